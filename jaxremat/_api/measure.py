"""``jaxremat.measure``: XLA's footprint of a gradient step, for linen params or an nnx model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax import nnx

from jaxremat._api.loss import LossFn, batch_with_arrays, training_loss_with_arrays
from jaxremat._backends.barriers import keeping_barriers
from jaxremat._backends.measure import (Footprint, check_scalar_loss, compile_footprint,
                                        gradient_step)
from jaxremat._backends.targets import Target, get_target, target_footprint
from jaxremat._backends.measure import measure as measure_params


def measure(
    loss_fn: Callable[..., Any],
    params: Any,
    batch: Any,
    *,
    wrt: Any = nnx.Param,
    target: str | Target | None = None,
    compiler_options: Mapping[str, str | bool] | None = None,
) -> Footprint:
  """XLA's footprint of the gradient step ``jax.grad(loss_fn)(params, batch)``.

  Args:
    loss_fn: ``loss_fn(params, batch) -> scalar``; for a flax.nnx model,
      ``loss_fn(model, batch) -> scalar``.
    params: the parameters (any pytree of arrays or ``jax.ShapeDtypeStruct``s), or an
      ``nnx.Module``: then the state ``wrt`` selects is differentiated (as
      ``nnx.grad`` does) and the rest of its state is an argument of the step.
    batch: the batch (any pytree of arrays).
    wrt: for an nnx model, the filter of the differentiated state.
    target: compile for this GPU instead of the local backend, from any machine (no GPU
      needed): ``"h100"``, ``"h200"``, ``"a100"``, a target-config text or file, or a
      ``Target``.
      Params and batch may then be ``jax.ShapeDtypeStruct``s; nothing is allocated.
    compiler_options: extra XLA options (e.g. ``{"xla_disable_hlo_passes":
      "rematerialization"}`` on GPU to measure a plan without XLA's own remat).

  Returns:
    The compiled step's ``Footprint``; ``total_bytes`` is the figure to compare.

  Raises:
    InvalidArgumentError: ``loss_fn`` does not return a float scalar, or ``target`` is
      not a GPU target.
    TargetUnavailableError: JAX's CUDA plugin, needed for ``target``, is not usable.
  """
  resolved = get_target(target)
  if not isinstance(params, nnx.Module):
    if resolved is None:
      return measure_params(loss_fn, params, batch, compiler_options=compiler_options)
    with keeping_barriers():  # GPU compiles keep jax.checkpoint's barriers
      check_scalar_loss(jax.eval_shape(loss_fn, params, batch))
      return target_footprint(gradient_step(loss_fn), (params, batch), resolved, compiler_options)
  graphdef, state = nnx.split(params)

  def loss(state: Any, batch: Any) -> Any:
    return loss_fn(nnx.merge(graphdef, state), batch)

  def grad_step(state: Any, batch: Any) -> Any:
    return nnx.grad(loss_fn, argnums=nnx.DiffState(0, wrt))(nnx.merge(graphdef, state), batch)

  with keeping_barriers():
    check_scalar_loss(jax.eval_shape(loss, state, batch), "model, batch")
    if resolved is not None:
      return target_footprint(grad_step, (state, batch), resolved, compiler_options)
  return compile_footprint(grad_step, state, batch, compiler_options=compiler_options)


def step_bytes(fn: Callable[..., Any], model_kwargs: Mapping[str, Any], params: Any,
               batch: Any, target: Target | None, loss_fn: LossFn | None = None) -> int:
  """XLA's footprint (bytes) of the training step (``training_loss`` with ``loss_fn``) of
  ``fn``, a model function or a drop-in, called with ``model_kwargs`` (their array leaves
  are arguments of the step), compiled for ``target`` (None: the local backend)."""
  loss, arrays = training_loss_with_arrays(fn, model_kwargs, loss_fn)
  return measure(batch_with_arrays(loss), params, (batch, arrays), target=target).total_bytes
