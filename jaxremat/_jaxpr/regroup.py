"""Moving work between layers: values every layer may read into a prelude run before
them, output-only work into the layer it reads; and the check that layers form a chain.

A layer here is a ``Group``, its name and its equations in order (``granularity``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

from jaxremat._jaxpr import compat as _compat

#: Values computed from the batch alone (an attention mask, positions) that a layer reads
#: two or more layers after the one that makes them move into the prelude (held for the
#: whole step, as their readers hold them anyway) when together they are at most this
#: share of the model's activation bytes.
HOIST_SHARE = 1 / 20

Group = tuple[str, list]  # (layer name, its equations)


def hoist_invariant_values(groups: list[Group], invariant: set) -> tuple[list, list[Group]]:
  """Moves equations that depend only on ``invariant`` values (parameters, kwargs,
  constants: not the batch) and feed other layers into a prelude."""
  origin = _origins(groups, invariant)
  crossing = _read_by(groups, origin, lambda made, reader: made != reader)
  return _moved(groups, crossing, origin)


def hoist_values(groups: list[Group], invariant: set, batch_vars: Sequence[Any],
                 param_vars: Sequence[Any], limit_bytes: float
                 ) -> tuple[list, list[Group], list]:
  """Both hoists of ``granularity.decompose``: parameter-only values read by another layer, then
  values computed without the parameters (from the batch, kwargs, constants) that a
  layer reads two or more layers after their maker, when they total at most
  ``limit_bytes``. Returns the prelude, the non-empty layers and the batch values
  hoisted."""
  prelude, groups = hoist_invariant_values(groups, invariant - set(batch_vars))
  free = invariant - set(param_vars)
  free |= set(_origins([("prelude", prelude)], free))
  origin = _origins(groups, free)
  skipping = _read_by(groups, origin, lambda made, reader: reader > made + 1)
  batch_values: list = []
  if skipping and sum(_compat.aval_bytes(v.aval) for v in skipping) <= limit_bytes:
    more, groups = _moved(groups, skipping, origin)
    prelude, batch_values = prelude + more, sorted(skipping, key=str)
  return prelude, [(name, g) for name, g in groups if g], batch_values


def _origins(groups: list[Group], sources: set) -> dict[Any, int]:
  """The layer that makes each value computed from ``sources`` alone."""
  derived = set(sources)
  origin: dict[Any, int] = {}
  for gi, (_, eqns) in enumerate(groups):
    for eqn in eqns:
      if all(isinstance(v, _compat.Literal) or v in derived for v in eqn.invars):
        for v in eqn.outvars:
          derived.add(v)
          origin[v] = gi
  return origin


def _read_by(groups: list[Group], origin: dict[Any, int],
             crossing: Callable[[int, int], bool]) -> set:
  """Values of ``origin`` that a layer reads where ``crossing(maker, reader)``."""
  return {v for gi, (_, eqns) in enumerate(groups) for eqn in eqns for v in eqn.invars
          if not isinstance(v, _compat.Literal) and v in origin and crossing(origin[v], gi)}


def _moved(groups: list[Group], values: set, origin: dict[Any, int]) -> tuple[list, list[Group]]:
  """The equations computing ``values`` (and those they are computed from, all in
  ``origin``) as a prelude, and the layers without them."""
  if not values:
    return [], groups
  needed = set(values)
  hoisted_ids = set()
  for _, eqns in reversed(groups):
    for eqn in reversed(eqns):
      if any(v in needed for v in eqn.outvars):
        hoisted_ids.add(id(eqn))
        needed.update(v for v in eqn.invars if not isinstance(v, _compat.Literal) and v in origin)
  prelude = [e for _, g in groups for e in g if id(e) in hoisted_ids]
  rest = [(name, [e for e in g if id(e) not in hoisted_ids]) for name, g in groups]
  return prelude, rest


def attach_output_work(groups: list[Group], invariant: set, outvars: Sequence[Any]
                       ) -> list[Group]:
  """Work outside any module whose results only the model's outputs read (an auxiliary
  loss: ``jnp.mean(h ** 2)`` returned beside the logits) joins the layer that made the
  latest value it reads, when that layer is not the one before it: it reads ``h`` across
  the layers after ``h``'s maker, which would make the model a graph; run with ``h``'s
  maker instead, its results are that layer's model outputs and the layers stay a chain.
  Equations keep their order within each layer."""
  outputs = {v for v in outvars if not isinstance(v, _compat.Literal)}
  made_by: dict[Any, int] = {}
  read_by: dict[Any, set[int]] = collections.defaultdict(set)
  for li, (_, eqns) in enumerate(groups):
    for eqn in eqns:
      for v in eqn.invars:
        if not isinstance(v, _compat.Literal):
          read_by[v].add(li)
      for v in eqn.outvars:
        made_by[v] = li
  moved: dict[int, int] = {}  # group -> the group it joins
  for li, (name, eqns) in enumerate(groups):
    if own_work_path(name) is None or li == 0:
      continue  # a module's layer, or the first
    made = [v for e in eqns for v in e.outvars]
    if any(read_by[v] - {li} for v in made) or not any(v in outputs for v in made):
      continue  # a later layer reads it, or it makes no model output
    makers = {made_by[v] for e in eqns for v in e.invars
              if not isinstance(v, _compat.Literal) and v not in invariant
              and made_by.get(v, li) != li}
    host = max(makers, default=li - 1)
    while host in moved:
      host = moved[host]
    if host < li - 1:
      moved[li] = host
  if not moved:
    return groups
  joined = [list(eqns) for _, eqns in groups]
  for li in sorted(moved):
    joined[moved[li]] += joined[li]
    joined[li] = []
  return [(name, eqns) for (name, _), eqns in zip(groups, joined) if eqns]


def first_skip(groups: Sequence[Group], invariant: set) -> tuple[int, int] | None:
  """``(reader, maker)``: the first layer that reads a value (not in ``invariant``) made
  by a layer other than the one just before it; None when the layers form a chain."""
  made_by: dict[Any, int] = {}
  for li, (_, eqns) in enumerate(groups):
    for eqn in eqns:
      for v in eqn.invars:
        if isinstance(v, _compat.Literal) or v in invariant or made_by.get(v, li) == li:
          continue
        if made_by[v] != li - 1:
          return li, made_by[v]
      for v in eqn.outvars:
        made_by[v] = li
  return None


def own_work_path(name: str) -> str | None:
  """The module path of a layer that is a module's own work, its equations outside the
  module's children (named by their primitives after the path: ``decoder/(reduce_sum,div)``,
  ``(add,mul)#2`` at the root: ``""``); None for a module's layer."""
  path, _, last = name.rpartition("/")
  return path if last.startswith("(") else None


def shared_inputs(groups: Sequence[Group], first: int, last: int, invariant: set) -> set:
  """Values made before layer ``first`` that two or more of layers ``first..last`` read,
  not counting the layer just after the value's maker: what a run of blocks reads beside
  its chain (a decoder's blocks, each cross-attending to the encoder's output). A
  residual block's input, read again only by its closing add, is not one."""
  made_by: dict[Any, int] = {}
  readers: dict[Any, set[int]] = collections.defaultdict(set)
  for li, (_, eqns) in enumerate(groups):
    for eqn in eqns:
      for v in eqn.invars:
        if not isinstance(v, _compat.Literal) and v not in invariant and v in made_by:
          if first <= li <= last and made_by[v] < first and li != made_by[v] + 1:
            readers[v].add(li)
      for v in eqn.outvars:
        made_by[v] = li
  return {v for v, found in readers.items() if len(found) >= 2}
