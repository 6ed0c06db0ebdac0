"""XLA's CPU fusions of a backward pass: library fusions, cotangent copies, inputs read in fusions.

A layer whose input is read by convolutions and by elementwise ops only (a residual
block's ``relu(bn(conv(x)) + x)``) does not keep that input as written: XLA duplicates
the input's elementwise tail (the previous layer's ``relu(bn(a) + b)``) into each
elementwise fusion that reads it, in the forward pass and in the backward's ReLU mask,
and keeps the operands of that tail instead (the convolution outputs ``a`` and ``b``)
until the layer's backward. Where the previous layer is recomputed, those operands are
kept beside its output's relaid copy (``operands_kept``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jaxremat._jaxpr import compat as _compat


def reads_input_in_fusions(step_jaxpr, n_inputs: int) -> bool:
  """Whether the layer's forward-and-backward ``step_jaxpr`` (its first ``n_inputs``
  inputs are the layer's input) reads that input by convolutions and by elementwise
  ops only, at least one of each: XLA then recomputes the input's elementwise tail in
  those fusions instead of reading the input."""
  jaxpr = getattr(step_jaxpr, "jaxpr", step_jaxpr)
  eqns = _compat.inlined_eqns(jaxpr)[0]
  _, consumers = _compat.dataflow(eqns)
  readers = [eqns[k] for v in jaxpr.invars[:n_inputs] for k in consumers.get(v, ())]
  others = [r for r in readers if r[0] != "conv_general_dilated"]
  return (len(others) < len(readers) and bool(others)
          and all(_compat.fusible_op(name, params, _compat.ELEMENTWISE_PRIMITIVES)
                  for name, _, _, params in others))


def operands_kept(eqns: Sequence, inputs: Sequence,
                  outputs: Sequence) -> tuple[tuple[int, ...], bool]:
  """The operands of the elementwise tail that makes a layer's ``outputs`` from its
  forward equations ``eqns``: bytes of each value the layer computes that the tail
  reads (through fusible ops), and whether it reads the layer's ``inputs`` too."""
  producer = {v: eqn for eqn in eqns for v in eqn.outvars}
  input_set = set(inputs)
  kept: dict = {}
  reads_input = False
  todo = [v for v in outputs if not isinstance(v, _compat.Literal)]
  seen = set()
  while todo:
    v = todo.pop()
    if v in seen:
      continue
    seen.add(v)
    eqn = producer.get(v)
    if v in input_set:
      reads_input = True
    elif eqn is None:
      continue  # a parameter
    elif _compat.fusible(eqn):
      todo.extend(_compat.non_literals(eqn.invars))
    elif v not in outputs:
      kept[v] = _compat.aval_bytes(v.aval)
  return tuple(kept.values()), reads_input


#: Reductions and products XLA's CPU backend runs as library (YNNPACK) fusions.
_LIBRARY_SEEDS = frozenset({"reduce_sum", "dot_general"})

#: Elementwise ops of a backward pass (``add_any`` sums cotangents).
_BACKWARD_FUSIBLE = _compat.FUSIBLE_PRIMITIVES | {"add_any"}

#: Shape-only primitives that keep the element count (looked through to the source).
_SAME_SIZE = frozenset({
    "reshape", "expand_dims", "squeeze", "broadcast_in_dim", "convert_element_type"})


@dataclasses.dataclass(frozen=True)
class LibraryFusions:
  """What the library fusions of a layer's backward ask of its forward (CPU).

  Attributes:
    broadcasts: bytes of each broadcast written out in full for them.
    read_whole: ``(equation index, output index, primitive name)`` of each forward value
      (top-level equations of the layer's forward-and-backward jaxpr) one of them reads:
      XLA writes it in the forward and keeps it, where it would otherwise recompute it.
  """

  broadcasts: tuple[int, ...] = ()
  read_whole: frozenset = frozenset()


