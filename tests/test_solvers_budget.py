"""The budget solver and the Pareto frontier against brute-force enumeration of every plan."""

from __future__ import annotations

import functools
import math
import pickle
import random

import numpy as np
import pytest

from jaxremat import (Chain, JaxrematError, Plan, UnknownMethodError, peak_bytes,
                      recompute_flops, solve)
from jaxremat._errors import InfeasibleBudgetError, InvalidBudgetError
from jaxremat.solvers import BUDGET_SOLVERS, SOLVERS, pareto
from jaxremat.solvers._budget import least_last_checkpoint
from jaxremat.solvers._optimal import least_peak_plan

from oracles import all_plans, literal_peak_of  # noqa: E402
from oracles import random_chain as oracle_random_chain  # noqa: E402

FLOP_POOLS = ([0], [0, 1], [1], [0, 0, 5], [1, 2, 3, 10], [10**12, 3 * 10**12])


def literal_flops(chain, checkpoints):
  """Every non-final segment runs twice: layers 1..last checkpoint are recomputed."""
  return sum(chain.flops[:max(checkpoints, default=0)])


def enumerate_plans(chain):
  """(peak, flops, checkpoints) of every plan of ``chain``."""
  n = chain.n
  plans = all_plans(n)
  return [(literal_peak_of(chain, cps), literal_flops(chain, cps), cps) for cps in plans]


def brute_budget(scored, budget):
  """Least (flops, peak) among plans with peak <= budget, or None."""
  return min(((f, p) for p, f, _ in scored if p <= budget), default=None)


def brute_frontier(scored):
  """The non-dominated (peak, flops) pairs, by increasing peak."""
  pairs = {(p, f) for p, f, _ in scored}
  return sorted((p, f) for p, f in pairs
                if not any(q <= p and h <= f and (q, h) != (p, f) for q, h in pairs))


def random_chain(rng: random.Random, n: int, refine: bool) -> Chain:
  return oracle_random_chain(rng, n, refine, flop_pools=FLOP_POOLS)


@functools.cache
def case(seed: int):
  rng = random.Random(seed)
  chain = random_chain(rng, rng.randint(0, 9), refine=seed % 2 == 1)
  return chain, enumerate_plans(chain)


def budgets_to_try(scored):
  """Every distinct peak, one byte below each, and far above all."""
  peaks = sorted({p for p, _, _ in scored})
  return sorted({*peaks, *(p - 1 for p in peaks), peaks[-1] * 2 + 1})


# --- budget against brute force ---------------------------------------------------------

BATCHES = 4
PER_BATCH = 300  # 1200 chains of 0..9 layers, each at every interesting budget


@pytest.mark.parametrize("batch", range(BATCHES))
def test_budget_is_least_recompute_within_budget(batch):
  for seed in range(batch * PER_BATCH, (batch + 1) * PER_BATCH):
    chain, scored = case(seed)
    least_peak = min(p for p, _, _ in scored)
    for budget in budgets_to_try(scored):
      want = brute_budget(scored, budget)
      if want is None:
        assert budget < least_peak
        with pytest.raises(InfeasibleBudgetError) as info:
          solve(chain, "budget", budget_bytes=budget)
        assert info.value.min_feasible_bytes == least_peak
        assert info.value.budget_bytes == budget
        assert f"{least_peak} bytes" in str(info.value)
        continue
      plan = solve(chain, "budget", budget_bytes=budget)
      assert plan.method == "budget"
      assert all(1 <= c <= chain.n - 1 for c in plan.checkpoints)
      got = (literal_flops(chain, plan.checkpoints), literal_peak_of(chain, plan.checkpoints))
      assert got[1] <= budget, (seed, budget, plan)
      assert got == want, (seed, budget, plan, got, want)


@pytest.mark.parametrize("batch", range(2))
def test_least_last_checkpoint_dp_equals_brute_force(batch):
  for seed in range(batch * PER_BATCH, (batch + 1) * PER_BATCH):
    chain, scored = case(seed)
    for budget in budgets_to_try(scored):
      lasts = [max(cps, default=0) for p, _, cps in scored if p <= budget]
      assert least_last_checkpoint(chain, budget) == min(lasts, default=None), (seed, budget)


