"""One traced layer as a function: its VJP, its forward-and-backward step, its FLOPs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax

from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.trace import Layer


def layer_fn(layer: Layer, inputs: Sequence[_compat.Var]) -> tuple[Callable, list, list]:
  """The layer as a function of ``inputs`` then its invariants, with its in and out vars."""
  in_vars = list(dict.fromkeys([*inputs, *layer.invariants]))
  out_vars = list(dict.fromkeys([*layer.outputs, *layer.side_outputs]))
  return _compat.inlined_function(layer.eqns, in_vars, out_vars), in_vars, out_vars


def spec(v) -> jax.ShapeDtypeStruct:
  """The abstract value of ``v`` (shape and dtype)."""
  return jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)


def differentiable(layer: Layer, inputs, grad_invariants, differentiate_inputs: bool):
  """The layer as a function, its inputs, outputs, and which inputs get cotangents."""
  fn, in_vars, out_vars = layer_fn(layer, inputs)
  return vjp_of(fn, in_vars, inputs, grad_invariants, differentiate_inputs), in_vars, out_vars


def vjp_of(fn: Callable, in_vars: Sequence, inputs, grad_invariants,
           differentiate_inputs: bool) -> Callable:
  """``vjp(*args) -> (outputs, vjp_fn)`` of ``fn`` (a function of ``in_vars``), with
  cotangents for its float ``in_vars`` that are ``inputs`` (when
  ``differentiate_inputs``) or in ``grad_invariants``."""
  input_set = set(inputs)
  diff = [
      _compat.is_float(v.aval)
      and ((v in input_set and differentiate_inputs) or v in grad_invariants)
      for v in in_vars
  ]

  def vjp(*args):
    def f(*d):
      it = iter(d)
      return fn(*[next(it) if m else a for a, m in zip(args, diff)])

    return jax.vjp(f, *[a for a, m in zip(args, diff) if m])

  return vjp


def forward_and_backward(layer: Layer, inputs, grad_invariants, differentiate_inputs: bool):
  """``step(args, cts)``: the layer's forward and backward (gradients from the inputs and
  output cotangents), and the abstract ``args`` and ``cts``."""
  vjp, in_vars, out_vars = differentiable(layer, inputs, grad_invariants, differentiate_inputs)

  def step(args, cts):
    _, vjp_fn = vjp(*args)
    return vjp_fn(cts)

  cts = [
      jax.ShapeDtypeStruct(v.aval.shape,
                           v.aval.dtype if _compat.is_float(v.aval) else jax.dtypes.float0)
      for v in out_vars
  ]
  return step, list(map(spec, in_vars)), cts


def flops(layer: Layer, inputs) -> int:
  """The layer's forward FLOPs by XLA's cost model (0 where the backend gives none)."""
  fn, in_vars, _ = layer_fn(layer, inputs)
  try:
    cost = jax.jit(fn).lower(*map(spec, in_vars)).cost_analysis()
  except Exception:  # cost analysis is advisory; a backend without it gives 0
    return 0
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return int(max(0.0, float((cost or {}).get("flops", 0.0))))
