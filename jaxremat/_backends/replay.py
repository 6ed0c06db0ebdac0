"""The compiled profile: a plan's footprint replayed from the plain step XLA compiled.

``apply(profile="compiled")`` compiles the training step without remat once, for the
target, and reads XLA's temp values off its dump (``plain_step``): each value's bytes, its
live range over XLA's schedule, and whether it is computed from the batch. Each schedule
step gets a phase and a layer: before the turn (the first backward instruction that reads
the batch) the forward layer of the latest instruction with a model op name; from the
turn on, the layer of the latest backward instruction whose op name fits (the layers run
backward from the last).

A plan's step is the plain step's steps in another order: the forward, then per segment
from the last its recompute (its layers' forward steps; none for the last segment) and
its backward (a recomputed segment's layer by layer, from the last). Each value lives
where its steps fall (``Replay.intervals``). What XLA decided for the plain step stands:
its temp values count, the values it placed in output buffers do not, and a value written
over another (at its offset, from the step the other ends) shares its bytes. A temp value
that, reordered, ends before an output buffer's output is written may go into that
buffer, as XLA's buffer assigner puts it there. The plan's temp bytes are XLA's heap
placement of the rest (``heap``). The no-remat plan replays the plain step's footprint,
to the byte on most models; what the replay cannot see is what XLA does only under
remat (docs/memory-model.md).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from jaxremat._backends.heap import CPU_ALIGNMENT, TempValue, replay_temp_bytes


@dataclasses.dataclass(frozen=True)
class Value:
  """A value of the plain step, in its temp allocation or put by XLA in an output buffer
  before the output is written: schedule steps (both included), bytes, whether the
  batch or a layer makes it (else: an iota or a constant, made once; a weight's cast
  that one layer reads counts as that layer's), the last forward step that reads it
  (None: none), the output buffer (index in ``Replay.grads``), of a value made once,
  the forward steps that read it, and the layer it belongs to where that is not the
  layer of its first step (a weight's cast: its reader's)."""

  first: int
  last: int
  size: int
  from_model: bool
  forward_read: int | None
  output: int = -1  # -1: in the temp allocation
  first_read: int | None = None  # of a layer's value the batch does not feed: its first reader
  forward_reads: tuple[int, ...] = ()  # of a value made once: the forward steps reading it
  layer: int = -1  # the layer it belongs to (-1: that of its first step)


@dataclasses.dataclass(frozen=True)
class Replay:
  """The plain step as XLA compiled it, to replay for plans.

  Attributes:
    values: the values of the temp allocation and those XLA put in an output buffer
      before its output (``Value``).
    turn: the first backward step.
    forward_layer: per forward step, its layer (0-based).
    backward_layer: per step from the turn on, its layer (0-based).
    kept: the values a plan's cut may keep, as ``(made, last read, bytes)`` (units:
      1..n the layers, n + 1 the loss): each is held by the first kept cut ``c`` at
      or after the layer that makes it, when read after it (segment ``(l, c]``:
      ``l < made <= c < last read``); a chain's ``x_c`` is ``(c, c + 1, a_c)``, a
      graph's values include its skip tensors.
    layers: the number of layers ``n``.
    fixed_bytes: the step's argument + output - alias bytes.
    tables: the bytes of each tuple's table of element pointers, which XLA allocates
      above the heap.
    alignment: the compiler's buffer alignment (bytes).
    plain_bytes: XLA's footprint of the plain step (bytes; 0 when not compiled).
    grads: per output buffer (a parameter's gradient), its bytes and the step that
      writes the output; before it, the buffer may hold other values.
  """

  values: tuple[Value, ...]
  turn: int
  forward_layer: tuple[int, ...]
  backward_layer: tuple[int, ...]
  kept: tuple[tuple[int, int, int], ...]
  layers: int
  fixed_bytes: int
  tables: tuple[int, ...] = ()
  alignment: int = CPU_ALIGNMENT
  plain_bytes: int = 0
  grads: tuple[tuple[int, int], ...] = ()
  _placed: dict[tuple[int, ...], int] = dataclasses.field(
      default_factory=dict, init=False, repr=False, compare=False)
  _temp: dict[tuple[int, ...], list[tuple[int, int, int]]] = dataclasses.field(
      default_factory=dict, init=False, repr=False, compare=False)  # the last plan's

  def total_bytes(self, checkpoints: Sequence[int]) -> int:
    """The footprint of the plan with these checkpoints (bytes), replayed: the step's
    fixed bytes and the temp allocation XLA's heap placement makes of ``intervals``, the
    plain step's tuple tables above it."""
    key = tuple(checkpoints)
    if key not in self._placed:
      values = [TempValue(i, first, last, -1 - i, size)  # no two written in place
                for i, (first, last, size) in enumerate(self._temp_values(key))]
      values += [TempValue(-1 - i, 0, 0, 0, size, is_tuple=True)
                 for i, size in enumerate(self.tables)]
      self._placed[key] = replay_temp_bytes(values, self.alignment)
    return self.fixed_bytes + self._placed[key]

  def live_bytes(self, checkpoints: Sequence[int]) -> int:
    """The peak live bytes of ``intervals`` (bytes): the temp allocation without the room
    the heap leaves between buffers (a lower bound of ``total_bytes``' temp part)."""
    live: collections.Counter[int] = collections.Counter()  # changes from step to step
    for first, last, size in self._temp_values(tuple(checkpoints)):
      live[first] += size
      live[last + 1] -= size
    peak = running = 0
    for step in sorted(live):
      running += live[step]
      peak = max(peak, running)
    return peak

  def _schedule(self, checkpoints: Sequence[int]
                ) -> tuple[list[tuple[int, int]], dict[tuple[Any, ...], int]]:
    """The plan's segments ``(l, r]`` and its virtual schedule: the position of each
    forward step ``("F", t)``, recompute step ``("R", segment, t)`` and backward step
    ``("B", t)``."""
    n, turn = self.layers, self.turn
    bounds = [0, *checkpoints, n]
    segments = list(zip(bounds[:-1], bounds[1:]))
    last = len(segments) - 1
    segment_of = {i: s for s, (l, r) in enumerate(segments) for i in range(l, r)}
    pos: dict[tuple[Any, ...], int] = {("F", t): t for t in range(turn)}
    for s in range(last, -1, -1):  # recompute, then backward
      if s != last:
        for t, layer in enumerate(self.forward_layer):
          if segment_of[layer] == s:
            pos["R", s, t] = len(pos)
      steps = [(t, layer) for t, layer in enumerate(self.backward_layer, start=turn)
               if segment_of[layer] == s]
      if s != last:  # a recomputed layer's backward runs whole, its weight gradients too
        steps.sort(key=lambda step: -step[1])
      for t, _ in steps:
        pos["B", t] = len(pos)
    return segments, pos

  def _temp_values(self, key: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """``intervals(key)``, kept for the last plan asked (its live bytes, then its
    placement)."""
    if key not in self._temp:
      self._temp.clear()
      self._temp[key] = self.intervals(key)
    return self._temp[key]

  def intervals(self, checkpoints: Sequence[int]) -> list[tuple[int, int, int]]:
    """The values of the plan's temp allocation as ``(first, last, bytes)`` over its
    step (both included): the replayed values less those in an output buffer. A
    value XLA put in one stays out of the temp allocation under every plan, even where
    the plan moves it past that buffer's output: such values are mostly zero broadcasts
    a ReLU's backward reads, which XLA makes again under remat where it needs them
    (sent back to the heap there, the H100 zoo's plans were predicted 6.2% off on
    average, against 4.2%). Another goes into an output buffer before its output is
    written where XLA's buffer assigner would put it: largest first (then by first
    step), each into the smallest output buffer it fits that holds nothing else over
    its steps."""
    segments, pos = self._schedule(checkpoints)
    found = self._pieces(segments, pos)
    written = [pos["F" if t < self.turn else "B", t] for _, t in self.grads]  # busy on
    busy: list[list[tuple[int, int]]] = [[] for _ in self.grads]  # before: sorted
    longest = [0] * len(self.grads)  # the longest interval in ``busy`` (steps)

    def free(g: int, a: int, b: int) -> bool:
      if b >= written[g]:
        return False
      held, floor = busy[g], a - longest[g]  # one starting below ``floor`` ends below a
      i = bisect.bisect_right(held, (b, math.inf))  # those starting at or before b
      while i > 0 and held[i - 1][0] >= floor:
        i -= 1
        if held[i][1] >= a:
          return False
      return True

    def hold(g: int, a: int, b: int) -> None:
      bisect.insort(busy[g], (a, b))
      longest[g] = max(longest[g], b - a)

    search = []
    for a, b, size, output in found:
      if output >= 0:  # XLA's choice: out of the temp allocation under every plan
        hold(output, a, b)
      else:
        search.append((a, b, size))
    order = sorted(range(len(self.grads)), key=lambda g: self.grads[g][0])
    sizes = [self.grads[g][0] for g in order]
    temp = []
    for a, b, size in sorted(search, key=lambda f: (-f[2], f[0], f[1])):
      host = next((g for g in order[bisect.bisect_left(sizes, size):] if free(g, a, b)),
                  None)
      if host is None:
        temp.append((a, b, size))
      else:
        hold(host, a, b)
    return temp

  def _pieces(self, segments: list[tuple[int, int]], pos: dict[tuple[Any, ...], int]
              ) -> list[tuple[int, int, int, int]]:
    """The values of the plan of these segments, over its virtual schedule ``pos``, as
    ``(first, last, bytes, output buffer)`` (both steps included; buffer -1: none).

    A layer's value the batch does not feed (dropout's random bits, made from the key)
    may be made early in the plain step, all blocks' at once; in a recomputed segment
    XLA makes it when the layer first reads it (``first_read``: not before it meets the
    batch's values, where dropout selects), and the replay starts it there, in the
    forward and in the recompute (not a value one layer makes for another: CPU VGGs
    keep a later layer's weight transposes from early on under remat too). So does a
    nameless cast of a weight that one layer alone reads (the bf16 cast XLA's CPU
    backend hoists to the start of the step): it belongs to its reader's layer, and
    XLA makes it again in that layer's recompute. Not a weight's transpose: the H100
    VGGs keep those from early on under remat (made again, VGG-16's plan went from the
    least to 19% above it).

    A value made once (no layer and no batch value makes it: an iota, a constant) lives
    over its steps, and on to where a recomputed segment reads it again: XLA shares the
    one value between the forward and the recompute (the zero broadcasts CPU pools and
    ReLUs read). A read by a segment's last layer does not count: the recompute need
    not make that layer's output (its backward needs its input), and XLA drops the work.
    A forward value read in the forward only lives in the forward and again in its
    segment's recompute while the segment reads it; a kept value of the last
    segment, from the forward to its backward read; of an earlier segment, in the
    forward while the forward reads it and from its recompute to its backward read;
    read by a later segment's backward, a value its kept cut holds (up to the bytes the
    cut keeps of its layer, ``kept``); a backward value over its steps (a cotangent
    into a recomputed segment: ``_cotangents``). What a kept
    cut holds of a layer beyond that: from the layer's forward to the backward of the
    layer after the cut (a chain's ``x_c``: ``a_c`` bytes from layer ``c``'s forward
    to layer ``c + 1``'s backward).
    """
    turn = self.turn
    last = len(segments) - 1
    segment_of = {i: s for s, (l, r) in enumerate(segments) for i in range(l, r)}
    found: list[tuple[int, int, int, int]] = []
    keeps: collections.Counter[tuple[int, int]] = collections.Counter()
    for made, read, size in self.kept:  # per (segment, layer) the bytes its cut keeps
      if made > 0 and (s := segment_of[made - 1]) != last and segments[s][1] < read:
        keeps[s, made] += size
    held: collections.Counter[tuple[int, int]] = collections.Counter()
    output = -1  # the output buffer XLA put the value being replayed in (-1: none)

    def add(a: int, b: int, size: int, host: int | None = None) -> None:
      if b >= a and size > 0:
        found.append((a, b, size, output if host is None else host))

    def at(t: int) -> int:
      return pos["F" if t < turn else "B", t]

    crossing: dict[int, list[Value]] = collections.defaultdict(list)
    for v in self.values:
      output = v.output
      if v.first >= turn and (s := segment_of[self.backward_layer[v.last - turn]]) < (
          segment_of[self.backward_layer[v.first - turn]]):
        crossing[s].append(v)  # a cotangent into a recomputed segment: placed below
        continue
      if not v.from_model or v.first >= turn:  # over its steps, which may run reordered
        steps = [at(v.first), at(v.last)]
        steps += [pos[key] for t in v.forward_reads
                  if (key := ("R", segment_of[self.forward_layer[t]], t)) in pos
                  and self.forward_layer[t] < segments[key[1]][1] - 1]
        add(min(steps), max(steps), v.size)
        continue
      own = v.layer if v.layer >= 0 else self.forward_layer[v.first]
      s = segment_of[own]
      first = v.first
      if (v.first_read is not None and s != last and v.first_read < turn
          and self.forward_layer[v.first_read] == own):
        first = v.first_read  # made where its recomputed layer first reads it
      if v.last < turn:  # read in the forward only
        add(at(first), at(v.last), v.size)
        again = [t for t in range(first, v.last + 1) if ("R", s, t) in pos]
        if again:
          add(pos["R", s, first], pos["R", s, max(again)], v.size)
        continue
      reader = segment_of[self.backward_layer[v.last - turn]]
      if s == last:
        add(at(first), at(v.last), v.size)
      elif reader > s:  # a later segment's backward reads it: a value the cut keeps
        by = (s, own + 1)
        take = min(v.size, keeps[by] - held[by])
        add(at(first), at(v.last), take)
        held[by] += max(take, 0)
      else:
        if v.forward_read is not None:
          add(at(first), at(v.forward_read), v.size)
        start, end = pos["R", s, first], at(v.last)
        add(start if end >= start else at(first), end, v.size)
    for s, into in crossing.items():
      self._cotangents(s, into, keeps, pos, add)
    output = -1  # a checkpoint: none in the plain step
    for (s, made_by), size in keeps.items():  # what the cut keeps no replayed value holds
      c = segments[s][1]
      made = max((t for t, layer in enumerate(self.forward_layer) if layer <= made_by - 1),
                 default=0)
      read = max((t for t, layer in enumerate(self.backward_layer, start=turn) if layer >= c),
                 default=turn + len(self.backward_layer) - 1)
      add(at(made), at(read), max(0, size - held[s, made_by]))
    return found

  def _cotangents(self, s: int, into: list[Value], keeps: collections.Counter[tuple[int, int]],
                  pos: dict[tuple[Any, ...], int],
                  add: Callable[[int, int, int, int | None], None]) -> None:
    """Places the backward values a later segment's backward makes and recomputed
    segment ``s``'s backward reads (``into``): over their steps; but where one of them
    is larger than the most ``s``'s cut keeps of any one layer, it is no cotangent of a
    kept value (a concatenation's, read slice by slice; an f32 cotangent of a bf16
    value; a cotangent laid out again for a convolution). XLA hands a checkpointed
    segment's backward the cotangent of each of its outputs, summed and cast before
    the recompute: then every value in ``into`` ends just before the recompute, and
    the cut's cotangents (the bytes it keeps of each layer) live from there to the
    backward of the layer that made them."""
    cut = {made: size for (t, made), size in keeps.items() if t == s}
    recompute = [p for key, p in pos.items() if key[0] == "R" and key[1] == s]
    summed = bool(recompute and cut and max(v.size for v in into) > max(cut.values()))
    for v in into:
      add(pos["B", v.first], min(recompute) - 1 if summed else pos["B", v.last], v.size,
          v.output)
    if summed:
      for made, size in cut.items():
        ends = [pos["B", t] for t, layer in enumerate(self.backward_layer, start=self.turn)
                if layer == made - 1]
        add(min(recompute), max(ends, default=min(recompute)), size, -1)


def chain_kept(act_bytes: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
  """``Replay.kept`` of a chain of activations ``a_0..a_n`` (bytes): ``x_c`` is made by
  layer ``c`` and read by layer ``c + 1``."""
  return tuple((c, c + 1, size) for c, size in enumerate(act_bytes))
