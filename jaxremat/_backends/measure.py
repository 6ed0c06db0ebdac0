"""Measure a training step's memory with XLA's compiled statistics."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax

from jaxremat._backends.barriers import barrier_options, keeping_barriers
from jaxremat._backends.registry import backend_for
from jaxremat._errors import InvalidArgumentError, UnsupportedModelError


@dataclasses.dataclass(frozen=True)
class Footprint:
  """XLA's compiled memory statistics of one program, in bytes.

  ``total_bytes = argument_bytes + output_bytes + temp_bytes - alias_bytes``.
  """

  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  alias_bytes: int
  flops: float
  backend: str
  compiler_options: Mapping[str, str | bool]

  @property
  def total_bytes(self) -> int:
    return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

  def __str__(self) -> str:
    mib = lambda n: f"{n / 2**20:.2f} MiB"  # noqa: E731
    return (f"{mib(self.total_bytes)} ({self.total_bytes} bytes) on {self.backend}: "
            f"argument {mib(self.argument_bytes)} + output {mib(self.output_bytes)} + temp "
            f"{mib(self.temp_bytes)} - alias {mib(self.alias_bytes)}")

  @property
  def barriers_kept(self) -> bool:
    """False on CPU when the barrier expander ran (remat would be silently undone)."""
    needed = backend_for(self.backend).compiler_options()
    return all(str(value) in str(self.compiler_options.get(key, ""))
               for key, value in needed.items())


def default_compiler_options(backend: str | None = None) -> dict[str, str | bool]:
  """The options under which remat is real on ``backend`` (CPU: keep the barriers)."""
  return backend_for(backend).compiler_options()


def memory_stats(compiled: Any) -> Any:
  """``compiled.memory_analysis()``, or an error when the compiler gives none."""
  stats = compiled.memory_analysis()
  if stats is None:
    raise UnsupportedModelError(
        "XLA reports no memory statistics for the compiled step on this backend, so "
        "jaxremat cannot measure it.")
  return stats


#: XLA:CPU options for a compile made only for its memory statistics: LLVM's
#: optimization shapes the machine code, not XLA's buffers or schedule (the plain steps of
#: the 23 benchmark models dumped the same values, offsets and schedule without it) and
#: takes a quarter to half of the compile.
MEASURE_ONLY_OPTIONS: dict[str, str | bool] = {"xla_backend_optimization_level": "0"}


def compile_footprint(
    fn: Callable[..., Any], *args: Any, compiler_options: Mapping[str, str | bool] | None = None
) -> Footprint:
  """Compiles ``jax.jit(fn)(*args)`` and returns its footprint.

  On CPU the barrier expander is always disabled (added to any given
  ``xla_disable_hlo_passes``), so that ``jax.checkpoint`` is not undone, and LLVM's
  optimization is off unless ``compiler_options`` sets it (``MEASURE_ONLY_OPTIONS``):
  the program is compiled to be measured, not run.
  """
  if jax.default_backend() == "cpu":
    compiler_options = {**MEASURE_ONLY_OPTIONS, **(compiler_options or {})}
  return compile_step(fn, *args, compiler_options=compiler_options)[0]


def compile_step(
    fn: Callable[..., Any], *args: Any, compiler_options: Mapping[str, str | bool] | None = None
) -> tuple[Footprint, Any]:
  """``compile_footprint``'s footprint and the compiled program itself (callable with
  ``args``, to run or time it)."""
  backend = jax.default_backend()
  options = barrier_options(compiler_options, backend)
  with keeping_barriers():  # traced for a compile that keeps them
    lowered = jax.jit(fn).lower(*args)
  compiled = lowered.compile(compiler_options=options or None)
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return footprint_of(compiled, float((cost or {}).get("flops", 0.0)), backend, options), compiled


def footprint_of(compiled: Any, flops: float, backend: str,
                 options: Mapping[str, str | bool]) -> Footprint:
  """The ``Footprint`` of a compiled program from its memory statistics (``memory_stats``)."""
  stats = memory_stats(compiled)
  return Footprint(
      argument_bytes=int(stats.argument_size_in_bytes),
      output_bytes=int(stats.output_size_in_bytes),
      temp_bytes=int(stats.temp_size_in_bytes),
      alias_bytes=int(stats.alias_size_in_bytes),
      flops=flops, backend=backend, compiler_options=options)


def check_scalar_loss(out: Any, call: str = "params, batch") -> None:
  """Raises unless ``out`` (a loss's abstract value) is a float scalar; ``call``: the
  loss's arguments, for the fix of a ``(loss, aux)`` pair."""
  if getattr(out, "shape", None) == () and jax.numpy.issubdtype(out.dtype, jax.numpy.floating):
    return
  if isinstance(out, (tuple, list)) and out and getattr(out[0], "shape", None) == ():
    raise InvalidArgumentError(
        f"loss_fn must return a float scalar to differentiate, got a {type(out).__name__} "
        f"of {len(out)} whose first is a scalar, as jax.value_and_grad(..., has_aux=True) "
        f"takes (loss, aux); jaxremat differentiates the loss alone: pass "
        f"lambda {call}: loss_fn({call})[0].")
  raise InvalidArgumentError(
      f"loss_fn must return a float scalar to differentiate, got "
      f"{getattr(out, 'shape', type(out).__name__)} {getattr(out, 'dtype', '')}".rstrip()
      + "; reduce the model output to one number, e.g. jnp.mean(jnp.square(out)).")


def gradient_step(loss_fn: Callable[..., Any]) -> Callable[..., Any]:
  """The training step jaxremat compiles: ``jax.grad(loss_fn)`` with respect to the first
  argument's float leaves; integer leaves (a step counter or quantised weights kept in the
  parameters) get float0 gradients, as ``jax.grad(..., allow_int=True)`` gives them."""
  return jax.grad(loss_fn, allow_int=True)


def measure(
    loss_fn: Callable[..., Any],
    params: Any,
    batch: Any,
    *,
    compiler_options: Mapping[str, str | bool] | None = None,
) -> Footprint:
  """XLA's footprint of the gradient step ``jax.grad(loss_fn)(params, batch)``.

  Args:
    loss_fn: ``loss_fn(params, batch) -> scalar``.
    params: the parameters (any pytree of arrays); gradients are taken with respect
      to their float leaves.
    batch: the batch (any pytree of arrays).
    compiler_options: extra XLA options (e.g. ``{"xla_disable_hlo_passes":
      "rematerialization"}`` on GPU to measure a plan without XLA's own remat).

  Returns:
    The compiled step's ``Footprint``; ``total_bytes`` is the figure to compare.

  Raises:
    InvalidArgumentError: ``loss_fn`` does not return a float scalar.
  """
  with keeping_barriers():  # a shape check, not a compile
    check_scalar_loss(jax.eval_shape(loss_fn, params, batch))
  return compile_footprint(gradient_step(loss_fn), params, batch,
                           compiler_options=compiler_options)
