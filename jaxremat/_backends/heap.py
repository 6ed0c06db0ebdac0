"""XLA's heap placement of a step's temp values, replayed (bytes of the temp allocation).

A compiled step's temp allocation holds XLA's values (each with a size and a live range
over XLA's schedule). Its size is what XLA's heap placement makes of them, which can
exceed their peak live bytes: the rest is room left between buffers. The replay follows
XLA's heap simulator (``HeapSimulator`` with the two ``GlobalDecreasingSizeBestFitHeap``
placements its buffer assigner runs, the smaller kept):

* time is counted in events, not schedule steps: at each step the values it defines are
  allocated one by one (in order of first step, last step, value id), then the values
  whose last step it is are freed one by one; each event is one tick. A value that ends
  at a step and one that starts there therefore overlap,
* unless the new value is written in place over the ending one (the dump shows this as
  the two at one offset): the pair is then one buffer, placed once, over both ranges,
* buffers are placed largest first (``"spatial"``: by size, then by length in ticks,
  then by value id) or longest first (``"temporal"``: by length over the whole buffer,
  then size, then id), each in the smallest free gap over its ticks that fits it
  (aligned), else above everything live then,
* a tuple's own value (its table of element pointers) is not placed in that heap: XLA
  gives each its own allocation and appends them above the heap, smallest first (then by
  falling value id), each aligned.

XLA's CPU buffers are 64-byte aligned, its GPU buffers 256. ``bench/xla_heap.py`` reads
the values off a compile's dump; the compiled profile (``replay``) places the values it
replays for a plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

#: XLA's CPU buffer alignment (bytes).
CPU_ALIGNMENT = 64
#: XLA's GPU buffer alignment (bytes).
GPU_ALIGNMENT = 256


@dataclasses.dataclass(frozen=True)
class TempValue:
  """One value of XLA's temp allocation.

  Attributes:
    id: XLA's value id (the heap's last tie-break).
    first: the first step of XLA's schedule it is live at.
    last: the last step it is live at (included).
    offset: where XLA placed it in the allocation (bytes); values at one offset, one
      starting where the other ends, are one buffer written in place.
    size: its size (bytes).
    is_tuple: a tuple's own value (its table of element pointers).
  """

  id: int
  first: int
  last: int
  offset: int
  size: int
  is_tuple: bool = False


def live_peak_bytes(values: Sequence[TempValue]) -> int:
  """The most bytes of the allocation that hold a live value at one schedule step
  (values written in place over another share its bytes, and count once)."""
  def live_bytes(step: int) -> int:  # the union of the byte ranges live at ``step``
    ranges = sorted((v.offset, v.offset + v.size) for v in values if v.first <= step <= v.last)
    return sum(hi - lo for lo, hi in _merged(ranges))

  # the live bytes peak where a value starts
  return max((live_bytes(step) for step in {v.first for v in values}), default=0)


def replay_temp_bytes(values: Sequence[TempValue], alignment: int = CPU_ALIGNMENT) -> int:
  """The temp allocation XLA's heap placement makes of ``values`` (bytes): the smaller
  of its largest-first and longest-first best-fit heaps, with the tuples' pointer
  tables, which XLA allocates apart, appended above it (module docstring)."""
  buffers = _buffers([v for v in values if not v.is_tuple])
  top = min((_heap_bytes(buffers, order, alignment) for order in ("spatial", "temporal")),
            default=0)
  for table in sorted((v for v in values if v.is_tuple), key=lambda v: (v.size, -v.id)):
    top = _aligned(top, alignment) + table.size
  return top


@dataclasses.dataclass
class _Buffer:
  """Values placed as one: the first allocated, and those written in place over it."""

  id: int
  size: int  # the first value's (bytes): what the order and the gaps go by
  span: int  # the largest value's (bytes): what is placed
  ticks: list[list[int]]  # [start, end] of each value, in event ticks


def _buffers(values: Sequence[TempValue]) -> list[_Buffer]:
  """The heap simulator's buffers over event ticks (module docstring)."""
  order = sorted(values, key=lambda v: (v.first, v.last, v.id))
  starting: dict[int, list[TempValue]] = {}
  ending: dict[int, list[TempValue]] = {}
  for v in order:
    starting.setdefault(v.first, []).append(v)
    ending.setdefault(v.last, []).append(v)
  at = {(v.offset, v.last): v for v in order}  # a value that ends at a step, by offset
  tick, buffers = 0, []
  buffer_of: dict[int, _Buffer] = {}
  ticks_of: dict[int, list[int]] = {}
  for step in sorted(starting.keys() | ending.keys()):
    freed = list(ending.get(step, []))
    for v in starting.get(step, []):
      over = at.get((v.offset, step))
      if over is not None and over.first < step and over in freed:
        ticks_of[over.id][1] = tick  # freed just before v is written over it
        tick += 1
        freed.remove(over)
        buffer_of[v.id] = buffer_of[over.id]
        buffer_of[v.id].span = max(buffer_of[v.id].span, v.size)
      else:
        buffer_of[v.id] = _Buffer(v.id, v.size, v.size, [])
        buffers.append(buffer_of[v.id])
      ticks_of[v.id] = [tick, -1]
      buffer_of[v.id].ticks.append(ticks_of[v.id])
      tick += 1
    for v in freed:
      ticks_of[v.id][1] = tick
      tick += 1
  return buffers


