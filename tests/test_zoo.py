"""Every zoo model traces as a chain; remat keeps its gradients and lowers XLA's footprint."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxremat
from jaxremat import zoo

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

KEY = jax.random.key(0)
IMG = jax.random.normal(KEY, (4, 16, 16, 3))
CIFAR = jax.random.normal(KEY, (2, 32, 32, 3))  # VGG halves 32 px five times
BN = {"mutable": ["batch_stats"]}
TOKENS = jax.random.randint(KEY, (4, 16), 0, 32)

# (name, model, input, kwargs for apply, tolerance): tiny configurations of each family.
TINY = [
    ("vgg11", zoo.vgg("vgg11", width=1 / 16, hidden=16), CIFAR, {}, 1e-5),
    ("resnet50-style", zoo.resnet((1, 1), width=4, block="bottleneck", stem="imagenet"), CIFAR,
     BN, 1e-4),
    ("vit-bf16", zoo.vit(patch=4, dim=16, depth=2, num_heads=2, dtype=jnp.bfloat16),
     IMG.astype(jnp.bfloat16), {}, 3e-2),
    ("gpt-causal", zoo.gpt(vocab_size=32, max_len=16, dim=16, depth=2, num_heads=2), TOKENS, {},
     1e-5),
    ("mlp-uneven", zoo.mlp([64, 256, 16, 128, 10]), jax.random.normal(KEY, (16, 24)), {}, 1e-5),
]
IDS = [t[0] for t in TINY]


def _loss(fn, kwargs, with_outputs=False):
  """A scalar of every float output (with BatchNorm: the updated batch_stats too)."""
  def loss(params, x):
    out = fn(params, x, **kwargs)
    leaves = jax.tree_util.tree_leaves(out)
    value = sum(jnp.mean(jnp.square(leaf.astype(jnp.float32))) for leaf in leaves)
    return (value, out) if with_outputs else value
  return loss


def _assert_trees_close(want, got, tol):
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
  leaves = jax.tree_util.tree_leaves(got)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(want), leaves):
    x32, y32 = np.asarray(x, np.float32), np.asarray(y, np.float32)
    scale = max(1.0, float(np.max(np.abs(x32))))
    np.testing.assert_allclose(y32, x32, atol=tol * scale, rtol=tol,
                               err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module", params=TINY, ids=IDS)
def tiny(request):
  name, model, x, kwargs, tol = request.param
  params = jax.jit(model.init)(KEY, x)
  return name, model, params, x, kwargs, tol, jaxremat.apply(model.apply, params, x, **kwargs)


def _compiled_step(fn, kwargs, params, x):
  """The jitted gradient step (gradients and outputs), compiled as XLA would run it; on CPU
  with the optimization barriers kept (docs/design.md), so that remat is not undone."""
  cpu = jax.default_backend() == "cpu"
  keep = {"xla_disable_hlo_passes": "cse_barrier_expander"} if cpu else None
  step = jax.jit(jax.grad(_loss(fn, kwargs, with_outputs=True), has_aux=True))
  return step.lower(params, x).compile(compiler_options=keep)


def _footprint(compiled):
  stats = compiled.memory_analysis()
  return (stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
          - stats.alias_size_in_bytes)


def test_remat_keeps_gradients_and_state_and_lowers_xla_footprint(tiny):
  name, model, params, x, kwargs, tol, r = tiny
  modules = sum(isinstance(layer, nn.Module) for layer in model.layers)
  assert r.chain.n >= modules  # each module is a layer; runs of functions between them too
  assert r.plan.checkpoints  # the plan does rematerialise
  plain = _compiled_step(model.apply, kwargs, params, x)
  remat = _compiled_step(r.fn, kwargs, params, x)
  want_grads, want_out = plain(params, x)
  got_grads, got_out = remat(params, x)
  _assert_trees_close(want_grads, got_grads, tol)
  _assert_trees_close(want_out, got_out, tol)  # outputs, and batch_stats where mutable
  assert _footprint(remat) < _footprint(plain), (name, r.plan, _footprint(remat), _footprint(plain))


def test_flax_remat_of_every_layer_keeps_variables_and_gradients():
  model = zoo.resnet((1,), width=4, block="bottleneck")
  params = jax.jit(model.init)(KEY, IMG)
  remat = zoo.remat_layers(model)
  assert (jax.tree_util.tree_structure(jax.eval_shape(remat.init, KEY, IMG))
          == jax.tree_util.tree_structure(params))
  want = jax.jit(jax.grad(_loss(model.apply, BN)))(params, IMG)
  _assert_trees_close(want, jax.jit(jax.grad(_loss(remat.apply, BN)))(params, IMG), 1e-4)
  jaxpr = str(jax.make_jaxpr(lambda p: remat.apply(p, IMG, **BN))(params))
  assert jaxpr.count("prevent_cse=True") == len(model.layers)  # one checkpoint per layer


def test_model_shapes():
  assert type(zoo.resnet_by_name("resnet50", width=1 / 16).layers[3]) is zoo.BottleneckBlock
  blocks = [len(zoo.resnet_by_name(n).layers) - 5 for n in ("resnet18", "resnet50", "resnet152")]
  assert blocks == [8, 16, 50]
  vgg224 = zoo.vgg("vgg19", num_classes=1000, hidden=4096)
  x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
  params = jax.eval_shape(vgg224.init, KEY, x)
  assert params["params"]["layers_38"]["kernel"].shape == (7 * 7 * 512, 4096)
  assert jax.eval_shape(vgg224.apply, params, x).shape == (1, 1000)


def test_gpt_is_causal():
  gpt = zoo.gpt(vocab_size=32, max_len=16, dim=16, depth=1, num_heads=2)
  params = jax.jit(gpt.init)(KEY, TOKENS)
  run = jax.jit(gpt.apply)
  logits = run(params, TOKENS)
  assert logits.shape == (4, 16, 32)
  changed = run(params, TOKENS.at[:, -1].set((TOKENS[:, -1] + 1) % 32))
  np.testing.assert_allclose(changed[:, :-1], logits[:, :-1], rtol=1e-5, atol=1e-6)
  assert not np.allclose(changed[:, -1], logits[:, -1])


def test_bad_names_are_rejected():
  with pytest.raises(ValueError, match="unknown ResNet 'resnet17'"):
    zoo.resnet_by_name("resnet17")
  with pytest.raises(ValueError, match="block must be one of"):
    zoo.resnet((1,), block="wide")
  assert isinstance(zoo.remat_layers(zoo.mlp([4, 4])), nn.Sequential)


def test_scanned_gpt_runs_segmented_with_the_plain_gradients():
  """``gpt(scan=True)``: the blocks as one nn.scan over stacked parameters; apply segments
  the stack, with the plain model's gradients and a smaller footprint."""
  model = zoo.gpt(vocab_size=32, max_len=16, dim=16, depth=4, num_heads=2, scan=True)
  params = jax.jit(model.init)(KEY, TOKENS)
  assert params["params"]["layers_1"]["blocks"]["Dense_0"]["kernel"].shape == (4, 16, 64)
  r = jaxremat.apply(model.apply, params, TOKENS)
  assert [s.length for s in r.scans] == [4] and r.scans[0].rematerialised
  plain = _compiled_step(model.apply, {}, params, TOKENS)
  remat = _compiled_step(r.fn, {}, params, TOKENS)
  for want, got in zip(plain(params, TOKENS), remat(params, TOKENS)):
    _assert_trees_close(want, got, 1e-5)
  assert _footprint(remat) < _footprint(plain)
