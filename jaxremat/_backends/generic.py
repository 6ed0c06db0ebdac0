"""Any platform without rules of its own: the shared fusion model, nothing added."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxremat._backends.buffers import BackendBuffers
from jaxremat._backends.fusion import as_kept_by_xla
from jaxremat._jaxpr.residuals import KeepRule
from jaxremat._jaxpr.trace import Layer


@dataclasses.dataclass(frozen=True)
class GenericBackend:
  """A platform XLA fuses as ``fusion.as_kept_by_xla`` says, with no buffers of its own."""

  name: str = "generic"

  def compiler_options(self) -> dict[str, str | bool]:
    """None needed (bytes are XLA's defaults)."""
    return {}

  def layer_extras(self, layer: Layer, inputs, grad_invariants, differentiate_inputs: bool) -> None:
    """Nothing to find."""
    return None

  def keep_rule(self, extras: None = None) -> KeepRule:
    """The shared fusion model."""
    return as_kept_by_xla

  def extra_residuals(self, extras: None) -> tuple[int, ...]:
    """None (bytes)."""
    return ()

  def chain_buffers(self, extras: Sequence[None], cot_bytes: Sequence[int]) -> BackendBuffers:
    """None."""
    return BackendBuffers()
