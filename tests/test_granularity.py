"""Automatic granularity: on models written as real code nests them (tests/realworld_models.py),
default apply finds the blocks as layers, keeps the gradients, and matches per-block remat."""

import functools
import warnings
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import realworld_models as rm
from flax import nnx

import jaxremat
from jaxremat._api.advice import split_depth
from jaxremat._jaxpr.trace import trace
from jaxremat.solvers import uniform_plan

#: XLA's footprint of default apply may exceed per-block remat's by this share at most.
PER_BLOCK_SLACK = 0.02


pytestmark = pytest.mark.xla  # apply compiles its plan by default: the slow set

@functools.cache
def _setup(name: str):
  """The test-size case, its model and variables, and default apply's result."""
  case = rm.build(name)
  model, variables = rm.init(case)
  return case, model, variables, rm.apply(case, model, variables)


def _assert_close(want, got, tol=1e-5):
  def leaf(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    return np.asarray(x, np.float64)

  want, got = jax.tree.map(leaf, want), jax.tree.map(leaf, got)
  assert jax.tree.structure(want) == jax.tree.structure(got)
  for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got)):
    scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("name", rm.NAMES)
def test_default_layers_are_the_blocks(name):
  case, _, _, r = _setup(name)
  names = r.chain.names
  start = names.index(case.blocks[0])
  assert names[start:start + len(case.blocks)] == case.blocks, names
  assert not any(n.startswith(block + "/") for block in case.blocks for n in names), names
  assert r.decomposition.startswith("descended into"), r.decomposition


def test_decomposition_is_recorded_with_its_reasons():
  vit = _setup("vit")[3].decomposition
  assert vit.startswith("descended into 'Transformer' (98% of the activation bytes): 9 layers")
  assert ("kept whole: 'Transformer/encoderblock_0' and those like it "
          "('Transformer/encoderblock_1')") in vit
  resnet = _setup("resnet")[3].decomposition
  assert "'layer1'" in resnet and "'layer2'" in resnet  # the second stage as the first's kind
  lm1b = _setup("lm1b")[3]
  assert "1 value(s) computed from the batch alone" in lm1b.decomposition  # the mask
  assert not any(n.startswith("(") for n in lm1b.chain.names)  # its layer went to the prelude


def test_a_scan_in_a_split_module_is_still_segmented():
  r = _setup("scan-lm")[3]
  assert [(s.name, s.length, s.rematerialised) for s in r.scans] == [("decoder/layers", 4, True)]


def test_another_batch_size_gives_the_same_layers():
  for name in ("lm1b", "resnet", "minigpt-list"):
    case, model, variables, r = _setup(name)
    bigger = jnp.concatenate([case.batch, case.batch])
    if case.nnx:
      again = jaxremat.apply_nnx(model, bigger)
    else:
      again = jaxremat.apply(model.apply, variables, bigger, **case.kwargs)
    assert again.chain.names == r.chain.names


def test_lm1b_forward_at_another_batch_size_reuses_the_plan():
  case, model, variables, r = _setup("lm1b")
  tokens = jnp.concatenate([case.batch, case.batch[:, ::-1]])
  _assert_close(model.apply(variables, tokens), r.fn(variables, tokens))


def test_layer_depth_stays_an_exact_override():
  case, model, variables, _ = _setup("vit")
  r = rm.apply(case, model, variables, layer_depth=1, method="none", verify=False)
  assert r.chain.names == ("embedding", "(reshape,tile,concatenate)", "Transformer",
                           "(slice,squeeze)", "head")
  assert r.decomposition == "layer_depth=1 (5 layers)"
  case, model, variables, _ = _setup("lm1b")  # the mask layer is read by every block
  graph = rm.apply(case, model, variables, layer_depth=2, method="none", verify=False,
                   profile="jaxpr")
  assert graph.is_graph


