"""XLA's temp allocation, read back from a compile's dump.

A bench helper, not part of the installed package: ``bench/live_peak.py``,
``bench/heap_replay.py`` and ``bench/dump_packing.py`` use it, and
``tests/test_xla_heap.py`` tests it.

A compiled step's temp allocation holds XLA's own values (post-fusion HLO values, each
with an offset, a size and a live range over XLA's schedule). This module reads them off
an XLA dump (``read_temp_values``); ``jaxremat._backends.heap`` sums their live bytes at
each step (``live_peak_bytes``) and replays XLA's placement over them
(``replay_temp_bytes``), which reproduces the allocation's size: the packing is fully set
by those values and their order, none of which the jaxpr has (docs/memory-model.md,
"Heap packing"). The dumps of XLA's GPU backend read the same way (256-byte alignment:
``replay_temp_bytes(values, 256)`` reproduces the H100 dumps in tests/data/h100/).
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
from collections.abc import Callable
from typing import Any

from jaxremat import Footprint, measure
from jaxremat._backends.heap import (TempValue, live_peak_bytes,  # noqa: F401 (re-exported)
                                     replay_temp_bytes)
from jaxremat._backends.xla_dump import _VALUE  # one reading of a value line, (phi) included

_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)")
_RANGE = re.compile(r"^\s+(\S+\{[\d,]*\}):(\d+)-(\d+)$")


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