def test_least_peak_plan_respects_its_limit():
  for seed in range(300):
    chain, scored = case(seed)
    for last in range(max(chain.n, 1)):
      cps = least_peak_plan(chain, last)
      assert all(c <= last for c in cps)
      best = min(p for p, _, c in scored if max(c, default=0) <= last)
      assert literal_peak_of(chain, cps) == best, (seed, last, cps)


def test_budget_at_the_optimum_is_an_optimal_plan():
  for seed in range(300):
    chain, scored = case(seed)
    least = min(p for p, _, _ in scored)
    plan = solve(chain, "budget", budget_bytes=least)
    assert peak_bytes(chain, plan) == least
    assert recompute_flops(chain, plan) == min(f for p, f, _ in scored if p == least)


def long_chain(rng: random.Random, n: int) -> Chain:
  act = [rng.randrange(1 << 20) for _ in range(n + 1)]
  res = [rng.randrange(1 << 20) for _ in range(n)]
  return Chain(act, res, input_res_bytes=[rng.randint(0, x) for x in res],
               flops=[rng.choice((0, 1, 5, 1000)) for _ in range(n)])


def test_budget_on_longer_chains_agrees_with_the_quadratic_dp():
  rng = random.Random(20)
  for n in (40, 120, 250):
    chain = long_chain(rng, n)
    least = peak_bytes(chain, solve(chain, "optimal"))
    most = peak_bytes(chain, Plan(()))
    previous = None
    for budget in sorted({least, most, *(rng.randint(least, most) for _ in range(6))}):
      plan = solve(chain, "budget", budget_bytes=budget)
      assert peak_bytes(chain, plan) <= budget
      flops = recompute_flops(chain, plan)
      assert flops == sum(chain.flops[:least_last_checkpoint(chain, budget)])
      assert previous is None or flops <= previous  # more budget never costs more FLOPs
      previous = flops
    assert solve(chain, "budget", budget_bytes=most).checkpoints == ()


def test_budget_without_flops_returns_a_least_peak_plan():
  rng = random.Random(21)
  for _ in range(50):
    chain = Chain([rng.randrange(100) for _ in range(31)], [rng.randrange(100) for _ in range(30)])
    least = peak_bytes(chain, solve(chain, "optimal"))
    plan = solve(chain, "budget", budget_bytes=least + rng.randrange(1000))
    assert peak_bytes(chain, plan) == least


def test_worked_example():
  chain = Chain([1, 2, 2, 2, 1], [3, 3, 3, 3], flops=[1, 2, 3, 4])
  assert solve(chain, "budget", budget_bytes=11).checkpoints == (2, 3)
  assert solve(chain, "budget", budget_bytes=14).checkpoints == (2,)
  assert solve(chain, "budget", budget_bytes=15).checkpoints == (1,)
  assert solve(chain, "budget", budget_bytes=16).checkpoints == ()
  with pytest.raises(InfeasibleBudgetError, match=r"budget_bytes=10 .* least peak .* 11 bytes"):
    solve(chain, "budget", budget_bytes=10)


def test_short_chains():
  assert solve(Chain([4], []), "budget", budget_bytes=8) == Plan((), method="budget")
  with pytest.raises(InfeasibleBudgetError) as info:
    solve(Chain([4], [], cot_bytes=[3]), "budget", budget_bytes=6)
  assert info.value.min_feasible_bytes == 7
  assert solve(Chain([1, 1], [1]), "budget", budget_bytes=4).checkpoints == ()


# --- budget_bytes handling --------------------------------------------------------------

CHAIN = Chain([1, 2, 2, 2, 1], [3, 3, 3, 3], flops=[1, 2, 3, 4])


