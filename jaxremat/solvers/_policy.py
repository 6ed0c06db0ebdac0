"""The fastest policy plan within a byte budget: a DP over the chain with per-group options.

Each candidate ``GroupCost`` covers layers ``start+1..stop``. A plan picks groups that
cover ``1..n`` in order; its peak is ``_model.policy_plan.peak_bytes`` and its time the
sum of its groups' seconds. Left to right, the state is the bytes the groups so far hold
(``held``): a group may follow when ``held + stored + transient <= budget``, and moves
the state to ``held + stored``. ``dp[p][h]`` is the least time over plans of layers
``1..p`` holding ``h``; only ``held`` matters for what may follow, so the DP is exact.

Bytes are counted in quanta of ``ceil(budget / resolution)``, stored bytes rounded up:
a plan the DP returns fits the budget exactly, and a plan it misses fits within one
quantum per group of the budget. With budgets under ``resolution`` bytes (the tests)
the quantum is one byte and the DP is exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from jaxremat._errors import InfeasibleBudgetError, InvalidArgumentError
from jaxremat._model.policy_plan import GroupCost, PolicyPlan, peak_bytes

RESOLUTION = 4096  # quanta of the byte axis


def _by_start(costs: Sequence[GroupCost], n: int) -> list[list[GroupCost]]:
  if n <= 0:
    raise InvalidArgumentError(f"a policy plan needs at least one layer, got n={n}.")
  starts: list[list[GroupCost]] = [[] for _ in range(n)]
  for c in costs:
    if not 0 <= c.group.start < c.group.stop <= n:
      raise InvalidArgumentError(f"group {c.group} lies outside layers 1..{n}.")
    starts[c.group.start].append(c)
  return starts


def solve_policy(costs: Sequence[GroupCost], n: int, budget_bytes: int, final_bytes: int = 0,
                 resolution: int = RESOLUTION) -> tuple[GroupCost, ...]:
  """The groups of least total seconds whose ``peak_bytes`` is within ``budget_bytes``
  (bytes above the fixed ones); among equal times, the one holding least.

  Raises:
    InfeasibleBudgetError: no plan fits; ``min_feasible_bytes`` is the least peak of all
      plans (``least_peak``).
  """
  found = _solve(costs, n, budget_bytes, final_bytes, resolution)
  if found is None:
    least = least_peak(costs, n, final_bytes)
    raise InfeasibleBudgetError(
        f"no policy plan peaks within {budget_bytes} bytes above the fixed bytes; the least "
        f"peak any plan reaches is {least} bytes.", budget_bytes=budget_bytes,
        min_feasible_bytes=least)
  return found


def _solve(costs: Sequence[GroupCost], n: int, budget_bytes: int, final_bytes: int,
           resolution: int) -> tuple[GroupCost, ...] | None:
  starts = _by_start(costs, n)
  quantum = max(1, math.ceil(max(budget_bytes, 1) / resolution))
  size = budget_bytes // quantum + 1 if budget_bytes >= 0 else 0
  best = np.full((n + 1, max(size, 1)), np.inf)
  via = np.full((n + 1, max(size, 1)), -1)  # index into ``flat`` of the last group
  came = np.zeros((n + 1, max(size, 1)), dtype=np.int64)  # the held state before it
  flat = [c for group in starts for c in group]
  index = {id(c): k for k, c in enumerate(flat)}
  if size:
    best[0, 0] = 0.0
  for p in range(n):
    row = best[p]
    if not np.isfinite(row).any():
      continue
    for c in starts[p]:
      step = math.ceil(c.stored_bytes / quantum)
      # held h may take the group when h * quantum + stored + transient <= budget
      room = budget_bytes - c.stored_bytes - c.transient_bytes
      if room < 0 or step >= size:
        continue
      last = min(room // quantum, size - 1 - step)  # states h in 0..last
      if last < 0:
        continue
      cand = row[:last + 1] + c.seconds
      target = best[c.group.stop, step:step + last + 1]
      better = np.nonzero(cand < target)[0]
      if better.size:
        target[better] = cand[better]
        via[c.group.stop, better + step] = index[id(c)]
        came[c.group.stop, better + step] = better
  finals = best[n].copy()
  held = np.arange(finals.size) * quantum
  finals[held + final_bytes > budget_bytes] = np.inf
  if not np.isfinite(finals).any():
    return None
  h = int(np.argmin(finals))  # the least time, then the least held (argmin takes the first)
  chosen = []
  p = n
  while p > 0:
    c = flat[int(via[p, h])]
    chosen.append(c)
    p, h = c.group.start, int(came[p, h])
  return tuple(reversed(chosen))


def least_peak(costs: Sequence[GroupCost], n: int, final_bytes: int = 0) -> int:
  """The least ``peak_bytes`` over all plans (bytes above the fixed ones): bisection on
  the budget over ``solve_policy``'s exact feasibility (one quantum coarse)."""
  hi = max(sum(c.stored_bytes + c.transient_bytes for c in costs) + final_bytes, 1)
  lo = 0
  while hi - lo > max(1, hi // RESOLUTION):
    mid = (lo + hi) // 2
    if _solve(costs, n, mid, final_bytes, RESOLUTION) is None:
      lo = mid
    else:
      hi = mid
  return hi


def brute_policy(costs: Sequence[GroupCost], n: int, budget_bytes: int,
                 final_bytes: int = 0) -> tuple[GroupCost, ...] | None:
  """The oracle: every covering of ``1..n`` by the candidate groups, exhaustively; the
  least seconds within the budget (ties: the least held), or None. Small ``n`` only."""
  starts = _by_start(costs, n)
  best: tuple[float, int, tuple[GroupCost, ...]] | None = None

  def walk(p: int, chosen: tuple[GroupCost, ...]) -> None:
    nonlocal best
    if p == n:
      if peak_bytes(chosen, final_bytes) <= budget_bytes:
        key = (sum(c.seconds for c in chosen), sum(c.stored_bytes for c in chosen), chosen)
        if best is None or key[:2] < best[:2]:
          best = key
      return
    for c in starts[p]:
      walk(c.group.stop, chosen + (c,))

  walk(0, ())
  return None if best is None else best[2]


def policy_frontier(costs: Sequence[GroupCost], n: int, final_bytes: int = 0,
                    points: int = 24) -> list[tuple[int, float, tuple[GroupCost, ...]]]:
  """The memory-versus-time frontier: ``(peak bytes, seconds, groups)`` for budgets spread
  evenly from the least peak to the peak of the fastest plan, each solved by
  ``solve_policy``, and the fastest plan; dominated points are dropped, sorted by
  increasing bytes."""
  lo = least_peak(costs, n, final_bytes)
  everything = sum(c.stored_bytes + c.transient_bytes for c in costs) + final_bytes
  fastest = solve_policy(costs, n, everything, final_bytes)  # the least time, least held
  hi = max(lo, peak_bytes(fastest, final_bytes))
  # The fastest plan itself: solved for its own peak, the DP's rounded-up bytes may miss it.
  found = {peak_bytes(fastest, final_bytes): (sum(c.seconds for c in fastest), fastest)}
  for budget in sorted({lo + (hi - lo) * k // max(points - 1, 1) for k in range(points)}):
    try:
      groups = solve_policy(costs, n, budget, final_bytes)
    except InfeasibleBudgetError:
      continue
    found[peak_bytes(groups, final_bytes)] = (sum(c.seconds for c in groups), groups)
  return pareto([(peak, seconds, groups) for peak, (seconds, groups) in found.items()])


def pareto(points: Iterable[tuple[int, float, Any]]) -> list[tuple[int, float, Any]]:
  """The points ``(bytes, seconds, ...)`` no other point beats on both, by increasing
  bytes (of equal bytes, the fastest)."""
  front: list[tuple[int, float, Any]] = []
  for point in sorted(points, key=lambda p: (p[0], p[1])):
    if not front or point[1] < front[-1][1]:
      front.append(point)
  return front


def as_plan(groups: Sequence[GroupCost]) -> PolicyPlan:
  """The ``PolicyPlan`` of solved groups."""
  return PolicyPlan(tuple(c.group for c in groups))

