"""One shared test set run over every method in ``SOLVERS`` and ``BUDGET_SOLVERS``."""

from __future__ import annotations

import functools
import math
import random

import pytest

from jaxremat import (Chain, ChainTooLongError, Plan, UnknownMethodError, peak_bytes,
                      recompute_flops, solve)
from jaxremat._model.chain import validate_plan
from jaxremat._model.simulate import simulate_peak_bytes
from jaxremat.solvers import BUDGET_SOLVERS, SOLVERS, uniform_plan
from jaxremat.solvers._greedy import greedy_plan

from oracles import POOLS, all_plans, literal_peak_of, random_chain  # noqa: E402

METHODS = sorted([*SOLVERS, *BUDGET_SOLVERS])
# Exact minimisers of model R ("budget" runs at the least feasible budget, see ``run``).
EXACT = ("optimal", "quadratic", "brute", "budget")
SMALL_ONLY = {"brute", "brute-a"}  # exhaustive: only run on short chains
MEDIUM_ONLY = {"multilevel"}  # O(n^3): n <= 400
# Methods that may return multi-level plans (Plan.inner): scored by the event simulator,
# and allowed below the single-level optimum of model R.
NESTED = {"multilevel"}


def score(chain: Chain, plan: Plan) -> int:
  """Peak bytes of any plan: model R (``peak_bytes``) or, when nested, the simulator."""
  return simulate_peak_bytes(chain, plan) if plan.is_nested else peak_bytes(chain, plan)


def brute_force(chain):
  """Least literal peak over every plan, and the least recompute FLOPs among those plans."""
  scored = [(literal_peak_of(chain, cps), sum(chain.flops[:max(cps, default=0)]))
            for cps in all_plans(chain.n)]
  return min(scored)


@functools.cache
def small_case(seed: int) -> tuple[Chain, tuple[int, int]]:
  """Seeded chain of 1..10 layers (refinements in half of them) and its brute-force optimum."""
  rng = random.Random(seed)
  chain = random_chain(rng, rng.randint(1, 10), refine=seed % 2 == 1)
  return chain, brute_force(chain)


def run(chain: Chain, method: str) -> Plan:
  """``solve(chain, method)``; budget methods get the tightest budget, the optimum of model R."""
  if method in BUDGET_SOLVERS:
    return solve(chain, method, budget_bytes=peak_bytes(chain, solve(chain, "optimal")))
  return solve(chain, method)


def check_plan(chain: Chain, plan: Plan, method: str) -> None:
  assert isinstance(plan, Plan)
  assert plan.method == method
  cps = plan.checkpoints
  assert all(type(c) is int for c in cps)
  assert all(1 <= c <= chain.n - 1 for c in cps), (chain.n, cps)
  assert all(x < y for x, y in zip(cps, cps[1:])), cps
  assert method in NESTED or not plan.is_nested, plan
  validate_plan(plan, chain.n)


def test_method_list():
  assert set(EXACT) <= set(METHODS)
  assert {"none", "every-layer", "sqrt", "best-uniform", "chen-greedy"} <= set(SOLVERS)
  assert {"dp", "brute-a"} <= set(SOLVERS)
  assert set(BUDGET_SOLVERS) == {"budget"}
  assert not set(SOLVERS) & set(BUDGET_SOLVERS)


# --- every method: valid plans ----------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_plans_are_valid(method):
  rng = random.Random(1)
  sizes = list(range(0, 13)) * 5
  if method not in SMALL_ONLY:
    sizes += [20, 50, 200] + ([] if method in MEDIUM_ONLY else [1000])
  for n in sizes:
    chain = random_chain(rng, n, refine=rng.random() < 0.5)
    plan = run(chain, method)
    check_plan(chain, plan, method)
    assert score(chain, plan) >= 0


@pytest.mark.parametrize("method", METHODS)
def test_chain_of_one_layer_has_no_checkpoints(method):
  for chain in (Chain([1, 1], [1]), Chain([0, 0], [0]), Chain([9, 2], [7], cot_bytes=[1, 1])):
    plan = run(chain, method)
    check_plan(chain, plan, method)
    assert plan.checkpoints == ()


@pytest.mark.parametrize("method", METHODS)
def test_chain_of_two_layers(method):
  rng = random.Random(2)
  for _ in range(50):
    chain = random_chain(rng, 2, refine=rng.random() < 0.5)
    plan = run(chain, method)
    check_plan(chain, plan, method)
    assert plan.checkpoints in ((), (1,))
    if method in EXACT or method in NESTED:  # two layers leave no room for nesting
      assert score(chain, plan) == min(literal_peak_of(chain, ()), literal_peak_of(chain, (1,)))


