"""refine: the local search over checkpoint toggles, with and without a lower bound."""

import random

import pytest

from jaxremat._backends.refine import refine
from jaxremat._model.chain import Plan


def _table(rng: random.Random, n: int):
  """A made-up prediction per plan (bytes), fixed per plan, and its recompute."""
  memo: dict[tuple[int, ...], int] = {}

  def predicted(plan: Plan) -> int:
    return memo.setdefault(plan.checkpoints, rng.randrange(1000, 1100))

  return predicted, lambda plan: sum(plan.checkpoints)


@pytest.mark.parametrize("seed", range(40))
def test_a_lower_bound_skips_plans_and_changes_nothing(seed):
  rng = random.Random(seed)
  n = rng.randint(2, 9)
  predicted, flops = _table(rng, n)
  start = Plan(tuple(sorted(rng.sample(range(1, n), rng.randint(0, n - 1)))), method="optimal")
  slack = {}  # a lower bound: the prediction less a made-up gap, 0 for some plans
  bound = lambda p: predicted(p) - slack.setdefault(p.checkpoints, rng.choice([0, 0, 5, 50]))
  asked = []

  def counted(p):
    asked.append(p.checkpoints)
    return predicted(p)

  plain = refine(n, start, predicted, flops)
  bounded = refine(n, start, counted, flops, least_bytes=bound)
  assert bounded == plain
  unbounded_asks = []
  refine(n, start, lambda p: unbounded_asks.append(p) or predicted(p), flops)
  assert len(asked) <= len(unbounded_asks)


def test_plans_the_bound_puts_above_the_best_are_not_predicted():
  n = 8
  predicted = lambda p: 1000 + 10 * len(p.checkpoints)  # the fewer checkpoints the better
  asked = []
  result = refine(n, Plan((2, 4, 6), method="optimal"),
                  lambda p: asked.append(p.checkpoints) or predicted(p), lambda p: 0,
                  least_bytes=predicted)
  assert result.checkpoints == ()
  # every plan with more checkpoints than the best so far is passed over unpredicted
  assert all(len(c) <= 3 for c in asked) and len(asked) < n + 2 * (n - 1)
