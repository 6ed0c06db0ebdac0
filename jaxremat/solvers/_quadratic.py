"""Exact model-R optimum by the O(n^2) recurrence (the reference for the O(n) solver)."""

from __future__ import annotations

import bisect

from jaxremat._model.chain import Chain, Plan, peak_bytes
from jaxremat.solvers._budget import least_last_checkpoint
from jaxremat.solvers._optimal import prefix_flops
from jaxremat.solvers._terms import plan_from_choices, terms


def solve_quadratic(chain: Chain) -> Plan:
  """Minimises ``peak_bytes`` by ``F(l) = min_r max(S(l, r), a_r + F(r))`` in O(n^2).

  ``OPT = a_0 + F(0)``; the ``a_n + F(n)`` term is absent. Ties go to the least
  recomputation, found without the O(n) solver: the least last checkpoint ``L`` of a
  plan peaking at ``OPT`` comes from the O(n^2) left-to-right DP
  (``_budget.least_last_checkpoint``), and the recurrence is solved again with the
  checkpoints after the last ``L'`` of equal prefix FLOPs made too large to keep.
  """
  n = chain.n
  first = _least_peak(chain, chain.act_bytes)
  peak = peak_bytes(chain, Plan(first))
  last = least_last_checkpoint(chain, peak)
  prefix = prefix_flops(chain)
  same = bisect.bisect_right(prefix, prefix[last], 0, max(n, 1)) - 1
  act = list(chain.act_bytes)
  too_big = peak_bytes(chain, Plan(())) + 1  # a kept x_r is live in every later segment
  act[same + 1:n] = [too_big] * max(0, n - 1 - same)
  return Plan(_least_peak(chain, act), method="quadratic")


def _least_peak(chain: Chain, act) -> tuple[int, ...]:
  """Checkpoints of least peak when ``x_r`` holds ``act[r]`` bytes; among equal values
  the farthest ``r`` wins (fewer checkpoints)."""
  n = chain.n
  t = terms(chain)
  f = [0] * (n + 1)
  choice = [n] * (n + 1)
  for l in range(n - 1, -1, -1):
    best, best_r, running = None, n, -1
    for r in range(l + 1, n + 1):
      running = max(running, t.h[r])
      value = running - t.c[l]
      if r < n:
        value = max(value, act[r] + f[r])
      if best is None or value <= best:
        best, best_r = value, r
    f[l], choice[l] = best, best_r
  return plan_from_choices(choice, n)
