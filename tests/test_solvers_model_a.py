"""Model A: ``cost_a`` against its formula, ``dp`` against ``brute-a`` and the plain program."""

from __future__ import annotations

import random

import pytest

from jaxremat import Chain, ChainTooLongError, InvalidPlanError, Plan, solve
from jaxremat.solvers import cost_a
from jaxremat.solvers._dp import least_checkpoint_sum
from oracles import POOLS, all_plans  # noqa: E402


def literal_cost_a(d, checkpoints):
  """docs/design.md: sum of d_c over c in C ∪ {0, n}, plus the largest sum_{l<t<r} d_t."""
  n = len(d) - 1
  kept = sorted({0, n, *checkpoints})
  interiors = [sum(d[t] for t in range(l + 1, r)) for l, r in zip(kept, kept[1:])]
  return sum(d[c] for c in kept) + max(interiors, default=0)



def random_d(rng: random.Random, n: int) -> list[int]:
  pool = rng.choice(POOLS)
  return [rng.choice(pool) for _ in range(n + 1)]


def chain_of(d, rng=None):
  """A chain with activation sizes ``d``; the other fields are noise model A must ignore."""
  n = len(d) - 1
  if rng is None:
    return Chain(d, [1] * n)
  return Chain(d, [rng.randrange(50) for _ in range(n)],
               cot_bytes=[rng.randrange(50) for _ in range(n + 1)],
               workspace_bytes=[rng.randrange(9) for _ in range(n)],
               flops=[rng.randrange(9) for _ in range(n)])


# --- cost_a -----------------------------------------------------------------------------


def test_cost_a_worked_values():
  chain = Chain([1, 2, 2, 2, 1], [3, 3, 3, 3])
  assert cost_a(chain, Plan(())) == 1 + 1 + 6
  assert cost_a(chain, Plan((2,))) == 1 + 2 + 1 + 2
  assert cost_a(chain, Plan((2, 3))) == 1 + 2 + 2 + 1 + 2
  assert cost_a(chain, Plan((1, 2, 3))) == 8
  assert solve(chain, "dp").checkpoints == (2,)
  assert solve(chain, "brute-a").checkpoints == (2,)


def test_cost_a_small_chains():
  assert cost_a(Chain([7], []), Plan(())) == 7
  assert cost_a(Chain([7, 3], [1]), Plan(())) == 10
  assert cost_a(Chain([7, 5, 3], [1, 1]), Plan(())) == 15
  assert cost_a(Chain([7, 5, 3], [1, 1]), Plan((1,))) == 15


def test_cost_a_equals_literal_formula():
  rng = random.Random(10)
  for _ in range(300):
    d = random_d(rng, rng.randint(0, 9))
    chain = chain_of(d, rng)
    for cps in all_plans(chain.n):
      assert cost_a(chain, Plan(cps)) == literal_cost_a(d, cps), (d, cps)


def test_cost_a_rejects_out_of_range_plans():
  chain = Chain([1, 1, 1], [1, 1])
  with pytest.raises(InvalidPlanError, match="out of range"):
    cost_a(chain, Plan((2,)))


# --- brute-a ----------------------------------------------------------------------------


def test_brute_a_equals_literal_enumeration():
  rng = random.Random(11)
  for _ in range(300):
    d = random_d(rng, rng.randint(0, 9))
    chain = chain_of(d, rng)
    best = min(literal_cost_a(d, cps) for cps in all_plans(chain.n))
    plan = solve(chain, "brute-a")
    assert plan.method == "brute-a"
    assert literal_cost_a(d, plan.checkpoints) == best, (d, plan)


def test_brute_a_refuses_long_chains():
  with pytest.raises(ChainTooLongError, match=r"at most 20 layers; this chain has 21.*'dp'"):
    solve(Chain([1] * 22, [1] * 21), "brute-a")


# --- dp ---------------------------------------------------------------------------------

DP_BATCHES = 4
DP_PER_BATCH = 400  # 1600 seeded chains of 0..12 layers


@pytest.mark.parametrize("batch", range(DP_BATCHES))
def test_dp_equals_brute_a(batch):
  for seed in range(batch * DP_PER_BATCH, (batch + 1) * DP_PER_BATCH):
    rng = random.Random(seed)
    d = random_d(rng, rng.randint(0, 12))
    chain = chain_of(d, rng if seed % 2 else None)
    plan = solve(chain, "dp")
    assert plan.method == "dp"
    assert all(1 <= c <= chain.n - 1 for c in plan.checkpoints)
    assert cost_a(chain, plan) == cost_a(chain, solve(chain, "brute-a")), (seed, d, plan)


def test_dp_on_ties_and_zeros():
  for n in range(0, 14):
    for d in ([0] * (n + 1), [1] * (n + 1), [3] * (n + 1), [0, *[1] * n], [*[0] * n, 9],
              [i % 2 for i in range(n + 1)], [2**40 * (i % 3 == 0) for i in range(n + 1)]):
      chain = chain_of(d)
      assert cost_a(chain, solve(chain, "dp")) == cost_a(chain, solve(chain, "brute-a")), d


def plain_program(d):
  """Hong et al.'s O(n^3) program without pruning: every segment sum as the candidate M."""
  n = len(d) - 1
  candidates = {sum(d[l + 1:r]) for l in range(n) for r in range(l + 1, n + 1)}
  return min(m + least_checkpoint_sum(d, m)[0] for m in candidates)


def test_dp_equals_the_plain_program_on_longer_chains():
  rng = random.Random(12)
  for _ in range(40):
    n = rng.randint(15, 60)
    d = ([rng.randrange(1 << 20) for _ in range(n + 1)] if rng.random() < 0.5
         else random_d(rng, n))
    chain = chain_of(d)
    assert cost_a(chain, solve(chain, "dp")) == plain_program(d), d


def test_least_checkpoint_sum_is_feasible_and_least():
  rng = random.Random(13)
  for _ in range(200):
    d = random_d(rng, rng.randint(1, 9))
    n = len(d) - 1
    for m in sorted({sum(d[l + 1:r]) for l in range(n) for r in range(l + 1, n + 1)}):
      total, cps = least_checkpoint_sum(d, m)
      bounds = (0, *cps, n)
      assert all(sum(d[l + 1:r]) <= m for l, r in zip(bounds, bounds[1:])), (d, m, cps)
      assert total == sum(d[c] for c in bounds)
      feasible = [sum(d[c] for c in (0, *p, n)) for p in all_plans(n)
                  if all(sum(d[l + 1:r]) <= m for l, r in zip((0, *p), (*p, n)))]
      assert total == min(feasible), (d, m)


def test_dp_handles_long_chains():
  rng = random.Random(14)
  for n in (300, 1000):
    d = [rng.randrange(1, 1 << 24) for _ in range(n + 1)]
    chain = chain_of(d)
    plan = solve(chain, "dp")
    # No worse than the best uniform segmentation, which model A also scores.
    uniform = min(cost_a(chain, Plan(tuple(range(k, n, k)))) for k in range(1, n + 1))
    assert cost_a(chain, plan) <= uniform
    assert len(plan.checkpoints) > 0
