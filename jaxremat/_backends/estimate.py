"""Estimate XLA's temp bytes for a plan: model R's live buffers over the whole step, less
those XLA places in parameter-gradient buffers that are not yet written."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Hashable

from jaxremat._backends.buffers import CpuBuffers
from jaxremat._backends.profile import Buffers
from jaxremat._model.chain import Chain, Plan

Key = tuple[Hashable, ...]  # a buffer's identity: its kind ("x", "g", "start", ...) first
Live = list[tuple[int, Key]]  # (bytes, identity) of each buffer live at one step
_FORWARD = "forward"  # the phase of values the forward pass computes
_START_KINDS = ("start", "iota", "swapped", "constant")  # made when the step starts


def estimate_temp_bytes(chain: Chain, buffers: Buffers, plan: Plan) -> int:
  """Peak temp bytes of the gradient step under ``plan``, as XLA is expected to lay it out.

  Walks the step in XLA's order: the forward pass, then per segment from the last its
  recompute (none for the last) and its backward pass. At layer ``i``'s backward in
  segment ``(l, r]`` the held checkpoints ``x_c`` (``0 < c <= l``), the residual buffers
  of layers ``l+1..i``, the cotangents ``g_i``, ``g_{i-1}`` and the workspace ``w_i``
  are live; the forward pass and each recompute hold what ``_forward_steps`` and
  ``_recompute_steps`` say. Buffers XLA allocates before a layer's backward
  (``buffers.start``: on CPU when the step starts, ``cpu_start``; on GPU max-pools'
  scatter targets, ``gpu``) are added where they are live. An elementwise layer
  (``buffers.elementwise``) writes ``g_{i-1}`` over ``g_i``: its step counts the larger.
  On CPU (``buffers.cpu``), a layer that writes ``g_{i-1}`` last (``late_cotangent``)
  has a backward of two steps: its residuals with ``g_i`` and ``w_i``, then its saved
  inputs with both cotangents and ``w_i``; and the last layer's backward starts with a
  step where the loss writes ``g_n`` from ``x_n``: its residuals, ``loss`` (``x_n`` and
  the copies of ``g_n`` beyond ``g_n``), ``g_n`` and ``w_n``.

  XLA's buffer assignment then places buffers in the output buffers of parameter
  gradients (``_hosted``): over the whole step, largest first, each in the smallest
  gradient buffer that fits and that holds nothing else live at the time, the gradient
  itself from its layer's backward on. What is not placed is temp. The batch ``x_0`` is
  an argument, not temp.
  """
  n = chain.n
  segments = plan.segments(n)
  start = _StartBuffers(buffers, segments, n)
  cpu = buffers.cpu or CpuBuffers()  # its empty fields add nothing
  operands = _operands_kept(cpu, segments)
  steps: list[Live] = [*_forward_steps(chain, buffers, segments, start, operands)]
  written: dict[int, int] = {}  # layer -> the step its parameter gradients are written
  for index in range(len(segments) - 1, -1, -1):
    l, r = segments[index]
    held: Live = [(chain.act_bytes[c], ("x", c, _FORWARD)) for c, _ in segments[1:index + 1]]
    if r == n:
      held += [(size, key) for size, key, _ in operands]
    if r < n:
      steps += _recompute_steps(chain, buffers, l, r, held, start)
    phase = _FORWARD if r == n else ("recompute", l)
    saved_all: Live = []
    ends = {}  # layer -> how many of saved_all are saved by it and the layers before it
    for j in range(l + 1, r + 1):
      saved_all += _saved(buffers, l, j, phase)
      ends[j] = len(saved_all)
    for i in range(r, l, -1):
      saved = saved_all[:ends[i]]
      elementwise = bool(buffers.elementwise) and buffers.elementwise[i - 1]
      if elementwise:  # g_{i-1} written over g_i
        cotangents = [(max(chain.cot_bytes[i], chain.cot_bytes[i - 1]), ("g", i))]
      else:
        cotangents = [(chain.cot_bytes[i], ("g", i)), (chain.cot_bytes[i - 1], ("g", i - 1))]
      work = (chain.workspace_bytes[i - 1], ("w", i))
      if i == n and cpu.loss:  # the loss's gradient, written from x_n for this backward
        steps.append([*held, *saved, (cpu.loss[0], ("x", n, _FORWARD)), cotangents[0],
                      (cpu.loss[1], ("loss", n)), work, *start.backward(i, l)])
      written[i] = len(steps)
      if not elementwise and cpu.late_cotangent and cpu.late_cotangent[i - 1]:
        # g_{i-1} is written once the layer's own residuals are read: two steps.
        earlier = ends[i - 1] if i - 1 > l else 0  # saved[earlier:] is layer i's own
        inputs = [b for b in saved[earlier:] if b[1][0] == "x"]
        steps.append([*held, *saved, cotangents[0], work, *start.backward(i, l)])
        steps.append([*held, *saved[:earlier], *inputs, *cotangents, work, *start.backward(i, l)])
      else:
        steps.append([*held, *saved, *cotangents, work, *start.backward(i, l)])
  grads = start.free_gradients(
      [(size, j) for j in range(1, n + 1) for size in buffers.param_grads[j - 1]])
  return _hosted(steps, [(size, written[j], j) for size, j in grads])


def _saved(buffers: Buffers, l: int, i: int, phase: Hashable) -> Live:
  """Layer ``i``'s residual buffers in a segment starting at ``l`` (whose input is held),
  as the pass ``phase`` computed them."""
  saved: Live = [(size, ("residual", i, m)) for m, size in enumerate(buffers.residuals[i - 1])]
  if i > l + 1:
    saved += [(size, ("x", i - 1, phase, m)) for m, size in enumerate(buffers.inputs[i - 1])]
  return saved


def _operands_kept(cpu: CpuBuffers, segments) -> list[tuple[int, Key, int]]:
  """The operands XLA's CPU backend keeps (``cpu.operands``) to recompute the final segment's
  input ``x_l`` in its first layer's fusions, as ``(bytes, identity, layer computing
  it)``: layer ``l``'s, and, while that tail reads its input ``x_{j-1}`` and ``j - 1``
  is no checkpoint, layer ``j - 1``'s too (``x_{j-1}`` is recomputed the same way)."""
  l = segments[-1][0]
  checkpoints = {c for c, _ in segments}
  kept: list[tuple[int, Key, int]] = []
  j = l
  while j > 0 and cpu.operands and cpu.operands[j - 1]:
    kept += [(size, ("operand", j, m), j) for m, size in enumerate(cpu.operands[j - 1])]
    if not cpu.operands_read_input[j - 1] or j - 1 in checkpoints:
      break
    j -= 1
  return kept


