"""Which plans ``jaxremat.fit`` compiles, in which order (issue 24).

``Search`` hands out the plans to compile until XLA fits one: the DP's plan of least
predicted time and the layer-boundary plans of ``apply(budget_bytes=)`` (``LayerPlans``),
each solved again for less after a miss. ``alternatives`` lists the other plans worth
timing beside the one that fits.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxremat._api.planner import Planner
from jaxremat._api.planning import tighten
from jaxremat._api.verify import PRUNE_ABOVE
from jaxremat._backends.policy_options import OptionCosts
from jaxremat._errors import InfeasibleBudgetError
from jaxremat._model.chain import Plan
from jaxremat._model.policy_plan import (
  DOTS,
  DOTS_NO_BATCH,
  RECOMPUTE,
  Group,
  GroupCost,
  Option,
  from_plan,
  peak_bytes,
)
from jaxremat.solvers._policy import solve_policy


def alternatives(options: OptionCosts, points: list[tuple[int, float, tuple[GroupCost, ...]]],
                  search: Search, chosen: tuple[GroupCost, ...], within: int
                  ) -> list[tuple[str, tuple[GroupCost, ...]]]:
  """Plans to time beside ``chosen``, each predicted to peak within ``within`` bytes (the
  groups' scale; XLA judges the fit) and different from the plans compiled so far: every
  layer recomputed, every layer keeping its matrix products (all, or those without batch
  dimensions), the frontier's plan of least footprint and its middle one under the
  budget, the layer-boundary plan."""
  n = search.n
  found = [(f"every layer: {kind}", tuple(options.of(Group(i, i + 1, Option(kind)))
                                          for i in range(n)))
           for kind in (RECOMPUTE, DOTS, DOTS_NO_BATCH)]
  below = [groups for peak, _, groups in points if peak <= search.allowed]
  found += [("frontier, least predicted footprint" if k == 0 else
             "frontier, middle point in budget", below[k])
            for k in sorted({0, len(below) // 2}) if k < len(below)]
  if search.layer_plans.current is not None:
    found.append(("layer-boundary plan", search.layer_plans.current))

  def signature(groups: tuple[GroupCost, ...]) -> tuple[tuple[int, int, int, float], ...]:
    return tuple((c.group.start, c.group.stop, c.stored_bytes, c.seconds) for c in groups)

  seen = {signature(g) for g in (*search.tried, chosen)}
  kept = []
  for what, groups in found:
    if peak_bytes(groups, search.final) <= within and signature(groups) not in seen:
      seen.add(signature(groups))
      kept.append((what, groups))
  return kept


#: Misses of the layer-boundary budget plan after which ``LayerPlans`` turns to the
#: planner's fallback plans: fit shares its compiles with the DP's plans, and a budget
#: plan solved again for XLA's excess can stay that far over it for several rounds (VGG-16
#: at 75% on the H100: three layer plans 0.2-0.7 MB over, where a fallback fits).
LAYER_TIGHTENINGS = 1
#: Once a plan fits, a layer-boundary fallback is compiled only if faster and predicted
#: (by the planner: the compiled profile on a GPU target) within this share over the
#: budget, as ``verify`` prunes its candidates (the H100 bf16 uneven MLP's plan of a
#: 75% budget is predicted 3.5% over it and fits).
FALLBACK_OVER = PRUNE_ABOVE


class LayerPlans:
  """Layer-boundary plans as groups, as ``apply(budget_bytes=)`` tries them: model R's
  budget plan (solved for less while the backend's estimate of it exceeds the budget),
  solved again for a budget lowered by XLA's excess after each miss, then (once the
  estimate finds none or after ``LAYER_TIGHTENINGS`` misses, and with ``fallbacks``: XLA
  will judge them) the planner's fallback plans (``_fallbacks``)."""

  def __init__(self, planner: Planner, options: OptionCosts, budget: int, fallbacks: bool):
    self.planner, self.options, self.budget = planner, options, budget
    self.asked = budget  # the budget as given, before XLA's misses lowered it
    self.fallbacks: list[Plan] | None = None if fallbacks else []
    self.misses = 0
    self.plan: Plan | None = None  # the layer plan of ``current``
    self.current: tuple[GroupCost, ...] | None = None
    self._take(self._next())

  def _take(self, plan: Plan | None) -> None:
    self.plan, self.current = plan, None if plan is None else self.groups_of(plan)

  def _next(self) -> Plan | None:
    # Model R's budget plan that the prediction fits (with the compiled profile,
    # solve_budget's plans fit the replay already); after repeated misses, the fallbacks.
    plan = None
    if self.misses < LAYER_TIGHTENINGS:
      plan = tighten(self.planner.solve_budget, self.planner.accepted_bytes,
                     self.planner.total_bytes, self.budget, 8)
    if plan is None and self.fallbacks is None:
      self.fallbacks = self._fallbacks()
    if plan is None and self.fallbacks:
      plan = self.fallbacks.pop(0)
    return plan

  def groups_of(self, plan: Plan) -> tuple[GroupCost, ...]:
    """``plan`` (checkpoints at layer boundaries) as the groups the DP's plans are made of."""
    return tuple(self.options.of(g)
                 for g in from_plan(plan.checkpoints, self.planner.chain.n).groups)

  def skip(self, tried: list[tuple[GroupCost, ...]], fastest: float | None) -> None:
    """Moves on to the next fallback plan while the current one was compiled already, or
    once a plan fitted (``fastest``: its predicted seconds) while the current one is no
    faster or predicted more than ``FALLBACK_OVER`` over the budget."""
    def passed(groups: tuple[GroupCost, ...], plan: Plan) -> bool:
      if groups in tried:
        return True
      return fastest is not None and (
          _seconds(groups) >= fastest
          or self.planner.total_bytes(plan) > self.asked * (1 + FALLBACK_OVER))

    while self.current is not None and self.plan is not None and passed(self.current, self.plan):
      if self.fallbacks is None:
        self.fallbacks = self._fallbacks()
      self._take(self.fallbacks.pop(0) if self.fallbacks else None)

  def _fallbacks(self) -> list[Plan]:
    """The planner's fallback plans and model R's plan for the budget as given (the one
    ``apply(budget_bytes=)`` compiles first): those the estimate fits in the budget, least
    recompute first, then the rest, smallest estimate first."""
    try:
      first = [self.planner.solve_budget(self.asked)]
    except InfeasibleBudgetError:
      first = []
    plans = list(dict.fromkeys(Plan(p.checkpoints)
                               for p in (*first, *self.planner.budget_fallbacks())))
    total = {p: self.planner.total_bytes(p) for p in plans}
    fitting = sorted((p for p in plans if total[p] <= self.budget),
                     key=self.planner.recompute_flops)
    return fitting + sorted((p for p in plans if total[p] > self.budget),
                            key=lambda p: total[p])

  def missed(self, excess_bytes: int) -> None:
    self.budget -= excess_bytes
    self.misses += 1
    self._take(self._next())


class Search:
  """The plans to compile: the DP's plan within the allowance (bytes above the fixed
  ones, in the groups' own scale) and the layer-boundary plan, each solved again for less
  after XLA finds it over the budget; none twice. The two take turns after misses (the
  one that missed fewer times first), else the faster predicted goes first: a model that
  XLA keeps surprising one way need not use up every compile. Once a plan (of either)
  fits, only plans predicted faster are offered, and the DP's allowance grows by the
  bytes XLA left unused or by those it was predicted over, the more (short of any
  allowance that missed): where the prediction was high, a faster plan may fit too.
  Where the DP finds no plan within the allowance, it offers its plan of least predicted
  peak (XLA judges the fit) until one fits. The DP rounds bytes up to its quantum, so a
  plan of ``frontier`` (exact peaks) faster than the DP's and within the allowance is
  offered instead (keeping everything, at a budget of exactly its footprint)."""

  def __init__(self, costs: list[GroupCost], n: int, final: int, allowed: int, scale: float,
               layer_plans: LayerPlans, xla_judges: bool,
               frontier: Sequence[tuple[int, float, tuple[GroupCost, ...]]] = ()):
    self.costs, self.n, self.final, self.allowed, self.scale = costs, n, final, allowed, scale
    self.frontier = frontier
    self.xla_judges = xla_judges  # else a plan must fit by its prediction
    self.layer_plans = layer_plans
    self.tried: list[tuple[GroupCost, ...]] = []
    self.least = 0  # the least predicted peak, in the groups' scale, once the DP finds none
    self.fastest: float | None = None  # predicted seconds of the fastest plan that fitted
    self._ceiling: int | None = None  # the least allowance whose DP plan missed
    self._missed_by: dict[tuple[GroupCost, ...], int] = {}  # XLA's excess, groups' scale
    self._misses = {"dp": 0, "layers": 0}
    self._least_peak_plan: tuple[GroupCost, ...] | None = None

  def _solved(self) -> tuple[GroupCost, ...] | None:
    for _ in range(64):
      try:
        groups = solve_policy(self.costs, self.n, self.allowed, self.final)
      except InfeasibleBudgetError as err:
        self.least = err.min_feasible_bytes
        return self._least_peak()
      groups = min([groups, *(g for peak, _, g in self.frontier
                              if peak <= self.allowed and g not in self.tried)], key=_seconds)
      if groups not in self.tried:
        return groups
      if self.fastest is not None and _seconds(groups) >= self.fastest:
        return None  # the DP's plans for less allowance are no faster than what fitted
      # compiled already: the next plan of the frontier peaks below it, by as much as
      # XLA found it over (where it missed: its neighbours miss alike)
      below = peak_bytes(groups, self.final) - self._missed_by.get(groups, 0)
      self.allowed = min(self.allowed, below) - 1
    return None

  def _least_peak(self) -> tuple[GroupCost, ...] | None:
    """Where XLA judges, nothing is predicted within the allowance and nothing fitted yet:
    the DP's plan of least predicted peak (the frontier's first point), until compiled.
    XLA may fit it all the same, and a failing fit names the least footprint it found (a
    GPT's named a plan 1.1% above this one, which a fit at a larger budget returned)."""
    if not self.xla_judges or self.fastest is not None:
      return None
    if self._least_peak_plan is None:
      self._least_peak_plan = solve_policy(self.costs, self.n, self.least, self.final)
    return None if self._least_peak_plan in self.tried else self._least_peak_plan

  def next(self) -> tuple[GroupCost, ...] | None:
    self.layer_plans.skip(self.tried, self.fastest)
    found = [(family, g) for family, g in (("dp", self._solved()),
                                           ("layers", self.layer_plans.current))
             if g is not None and g not in self.tried
             and (self.xla_judges or peak_bytes(g, self.final) <= self.allowed)
             and (self.fastest is None or _seconds(g) < self.fastest)]
    if not found:
      return None
    return min(found, key=lambda f: (self._misses[f[0]], _seconds(f[1])))[1]

  def fitted(self, groups: tuple[GroupCost, ...], slack_bytes: int, overestimate_bytes: int
             ) -> None:
    """``groups`` compiled to ``slack_bytes`` under the budget, and ``overestimate_bytes``
    under its prediction (negative: over it)."""
    self.tried.append(groups)
    seconds = _seconds(groups)
    self.fastest = seconds if self.fastest is None else min(seconds, self.fastest)
    grown = self.allowed + int(max(slack_bytes, overestimate_bytes) / self.scale)
    self.allowed = grown if self._ceiling is None else min(grown, self._ceiling - 1)

  def failed(self, groups: tuple[GroupCost, ...], excess_bytes: int) -> None:
    """``groups`` compiled to ``excess_bytes`` over the budget."""
    self.tried.append(groups)
    from_layers = groups is self.layer_plans.current
    if groups == self.layer_plans.current:  # the DP's plan may be the layer plan too
      self._misses["layers"] += 1
      self.layer_plans.missed(excess_bytes)
    if not from_layers:
      self._misses["dp"] += 1
      self._ceiling = self.allowed if self._ceiling is None else min(self.allowed, self._ceiling)
      self._missed_by[groups] = excess = max(int(excess_bytes / self.scale), 1)
      self.allowed -= excess  # XLA needs this much more than predicted: ask for less


def _seconds(groups: tuple[GroupCost, ...]) -> float:
  return sum(c.seconds for c in groups)
