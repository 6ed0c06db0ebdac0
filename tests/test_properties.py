"""Property test: random small linen stacks keep their gradients under any plan."""

import warnings

import flax.linen as nn
import jax
import pytest
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxremat

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

LAYER = st.one_of(
    st.integers(2, 6).map(lambda w: ("dense", w)),
    st.sampled_from([("relu", 0), ("tanh", 0), ("layernorm", 0)]),
)


def build(spec):
  make = {"dense": lambda w: nn.Dense(w), "relu": lambda _: nn.relu, "tanh": lambda _: jnp.tanh,
          "layernorm": lambda _: nn.LayerNorm()}
  return nn.Sequential([make[kind](w) for kind, w in spec])


def expected_layers(spec):
  """A module is a layer; a run of consecutive functions (relu, tanh) is one layer."""
  modules = sum(kind in ("dense", "layernorm") for kind, _ in spec)
  runs = sum(kind in ("relu", "tanh") and (k == 0 or spec[k - 1][0] not in ("relu", "tanh"))
             for k, (kind, _) in enumerate(spec))
  return modules + runs


def loss_of(fn):
  return lambda params, x: jnp.mean(jnp.square(fn(params, x)))


@settings(max_examples=6, deadline=None, derandomize=True)
@given(first=st.integers(2, 6), rest=st.lists(LAYER, min_size=0, max_size=6),
       features=st.integers(1, 4), data=st.data())
def test_random_stacks_plan_validly_and_keep_gradients(first, rest, features, data):
  model = build([("dense", first), *rest])
  x = jax.random.normal(jax.random.key(1), (3, features))
  params = model.init(jax.random.key(0), x)
  with warnings.catch_warnings():  # a stack this small may be one layer, or gain nothing
    warnings.simplefilter("ignore", jaxremat.NoSavingWarning)
    r = jaxremat.apply(model.apply, params, x)
  n = r.chain.n
  assert n == expected_layers([("dense", first), *rest])
  assert all(1 <= c <= n - 1 for c in r.plan.checkpoints)
  assert list(r.plan.checkpoints) == sorted(set(r.plan.checkpoints))
  checkpoints = data.draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=n - 1)
                          if n > 1 else st.just(set()))
  forced = jaxremat.apply(model.apply, params, x, plan=jaxremat.Plan(tuple(sorted(checkpoints))),
                            verify=False)
  want = jax.jit(jax.value_and_grad(loss_of(model.apply)))(params, x)
  for fn in (r.fn, forced.fn):
    got = jax.jit(jax.value_and_grad(loss_of(fn)))(params, x)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
      # Float reassociation only: relative to each leaf's scale (LayerNorm of a few
      # features is ill-conditioned enough to amplify rounding).
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(b))))
