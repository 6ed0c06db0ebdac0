"""Tests of the event simulator (_simulate) and the multi-level solver (method="multilevel")."""

from __future__ import annotations

import functools
import itertools
import random

import pytest

from jaxremat import (Chain, ChainTooLongError, InvalidPlanError, Plan, peak_bytes,
                      recompute_flops, solve)
from jaxremat._model.simulate import recompute_counts, simulate_peak_bytes
from jaxremat.solvers import SOLVERS
from jaxremat.solvers import _multilevel

from oracles import literal_peak_of, literal_recompute_flops, random_chain  # noqa: E402

WORKED = Chain([1, 2, 2, 2, 1], [3, 3, 3, 3])  # docs/design.md: single-level optimum 11 at {2, 3}


# --- independent oracles for nested plans -----------------------------------------------


def leaves(plan: Plan, n: int):
  """Every leaf segment of ``plan`` as ``(l, r, held, reruns)``, written out from the
  semantics: at each level the sub-segments ``(m_j, m_{j+1}]`` of a node keep their
  inputs ``x_{m_0..m_j}`` held while ``(m_j, m_{j+1}]`` runs its backward, and every
  sub-segment but the last reruns once more than its node."""
  out = []

  def visit(l, r, sub, held, reruns):
    if sub is None:
      out.append((l, r, held, reruns))
      return
    bounds = (l, *sub.checkpoints, r)
    inner = dict(sub.inner)
    last = len(bounds) - 2
    for j in range(last + 1):
      visit(bounds[j], bounds[j + 1], inner.get(bounds[j]), held | set(bounds[:j + 1]),
            reruns + (j < last))

  visit(0, n, plan, {0}, 0)
  return out


def literal_nested_peak(chain: Chain, plan: Plan) -> int:
  """Max over leaves (l, r] and layers i in them of the held x_c, the residuals of
  l+1..i less e_{l+1}, w_i, g_i and g_{i-1} (what model R says of each leaf)."""
  a, b, g = chain.act_bytes, chain.res_bytes, chain.cot_bytes
  e, w = chain.input_res_bytes, chain.workspace_bytes
  if chain.n == 0:
    return a[0] + g[0]
  peak = None
  for l, r, held, _ in leaves(plan, chain.n):
    for i in range(l + 1, r + 1):
      live = (sum(a[c] for c in held) + sum(b[t - 1] for t in range(l + 1, i + 1)) - e[l]
              + w[i - 1] + g[i] + g[i - 1])
      peak = live if peak is None else max(peak, live)
  return peak


def literal_counts(plan: Plan, n: int) -> list[int]:
  counts = [0] * n
  for l, r, _, reruns in leaves(plan, n):
    for i in range(l + 1, r + 1):
      counts[i - 1] = reruns
  return counts


def checkpoint_count(plan: Plan) -> int:
  return len(plan.checkpoints) + sum(checkpoint_count(sub) for _, sub in plan.inner)


def depth(plan: Plan) -> int:
  level, todo = 0, [plan]
  while todo:
    level += 1
    todo = [sub for p in todo for _, sub in p.inner]
  return level


@functools.cache
def structures(l: int, r: int) -> tuple[Plan | None, ...]:
  """Every structure of the segment (l, r]: None (one segment) or any nonempty set of
  inner checkpoints with any structure for each sub-segment (the last included)."""
  out: list[Plan | None] = [None]
  for k in range(1, r - l):
    for cps in itertools.combinations(range(l + 1, r), k):
      bounds = (l, *cps, r)
      kids = [structures(s, t) for s, t in zip(bounds[:-1], bounds[1:])]
      for pick in itertools.product(*kids):
        inner = tuple((s, sub) for s, sub in zip(bounds, pick) if sub is not None)
        out.append(Plan(cps, inner=inner))
  return tuple(out)


def all_nested_plans(n: int) -> list[Plan]:
  return [sub or Plan(()) for sub in structures(0, n)]


def test_structure_counts():
  # 1, 2, 6, 24, 112, 568: one segment, or a composition into >= 2 parts of any structure.
  assert [len(all_nested_plans(n)) for n in range(1, 7)] == [1, 2, 6, 24, 112, 568]


# --- the simulator ----------------------------------------------------------------------


