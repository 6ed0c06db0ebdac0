"""The estimate scaled to XLA's step without remat (``ChainPlanner.scaled_to``): the
estimate spreads the bytes over the layers, the compiled step says how many there are."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

import jaxremat
from jaxremat._api.planning import every_k_plans
from jaxremat._model.chain import Plan


class _Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(256, dtype=jnp.bfloat16)(nn.LayerNorm(dtype=jnp.bfloat16)(x))
    return x + nn.Dense(64, dtype=jnp.bfloat16)(nn.gelu(h))


class _Stack(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(4):
      x = _Block()(x)
    return nn.Dense(10)(x)


def _model():
  model = _Stack()
  x = jax.random.normal(jax.random.key(0), (256, 64), jnp.bfloat16)
  return model, model.init(jax.random.key(1), x), x


def test_the_scaled_estimate_predicts_the_plain_step_and_ranks_plans_as_before():
  model, params, x = _model()
  planner = jaxremat.apply(model.apply, params, x, verify=False)._model  # nothing compiled
  assert planner.temp_scale == 1.0
  plain = planner.total_bytes(Plan()) * 3 // 2
  scaled = planner.scaled_to(plain)
  assert scaled.total_bytes(Plan()) == plain
  plans = every_k_plans(planner.chain.n)
  for p in plans:
    temp = planner.total_bytes(p) - planner.fixed_bytes
    assert scaled.total_bytes(p) - scaled.fixed_bytes == round(temp * scaled.temp_scale)
  assert sorted(plans, key=planner.total_bytes) == sorted(plans, key=scaled.total_bytes)
  assert planner.scaled_to(planner.fixed_bytes) is planner  # no temp left to scale to


@pytest.mark.xla
def test_apply_scales_the_estimate_to_the_step_as_written():
  model, params, x = _model()
  r = jaxremat.apply(model.apply, params, x)
  planner = r._model
  assert r.as_written_bytes is not None
  assert planner.total_bytes(Plan()) == r.as_written_bytes  # XLA:CPU's f32 copies counted
  assert planner.temp_scale > 1.2
  assert (f"scale the estimate's temp bytes by {planner.temp_scale:.2f}, so that the model as "
          "written is predicted as XLA measured it") in r.report()
  unscaled = jaxremat.apply(model.apply, params, x, verify=False)._model  # nothing compiled
  assert unscaled.temp_scale == 1.0
  assert planner.solve("optimal") == unscaled.solve("optimal")
