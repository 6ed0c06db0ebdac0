"""Least recomputation under a byte budget: peak_R <= P with the fewest recomputed FLOPs."""

from __future__ import annotations

import math
import numbers
import operator

from jaxremat._model.chain import Chain, Plan, peak_bytes
from jaxremat._errors import InfeasibleBudgetError, InvalidArgumentError, InvalidBudgetError
from jaxremat.solvers._optimal import (cheapest_last, least_last, least_peak_choices,
                                         least_peak_value)
from jaxremat.solvers._terms import plan_from_choices, terms


def budget_as_int(budget_bytes: object) -> int | None:
  """``budget_bytes`` as whole bytes: integers as they are, floats rounded down, +inf as None.

  Raises:
    InvalidArgumentError: (a TypeError) not a real number (or a bool).
    InvalidBudgetError: NaN or -inf.
  """
  if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, numbers.Real):
    raise InvalidArgumentError(
        f"budget_bytes must be a number of bytes, got {type(budget_bytes).__name__} "
        f"{budget_bytes!r}.")
  if isinstance(budget_bytes, numbers.Integral):
    return operator.index(budget_bytes)
  value = float(budget_bytes)
  if math.isnan(value) or value == -math.inf:
    raise InvalidBudgetError(
        f"budget_bytes must be a number of bytes or +inf, got {budget_bytes!r}.")
  return None if value == math.inf else math.floor(value)


def least_last_checkpoint(chain: Chain, budget_bytes: int) -> int | None:
  """The least ``L`` such that a plan with checkpoints ``<= L`` peaks at most ``budget_bytes``.

  The left-to-right O(n^2) DP of docs/design.md, kept as the reference for
  ``_optimal.least_last`` (the same DP in O(n)). ``D(r)``, the least held sum
  ``sum_{c in C u {0}, c <= r} a_c`` over plans of the layers ``1..r`` that keep
  ``x_r`` and stay within budget, is ``a_r + min D(l)`` over the ``l < r`` with
  ``D(l) + S(l, r) <= budget`` (``S`` from ``_terms``; a smaller held sum is never
  worse for the layers after ``r``). The answer is the least ``l`` (0: no
  checkpoints) with ``D(l) + S(l, n) <= budget``.

  Returns:
    ``L`` in ``0..n-1``, or None when no plan fits the budget.
  """
  n = chain.n
  if n == 0:
    return 0 if peak_bytes(chain, Plan(())) <= budget_bytes else None
  t = terms(chain)
  h, c, a = t.h, t.c, chain.act_bytes
  held: list[int | None] = [None] * n
  held[0] = a[0]
  for r in range(1, n):
    best, running = None, h[r]
    for l in range(r - 1, -1, -1):
      running = max(running, h[l + 1])
      if held[l] is not None and held[l] + running - c[l] <= budget_bytes:
        best = held[l] if best is None else min(best, held[l])
    held[r] = None if best is None else a[r] + best
  feasible, to_end = None, h[n]  # to_end = max_{l<i<=n} h[i], widened as l decreases
  for l in range(n - 1, -1, -1):
    to_end = max(to_end, h[l + 1])
    if held[l] is not None and held[l] + to_end - c[l] <= budget_bytes:
      feasible = l
  return feasible


def solve_budget(chain: Chain, budget_bytes: int) -> Plan:
  """The plan with ``peak_bytes <= budget_bytes`` that recomputes the fewest FLOPs, in O(n).

  Every non-final segment is recomputed once, so a plan recomputes
  ``f_1 + ... + f_L`` with ``L`` its last checkpoint. ``least_last`` (one left-to-right
  pass) finds the least ``L`` such that a plan with checkpoints ``<= L`` fits the
  budget; the plans recomputing just as little are those with checkpoints up to the
  last ``L'`` with ``f_{L+1} = ... = f_{L'} = 0``, and one stack solve restricted to
  them (``least_peak_choices``) returns the one of least peak. The least peak of all
  plans is computed only for the error.

  Args:
    chain: the per-layer byte counts and FLOPs.
    budget_bytes: the most bytes the backward pass may peak at under model R
      (``peak_bytes``); a float is rounded down to whole bytes, ``math.inf`` means
      no limit.

  Returns:
    A ``Plan`` with ``method="budget"``: least ``recompute_flops``, then least
    ``peak_bytes``.

  Raises:
    InfeasibleBudgetError: ``budget_bytes`` is below the optimum of model R; its
      ``min_feasible_bytes`` holds that optimum, the least budget that works.
    InvalidBudgetError, TypeError: ``budget_bytes`` is NaN, -inf or not a number.

  References:
    Beaumont et al. 2019, "Optimal checkpointing for heterogeneous chains" (rotor),
    for the min-time-under-a-budget formulation.
  """
  budget = budget_as_int(budget_bytes)
  n = chain.n
  if n <= 1:  # the only plan keeps nothing
    least = peak_bytes(chain, Plan(()))
    if budget is not None and budget < least:
      raise _infeasible(budget, least)
    return Plan((), method="budget")
  t, a = terms(chain), chain.act_bytes
  last = 0 if budget is None else least_last(t, a, budget)
  if last is None:
    raise _infeasible(budget, a[0] + least_peak_value(t, a))
  choice = least_peak_choices(t, a, cheapest_last(chain.flops, last))
  return Plan(plan_from_choices(choice, n), method="budget")


def _infeasible(budget: int, least: int) -> InfeasibleBudgetError:
  """The error for a budget below ``least``, the least peak of any plan (bytes)."""
  return InfeasibleBudgetError(
      f"budget_bytes={budget} is below the least peak any plan reaches, {least} bytes "
      f"(model R, method='optimal'); pass budget_bytes >= {least}.",
      budget_bytes=budget, min_feasible_bytes=least)
