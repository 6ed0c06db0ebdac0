"""jaxremat.apply_nnx: flax.nnx models get the same gradients and state, in less memory."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxremat

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set


def _rngs(seed=0, **streams):
  """nnx.Rngs on the "rbg" PRNG: its initializers compile in a fraction of threefry's time."""
  key = lambda s: jax.random.key(s, impl="rbg")
  return nnx.Rngs(key(seed), **{name: key(s) for name, s in streams.items()})


def _mlp(width=16, depth=4, seed=0):
  rngs = _rngs(seed)
  layers = [nnx.Linear(8, width, rngs=rngs), nnx.tanh]
  for _ in range(depth - 1):
    layers += [nnx.Linear(width, width, rngs=rngs), nnx.tanh]
  return nnx.Sequential(*layers, nnx.Linear(width, 3, rngs=rngs))


def _cnn():
  rngs = _rngs()
  return nnx.Sequential(
      nnx.Conv(1, 4, (3, 3), rngs=rngs), nnx.relu,
      nnx.Conv(4, 8, (3, 3), strides=2, rngs=rngs), nnx.relu,
      nnx.Conv(8, 8, (3, 3), rngs=rngs), nnx.relu,
      lambda x: x.reshape(x.shape[0], -1),
      nnx.Linear(8 * 4 * 4, 5, rngs=rngs))


def _batchnorm_mlp():
  rngs = _rngs()
  return nnx.Sequential(
      nnx.Linear(8, 16, rngs=rngs), nnx.BatchNorm(16, rngs=rngs), nnx.relu,
      nnx.Linear(16, 16, rngs=rngs), nnx.BatchNorm(16, rngs=rngs), nnx.relu,
      nnx.Linear(16, 3, rngs=rngs))


def _dropout_mlp():
  rngs = _rngs(0, dropout=1)
  return nnx.Sequential(
      nnx.Linear(8, 16, rngs=rngs), nnx.relu, nnx.Dropout(0.5, rngs=rngs),
      nnx.Linear(16, 16, rngs=rngs), nnx.relu, nnx.Dropout(0.5, rngs=rngs),
      nnx.Linear(16, 3, rngs=rngs))