@pytest.mark.parametrize("batch", range(4))
def test_simulator_equals_model_r_on_single_level_plans(batch):
  plans = 0
  for seed in range(batch * 1000, (batch + 1) * 1000):
    rng = random.Random(seed)
    n = rng.randint(0, 14)
    chain = random_chain(rng, n, refine=seed % 2 == 1)
    p = rng.random()
    for cps in {(), tuple(range(1, n)), tuple(c for c in range(1, n) if rng.random() < p)}:
      plan = Plan(cps)
      assert simulate_peak_bytes(chain, plan) == peak_bytes(chain, plan), (seed, chain, cps)
      assert peak_bytes(chain, plan) == literal_peak_of(chain, cps)
      counts = recompute_counts(chain, plan)
      assert counts == [int(i <= max(cps, default=0)) for i in range(1, n + 1)]
      assert recompute_flops(chain, plan) == literal_recompute_flops(chain.flops, cps)
      plans += 1
  assert plans > 2000


def test_simulator_equals_model_r_on_every_plan_of_small_chains():
  for seed in range(300):
    rng = random.Random(10**6 + seed)
    n = rng.randint(1, 7)
    chain = random_chain(rng, n, refine=seed % 2 == 0)
    for k in range(n):
      for cps in itertools.combinations(range(1, n), k):
        assert simulate_peak_bytes(chain, Plan(cps)) == peak_bytes(chain, Plan(cps))


def test_simulator_on_nested_plans_equals_the_literal_leaf_formula():
  checked = 0
  for seed in range(120):
    rng = random.Random(2 * 10**6 + seed)
    n = rng.randint(3, 6)
    chain = random_chain(rng, n, refine=seed % 2 == 0)
    plans = all_nested_plans(n)
    for plan in rng.sample(plans, min(len(plans), 60)):
      assert simulate_peak_bytes(chain, plan) == literal_nested_peak(chain, plan), (chain, plan)
      assert recompute_counts(chain, plan) == literal_counts(plan, n)
      assert recompute_flops(chain, plan) == sum(
          k * f for k, f in zip(literal_counts(plan, n), chain.flops))
      checked += 1
  assert checked > 3000


def test_recompute_counts_by_hand():
  chain = Chain([1] * 7, [1] * 6, flops=[1, 10, 100, 1000, 10**4, 10**5])
  # Top level (0, 4], (4, 6]; (0, 4] split at 2 with (0, 2] split at 1; (4, 6] split at 5.
  plan = Plan((4,), inner=((0, Plan((2,), inner=((0, Plan((1,))),))), (4, Plan((5,)))))
  # Layer 1 reruns in (0, 4], (0, 2] and (0, 1]; layer 2 in (0, 4] and (0, 2]; layers 3, 4
  # in (0, 4]; layer 5 in (4, 5] (the last part (4, 6] is not recomputed); layer 6 never.
  assert recompute_counts(chain, plan) == [3, 2, 1, 1, 1, 0]
  assert recompute_flops(chain, plan) == 3 + 20 + 100 + 1000 + 10**4
  # A split of the last segment is the same as a further top-level checkpoint.
  flat = Plan((4, 5), inner=((0, Plan((2,), inner=((0, Plan((1,))),))),))
  assert recompute_counts(chain, flat) == recompute_counts(chain, plan)
  assert simulate_peak_bytes(chain, flat) == simulate_peak_bytes(chain, plan)


def test_simulator_by_hand_on_the_worked_example():
  # x_3 kept; (0, 3] recomputed keeping x_2; (0, 2] recomputed keeping x_1.
  plan = Plan((3,), inner=((0, Plan((2,), inner=((0, Plan((1,))),))),))
  # Leaves (held; top layer): (3, 4] (x_0, x_3; 3 + g_4 + g_3) = 3 + 6 = 9;
  # (2, 3] (x_0, x_2; 3 + g_3 + g_2) = 3 + 7 = 10; (1, 2] (x_0, x_1) = 3 + 7 = 10;
  # (0, 1] (x_0; 3 + g_1 + g_0) = 1 + 6 = 7.
  assert simulate_peak_bytes(WORKED, plan) == 10
  assert recompute_counts(WORKED, plan) == [3, 2, 1, 0]


def test_simulator_chain_of_zero_layers_and_errors():
  assert simulate_peak_bytes(Chain([5], [], cot_bytes=[3]), Plan(())) == 8
  assert recompute_counts(Chain([5], []), Plan(())) == []
  with pytest.raises(InvalidPlanError, match=r"out of range"):
    simulate_peak_bytes(WORKED, Plan((4,)))
  with pytest.raises(InvalidPlanError, match=r"outside the segment"):
    simulate_peak_bytes(WORKED, Plan((2,), inner=((0, Plan((3,))),)))
  with pytest.raises(InvalidPlanError, match=r"segments start at"):
    recompute_counts(WORKED, Plan((2,), inner=((1, Plan(())),)))


