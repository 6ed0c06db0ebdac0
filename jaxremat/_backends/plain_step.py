"""The plain step compiled with an XLA dump, read into the ``Replay`` of its layers: each
value's steps, bytes and layer, and the turn into the backward (``replay.py`` says how a
plan is replayed from it)."""

from __future__ import annotations

import collections
import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxremat._backends.heap import CPU_ALIGNMENT, GPU_ALIGNMENT
from jaxremat._backends.measure import compile_footprint, gradient_step
from jaxremat._backends.replay import Replay, Value
from jaxremat._backends.targets import Target, target_footprint
from jaxremat._backends.xla_dump import Dump, LayerNames, read_dump
from jaxremat._jaxpr.trace import TracedChain


@dataclasses.dataclass(frozen=True)
class PlainStep:
  """The plain step XLA compiled with a dump: its values (``Dump``), its footprint's fixed
  bytes (argument + output - alias), XLA's footprint (bytes) and the buffer alignment."""

  dump: Dump
  fixed_bytes: int
  total_bytes: int
  alignment: int

  def replay(self, traced: TracedChain, kept: Sequence[tuple[int, int, int]]) -> Replay:
    """The ``Replay`` of this step over ``traced``'s layers (any ``layer_depth`` of the
    model), ``kept`` the values a cut may keep (``Replay.kept``)."""
    replay = replay_of(self.dump, traced, kept, self.fixed_bytes, self.alignment)
    return dataclasses.replace(replay, plain_bytes=self.total_bytes)


def compile_plain_step(loss_fn: Callable[[Any, Any, Any], Any], params: Any, batch: Any,
                       target: Target | None, arrays: Any) -> PlainStep:
  """Compiles ``jax.grad(loss_fn)`` once (for ``target``, deviceless, when given; else on
  the local backend) with an XLA dump, and reads it. ``loss_fn(params, batch, arrays)``:
  ``arrays`` (the model's array kwargs) are arguments of the step."""
  with tempfile.TemporaryDirectory() as out:
    options = {"xla_dump_to": out}
    step = gradient_step(loss_fn)
    args = (params, batch, arrays)
    footprint = (target_footprint(step, args, target, options) if target
                 else compile_footprint(step, *args, compiler_options=options))
    found = read_dump(out, footprint.temp_bytes)
  gpu = target is not None or jax.default_backend() != "cpu"
  return PlainStep(found, footprint.total_bytes - footprint.temp_bytes, footprint.total_bytes,
                   GPU_ALIGNMENT if gpu else CPU_ALIGNMENT)


def compile_replay(traced: TracedChain, loss_fn: Callable[[Any, Any, Any], Any], params: Any,
                   batch: Any, kept: Sequence[tuple[int, int, int]], target: Target | None,
                   arrays: Any) -> Replay:
  """``compile_plain_step`` and its ``Replay`` over ``traced``'s layers."""
  return compile_plain_step(loss_fn, params, batch, target, arrays).replay(traced, kept)