class Block(nnx.Module):
  """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

  def __init__(self, dim, heads, rngs):
    self.ln1 = nnx.LayerNorm(dim, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(heads, dim, decode=False, rngs=rngs)
    self.ln2 = nnx.LayerNorm(dim, rngs=rngs)
    self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
    self.down = nnx.Linear(4 * dim, dim, rngs=rngs)

  def __call__(self, x):
    h = self.ln1(x)
    x = x + self.attn(h, mask=nnx.make_causal_mask(x[..., 0]))
    return x + self.down(nnx.gelu(self.up(self.ln2(x))))


class TinyLM(nnx.Module):
  def __init__(self, vocab=11, dim=16, heads=2, depth=2, rngs=None):
    rngs = rngs or _rngs()
    self.embed = nnx.Embed(vocab, dim, rngs=rngs)
    self.blocks = nnx.List([Block(dim, heads, rngs) for _ in range(depth)])
    self.ln_f = nnx.LayerNorm(dim, rngs=rngs)
    self.head = nnx.Linear(dim, vocab, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    for block in self.blocks:
      x = block(x)
    return self.head(self.ln_f(x))


class ScannedLM(nnx.Module):
  """TinyLM's blocks made by nnx.vmap and run by nnx.scan, as Flax's docs write a stack."""

  def __init__(self, vocab=11, dim=16, heads=2, depth=3):
    rngs = _rngs()
    self.embed = nnx.Embed(vocab, dim, rngs=rngs)

    @nnx.split_rngs(splits=depth)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def blocks(rngs):
      return Block(dim, heads, rngs)

    self.blocks = blocks(rngs)
    self.head = nnx.Linear(dim, vocab, rngs=rngs)

  def __call__(self, tokens):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def run(x, block):
      return block(x)

    return self.head(run(self.embed(tokens), self.blocks))


class SkipAcrossLayers(nnx.Module):
  def __init__(self):
    rngs = _rngs()
    self.first = nnx.Linear(4, 8, rngs=rngs)
    self.second = nnx.Linear(8, 8, rngs=rngs)
    self.third = nnx.Linear(8, 8, rngs=rngs)

  def __call__(self, x):
    h = self.first(x)
    return self.third(self.second(h)) + h


def _step(model, fn, x):
  """Loss, gradients (nnx.value_and_grad under nnx.jit) and the model after, on a clone."""
  model = nnx.clone(model)

  def loss_fn(m, x):
    return jnp.mean(jnp.square(fn(m, x).astype(jnp.float32)))

  loss, grads = nnx.jit(nnx.value_and_grad(loss_fn))(model, x)
  return loss, grads, model


def _comparable(state):
  """Leaves as NumPy arrays (rng keys as their key data)."""
  def leaf(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    return np.asarray(x)
  return jax.tree.map(leaf, state)


def _assert_trees_close(actual, desired, rtol=1e-5, atol=1e-6):
  actual, desired = _comparable(actual), _comparable(desired)
  assert jax.tree.structure(actual) == jax.tree.structure(desired)
  jax.tree.map(lambda a, d: np.testing.assert_allclose(a, d, rtol=rtol, atol=atol),
               actual, desired)


def _has_remat(fn, model, x):
  names = {e.primitive.name for e in jax.make_jaxpr(lambda m: fn(m, x))(nnx.clone(model)).eqns}
  return bool(names & {"checkpoint", "remat2"})


def _assert_step_as_plain(model, fn, x):
  """One gradient step through ``fn`` gives the plain model's loss, gradients and state
  (batch stats, rng counts); returns the model after the plain step."""
  loss, grads, after = _step(model, lambda m, b: m(b), x)
  loss_fn, grads_fn, after_fn = _step(model, fn, x)
  np.testing.assert_allclose(loss_fn, loss, rtol=1e-6)
  _assert_trees_close(grads_fn, grads)
  _assert_trees_close(nnx.state(after_fn), nnx.state(after))
  return after


def _check_same_as_plain(model, x, **apply_kwargs):
  """apply_nnx leaves the model alone; one gradient step matches the plain model's."""
  before = _comparable(nnx.state(model))
  r = jaxremat.apply_nnx(model, x, **apply_kwargs)
  _assert_trees_close(nnx.state(model), before, rtol=0, atol=0)
  assert r.plan.checkpoints, "the plan should remat at least one segment"
  assert _has_remat(r.fn, model, x)
  return r, _assert_step_as_plain(model, r.fn, x)


def test_sequential_mlp():
  model = _mlp()
  r, _ = _check_same_as_plain(model, jax.random.normal(jax.random.key(1), (64, 8)))
  assert r.chain.names[:2] == ("layers.0", "(tanh)")


def test_small_cnn():
  _check_same_as_plain(_cnn(), jax.random.normal(jax.random.key(1), (8, 8, 8, 1)))


def test_batchnorm_statistics_update_as_without_remat():
  model = _batchnorm_mlp()
  _, after = _check_same_as_plain(model, jax.random.normal(jax.random.key(1), (32, 8)) + 3.0)
  moved = after.layers[1].mean[...]  # the comparison above covers both models' stats
  assert not np.allclose(moved, model.layers[1].mean[...])


def test_dropout_masks_and_rng_counts_as_without_remat():
  model = _dropout_mlp()
  _, after = _check_same_as_plain(model, jax.random.normal(jax.random.key(1), (32, 8)))
  counts = jax.tree.leaves(nnx.state(after, nnx.RngCount))
  assert counts and all(int(c) == 1 for c in counts)  # each Dropout drew once


@pytest.mark.parametrize("build", [_batchnorm_mlp, _dropout_mlp])
def test_compiled_profile_takes_the_state_as_arguments(build):
  """The compiled profile's compile of the plain step gets the model's other state
  (BatchNorm statistics, Dropout's rng counts) as arguments of the step, as the jaxpr
  trace does: the plan's gradients and state updates are the plain model's."""
  r, _ = _check_same_as_plain(build(), jax.random.normal(jax.random.key(1), (32, 8)),
                              profile="compiled")
  assert r.profile == "compiled"


