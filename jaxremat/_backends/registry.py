"""The backend of each XLA platform, registered by name as JAX registers lowering rules."""

from __future__ import annotations

from typing import Any

import jax

from jaxremat._backends.base import Backend
from jaxremat._backends.cpu import CpuBackend
from jaxremat._backends.generic import GenericBackend
from jaxremat._backends.gpu import GpuBackend

_BACKENDS: dict[str, Backend[Any]] = {}


def register_backend(platform: str, backend: Backend[Any]) -> None:
  """Makes ``backend`` the one of ``platform`` (a name ``jax.default_backend()`` gives)."""
  _BACKENDS[platform] = backend


def backend_for(platform: str | None = None) -> Backend[Any]:
  """The backend of ``platform`` (default: JAX's default backend); a platform without
  one of its own gets a ``GenericBackend``."""
  platform = platform or jax.default_backend()
  return _BACKENDS.get(platform) or GenericBackend(platform)


register_backend("cpu", CpuBackend())
for _platform in ("gpu", "cuda", "rocm"):
  register_backend(_platform, GpuBackend())
