"""The policy-plan DP against exhaustive search (issue 24): same least time, within budget."""

import random

import pytest

from jaxremat._errors import InfeasibleBudgetError
from jaxremat._model.policy_plan import (DOTS, KEEP, NAMES, RECOMPUTE, Group, GroupCost,
                                         Option, PolicyPlan, peak_bytes)
from jaxremat.solvers._policy import (as_plan, brute_policy, least_peak, policy_frontier,
                                      solve_policy)


def random_costs(rng: random.Random, n: int) -> list[GroupCost]:
  """Per layer: keep (stores its residuals, no time), recompute (stores its input, costs
  its forward), dots (between the two); and multi-layer recompute groups."""
  act = [rng.randint(1, 20) for _ in range(n + 1)]
  res = [rng.randint(1, 40) for _ in range(n)]
  fwd = [rng.uniform(0.1, 3.0) for _ in range(n)]
  costs = []
  for i in range(n):
    costs.append(GroupCost(Group(i, i + 1, Option(KEEP)), res[i], rng.randint(0, 5), 0.0))
    costs.append(GroupCost(Group(i, i + 1, Option(RECOMPUTE)), act[i], res[i], fwd[i]))
    half = rng.randint(0, res[i])
    costs.append(GroupCost(Group(i, i + 1, Option(DOTS)), act[i] + half, res[i] - half,
                           fwd[i] * rng.uniform(0.05, 0.5)))
    for j in range(i + 2, n + 1):
      costs.append(GroupCost(Group(i, j, Option(RECOMPUTE)), act[i], sum(res[i:j]),
                             sum(fwd[i:j])))
  return costs


@pytest.mark.parametrize("seed", range(40))
def test_dp_matches_brute_force(seed):
  rng = random.Random(seed)
  n = rng.randint(1, 6)
  costs = random_costs(rng, n)
  final = rng.randint(0, 10)
  hi = sum(c.stored_bytes + c.transient_bytes for c in costs if c.group.option.kind == KEEP)
  for budget in (rng.randint(0, hi + final), hi + final, rng.randint(0, 60)):
    want = brute_policy(costs, n, budget, final)
    if want is None:
      with pytest.raises(InfeasibleBudgetError) as err:
        solve_policy(costs, n, budget, final)
      assert err.value.min_feasible_bytes > budget
      continue
    got = solve_policy(costs, n, budget, final)
    as_plan(got).validate(n)
    assert peak_bytes(got, final) <= budget
    assert sum(c.seconds for c in got) == pytest.approx(sum(c.seconds for c in want))


def test_least_peak_is_the_brute_least():
  rng = random.Random(7)
  for _ in range(10):
    n = rng.randint(1, 5)
    costs = random_costs(rng, n)
    least = least_peak(costs, n, 3)
    assert brute_policy(costs, n, least, 3) is not None
    assert brute_policy(costs, n, least - 1, 3) is None


def test_frontier_is_monotone_and_undominated():
  rng = random.Random(3)
  costs = random_costs(rng, 6)
  front = policy_frontier(costs, 6, 2)
  assert len(front) >= 2
  for (b0, s0, _), (b1, s1, _) in zip(front, front[1:]):
    assert b0 < b1 and s0 > s1
  for peak, seconds, groups in front:
    assert peak_bytes(groups, 2) == peak
    assert sum(c.seconds for c in groups) == pytest.approx(seconds)


@pytest.mark.parametrize("seed", range(10))
def test_frontier_ends_at_the_fastest_plan(seed):
  """With bytes large enough that the DP counts them in rounded-up quanta, the frontier
  still ends at the least time exhaustive search finds (a user's trial: the chosen plan
  was missing from it)."""
  rng = random.Random(seed)
  n = rng.randint(2, 5)
  scale = 10**6 + rng.randint(0, 999)
  costs = [GroupCost(c.group, c.stored_bytes * scale + rng.randint(0, 999),
                     c.transient_bytes * scale, c.seconds) for c in random_costs(rng, n)]
  fastest = brute_policy(costs, n, sum(c.stored_bytes + c.transient_bytes for c in costs), 0)
  front = policy_frontier(costs, n, 0)
  assert front[-1][1] == pytest.approx(sum(c.seconds for c in fastest))


def test_groups_are_checked():
  with pytest.raises(Exception, match="recomputed as a whole"):
    Group(0, 2, Option(KEEP))
  with pytest.raises(Exception, match="takes no saved"):
    Option(DOTS, saved=frozenset({1}))
  with pytest.raises(Exception, match="cover"):
    PolicyPlan((Group(0, 1, Option(KEEP)),)).validate(2)
  assert "names(2 saved)" in Option(NAMES, saved=frozenset({1, 2})).describe()


def test_a_printed_plan_lists_its_groups():
  plan = PolicyPlan((Group(0, 2, Option(RECOMPUTE)), Group(2, 3, Option(DOTS))))
  assert str(plan) == "layers 1-2: recompute\nlayer 3: dots"
