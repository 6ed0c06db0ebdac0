"""apply(loss_fn=) and fit(loss_fn=): the steps compiled are the user's, with their loss."""

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import jaxremat
from jaxremat import zoo

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

VOCAB = 4096  # a wide output: the cross-entropy's softmax is as large as a layer's output
X = jax.random.normal(jax.random.key(0), (256, 32))
LABELS = jnp.arange(256) % VOCAB
MODEL = zoo.mlp([64, 64, 64, VOCAB])
PARAMS = MODEL.init(jax.random.key(1), X)


def cross_entropy(logits):
  return optax.softmax_cross_entropy_with_integer_labels(logits, LABELS).mean()


def step_bytes(fn, params=PARAMS):
  """XLA's footprint of the user's own training step through ``fn``."""
  return jaxremat.measure(lambda p, x: cross_entropy(fn(p, x)), params, X).total_bytes


def test_the_cross_entropy_step_is_not_the_stand_in_step():
  # The premise: the default loss (mean squares) compiles to another footprint.
  stand_in = jaxremat.measure(lambda p, x: jnp.mean(jnp.square(MODEL.apply(p, x))), PARAMS, X)
  assert stand_in.total_bytes != step_bytes(MODEL.apply)


def test_apply_confirms_its_plan_on_the_users_loss():
  r = jaxremat.apply(MODEL.apply, PARAMS, X, loss_fn=cross_entropy)
  assert r.measured_total_bytes == step_bytes(r.fn)


def test_fit_holds_the_budget_for_the_users_loss():
  plain = step_bytes(MODEL.apply)
  budget = plain - 1
  fitted = jaxremat.fit(MODEL.apply, PARAMS, X, budget, loss_fn=cross_entropy,
                        time_steps=False)
  assert fitted.no_remat_bytes == plain
  assert fitted.measured_total_bytes == step_bytes(fitted.fn) <= budget


class _Net(nnx.Module):
  def __init__(self, rngs):
    self.layers = nnx.List([nnx.Linear(32, 64, rngs=rngs), nnx.Linear(64, 64, rngs=rngs),
                            nnx.Linear(64, VOCAB, rngs=rngs)])

  def __call__(self, x):
    for layer in self.layers[:-1]:
      x = nnx.relu(layer(x))
    return self.layers[-1](x)


def test_fit_nnx_takes_the_loss_of_the_models_output():
  model = _Net(nnx.Rngs(0))
  plain = jaxremat.measure(lambda m, x: cross_entropy(m(x)), model, X).total_bytes
  fitted = jaxremat.fit_nnx(model, X, plain - 1, loss_fn=cross_entropy, time_steps=False)
  measured = jaxremat.measure(lambda m, x: cross_entropy(fitted.fn(m, x)), model, X)
  assert fitted.no_remat_bytes == plain
  assert measured.total_bytes == fitted.measured_total_bytes <= plain - 1