def _forward_steps(chain: Chain, buffers: Buffers, segments, start: _StartBuffers,
                   operands: list[tuple[int, Key, int]]) -> list[Live]:
  """The forward pass: at layer ``k`` the checkpoints before it, the residuals of the
  final segment's layers up to ``k``, the input ``x_{k-1}`` where neither held nor
  saved (an elementwise layer writes ``x_k`` over it) or where the final segment keeps a
  relaid copy of it besides, the output ``x_k``, the start buffers still live and the
  ``operands`` (``_operands_kept``) computed so far."""
  n = chain.n
  steps = []
  held: Live = []
  for l, r in segments:
    if l > 0:
      held.append((chain.act_bytes[l], ("x", l, _FORWARD)))
    seg: Live = []
    for k in range(l + 1, r + 1):
      if r == n:  # only the final segment keeps residuals in the forward pass
        seg += _saved(buffers, l, k, _FORWARD)
      running = _input_and_output(chain, buffers, l, k, r == n, chain.act_bytes[k], _FORWARD)
      if r == n and (k - 1 == l or _input_saved(buffers, k)):  # a relaid copy of the input besides
        running.append((start.relaid[k - 1], ("relaid", k - 1)))
      steps.append([*held, *seg, *running, *start.forward(k),
                    *[(size, key) for size, key, j in operands if j <= k]])
  return steps


def _input_and_output(chain: Chain, buffers: Buffers, l: int, k: int, kept: bool,
                      output: int, phase: Hashable) -> Live:
  """Layer ``k``'s input ``x_{k-1}`` and its output (``output`` bytes) while the pass
  ``phase`` runs its forward in a segment starting at ``l``; ``kept``: the pass keeps
  residuals. The input counts where neither held (``k - 1 == l``) nor saved, the output
  where not saved as a residual; an elementwise layer writes its output (or the
  residual that is its output) over its input."""
  out: Live = [] if kept and _saves_output(buffers, k) else [(output, ("x", k, phase))]
  if k - 1 > l and not (kept and _input_saved(buffers, k)):
    if buffers.elementwise and buffers.elementwise[k - 1]:
      return [(max(output, chain.act_bytes[k - 1]), ("x", k, phase))] if out else []
    return [(chain.act_bytes[k - 1], ("x", k - 1, phase)), *out]
  return out


def _saves_output(buffers: Buffers, k: int) -> bool:
  """Whether layer ``k``'s residuals include its output ``x_k``."""
  return bool(buffers.saves_output) and buffers.saves_output[k - 1]


