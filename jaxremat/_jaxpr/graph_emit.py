"""Emit a graph plan: each non-final segment under jax.checkpoint, crossing values in and out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxremat._jaxpr import compat as _compat
from jaxremat._model.chain import Plan, validate_plan
from jaxremat._errors import InvalidPlanError
from jaxremat._jaxpr.trace import TracedChain


def emit_graph(traced: TracedChain, plan: Plan) -> Callable[[Sequence[Any]], list[Any]]:
  """Returns ``run(flat_inputs) -> flat_outputs`` executing ``traced`` (a graph) under ``plan``.

  Segment ``(l, r]`` evaluates the equations of layers ``l+1..r``. Its inputs are the
  values made before it that it reads (the part of ``C_l`` it needs, plus parameters
  and batch), its outputs the values it makes that later layers or the model's result
  read (the part of ``C_r`` made inside it). Every segment but the last runs inside
  ``jax.checkpoint(prevent_cse=True)``, so its backward saves only its inputs and
  recomputes the rest.
  """
  layers = traced.layers
  n = len(layers)
  if plan.is_nested:
    raise InvalidPlanError("a model that is not a chain takes single-level plans (no Plan.inner).")
  validate_plan(plan, n)
  base_vars = [*traced.input_vars, *traced.const_vars]
  prelude = (
      _compat.sub_function(traced.prelude, base_vars, traced.prelude_outputs)
      if traced.prelude else None)
  bounds = (0, *plan.checkpoints, n)
  segments = []
  for k, (l, r) in enumerate(zip(bounds[:-1], bounds[1:])):
    inside = layers[l:r]
    made = {v for layer in inside for e in layer.eqns for v in e.outvars}
    in_vars = list(dict.fromkeys(
        v for layer in inside for v in (*layer.inputs, *layer.invariants) if v not in made))
    read_after = {v for layer in layers[r:] for v in layer.inputs}
    out_vars = list(dict.fromkeys(
        v for layer in inside for v in (*layer.outputs, *layer.side_outputs)
        if v in read_after or v in layer.side_outputs))
    fn = _compat.sub_function([e for layer in inside for e in layer.eqns], in_vars, out_vars)
    if k < len(bounds) - 2:
      fn = jax.checkpoint(fn, prevent_cse=True)
    segments.append((fn, in_vars, out_vars))

  def run(flat_inputs: Sequence[Any]) -> list[Any]:
    env = dict(zip(base_vars, [*flat_inputs, *traced.consts]))
    if prelude is not None:
      env.update(zip(traced.prelude_outputs, prelude(*[env[v] for v in base_vars])))
    for fn, in_vars, out_vars in segments:
      env.update(zip(out_vars, fn(*[env[v] for v in in_vars])))
    return [a.val if isinstance(a, _compat.Literal) else env[a] for a in traced.outvars]

  return run
