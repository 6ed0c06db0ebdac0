"""The profile read off the compiled plain step (jaxremat/_backends/compiled.py)."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax._src.ad_checkpoint import saved_residuals

import jaxremat
from jaxremat._api.loss import training_loss
from jaxremat._backends.compiled import CompiledProfile, compiled_profile, with_compiled
from jaxremat._backends.profile import profile
from jaxremat._jaxpr.trace import trace

pytestmark = pytest.mark.xla


def _mlp() -> tuple[nn.Module, jax.Array]:
  return (nn.Sequential([nn.Dense(256), nn.relu, nn.Dense(256), nn.relu, nn.Dense(10)]),
          jnp.ones((32, 128)))


def _conv() -> tuple[nn.Module, jax.Array]:
  return (nn.Sequential([nn.Conv(16, (3, 3)), nn.relu, nn.Conv(16, (3, 3)), nn.relu,
                         lambda y: y.reshape(y.shape[0], -1), nn.Dense(10)]),
          jnp.ones((8, 16, 16, 3)))


def _profiled(build: Any) -> tuple[Any, Any, jax.Array, Any, CompiledProfile]:
  model, x = build()
  params = model.init(jax.random.key(0), x)
  traced = trace(model.apply, params, x, {})
  return model, params, x, traced, compiled_profile(traced, training_loss(model.apply, {}),
                                                    params, x)


def _unfused_residual_bytes(model: nn.Module, params: Any, x: jax.Array) -> int:
  """Bytes of what JAX's VJP of the loss saves, computed values only (no fusion)."""
  loss = training_loss(model.apply, {})
  return sum(math.prod(getattr(aval, "shape")) * getattr(aval, "dtype").itemsize
             for aval, why in saved_residuals(loss, params, x)
             if not why.startswith("from the argument") and hasattr(aval, "shape"))


@pytest.mark.parametrize("build", [_mlp, _conv], ids=["mlp", "conv"])
def test_compiled_residuals_are_positive_and_within_temp(build: Any) -> None:
  model, params, x, traced, found = _profiled(build)
  assert len(found.res_bytes) == len(traced.layers)
  assert all(b >= 0 for b in found.res_bytes + found.output_buffer_bytes)
  assert all(0 <= e <= b for e, b in zip(found.input_res_bytes, found.res_bytes))
  assert sum(found.res_bytes) > 0
  # the kept values are all live at the turn, each in XLA's temp once
  temp = jaxremat.measure(training_loss(model.apply, {}), params, x).temp_bytes
  assert sum(found.res_bytes) <= temp
  assert found.temp_bytes == temp


@pytest.mark.parametrize("build", [_mlp, _conv], ids=["mlp", "conv"])
def test_compiled_residuals_at_most_the_unfused_ones(build: Any) -> None:
  model, params, x, _, found = _profiled(build)
  kept = sum(found.res_bytes) + sum(found.output_buffer_bytes)
  assert 0 < kept <= _unfused_residual_bytes(model, params, x)


def test_relu_conv_keeps_less_than_the_jaxpr_profile() -> None:
  """XLA recomputes the first ReLU's output in the backward from the conv's output (a
  fusion), so the compiled chain keeps less than the jaxpr's residuals."""
  model, params, x, traced, found = _profiled(_conv)
  chain = profile(traced).chain
  compiled = with_compiled(chain, found)
  assert compiled.act_bytes == chain.act_bytes and compiled.flops == chain.flops
  assert sum(compiled.res_bytes) <= sum(chain.res_bytes)
  assert sum(compiled.res_bytes) - compiled.input_res_bytes[0] <= _unfused_residual_bytes(
      model, params, x)
  assert compiled.input_res_bytes[0] == chain.input_res_bytes[0]  # the batch, kept as is


def test_with_compiled_rejects_another_chain() -> None:
  _, _, _, traced, found = _profiled(_mlp)
  chain = profile(traced).chain
  short = jaxremat.Chain(chain.act_bytes[:-1], chain.res_bytes[:-1])
  with pytest.raises(ValueError):
    with_compiled(short, found)