def test_layer_depth_names_a_module_without_children_and_whose_own_work_a_layer_is():
  # At layer_depth=2 the U-Net's stem and head are convolutions with no children: they
  # keep their names, not their primitives'; the middle block's own work between its
  # children says it is the middle block's, as the automatic decomposition's layers do.
  case, model, variables, _ = _setup("unet")
  names = rm.apply(case, model, variables, layer_depth=2, method="none",
                   verify=False, profile="jaxpr").chain.names
  assert names[0] == "stem" and names[-1] == "head"
  assert names[6:13] == ("middle/GroupNorm_0", "middle/(silu)", "middle/Conv_0",
                         "middle/GroupNorm_1", "middle/(silu)#2", "middle/Conv_1",
                         "middle/(add)")
  assert names[-3:-1] == ("GroupNorm_0", "(silu)")  # the root's own work: no path


class _InputSkip(nn.Module):
  """A scaled copy of the input (batch-only, as large as an activation) read by the first
  and the last of three layers."""

  @nn.compact
  def __call__(self, x):
    h = 2.0 * x
    return nn.Dense(x.shape[-1])(nn.relu(nn.Dense(x.shape[-1])(h))) + h


class _Wrapper(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(x.shape[-1], name="head")(_InputSkip(name="inner")(x))


def test_a_large_batch_value_read_across_layers_keeps_its_module_whole():
  # (the root's only module is split whatever its layers: see the test of one module)
  model, x = _Wrapper(), jnp.ones((8, 64))
  r = jaxremat.apply(model.apply, model.init(jax.random.key(0), x), x, method="none")
  assert r.chain.names == ("inner", "head")
  assert "kept whole: 'inner' (" in r.decomposition


class _ResBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(x.shape[-1])(nn.relu(nn.Dense(x.shape[-1])(x)))


class _Encoder(nn.Module):
  @nn.compact
  def __call__(self, x):
    skips = []
    for i in range(2):
      x = _ResBlock(name=f"block{i}")(x)
      skips.append(x)
    return x, skips


class _Decoder(nn.Module):
  @nn.compact
  def __call__(self, x, skips):
    for i, skip in enumerate(reversed(skips)):
      x = _ResBlock(name=f"block{i}")(jnp.concatenate([x, skip], -1)[..., ::2])
    return x


class _NestedUNet(nn.Module):
  """A U-Net as real code nests it: the skips cross from the Encoder to the Decoder."""

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(64, name="stem")(x)
    x, skips = _Encoder(name="Encoder")(x)
    return _Decoder(name="Decoder")(nn.Dense(64, name="middle")(x), skips)


def test_a_graph_at_the_root_is_split_into_its_blocks_which_stay_whole():
  # The root's children (stem, Encoder, middle, Decoder) are a graph already. The Encoder
  # and the Decoder are split into their blocks (each stage's layers and the one before
  # are a chain); a residual block is not (its input is read by its last layer). XLA
  # measures the plan over the blocks no larger than the plan over the root's children.
  model, x = _NestedUNet(), jnp.ones((64, 16))
  params = model.init(jax.random.key(0), x)
  r = jaxremat.apply(model.apply, params, x)
  assert r.is_graph
  assert r.chain.names == ("stem", "Encoder/block0", "Encoder/block1", "middle",
                           "Decoder/(concatenate,slice)", "Decoder/block0",
                           "Decoder/(concatenate,slice)#2", "Decoder/block1")
  assert "kept whole: 'Encoder/block0'" in r.decomposition
  assert "planned as a graph" in r.decomposition
  coarse = jaxremat.apply(model.apply, params, x, layer_depth=1)
  assert r.measured_total_bytes <= coarse.measured_total_bytes
  _assert_close(jax.grad(lambda p: model.apply(p, x).sum())(params),
                jax.grad(lambda p: r.fn(p, x).sum())(params))


class _CrossBlock(nn.Module):
  """A decoder block: self-attention, cross-attention to ``memory``, an MLP, each residual."""

  @nn.compact
  def __call__(self, x, memory):
    x = x + nn.MultiHeadDotProductAttention(2)(nn.LayerNorm()(x))
    x = x + nn.MultiHeadDotProductAttention(2)(nn.LayerNorm()(x), memory)
    return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(4 * x.shape[-1])(nn.LayerNorm()(x))))