def test_abstract_model_with_batch_statistics():
  """An nnx.eval_shape model (nothing allocated) with BatchNorm plans as the concrete one
  does, and its r.fn runs the concrete model as the plain call."""
  x = jax.random.normal(jax.random.key(1), (32, 8)) + 3.0
  abstract = nnx.eval_shape(_batchnorm_mlp)
  r = jaxremat.apply_nnx(abstract, jax.ShapeDtypeStruct(x.shape, x.dtype))
  concrete = jaxremat.apply_nnx(_batchnorm_mlp(), x)
  assert r.plan == concrete.plan
  assert r.measured_total_bytes == concrete.measured_total_bytes
  _assert_step_as_plain(_batchnorm_mlp(), r.fn, x)


def test_pre_ln_transformer_stack():
  model = TinyLM()
  tokens = jax.random.randint(jax.random.key(1), (4, 16), 0, 11)
  r, _ = _check_same_as_plain(model, tokens)
  assert r.chain.names == ("embed", "blocks.0", "blocks.1", "ln_f", "head")


def test_a_scanned_stack_is_named_by_its_module_and_gives_the_plain_gradients():
  # nnx.scan runs a new object of the stacked module per step, unnamed before (a user's
  # trial read "(scan)" where docs/usage.md promised the module's name)
  model = ScannedLM()
  tokens = jax.random.randint(jax.random.key(1), (4, 16), 0, 11)
  r = jaxremat.apply_nnx(model, tokens)
  assert r.chain.names == ("embed", "blocks", "head")
  assert [s.name for s in r.scans] == ["blocks"] and r.scans[0].segment < 3
  _assert_step_as_plain(model, r.fn, tokens)


def test_layer_depth_reaches_into_children():
  model = nnx.Sequential(_mlp(depth=2), nnx.Linear(3, 4, rngs=_rngs(1)))
  with pytest.warns(jaxremat.NoSavingWarning):  # so small, no checkpoint saves: it says so
    names = jaxremat.apply_nnx(model, jnp.ones((4, 8)), layer_depth=2).chain.names
  assert names[:3] == ("layers.0/layers.0", "layers.0/(tanh)", "layers.0/layers.2")


def test_training_loop_with_optimizer_and_nnx_jit():
  """nnx.jit + nnx.value_and_grad + nnx.Optimizer: same losses, parameters and state."""
  rngs = _rngs(0, dropout=1)
  model = nnx.Sequential(
      nnx.Linear(8, 16, rngs=rngs), nnx.BatchNorm(16, rngs=rngs), nnx.relu,
      nnx.Dropout(0.3, rngs=rngs), nnx.Linear(16, 16, rngs=rngs), nnx.relu,
      nnx.Linear(16, 3, rngs=rngs))
  x = jax.random.normal(jax.random.key(1), (5, 32, 8))
  y = jax.random.randint(jax.random.key(2), (5, 32), 0, 3)
  r = jaxremat.apply_nnx(model, x[0])

  def train(fn):
    m = nnx.clone(model)
    optimizer = nnx.Optimizer(m, optax.sgd(0.1), wrt=nnx.Param)

    @nnx.jit
    def step(m, optimizer, x, y):
      def loss_fn(m):
        return optax.softmax_cross_entropy_with_integer_labels(fn(m, x), y).mean()
      loss, grads = nnx.value_and_grad(loss_fn)(m)
      optimizer.update(m, grads)
      return loss

    return [float(step(m, optimizer, xb, yb)) for xb, yb in zip(x, y)], m

  losses, plain = train(lambda m, x: m(x))
  losses_r, remat = train(r.fn)
  np.testing.assert_allclose(losses_r, losses, rtol=1e-5)
  assert losses[-1] < losses[0]
  _assert_trees_close(nnx.state(remat), nnx.state(plain), rtol=1e-4, atol=1e-6)


