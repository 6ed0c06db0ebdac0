"""The linear passes of "optimal" and "budget" against the O(n^2) DP and the former search."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxremat import Chain, Plan, peak_bytes, solve
from jaxremat._errors import InfeasibleBudgetError
from jaxremat.solvers._budget import least_last_checkpoint
from jaxremat.solvers._optimal import (cheapest_last, least_last, least_peak_checkpoints,
                                       least_peak_choices, least_peak_plan, least_peak_value)
from jaxremat.solvers._terms import _terms_exact, plan_from_choices, terms

from oracles import (POOLS, all_plans, former_budget, former_optimal,  # noqa: E402
                     former_restricted, former_stack_solve, literal_peak_of, random_chain)

# FLOPs with ties and zeros (zero runs move the last checkpoint allowed).
FLOP_POOLS = ([0], [0, 1], [1], [0, 0, 5], [1, 2, 3, 10], [10**12, 3 * 10**12])


def chain_for(seed: int, n: int) -> Chain:
  rng = random.Random(seed)
  return random_chain(rng, n, refine=seed % 2 == 1, flop_pools=FLOP_POOLS)


def budgets(chain: Chain) -> list[int]:
  """Every distinct peak of a short chain, one byte below each, and far above all."""
  peaks = sorted({literal_peak_of(chain, cps) for cps in all_plans(chain.n)})
  return sorted({*peaks, *(p - 1 for p in peaks), 2 * peaks[-1] + 1})


def budget_plan(chain: Chain, budget: int) -> tuple[int, ...] | None:
  try:
    return solve(chain, "budget", budget_bytes=budget).checkpoints
  except InfeasibleBudgetError:
    return None


def long_chain(rng: random.Random, n: int) -> Chain:
  """Wide random bytes, or a pool with many ties; FLOPs with zero runs."""
  pool = rng.choice([None, *POOLS])

  def pick():
    return rng.randrange(1 << 20) if pool is None else rng.choice(pool)

  b = [pick() for _ in range(n)]
  return Chain([pick() for _ in range(n + 1)], b, cot_bytes=[pick() for _ in range(n + 1)],
               input_res_bytes=[rng.choice((0, x, rng.randint(0, x))) for x in b],
               workspace_bytes=[rng.choice((0, pick())) for _ in range(n)],
               flops=[rng.choice(rng.choice(FLOP_POOLS)) for _ in range(n)])


# --- short chains: every budget -----------------------------------------------------------


@pytest.mark.parametrize("batch", range(4))
def test_least_last_equals_the_quadratic_dp(batch):
  for seed in range(batch * 300, (batch + 1) * 300):
    chain = chain_for(seed, 1 + seed % 10)
    t = terms(chain)
    for budget in budgets(chain):
      assert least_last(t, chain.act_bytes, budget) == least_last_checkpoint(chain, budget), (
          seed, budget)


@pytest.mark.parametrize("batch", range(4))
def test_plans_equal_the_former_search(batch):
  for seed in range(batch * 300, (batch + 1) * 300):
    chain = chain_for(seed, seed % 11)  # n = 0..10
    assert solve(chain, "optimal").checkpoints == former_optimal(chain), seed
    for budget in budgets(chain):
      assert budget_plan(chain, budget) == former_budget(chain, budget), (seed, budget)


def test_restricted_plans_equal_the_former_restriction():
  for seed in range(400):
    chain = chain_for(seed, seed % 11)
    for last in range(-1, chain.n + 2):
      assert least_peak_plan(chain, last) == former_restricted(chain, last)[0], (seed, last)


def test_the_value_pass_and_the_choice_pass_agree_with_the_former_stack():
  for seed in range(400):
    chain = chain_for(seed, 1 + seed % 12)
    t, a = terms(chain), chain.act_bytes
    cps, peak = (), literal_peak_of(chain, ())
    if chain.n >= 2:
      cps, peak = former_stack_solve(chain, a)
    assert a[0] + least_peak_value(t, a) == peak
    assert plan_from_choices(least_peak_choices(t, a, chain.n - 1), chain.n) == cps
    assert least_peak_checkpoints(chain) == cps


# --- edge cases ---------------------------------------------------------------------------


def test_zero_one_and_two_layers():
  for chain in (Chain([3], []), Chain([3], [], cot_bytes=[4]), Chain([1, 1], [1]),
                Chain([5, 0], [0], flops=[0]), Chain([1, 2, 1], [3, 3]),
                Chain([1, 9, 1], [3, 3], flops=[0, 0]), Chain([0, 0, 0], [0, 0])):
    assert solve(chain, "optimal").checkpoints == former_optimal(chain)
    for budget in budgets(chain):
      assert budget_plan(chain, budget) == former_budget(chain, budget), (chain, budget)
    if chain.n:
      t = terms(chain)
      for budget in budgets(chain):
        assert least_last(t, chain.act_bytes, budget) == least_last_checkpoint(chain, budget)


def test_cheapest_last_runs_over_zero_flops():
  flops = [1, 0, 0, 2, 0]  # f_1..f_5
  assert [cheapest_last(flops, last) for last in range(5)] == [0, 3, 3, 3, 4]
  assert cheapest_last([0, 0, 0], 0) == 2  # never past n - 1
  assert cheapest_last([7], 0) == 0


def test_all_ties():
  """Equal bytes everywhere and zero FLOPs: many plans tie on peak and on recomputation."""
  for n in range(2, 40):
    for flops in ([0] * n, [1] * n):
      chain = Chain([7] * (n + 1), [7] * n, flops=flops)
      assert solve(chain, "optimal").checkpoints == former_optimal(chain), n
      least = peak_bytes(chain, solve(chain, "optimal"))
      for budget in (least, least + 7, least + 100, 10**6):
        assert budget_plan(chain, budget) == former_budget(chain, budget), (n, budget)


def test_terms_beyond_int64_are_exact():
  big = 2**62
  chain = Chain([big, 1, big, 3], [big, 2, big], flops=[1, 0, 2])
  assert terms(chain) == _terms_exact(chain)
  assert solve(chain, "optimal").checkpoints == former_optimal(chain)
  for budget in budgets(chain):
    assert budget_plan(chain, budget) == former_budget(chain, budget)


def test_int64_terms_equal_exact_ones():
  rng = random.Random(9)
  for n in [0, 1, 2, 3, *range(4, 60, 7)]:
    for scale in (1, 2**40, 2**55):
      chain = long_chain(rng, n)
      chain = Chain([x * scale for x in chain.act_bytes], [x * scale for x in chain.res_bytes],
                    input_res_bytes=[x * scale for x in chain.input_res_bytes])
      assert terms(chain) == _terms_exact(chain), (n, scale)


# --- longer chains ------------------------------------------------------------------------


def test_longer_chains_equal_the_former_search():
  rng = random.Random(10)
  for _ in range(60):
    chain = long_chain(rng, rng.randint(2, 150))
    assert solve(chain, "optimal").checkpoints == former_optimal(chain)
    least = peak_bytes(chain, solve(chain, "optimal"))
    most = peak_bytes(chain, Plan(()))
    for budget in {least - 1, least, most, rng.randint(least, most), rng.randint(least, most)}:
      assert budget_plan(chain, budget) == former_budget(chain, budget), budget
      if budget >= least:
        assert least_last(terms(chain), chain.act_bytes, budget) == least_last_checkpoint(
            chain, budget)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_least_last_on_generated_chains(data):
  n = data.draw(st.integers(1, 25))
  small = st.integers(0, 6)
  act = data.draw(st.lists(small, min_size=n + 1, max_size=n + 1))
  res = data.draw(st.lists(small, min_size=n, max_size=n))
  inp = [data.draw(st.integers(0, x)) for x in res]
  chain = Chain(act, res, input_res_bytes=inp, flops=data.draw(
      st.lists(st.integers(0, 2), min_size=n, max_size=n)))
  least = peak_bytes(chain, solve(chain, "quadratic"))
  budget = data.draw(st.integers(least - 2, least + 20))
  assert least_last(terms(chain), act, budget) == least_last_checkpoint(chain, budget)
  assert budget_plan(chain, budget) == former_budget(chain, budget)
  assert solve(chain, "optimal").checkpoints == former_optimal(chain)
