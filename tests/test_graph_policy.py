"""The graph DP with options per unit and per run of units against brute force over
every plan, and against model G where there are no options."""

import itertools
import random

import pytest

from jaxremat._errors import InfeasibleBudgetError
from jaxremat._model.chain import Plan
from jaxremat._model.graph import graph_peak_bytes
from jaxremat._model.policy_plan import DOTS, KEEP, RECOMPUTE, Group, Option, PolicyPlan
from jaxremat.solvers._graph import solve_graph_budget
from jaxremat.solvers._graph_policy import SegmentOption, policy_peak_bytes, solve_graph_policy
from graph_oracles import random_graph


def _random_options(rng: random.Random, n: int) -> list[list[SegmentOption]]:
  """Per unit: KEEP (held, no seconds), sometimes DOTS (held less, some seconds; whole
  numbers, so that plans tie), and sometimes DOTS over a run of 2 or 3 units from it."""
  options = []
  for l in range(n):
    unit = [SegmentOption(Option(KEEP), rng.randint(0, 40), 0.0)]
    if rng.random() < 0.6:
      unit.append(SegmentOption(Option(DOTS), rng.randint(0, 20), float(rng.randint(0, 2))))
    if rng.random() < 0.5 and l + 2 <= n:
      unit.append(SegmentOption(Option(DOTS), rng.randint(0, 40), float(rng.randint(0, 3)),
                                rng.randint(2, min(3, n - l))))
    options.append(unit)
  return options


def _every_plan(n: int, options: list[list[SegmentOption]], rec: list[float]):
  """Every plan: kept cuts, and per segment before the last one, recomputed or under one
  of the options of its length (none but the last segment's run of kept units at the
  end)."""
  for k in range(n):
    for cuts in itertools.combinations(range(1, n), k):
      bounds = (0, *cuts)
      segments = list(zip(bounds, (*cuts, n)))[:-1]
      choices = [[None] + [o for o in options[l] if o.length == r - l] for l, r in segments]
      for picked in itertools.product(*choices):
        if picked and picked[-1] is not None and picked[-1].option.kind == KEEP:
          continue  # a kept unit before the last segment is the last segment's
        groups = [Group(l, r, Option(RECOMPUTE)) if o is None else Group(l, r, o.option)
                  for (l, r), o in zip(segments, picked)]
        groups += [Group(i, i + 1, Option(KEEP)) for i in range(bounds[-1], n)]
        seconds = sum(o.seconds if o is not None else sum(rec[l:r])
                      for (l, r), o in zip(segments, picked))
        yield PolicyPlan(tuple(groups)), seconds


@pytest.mark.parametrize("seed", range(80))
def test_dp_is_the_brute_force_fastest_within_the_budget(seed):
  rng = random.Random(seed)
  n = rng.randint(1, 6)
  graph = random_graph(rng, n)
  options = _random_options(rng, n)
  rec = [float(rng.randint(1, 2)) for _ in range(n)]
  kept = {Group(i, i + o.length, o.option): o.kept_bytes for i in range(n) for o in options[i]}
  plans = [(p, s, policy_peak_bytes(graph, p, kept)) for p, s in _every_plan(n, options, rec)]
  peaks = sorted({peak for _, _, peak in plans})
  for budget in {peaks[0] - 1, peaks[0], peaks[len(peaks) // 2], peaks[-1]}:
    within = [(s, peak) for _, s, peak in plans if peak <= budget]
    if not within:
      with pytest.raises(InfeasibleBudgetError) as err:
        solve_graph_policy(graph, options, rec, budget)
      assert err.value.min_feasible_bytes == peaks[0]
      continue
    plan, peak, seconds = solve_graph_policy(graph, options, rec, budget)
    fastest = min(s for s, _ in within)
    assert seconds == pytest.approx(fastest)
    assert peak == policy_peak_bytes(graph, plan, kept) <= budget


@pytest.mark.parametrize("seed", range(20))
def test_the_walk_is_model_g_on_layer_boundary_plans(seed):
  """``policy_peak_bytes`` (what the DP solves) on a plan without options is model G's
  peak (``graph_peak_bytes``), for every plan of a random graph."""
  rng = random.Random(200 + seed)
  n = rng.randint(1, 7)
  graph = random_graph(rng, n)
  for k in range(n):
    for cuts in itertools.combinations(range(1, n), k):
      bounds = (0, *cuts)
      groups = [Group(l, r, Option(RECOMPUTE)) for l, r in zip(bounds, cuts)]
      groups += [Group(i, i + 1, Option(KEEP)) for i in range(bounds[-1], n)]
      plan = PolicyPlan(tuple(groups))
      assert policy_peak_bytes(graph, plan, {}) == graph_peak_bytes(graph, Plan(cuts))


@pytest.mark.parametrize("seed", range(20))
def test_without_options_it_is_model_g_budget_plan(seed):
  """No options: the plan is a layer-boundary plan, its peak model G's, and it recomputes
  as little as model G's budget solver's."""
  rng = random.Random(100 + seed)
  n = rng.randint(2, 9)
  graph = random_graph(rng, n)
  rec = [1.0] * n
  budget = graph_peak_bytes(graph, Plan(tuple(range(1, n)))) + rng.randint(0, 50)
  plan, peak, seconds = solve_graph_policy(graph, [[] for _ in range(n)], rec, budget)
  cuts = tuple(g.stop for g in plan.groups if g.option.kind == RECOMPUTE)
  assert peak == graph_peak_bytes(graph, Plan(cuts)) <= budget
  model_g = solve_graph_budget(graph, budget)
  assert seconds == (model_g.checkpoints[-1] if model_g.checkpoints else 0)
