"""Whether a compile keeps jax.checkpoint's barriers: XLA's CPU compiler removes them by default."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Mapping

import jax

#: The XLA pass that, on CPU, turns the optimization barriers of ``jax.checkpoint`` into
#: plain values, after which common-subexpression elimination merges the recomputation
#: back into the forward pass: remat silently does nothing.
BARRIER_PASS = "cse_barrier_expander"

_KEPT: contextvars.ContextVar[bool] = contextvars.ContextVar("jaxremat_barriers_kept", default=False)


def barrier_options(options: Mapping[str, str | bool] | None = None,
                    platform: str | None = None) -> dict[str, str | bool]:
  """``options`` with, on CPU, ``BARRIER_PASS`` added to ``xla_disable_hlo_passes``."""
  merged: dict[str, str | bool] = dict(options or {})
  if (platform or jax.default_backend()) == "cpu":
    present = [p for p in str(merged.get("xla_disable_hlo_passes", "")).split(",") if p]
    merged["xla_disable_hlo_passes"] = ",".join(dict.fromkeys([*present, BARRIER_PASS]))
  return merged


@contextlib.contextmanager
def keeping_barriers() -> Iterator[None]:
  """Marks what is traced inside as compiled with the barriers kept (``jaxremat.jit``)."""
  token = _KEPT.set(True)
  try:
    yield
  finally:
    _KEPT.reset(token)


def barriers_kept(platform: str | None = None) -> bool:
  """False when a CPU compile of what is being traced may drop the barriers: not inside
  ``keeping_barriers`` and no process-wide ``XLA_FLAGS`` disabling ``BARRIER_PASS``."""
  if (platform or jax.default_backend()) != "cpu" or _KEPT.get():
    return True
  return BARRIER_PASS in os.environ.get("XLA_FLAGS", "")
