"""Profile a traced chain: per layer the bytes of its output, residuals and cotangent, and FLOPs."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax

from jaxremat._jaxpr import compat as _compat
from jaxremat._backends import cpu as _xla_cpu
from jaxremat._backends import gpu as _xla_gpu
from jaxremat._model.chain import Chain
from jaxremat._backends.measure import default_compiler_options, memory_stats
from jaxremat._jaxpr.trace import Layer, TracedChain


@dataclasses.dataclass(frozen=True)
class LayerResiduals:
  """What one layer's VJP saves, in bytes (deduplicated, parameters excluded)."""

  total: int  # every saved value that is not a parameter or other model input
  own_input: int  # the part that is the layer's input x_{i-1}
  own_input_vars: frozenset  # which of the layer's inputs x_{i-1} it saves
  own_output_vars: frozenset  # which of the layer's outputs x_i it saves
  computed: tuple[int, ...]  # bytes of each saved value the layer computes


@dataclasses.dataclass(frozen=True)
class Buffers:
  """Per layer, the separate buffers behind the chain's byte counts (for ``_estimate``).

  Attributes:
    residuals: bytes of each residual the layer computes and saves.
    inputs: bytes of each saved input that no earlier layer already saves.
    param_grads: bytes of each parameter gradient the layer's backward writes (a
      parameter read by several layers counts for the first).
    start: buffers XLA allocates for the layer's backward before it runs: on CPU when
      the step starts (``_xla_cpu``), on GPU the max-pools' zero-filled scatter targets
      (``_xla_gpu.pool_buffers``, ``until_backward`` only); empty on other backends.
    elementwise: per layer, whether its every operation is elementwise and fusible (a
      ReLU): XLA then writes its input cotangent over its output cotangent (one buffer).
    saves_output: per layer, whether its residuals include its output ``x_i`` (then
      counted as its residual, and as the next layer's input nowhere else).
    loss: bytes the last layer's backward holds on CPU because XLA fuses the loss's
      gradient into it: the model's output ``x_n``, which the loss reads, and the copies
      of ``g_n`` beyond ``g_n`` itself (one per form its readers take,
      ``_xla_cpu.cotangent_copies``); empty on other backends.
    late_cotangent: per layer, whether XLA writes its input cotangent ``g_{i-1}`` only
      once the layer's own residuals are read: on CPU, where ``g_{i-1}`` is larger than
      ``g_i`` (a downsampling block) and is not a max-pool's scatter target (allocated
      before the backward); empty on other backends.
    operands: per layer ``i``, bytes of each value its output's elementwise tail reads
      (its convolution outputs), which XLA's CPU backend keeps, besides ``x_i``'s
      relaid copy, when layer ``i + 1`` reads ``x_i`` by convolutions and elementwise
      ops only (``_xla_cpu.reads_input_in_fusions``): it recomputes ``x_i`` in those
      fusions. Empty otherwise and on other backends.
    operands_read_input: per layer ``i``, whether that tail reads ``x_{i-1}`` too.
  """

  residuals: tuple[tuple[int, ...], ...]
  inputs: tuple[tuple[int, ...], ...]
  param_grads: tuple[tuple[int, ...], ...]
  start: tuple[_xla_cpu.StartBuffers, ...] = ()
  elementwise: tuple[bool, ...] = ()
  saves_output: tuple[bool, ...] = ()
  loss: tuple[int, ...] = ()
  late_cotangent: tuple[bool, ...] = ()
  operands: tuple[tuple[int, ...], ...] = ()
  operands_read_input: tuple[bool, ...] = ()


@dataclasses.dataclass(frozen=True)
class Profile:
  chain: Chain
  buffers: Buffers


