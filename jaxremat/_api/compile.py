"""``jaxremat.jit``: ``jax.jit`` that keeps remat on every backend (CPU included)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import jax

from jaxremat._backends.barriers import barrier_options, barriers_kept, keeping_barriers
from jaxremat._jaxpr import compat as _compat


class RematUndoneWarning(UserWarning):
  """A rematerialised function is traced for a CPU compile that removes its barriers."""


def jit(fun: Callable[..., Any] | None = None, /, **jit_kwargs: Any) -> Any:
  """``jax.jit(fun, **jit_kwargs)`` compiled so that ``jax.checkpoint`` is kept.

  On CPU, XLA removes ``jax.checkpoint``'s optimization barriers unless compiled with
  ``compiler_options={"xla_disable_hlo_passes": "cse_barrier_expander"}``, and then merges
  the recomputation back into the forward pass, so remat does nothing. This adds that
  option (to any ``compiler_options`` given) on CPU; other backends keep the barriers
  and get ``jax.jit`` unchanged. Use it as ``jaxremat.jit(step)``, ``@jaxremat.jit`` or
  ``@jaxremat.jit(donate_argnums=(0, 1))``.

  Args:
    fun: the function to compile; omitted, a decorator taking it is returned.
    **jit_kwargs: ``jax.jit``'s options (``donate_argnums``, ``static_argnames``, ...).

  Returns:
    The jitted function.
  """
  if fun is None:
    return functools.partial(jit, **jit_kwargs)
  options = barrier_options(jit_kwargs.pop("compiler_options", None))

  @functools.wraps(fun)
  def kept(*args: Any, **kwargs: Any) -> Any:
    with keeping_barriers():
      return fun(*args, **kwargs)

  return jax.jit(kept, compiler_options=options or None, **jit_kwargs)


def warn_if_barriers_dropped(traced_inputs: list[Any]) -> None:
  """Warns (``RematUndoneWarning``) when a drop-in is traced on CPU outside ``jaxremat.jit``
  (or ``jaxremat.measure``) and without the process-wide flag: a ``jax.jit`` compile of it
  would run without remat."""
  tracing = any(_compat.is_staged(x) for x in traced_inputs)  # eager grad: no compile
  if tracing and not barriers_kept():
    warnings.warn(RematUndoneWarning(
        "jaxremat: this rematerialised function is traced for a CPU compile that is not "
        "known to keep jax.checkpoint's barriers; plain jax.jit on CPU removes them, and "
        "XLA may then merge the recomputation back into the forward pass (remat undone, "
        "wholly or in part). Compile the training step with jaxremat.jit, or start the "
        "process with XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander (the way "
        "under nnx.jit). A jax.jit given compiler_options={'xla_disable_hlo_passes': "
        "'cse_barrier_expander'} keeps them too, which this warning cannot see: there, "
        "silence it with warnings.filterwarnings('ignore', "
        "category=jaxremat.RematUndoneWarning)."), stacklevel=3)