# --- the solver -------------------------------------------------------------------------


def test_registered():
  assert SOLVERS["multilevel"] is _multilevel.solve_multilevel
  assert solve(WORKED, "multilevel").method == "multilevel"


def test_worked_example_goes_below_the_single_level_optimum():
  plan = solve(WORKED, "multilevel")
  assert simulate_peak_bytes(WORKED, plan) == 10 < 11 == peak_bytes(WORKED, solve(WORKED))
  assert plan.is_nested


def test_constructed_chain_strictly_below_the_single_level_optimum():
  # b = 10 each, x_1 and x_2 of 5 bytes, no cotangents. Single level: {} 30, {1} 25,
  # {2} 20, {1, 2} 20 (x_1 stays held while (2, 3] runs). Nested: keep x_2 at the top,
  # split the recomputed (0, 2] at 1, so x_1 only exists after x_2 is freed: 15.
  chain = Chain([0, 5, 5, 0], [10, 10, 10], cot_bytes=[0] * 4, flops=[1, 1, 1])
  assert min(peak_bytes(chain, Plan(c)) for c in [(), (1,), (2,), (1, 2)]) == 20
  plan = solve(chain, "multilevel")
  assert plan == Plan((2,), method="multilevel", inner=((0, Plan((1,))),))
  assert simulate_peak_bytes(chain, plan) == 15
  assert recompute_counts(chain, plan) == [2, 1, 0]
  assert recompute_flops(chain, plan) == 3


def check_solution(chain: Chain, plan: Plan) -> tuple[int, int]:
  """Asserts the multilevel invariants; returns (peak, recomputed FLOPs)."""
  assert plan.method == "multilevel"
  peak = simulate_peak_bytes(chain, plan)
  assert peak == literal_nested_peak(chain, plan)
  single = peak_bytes(chain, solve(chain, "optimal"))
  assert peak <= single
  flops = recompute_flops(chain, plan)
  if peak == single:  # never recomputes more than the best single-level plan at that peak
    assert flops <= recompute_flops(chain, solve(chain, "budget", budget_bytes=single))
  if chain.n >= 2:  # the recursion's value is the simulated peak of the plan it returns
    assert peak == chain.act_bytes[0] + _multilevel._Tables(chain).least
  return peak, flops


@pytest.mark.parametrize("batch", range(4))
def test_never_above_single_level_and_equals_the_simulator(batch):
  below = 0
  for seed in range(batch * 750, (batch + 1) * 750):
    rng = random.Random(3 * 10**6 + seed)
    chain = random_chain(rng, rng.randint(1, 12), refine=seed % 2 == 1)
    peak, _ = check_solution(chain, solve(chain, "multilevel"))
    below += peak < peak_bytes(chain, solve(chain, "optimal"))
  assert below > 50  # nesting often helps


@pytest.mark.parametrize("batch", range(8))
def test_least_peak_then_least_recompute_over_every_nested_plan(batch):
  for seed in range(batch * 100, (batch + 1) * 100):
    rng = random.Random(4 * 10**6 + seed)
    n = rng.choice((1, 2, 3, 4, 5, 5, 6, 6, 6, 6)) if seed % 40 else 7
    chain = random_chain(rng, n, refine=seed % 2 == 0)
    best = min((literal_nested_peak(chain, p), recompute_flops(chain, p), checkpoint_count(p))
               for p in all_nested_plans(n))
    plan = solve(chain, "multilevel")
    got = (simulate_peak_bytes(chain, plan), recompute_flops(chain, plan),
           checkpoint_count(plan))
    assert got == best, (seed, chain, plan, best)


def literal_least(chain: Chain) -> tuple[int, tuple[int, int]]:
  """``P(0, n)`` and ``T(0, n, P(0, n))`` (FLOPs, checkpoints) by the plain recursions
  of the solver's docstring, memoised on ``(l, r, beta)``, without bounds or pruning."""
  n, a, f = chain.n, chain.act_bytes, chain.flops

  @functools.cache
  def seg(l, r):  # S(l, r) from the literal model-R leaf formula with nothing else held
    return literal_nested_peak(
        Chain([0] * (r - l + 1), chain.res_bytes[l:r], cot_bytes=chain.cot_bytes[l:r + 1],
              input_res_bytes=chain.input_res_bytes[l:r],
              workspace_bytes=chain.workspace_bytes[l:r]), Plan(()))

  @functools.cache
  def least_peak(l, r):
    return min([seg(l, r)] + [max(least_peak(l, m), a[m] + least_peak(m, r))
                              for m in range(l + 1, r)])

  @functools.cache
  def least_recompute(l, r, beta):
    if seg(l, r) <= beta:
      return (0, 0)
    options = [(sum(f[l:m]) + x[0] + y[0], 1 + x[1] + y[1])
               for m in range(l + 1, r)
               if least_peak(l, m) <= beta and least_peak(m, r) <= beta - a[m]
               for x, y in [(least_recompute(l, m, beta), least_recompute(m, r, beta - a[m]))]]
    return min(options)

  return least_peak(0, n), least_recompute(0, n, least_peak(0, n))