@pytest.mark.parametrize("method", METHODS)
def test_deterministic(method):
  rng = random.Random(3)
  for _ in range(20):
    chain = random_chain(rng, rng.randint(1, 10), refine=True)
    assert run(chain, method) == run(chain, method)


@pytest.mark.parametrize("method", METHODS)
def test_never_beats_the_optimum_and_optimal_never_loses(method):
  rng = random.Random(4)
  for _ in range(100):
    n = rng.randint(1, 10 if method in SMALL_ONLY else 150)
    chain = random_chain(rng, n, refine=rng.random() < 0.5)
    best = peak_bytes(chain, solve(chain, "optimal"))
    plan = run(chain, method)
    if method in NESTED:  # nested plans may go below the single-level optimum, never above
      assert score(chain, plan) <= best
    else:
      assert peak_bytes(chain, plan) >= best


@pytest.mark.parametrize("method", METHODS)
def test_worked_example(method):
  chain = Chain([1, 2, 2, 2, 1], [3, 3, 3, 3])
  plan = run(chain, method)
  check_plan(chain, plan, method)
  if method in EXACT:
    assert plan.checkpoints == (2, 3)
    assert peak_bytes(chain, plan) == 11
  if method in NESTED:  # see test_multilevel.py: 10, nesting (0, 3] as (0, 1], (1, 2], (2, 3]
    assert score(chain, plan) == 10


# --- exact methods ----------------------------------------------------------------------

SMALL_BATCHES = 8
SMALL_PER_BATCH = 500  # 4000 chains of 1..10 layers


@pytest.mark.parametrize("batch", range(SMALL_BATCHES))
@pytest.mark.parametrize("method", EXACT)
def test_exact_equals_brute_force(method, batch):
  for seed in range(batch * SMALL_PER_BATCH, (batch + 1) * SMALL_PER_BATCH):
    chain, (best, _) = small_case(seed)
    plan = run(chain, method)
    check_plan(chain, plan, method)
    assert literal_peak_of(chain, plan.checkpoints) == best, (seed, chain, plan)


@pytest.mark.parametrize("method", ["brute", "optimal", "quadratic", "budget"])
def test_exact_ties_prefer_least_recomputation(method):
  for seed in range(SMALL_PER_BATCH):
    chain, (_, least_flops) = small_case(seed)
    plan = run(chain, method)
    assert recompute_flops(chain, plan) == least_flops, (seed, chain, plan)


LARGE_CASES = [
    # (n, pool index or None for wide random values, refine)
    (2000, None, False),
    (2000, 2, True),
    (1500, None, True),
    (1200, 4, False),
    (1000, 1, True),
    (800, 8, True),
    (500, 9, False),
    (3000, None, True),
    (2500, 0, False),
    (2000, 6, True),
]


@pytest.mark.parametrize("n, pool, refine", LARGE_CASES)
def test_optimal_equals_quadratic_on_long_chains(n, pool, refine):
  rng = random.Random(n * 31 + refine)

  def pick():
    return rng.randrange(1 << 20) if pool is None else rng.choice(POOLS[pool])

  b = [pick() for _ in range(n)]
  kwargs = {}
  if refine:
    kwargs = dict(cot_bytes=[pick() for _ in range(n + 1)],
                  input_res_bytes=[rng.randint(0, x) for x in b],
                  workspace_bytes=[pick() for _ in range(n)])
  chain = Chain([pick() for _ in range(n + 1)], b, **kwargs)
  assert peak_bytes(chain, solve(chain, "optimal")) == peak_bytes(chain, solve(chain, "quadratic"))


def test_optimal_equals_quadratic_on_many_medium_chains():
  rng = random.Random(5)
  for _ in range(600):
    n = rng.randint(10, 120)
    chain = random_chain(rng, n, refine=rng.random() < 0.5)
    fast, slow = solve(chain, "optimal"), solve(chain, "quadratic")
    assert peak_bytes(chain, fast) == peak_bytes(chain, slow)
    assert recompute_flops(chain, fast) == recompute_flops(chain, slow)


# --- baselines --------------------------------------------------------------------------

BASELINE_SIZES = list(range(1, 60)) + [99, 100, 101, 1000, 1024, 2000]


def test_none_has_no_checkpoints():
  for n in BASELINE_SIZES:
    assert solve(Chain([1] * (n + 1), [1] * n), "none").checkpoints == ()


def test_every_layer_keeps_every_output():
  for n in BASELINE_SIZES:
    plan = solve(Chain([1] * (n + 1), [1] * n), "every-layer")
    assert plan.checkpoints == tuple(range(1, n))
    assert len(plan.checkpoints) == n - 1