def profile(traced: TracedChain, calibrate: bool = False, backend: str | None = None) -> Profile:
  """Measures the chain of ``traced`` (bytes are dtype-aware; FLOPs from XLA's cost model).

  ``backend`` (default: JAX's default backend) picks what XLA is modelled to keep and
  add: ``"cpu"`` its CPU expansions (``_xla_cpu``), ``"gpu"`` its GPU fusion
  (``_xla_gpu``).

  With ``calibrate``, each layer's forward and backward is also compiled alone; what
  XLA's temp needs beyond the layer's residuals becomes its workspace ``w_i``. (A temp
  below the residuals does not lower ``b_i``: alone, a layer can recompute cheap
  residuals from its input, which in the whole program is not held.)
  """
  backend = backend or jax.default_backend()
  layers = traced.layers
  n = len(layers)
  param_vars = set(traced.param_vars)
  batch_vars = set(traced.batch_vars)
  # Invariants a cotangent flows into: the parameters and anything computed from them.
  grad_invariants = param_vars | set(traced.prelude_outputs)

  first_inputs = tuple(v for v in layers[0].invariants if v in batch_vars)
  act = [_bytes(first_inputs)] + [_bytes(layer.outputs) for layer in layers[:-1]]
  act.append(_bytes(layers[-1].side_outputs))
  cot = [0] + [_bytes(v for v in layer.outputs if _compat.is_float(v.aval)) for layer in layers[:-1]]
  cot.append(_bytes(v for v in layers[-1].side_outputs if _compat.is_float(v.aval)))

  cpu = [_cpu_buffers(layer, first_inputs if i == 0 else layer.inputs, grad_invariants, i > 0)
         for i, layer in enumerate(layers)] if backend == "cpu" else []
  residuals = []
  for i, layer in enumerate(layers):
    inputs = first_inputs if i == 0 else layer.inputs
    residuals.append(_residuals(layer, inputs, grad_invariants, differentiate_inputs=i > 0,
                                backend=backend, library=cpu[i][1] if cpu else None))
  res = [r.total for r in residuals]
  own = [r.own_input for r in residuals]
  saved_inputs = [set(r.own_input_vars) for r in residuals]
  # A value saved both by layer i (its output) and by layer i+1 (its input) is one
  # buffer: count it once, as layer i's.
  for i in range(n - 1):
    shared = residuals[i].own_output_vars & residuals[i + 1].own_input_vars
    overlap = _bytes(shared)
    res[i + 1] -= overlap
    own[i + 1] -= overlap
    saved_inputs[i + 1] -= shared
  seen_params: set = set()
  param_grads = []
  for layer in layers:
    mine = [v for v in layer.invariants if v in param_vars and v not in seen_params and _compat.is_float(v.aval)]
    seen_params.update(mine)
    param_grads.append(tuple(_compat.aval_bytes(v.aval) for v in mine))
  start: tuple = ()
  work = [0] * n
  loss: tuple[int, ...] = ()
  late: tuple[bool, ...] = ()
  operands: tuple[tuple[int, ...], ...] = ()
  operands_read_input: tuple[bool, ...] = ()
  if backend == "cpu":
    start = tuple(starts for starts, *_ in cpu)
    work = [s.relaid_cotangents for s in start]
    loss = (cot[n], max(0, cpu[-1][2] - 1) * cot[n])  # x_n; copies of g_n beyond g_n
    late = tuple(cot[j] > cot[j + 1] and not start[j].until_backward for j in range(n))
    tails = [_xla_cpu.operands_kept(layer.eqns, layer.inputs, layer.outputs) for layer in layers]
    operands = tuple(tails[j][0] if j + 1 < n and cpu[j + 1][3] else () for j in range(n))
    operands_read_input = tuple(reads for _, reads in tails)
  elif backend == "gpu":
    gpu = [_gpu_buffers(layer, first_inputs if i == 0 else layer.inputs, grad_invariants, i > 0)
           for i, layer in enumerate(layers)]
    work = [workspace + indices for workspace, _, indices in gpu]
    start = tuple(_xla_cpu.StartBuffers(until_backward=zeros) for _, zeros, _ in gpu)
  buffers = Buffers(
      residuals=tuple(r.computed for r in residuals),
      inputs=tuple(tuple(_compat.aval_bytes(v.aval) for v in s) for s in saved_inputs),
      param_grads=tuple(param_grads),
      start=start,
      elementwise=tuple(_elementwise(layer) for layer in layers),
      saves_output=tuple(bool(r.own_output_vars) for r in residuals),
      loss=loss, late_cotangent=late, operands=operands,
      operands_read_input=operands_read_input)
  if calibrate:
    for i, layer in enumerate(layers):
      inputs = first_inputs if i == 0 else layer.inputs
      temp = _backward_temp_bytes(layer, inputs, grad_invariants, differentiate_inputs=i > 0)
      modelled = start[i].total_bytes if start else 0  # walked by the estimate instead
      work[i] = max(0, temp - (res[i] - own[i]) - modelled)
  flops = [_flops(layer, first_inputs if i == 0 else layer.inputs) for i, layer in enumerate(layers)]
  chain = Chain(
      act_bytes=act,
      res_bytes=res,
      cot_bytes=cot,
      input_res_bytes=own,
      workspace_bytes=work,
      flops=flops,
      names=[layer.name for layer in layers],
  )
  return Profile(chain, buffers)


