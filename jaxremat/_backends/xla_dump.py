"""Reading XLA's dump of a compiled step: its values, their live ranges, its schedule.

``compile(compiler_options={"xla_dump_to": DIR})`` writes, per module, three text files
whose fields are read here:

* ``*after_optimizations-buffer-assignment.txt``: per allocation (``allocation K: size S,
  preallocated-temp`` / ``maybe-live-out`` / ``parameter``) its values as ``value: <ID
  NAME @0> (size=B,offset=O)``: which values live in XLA's temp allocation, where, and
  their bytes;
* ``*after_optimizations-buffer-assignment-values.txt``: per value ``<ID NAME @0>`` its
  ``uses:`` (instruction, operand) and ``from instruction: %INSTR = ...
  metadata={op_name="..."}``: the defining instruction and its op name, which carries
  the Flax name stack (``jit(loss)/jvp(Sequential)/layers_2/dot_general``; the backward's
  are under ``transpose(...)``);
* ``*after_optimizations-live-range.txt``: ``InstructionSequence`` (XLA's schedule of the
  entry computation) and ``BufferLiveRange`` (``NAME{index}:first-last`` in schedule steps).

XLA's CPU and GPU backends write them alike. Where the schedule runs a loop's body inline
(XLA:CPU's threefry loops), the body's values have live ranges too; its parameter is then a
leaf outside the step's parameter allocations (``Dump.loop_params``).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re

from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.regroup import own_work_path
from jaxremat._jaxpr.trace import TracedChain

_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*)$")
_VALUE = re.compile(
    r"^ value: <(\d+) (\S+?)(?: \(phi\))? @0> \(size=(\d+),offset=(\d+)\): (\S)")
_HEADER = re.compile(r"^<(\d+) (\S+?)(?: \(phi\))? @0>")
_USE = re.compile(r"^  (\S+), operand")
_FROM = re.compile(r"^ from instruction: %?(\S+) = (.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_STEP = re.compile(r"^\s+(\d+):(\S+)$")
_RANGE = re.compile(r"^\s+(\S+\{[\d,]*\}):(\d+)-(\d+)$")
_LEAF_OPS = ("parameter(", "constant(", "iota(")


@dataclasses.dataclass
class DumpValue:
  """One value of the module: its name, bytes, allocation, whether it is a tuple's,
  defining instruction, uses, live range (schedule steps, both included; -1: none)."""

  name: str  # "fusion.3{}" as in the live-range dump
  size: int
  allocation: str  # "temp", "output", "parameter", "other"
  index: int = 0  # the allocation's number
  allocation_size: int = 0  # the allocation's bytes
  offset: int = 0  # where in its allocation (bytes)
  is_tuple: bool = False  # a tuple's own value: its table of element pointers
  instr: str = ""
  uses: tuple[str, ...] = ()
  first: int = -1
  last: int = -1


@dataclasses.dataclass
class Dump:
  """One compiled module as dumped.

  Attributes:
    values: by value id (``DumpValue``).
    ops: instruction name -> (op name, whether it is a leaf: parameter, constant, iota).
    schedule: the entry computation's instructions in XLA's order.
    temp_bytes: the temp allocation's size.
    loop_params: the parameters of called computations (a loop's body or condition):
      what they hold comes from the loop's operands, not from the step's arguments.
  """

  values: dict[int, DumpValue]
  ops: dict[str, tuple[str, bool]]
  schedule: list[str]
  temp_bytes: int
  loop_params: frozenset[str] = frozenset()


def read_dump(directory: str, temp_bytes: int | None = None) -> Dump:
  """The module dumped in ``directory`` whose temp allocation is ``temp_bytes`` (when
  several modules were dumped); else the one of largest temp allocation."""
  paths = sorted(glob.glob(os.path.join(directory, "*after_optimizations-buffer-assignment.txt")))
  dumps = []
  for path in paths:
    stem = path[: -len("buffer-assignment.txt")]
    values, ops, temp, params = _read_values(path, stem + "buffer-assignment-values.txt")
    loop_params = frozenset(v.instr for v in values.values()
                            if v.instr in params and v.allocation != "parameter")
    dumps.append(Dump(values, ops, _read_schedule(stem + "live-range.txt", values), temp,
                      loop_params))
  if temp_bytes is not None:
    dumps = [d for d in dumps if d.temp_bytes == temp_bytes] or dumps
  if not dumps:
    raise FileNotFoundError(f"no buffer-assignment dump in {directory}")
  return max(dumps, key=lambda d: d.temp_bytes)


def _read_values(assignment: str, values_path: str
                 ) -> tuple[dict[int, DumpValue], dict[str, tuple[str, bool]], int, set[str]]:
  """Values by id (allocation kind, bytes, defining instruction, uses); instruction name ->
  (op name, whether it is a leaf: parameter, constant, iota); the temp bytes; the
  parameter instructions."""
  values: dict[int, DumpValue] = {}
  kind, temp, index, size = "other", 0, 0, 0
  with open(assignment) as f:
    for line in f:
      if allocation := _ALLOCATION.match(line):
        index, size, tags = int(allocation.group(1)), int(allocation.group(2)), allocation.group(3)
        kind = ("temp" if "preallocated-temp" in tags else "parameter" if "parameter" in tags
                else "output" if "live-out" in tags else "other")
        if kind == "temp":
          temp = size
      elif value := _VALUE.match(line):
        name = value.group(2) if value.group(2).endswith("}") else value.group(2) + "{}"
        values[int(value.group(1))] = DumpValue(
            name, int(value.group(3)), kind, index, size, int(value.group(4)),
            value.group(5) == "(")
  ops: dict[str, tuple[str, bool]] = {}
  params: set[str] = set()
  current: DumpValue | None = None
  uses: list[str] = []
  with open(values_path) as f:
    for line in f:
      if header := _HEADER.match(line):
        current, uses = values.get(int(header.group(1))), []
      elif use := _USE.match(line):
        uses.append(use.group(1))
      elif source := _FROM.match(line):
        op = _OP_NAME.search(source.group(2))
        ops[source.group(1)] = (op.group(1) if op else "",
                                any(leaf in source.group(2) for leaf in _LEAF_OPS))
        if "parameter(" in source.group(2):
          params.add(source.group(1))
        if current is not None:
          current.instr, current.uses = source.group(1), tuple(uses)
  return values, ops, temp, params


def _read_schedule(live_range: str, values: dict[int, DumpValue]) -> list[str]:
  """XLA's schedule (instruction names in order); sets each value's live range."""
  schedule: list[str] = []
  ranges: dict[str, tuple[int, int]] = {}
  with open(live_range) as f:
    for line in f:
      if step := _STEP.match(line):
        schedule.append(step.group(2))
      elif found := _RANGE.match(line):
        ranges[found.group(1)] = (int(found.group(2)), int(found.group(3)))
  for v in values.values():
    v.first, v.last = ranges.get(v.name, (-1, -1))
  return schedule


class LayerNames:
  """Tells a model instruction's layer from its op name (and, where ambiguous, data flow)."""

  def __init__(self, traced: TracedChain):
    roots = collections.Counter(stack[0] for layer in traced.layers for e in layer.eqns
                                if (stack := _compat.name_stack(e)))
    self.root = roots.most_common(1)[0][0] if roots else ""
    self.paths: list[tuple[tuple[str, ...], bool]] = []  # (path, named module?) per layer
    for layer in traced.layers:
      name = re.sub(r"#\d+$", "", layer.name)
      parts, outside = tuple(name.split("/")), own_work_path(name) is not None
      self.paths.append((parts[:-1] if outside else parts, not outside))

  def path(self, op_name: str) -> tuple[str, ...] | None:
    """The name-stack path below the root of a model op (None: not the model's)."""
    for op in op_name.split(";"):
      parts = op.split("/")
      for k, part in enumerate(parts):
        if self.root and re.sub(r"^(?:[\w-]+\()+|\)+$", "", part) == self.root:
          return tuple(parts[k + 1:])
    return None

  def candidates(self, path: tuple[str, ...]) -> list[int]:
    """Layers ``path`` may be in: the named ones of longest matching path, else the
    layers outside modules whose parent is the longest prefix."""
    for named in (True, False):
      fits = [(len(p), i) for i, (p, n) in enumerate(self.paths)
              if n == named and path[:len(p)] == p and (named or len(path) > len(p))]
      if fits:
        longest = max(n for n, _ in fits)
        return [i for n, i in fits if n == longest]
    return []
