"""The buffers a backend adds to a chain beyond its values: start buffers and the CPU's own."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class StartBuffers:
  """Per layer, what XLA allocates for its backward before it runs: on CPU when the step
  starts (``cpu_start``), on GPU the max-pools' zero-filled scatter targets
  (``until_backward`` only).

  Attributes:
    until_backward: bytes live until the layer's backward: the zero-filled scatter
      targets.
    kernels: bytes of each reversed kernel: in its gradient's buffer from the start
      until the layer's backward when the layer is not recomputed; when it is, made when
      its recompute starts and live until its backward.
    indices: ``(shape, bytes)`` of each shape's iotas (one per dimension), live until
      the layer's last forward computation (its recompute, if the plan recomputes it);
      equal shapes share them.
    relaid_cotangents: bytes of the largest cotangent copy a kernel gradient reads (one
      is live at a time during the layer's backward; workspace, not in ``total_bytes``).
    swapped_kernels: bytes of each reversed kernel a forward convolution with swapped
      operands reads, live until the layer's forward pass.
    pooled_operands: bytes of the pooled operands computed inside the layer, live only
      while its forward pass runs (not in ``total_bytes``).
    window_constants: ``(key, bytes)`` of each scalar constant an average pool's library
      fusion reads as a whole buffer (the zeros of a ReLU before it, the divisor after
      it), live until the layer's forward pass (a recompute makes its own, transient);
      equal keys (shape, dtype, value) share a buffer.
    batch_copy: bytes of the relaid-out copy of a convolved batch, live until the
      layer's backward; when the layer is recomputed, the recompute makes it (it reads
      the batch through the recompute's optimization barrier) and it lives from there.
    argmax_values: bytes of the values each argmax reduce-window writes besides its
      indices (the pooled output once more), live only while it runs: in the layer's
      forward pass, or its recompute when the plan recomputes it (not in
      ``total_bytes``).
    relaid_inputs: bytes of the layer's input that a convolution reads for its kernel
      gradient in another layout: the copy is made in the forward pass and kept for the
      backward in place of the input, so while the layer's forward runs both are live
      (not in ``total_bytes``).
  """

  until_backward: int = 0
  kernels: tuple[int, ...] = ()
  indices: tuple[tuple[tuple[int, ...], int], ...] = ()
  relaid_cotangents: int = 0
  swapped_kernels: tuple[int, ...] = ()
  pooled_operands: int = 0
  argmax_values: int = 0
  relaid_inputs: int = 0
  window_constants: tuple[tuple[tuple, int], ...] = ()
  batch_copy: int = 0

  @property
  def total_bytes(self) -> int:
    """All of them together (bytes)."""
    return (self.until_backward + sum(self.kernels) + sum(b for _, b in self.indices)
            + sum(self.swapped_kernels) + sum(b for _, b in self.window_constants)
            + self.batch_copy)

  def per_device(self, act: float, res: float) -> StartBuffers:
    """Bytes on one device, where the layer's input holds fraction ``act`` of its bytes
    there and its residuals ``res`` (the pooled operands shard as the residuals)."""
    return dataclasses.replace(
        self, until_backward=scaled(self.until_backward, res),
        indices=tuple((shape, scaled(b, res)) for shape, b in self.indices),
        window_constants=tuple((key, scaled(b, res)) for key, b in self.window_constants),
        pooled_operands=scaled(self.pooled_operands, res),
        argmax_values=scaled(self.argmax_values, res),
        relaid_inputs=scaled(self.relaid_inputs, act), batch_copy=scaled(self.batch_copy, act))


@dataclasses.dataclass(frozen=True)
class CpuBuffers:
  """Per layer, what XLA's CPU backend adds to a chain besides its start buffers.

  Attributes:
    loss: bytes the last layer's backward holds because XLA fuses the loss's gradient
      into it: the model's output ``x_n``, which the loss reads, and the copies of
      ``g_n`` beyond ``g_n`` itself (one per form its readers take,
      ``cpu_fusions.cotangent_copies``).
    late_cotangent: per layer, whether XLA writes its input cotangent ``g_{i-1}`` only
      once the layer's own residuals are read: where ``g_{i-1}`` is larger than ``g_i``
      (a downsampling block) and is not a max-pool's scatter target (allocated before
      the backward).
    operands: per layer ``i``, bytes of each value its output's elementwise tail reads
      (its convolution outputs), which XLA keeps, besides ``x_i``'s relaid copy, when
      layer ``i + 1`` reads ``x_i`` by convolutions and elementwise ops only
      (``cpu_fusions.reads_input_in_fusions``): it recomputes ``x_i`` in those fusions.
      Empty otherwise.
    operands_read_input: per layer ``i``, whether that tail reads ``x_{i-1}`` too.
  """

  loss: tuple[int, ...] = ()
  late_cotangent: tuple[bool, ...] = ()
  operands: tuple[tuple[int, ...], ...] = ()
  operands_read_input: tuple[bool, ...] = ()

  def per_device(self, act: Sequence[float], res: Sequence[float]) -> CpuBuffers:
    """Bytes on one device, where activation ``x_i`` holds fraction ``act[i]`` of its
    bytes there and layer ``i``'s residuals ``res[i - 1]``."""
    return dataclasses.replace(
        self, loss=tuple(scaled(b, act[-1]) for b in self.loss),  # the output and g_n's copies
        operands=tuple(tuple(scaled(b, res[i]) for b in r)  # values computed inside layer i
                       for i, r in enumerate(self.operands)))


@dataclasses.dataclass(frozen=True)
class BackendBuffers:
  """What a backend adds to a whole chain.

  Attributes:
    start: per layer, the buffers allocated before its backward; empty: none.
    workspace: per layer, bytes of its backward's transient buffers; empty: none.
    cpu: the CPU backend's own buffers; None on other backends.
  """

  start: tuple[StartBuffers, ...] = ()
  workspace: tuple[int, ...] = ()
  cpu: CpuBuffers | None = None


def scaled(nbytes: int, fraction: float) -> int:
  """``nbytes`` times ``fraction``, rounded to a whole byte."""
  return int(round(nbytes * fraction))