def _input_saved(buffers: Buffers, k: int) -> bool:
  """Whether layer ``k``'s input ``x_{k-1}`` is a residual: of layer ``k``, or of layer
  ``k - 1`` as its output."""
  return bool(buffers.inputs[k - 1]) or (k > 1 and _saves_output(buffers, k - 1))


def _recompute_steps(chain: Chain, buffers: Buffers, l: int, r: int, held: Live,
                     start: _StartBuffers) -> list[Live]:
  """The recompute of segment ``(l, r]``: at layer ``k`` the checkpoints up to ``l``, the
  residuals recomputed so far, the input ``x_{k-1}`` where not saved, the output ``x_k``
  (the next layer's input), the cotangent ``g_r`` waiting for the segment's backward,
  and the start buffers then live, with what the recompute of layer ``k`` makes for
  itself (``_StartBuffers.recompute``)."""
  phase = ("recompute", l)
  steps = []
  seg: Live = []
  for k in range(l + 1, r + 1):
    seg += _saved(buffers, l, k, phase)
    output = chain.act_bytes[k] if k < r else 0  # x_r is not recomputed
    running = _input_and_output(chain, buffers, l, k, True, output, phase)
    steps.append([*held, *seg, *running, (chain.cot_bytes[r], ("g", r)),
                  *start.recompute(k, l, r)])
  return steps