def test_search_equals_the_plain_recursions():
  for seed in range(300):
    rng = random.Random(8 * 10**6 + seed)
    n = rng.randint(2, 14)
    chain = random_chain(rng, n, refine=seed % 2 == 1)
    peak, (flops, count) = literal_least(chain)
    plan = solve(chain, "multilevel")
    assert simulate_peak_bytes(chain, plan) == chain.act_bytes[0] + peak
    assert (recompute_flops(chain, plan), checkpoint_count(plan)) == (flops, count), seed


def test_fallback_keeps_the_least_peak(monkeypatch):
  monkeypatch.setattr(_multilevel, "SEARCH_STEPS", 0)
  for seed in range(400):
    rng = random.Random(5 * 10**6 + seed)
    n = rng.randint(1, 30)
    chain = random_chain(rng, n, refine=seed % 2 == 1)
    plan = solve(chain, "multilevel")
    check_solution(chain, plan)
    if n >= 2:  # the rollout is never worse than solving every sub-problem on its own
      tab = _multilevel._Tables(chain)
      got = (recompute_flops(chain, plan), checkpoint_count(plan))
      assert got <= (tab.flops[0][n], tab.count[0][n])
      if n <= 12:
        assert got >= literal_least(chain)[1]


def test_plans_are_flattened():
  # A split last part is a further checkpoint at its level: no inner plan of any level
  # has an entry for its last segment.
  for seed in range(300):
    rng = random.Random(6 * 10**6 + seed)
    n = rng.randint(1, 30)
    chain = random_chain(rng, n, refine=True)
    todo = [(0, n, solve(chain, "multilevel"))]
    while todo:
      l, r, plan = todo.pop()
      last = plan.checkpoints[-1] if plan.checkpoints else l
      assert last not in dict(plan.inner)
      bounds = (l, *plan.checkpoints, r)
      stops = dict(zip(bounds[:-1], bounds[1:]))
      todo += [(s, stops[s], sub) for s, sub in plan.inner]
      assert all(sub.checkpoints and sub.method == "" for _, sub in plan.inner)


def test_uniform_chain_nests_deeply():
  # Unit bytes everywhere: the least peak keeps x_0 and one or two more buffers, by
  # recomputing almost everything from x_0 again and again (about n^2 / 2 layer runs).
  n = 400
  chain = Chain([1] * (n + 1), [1] * n, flops=[1] * n)
  plan = solve(chain, "multilevel")
  assert simulate_peak_bytes(chain, plan) == 5 < peak_bytes(chain, solve(chain, "optimal"))
  assert depth(plan) > 100
  assert recompute_flops(chain, plan) == sum(recompute_counts(chain, plan))


def test_huge_byte_counts_use_exact_integers():
  rng = random.Random(7)
  for _ in range(20):
    n = rng.randint(2, 9)
    chain = Chain([rng.choice((0, 2**62, 3 * 2**61)) for _ in range(n + 1)],
                  [rng.choice((1, 2**62, 2**63)) for _ in range(n)],
                  flops=[rng.choice((0, 2**62)) for _ in range(n)])
    check_solution(chain, solve(chain, "multilevel"))


def test_small_chains_and_limit():
  assert solve(Chain([1], []), "multilevel") == Plan((), method="multilevel")
  assert solve(Chain([4, 4], [4]), "multilevel") == Plan((), method="multilevel")
  limit = _multilevel.MAX_LAYERS
  assert limit == 400
  with pytest.raises(ChainTooLongError, match=r"at most 400 layers; this chain has 401"):
    solve(Chain([1] * (limit + 2), [1] * (limit + 1)), "multilevel")


def test_deterministic():
  rng = random.Random(8)
  for _ in range(30):
    chain = random_chain(rng, rng.randint(1, 40), refine=True)
    assert solve(chain, "multilevel") == solve(chain, "multilevel")
