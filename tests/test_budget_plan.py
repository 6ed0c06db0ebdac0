"""The chain planner's budget plan under the compiled profile: model R's plan tightened
until the replay's footprint fits (``ChainPlanner.solve_budget``), on a hand-made chain
and a stand-in replay. No XLA."""

import dataclasses

import pytest

from jaxremat._api.planner import ChainPlanner
from jaxremat._api.planning import tighten
from jaxremat._errors import InfeasibleBudgetError
from jaxremat._model.chain import Chain, Plan
from jaxremat._model.simulate import simulate_peak_bytes
from jaxremat.solvers import solve

FIXED = 1000
CHAIN = Chain([10, 40, 10, 60, 20, 40, 10, 30, 10], [30, 5, 50, 5, 30, 5, 40, 5],
              flops=[1, 5, 2, 5, 1, 5, 3, 5])


@dataclasses.dataclass(frozen=True)
class _Replay:
  """XLA as a replay sees it: model R's whole-step footprint plus ``extra`` bytes."""

  extra: int
  fixed_bytes: int = FIXED

  def total_bytes(self, checkpoints: tuple[int, ...]) -> int:
    return FIXED - CHAIN.act_bytes[0] + simulate_peak_bytes(CHAIN, Plan(checkpoints)) + self.extra

  def live_bytes(self, checkpoints: tuple[int, ...]) -> int:
    return 0  # a lower bound of the temp bytes that rules nothing out


def _planner(extra: int) -> ChainPlanner:
  return ChainPlanner(CHAIN, None, FIXED, replay=_Replay(extra))  # type: ignore[arg-type]


def _model_r(budget: int) -> Plan:
  """Model R's own budget plan for a whole-step budget (bytes): the oracle."""
  return solve(CHAIN, "budget", budget_bytes=budget - (FIXED - CHAIN.act_bytes[0]))


def test_the_replay_s_extra_bytes_tighten_model_r_s_budget():
  planner = _planner(extra=25)
  least = planner.model_total_bytes(solve(CHAIN, "optimal"))
  tightened = 0
  for budget in range(least + 25, planner.model_total_bytes(Plan()) + 30):
    plan = planner.solve_budget(budget)
    assert planner.total_bytes(plan) <= budget
    # the plan of least recompute whose replayed footprint fits: model R's for 25 less
    assert (planner.recompute_flops(plan)
            == planner.recompute_flops(_model_r(budget - 25))), budget
    tightened += plan.checkpoints != _model_r(budget).checkpoints
  assert tightened > 10  # model R's own plan for the budget would not have fitted


def test_without_a_replay_the_budget_plan_is_model_r_s():
  planner = dataclasses.replace(_planner(extra=0), replay=None)
  budget = planner.model_total_bytes(Plan((2, 4))) + 3
  assert planner.solve_budget(budget).checkpoints == _model_r(budget).checkpoints


def test_a_budget_the_replay_fits_no_plan_in_names_the_replay_s_least():
  planner = _planner(extra=500)
  with pytest.raises(InfeasibleBudgetError) as err:
    planner.solve_budget(FIXED + 100)
  least = min(planner.total_bytes(p) for p in planner.budget_fallbacks())
  assert err.value.min_feasible_bytes == least > FIXED + 100


def test_where_model_r_s_plans_all_miss_the_replay_the_fitting_fallback_is_taken():
  planner = _planner(extra=0)
  kept = planner.budget_fallbacks()[-1]  # the one plan the replay fits: a fallback

  class Replay(_Replay):
    def total_bytes(self, checkpoints: tuple[int, ...]) -> int:
      return super().total_bytes(checkpoints) + (0 if checkpoints == kept.checkpoints
                                                 else 10**6)

  planner = dataclasses.replace(planner, replay=Replay(0))
  plan = planner.solve_budget(planner.total_bytes(kept))
  assert plan.checkpoints == kept.checkpoints and plan.method == "budget"


def test_tighten_rules_out_a_plan_below_the_figure_the_solver_judged_it_by():
  """A solver that judges plans by the replay (the graph planner's): (3,) is 970 bytes
  by the replay, 1200 by the model, 1001 by XLA; (2, 4) 900 by the replay, 990 by XLA.
  Lowered below the model's 1200 alone, the solver would give (3,) back each round."""
  replay = {(3,): 970, (2, 4): 900}
  xla = {(3,): 1001, (2, 4): 990}

  def solve_budget(budget: int) -> Plan:
    fits = [c for c, b in replay.items() if b <= budget]
    if not fits:
      raise InfeasibleBudgetError("none", budget_bytes=budget, min_feasible_bytes=900)
    return Plan(min(fits, key=len))

  found = tighten(solve_budget, lambda p: replay[p.checkpoints], lambda p: xla[p.checkpoints],
                  1000, 6)
  assert found is not None and found.checkpoints == (2, 4)