class _EncoderBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = x + nn.MultiHeadDotProductAttention(2)(nn.LayerNorm()(x))
    return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(4 * x.shape[-1])(nn.LayerNorm()(x))))


class _Seq2Seq(nn.Module):
  """An encoder-decoder nested as Flax's wmt example nests it: every decoder block reads
  the encoder's output besides the block before it."""

  @nn.compact
  def __call__(self, inputs, targets):
    embed = nn.Embed(50, 32)
    memory = _Coder(_EncoderBlock, name="Encoder")(embed(inputs))
    return embed.attend(_Coder(_CrossBlock, name="Decoder")(embed(targets), memory))


class _Coder(nn.Module):
  """Three blocks of ``block`` and a LayerNorm; a decoder's blocks read ``memory`` too."""

  block: Any

  @nn.compact
  def __call__(self, x, memory=None):
    for i in range(3):
      x = self.block(name=f"block{i}")(*((x,) if memory is None else (x, memory)))
    return nn.LayerNorm(name="norm")(x)


def test_a_decoders_blocks_reading_the_encoders_output_are_layers():
  # A user's trial (a wmt-style transformer): splitting the decoder makes a graph (each
  # block reads the encoder's output), so the decoder stayed one layer holding 60% of the
  # activations, and the default saved 35% where layer_depth=3 saved 69%.
  model = _Seq2Seq()
  inputs, targets = (jax.random.randint(jax.random.key(k), (8, 24), 0, 50) for k in (1, 2))
  params = model.init(jax.random.key(0), inputs, targets)
  r = jaxremat.apply(model.apply, params, inputs, targets=targets)
  assert r.is_graph and "planned as a graph" in r.decomposition
  assert all(f"{part}/block{i}" in r.chain.names
             for part in ("Encoder", "Decoder") for i in range(3)), r.chain.names
  assert "kept whole: 'Decoder/block" in r.decomposition  # each a residual block, whole
  coarse = jaxremat.apply(model.apply, params, inputs, targets=targets, layer_depth=1)
  assert r.measured_total_bytes < coarse.measured_total_bytes
  loss = lambda fn: lambda p: jnp.mean(jnp.square(fn(p, inputs, targets=targets)))
  _assert_close(jax.grad(loss(model.apply))(params), jax.grad(loss(r.fn))(params))


class _DecodeScope(nn.Module):
  """Work of its own and a single child, the decoder: as a ``Transformer.decode`` method
  scope holds ``decoder``."""

  @nn.compact
  def __call__(self, x, memory):
    return _Coder(_CrossBlock, name="Decoder")(x * 2.0, memory)


class _ScopedSeq2Seq(nn.Module):
  @nn.compact
  def __call__(self, inputs, targets):
    embed = nn.Embed(50, 32)
    memory = _Coder(_EncoderBlock, name="Encoder")(embed(inputs))
    return embed.attend(_DecodeScope(name="decode")(embed(targets), memory))


def test_the_layer_depth_hint_reaches_a_scopes_blocks():
  # A user's trial: the hint for a layer holding most residual bytes said layer_depth=2
  # for a method scope over a single child ('Transformer.decode' > 'decoder'), one level
  # too shallow for the decoder's blocks.
  model = _ScopedSeq2Seq()
  inputs, targets = (jax.random.randint(jax.random.key(k), (2, 8), 0, 50) for k in (1, 2))
  params = model.init(jax.random.key(0), inputs, targets)
  layers = lambda depth: [layer.name for layer in trace(
      model.apply, params, inputs, {"targets": targets}, depth).layers]
  decode = next(layer for layer in trace(model.apply, params, inputs, {"targets": targets},
                                         1).layers if layer.name == "decode")
  depth = split_depth(decode)
  assert "decode/Decoder/block0" in layers(depth), (depth, layers(depth))
  assert "decode/Decoder/block0" not in layers(depth - 1)