def test_xla_footprint_below_no_remat_and_within_budget():
  model = _mlp(width=32, depth=8)
  x = jax.random.normal(jax.random.key(1), (512, 8))
  r = jaxremat.apply_nnx(model, x)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss_of(fn):
    def loss(params, x):
      return jnp.mean(jnp.square(fn(nnx.merge(graphdef, params, rest), x)))
    return loss

  plain = jaxremat.measure(loss_of(lambda m, b: m(b)), params, x).total_bytes
  remat = jaxremat.measure(loss_of(r.fn), params, x).total_bytes
  assert remat < 0.8 * plain, (remat, plain)
  budget = (remat + plain) // 2
  fitted = jaxremat.apply_nnx(model, x, budget_bytes=budget)
  assert jaxremat.measure(loss_of(fitted.fn), params, x).total_bytes <= budget


def test_not_an_nnx_module():
  with pytest.raises(jaxremat.InvalidArgumentError, match="model must be a flax.nnx.Module, got function"):
    jaxremat.apply_nnx(lambda x: x, jnp.ones(3))
  with pytest.raises(TypeError, match=r"linen module use jaxremat\.apply\(model\.apply"):
    jaxremat.apply_nnx(nn.Dense(3), jnp.ones((2, 3)))


def test_rngs_at_call_time_are_rejected():
  model = _dropout_mlp()
  with pytest.raises(jaxremat.InvalidArgumentError, match=r"nnx objects at \['rngs'\].*at construction"):
    jaxremat.apply_nnx(model, jnp.ones((4, 8)), rngs=nnx.Rngs(0))


def test_skip_connection_across_children_is_planned_as_a_graph():
  model, x = SkipAcrossLayers(), jnp.ones((2, 4))
  r = jaxremat.apply_nnx(model, x, plan=jaxremat.Plan((1,)))
  assert r.is_graph

  def loss(fn):
    return lambda m, x: jnp.mean(fn(m, x) ** 2)

  want = nnx.grad(loss(lambda m, x: m(x)))(model, x)
  got = nnx.grad(loss(r.fn))(model, x)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7),
               nnx.state(want), nnx.state(got))


def test_fn_rejects_another_model_or_mode():
  model = _dropout_mlp()
  x = jnp.ones((4, 8))
  r = jaxremat.apply_nnx(model, x, verify=False)  # the calls below are what is tested
  with pytest.raises(jaxremat.InputMismatchError, match="plan was made for a Sequential"):
    r.fn(TinyLM(), x)
  with pytest.raises(jaxremat.InvalidArgumentError,
                     match=r"called as r\.fn\(model, batch, \*\*kwargs\).*got State, then"):
    r.fn(nnx.split(model)[1], x)
  evaluating = nnx.clone(model)
  evaluating.eval()
  match = r"model\.eval\(\).*evaluate with model\(x\)"
  with pytest.raises(jaxremat.InputMismatchError, match=match) as caught:
    r.fn(evaluating, x)
  assert "train=False" not in str(caught.value)  # linen's words, not nnx's
  assert "call jaxremat.apply_nnx on the model" in str(caught.value)
  f = jaxremat.fit_nnx(model, x, 0.9, verify=False)
  with pytest.raises(jaxremat.InputMismatchError, match="call jaxremat.fit_nnx on the model"):
    f.fn(evaluating, x)


def _wide_mlp():
  rngs = _rngs(3)
  layers = [nnx.Linear(8, 256, rngs=rngs), nnx.tanh]
  for _ in range(5):
    layers += [nnx.Linear(256, 256, rngs=rngs), nnx.Dropout(0.1, rngs=rngs), nnx.tanh]
  return nnx.Sequential(*layers, nnx.Linear(256, 4, rngs=rngs))


def test_measure_takes_an_nnx_model_and_counts_its_remat():
  """measure(loss, model, x) differentiates the model's Params; r.fn's step is smaller."""
  model, x = _wide_mlp(), jax.random.normal(jax.random.key(1), (256, 8))
  r = jaxremat.apply_nnx(model, x)
  plain = jaxremat.measure(lambda m, b: jnp.mean(m(b) ** 2), model, x)
  remat = jaxremat.measure(lambda m, b: jnp.mean(r.fn(m, b) ** 2), model, x)
  params = nnx.state(model, nnx.Param)
  leaves = jax.tree_util.tree_leaves(params)
  param_bytes = sum(v.nbytes for v in leaves)
  # The gradients of the Params, nothing else (plus, on CPU, 8 B per leaf of tuple table).
  assert param_bytes <= plain.output_bytes <= param_bytes + 8 * len(leaves)
  assert remat.total_bytes < plain.total_bytes


