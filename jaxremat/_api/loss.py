"""The training step jaxremat measures: one scalar loss for verify, the CLI and bench/."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxremat._jaxpr import compat as _compat


def training_loss(fn: Callable[..., Any], model_kwargs: Mapping[str, Any]) -> Callable[..., Any]:
  """``loss(params, batch)``: the sum of the mean squares of ``fn``'s float outputs.

  With Flax's ``mutable=``, the output is ``(prediction, updated collections)`` and only
  the prediction is read, as a training loss reads it: the updated BatchNorm statistics
  are state, not differentiated.
  """
  def loss(params: Any, batch: Any) -> jax.Array | int:  # 0 when no output is float
    out = fn(params, batch, **model_kwargs)
    if model_kwargs.get("mutable", False) and isinstance(out, tuple) and len(out) == 2:
      out = out[0]
    leaves = jax.tree_util.tree_leaves(out)
    return sum(jnp.mean(jnp.square(x.astype(jnp.float32)))
               for x in leaves if _compat.is_float(x))
  return loss
