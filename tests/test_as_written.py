"""apply never returns a plan XLA measures above the model as written."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxremat
from jaxremat import zoo
from jaxremat._api.loss import training_loss
from jaxremat._api.planning import fmt_bytes

pytestmark = pytest.mark.xla


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, mask):
    h = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=64)(h, h, mask=mask)
    return x + nn.Dense(64)(nn.gelu(nn.Dense(256)(nn.LayerNorm()(x)))), None


class Encoder(nn.Module):
  @nn.compact
  def __call__(self, x, mask):
    stack = nn.scan(nn.remat(Block), variable_axes={"params": 0}, split_rngs={"params": True},
                    in_axes=nn.broadcast, length=6)
    return stack(name="layers")(x, mask)[0]


class RematScanNet(nn.Module):
  """Attention blocks the user already rematerialised, scanned inside an encoder."""

  @nn.compact
  def __call__(self, x):
    mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
    x = Encoder()(nn.Dense(64)(x), mask)
    return nn.Dense(10)(x.mean(1))


def assert_same_gradients(model_fn, fn, params, x):
  want = jax.grad(training_loss(model_fn, {}))(params, x)
  got = jax.grad(training_loss(fn, {}))(params, x)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_one_layer_is_the_model_as_written_and_says_why():
  """One layer: the plan has no checkpoint, so it is the model as written; apply says
  the model is one layer (and only that)."""
  model, x = nn.Dense(64), jnp.ones((32, 16))
  params = model.init(jax.random.key(0), x)
  plain = jaxremat.measure(training_loss(model.apply, {}), params, x).total_bytes
  with pytest.warns(jaxremat.NoSavingWarning, match="one layer") as caught:
    r = jaxremat.apply(model.apply, params, x)
  assert len(caught) == 1 and "apply_nnx" not in str(caught[0].message)
  assert r.plan.checkpoints == () and r.plan.method != "as written"
  assert r.as_written_bytes == r.measured_total_bytes == plain


def test_a_trace_without_module_names_points_to_apply_nnx():
  """An nnx model merged inside a plain function leaves no module names in the trace:
  one layer, and the warning (and fit's error) name the way that finds its layers."""
  from flax import nnx  # noqa: PLC0415

  model = nnx.Sequential(*[nnx.Linear(16, 16, rngs=nnx.Rngs(i)) for i in range(4)])
  graphdef, params = nnx.split(model)
  fn = lambda p, x: nnx.merge(graphdef, p)(x)  # noqa: E731
  x = jnp.ones((32, 16))
  with pytest.warns(jaxremat.NoSavingWarning, match="apply_nnx"):
    r = jaxremat.apply(fn, params, x)
  assert r.chain.n == 1 and "no module" in r.decomposition
  with pytest.raises(jaxremat.InfeasibleBudgetError, match="apply_nnx"):
    jaxremat.fit(fn, params, x, 1e-6)


def test_a_rematerialised_scan_is_never_made_larger():
  """A scan of nn.remat blocks, split into segments, compiled above the model as written
  (a user's trial); whatever apply returns measures at most the model as written."""
  model, x = RematScanNet(), jax.random.normal(jax.random.key(1), (8, 64, 32))
  params = model.init(jax.random.key(0), x)
  plain = jaxremat.measure(training_loss(model.apply, {}), params, x).total_bytes
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    r = jaxremat.apply(model.apply, params, x)
  assert r.as_written_bytes == plain
  got = jaxremat.measure(training_loss(r.fn, {}), params, x).total_bytes
  assert got == r.measured_total_bytes <= plain
  warned = any(issubclass(w.category, jaxremat.NoSavingWarning) for w in caught)
  assert warned == (r.plan.method == "as written")
  if r.plan.checkpoints or r.scans:  # a plan that recomputes must save 1% at least
    assert got <= 0.99 * plain
  else:  # the report's list marks the model as written chosen, not the segmented []
    chosen = [row for row in r.report().splitlines() if row.endswith("<- chosen")]
    assert chosen == [f"  {fmt_bytes(plain):>10}  the model as written  <- chosen"]
  assert_same_gradients(model.apply, r.fn, params, x)


def test_the_model_as_written_is_measured_beside_the_plan():
  model = zoo.mlp([64, 64, 64, 64])
  x = jnp.ones((32, 16))
  params = model.init(jax.random.key(0), x)
  r = jaxremat.apply(model.apply, params, x)
  plain = jaxremat.measure(training_loss(model.apply, {}), params, x).total_bytes
  assert r.as_written_bytes == plain
  assert r.measured_total_bytes <= plain
  assert "the model as written (no plan), XLA-measured" in r.report()
  assert jaxremat.apply(model.apply, params, x, verify=False).as_written_bytes is None


class SharedLoop(nn.Module):
  """One weight-shared block applied in a ``fori_loop`` (its weights closed over, not
  scanned): the loop holds nearly every residual, and no checkpoint between layers
  reaches inside it (a user's trial)."""

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(64)(x)
    w = self.param("w", nn.initializers.lecun_normal(), (64, 256))
    w2 = self.param("w2", nn.initializers.lecun_normal(), (256, 64))
    x = jax.lax.fori_loop(0, 8, lambda i, h: h + jnp.tanh(h @ w) @ w2, x)
    return nn.Dense(10)(x)


def test_a_loop_holding_the_residuals_says_how_to_reach_inside_it():
  model, x = SharedLoop(), jnp.ones((64, 32))
  params = model.init(jax.random.key(0), x)
  with pytest.warns(jaxremat.CoarseLayersWarning, match="body in jax.checkpoint") as caught:
    r = jaxremat.apply(model.apply, params, x, verify=False)
  assert len(caught) == 1 and r.plan.checkpoints == () and r.scans == ()


class Loop(nn.Module):
  """A fori_loop over weights of its own: a loop without xs, which jaxremat does not split;
  with ``remat``, its body under jax.checkpoint."""
  remat: bool = False

  @nn.compact
  def __call__(self, x):
    w = self.param("w", nn.initializers.lecun_normal(), (64, 256))
    w2 = self.param("w2", nn.initializers.lecun_normal(), (256, 64))
    body = lambda i, h: h + jnp.tanh(h @ w) @ w2  # noqa: E731
    return jax.lax.fori_loop(0, 16, jax.checkpoint(body) if self.remat else body, x)


class TwoLoops(nn.Module):
  remat: bool = False

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(64)(x)
    x = Loop(self.remat, name="loop_0")(x)
    x = Loop(self.remat, name="loop_1")(x)
    return nn.Dense(10)(nn.relu(nn.Dense(64)(x)))


def test_loops_holding_the_residuals_together_say_how_to_reach_inside_them():
  """A user's trial (two RNNs over time then, which jaxremat now segments): loops neither
  holding half the residuals; the model predicted a large saving, XLA measured a few
  percent, and nothing said why."""
  model, x = TwoLoops(), jnp.ones((64, 16))
  params = model.init(jax.random.key(0), x)
  with pytest.warns(UserWarning, match=r"(?i)checkpoints fall between layers only, and layers "
                    r"'loop_0', 'loop_1' hold \d+% of the residual bytes in loops .*"
                    r"body in jax.checkpoint") as caught:
    r = jaxremat.apply(model.apply, params, x)
  # the premise: XLA measures (next to) no saving, whichever plan is returned
  assert min(r.verified.values()) > 0.9 * r.as_written_bytes
  assert {w.category for w in caught} & {jaxremat.CoarseLayersWarning, jaxremat.NoSavingWarning}


def test_fit_says_the_loops_hold_what_no_plan_reaches():
  """A user's trial: fit called a budget a checkpointed loop body reaches infeasible and
  said only to raise it."""
  model, x = TwoLoops(), jnp.ones((64, 16))
  params = model.init(jax.random.key(0), x)
  with pytest.raises(jaxremat.InfeasibleBudgetError,
                     match=r"layers 'loop_0', 'loop_1' hold \d+% of the residual bytes in "
                     r"loops .*body in jax.checkpoint"):
    jaxremat.fit(model.apply, params, x, 0.25)


def test_loops_whose_bodies_are_rematerialised_are_not_told_to_remat_them():
  """A review: the loops' advice said to wrap the body in a checkpoint where it was already."""
  model, x = TwoLoops(remat=True), jnp.ones((64, 16))
  params = model.init(jax.random.key(0), x)
  with pytest.raises(jaxremat.InfeasibleBudgetError,
                     match=r"(?s)hold \d+% of the residual bytes in loops .*bodies are "
                     r"rematerialised already.*chunks of steps") as caught:
    jaxremat.fit(model.apply, params, x, 0.1)
  assert "Wrap the loop's body" not in str(caught.value)


def test_a_plan_without_checkpoints_says_the_model_runs_as_written():
  model, x = nn.Sequential([nn.Dense(64), nn.Dense(64), nn.Dense(8)]), jnp.ones((32, 16))
  params = model.init(jax.random.key(0), x)
  with pytest.warns(jaxremat.NoSavingWarning, match="no checkpoint between its 3 layers"):
    r = jaxremat.apply(model.apply, params, x, verify=False)
  assert r.plan.checkpoints == ()