def test_full_train_step_with_optimizer_and_donation_matches_the_plain_one():
  """nnx's split/merge step under jaxremat.jit with donated state: same losses and
  parameters as the plain model for five steps, and a smaller compiled step."""
  x = jax.random.normal(jax.random.key(1), (256, 8))
  y = jax.random.normal(jax.random.key(2), (256, 4))
  runs = {}
  for name in ("plain", "remat"):
    model = _wide_mlp()
    call = (lambda m, b: m(b)) if name == "plain" else jaxremat.apply_nnx(model, x).fn
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    def step(state, x, y, call=call, graphdef=graphdef):
      model, optimizer = nnx.merge(graphdef, state)
      loss, grads = nnx.value_and_grad(lambda m: jnp.mean((call(m, x) - y) ** 2))(model)
      optimizer.update(model, grads)
      return nnx.split((model, optimizer))[1], loss

    jitted = jaxremat.jit(step, donate_argnums=0)
    compiled = jitted.lower(state, x, y).compile().memory_analysis()
    runs[name] = [compiled.temp_size_in_bytes, []]
    for _ in range(5):
      state, loss = jitted(state, x, y)
      runs[name][1].append(float(loss))
    runs[name].append(nnx.state(nnx.merge(graphdef, state)[0], nnx.Param))
  np.testing.assert_allclose(runs["remat"][1], runs["plain"][1], rtol=1e-5)
  # Adam divides by the gradient's root mean square: where a gradient is near zero, its
  # reassociation noise moves the step by a share of the learning rate (1e-3).
  _assert_trees_close(runs["remat"][2], runs["plain"][2], atol=1e-4)
  assert runs["remat"][0] < runs["plain"][0]


class _RematBlocks(nnx.Module):
  """Blocks the user rematerialised with nnx.remat (a user's trial)."""

  def __init__(self):
    rngs = _rngs()
    self.blocks = nnx.List([nnx.Linear(16, 16, rngs=rngs) for _ in range(4)])
    self.head = nnx.Linear(16, 3, rngs=rngs)

  def __call__(self, x):
    for block in self.blocks:
      x = nnx.remat(lambda b, x: nnx.tanh(b(x)))(block, x)
    return self.head(x)


def test_a_model_that_rematerialises_already_says_so():
  with pytest.warns(jaxremat.NoSavingWarning, match="rematerialises already"):
    r = jaxremat.apply_nnx(_RematBlocks(), jnp.ones((32, 16)))
  assert r.plan.checkpoints == ()


def test_fit_nnx_fits_the_budget_with_the_plain_gradients_and_state():
  """A user's trial: fit had no nnx entry (fit on an nnx model pointed to apply_nnx, and a
  split/merge wrapper traced as one layer). fit_nnx plans the blocks of an nnx.List with
  Dropout; its step fits half of the activations as XLA measures it, and one step gives
  the plain model's loss, gradients, and rng counts."""
  rngs = _rngs(0, dropout=1)
  model = nnx.Sequential(nnx.Linear(8, 64, rngs=rngs),
                         *[nnx.Sequential(nnx.Linear(64, 64, rngs=rngs), nnx.tanh,
                                          nnx.Dropout(0.25, rngs=rngs)) for _ in range(6)],
                         nnx.Linear(64, 3, rngs=rngs))
  x = jax.random.normal(jax.random.key(1), (512, 8))
  before = _comparable(nnx.state(model))
  f = jaxremat.fit_nnx(model, x, 0.5, time_steps=False)
  _assert_trees_close(nnx.state(model), before, rtol=0, atol=0)
  assert f.measured_total_bytes <= f.budget_bytes < f.no_remat_bytes
  assert _has_remat(f.fn, model, x)
  _assert_step_as_plain(model, f.fn, x)


def test_fit_on_an_nnx_module_points_to_fit_nnx():
  with pytest.raises(jaxremat.InvalidArgumentError, match=r"fit_nnx\(model, batch, memory_budget\)"):
    jaxremat.fit(_mlp(), {}, jnp.ones((2, 8)), 0.5)
