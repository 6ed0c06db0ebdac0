"""Profile a traced chain: per layer the bytes of its output, residuals and cotangent, and FLOPs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax

from jaxremat import _compat
from jaxremat._chain import Chain
from jaxremat._trace import Layer, TracedChain


@dataclasses.dataclass(frozen=True)
class LayerResiduals:
  """What one layer's VJP saves, in bytes (deduplicated, parameters excluded)."""

  total: int  # every saved value that is not a parameter or other model input
  own_input: int  # the part that is the layer's input x_{i-1}
  own_input_vars: frozenset  # which of the layer's inputs x_{i-1} it saves
  own_output_vars: frozenset  # which of the layer's outputs x_i it saves


def profile(traced: TracedChain) -> Chain:
  """Measures the chain of ``traced`` (bytes are dtype-aware; FLOPs from XLA's cost model)."""
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

  residuals = []
  for i, layer in enumerate(layers):
    inputs = first_inputs if i == 0 else layer.inputs
    residuals.append(_residuals(layer, inputs, grad_invariants, differentiate_inputs=i > 0))
  res = [r.total for r in residuals]
  own = [r.own_input for r in residuals]
  # A value saved both by layer i (its output) and by layer i+1 (its input) is one
  # buffer: count it once, as layer i's.
  for i in range(n - 1):
    shared = residuals[i].own_output_vars & residuals[i + 1].own_input_vars
    overlap = _bytes(shared)
    res[i + 1] -= overlap
    own[i + 1] -= overlap
  flops = [_flops(layer, first_inputs if i == 0 else layer.inputs) for i, layer in enumerate(layers)]
  return Chain(
      act_bytes=act,
      res_bytes=res,
      cot_bytes=cot,
      input_res_bytes=own,
      flops=flops,
      names=[layer.name for layer in layers],
  )


def _bytes(variables) -> int:
  return sum(_compat.aval_bytes(v.aval) for v in dict.fromkeys(variables))


def _layer_fn(layer: Layer, inputs: Sequence[_compat.Var]):
  in_vars = list(dict.fromkeys([*inputs, *layer.invariants]))
  out_vars = list(dict.fromkeys([*layer.outputs, *layer.side_outputs]))
  return _compat.sub_function(layer.eqns, in_vars, out_vars), in_vars, out_vars


def _spec(v) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)


def _residuals(layer: Layer, inputs, grad_invariants, differentiate_inputs: bool) -> LayerResiduals:
  fn, in_vars, out_vars = _layer_fn(layer, inputs)
  input_set = set(inputs)
  diff = [
      _compat.is_float(v.aval) and ((v in input_set and differentiate_inputs) or v in grad_invariants)
      for v in in_vars
  ]

  def outputs_and_residuals(*args):
    def f(*d):
      it = iter(d)
      return fn(*[next(it) if m else a for a, m in zip(args, diff)])

    outs, vjp_fn = jax.vjp(f, *[a for a, m in zip(args, diff) if m])
    return outs, jax.tree_util.tree_leaves(vjp_fn)

  closed = jax.make_jaxpr(outputs_and_residuals)(*map(_spec, in_vars))
  jaxpr = closed.jaxpr
  n_out = len(out_vars)
  out_atoms, res_atoms = jaxpr.outvars[:n_out], jaxpr.outvars[n_out:]
  position = {v: k for k, v in enumerate(jaxpr.invars)}
  constvars = set(jaxpr.constvars)
  total = own_input = 0
  own_inputs, own_outputs = set(), set()
  seen = set()
  for atom in res_atoms:
    if isinstance(atom, _compat.Literal) or atom in seen or atom in constvars:
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
    for k, out_atom in enumerate(out_atoms):
      if out_atom is atom:
        own_outputs.add(out_vars[k])
  return LayerResiduals(total, own_input, frozenset(own_inputs), frozenset(own_outputs))


def _flops(layer: Layer, inputs) -> int:
  fn, in_vars, _ = _layer_fn(layer, inputs)
  try:
    cost = jax.jit(fn).lower(*map(_spec, in_vars)).cost_analysis()
  except Exception:  # cost analysis is advisory; a backend without it gives 0
    return 0
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return int(max(0.0, float((cost or {}).get("flops", 0.0))))