class _ActivationPenalty(nn.Module):
  """An MLP returning its logits and a penalty on every hidden activation (a graph: the
  penalty reads each layer's output)."""

  @nn.compact
  def __call__(self, x):
    hidden = []
    for i in range(4):
      x = nn.relu(nn.Dense(64, name=f"fc{i}")(x))
      hidden.append(x)
    return nn.Dense(10, name="head")(x), sum(jnp.mean(h ** 2) for h in hidden)


class _PenaltyLogitsOnly(_ActivationPenalty):
  """A subclass calling ``super().__call__``: Flax names everything under one module."""

  def __call__(self, x):
    logits, penalty = super().__call__(x)
    return logits + penalty


def test_a_model_that_is_one_module_is_planned_at_that_modules_children():
  """Found by a user's trial: the subclass traced as one layer beside its root's own add
  (its split a graph, kept whole), where its base class is planned as a graph of its
  layers."""
  x = jax.random.normal(jax.random.key(1), (32, 16))
  params = _ActivationPenalty().init(jax.random.key(0), x)
  for model in (_ActivationPenalty(), _PenaltyLogitsOnly()):
    r = jaxremat.apply(model.apply, params, x, verify=False)
    assert r.is_graph and len(r.chain.names) >= 9, r.decomposition
    loss = lambda p, f: sum(jnp.sum(y) for y in jax.tree.leaves(f(p, x)))  # noqa: E731
    _assert_close(jax.grad(loss)(params, model.apply), jax.grad(loss)(params, r.fn))
  assert all(name.startswith("_PenaltyLogitsOnly/") for name in r.chain.names[:-1])
  assert "descended into '_PenaltyLogitsOnly'" in r.decomposition


@pytest.mark.parametrize("name", ["vit", "lm1b"])
def test_layer_depth_search_goes_below_the_blocks_where_xla_measures_less(name):
  # layer_depth="search" also plans one and two levels below a transformer's blocks (as a
  # graph: the residual adds span the attention and the MLP) and keeps what XLA measures
  # least: against default apply's plan over the blocks, measured here on its own.
  case, model, variables, r = _setup(name)
  v = rm.apply(case, model, variables, layer_depth="search")
  assert v.decomposition.startswith("layer_depth=") and "as XLA measured" in v.decomposition
  assert v.is_graph
  measured = rm.footprint(case, v.fn, model, variables)  # its loss: a few bytes apart
  assert measured == pytest.approx(v.measured_total_bytes, rel=1e-3)
  assert measured < rm.footprint(case, r.fn, model, variables)
  want = jax.jit(jax.grad(rm.loss(case, model.apply)))(variables, case.batch)
  got = jax.jit(jax.grad(rm.loss(case, v.fn)))(variables, case.batch)
  _assert_close(want, got)
  half = case.batch[: case.batch.shape[0] // 2]  # another batch size: traced again, same layers
  _assert_close(rm.loss(case, model.apply)(variables, half), rm.loss(case, v.fn)(variables, half))


def test_layer_depth_search_keeps_the_layers_found_where_deeper_measures_no_less():
  # The ResNet's blocks split measure no less than over the blocks (bench size: 91.63 MiB
  # both): the search returns default apply's plan and says what the level below measured.
  case, model, variables, r = _setup("resnet")
  v = rm.apply(case, model, variables, layer_depth="search")
  assert v.decomposition.startswith(r.decomposition + "; layer_depth='search': one level below")
  assert v.decomposition.endswith("these layers kept")
  assert v.plan.checkpoints == r.plan.checkpoints
  assert v.measured_total_bytes == r.measured_total_bytes


@pytest.mark.parametrize("name", rm.NAMES)
def test_gradients_equal_plain_gradients(name):
  case, model, variables, r = _setup(name)
  if case.nnx:
    def step(fn):
      m = nnx.clone(model)
      loss = lambda m, x: jnp.mean(jnp.square(fn(m, x)))
      grads = nnx.jit(nnx.grad(loss))(m, case.batch)
      return grads, nnx.state(m)  # the state after: Dropout's rng counts

    (want, want_state), (got, got_state) = step(rm.plain_call(case, model)), step(r.fn)
    _assert_close(want_state, got_state)
  else:
    want = jax.jit(jax.grad(rm.loss(case, model.apply)))(variables, case.batch)
    got = jax.jit(jax.grad(rm.loss(case, r.fn)))(variables, case.batch)
    if "mutable" in case.kwargs:  # the updated BatchNorm statistics too
      state = lambda fn: jax.jit(lambda v, x: fn(v, x, **case.kwargs)[1])
      _assert_close(state(model.apply)(variables, case.batch), state(r.fn)(variables, case.batch))
  _assert_close(want, got)


@pytest.mark.parametrize("name", rm.NAMES)
def test_footprint_matches_per_block_remat_and_best_uniform(name):
  case, model, variables, r = _setup(name)
  default = rm.footprint(case, r.fn, model, variables)
  remat_model, remat_variables = rm.init(case, remat=True)
  per_block = rm.footprint(case, rm.plain_call(case, remat_model), remat_model, remat_variables)
  assert default <= (1 + PER_BLOCK_SLACK) * per_block, (default, per_block)
  n = r.chain.n
  uniform = {k: rm.footprint(case, rm.apply(case, model, variables, plan=uniform_plan(n, k),
                                             verify=False).fn, model, variables)
             for k in range(1, n)}
  assert default <= min(uniform.values()), (default, uniform)


class _Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(256)(nn.LayerNorm()(x))))


