"""What the chain and graph planners share: near ties, the checkpoint-every-k plans, a
budget plan tightened to a footprint, the budget error, bytes as text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from jaxremat._backends.refine import MAX_LAYERS as MAX_REFINE_LAYERS
from jaxremat._backends.refine import neighbours
from jaxremat._errors import InfeasibleBudgetError
from jaxremat._model.chain import Plan
from jaxremat.solvers import uniform_plan

TIE = 0.01  # predictions this close (relative) are a tie: the predictions' errors are larger


class _Layers(Protocol):
  @property
  def n(self) -> int: ...


class Ranks(Protocol):
  """A planner that predicts a plan's temp bytes and recompute FLOPs."""

  @property
  def chain(self) -> _Layers: ...

  def temp_bytes(self, plan: Plan) -> int: ...

  def recompute_flops(self, plan: Plan) -> int: ...


def near_ties(planner: Ranks, plan: Plan, count: int) -> list[Plan]:
  """Up to ``count`` plans one checkpoint away from ``plan`` whose predicted temp bytes
  are within ``TIE`` of ``plan``'s, least prediction first (then least recompute): plans
  the prediction cannot tell apart, which XLA's footprint can. None beyond refine's
  ``MAX_LAYERS`` layers."""
  n = planner.chain.n
  if n > MAX_REFINE_LAYERS or plan.is_nested:
    return []
  near = set(neighbours(plan.checkpoints, n))
  limit = planner.temp_bytes(plan) * (1 + TIE)
  keys = {c: (planner.temp_bytes(Plan(c)), planner.recompute_flops(Plan(c))) for c in near}
  ties = sorted((c for c in near if keys[c][0] <= limit), key=keys.__getitem__)
  return [Plan(c) for c in ties[:count]]


def every_k_plans(n: int) -> list[Plan]:
  """The checkpoint-every-k plans of ``n`` layers that keep a checkpoint, k = 1..n-1."""
  return [uniform_plan(n, k) for k in range(1, n)]


def fmt_bytes(num_bytes: int) -> str:
  """``num_bytes`` in the largest binary unit it reaches, e.g. ``1.50 MiB``."""
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if abs(num_bytes) >= scale:
      return f"{num_bytes / scale:.2f} {unit}"
  return f"{num_bytes} B"


def tighten(solve_budget: Callable[[int], Plan], accepted_bytes: Callable[[Plan], int],
            footprint: Callable[[Plan], int], budget_bytes: int, rounds: int) -> Plan | None:
  """The first plan of ``solve_budget`` (least recompute within a budget, bytes) whose
  ``footprint`` (the replay's, the estimate's, XLA's) is at most ``budget_bytes``.

  A plan over by ``d`` bytes lowers the budget given to ``solve_budget`` by ``d``, and
  below ``accepted_bytes`` of the plan (the footprint the solver judged it by), so the
  next plan is another: lowered by ``d`` alone, a solver whose figure was already well
  below the budget returns the same plan again. None when the solver has no plan
  (``InfeasibleBudgetError``) or after ``rounds`` plans.
  """
  asked = budget_bytes
  for _ in range(rounds):
    try:
      plan = solve_budget(asked)
    except InfeasibleBudgetError:
      return None
    over = footprint(plan) - budget_bytes
    if over <= 0:
      return plan
    asked = min(asked - over, accepted_bytes(plan) - 1)
  return None


def below_least(budget_bytes: int, least: int, fixed_bytes: int) -> InfeasibleBudgetError:
  """The error for a budget (bytes) below ``least``, the least predicted footprint."""
  return InfeasibleBudgetError(
      f"budget_bytes={budget_bytes} ({fmt_bytes(budget_bytes)}) is below the least "
      f"footprint any plan reaches by jaxremat's prediction, {least} bytes "
      f"({fmt_bytes(least)}: {fmt_bytes(fixed_bytes)} of parameters, batch and gradients "
      "plus the least activation peak). Raise the budget or shrink the batch.",
      budget_bytes=budget_bytes, min_feasible_bytes=least)