def _heap_bytes(buffers: Sequence[_Buffer], order: str, alignment: int) -> int:
  """Heap size when ``buffers`` are placed in XLA's ``order`` ("spatial" or "temporal")."""

  def key(b: _Buffer) -> tuple[int, int, int]:
    if order == "spatial":
      first = b.ticks[0]
      return (-b.size, first[0] - first[1], b.id)
    return (min(t[0] for t in b.ticks) - max(t[1] for t in b.ticks), -b.size, b.id)

  count = sum(len(b.ticks) for b in buffers)
  starts, ends = np.empty(count, np.int64), np.empty(count, np.int64)
  los, his = np.empty(count, np.int64), np.empty(count, np.int64)
  placed = top = 0
  for b in sorted(buffers, key=key):
    overlap = np.zeros(placed, bool)  # placed ranges live at one of b's ticks
    for s, e in b.ticks:
      overlap |= (starts[:placed] <= e) & (s <= ends[:placed])
    offset = _best_fit(los[:placed][overlap], his[:placed][overlap], b.span, alignment)
    for s, e in b.ticks:
      starts[placed], ends[placed], los[placed], his[placed] = s, e, offset, offset + b.span
      placed += 1
    top = max(top, offset + b.span)
  return top


def _best_fit(los: np.ndarray, his: np.ndarray, span: int, alignment: int) -> int:
  """The offset (bytes) best fit gives ``span`` bytes among the byte ranges ``[lo, hi)``
  in use: the smallest gap it fits, the lowest of equal gaps; else above them all. A
  gap runs from the aligned end of every range below to the next start."""
  if not len(los):
    return 0
  order = np.lexsort((his, los))
  los, his = los[order], his[order]
  below = np.maximum.accumulate(his)  # the highest end up to each range
  free_from = np.concatenate(([0], -(-below[:-1] // alignment) * alignment))
  gaps = los - free_from
  fits = np.flatnonzero(gaps >= span)
  if not len(fits):
    return _aligned(int(below[-1]), alignment)
  best = fits[np.lexsort((free_from[fits], gaps[fits]))[0]]
  return int(free_from[best])


def _aligned(offset: int, alignment: int) -> int:
  """``offset`` rounded up to a multiple of ``alignment`` (bytes)."""
  return -(-offset // alignment) * alignment


def _merged(chunks: list[tuple[int, int]]) -> list[tuple[int, int]]:
  """Overlapping byte ranges (sorted by start) merged into disjoint ones."""
  out: list[tuple[int, int]] = []
  for lo, hi in chunks:
    if out and lo < out[-1][1]:
      out[-1] = (out[-1][0], max(out[-1][1], hi))
    else:
      out.append((lo, hi))
  return out
