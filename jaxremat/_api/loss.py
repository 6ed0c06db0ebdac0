"""The training step jaxremat measures: one scalar loss for verify, the CLI and bench/."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.trace import merge_kwargs, split_kwargs


LossFn = Callable[[Any], Any]  # the model's output -> a float scalar


def training_loss(fn: Callable[..., Any], model_kwargs: Mapping[str, Any],
                  loss_fn: LossFn | None = None) -> Callable[..., Any]:
  """``loss(params, batch)``: ``loss_fn`` of ``fn``'s output (the user's training loss),
  by default the sum of the mean squares of its float outputs.

  With Flax's ``mutable=``, the output is ``(prediction, updated collections)`` and only
  the prediction is read, as a training loss reads it: the updated BatchNorm statistics
  are state, not differentiated.
  """
  def loss(params: Any, batch: Any) -> jax.Array | int:  # 0 when no output is float
    out = training_output(fn(params, batch, **model_kwargs), model_kwargs)
    if loss_fn is not None:
      return loss_fn(out)
    leaves = jax.tree_util.tree_leaves(out)
    return sum(jnp.mean(jnp.square(x.astype(jnp.float32)))
               for x in leaves if _compat.is_float(x))
  return loss


def training_output(out: Any, model_kwargs: Mapping[str, Any]) -> Any:
  """What a training loss reads of a model's output ``out``: with Flax's ``mutable=``,
  the prediction of ``(prediction, updated collections)``; else ``out``."""
  if model_kwargs.get("mutable", False) and isinstance(out, tuple) and len(out) == 2:
    return out[0]
  return out


def training_loss_with_arrays(fn: Callable[..., Any], model_kwargs: Mapping[str, Any],
                              loss_fn: LossFn | None = None
                              ) -> tuple[Callable[..., Any], list[Any]]:
  """``(loss(params, batch, arrays), arrays)``: ``training_loss`` with the array leaves
  of ``model_kwargs`` as its third argument, so that a compiled step takes them as
  arguments, not constants: an nnx model's state cannot be closed over by a trace (its
  variables belong to the caller's), and a ``jax.ShapeDtypeStruct`` has no value."""
  arrays, treedef, static = split_kwargs(dict(model_kwargs))

  def loss(params: Any, batch: Any, arrays: Any) -> jax.Array | int:
    return training_loss(fn, merge_kwargs(arrays, treedef, static), loss_fn)(params, batch)
  return loss, arrays


def batch_with_arrays(loss: Callable[..., Any]) -> Callable[[Any, Any], Any]:
  """``loss(params, batch, arrays)`` as ``loss(params, (batch, arrays))``: the form
  ``jaxremat.measure`` compiles."""
  return lambda params, inputs: loss(params, *inputs)