def replay_of(dump: Dump, traced: TracedChain, kept: Sequence[tuple[int, int, int]],
              fixed_bytes: int,
              alignment: int = CPU_ALIGNMENT) -> Replay:
  """The ``Replay`` of a dumped plain step of ``traced``'s model (buffers aligned to
  ``alignment`` bytes)."""
  layers = LayerNames(traced)
  ops, schedule = dump.ops, dump.schedule
  producers: dict[str, set[str]] = collections.defaultdict(set)
  users: dict[str, set[str]] = collections.defaultdict(set)
  for v in dump.values.values():
    users[v.instr].update(v.uses)
    for u in v.uses:
      producers[u].add(v.instr)
  leaf = {name for name, (_, is_leaf) in ops.items() if is_leaf}
  paths = {name: layers.path(op) for name, (op, _) in ops.items()}
  backward = {name for name, (op, _) in ops.items() if "transpose(" in op}

  def computed_from(found: set[str]) -> set[str]:
    """``found`` and what reads them."""
    for name in schedule:
      if producers[name] & found:
        found.add(name)
    return found

  def arguments(*named: str) -> set[str]:
    """The step's arguments named so (``batch``, ``params``, ...)."""
    return {name for name in leaf if ops[name][0].startswith(named)}

  data = computed_from(arguments("batch"))
  weights = computed_from(arguments("params", "arrays"))  # the parameters and array kwargs
  looped = computed_from(set(dump.loop_params))  # inside a loop the schedule runs inline
  forward = {name for name in data - backward - leaf if ops.get(name, ("",))[0]}
  turn = _turn(schedule, producers, backward, data, forward, len(traced.layers))
  layer_of: dict[str, int] = {}
  for name in schedule[:turn]:
    path = paths.get(name)
    if name in backward or name in leaf or (path is None and ops.get(name, ("x",))[0]):
      continue
    after = max((layer_of[p] for p in producers[name] if p in layer_of), default=-1)
    fits = layers.candidates(path or ())
    later = [i for i in fits if i >= after]
    if fits:
      layer_of[name] = min(later) if later else max(fits)
    elif after >= 0:
      layer_of[name] = after
  forward_layer, current = [], 0
  for name in schedule[:turn]:
    current = layer_of.get(name, current)
    forward_layer.append(current)
  backward_layer, current = [], len(traced.layers) - 1
  for name in schedule[turn:]:
    path = paths.get(name)
    fits = layers.candidates(path) if name in backward and path else []
    if fits:
      below = [i for i in fits if i <= current]
      current = max(below) if below else min(fits)
    backward_layer.append(current)
  step = {name: i for i, name in enumerate(schedule)}
  meets_data: dict[str, int] = {}  # per instruction, the first step on the batch's values
  for t in range(len(schedule) - 1, -1, -1):  # it feeds (directly or through others)
    name = schedule[t]
    later = [meets_data[u] for u in users[name] if u in meets_data]
    if name in data:
      later.append(t)
    if later:
      meets_data[name] = min(later)
  temp = [v for v in dump.values.values()
          if v.allocation == "temp" and v.first >= 0 and not v.is_tuple]
  outputs: dict[int, list] = collections.defaultdict(list)
  for v in dump.values.values():
    if v.allocation == "output" and v.first >= 0 and not v.is_tuple:
      outputs[v.index].append(v)
  grads: list[tuple[int, int]] = []
  output_of: dict[int, int] = {}
  for found in outputs.values():  # the output, written last; the values it hosted before
    out = max(found, key=lambda v: (v.last, v.first))
    output_of.update({id(v): len(grads) for v in found if v is not out})
    grads.append((found[0].allocation_size, out.first))
    temp += [v for v in found if v is not out]
  tables = tuple(v.size for v in dump.values.values() if v.allocation == "temp" and v.is_tuple)
  starts = {(v.index, v.first, v.offset) for v in temp}  # written over one that ends there
  values = []
  for v in temp:
    reads = sorted(step[u] for u in v.uses if step.get(u, turn) < turn)  # in the forward
    unfed = v.instr not in data and v.first < turn  # made in the forward, not from the batch
    # a loop's values (dropout's random bits on CPU) are made again with their layer
    by_layer = paths.get(v.instr) is not None or v.instr in looped
    last = v.last - 1 if (v.index, v.last, v.offset) in starts and v.last > v.first else v.last
    first_read = min((step[u] for u in v.uses if u in step), default=None)
    if first_read is not None and unfed:  # made early (all blocks' random bits at once):
      first_read = max(first_read, meets_data.get(v.instr, first_read))  # where they select
    # a weight's cast (XLA names a fusion by its ops) that one layer reads: that layer's
    if reads and unfed and not by_layer and v.instr in weights and "convert" in v.instr:
      reader = forward_layer[reads[0]]
      readers = {forward_layer[t] for t in reads}
      readers |= {backward_layer[step[u] - turn] for u in v.uses if step.get(u, -1) >= turn}
      if readers == {reader}:
        values.append(Value(v.first, last, v.size, True, reads[-1], output_of.get(id(v), -1),
                            reads[0], (), reader))
        continue
    values.append(Value(v.first, last, v.size, not unfed or by_layer,
                        reads[-1] if reads else None, output_of.get(id(v), -1),
                        first_read if unfed and by_layer else None,
                        tuple(reads) if unfed and not by_layer else ()))
  return Replay(tuple(values), turn, tuple(forward_layer), tuple(backward_layer), tuple(kept),
                len(traced.layers), fixed_bytes, tables, alignment, grads=tuple(grads))


def _turn(schedule: Sequence[str], producers: dict[str, set[str]], backward: set[str],
          data: set[str], forward: set[str], layers: int) -> int:
  """The first backward step: the first instruction of the backward (``backward``) that
  reads the batch (``data``) and reaches within half a layer's depth as deep as any
  forward instruction (``forward``: named, of the forward, reading the batch) scheduled
  after it; an instruction's depth is the count of forward instructions on its longest
  chain from the batch, half a layer's the forward's deepest over ``2 * layers``. XLA may
  schedule backward work on an earlier layer's forward values during the forward (the
  padding of a block's attention probabilities, bf16 on the H100): more of the forward
  follows it. Forward work it puts off into the backward (a slice read only there) is
  a few instructions deeper than the backward's first at most."""
  depth: dict[str, int] = {}
  for name in schedule:
    below = max((depth.get(p, 0) for p in producers[name]), default=0)
    depth[name] = below + (name in forward)
  deepest_after = [0] * (len(schedule) + 1)  # of the forward instructions from step i on
  for i in range(len(schedule) - 1, -1, -1):
    name = schedule[i]
    deepest_after[i] = max(deepest_after[i + 1], depth[name] if name in forward else 0)
  slack = max(1, deepest_after[0] // (2 * max(layers, 1)))
  return next((i for i, name in enumerate(schedule) if name in backward and name in data
               and depth[name] + slack >= deepest_after[i + 1]), len(schedule))