class _Body(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(6):
      x = _Block()(x)
    return x


class _Wrapped(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(4)(_Body()(nn.Dense(64)(x)))


def test_a_coarse_plan_warns_with_the_granularity_that_saves_more():
  """layer_depth=1 leaves one layer with nearly all residuals: the plan saves little and
  apply says which layer_depth plans inside it; the default finds finer layers and saves
  more, without the warning."""
  x = jnp.ones((64, 16))
  model = _Wrapped()
  params = model.init(jax.random.key(0), x)
  with pytest.warns(jaxremat.CoarseLayersWarning, match=r"'_Body_0' holds \d+% .*layer_depth=2"):
    coarse = jaxremat.apply(model.apply, params, x, layer_depth=1, verify=False)
  fine = jaxremat.apply(model.apply, params, x, verify=False)
  assert fine.predicted_total_bytes < coarse.predicted_total_bytes


class _SharedStack(nn.Module):
  """One block called four times (ALBERT's shared weights)."""

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(64)(x)
    block = _Block(name="shared_block")
    for _ in range(4):
      x = block(x)
    return nn.Dense(4)(x)


def test_each_call_of_a_block_called_several_times_is_a_layer():
  """A user's trial: the four calls of a shared-weight block were one layer, planned
  whole (a 9% saving); each call is a layer now, by default and at a fixed depth, and
  XLA measures the plan below the model as written, with the same gradients."""
  x = jnp.ones((64, 16))
  model = _SharedStack()
  params = model.init(jax.random.key(0), x)
  r = jaxremat.apply(model.apply, params, x)
  assert r.chain.names[1:5] == ("shared_block", "shared_block#2", "shared_block#3",
                                "shared_block#4")
  assert "'shared_block' (4 calls)" in r.decomposition
  assert r.measured_total_bytes < 0.8 * r.as_written_bytes
  fixed = jaxremat.apply(model.apply, params, x, layer_depth=1, verify=False)
  assert fixed.chain.names == r.chain.names
  loss = lambda fn: lambda p: jnp.sum(fn(p, x) ** 2)  # noqa: E731
  _assert_close(jax.grad(loss(model.apply))(params), jax.grad(loss(r.fn))(params))


class _NnxResidual(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.up = nnx.Linear(64, 128, rngs=rngs)
    self.down = nnx.Linear(128, 64, rngs=rngs)

  def __call__(self, x):
    return x + self.down(nnx.relu(self.up(x)))


class _NnxShared(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.inp = nnx.Linear(16, 64, rngs=rngs)
    self.block = _NnxResidual(rngs)
    self.out = nnx.Linear(64, 4, rngs=rngs)

  def __call__(self, x):
    x = self.inp(x)
    for _ in range(3):
      x = self.block(x)
    return self.out(x)


def test_each_call_of_an_nnx_block_called_several_times_is_a_layer():
  r = jaxremat.apply_nnx(_NnxShared(nnx.Rngs(0)), jnp.ones((8, 16)), verify=False)
  assert r.chain.names == ("inp", "block", "block#2", "block#3", "out")


class _HalfRemat(nn.Module):
  """The first two of four blocks under ``nn.remat``, as a user placed them."""

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(32)(x)
    for i in range(4):
      x = (nn.remat(_Block) if i < 2 else _Block)(name=f"block_{i}")(x)
    return nn.Dense(4)(x)


def test_blocks_under_nn_remat_keep_their_names_and_are_layers():
  """A user's trial: the calls of ``nn.remat(Block)`` (a checkpoint whose own name stack
  stops at the caller) were one layer named '(remat2)', no checkpoint between them."""
  x = jnp.ones((16, 16))
  model = _HalfRemat()
  params = model.init(jax.random.key(0), x)
  with warnings.catch_warnings():  # too small for a checkpoint to save (XLA agrees)
    warnings.simplefilter("ignore", jaxremat.NoSavingWarning)
    r = jaxremat.apply(model.apply, params, x, verify=False)
  assert r.chain.names[1:5] == ("block_0", "block_1", "block_2", "block_3")
  loss = lambda fn: lambda p: jnp.sum(fn(p, x) ** 2)  # noqa: E731
  _assert_close(jax.grad(loss(model.apply))(params), jax.grad(loss(r.fn))(params))


class _Twice(nn.Module):
  relu: bool

  @nn.compact
  def __call__(self, x):
    d = nn.Dense(x.shape[-1])
    x = d(d(x))
    return nn.relu(x) if self.relu else x


class _Siamese(nn.Module):
  @nn.compact
  def __call__(self, x):
    enc = _Block(name="enc")
    return nn.Dense(4)(jnp.concatenate([enc(x["a"]), enc(x["b"])], -1))


class _SharedRemat(nn.Module):
  @nn.compact
  def __call__(self, x):
    blk = nn.remat(_Block)(name="blk")
    for _ in range(3):
      x = blk(x)
    return nn.Dense(4)(x)


@pytest.mark.filterwarnings("ignore::jaxremat.CoarseLayersWarning")
@pytest.mark.filterwarnings("ignore::jaxremat.NoSavingWarning")
def test_calls_are_layers_only_when_the_module_itself_is_called_in_a_loop():
  """A review: a module applying one child twice in one call (with or without more work
  after it) is one call; a shared encoder called side by side on two inputs (Siamese)
  is not a loop, and stays one layer of a chain; a shared nn.remat block called in a
  loop (a checkpoint equation per call) is a layer per call."""
  x = jnp.ones((8, 16))
  for relu in (True, False):
    model = nn.Sequential([nn.Dense(16), _Twice(relu), nn.Dense(4)])
    params = model.init(jax.random.key(0), x)
    r = jaxremat.apply(model.apply, params, x, layer_depth=1, verify=False)
    assert r.chain.names == ("layers_0", "layers_1", "layers_2")
  pair = {"a": x, "b": x + 1}
  params = _Siamese().init(jax.random.key(0), pair)
  r = jaxremat.apply(_Siamese().apply, params, pair, verify=False)
  assert r.chain.names[0] == "enc" and "enc#2" not in r.chain.names and not r.is_graph
  params = _SharedRemat().init(jax.random.key(0), x)
  r = jaxremat.apply(_SharedRemat().apply, params, x, verify=False)
  assert r.chain.names == ("blk", "blk#2", "blk#3", "Dense_0")


class _AuxBlock(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(64)(nn.LayerNorm()(x)))), jnp.mean(x)


class _AuxDecoder(nn.Module):
  @nn.compact
  def __call__(self, x):
    for i in range(4):
      x, _ = _AuxBlock(name=f"block_{i}")(x, None)
    return nn.LayerNorm()(x)


class _AuxTransformer(nn.Module):
  """Blocks two levels down; an auxiliary loss of the decoder's output beside the logits
  (a user's trial: read across the head, it made the model a graph)."""

  scanned: bool = False

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(16)(x)
    if self.scanned:
      x, aux = nn.scan(_AuxBlock, variable_axes={"params": 0}, split_rngs={"params": True},
                       length=4)(name="layers")(x, None)
      return nn.Dense(4)(x), {"aux_loss": jnp.mean(aux)}
    h = _AuxDecoder(name="decoder")(x)
    return nn.Dense(4)(h), {"aux_loss": jnp.mean(h ** 2)}


def _aux_loss(fn):
  def loss(p, x):
    logits, aux = fn(p, x)
    return jnp.mean(jnp.square(logits)) + aux["aux_loss"]
  return loss


@pytest.mark.parametrize("scanned", [False, True])
def test_an_auxiliary_output_joins_the_layer_it_reads(scanned):
  model, x = _AuxTransformer(scanned), jax.random.normal(jax.random.key(1), (64, 8))
  params = model.init(jax.random.key(0), x)
  r = jaxremat.apply(model.apply, params, x)
  assert not r.is_graph
  if scanned:
    assert [s.name for s in r.scans] == ["layers"] and r.scans[0].rematerialised
  else:
    assert "descended into 'decoder'" in r.decomposition
    assert "decoder/block_3" in r.chain.names
  assert r.measured_total_bytes < r.as_written_bytes
  want = jax.jit(jax.grad(_aux_loss(model.apply)))(params, x)
  _assert_close(want, jaxremat.jit(jax.grad(_aux_loss(r.fn)))(params, x))
  if not scanned:  # fit takes chains: it takes this one now
    fitted = jaxremat.fit(model.apply, params, x, 0.5)
    assert fitted.measured_total_bytes <= fitted.budget_bytes


def test_values_computed_from_keyword_arrays_before_the_layers_are_noted():
  """A captioner's embedding of ``tokens=`` (a keyword array) is read by the next layer,
  so it runs in the prelude, outside the plan, held for the whole step: the decomposition
  says so, with its bytes (batch x length x width float32)."""

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      return x + nn.Dense(32)(nn.relu(nn.Dense(32)(x)))

  class Captioner(nn.Module):
    @nn.compact
    def __call__(self, image, tokens):
      x = nn.Embed(256, 32)(tokens) + nn.Dense(32)(image)[:, None]
      for _ in range(3):
        x = Block()(x)
      return nn.Dense(256)(x)

  model = Captioner()
  image, tokens = jnp.ones((4, 16)), jnp.zeros((4, 64), jnp.int32)
  variables = model.init(jax.random.key(0), image, tokens=tokens)
  traced = trace(model.apply, variables, image, {"tokens": tokens})
  assert f"1 value(s) computed from tokens= before the layers ({4 * 64 * 32 * 4} bytes)" in (
      traced.decomposition)
  plain = trace(lambda v, xs: model.apply(v, xs[0], tokens=xs[1]), variables, (image, tokens), {})
  assert "computed from" not in plain.decomposition  # in the batch, the layers make it