def _bytes(variables) -> int:
  return sum(_compat.aval_bytes(v.aval) for v in dict.fromkeys(variables))


def _layer_fn(layer: Layer, inputs: Sequence[_compat.Var]):
  in_vars = list(dict.fromkeys([*inputs, *layer.invariants]))
  out_vars = list(dict.fromkeys([*layer.outputs, *layer.side_outputs]))
  return _compat.inlined_function(layer.eqns, in_vars, out_vars), in_vars, out_vars


def _spec(v) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)


def _differentiable(layer: Layer, inputs, grad_invariants, differentiate_inputs: bool):
  """The layer as a function, its inputs, outputs, and which inputs get cotangents."""
  fn, in_vars, out_vars = _layer_fn(layer, inputs)
  input_set = set(inputs)
  diff = [
      _compat.is_float(v.aval) and ((v in input_set and differentiate_inputs) or v in grad_invariants)
      for v in in_vars
  ]

  def vjp(*args):
    def f(*d):
      it = iter(d)
      return fn(*[next(it) if m else a for a, m in zip(args, diff)])

    return jax.vjp(f, *[a for a, m in zip(args, diff) if m])

  return vjp, in_vars, out_vars


def _residuals(layer: Layer, inputs, grad_invariants, differentiate_inputs: bool,
               fused: bool = True, backend: str | None = None,
               library: _xla_cpu.LibraryFusions | None = None) -> LayerResiduals:
  """What the layer's VJP saves; with ``fused``, as XLA keeps it (``_as_kept_by_xla``,
  on GPU ``_xla_gpu.kept_values``). ``library`` (CPU) adds the broadcasts the
  backward's library fusions need and keeps the values they read.

  Pass ``fused=False`` for a scan body: its residuals are written to stacked loop
  outputs, which XLA cannot fuse into the backward loop.
  """
  vjp, in_vars, out_vars = _differentiable(layer, inputs, grad_invariants, differentiate_inputs)

  def outputs_and_residuals(*args):
    outs, vjp_fn = vjp(*args)
    return outs, jax.tree_util.tree_leaves(vjp_fn)

  closed = jax.make_jaxpr(outputs_and_residuals)(*map(_spec, in_vars))
  jaxpr = closed.jaxpr
  if (backend or jax.default_backend()) == "gpu":
    keep = _xla_gpu.kept_values
  else:
    # The step's forward traces as this jaxpr does: its equations match by position.
    read = {jaxpr.eqns[k].outvars[j] for k, j, name in (library.read_whole if library else ())
            if k < len(jaxpr.eqns) and jaxpr.eqns[k].primitive.name == name}
    keep = functools.partial(_as_kept_by_xla, written=read)
  n_out = len(out_vars)
  out_atoms, res_atoms = jaxpr.outvars[:n_out], jaxpr.outvars[n_out:]
  position = {v: k for k, v in enumerate(jaxpr.invars)}
  constvars = set(jaxpr.constvars)
  varying = _compat.input_dependent(jaxpr)
  input_set = set(inputs)
  total = own_input = 0
  own_inputs, own_outputs = set(), set()
  computed = []
  seen = set()
  producer = {v: e for e in jaxpr.eqns for v in e.outvars}
  for atom in (keep(jaxpr, res_atoms, out_atoms) if fused else res_atoms):
    if isinstance(atom, _compat.Literal) or atom in constvars or atom not in varying:
      continue  # constants (e.g. the zeros relu's VJP selects from) fuse away in XLA
    atom = _bitcast_source(atom, producer)  # a reshaped input is the input's buffer
    if atom in seen:
      continue
    seen.add(atom)
    if atom in position:
      src = in_vars[position[atom]]
      if src in input_set:
        size = _compat.aval_bytes(atom.aval)
        total += size
        own_input += size
        own_inputs.add(src)
      continue  # parameters and other model inputs are held anyway
    total += _compat.aval_bytes(atom.aval)
    computed.append(_compat.aval_bytes(atom.aval))
    for k, out_atom in enumerate(out_atoms):
      if out_atom is atom:
        own_outputs.add(out_vars[k])
  if library is not None and fused:
    total += sum(library.broadcasts)
    computed.extend(library.broadcasts)
  return LayerResiduals(total, own_input, frozenset(own_inputs), frozenset(own_outputs), tuple(computed))


