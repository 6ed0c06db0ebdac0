"""The module tree below a model's root, from its equations' name stacks, with each
module's activation bytes (what ``granularity.decompose`` splits by)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from jaxremat._jaxpr import compat as _compat

Key = tuple[str, ...]  # a module's path in the name stack


def activation_bytes(eqns: Sequence[Any], batch_vars: Iterable[Any]) -> list[int]:
  """Per equation, the bytes of the float values it makes that depend on the batch (a
  proxy for what its backward keeps): inside a call, those of the equations it runs;
  inside a scan, one iteration's times its length; parameter-only work counts 0."""
  varying = set(batch_vars)
  weights = []
  for eqn in eqns:
    if any(not isinstance(v, _compat.Literal) and v in varying for v in eqn.invars):
      varying.update(eqn.outvars)
      weights.append(_made_bytes(eqn))
    else:
      weights.append(0)
  return weights


def _made_bytes(eqn: Any) -> int:
  """Bytes of the float values ``eqn`` makes, counting the equations of its sub-programs
  instead of its outputs (``cond``: its largest branch; ``scan``: times its length)."""
  bodies = [[_body_bytes(j) for j in (value if isinstance(value, (tuple, list)) else (value,))
             if hasattr(getattr(j, "jaxpr", j), "eqns")] for value in eqn.params.values()]
  bodies = [b for b in bodies if b]
  if not bodies:
    return sum(_compat.aval_bytes(v.aval) for v in eqn.outvars if _compat.is_float(v.aval))
  times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
  return times * sum(max(b) for b in bodies)


def _body_bytes(jaxpr: Any) -> int:
  return sum(_made_bytes(e) for e in getattr(jaxpr, "jaxpr", jaxpr).eqns)


class ModuleTree:
  """The module tree below the root, from the name stacks: each module's activation bytes,
  its child modules and whether it has equations of its own."""

  def __init__(self, stacks: Sequence[Key], weights: Sequence[int], depth: int):
    self._weight: dict[Key, int] = {}
    self._children: dict[Key, dict[Key, None]] = {}
    self._own: set[Key] = set()
    for stack, w in zip(stacks, weights):
      for k in range(depth + 1, len(stack) + 1):
        prefix = stack[:k]
        self._weight[prefix] = self._weight.get(prefix, 0) + w
        if k < len(stack):
          self._children.setdefault(prefix, {})[stack[:k + 1]] = None
        else:
          self._own.add(prefix)

  def weight(self, key: Key) -> int:
    return self._weight.get(key, 0)

  def _only_child(self, key: Key) -> Key | None:
    children = list(self._children.get(key, ()))
    return children[0] if len(children) == 1 and key not in self._own else None

  def divisible(self, key: Key) -> bool:
    """Whether splitting ``key`` (looking through single children) gives two or more layers,
    one of them a module."""
    while (only := self._only_child(key)) is not None:
      key = only
    children = len(self._children.get(key, ()))
    return children >= 1 and children + (key in self._own) >= 2

  def expansion(self, key: Key) -> frozenset:
    """``key`` and the single children it is looked through to."""
    keys = [key]
    while (only := self._only_child(keys[-1])) is not None:
      keys.append(only)
    return frozenset(keys)
