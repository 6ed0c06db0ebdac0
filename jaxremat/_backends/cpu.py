"""Buffers XLA's CPU backend adds to a backward pass that the jaxpr does not show.

XLA's CPU pipeline has no native select-and-scatter (the gradient of a max- or
min-pool, ``select_and_scatter_add`` in the jaxpr). It expands each into an ``iota`` per
operand dimension (``s32``, the operand's shape with the pool's padding), a reduce-window
over the operand and those iotas that picks the winning indices, and a scatter of the
cotangent into a zero-filled buffer of that padded shape. Neither the iotas nor the zeros
depend on any activation, so XLA's scheduler creates them when the step starts:

* the zeros stay live until the pool's backward scatters into them;
* the iotas stay live until the reduce-window runs: in the forward pass when the pool's
  layer is not recomputed, in the backward pass when it is. Iotas of one shape are one
  buffer (XLA merges identical ``iota`` instructions).

That reduce-window reads the pooled operand besides the pool itself, so an operand
computed inside the layer (a ReLU before the pool) is written out and is live, with its
four index arrays, while the forward pass reaches the pool.

A convolution of the batch itself (the first layer's) reads it for its kernel gradient
in another layout: XLA copies the batch when the step starts and keeps the copy until
that layer's backward, or, when the layer is recomputed, copies it in the recompute.

A convolution of a computed input reads it for its kernel gradient relaid out as well:
the copy is made in the forward pass, beside the input, and kept in its place.

An average pool (``reduce_window_sum``) runs as a library fusion with the elementwise ops
around it, which reads their scalar constants (a ReLU's zeros, the divisor) as whole
buffers of the op's shape: they depend on nothing, so they too are made when the step
starts, and live until the pool's forward pass.

A convolution's kernel gradient reads the output cotangent in another layout too: a
copy the size of the convolution's output, transient during the layer's backward (its
workspace ``w_i``, not a start buffer).

The reversed kernel a convolution's input gradient convolves with (``rev`` of a
parameter in the jaxpr) depends on parameters only too: it is made when the step starts
and lives until the layer's backward, unless the layer is recomputed (then it reads the
parameter through the recompute's optimization barrier and is made when the recompute
starts). XLA mostly places it in the kernel's own gradient buffer, written once the
copy is read: it then costs no temp bytes, but that buffer holds nothing else until
then.

A forward convolution whose kernel covers more of the input than the input itself (a
3x3 kernel over a 2x2 or 1x1 feature map) has its operands swapped by XLA's simplifier:
the kernel becomes the convolved operand, reversed. That reversed copy depends on
parameters only, so it too is made when the step starts; it lives until the layer's
forward pass (a recompute reads the parameter through its optimization barrier and
makes a transient copy of its own).

A layer whose input is read by convolutions and by elementwise ops only (a residual
block's ``relu(bn(conv(x)) + x)``) does not keep that input as written: XLA duplicates
the input's elementwise tail (the previous layer's ``relu(bn(a) + b)``) into each
elementwise fusion that reads it, in the forward pass and in the backward's ReLU mask,
and keeps the operands of that tail instead (the convolution outputs ``a`` and ``b``)
until the layer's backward. Where the previous layer is recomputed, those operands are
kept beside its output's relaid copy (``operands_kept``).

Measured on jax 0.10.2 (CPU): a VGG-11 with batch 16 at 32x32 holds 7.6 MiB of iotas and
1.9 MiB of zeros at its peak, against 4.5 MiB of residuals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxremat._jaxpr import compat as _compat


@dataclasses.dataclass(frozen=True)
class StartBuffers:
  """Per layer, what the CPU expansion of its backward allocates when the step starts.

  Attributes:
    until_backward: bytes live until the layer's backward: the zero-filled scatter
      targets.
    kernels: bytes of each reversed kernel: in its gradient's buffer from the start
      until the layer's backward when the layer is not recomputed; when it is, made when
      its recompute starts and live until its backward.
    indices: ``(shape, bytes)`` of each shape's iotas (one per dimension), live until
      the layer's last forward computation (its recompute, if the plan recomputes it);
      equal shapes share them.
    relaid_cotangents: bytes of the largest cotangent copy a kernel gradient reads (one
      is live at a time during the layer's backward; workspace, not in ``total_bytes``).
    swapped_kernels: bytes of each reversed kernel a forward convolution with swapped
      operands reads, live until the layer's forward pass.
    pooled_operands: bytes of the pooled operands computed inside the layer, live only
      while its forward pass runs (not in ``total_bytes``).
    window_constants: ``(key, bytes)`` of each scalar constant an average pool's library
      fusion reads as a whole buffer (the zeros of a ReLU before it, the divisor after
      it), live until the layer's forward pass (a recompute makes its own, transient);
      equal keys (shape, dtype, value) share a buffer.
    batch_copy: bytes of the relaid-out copy of a convolved batch, live until the
      layer's backward; when the layer is recomputed, the recompute makes it (it reads
      the batch through the recompute's optimization barrier) and it lives from there.
    argmax_values: bytes of the values each argmax reduce-window writes besides its
      indices (the pooled output once more), live only while it runs: in the layer's
      forward pass, or its recompute when the plan recomputes it (not in
      ``total_bytes``).
    relaid_inputs: bytes of the layer's input that a convolution reads for its kernel
      gradient in another layout: the copy is made in the forward pass and kept for the
      backward in place of the input, so while the layer's forward runs both are live
      (not in ``total_bytes``).
  """

  until_backward: int = 0
  kernels: tuple[int, ...] = ()
  indices: tuple[tuple[tuple[int, ...], int], ...] = ()
  relaid_cotangents: int = 0
  swapped_kernels: tuple[int, ...] = ()
  pooled_operands: int = 0
  argmax_values: int = 0
  relaid_inputs: int = 0
  window_constants: tuple[tuple[tuple, int], ...] = ()
  batch_copy: int = 0

  @property
  def total_bytes(self) -> int:
    """All of them together (bytes)."""
    return (self.until_backward + sum(self.kernels) + sum(b for _, b in self.indices)
            + sum(self.swapped_kernels) + sum(b for _, b in self.window_constants) + self.batch_copy)


def start_buffers(backward_jaxpr, activations: Sequence[bool], batch: Sequence[bool] = (),
                  inputs: Sequence[bool] = ()) -> StartBuffers:
  """The buffers XLA's CPU backend adds for a layer whose forward-and-backward is
  ``backward_jaxpr`` (a Jaxpr or ClosedJaxpr); ``activations`` flags its inputs that are
  activations or cotangents (the rest are parameters), ``batch`` those that are the
  model's batch (an argument of the step, not temp), ``inputs`` those that are the
  layer's input computed by an earlier layer. Sub-jaxprs are searched for
  select-and-scatter; reversed kernels and convolutions of the batch at the top level."""
  jaxpr = getattr(backward_jaxpr, "jaxpr", backward_jaxpr)
  until_backward = 0
  kernels = []
  indices: dict[tuple[int, ...], int] = {}
  invars = set(jaxpr.invars)
  pooled = set()
  argmax_values = 0
  eqns = _compat.inlined_eqns(jaxpr)[0]
  for name, ins, outs, params in eqns:
    if name not in _compat.POOL_GRADIENT_PRIMITIVES:  # expanded into iotas, argmax, scatter
      continue
    operand = outs[0].aval  # the scatter target: the pooled operand's shape, padded
    shape = tuple(int(d) + lo + hi for d, (lo, hi) in zip(operand.shape, params["padding"]))
    until_backward += _compat.aval_bytes(operand.update(shape=shape))
    indices[shape] = len(shape) * int(np.prod(shape, dtype=np.int64)) * _compat.INDEX_BYTES
    # (source, operand): the argmax writes the source's shape in the operand's dtype
    argmax_values += _compat.aval_bytes(ins[0].aval.update(dtype=ins[1].aval.dtype))
    if ins[1] not in invars:  # an operand the layer computes
      pooled.add(ins[1])
  batch_vars = {v for v, flag in zip(jaxpr.invars, batch) if flag}
  copied = {eqn.invars[0] for eqn in jaxpr.eqns
            if eqn.primitive.name == "conv_general_dilated" and eqn.invars[0] in batch_vars}
  batch_copy = sum(_compat.aval_bytes(v.aval) for v in copied)
  varying = _compat.input_dependent(jaxpr, [v for v, flag in zip(jaxpr.invars, activations) if flag])
  param_vars = {v for v, flag in zip(jaxpr.invars, activations) if not flag}
  layer_inputs = {v for v, flag in zip(jaxpr.invars, inputs) if flag}
  relaid_inputs = set()
  relaid = 0
  swapped = []
  reversed_ = set()  # values computed from a reversed kernel
  for eqn in jaxpr.eqns:
    operands = [v for v in eqn.invars if not isinstance(v, _compat.Literal)]
    if any(v in reversed_ for v in operands) or eqn.primitive.name == "rev":
      reversed_.update(eqn.outvars)
    if any(v in varying for v in operands):
      if _relays_cotangent(eqn, param_vars):
        # a forward conv of a kernel; one relaid cotangent at a time
        relaid = max(relaid, _compat.aval_bytes(eqn.outvars[0].aval))
      kernel = eqn.invars[1] if eqn.primitive.name == "conv_general_dilated" else None
      if kernel is not None and kernel in param_vars and eqn.invars[0] in layer_inputs:
        relaid_inputs.add(eqn.invars[0])
      if (kernel is not None and kernel not in varying and kernel not in reversed_
          and swaps_operands(eqn)):
        swapped.append(_compat.aval_bytes(kernel.aval))
    elif eqn.primitive.name == "rev" and operands:
      kernels.append(_compat.aval_bytes(eqn.outvars[0].aval))
  return StartBuffers(
      until_backward=until_backward, kernels=tuple(kernels), indices=tuple(indices.items()),
      relaid_cotangents=relaid, swapped_kernels=tuple(swapped),
      pooled_operands=sum(_compat.aval_bytes(v.aval) for v in pooled), argmax_values=argmax_values,
      relaid_inputs=sum(_compat.aval_bytes(v.aval) for v in relaid_inputs),
      window_constants=tuple(_window_constants(eqns, varying).items()), batch_copy=batch_copy)


def reads_input_in_fusions(step_jaxpr, n_inputs: int) -> bool:
  """Whether the layer's forward-and-backward ``step_jaxpr`` (its first ``n_inputs``
  inputs are the layer's input) reads that input by convolutions and by elementwise
  ops only, at least one of each: XLA then recomputes the input's elementwise tail in
  those fusions instead of reading the input."""
  jaxpr = getattr(step_jaxpr, "jaxpr", step_jaxpr)
  eqns = _compat.inlined_eqns(jaxpr)[0]
  _, consumers = _dataflow(eqns)
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
      todo.extend(_vars(eqn.invars))
    elif v not in outputs:
      kept[v] = _compat.aval_bytes(v.aval)
  return tuple(kept.values()), reads_input


def _window_constants(eqns, varying: set) -> dict[tuple, int]:
  """``{(shape, dtype, value): bytes}`` of the scalar constants that the library fusion
  of each forward ``reduce_window_sum`` (an average pool) reads in full: those of the
  elementwise ops fused with it, feeding it through values used once (a ReLU's zeros)
  or fed by it (the division by the window size)."""
  producer, consumers = _dataflow(eqns)
  constants = {}

  def elementwise(k: int) -> bool:
    """Whether equation ``k`` is elementwise (a custom_jvp function such as ``relu``
    included); if so, its scalar constants are recorded in ``constants``."""
    name, ins, outs, params = eqns[k]
    inner = [(name, ins)]
    if name in _compat.WRAPPER_PRIMITIVES and "call_jaxpr" in params:
      inner = [(e.primitive.name, e.invars) for e in _compat.all_eqns(params["call_jaxpr"].jaxpr.eqns)
               if e.primitive.name not in _compat.WRAPPER_PRIMITIVES]
    if not inner or any(n not in _compat.ELEMENTWISE_PRIMITIVES for n, _ in inner):
      return False
    out = outs[0].aval
    for v in (v for _, vs in inner for v in vs):
      if isinstance(v, _compat.Literal) and np.ndim(v.val) == 0:
        constants[(tuple(int(d) for d in out.shape), str(out.dtype), float(v.val))] = _compat.aval_bytes(out)
    return True

  for k, (name, ins, outs, _) in enumerate(eqns):
    if name != "reduce_window_sum" or not any(v in varying for v in _vars(ins)):
      continue
    stack = list(_vars(ins))
    while stack:  # the elementwise ops feeding it through values used once
      v = stack.pop()
      j = producer.get(v)
      if j is not None and len(consumers.get(v, ())) == 1 and elementwise(j):
        stack.extend(_vars(eqns[j][1]))
    v = outs[0]
    while len(consumers.get(v, ())) == 1 and elementwise(consumers[v][0]):
      v = eqns[consumers[v][0]][2][0]
  return constants


def swaps_operands(conv) -> bool:
  """Whether XLA's simplifier swaps the operands of ``conv`` (a ``conv_general_dilated``
  equation): when the product of the kernel's spatial sizes exceeds that of the input's.

  Spatial dimensions that are a plain contraction (kernel as large as the input, no
  padding, stride 1) or a feature group are left out of both products; an input of size
  1 with full padding on both sides counts the kernel's size (its swapped window).
  """
  p = conv.params
  if p["feature_group_count"] > 1 or p["batch_group_count"] > 1:
    return False
  lhs, rhs = conv.invars[0].aval.shape, conv.invars[1].aval.shape
  dims = p["dimension_numbers"]
  kernel_product = swapped_product = 1
  for d, (low, high) in enumerate(p["padding"]):
    k, n = rhs[dims.rhs_spec[2 + d]], lhs[dims.lhs_spec[2 + d]]
    stride, base, dilation = p["window_strides"][d], p["lhs_dilation"][d], p["rhs_dilation"][d]
    unpadded = low == 0 and high == 0 and dilation == 1
    if unpadded and ((base == k and stride == k - 1) or (k == n and base == 1 and stride == 1)):
      continue
    kernel_product *= k
    full = n == 1 and stride == 1 and dilation == 1 and low == high == k - 1
    swapped_product *= k if full else n
  return kernel_product > swapped_product


#: Reductions and products XLA's CPU backend runs as library (YNNPACK) fusions.
_LIBRARY_SEEDS = frozenset({"reduce_sum", "dot_general"})

#: Elementwise ops of a backward pass (``add_any`` sums cotangents).
_BACKWARD_FUSIBLE = _compat.FUSIBLE_PRIMITIVES | {"add_any"}

#: Shape-only primitives that keep the element count (looked through to the source).
_SAME_SIZE = frozenset({"reshape", "expand_dims", "squeeze", "broadcast_in_dim", "convert_element_type"})

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
  producer, consumers = _dataflow(eqns)
  for _, ins, outs, _ in eqns:
    if any(v in cotangent for v in _vars(ins)):
      cotangent.update(outs)

  def fusible(k: int) -> bool:
    return eqns[k][0] in _BACKWARD_FUSIBLE and any(v in cotangent for v in _vars(eqns[k][1]))

  feeding: set = set()  # elementwise ops feeding a reduction through values used once
  region: set = set()  # with those feeding through any value, and those a matmul feeds
  for k, (name, ins, outs, _) in enumerate(eqns):
    if name not in _LIBRARY_SEEDS or not any(v in cotangent for v in _vars(ins)):
      continue
    if name == "reduce_sum":
      for once_only, found in ((True, feeding), (False, region)):
        stack = [(v, producer[v]) for v in _vars(ins) if v in producer]
        while stack:
          v, j = stack.pop()
          if j in found or not fusible(j) or (once_only and len(consumers[v]) > 1):
            continue
          found.add(j)
          stack.extend((u, producer[u]) for u in _vars(eqns[j][1]) if u in producer)
    else:
      pending = [c for v in outs for c in consumers.get(v, ())]
      while pending:
        j = pending.pop()
        if j not in region and fusible(j):
          region.add(j)
          pending.extend(c for v in eqns[j][2] for c in consumers.get(v, ()))
  region |= feeding

  def source(v):
    while v in producer and eqns[producer[v]][0] in _SAME_SIZE and _size(eqns[producer[v]][1][0]) == _size(v):
      v = eqns[producer[v]][1][0]
    return v

  broadcasts: dict = {}
  whole: set = set()
  for k in region:
    out = eqns[k][2][0].aval
    full = int(np.prod(out.shape, dtype=np.int64))
    for v in _vars(eqns[k][1]):
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
      (k, j, eqn.primitive.name) for k, eqn in enumerate(jaxpr.eqns) for j, v in enumerate(eqn.outvars)
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
    read = [v for v in _vars(ins) if v in cotangent]
    if not read:
      continue
    if name in _SAME_SIZE:
      cotangent.update(outs)
    elif name == "dot_general":
      forms.add("flattened" if any(len(v.aval.shape) > 2 for v in read) else "as is")
    elif name in ("reduce_sum", "conv_general_dilated"):
      forms.add("as is")
  return len(forms)


def _dataflow(eqns) -> tuple[dict, dict]:
  """For ``_compat.inlined_eqns`` equations: the index of the equation producing each
  value, and the indices of those reading it."""
  producer: dict[Any, int] = {}
  consumers: dict[Any, list[int]] = {}
  for k, (_, ins, outs, _) in enumerate(eqns):
    producer.update((v, k) for v in outs)
    for v in _vars(ins):
      consumers.setdefault(v, []).append(k)
  return producer, consumers


def _vars(atoms) -> list:
  return [v for v in atoms if not isinstance(v, _compat.Literal)]


def _size(v) -> int:
  return int(np.prod(v.aval.shape, dtype=np.int64))


def _relays_cotangent(eqn, params: set) -> bool:
  """A forward convolution, or a dense layer over more than one batch axis, of a
  parameter kernel: its kernel gradient reads the output cotangent relaid out (a dense
  layer over one batch axis reads it as it is)."""
  if eqn.primitive.name not in ("conv_general_dilated", "dot_general"):
    return False
  kernel = eqn.invars[1]
  if isinstance(kernel, _compat.Literal) or kernel not in params:
    return False
  if eqn.primitive.name == "conv_general_dilated":
    return True
  return eqn.primitive.name == "dot_general" and len(eqn.invars[0].aval.shape) > 2
