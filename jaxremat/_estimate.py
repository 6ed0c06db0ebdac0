"""Estimate XLA's temp bytes for a plan: model R's live buffers, less those XLA can host
in parameter-gradient buffers that are not yet written."""

from __future__ import annotations

import bisect

from jaxremat._chain import Chain, Plan
from jaxremat._profile import Buffers


def estimate_temp_bytes(chain: Chain, buffers: Buffers, plan: Plan) -> int:
  """Peak temp bytes of the gradient step under ``plan``, as XLA is expected to lay it out.

  Walks the backward pass as model R does: at layer ``i`` of segment ``(l, r]`` the
  held checkpoints ``x_c`` (``0 < c <= l``), the residual buffers of layers
  ``l+1..i``, the cotangents ``g_i``, ``g_{i-1}`` and the workspace ``w_i`` are live.
  XLA's buffer assignment may place a live buffer in the output buffer of a parameter
  gradient that is written later (a layer ``j < i``, and before the buffer dies); each
  gradient buffer holds one live buffer, which must fit. Buffers are hosted greedily,
  largest first, each in the smallest gradient buffer that fits. The batch ``x_0`` is
  an argument, not temp.

  An elementwise layer (``buffers.elementwise``) writes ``g_{i-1}`` over ``g_i``: its
  step counts the larger of the two. Buffers XLA allocates before a layer's backward
  (``buffers.start``: on CPU when the step starts, ``_xla_cpu``; on GPU max-pools'
  scatter targets, ``_xla_gpu``) are added where they are live, and then the forward
  pass and each segment's recompute are walked too (``_forward_peak``,
  ``_recompute_peak``).
  """
  n = chain.n
  grads = sorted((size, j) for j in range(1, n + 1) for size in buffers.param_grads[j - 1])
  segments = plan.segments(n)
  start = None
  if any(s.total_bytes or s.pooled_operands or s.relaid_inputs for s in buffers.start):
    start = _StartBuffers(buffers, segments)
    grads = start.free_gradients(grads)
  peak = 0
  if start is not None:
    peak = max(_forward_peak(chain, buffers, segments, start, grads),
               _recompute_peak(chain, buffers, segments, start, grads))
  held: list[tuple[int, int]] = []  # (bytes, hostable in gradients of layers <= this)
  for l, r in segments:
    if l > 0:
      held.append((chain.act_bytes[l], l))
    seg: list[tuple[int, int]] = []
    for i in range(l + 1, r + 1):
      elementwise = bool(buffers.elementwise) and buffers.elementwise[i - 1]
      seg += _saved(buffers, l, i)
      if elementwise:  # g_{i-1} written over g_i
        cotangents = [(max(chain.cot_bytes[i], chain.cot_bytes[i - 1]), i - 1)]
      else:
        cotangents = [(chain.cot_bytes[i], i - 1), (chain.cot_bytes[i - 1], i - 1)]
      transient = [*cotangents, (chain.workspace_bytes[i - 1], i - 1)]
      extra = start.backward(i) if start is not None else []
      live = [b for b in (*held, *seg, *transient, *extra) if b[0] > 0]
      peak = max(peak, _unhosted_bytes(live, grads, written_from=i))
  return peak


def _saved(buffers: Buffers, l: int, i: int) -> list[tuple[int, int]]:
  """Layer ``i``'s residual buffers in a segment starting at ``l`` (whose input is held)."""
  saved = [(size, i - 1) for size in buffers.residuals[i - 1]]
  if i > l + 1:
    saved += [(size, i - 1) for size in buffers.inputs[i - 1]]
  return saved


