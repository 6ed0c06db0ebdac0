"""XLA's CPU backend: what it keeps and adds to a chain (``cpu_start``, ``cpu_fusions``)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import jax

from jaxremat._backends import cpu_fusions, cpu_start
from jaxremat._backends.buffers import BackendBuffers, CpuBuffers, StartBuffers
from jaxremat._backends.fusion import as_kept_by_xla
from jaxremat._jaxpr.layer_vjp import forward_and_backward
from jaxremat._jaxpr.residuals import KeepRule
from jaxremat._jaxpr.trace import Layer

#: XLA's CPU pipeline expands jax.checkpoint's optimization barriers and then CSE merges
#: the recomputation back into the forward pass; disabling the expander keeps remat real.
COMPILER_OPTIONS: Mapping[str, str] = {"xla_disable_hlo_passes": "cse_barrier_expander"}


@dataclasses.dataclass(frozen=True)
class CpuLayer:
  """What XLA's CPU backend adds to one layer's forward and backward.

  Attributes:
    start: the buffers it allocates when the step starts (``cpu_start``).
    library: what the backward's library fusions need (``cpu_fusions.library_fusions``).
    cotangent_copies: how many copies of an output cotangent it would have written
      (``cpu_fusions.cotangent_copies``).
    reads_input_in_fusions: whether it reads its input in fusions, recomputing the
      input's elementwise tail (``cpu_fusions.reads_input_in_fusions``).
    operands: bytes of each value its output's elementwise tail reads
      (``cpu_fusions.operands_kept``).
    operands_read_input: whether that tail reads the layer's input too.
  """

  start: StartBuffers
  library: cpu_fusions.LibraryFusions
  cotangent_copies: int
  reads_input_in_fusions: bool
  operands: tuple[int, ...]
  operands_read_input: bool


@dataclasses.dataclass(frozen=True)
class CpuBackend:
  """XLA's CPU backend: its expansions and library fusions of the backward."""

  name: str = "cpu"

  def compiler_options(self) -> dict[str, str | bool]:
    """The barrier expander disabled, so that remat is not undone."""
    return dict(COMPILER_OPTIONS)

  def layer_extras(self, layer: Layer, inputs, grad_invariants,
                   differentiate_inputs: bool) -> CpuLayer:
    """The start buffers, library fusions, cotangent copies and kept operands of the layer."""
    step, args, cts = forward_and_backward(layer, inputs, grad_invariants, differentiate_inputs)
    closed = jax.make_jaxpr(step)(args, cts)
    n_inputs = len(dict.fromkeys(inputs))  # args are the inputs, then the invariants
    n_cts = len(jax.tree_util.tree_leaves(cts))
    activations = [k < n_inputs for k in range(len(args))] + [True] * len(cts)
    batch = [k < n_inputs and not differentiate_inputs for k in range(len(args))]
    computed = [k < n_inputs and differentiate_inputs for k in range(len(args))]
    operands, reads_input = cpu_fusions.operands_kept(layer.eqns, layer.inputs, layer.outputs)
    return CpuLayer(
        start=cpu_start.start_buffers(closed, activations, batch, computed),
        library=cpu_fusions.library_fusions(closed, n_cts),
        cotangent_copies=cpu_fusions.cotangent_copies(closed, n_cts),
        reads_input_in_fusions=(differentiate_inputs
                                and cpu_fusions.reads_input_in_fusions(closed, n_inputs)),
        operands=operands, operands_read_input=reads_input)

  def keep_rule(self, extras: CpuLayer | None = None) -> KeepRule:
    """The shared fusion model, keeping what the backward's library fusions read."""
    return functools.partial(_kept, read_whole=extras.library.read_whole if extras else frozenset())

  def extra_residuals(self, extras: CpuLayer) -> tuple[int, ...]:
    """The broadcasts the backward's library fusions read (bytes)."""
    return extras.library.broadcasts

  def chain_buffers(self, extras: Sequence[CpuLayer], cot_bytes: Sequence[int]) -> BackendBuffers:
    """The start buffers, relaid cotangents as workspace, and ``CpuBuffers``."""
    n = len(extras)
    start = tuple(layer.start for layer in extras)
    cot = cot_bytes
    cpu = CpuBuffers(
        loss=(cot[n], max(0, extras[-1].cotangent_copies - 1) * cot[n]),  # x_n; g_n's copies
        late_cotangent=tuple(cot[j] > cot[j + 1] and not start[j].until_backward for j in range(n)),
        operands=tuple(
            extras[j].operands if j + 1 < n and extras[j + 1].reads_input_in_fusions else ()
            for j in range(n)),
        operands_read_input=tuple(layer.operands_read_input for layer in extras))
    return BackendBuffers(start=start, workspace=tuple(s.relaid_cotangents for s in start), cpu=cpu)


def _kept(jaxpr, res_atoms, out_atoms, read_whole: frozenset) -> list:
  """``as_kept_by_xla`` where the library fusions read the values at ``read_whole``."""
  # The step's forward traces as this jaxpr does: its equations match by position.
  read = {jaxpr.eqns[k].outvars[j] for k, j, name in read_whole
          if k < len(jaxpr.eqns) and jaxpr.eqns[k].primitive.name == name}
  return as_kept_by_xla(jaxpr, res_atoms, out_atoms, written=read)