def _bitcast_source(atom, producer: dict):
  """The value ``atom`` reshapes (through reshapes, squeezes and expand_dims, which XLA
  makes bitcasts of one buffer), or ``atom`` itself."""
  eqn = producer.get(atom)
  while eqn is not None and eqn.primitive.name in _RESHAPES and not isinstance(eqn.invars[0], _compat.Literal):
    atom = eqn.invars[0]
    eqn = producer.get(atom)
  return atom


_RESHAPES = frozenset({"reshape", "squeeze", "expand_dims"})


def _as_kept_by_xla(jaxpr, res_atoms, out_atoms, written: frozenset | set = frozenset()) -> list:
  """The values XLA keeps for the backward pass in place of ``res_atoms``.

  A residual the forward computes only for the backward (no forward consumer) by a
  fusible op, such as relu's mask ``x > 0`` or tanh's ``1 - y``, is fused into its
  backward consumer: XLA keeps the op's operands instead (here ``x`` and ``y``), which
  may be larger (a bool mask becomes its f32 source) or smaller (a broadcast becomes
  its source vector). Applied recursively through single-use fusible producers. A
  kept value that XLA can recompute from the other kept values (``_recomputable``) is
  dropped, unless a forward op or a library fusion of the backward (``written``, CPU)
  reads it from memory: GELU's ``0.5 * (1 + tanh)`` goes, BatchNorm's ``x - mean``
  stays.
  """
  producer = {v: e for e in jaxpr.eqns for v in e.outvars}
  uses: dict = {}
  # Values some op reads from memory: a forward op, or (if the VJP saves them) the
  # backward's library fusions (``written``).
  written = (set(written) & set(res_atoms)) | set(jaxpr.invars)
  for e in jaxpr.eqns:
    for v in e.invars:
      if not isinstance(v, _compat.Literal):
        uses[v] = uses.get(v, 0) + 1
        if not _compat.fusible(e):
          written.add(v)
  forward_out = {v for v in out_atoms if not isinstance(v, _compat.Literal)}

  def kept(atom, only_backward: bool) -> list:
    eqn = None if isinstance(atom, _compat.Literal) else producer.get(atom)
    if (not only_backward or eqn is None or atom in forward_out
        or eqn.primitive.name not in _compat.FUSIBLE_PRIMITIVES):
      return [atom]
    return [k for v in eqn.invars if not isinstance(v, _compat.Literal)
            for k in kept(v, uses.get(v, 0) == 1)]

  kept_atoms = list(dict.fromkeys(k for atom in res_atoms for k in kept(atom, uses.get(atom, 0) == 0)))
  held = set(kept_atoms) | set(jaxpr.invars) | set(jaxpr.constvars)
  out = []
  for k in kept_atoms:
    if k not in forward_out and k not in written and _recomputable(k, producer, held - {k}):
      held.discard(k)
    else:
      out.append(k)
  return out


def _elementwise(layer: Layer) -> bool:
  """True when every equation of the layer (inside calls too) is elementwise and fusible."""
  names = [eqn.primitive.name for eqn in _compat.all_eqns(layer.eqns)
           if eqn.primitive.name not in _compat.WRAPPER_PRIMITIVES]
  return bool(names) and all(name in _compat.ELEMENTWISE_PRIMITIVES for name in names)