def test_budget_bytes_types():
  assert solve(CHAIN, "budget", budget_bytes=np.int64(12)).checkpoints == (2,)
  assert solve(CHAIN, "budget", budget_bytes=12.9).checkpoints == (2,)  # rounded down
  assert solve(CHAIN, "budget", budget_bytes=np.float32(15.5)).checkpoints == (1,)
  assert solve(CHAIN, "budget", budget_bytes=math.inf).checkpoints == ()
  with pytest.raises(InfeasibleBudgetError):
    solve(CHAIN, "budget", budget_bytes=10.99)
  with pytest.raises(InfeasibleBudgetError):
    solve(CHAIN, "budget", budget_bytes=-5)


@pytest.mark.parametrize("bad", ["12", object(), [12], True])
def test_budget_bytes_must_be_a_number(bad):
  with pytest.raises(TypeError, match="budget_bytes must be a number of bytes"):
    solve(CHAIN, "budget", budget_bytes=bad)


@pytest.mark.parametrize("bad", [math.nan, -math.inf])
def test_budget_bytes_must_not_be_nan(bad):
  with pytest.raises(InvalidBudgetError, match="budget_bytes must be a number of bytes or \\+inf"):
    solve(CHAIN, "budget", budget_bytes=bad)


def test_budget_method_needs_budget_bytes():
  with pytest.raises(InvalidBudgetError, match=r"method='budget' needs budget_bytes"):
    solve(CHAIN, "budget")


@pytest.mark.parametrize("method", sorted(SOLVERS))
def test_other_methods_refuse_budget_bytes(method):
  with pytest.raises(InvalidBudgetError, match=rf"only used by method='budget'; method='{method}'"):
    solve(CHAIN, method, budget_bytes=100)


def test_unknown_method_wins_over_budget_checks():
  with pytest.raises(UnknownMethodError, match="'budget'"):
    solve(CHAIN, "budgett", budget_bytes=100)
  with pytest.raises(UnknownMethodError):
    solve(CHAIN, ["budget"])


def test_error_classes():
  for err in (InfeasibleBudgetError, InvalidBudgetError):
    assert issubclass(err, JaxrematError) and issubclass(err, ValueError)
  assert set(BUDGET_SOLVERS) == {"budget"}
  with pytest.raises(InfeasibleBudgetError) as info:
    solve(CHAIN, "budget", budget_bytes=3)
  copy = pickle.loads(pickle.dumps(info.value))
  assert (copy.min_feasible_bytes, copy.budget_bytes, str(copy)) == (11, 3, str(info.value))


# --- pareto -----------------------------------------------------------------------------


def test_pareto_worked_example():
  assert [(p, f, plan.checkpoints) for p, f, plan in pareto(CHAIN)] == [
      (11, 6, (2, 3)), (12, 3, (2,)), (15, 1, (1,)), (16, 0, ())]


@pytest.mark.parametrize("batch", range(2))
def test_pareto_equals_brute_force(batch):
  for seed in range(batch * PER_BATCH, (batch + 1) * PER_BATCH):
    chain, scored = case(seed)
    points = pareto(chain)
    assert [(p, f) for p, f, _ in points] == brute_frontier(scored), seed
    for peak, flops, plan in points:
      assert literal_peak_of(chain, plan.checkpoints) == peak
      assert literal_flops(chain, plan.checkpoints) == flops
      assert plan == solve(chain, "budget", budget_bytes=peak)


def test_pareto_on_longer_chains():
  rng = random.Random(22)
  for n in (60, 200):
    chain = long_chain(rng, n)
    points = pareto(chain)
    peaks = [p for p, _, _ in points]
    flops = [f for _, f, _ in points]
    assert peaks == sorted(set(peaks)) and flops == sorted(set(flops), reverse=True)
    assert peaks[0] == peak_bytes(chain, solve(chain, "optimal"))
    assert flops[-1] == 0
    for peak, f, plan in points:
      assert peak_bytes(chain, plan) == peak and recompute_flops(chain, plan) == f
    for (p0, _, _), (_, f1, _) in zip(points, points[1:]):
      assert recompute_flops(chain, solve(chain, "budget", budget_bytes=p0)) > f1


def test_pareto_rejects_non_chains():
  with pytest.raises(TypeError, match=r"pareto expects a jaxremat\.Chain, got str"):
    pareto("not a chain")  # type: ignore[arg-type]