def library_fusions(step_jaxpr, n_cotangents: int) -> LibraryFusions:
  """The library fusions of a layer's backward and what they need written out.

  ``step_jaxpr`` is the layer's forward and backward; its last ``n_cotangents`` inputs
  are the output cotangents. XLA's CPU backend runs a backward reduction (with the
  elementwise ops feeding it) and a matmul (with the elementwise ops it feeds) as one
  library (YNNPACK) fusion, which reads whole buffers only:

  * a smaller operand there (LayerNorm's scale or inverse deviation against a
    cotangent, a softmax's denominator) is broadcast to full size in a buffer of its
    own, made as soon as its source exists and kept until the backward reads it; a
    source that cheap elementwise ops compute (``x * x``) is recomputed inside instead;
  * a forward value an elementwise op feeding the reduction reads (BatchNorm's
    ``x - mean`` in ``sum(g * (x - mean))``) is written and kept, not recomputed. Ops
    are pulled in only through values used once: a product two reductions read
    (LayerNorm's) is written by an ordinary fusion, which recomputes its operands.
  """
  jaxpr = getattr(step_jaxpr, "jaxpr", step_jaxpr)
  eqns, renaming = _compat.inlined_eqns(jaxpr)
  cotangent = set(jaxpr.invars[len(jaxpr.invars) - n_cotangents:])
  producer, consumers = _compat.dataflow(eqns)
  for _, ins, outs, _ in eqns:
    if any(v in cotangent for v in _compat.non_literals(ins)):
      cotangent.update(outs)

  def fusible(k: int) -> bool:
    return (eqns[k][0] in _BACKWARD_FUSIBLE
            and any(v in cotangent for v in _compat.non_literals(eqns[k][1])))

  feeding: set = set()  # elementwise ops feeding a reduction through values used once
  region: set = set()  # with those feeding through any value, and those a matmul feeds
  for k, (name, ins, outs, _) in enumerate(eqns):
    if name not in _LIBRARY_SEEDS or not any(v in cotangent for v in _compat.non_literals(ins)):
      continue
    if name == "reduce_sum":
      for once_only, found in ((True, feeding), (False, region)):
        stack = [(v, producer[v]) for v in _compat.non_literals(ins) if v in producer]
        while stack:
          v, j = stack.pop()
          if j in found or not fusible(j) or (once_only and len(consumers[v]) > 1):
            continue
          found.add(j)
          stack.extend((u, producer[u]) for u in _compat.non_literals(eqns[j][1]) if u in producer)
    else:
      pending = [c for v in outs for c in consumers.get(v, ())]
      while pending:
        j = pending.pop()
        if j not in region and fusible(j):
          region.add(j)
          pending.extend(c for v in eqns[j][2] for c in consumers.get(v, ()))
  region |= feeding

  def source(v):
    while (v in producer and eqns[producer[v]][0] in _SAME_SIZE
           and _size(eqns[producer[v]][1][0]) == _size(v)):
      v = eqns[producer[v]][1][0]
    return v

  broadcasts: dict = {}
  whole: set = set()
  for k in region:
    out = eqns[k][2][0].aval
    full = int(np.prod(out.shape, dtype=np.int64))
    for v in _compat.non_literals(eqns[k][1]):
      if v in cotangent:
        continue
      if v in producer and eqns[producer[v]][0] == "broadcast_in_dim":
        v = eqns[producer[v]][1][0]  # an explicit broadcast: its operand
        if isinstance(v, _compat.Literal):
          continue
      if _size(v) == full:
        if k in feeding:
          whole.add(v)
        continue
      if _size(v) == 1:
        continue
      src = source(v)
      made_by = eqns[producer[src]][0] if src in producer else None
      if made_by in _compat.CHEAP_PRIMITIVES:
        continue  # cheap: recomputed inside the fusion
      shape = tuple(int(d) for d in out.shape)
      broadcasts[(src, shape)] = _compat.aval_bytes(out.update(dtype=v.aval.dtype))
  positions = frozenset(
      (k, j, eqn.primitive.name) for k, eqn in enumerate(jaxpr.eqns)
      for j, v in enumerate(eqn.outvars)
      if renaming.get(v, v) in whole)
  return LibraryFusions(tuple(broadcasts.values()), positions)


def cotangent_copies(step_jaxpr, n_cotangents: int) -> int:
  """How many copies of an output cotangent a layer's backward would have XLA write if
  that cotangent were a fusion of other values, as the loss's gradient is: one per form
  its library readers (matmuls, convolutions, sums) take it in, as it is or flattened (a
  matmul over more than one batch axis reads it as a 2-D bitcast, which XLA writes by a
  fusion of its own). ``step_jaxpr`` is the layer's forward and backward, its last
  ``n_cotangents`` inputs the output cotangents; reshapes are looked through. The kernel
  gradient's relaid copy is the layer's workspace, not counted here.
  """
  jaxpr = getattr(step_jaxpr, "jaxpr", step_jaxpr)
  eqns, _ = _compat.inlined_eqns(jaxpr)
  cotangent = set(jaxpr.invars[len(jaxpr.invars) - n_cotangents:])
  forms = set()
  for name, ins, outs, _ in eqns:
    read = [v for v in _compat.non_literals(ins) if v in cotangent]
    if not read:
      continue
    if name in _SAME_SIZE:
      cotangent.update(outs)
    elif name == "dot_general":
      forms.add("flattened" if any(len(v.aval.shape) > 2 for v in read) else "as is")
    elif name in ("reduce_sum", "conv_general_dilated"):
      forms.add("as is")
  return len(forms)


def _size(v) -> int:
  return int(np.prod(v.aval.shape, dtype=np.int64))
