"""Whether a compile keeps jax.checkpoint's barriers: XLA's CPU compiler removes them by default."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Mapping

from jaxremat._backends.registry import backend_for

_KEPT: contextvars.ContextVar[bool] = contextvars.ContextVar("jaxremat_barriers_kept", default=False)


def barrier_options(options: Mapping[str, str | bool] | None = None,
                    platform: str | None = None) -> dict[str, str | bool]:
  """``options`` with the backend's own options for remat added (on CPU, its barrier pass
  joins ``xla_disable_hlo_passes``; comma-separated lists are merged)."""
  merged: dict[str, str | bool] = dict(options or {})
  for key, value in backend_for(platform).compiler_options().items():
    present = [p for p in str(merged.get(key, "")).split(",") if p]
    merged[key] = ",".join(dict.fromkeys([*present, str(value)]))
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
  """False when a compile of what is being traced may drop the barriers: the backend
  needs options for remat, this is not inside ``keeping_barriers``, and the process-wide
  ``XLA_FLAGS`` does not disable the passes those options disable."""
  needed = backend_for(platform).compiler_options().get("xla_disable_hlo_passes")
  if not needed or _KEPT.get():
    return True
  flags = os.environ.get("XLA_FLAGS", "")
  return all(p in flags for p in str(needed).split(","))