class _StartBuffers:
  """The start buffers (``buffers.StartBuffers`` per layer) live at each step of a plan."""

  def __init__(self, buffers: Buffers, segments: list[tuple[int, int]], n: int):
    start = buffers.start or ()
    recomputed = [False] * (n + 1)
    for l, r in segments[:-1]:
      for i in range(l + 1, r + 1):
        recomputed[i] = True
    self.recomputed = recomputed
    self.until_backward = [(s.until_backward + (0 if recomputed[j] else s.batch_copy), j)
                           for j, s in enumerate(start, start=1)]
    # Batch copies a recompute makes: (bytes, layer, end of the layer's segment).
    ends = {i: r for l, r in segments for i in range(l + 1, r + 1)}
    self.recomputed_copies = [(s.batch_copy, j, ends[j]) for j, s in enumerate(start, start=1)
                              if recomputed[j] and s.batch_copy]
    # Kernel copies made at the start, each in its own gradient's buffer.
    self.kernels = [(size, j) for j, s in enumerate(start, start=1) if not recomputed[j]
                    for size in s.kernels]
    # Kernel copies a recompute makes (from the kernel its optimization barrier passes
    # on, when it starts) for a layer's backward: (bytes, identity, layer).
    self.recomputed_kernels = [(size, ("kernel", j, m), j) for j, s in enumerate(start, start=1)
                               if recomputed[j] for m, size in enumerate(s.kernels)]
    # Per iota (one per dimension of a shape; equal shapes share them): its bytes, its
    # identity and the layers that use it, each with whether it runs again in the
    # backward.
    uses: dict[tuple[int, ...], list[tuple[int, bool]]] = {}
    size: dict[tuple[int, ...], int] = {}
    for j, s in enumerate(start, start=1):
      for shape, nbytes in s.indices:
        uses.setdefault(shape, []).append((j, recomputed[j]))
        size[shape] = nbytes // len(shape)
    self.indices = [(size[shape], ("iota", shape, d), u) for shape, u in uses.items()
                    for d in range(len(shape))]
    # Per average pool's constant: its bytes, identity and the last layer whose forward
    # reads it.
    constants: dict[tuple, tuple[int, int]] = {}
    for j, s in enumerate(start, start=1):
      for key, nbytes in s.window_constants:
        constants[key] = (nbytes, j)
    self.constants = [(nbytes, ("constant", key), j) for key, (nbytes, j) in constants.items()]
    # Reversed kernels of swapped forward convolutions: (bytes, identity, layer).
    self.swapped = [(size, ("swapped", j, m), j) for j, s in enumerate(start, start=1)
                    for m, size in enumerate(s.swapped_kernels)]
    self.pooled = [s.pooled_operands for s in start] or [0] * n
    self.argmax = [s.argmax_values for s in start] or [0] * n
    self.relaid = [s.relaid_inputs for s in start] or [0] * n

  def free_gradients(self, grads: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``grads`` (bytes, layer) less the buffers that hold a kernel copy from the start
    until they are written."""
    grads = list(grads)
    for kernel in self.kernels:
      if kernel in grads:
        grads.remove(kernel)
    return grads

  def forward(self, k: int) -> Live:
    """Live while layer ``k``'s forward runs: every buffer kept until a backward; each
    iota whose last use is at layer ``k`` or later (a later forward, or any recompute);
    the swapped kernels and average pools' constants of layers ``k`` and later (a
    recompute makes its own, transient); the operands layer ``k`` pools for its argmax
    and the values the argmax writes, when it is not recomputed (else its recompute
    does)."""
    live: Live = [(size, ("start", j)) for size, j in self.until_backward]
    live += [(size, key) for size, key, j in (*self.swapped, *self.constants) if j >= k]
    if not self.recomputed[k]:  # the argmax runs here
      live += [(self.pooled[k - 1], ("pooled", k, _FORWARD)),
               (self.argmax[k - 1], ("argmax", k, _FORWARD))]
    live += [(size, key) for size, key, uses in self.indices
             if any(again or j >= k for j, again in uses)]
    return live

  def recompute(self, k: int, l: int, r: int) -> Live:
    """Live while layer ``k`` of segment ``(l, r]`` is recomputed: buffers kept until the
    backward of a layer up to ``r``, the batch copy once its layer is recomputed, the
    segment's kernel copies (made when the recompute starts), iotas a recompute still to
    come needs, and the copies layer ``k``'s recompute makes for itself (a swapped
    kernel, an average pool's constants) with the operand it pools and its argmax's
    values."""
    live: Live = [(size, ("start", j)) for size, j in self.until_backward if j <= r]
    live += [(size, ("batch copy", j)) for size, j, end in self.recomputed_copies
             if j <= k and end == r]
    live += [(size, ("recompute", key)) for size, key, j in (*self.swapped, *self.constants)
             if j == k]
    live += [(size, key) for size, key, j in self.recomputed_kernels if l < j <= r]
    live += [(self.pooled[k - 1], ("pooled", k, ("recompute", l))),
             (self.argmax[k - 1], ("argmax", k, ("recompute", l)))]
    live += [(size, key) for size, key, uses in self.indices
             if any(again and (j <= l or k <= j <= r) for j, again in uses)]
    return live

  def backward(self, i: int, l: int) -> Live:
    """Live while layer ``i``'s backward runs in a segment starting at ``l``: buffers
    kept until the backward of a layer before ``i`` (layer ``i``'s zeros became its
    input cotangent), batch copies and kernel copies a recompute of ``i``'s segment made
    for layer ``i`` or an earlier one, and iotas a recompute still to come (of a layer
    up to ``l``) needs."""
    live: Live = [(size, ("start", j)) for size, j in self.until_backward if j < i]
    live += [(size, ("batch copy", j)) for size, j, end in self.recomputed_copies
             if j <= i <= end]
    live += [(size, key) for size, key, j in self.recomputed_kernels if l < j <= i]
    live += [(size, key) for size, key, uses in self.indices
             if any(again and j <= l for j, again in uses)]
    return live


def _hosted(steps: list[Live], grads: list[tuple[int, int, int]]) -> int:
  """Peak temp bytes over ``steps`` once XLA's buffer assignment has placed buffers in
  gradient buffers ``grads`` (bytes, step from which the gradient is written, layer).

  As XLA's ``BufferAssigner`` does for buffers that share an allocation with an output:
  buffers are taken largest first (then in post-order of their definitions), each into
  the smallest gradient buffer it fits whose buffers so far are live at other steps
  only; a layer's kernel copy, read where the layer's gradient is written, may end in
  that gradient's buffer. A buffer is one identity, live from the first to the last step
  it appears in, at its largest size there. A start buffer depends on nothing, so the
  post-order puts it just before its reader: at its last step.
  """
  first: dict[Key, int] = {}
  last: dict[Key, int] = {}
  size: dict[Key, int] = {}
  for t, live in enumerate(steps):
    for nbytes, key in live:
      if nbytes <= 0:
        continue
      if key in size:
        last[key] = t
        if nbytes > size[key]:
          size[key] = nbytes
      else:
        first[key] = last[key] = t
        size[key] = nbytes
  order = sorted(grads)
  sizes = [g[0] for g in order]
  busy = [[(written, len(steps))] for _, written, _ in order]  # steps each gradient buffer is taken

  def made(key) -> int:  # where XLA's post-order puts the buffer's definition
    return last[key] if key[0] in _START_KINDS else first[key]

  temp = [0] * (len(steps) + 1)  # differences of the temp bytes from step to step
  for key in sorted(size, key=lambda key: (-size[key], made(key))):
    a, b = first[key], last[key]
    own = key[1] if key[0] == "kernel" else None  # a copy its layer's gradient may take over
    for g in range(bisect.bisect_left(sizes, size[key]), len(order)):
      if all(b < c or d < a or (own == order[g][2] and b == c == order[g][1])
             for c, d in busy[g]):
        busy[g].append((a, b))
        break
    else:
      temp[a] += size[key]
      temp[b + 1] -= size[key]
  return max(itertools.accumulate(temp[:-1]), default=0)
