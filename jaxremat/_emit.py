"""Emit the rematerialised function: each non-final segment under its own jax.checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxremat import _compat
from jaxremat._chain import Plan
from jaxremat._trace import TracedChain


def emit(traced: TracedChain, plan: Plan) -> Callable[[Sequence[Any]], list[Any]]:
  """Returns ``run(flat_inputs) -> flat_outputs`` executing ``traced`` under ``plan``.

  Segment ``(l, r]`` evaluates the equations of layers ``l+1..r``; every segment but the
  last runs inside ``jax.checkpoint(prevent_cse=True)``, so only its inputs (the kept
  ``x_l`` and the parameters it reads) are saved for the backward pass and the rest is
  recomputed. The last segment runs plainly: its residuals are needed first anyway.
  """
  layers = traced.layers
  segments = plan.segments(len(layers))
  steps = []
  for k, (l, r) in enumerate(segments):
    seg = layers[l:r]
    final = k == len(segments) - 1
    eqns = [e for layer in seg for e in layer.eqns]
    in_vars = list(dict.fromkeys([*seg[0].inputs, *(v for layer in seg for v in layer.invariants)]))
    out_vars = list(dict.fromkeys([
        *(() if final else seg[-1].outputs), *(v for layer in seg for v in layer.side_outputs)]))
    fn = _compat.sub_function(eqns, in_vars, out_vars)
    if not final:
      fn = jax.checkpoint(fn, prevent_cse=True)
    steps.append((fn, in_vars, out_vars))
  base_vars = [*traced.input_vars, *traced.const_vars]
  prelude = (
      _compat.sub_function(traced.prelude, base_vars, traced.prelude_outputs)
      if traced.prelude else None)

  def run(flat_inputs: Sequence[Any]) -> list[Any]:
    env = dict(zip(base_vars, [*flat_inputs, *traced.consts]))
    if prelude is not None:
      env.update(zip(traced.prelude_outputs, prelude(*[env[v] for v in base_vars])))
    for fn, in_vars, out_vars in steps:
      env.update(zip(out_vars, fn(*[env[v] for v in in_vars])))
    return [a.val if isinstance(a, _compat.Literal) else env[a] for a in traced.outvars]

  return run
