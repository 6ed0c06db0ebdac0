"""Exact model-R optimum by the O(n^2) recurrence (the reference for the O(n) solver)."""

from __future__ import annotations

from jaxremat._chain import Chain, Plan
from jaxremat.solvers._terms import plan_from_choices, terms


def solve_quadratic(chain: Chain) -> Plan:
  """Minimises ``peak_bytes`` by ``F(l) = min_r max(S(l, r), a_r + F(r))`` in O(n^2).

  ``OPT = a_0 + F(0)``; the ``a_n + F(n)`` term is absent. Among equal values the
  farthest ``r`` wins (fewer checkpoints).
  """
  n = chain.n
  t = terms(chain)
  a = chain.act_bytes
  f = [0] * (n + 1)
  choice = [n] * (n + 1)
  for l in range(n - 1, -1, -1):
    best, best_r, running = None, n, -1
    for r in range(l + 1, n + 1):
      running = max(running, t.h[r])
      value = running - t.c[l]
      if r < n:
        value = max(value, a[r] + f[r])
      if best is None or value <= best:
        best, best_r = value, r
    f[l], choice[l] = best, best_r
  return Plan(plan_from_choices(choice, n), method="quadratic")