def _recomputable(atom, producer: dict, held: set) -> bool:
  """True when cheap fusible ops make ``atom`` from held values and small ones (a
  tenth of its size or less, such as broadcast statistics): XLA then recomputes it in
  the backward fusion rather than keeping it (relu after BatchNorm reads the normalised
  value BatchNorm's own residuals give back)."""
  size = _compat.aval_bytes(atom.aval)

  def made_cheaply(v) -> bool:
    eqn = producer.get(v)
    return eqn is not None and eqn.primitive.name in _compat.CHEAP_PRIMITIVES and all(map(ok, eqn.invars))

  def ok(v) -> bool:
    return (isinstance(v, _compat.Literal) or v in held or 10 * _compat.aval_bytes(v.aval) <= size
            or made_cheaply(v))

  return made_cheaply(atom)


def _forward_and_backward(layer: Layer, inputs, grad_invariants, differentiate_inputs: bool):
  """``step(args, cts)``: the layer's forward and backward (gradients from the inputs and
  output cotangents), and the abstract ``args`` and ``cts``."""
  vjp, in_vars, out_vars = _differentiable(layer, inputs, grad_invariants, differentiate_inputs)

  def step(args, cts):
    _, vjp_fn = vjp(*args)
    return vjp_fn(cts)

  cts = [
      jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype if _compat.is_float(v.aval) else jax.dtypes.float0)
      for v in out_vars
  ]
  return step, list(map(_spec, in_vars)), cts


def _cpu_buffers(layer: Layer, inputs, grad_invariants, differentiate_inputs: bool):
  """What XLA's CPU backend adds for the layer's backward (``_xla_cpu``): the buffers it
  allocates when the step starts, what the backward's library fusions need, how many
  copies of an output cotangent it would have written (``_xla_cpu.cotangent_copies``)
  and whether it reads its input in fusions (``_xla_cpu.reads_input_in_fusions``)."""
  step, args, cts = _forward_and_backward(layer, inputs, grad_invariants, differentiate_inputs)
  closed = jax.make_jaxpr(step)(args, cts)
  n_inputs = len(dict.fromkeys(inputs))  # args are the inputs, then the invariants
  n_cts = len(jax.tree_util.tree_leaves(cts))
  activations = [k < n_inputs for k in range(len(args))] + [True] * len(cts)
  batch = [k < n_inputs and not differentiate_inputs for k in range(len(args))]
  computed = [k < n_inputs and differentiate_inputs for k in range(len(args))]
  return (_xla_cpu.start_buffers(closed, activations, batch, computed),
          _xla_cpu.library_fusions(closed, n_cts), _xla_cpu.cotangent_copies(closed, n_cts),
          differentiate_inputs and _xla_cpu.reads_input_in_fusions(closed, n_inputs))


def _gpu_buffers(layer: Layer, inputs, grad_invariants, differentiate_inputs: bool) -> tuple[int, int, int]:
  """What XLA's GPU backend adds to the layer's backward (bytes): the largest written
  intermediate (workspace), its max-pools' zero-filled targets and argmax indices."""
  step, args, cts = _forward_and_backward(layer, inputs, grad_invariants, differentiate_inputs)
  closed = jax.make_jaxpr(step)(args, cts)
  n_cts = len(jax.tree_util.tree_leaves(cts))
  workspace = _xla_gpu.backward_workspace_bytes(closed, closed.jaxpr.invars[len(closed.jaxpr.invars) - n_cts:])
  return (workspace, *_xla_gpu.pool_buffers(closed))


def _backward_temp_bytes(layer: Layer, inputs, grad_invariants, differentiate_inputs: bool) -> int:
  """XLA's temp bytes for the layer's forward and backward compiled alone.

  The program takes the layer's inputs and its output cotangents and returns the
  gradients, so its temp holds what the layer's backward needs beyond them: the
  residuals as XLA keeps them (after fusion) and any transient workspace.
  """
  step, args, cts = _forward_and_backward(layer, inputs, grad_invariants, differentiate_inputs)
  compiled = jax.jit(step).lower(args, cts).compile(
      compiler_options=default_compiler_options() or None)
  return int(memory_stats(compiled).temp_size_in_bytes)


def _flops(layer: Layer, inputs) -> int:
  fn, in_vars, _ = _layer_fn(layer, inputs)
  try:
    cost = jax.jit(fn).lower(*map(_spec, in_vars)).cost_analysis()
  except Exception:  # cost analysis is advisory; a backend without it gives 0
    return 0
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return int(max(0.0, float((cost or {}).get("flops", 0.0))))