def _forward_peak(chain: Chain, buffers: Buffers, segments, start: _StartBuffers, grads) -> int:
  """Peak over the forward pass: at layer ``k`` the checkpoints before it, the residuals
  of the final segment's layers up to ``k``, the input ``x_{k-1}`` where neither held nor
  saved (an elementwise layer writes ``x_k`` over it) or where the final segment keeps a
  relaid copy of it besides, the output ``x_k`` and the start buffers still live. No
  gradient is written yet, so every gradient buffer can host."""
  n = chain.n
  peak = 0
  held: list[tuple[int, int]] = []
  for l, r in segments:
    if l > 0:
      held.append((chain.act_bytes[l], l))
    seg: list[tuple[int, int]] = []
    for k in range(l + 1, r + 1):
      if r == n:  # only the final segment keeps residuals in the forward pass
        seg += _saved(buffers, l, k)
      saved = r == n and bool(buffers.inputs[k - 1])
      # x_k being written; kept only if a later layer saves it
      running = _input_and_output(chain, buffers, l, k, saved, chain.act_bytes[k])
      if (k - 1 == l or saved) and r == n and buffers.start[k - 1].relaid_inputs:
        running.append((buffers.start[k - 1].relaid_inputs, k - 1))  # a relaid copy besides
      live = [b for b in (*held, *seg, *running, *start.forward(k)) if b[0] > 0]
      peak = max(peak, _unhosted_bytes(live, grads, written_from=n + 1))
  return peak


def _input_and_output(chain: Chain, buffers: Buffers, l: int, k: int, input_saved: bool,
                      output: int) -> list[tuple[int, int]]:
  """Layer ``k``'s input ``x_{k-1}`` and its output (``output`` bytes) while its forward
  runs in a segment starting at ``l``: the input where neither held (``k - 1 == l``) nor
  saved; an elementwise layer writes its output over its input."""
  if k - 1 > l and not input_saved:
    if buffers.elementwise and buffers.elementwise[k - 1]:
      return [(max(output, chain.act_bytes[k - 1]), k - 1)]
    return [(chain.act_bytes[k - 1], k - 1), (output, k)]
  return [(output, k)]


def _recompute_peak(chain: Chain, buffers: Buffers, segments, start: _StartBuffers, grads) -> int:
  """Peak over the recomputes in the backward pass: at layer ``k`` of segment ``(l, r]``
  the checkpoints up to ``l``, the residuals recomputed so far, the input ``x_{k-1}``
  where not saved, the output ``x_k`` (the next layer's input), the cotangent ``g_r``
  waiting for the segment's backward, and the start buffers then live, with what the
  recompute of layer ``k`` makes for itself (``_StartBuffers.recompute``). Gradients of
  the layers after ``r`` are written."""
  peak = 0
  held: list[tuple[int, int]] = []
  for l, r in segments[:-1]:  # the final segment is not recomputed
    if l > 0:
      held.append((chain.act_bytes[l], l))
    seg: list[tuple[int, int]] = []
    for k in range(l + 1, r + 1):
      seg += _saved(buffers, l, k)
      output = chain.act_bytes[k] if k < r else 0  # x_r is not recomputed
      running = _input_and_output(chain, buffers, l, k, bool(buffers.inputs[k - 1]), output)
      waiting = (chain.cot_bytes[r], r - 1)
      live = [b for b in (*held, *seg, *running, waiting, *start.recompute(k, l, r)) if b[0] > 0]
      peak = max(peak, _unhosted_bytes(live, grads, written_from=r + 1))
  return peak


