"""A profile read off the compiled training step: what XLA keeps per layer (issue 21).

The jaxpr profile (``profile.py``) models which residuals XLA keeps; this module reads
them from ONE compile of the plain training step (no remat) on JAX's default backend and
replaces ``b_i`` (and ``e_i``) of the jaxpr chain by them. ``a_i``, ``g_i``, ``w_i`` and
FLOPs stay the jaxpr's. Opt-in; how the API calls it (one line, ``traced`` and ``chain``
as in ``apply._planner``, ``loss`` the step's loss, e.g. ``training_loss(model_fn,
model_kwargs)``)::

    from jaxremat._backends.compiled import compiled_chain
    chain = compiled_chain(traced, prof.chain, loss, params, batch)

or, keeping the per-layer figures (``CompiledProfile``) for reports::

    found = compiled_profile(traced, loss, params, batch)
    chain = with_compiled(prof.chain, found)

What is read. ``compile(compiler_options={"xla_dump_to": DIR})`` writes, for the step's
module, three text files whose fields this module reads:

* ``*after_optimizations-buffer-assignment.txt``: per allocation (``allocation K: size S,
  preallocated-temp`` / ``maybe-live-out`` / ``parameter``) its values as ``value: <ID
  NAME @0> (size=B,offset=O)``: which values live in XLA's temp allocation, and bytes;
* ``*after_optimizations-buffer-assignment-values.txt``: per value ``<ID NAME @0>`` its
  ``uses:`` (instruction, operand) and ``from instruction: %INSTR = ...
  metadata={op_name="..."}``: the defining instruction and its op name, which carries
  the Flax name stack (``jit(loss)/jvp(Sequential)/layers_2/dot_general``; the backward's
  are under ``transpose(...)``);
* ``*after_optimizations-live-range.txt``: ``InstructionSequence`` (XLA's schedule of the
  entry computation) and ``BufferLiveRange`` (``NAME{index}:first-last`` in schedule steps).

The turn is the first instruction in the schedule whose op name has ``transpose(`` and
that reads a computed value. A value is kept for the backward when the model's forward
writes it (op name under the root module, without ``transpose(``) before the turn, it is
live at the turn, not live out, and some instruction of the model's backward reads it (a
value only the loss reads, such as the model's output, is not a residual). It counts for
the layer whose name-stack path prefixes the writer's op name (a fusion carries its
root's); a layer outside any module (``(relu)``) or a repeated name is told by data flow:
the first such layer at or after the latest layer the writer reads; an instruction with no
op name (CPU max-pool's index and zero buffers), the layer it reads, else the layer of the
forward instruction scheduled last before it. A kept value that
layer ``i - 1`` writes and only layer ``i``'s backward reads is layer ``i``'s own input
(``e_i``). Only values in the temp allocation count: XLA places some in a parameter
gradient's output buffer, which the fixed bytes already hold (``output_buffer_bytes``).
Loops and called computations are not looked into (their values have no entry live range).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import jax

from jaxremat._backends.measure import Footprint, compile_footprint
from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.trace import TracedChain
from jaxremat._model.chain import Chain

_ALLOCATION = re.compile(r"^allocation \d+: size \d+(.*)$")
_VALUE = re.compile(r"^ value: <(\d+) (\S+?) @0> \(size=(\d+),offset=\d+\): (\S)")
_HEADER = re.compile(r"^<(\d+) (\S+) @0>")
_USE = re.compile(r"^  (\S+), operand")
_FROM = re.compile(r"^ from instruction: %?(\S+) = (.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_STEP = re.compile(r"^\s+(\d+):(\S+)$")
_RANGE = re.compile(r"^\s+(\S+\{[\d,]*\}):(\d+)-(\d+)$")
_LEAF_OPS = ("parameter(", "constant(", "iota(")


@dataclasses.dataclass(frozen=True)
class CompiledProfile:
  """Per layer, what the compiled plain step keeps for its backward (bytes).

  Attributes:
    res_bytes: ``b_i``: kept values in XLA's temp allocation counted for layer ``i``.
    input_res_bytes: ``e_i``: the part of ``res_bytes[i]`` that is layer ``i``'s input.
    output_buffer_bytes: kept values XLA placed in an output buffer (not in ``res_bytes``).
    act_bytes: bytes each layer writes that a later layer's forward reads (its output).
    other_bytes: kept values of no layer (the loss's, the model output kept for it).
    temp_bytes: XLA's temp allocation of the step.
    footprint: the step's ``Footprint`` (the plan without remat, measured).
  """

  res_bytes: tuple[int, ...]
  input_res_bytes: tuple[int, ...]
  output_buffer_bytes: tuple[int, ...]
  act_bytes: tuple[int, ...]
  other_bytes: int
  temp_bytes: int
  footprint: Footprint | None = None


@dataclasses.dataclass
class _Value:
  name: str  # "fusion.3{}" as in the live-range dump
  size: int
  allocation: str  # "temp", "output", "parameter", "other"
  instr: str = ""
  uses: tuple[str, ...] = ()
  first: int = -1
  last: int = -1


def compiled_chain(traced: TracedChain, chain: Chain, loss_fn: Callable[[Any, Any], Any],
                   params: Any, batch: Any,
                   compiler_options: Mapping[str, str | bool] | None = None) -> Chain:
  """``chain`` (the jaxpr profile of ``traced``) with ``b_i``/``e_i`` as XLA keeps them in
  ``jax.grad(loss_fn)(params, batch)`` compiled once without remat."""
  return with_compiled(chain, compiled_profile(traced, loss_fn, params, batch, compiler_options))


def with_compiled(chain: Chain, found: CompiledProfile) -> Chain:
  """``chain`` with ``b_i`` and ``e_i`` from ``found``. The batch is an argument, no value
  XLA writes: layer 1 keeps the jaxpr's ``e_1`` (the part of its input it saves) on top."""
  if len(found.res_bytes) != chain.n:
    raise ValueError(f"the compiled profile has {len(found.res_bytes)} layers, the chain {chain.n}")
  first = chain.input_res_bytes[0] if chain.n else 0
  res = [b + (first if i == 0 else 0) for i, b in enumerate(found.res_bytes)]
  own = [e + (first if i == 0 else 0) for i, e in enumerate(found.input_res_bytes)]
  return Chain(chain.act_bytes, res, cot_bytes=chain.cot_bytes, input_res_bytes=own,
               workspace_bytes=chain.workspace_bytes, flops=chain.flops, names=chain.names)


def compiled_profile(traced: TracedChain, loss_fn: Callable[[Any, Any], Any], params: Any,
                     batch: Any, compiler_options: Mapping[str, str | bool] | None = None
                     ) -> CompiledProfile:
  """Compiles ``jax.grad(loss_fn)`` once with an XLA dump and reads per layer what it keeps
  (module docstring); ``traced`` gives the layers' names."""
  with tempfile.TemporaryDirectory() as out:
    options = {**(compiler_options or {}), "xla_dump_to": out}
    footprint = compile_footprint(jax.grad(loss_fn), params, batch, compiler_options=options)
    found = read_dump(out, traced, footprint.temp_bytes)
  return dataclasses.replace(found, footprint=footprint)


def read_dump(directory: str, traced: TracedChain, temp_bytes: int | None = None
              ) -> CompiledProfile:
  """The ``CompiledProfile`` of the module dumped in ``directory`` (of a step whose temp
  allocation is ``temp_bytes``, when several modules were dumped)."""
  paths = sorted(glob.glob(os.path.join(directory, "*after_optimizations-buffer-assignment.txt")))
  candidates = []
  for path in paths:
    stem = path[: -len("buffer-assignment.txt")]
    values, ops, temp = _read_values(path, stem + "buffer-assignment-values.txt")
    candidates.append((temp, values, ops, _read_schedule(stem + "live-range.txt", values)))
  if temp_bytes is not None:
    candidates = [c for c in candidates if c[0] == temp_bytes] or candidates
  if not candidates:
    raise FileNotFoundError(f"no buffer-assignment dump in {directory}")
  temp, values, ops, schedule = max(candidates, key=lambda c: c[0])
  return _attribute(values, ops, schedule, traced, temp)


def _read_values(assignment: str, values_path: str
                 ) -> tuple[dict[int, _Value], dict[str, tuple[str, bool]], int]:
  """Values by id (allocation kind, bytes, defining instruction, uses); instruction name ->
  (op name, whether it is a leaf: parameter, constant, iota); the temp bytes."""
  values: dict[int, _Value] = {}
  kind, temp = "other", 0
  with open(assignment) as f:
    for line in f:
      if allocation := _ALLOCATION.match(line):
        tags = allocation.group(1)
        kind = ("temp" if "preallocated-temp" in tags else "parameter" if "parameter" in tags
                else "output" if "live-out" in tags else "other")
        if kind == "temp":
          temp = int(line.split("size ")[1].split(",")[0])
      elif value := _VALUE.match(line):
        name = value.group(2) if value.group(2).endswith("}") else value.group(2) + "{}"
        values[int(value.group(1))] = _Value(
            name, int(value.group(3)), "tuple" if value.group(4) == "(" else kind)
  ops: dict[str, tuple[str, bool]] = {}
  current: _Value | None = None
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
        if current is not None:
          current.instr, current.uses = source.group(1), tuple(uses)
  return values, ops, temp


def _read_schedule(live_range: str, values: dict[int, _Value]) -> list[str]:
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


class _Layers:
  """Tells a model instruction's layer from its op name (and, where ambiguous, data flow)."""

  def __init__(self, traced: TracedChain):
    roots = collections.Counter(stack[0] for layer in traced.layers for e in layer.eqns
                                if (stack := _compat.name_stack(e)))
    self.root = roots.most_common(1)[0][0] if roots else ""
    self.paths: list[tuple[tuple[str, ...], bool]] = []  # (path, named module?) per layer
    for layer in traced.layers:
      parts = tuple(re.sub(r"#\d+$", "", layer.name).split("/"))
      outside = parts[-1].startswith("(")
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


def _attribute(values: dict[int, _Value], ops: dict[str, tuple[str, bool]],
               schedule: list[str], traced: TracedChain, temp: int) -> CompiledProfile:
  """Per layer the kept bytes (module docstring) from the read dump."""
  layers = _Layers(traced)
  n = len(traced.layers)
  producers: dict[str, set[str]] = collections.defaultdict(set)
  for v in values.values():
    for u in v.uses:
      producers[u].add(v.instr)
  leaf = {name for name, (_, is_leaf) in ops.items() if is_leaf}
  paths = {name: layers.path(op) for name, (op, _) in ops.items()}
  backward = {name for name, (op, _) in ops.items() if "transpose(" in op}
  data = {name for name in leaf if ops[name][0].startswith("batch")}  # the batch's parameters
  for name in schedule:  # what depends on the batch (the weights' flips do not)
    if producers[name] & data:
      data.add(name)
  turn = next((i for i, name in enumerate(schedule) if name in backward and name in data),
              len(schedule))
  layer_of: dict[str, int] = {}  # forward model instructions
  for step, name in enumerate(schedule):
    path = paths.get(name)
    if name in backward or name in leaf:
      continue
    if path is None:  # no op name (a pool's indices): the layer it reads, before the turn
      path = () if ops.get(name, ("x", False))[0] == "" and step < turn else None
      if path is None:
        continue
    after = max((layer_of[p] for p in producers[name] if p in layer_of), default=-1)
    found = layers.candidates(path)
    later = [i for i in found if i >= after]
    if later or found:
      layer_of[name] = min(later) if later else max(found)
    elif after >= 0:
      layer_of[name] = after

  def backward_layer(name: str, writer: int) -> int | None:
    """The layer whose backward ``name`` is, among those its op name fits: the writer's
    or the next one's where several fit (``(relu)`` and ``(relu)#2``); else unknown."""
    path = paths.get(name)
    found = layers.candidates(path) if name in backward and path else []
    if len(found) == 1:
      return found[0]
    return writer + 1 if writer + 1 in found else writer if writer in found else None

  near, last = {}, 0  # per instruction, the layer of the latest forward one scheduled before
  for name in schedule:
    last = layer_of.get(name, last)
    near[name] = last
  res, own, out_buf, act = [0] * n, [0] * n, [0] * n, [0] * n
  other = 0
  steps = {name: i for i, name in enumerate(schedule)}
  for v in values.values():
    if v.allocation == "tuple" or v.first < 0:
      continue
    writer = layer_of.get(v.instr)
    if writer is not None and any(layer_of.get(u, -1) > writer for u in v.uses):
      act[writer] += v.size
    if not v.first < turn <= v.last < len(schedule) or v.instr in leaf:
      continue
    readers = [u for u in v.uses if paths.get(u) is not None and steps.get(u, -1) >= turn]
    if not readers or "transpose(" in ops.get(v.instr, ("", False))[0]:
      continue
    if writer is None and ops.get(v.instr, ("x", False))[0] == "":
      writer = near.get(v.instr)  # no op name (a pool gradient's zeros): where it is written
    if writer is None:
      other += v.size if v.allocation == "temp" else 0
      continue
    owners = {backward_layer(u, writer) for u in readers}
    is_input = writer + 1 < n and owners == {writer + 1}
    layer = writer + 1 if is_input else writer
    if v.allocation == "temp":
      res[layer] += v.size
      own[layer] += v.size if is_input else 0
    elif v.allocation == "output":
      out_buf[layer] += v.size
  return CompiledProfile(tuple(res), tuple(own), tuple(out_buf), tuple(act), other, temp)
