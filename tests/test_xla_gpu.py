"""What XLA's GPU backend keeps and adds (``_xla_gpu``), checked on CPU against the
layers' shapes: the rules read the jaxpr only, so ``profile(backend="gpu")`` runs here."""

import flax.linen as nn
import jax
import pytest
import jax.numpy as jnp

from jaxremat import zoo
from jaxremat._backends import gpu as _xla_gpu
from jaxremat._backends.profile import profile
from jaxremat._jaxpr.trace import trace

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

B, D, H = 8, 64, 256  # batch, model width, hidden width


def _profile(model, x, backend="gpu", **kwargs):
  variables = model.init(jax.random.key(0), x)
  # layer_depth=1: each test module is one layer (the default would split it into its own).
  return profile(trace(model.apply, variables, x, kwargs, layer_depth=1), backend=backend)


class _Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(D)(nn.gelu(nn.Dense(H)(x), approximate=True))


class _Attention(nn.Module):
  @nn.compact
  def __call__(self, x):  # x: (batch, tokens, D), one head
    q, k, v = nn.Dense(D)(x), nn.Dense(D)(x), nn.Dense(D)(x)
    p = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k), axis=-1)
    return jnp.einsum("bqk,bkd->bqd", p, v)


class _ConvBnRelu(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.BatchNorm(use_running_average=False)(nn.Conv(16, (3, 3))(x)))


def test_tanh_gelu_keeps_its_input_and_output_only():
  # GELU's tanh and products are recomputed in the backward's fusion from the first
  # matmul's output; the second matmul reads GELU's output, so that is written.
  x = jnp.ones((B, D))
  hidden = B * H * 4
  gpu = _profile(nn.Sequential([_Mlp(), nn.Dense(8)]), x)
  cpu = _profile(nn.Sequential([_Mlp(), nn.Dense(8)]), x, backend="cpu")
  assert sum(b for b in gpu.buffers.residuals[0] if b == hidden) == 2 * hidden
  assert sum(b for b in cpu.buffers.residuals[0] if b == hidden) > 2 * hidden


def test_softmax_keeps_scores_and_probabilities_not_exp():
  t = 32
  x = jnp.ones((B, t, D))
  scores = B * t * t * 4
  chain_buffers = _profile(nn.Sequential([_Attention(), nn.Dense(8)]), x).buffers
  assert sorted(b for b in chain_buffers.residuals[0] if b == scores) == [scores, scores]


def test_batchnorm_relu_keeps_conv_output_and_relu_output():
  x = jnp.ones((B, 8, 8, 3))
  act = B * 8 * 8 * 16 * 4
  prof = _profile(nn.Sequential([_ConvBnRelu(), nn.Conv(4, (3, 3))]), x, mutable=["batch_stats"])
  # the block's own input is the batch (an argument): conv output only; the relu output
  # is the block's output, kept by the next conv as its input
  assert [b for b in prof.buffers.residuals[0] if b >= act] == [act]
  assert prof.chain.input_res_bytes[1] == act


def test_backward_workspace_is_the_largest_written_cotangent():
  # The MLP's backward writes the hidden layer's cotangent (the second matmul's input
  # gradient, read by the first's transposes): batch x H floats. At batch 512 that is
  # larger than a kernel gradient (D x H floats) written before its transpose.
  x = jnp.ones((512, D))
  model = nn.Sequential([nn.Dense(D), _Mlp(), nn.Dense(8)])
  assert _profile(model, x).chain.workspace_bytes[1] == 512 * H * 4
  assert _profile(model, x, backend="cpu").chain.workspace_bytes[1] == 0


def test_kernel_gradient_before_its_transpose_is_workspace():
  # At batch 8 the largest written backward value is a kernel gradient the matmul
  # writes as [H, D] before transposing it into its [D, H] gradient buffer.
  x = jnp.ones((B, D))
  prof = _profile(nn.Sequential([nn.Dense(D), _Mlp(), nn.Dense(8)]), x)
  assert prof.chain.workspace_bytes[1] == D * H * 4


def test_max_pool_zeros_and_argmax_indices():
  # The scatter target is the pool's operand (f32); the argmax writes one s32 index per
  # operand dimension and pooled element, read by the scatter in the backward.
  x = jnp.ones((B, 16, 16, 8))
  pool = lambda v: nn.max_pool(v, (2, 2), strides=(2, 2))
  operand = B * 16 * 16 * 8 * 4
  indices = 4 * (B * 8 * 8 * 8) * 4
  step = lambda v, ct: jax.vjp(pool, v)[1](ct)
  assert _xla_gpu.pool_buffers(jax.make_jaxpr(step)(x, jnp.ones((B, 8, 8, 8)))) == (operand, indices)
  prof = _profile(nn.Sequential([nn.Conv(8, (3, 3)), pool, zoo.flatten, nn.Dense(4)]), x)
  assert prof.buffers.start[1].until_backward == operand
  assert prof.chain.workspace_bytes[1] >= indices
  assert prof.buffers.start[0].until_backward == 0


def test_gpu_profile_of_a_vit_keeps_less_than_the_jaxpr_saves():
  x = jnp.ones((4, 32, 32, 3))
  model = zoo.vit(patch=4, dim=32, depth=2, num_heads=2)
  gpu, cpu = _profile(model, x), _profile(model, x, backend="cpu")
  for i in (1, 2):  # the transformer blocks
    assert gpu.chain.res_bytes[i] < cpu.chain.res_bytes[i]
    assert gpu.chain.workspace_bytes[i] > 0
