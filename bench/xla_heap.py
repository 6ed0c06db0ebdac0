"""XLA's temp allocation, read back from a compile's dump and replayed.

A bench helper, not part of the installed package: ``bench/live_peak.py``,
``bench/heap_replay.py`` and ``bench/dump_packing.py`` use it, and
``tests/test_xla_heap.py`` tests it.

A compiled step's temp allocation holds XLA's own values (post-fusion HLO values, each
with an offset, a size and a live range over XLA's schedule). Its size is what XLA's
heap placement makes of them, and that can exceed their peak live bytes: the rest is
packing, room left between buffers. This module reads the values off an XLA dump
(``read_temp_values``), sums their live bytes at each step (``live_peak_bytes``), and
replays XLA's placement over them (``replay_temp_bytes``), which reproduces the
allocation's size: the packing is fully set by those values and their order, none of
which the jaxpr has (docs/memory-model.md, "Heap packing").

The replay follows XLA's heap simulator (``HeapSimulator`` with the
``GlobalDecreasingSizeBestFitHeap`` placements its buffer assigner runs, the smaller of
the two kept):

* time is counted in events, not schedule steps: at each step the values it defines are
  allocated one by one (in order of first step, last step, value id), then the values
  whose last step it is are freed one by one; each event is one tick. A value that
  ends at a step and one that starts there therefore overlap,
* unless the new value is written in place over the ending one (the dump shows this as
  the two at one offset): the pair is then one buffer, placed once, over both ranges,
* buffers are placed largest first (``"spatial"``: by size, then by length in ticks,
  then by value id) or longest first (``"temporal"``: by length over the whole buffer,
  then size, then id), each in the smallest free gap over its ticks that fits it
  (aligned), else above everything live then,
* a tuple's own value (its table of element pointers, e.g. an optimization barrier's)
  is not placed in that heap: XLA gives each its own allocation and appends them above
  the heap, smallest first (then by falling value id), each aligned.

The dumps of XLA's GPU backend read the same way; its buffers are 256-byte aligned
(``replay_temp_bytes(values, 256)`` reproduces the H100 dumps in tests/data/h100/), the
CPU's 64 (the default).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from jaxremat import Footprint, measure

#: XLA's CPU buffer alignment (bytes).
CPU_ALIGNMENT = 64

_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)")
_VALUE = re.compile(r"^ value: <(\d+) (\S+?) @0> \(size=(\d+),offset=(\d+)\): (\S)")
_RANGE = re.compile(r"^\s+(\S+\{[\d,]*\}):(\d+)-(\d+)$")


@dataclasses.dataclass(frozen=True)
class TempValue:
  """One value of XLA's temp allocation.

  Attributes:
    id: XLA's value id (the heap's last tie-break).
    first: the first step of XLA's schedule it is live at.
    last: the last step it is live at (included).
    offset: where XLA placed it in the allocation (bytes).
    size: its size (bytes).
    is_tuple: a tuple's own value (its table of element pointers).
  """

  id: int
  first: int
  last: int
  offset: int
  size: int
  is_tuple: bool = False


def read_temp_values(buffer_assignment: str, live_range: str) -> tuple[int, list[TempValue]]:
  """``(temp allocation bytes, its values)`` from one compile's
  ``*-buffer-assignment.txt`` and ``*-live-range.txt`` dumps (paths); ``(0, [])``
  when the step has no temp allocation."""
  found, temp, inside = [], None, False
  with open(buffer_assignment) as f:
    for line in f:
      allocation = _ALLOCATION.match(line)
      if allocation:
        inside = "preallocated-temp" in line
        if inside:
          temp = int(allocation.group(1))
      elif inside and (value := _VALUE.match(line)):
        name = value.group(2)  # "add.3" or "add.3{}", or "reduce-window{1}" in a tuple
        name += "" if name.endswith("}") else "{}"
        found.append((name, int(value.group(1)), int(value.group(4)), int(value.group(3)),
                      value.group(5) == "("))
  if temp is None:
    return 0, []
  ranges = {}
  with open(live_range) as f:
    for line in f:
      if match := _RANGE.match(line):
        ranges[match.group(1)] = (int(match.group(2)), int(match.group(3)))
  return temp, [TempValue(id_, *ranges[name], offset, size, is_tuple)
                for name, id_, offset, size, is_tuple in found]


def measure_with_temp_values(
    loss_fn: Callable[[Any, Any], Any], params: Any, batch: Any
) -> tuple[Footprint, list[TempValue]]:
  """``jaxremat.measure`` of ``loss_fn``'s gradient step, and its temp allocation's
  values, read off an XLA dump of that compile."""
  with tempfile.TemporaryDirectory() as out:
    footprint = measure(loss_fn, params, batch, compiler_options={"xla_dump_to": out})
    paths = [glob.glob(os.path.join(out, f"*after_optimizations-{kind}.txt"))
             for kind in ("buffer-assignment", "live-range")]
    if any(len(found) != 1 for found in paths):
      raise RuntimeError(f"expected one buffer-assignment and one live-range dump, found {paths}")
    temp, values = read_temp_values(paths[0][0], paths[1][0])
  if temp != footprint.temp_bytes:
    raise RuntimeError(f"the dump's temp allocation ({temp} B) is not the step's "
                       f"({footprint.temp_bytes} B)")
  return footprint, values


def live_peak_bytes(values: Sequence[TempValue]) -> int:
  """The most bytes of the allocation that hold a live value at one schedule step
  (values written in place over another share its bytes, and count once)."""
  def live_bytes(step: int) -> int:  # the union of the byte ranges live at ``step``
    ranges = sorted((v.offset, v.offset + v.size) for v in values if v.first <= step <= v.last)
    return sum(hi - lo for lo, hi in _merged(ranges))

  # the live bytes peak where a value starts
  return max((live_bytes(step) for step in {v.first for v in values}), default=0)


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
  tick, buffer_of, ticks_of, buffers = 0, {}, {}, []
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

  placed: list[tuple[int, int, int, int]] = []  # (start tick, end tick, lo, hi)
  top = 0
  for b in sorted(buffers, key=key):
    used = sorted((lo, hi) for start, end, lo, hi in placed
                  if any(start <= e and s <= end for s, e in b.ticks))
    gaps, free_from = [], 0  # (bytes, offset) of each gap b fits in; free_from is aligned
    for lo, hi in _merged(used):
      if lo - free_from >= b.span:
        gaps.append((lo - free_from, free_from))
      free_from = max(free_from, _aligned(hi, alignment))
    offset = min(gaps)[1] if gaps else free_from  # best fit, the lowest of equal gaps
    placed.extend((s, e, offset, offset + b.span) for s, e in b.ticks)
    top = max(top, offset + b.span)
  return top


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
