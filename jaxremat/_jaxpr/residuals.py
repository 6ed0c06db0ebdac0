"""What a layer's VJP saves for its backward, under a rule for which values XLA keeps."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
from jax.extend import core as jex_core

from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.layer_vjp import differentiable, spec
from jaxremat._jaxpr.trace import Layer

#: ``keep(jaxpr, res_atoms, out_atoms)``: the values XLA keeps for the backward in place
#: of the residuals ``res_atoms`` of ``jaxpr``, which computes a layer's outputs
#: ``out_atoms`` and then its residuals.
KeepRule = Callable[[jex_core.Jaxpr, Sequence, Sequence], list]


@dataclasses.dataclass(frozen=True)
class LayerResiduals:
  """What one layer's VJP saves, in bytes (deduplicated, parameters excluded)."""

  total: int  # every saved value that is not a parameter or other model input
  own_input: int  # the part that is the layer's input x_{i-1}
  own_input_vars: frozenset  # which of the layer's inputs x_{i-1} it saves
  own_output_vars: frozenset  # which of the layer's outputs x_i it saves
  computed: tuple[int, ...]  # bytes of each saved value the layer computes

  def plus(self, computed: tuple[int, ...]) -> LayerResiduals:
    """These residuals and more values the layer computes and saves (bytes each)."""
    return dataclasses.replace(self, total=self.total + sum(computed),
                               computed=self.computed + computed)


def residuals(layer: Layer, inputs, grad_invariants, differentiate_inputs: bool,
              keep: KeepRule | None = None, loop_invariant=()) -> LayerResiduals:
  """What the layer's VJP saves; with ``keep``, as XLA keeps it (a backend's rule).

  Pass no ``keep`` for a scan body: its residuals are written to stacked loop outputs,
  which XLA cannot fuse into the backward loop. ``loop_invariant``: the body's inputs
  that are the same in every iteration (the scan's consts); a residual computed from them
  alone is not counted, as JAX's scan hoists it out of the loop rather than stacking it
  (an RNN cell's transposed weights).
  """
  vjp, in_vars, out_vars = differentiable(layer, inputs, grad_invariants, differentiate_inputs)

  def outputs_and_residuals(*args):
    outs, vjp_fn = vjp(*args)
    return outs, jax.tree_util.tree_leaves(vjp_fn)

  jaxpr = jax.make_jaxpr(outputs_and_residuals)(*map(spec, in_vars)).jaxpr
  n_out = len(out_vars)
  out_atoms, res_atoms = jaxpr.outvars[:n_out], jaxpr.outvars[n_out:]
  position = {v: k for k, v in enumerate(jaxpr.invars)}
  constvars = set(jaxpr.constvars)
  fixed = set(loop_invariant)
  varying = _compat.input_dependent(
      jaxpr, [a for a, v in zip(jaxpr.invars, in_vars) if v not in fixed])
  input_set = set(inputs)
  total = own_input = 0
  own_inputs, own_outputs = set(), set()
  computed = []
  seen = set()
  producer = {v: e for e in jaxpr.eqns for v in e.outvars}
  for atom in (res_atoms if keep is None else keep(jaxpr, res_atoms, out_atoms)):
    if isinstance(atom, _compat.Literal) or atom in constvars or atom not in varying:
      continue  # constants (e.g. the zeros relu's VJP selects from) fuse away in XLA
    atom = bitcast_source(atom, producer)  # a reshaped input is the input's buffer
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
  return LayerResiduals(total, own_input, frozenset(own_inputs), frozenset(own_outputs),
                        tuple(computed))


def bitcast_source(atom, producer: dict):
  """The value ``atom`` reshapes (through reshapes, squeezes and expand_dims, which XLA
  makes bitcasts of one buffer), or ``atom`` itself."""
  eqn = producer.get(atom)
  while (eqn is not None and eqn.primitive.name in _RESHAPES
         and not isinstance(eqn.invars[0], _compat.Literal)):
    atom = eqn.invars[0]
    eqn = producer.get(atom)
  return atom


_RESHAPES = frozenset({"reshape", "squeeze", "expand_dims"})


def elementwise(layer: Layer) -> bool:
  """True when every equation of the layer (inside calls too) is elementwise and fusible."""
  names = [eqn.primitive.name for eqn in _compat.all_eqns(layer.eqns)
           if eqn.primitive.name not in _compat.WRAPPER_PRIMITIVES]
  return bool(names) and all(name in _compat.ELEMENTWISE_PRIMITIVES for name in names)


def without_checkpoints(layer: Layer) -> Layer | None:
  """``layer`` with the user's own ``jax.checkpoint`` calls inlined (an ``nn.remat``
  block, a checkpointed MLP inside a block); None when it has none. Its residuals are
  what the layer's backward holds while it recomputes a checkpointed body."""
  found = False

  def inlined(eqns) -> list:
    nonlocal found
    out = []
    for e in eqns:
      inner = e.params.get("jaxpr") if e.primitive.name in _compat.REMAT_PRIMITIVES else None
      inner = getattr(inner, "jaxpr", inner)
      if inner is None or inner.constvars or any(
          isinstance(v, _compat.Literal) or v in inner.invars for v in inner.outvars):
        out.append(e)
        continue
      found = True
      out += inlined(_compat.spliced(inner, e.invars, e.outvars))
    return out

  eqns = inlined(layer.eqns)
  return dataclasses.replace(layer, eqns=tuple(eqns)) if found else None
