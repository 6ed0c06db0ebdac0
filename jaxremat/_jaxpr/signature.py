"""A layer's structure as a hashable key: layers with equal keys profile identically."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.trace import Layer


def layer_signature(layer: Layer, inputs: Sequence[_compat.Var], grad_invariants: set,
                    differentiate_inputs: bool) -> Hashable | None:
  """The layer's equations with variables renamed by position, its inputs' and outputs'
  shapes and dtypes, and which inputs get cotangents; None when a parameter of some
  equation has no stable text (the layer is then profiled on its own).

  Two layers with equal signatures compute the same function of their inputs in the same
  order (the repeated blocks of a transformer), so their profiles are equal with the
  variables mapped by position: input ``k`` to input ``k``, output ``k`` to output ``k``.
  """
  in_vars = list(dict.fromkeys([*inputs, *layer.invariants]))
  names: dict[Any, tuple] = {
      v: ("in", k, str(v.aval), v in grad_invariants or (differentiate_inputs and v in inputs))
      for k, v in enumerate(in_vars)}
  eqns = []
  try:
    for eqn in layer.eqns:
      ins = tuple(("lit", repr(v.val)) if isinstance(v, _compat.Literal) else names[v]
                  for v in eqn.invars)
      for v in eqn.outvars:
        names[v] = ("eq", len(names), str(v.aval))
      eqns.append((eqn.primitive.name, _stable(eqn.params), ins,
                   tuple(names[v] for v in eqn.outvars)))
    outs = tuple(names[v] for v in dict.fromkeys([*layer.outputs, *layer.side_outputs]))
  except (KeyError, _Unstable):
    return None
  return (len(inputs), tuple(eqns), outs)


class _Unstable(Exception):
  pass


def _stable(value: Any) -> Hashable:
  """``value`` as text or tuples that are equal for equal structure (no object ids)."""
  if isinstance(value, (str, int, float, bool, type(None))):
    return value
  if isinstance(value, (tuple, list)):
    return tuple(_stable(v) for v in value)
  if isinstance(value, dict):
    return tuple(sorted((str(k), _stable(v)) for k, v in value.items()))
  if callable(value) and not hasattr(value, "jaxpr"):
    return getattr(value, "__qualname__", type(value).__name__)
  text = str(value)
  if " at 0x" in text:  # an object's id: not a structure
    raise _Unstable(text)
  return text