def test_sqrt_segments_have_length_ceil_sqrt_n():
  for n in BASELINE_SIZES:
    k = math.isqrt(n - 1) + 1  # ceil(sqrt(n)) for n >= 1
    assert (k - 1) ** 2 < n <= k**2
    plan = solve(Chain([1] * (n + 1), [1] * n), "sqrt")
    lengths = [r - l for l, r in plan.segments(n)]
    assert all(length == k for length in lengths[:-1]), (n, lengths)
    assert 1 <= lengths[-1] <= k, (n, lengths)
    assert len(lengths) == math.ceil(n / k)


def test_best_uniform_beats_every_uniform_plan():
  rng = random.Random(6)
  for _ in range(200):
    n = rng.randint(1, 40)
    chain = random_chain(rng, n, refine=rng.random() < 0.5)
    plan = solve(chain, "best-uniform")
    uniform = [tuple(range(k, n, k)) for k in range(1, n + 1)]
    assert plan.checkpoints in uniform
    best = literal_peak_of(chain, plan.checkpoints)
    assert all(best <= literal_peak_of(chain, cps) for cps in uniform)


def test_greedy_pass_closes_a_segment_once_it_exceeds_the_threshold():
  rng = random.Random(7)
  for _ in range(300):
    n = rng.randint(0, 30)
    chain = random_chain(rng, n, refine=False)
    b = chain.res_bytes
    assert greedy_plan(chain, 0)[0] == tuple(i for i in range(1, n) if b[i - 1] > 0)
    for threshold in (0, 1, 5, 50, 2**41, rng.randrange(1000)):
      cps, kept, largest = greedy_plan(chain, threshold)
      bounds = (0, *cps)
      sizes = [sum(b[l:r]) for l, r in zip(bounds, cps)]  # layers l+1..r
      assert all(size > threshold for size in sizes)
      assert all(sum(b[l:r - 1]) <= threshold for l, r in zip(bounds, cps))
      assert sum(b[bounds[-1]:max(n - 1, 0)]) <= threshold  # the open tail, layers up to n-1
      assert kept == sum(chain.act_bytes[c] for c in cps)
      assert largest == max(sizes, default=0)


def test_chen_greedy_search_on_a_uniform_chain():
  # a = b = 1, n = 100. Threshold 0 keeps every layer (99 kept, largest 1): guess
  # isqrt(99 * 1 // 2) = 7 gives segments of 8 (12 kept, largest 8): guess 6 gives
  # segments of 7 (14 kept, largest 7): last guess 7. Grid from the least largest, 1, to
  # isqrt(2 * 7**2) = 9 in steps of (9 - 1) // 6 = 1: thresholds 2..7, segments of 3..8.
  n = 100
  chain = Chain([1] * (n + 1), [1] * n)
  tried = [uniform_plan(n, k) for k in (1, 3, 4, 5, 6, 7, 8)]
  plan = solve(chain, "chen-greedy")
  assert plan.checkpoints in [p.checkpoints for p in tried]
  assert peak_bytes(chain, plan) == min(peak_bytes(chain, p) for p in tried)


def test_chen_greedy_is_no_worse_than_every_layer_when_all_layers_have_residuals():
  rng = random.Random(8)
  for _ in range(200):
    n = rng.randint(1, 80)
    chain = Chain([rng.randrange(1, 100) for _ in range(n + 1)],
                  [rng.randrange(1, 100) for _ in range(n)])
    greedy = peak_bytes(chain, solve(chain, "chen-greedy"))
    assert greedy <= peak_bytes(chain, solve(chain, "every-layer"))


# --- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["Optimal", "", "dp-unknown", None, 3])
def test_unknown_method(method):
  chain = Chain([1, 1, 1], [1, 1])
  with pytest.raises(UnknownMethodError, match=r"unknown method") as info:
    solve(chain, method)
  for name in METHODS:
    assert repr(name) in str(info.value)


def test_brute_refuses_long_chains():
  chain = Chain([1] * 22, [1] * 21)
  with pytest.raises(ChainTooLongError, match=r"at most 20 layers; this chain has 21"):
    solve(chain, "brute")


@pytest.mark.parametrize("not_a_chain", [
    None, {"act_bytes": [1, 1], "res_bytes": [1]}, ([1, 1], [1]), Plan(())])
def test_solve_rejects_non_chain(not_a_chain):
  with pytest.raises(TypeError, match=r"solve expects a jaxremat\.Chain"):
    solve(not_a_chain, "optimal")


def test_default_method_is_optimal():
  chain = Chain([1, 2, 2, 2, 1], [3, 3, 3, 3])
  assert solve(chain) == solve(chain, "optimal")