class _StartBuffers:
  """The start buffers (``_xla_cpu.StartBuffers`` per layer) live at each step of a plan."""

  def __init__(self, buffers: Buffers, segments: list[tuple[int, int]]):
    n = len(buffers.start)
    recomputed = [False] * (n + 1)
    for l, r in segments[:-1]:
      for i in range(l + 1, r + 1):
        recomputed[i] = True
    self.until_backward = [(s.until_backward + (0 if recomputed[j] else s.batch_copy), j)
                           for j, s in enumerate(buffers.start, start=1)]
    # Batch copies a recompute makes: (bytes, layer, end of the layer's segment).
    ends = {i: r for l, r in segments for i in range(l + 1, r + 1)}
    self.recomputed_copies = [(s.batch_copy, j, ends[j]) for j, s in enumerate(buffers.start, start=1)
                              if recomputed[j] and s.batch_copy]
    # Kernel copies made at the start, each in its own gradient's buffer.
    self.kernels = [(size, j) for j, s in enumerate(buffers.start, start=1) if not recomputed[j]
                    for size in s.kernels]
    # Per iota shape: its bytes and the layers that use it, each with whether it runs
    # again in the backward.
    uses: dict[tuple[int, ...], list[tuple[int, bool]]] = {}
    size: dict[tuple[int, ...], int] = {}
    for j, s in enumerate(buffers.start, start=1):
      for shape, nbytes in s.indices:
        uses.setdefault(shape, []).append((j, recomputed[j]))
        size[shape] = nbytes
    self.indices = [(size[shape], u) for shape, u in uses.items()]
    # Per average pool's constant: its bytes and the last layer whose forward reads it.
    constants: dict[tuple, tuple[int, int]] = {}
    for j, s in enumerate(buffers.start, start=1):
      for key, nbytes in s.window_constants:
        constants[key] = (nbytes, j)
    self.constants = list(constants.values())
    # Reversed kernels of swapped forward convolutions: (bytes, layer).
    self.swapped = [(size, j) for j, s in enumerate(buffers.start, start=1) for size in s.swapped_kernels]
    self.pooled = [s.pooled_operands for s in buffers.start]
    self.n = n

  def free_gradients(self, grads: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``grads`` less the buffers that hold a kernel copy until they are written."""
    grads = list(grads)
    for kernel in self.kernels:
      if kernel in grads:
        grads.remove(kernel)
    return grads

  def forward(self, k: int) -> list[tuple[int, int]]:
    """Live while layer ``k``'s forward runs: every buffer kept until a backward; each
    iota whose last use is at layer ``k`` or later (a later forward, or any recompute);
    the swapped kernels and average pools' constants of layers ``k`` and later (a
    recompute makes its own, transient); the operands layer ``k`` pools."""
    live = [(size, j - 1) for size, j in self.until_backward]
    live += [(size, self.n) for size, j in (*self.swapped, *self.constants) if j >= k]
    live.append((self.pooled[k - 1], self.n))
    for size, uses in self.indices:
      if any(again or j >= k for j, again in uses):
        # hostable in gradients written after its last use: a recompute's layer, or any
        live.append((size, min((j - 1 for j, again in uses if again), default=self.n)))
    return live

  def recompute(self, k: int, l: int, r: int) -> list[tuple[int, int]]:
    """Live while layer ``k`` of segment ``(l, r]`` is recomputed: buffers kept until the
    backward of a layer up to ``r``, the batch copy once its layer is recomputed, iotas a
    recompute still to come needs, and the copies layer ``k``'s recompute makes for
    itself (a swapped kernel, an average pool's constants) with the operand it pools."""
    live = [(size, j - 1) for size, j in self.until_backward if j <= r]
    live += [(size, j - 1) for size, j, end in self.recomputed_copies if j <= k and end == r]
    live += [(size, r) for size, j in (*self.swapped, *self.constants) if j == k]
    live.append((self.pooled[k - 1], r))
    for size, uses in self.indices:
      later = [j for j, recomputed in uses if recomputed and (j <= l or k <= j <= r)]
      if later:
        live.append((size, min(later) - 1))
    return live

  def backward(self, i: int) -> list[tuple[int, int]]:
    """Live while layer ``i``'s backward runs: buffers kept until the backward of a layer
    before ``i`` (layer ``i``'s zeros became its input cotangent), batch copies a
    recompute of ``i``'s segment made for layer ``i`` or an earlier one, and iotas a
    recompute at or before ``i`` still needs."""
    live = [(size, j - 1) for size, j in self.until_backward if j < i]
    live += [(size, j - 1) for size, j, end in self.recomputed_copies if j <= i <= end]
    for size, uses in self.indices:
      again = [j for j, recomputed in uses if recomputed and j <= i]
      if again:
        live.append((size, min(again) - 1))
    return live


def _unhosted_bytes(live: list[tuple[int, int]], grads: list[tuple[int, int]], written_from: int) -> int:
  free = [g for g in grads if g[1] < written_from]
  sizes = [g[0] for g in free]
  used = [False] * len(free)
  total = 0
  for size, limit in sorted(live, reverse=True):
    k = bisect.bisect_left(sizes, size)
    while k < len(free) and (used[k] or free[k][1] > limit):
      k += 1
    if k < len(free):
      used[k] = True
    else:
      total += size
  return total
