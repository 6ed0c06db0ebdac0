"""What XLA's CPU library (YNNPACK) fusions of a backward pass ask of the forward: full
broadcasts of LayerNorm statistics and softmax denominators, BatchNorm's ``x - mean``
kept whole. Sizes are worked by hand from the shapes; the XLA check is the oracle."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

import jaxremat
from jaxremat._backends import profile as _profile
from jaxremat._jaxpr.trace import trace
from jaxremat._backends.cpu_fusions import library_fusions
from jaxremat.solvers import uniform_plan

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU library fusions of XLA")

B, T, D, H = 4, 16, 32, 64  # batch, tokens, features, hidden
F32 = 4


def _step_jaxpr(fn, *args):
  """The forward-and-backward jaxpr of ``fn`` with the output cotangent as last input."""
  def step(args, ct):
    _, vjp_fn = jax.vjp(fn, *args)
    return vjp_fn(ct)

  out = jax.eval_shape(fn, *args)
  return jax.make_jaxpr(step)(args, jax.ShapeDtypeStruct(out.shape, out.dtype))


def test_layer_norm_writes_its_scale_and_inverse_deviation_in_full():
  ln = nn.LayerNorm()
  x = jnp.ones((B, T, D))
  params = ln.init(jax.random.key(0), x)
  found = library_fusions(_step_jaxpr(lambda p, x: ln.apply(p, x), params, x), 1)
  # sum(g * scale) over features and sum(g * rsqrt(var)) over tokens: two (B, T, D) buffers.
  assert sorted(found.broadcasts) == [B * T * D * F32] * 2


def test_softmax_writes_its_denominator_at_the_scores_size():
  def attend(q, k, v):
    return jax.nn.softmax(q @ k.swapaxes(-1, -2)) @ v

  q = k = v = jnp.ones((B, T, D))
  found = library_fusions(_step_jaxpr(attend, q, k, v), 1)
  # The cotangent of the probabilities (a matmul) divided by the (B, T, 1) sums.
  assert found.broadcasts == (B * T * T * F32,)


def test_a_cheaply_computed_operand_is_not_written():
  def scaled_sum(x, s):
    return jnp.sum(x * (s * s), axis=-1)  # s * s is recomputed inside the fusion

  found = library_fusions(_step_jaxpr(scaled_sum, jnp.ones((B, D)), jnp.ones((1, D))), 1)
  assert found.broadcasts == ()


def test_batch_norm_keeps_the_centred_input_its_reduction_reads():
  bn = nn.BatchNorm(use_running_average=False)
  x = jnp.ones((B, 8, 8, 16))
  variables = bn.init(jax.random.key(0), x)

  def normalise(p, x):
    return bn.apply({**variables, "params": p}, x, mutable=["batch_stats"])[0]

  jaxpr = _step_jaxpr(normalise, variables["params"], x).jaxpr
  found = library_fusions(jaxpr, 1)
  read = [(name, jaxpr.eqns[k].outvars[j].aval.shape) for k, j, name in found.read_whole]
  assert found.broadcasts == ()
  assert ("sub", x.shape) in read  # sum(g * (x - mean)) for the scale's gradient


class _MLPBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(D)(nn.gelu(nn.Dense(H)(x)))


@cpu_only
def test_gelu_keeps_its_input_tanh_and_output_not_its_cdf():
  model = nn.Sequential([_MLPBlock(), _MLPBlock()])
  x = jnp.ones((B, T, D))
  params = model.init(jax.random.key(0), x)
  traced = trace(model.apply, params, x, {}, 1)  # each block one layer
  chain = _profile.profile(traced, backend="cpu").chain
  # The second block saves its input, and of (B, T, H) values the pre-activation, the
  # tanh and the GELU output (its Dense's input); 0.5 * (1 + tanh) is recomputed.
  assert chain.res_bytes[1] == B * T * D * F32 + 3 * B * T * H * F32


class _Block(nn.Module):
  heads: int = 4

  @nn.compact
  def __call__(self, x):
    y = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads, deterministic=True)(y)
    return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(4 * x.shape[-1])(nn.LayerNorm()(x))))


def _transformer_error(batch: int, tokens: int, dim: int, heads: int, k: int) -> float:
  model = nn.Sequential([_Block(heads) for _ in range(4)])
  x = jax.random.normal(jax.random.key(1), (batch, tokens, dim))
  params = model.init(jax.random.key(0), x)
  base = jaxremat.apply(model.apply, params, x)
  plan = jaxremat.Plan(()) if k == 0 else uniform_plan(base.chain.n, k)
  r = jaxremat.apply(model.apply, params, x, plan=plan, verify=False)
  measured = jaxremat.measure(lambda p, b: jnp.mean(jnp.square(r.fn(p, b))), params, x).total_bytes
  return r.predicted_total_bytes / measured - 1


@cpu_only
@pytest.mark.parametrize("k", [0, 1, 2])
def test_transformer_prediction_is_near_xla(k):
  """Before the library fusions were modelled the zoo's GPT was predicted 7-11% below
  XLA's figure; the benchmark records the figures, the bound here is looser."""
  assert abs(_transformer_error(16, 64, 64, 4, k)) < 0.06


@cpu_only
@pytest.mark.xfail(strict=True, reason="measured: with batch x heads x tokens^2 this small, "
                   "XLA runs the softmax backward apart from the matmul and writes no "
                   "denominator broadcast (docs/memory-model.md)")
def test_small_attention_is_predicted_high():
  assert abs(_transformer_error(8, 64, 64, 4, 0)) < 0.06
