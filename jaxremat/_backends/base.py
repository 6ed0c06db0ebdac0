"""The Backend protocol: what profiling, the estimate and measuring ask of an XLA platform."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from jaxremat._backends.buffers import BackendBuffers
from jaxremat._jaxpr.residuals import KeepRule
from jaxremat._jaxpr.trace import Layer

L = TypeVar("L")


class Backend(Protocol[L]):
  """One XLA platform as profiling models it; ``L`` is what it finds in one layer."""

  @property
  def name(self) -> str:
    """The platform's name (``"cpu"``, ``"gpu"``, ...)."""
    ...

  def compiler_options(self) -> dict[str, str | bool]:
    """XLA options under which ``jax.checkpoint``'s remat is real on this platform."""
    ...

  def layer_extras(self, layer: Layer, inputs, grad_invariants, differentiate_inputs: bool) -> L:
    """What the platform adds to the layer's forward and backward (read off their jaxpr)."""
    ...

  def keep_rule(self, extras: L | None = None) -> KeepRule:
    """Which of a layer's VJP residuals XLA keeps, given its ``extras`` where known."""
    ...

  def extra_residuals(self, extras: L) -> tuple[int, ...]:
    """Bytes of each residual the platform adds to a layer's own (CPU: library broadcasts)."""
    ...

  def chain_buffers(self, extras: Sequence[L], cot_bytes: Sequence[int]) -> BackendBuffers:
    """What the platform adds to a chain, from each layer's ``extras`` and the cotangents
    ``g_0..g_n`` (bytes)."""
    ...
