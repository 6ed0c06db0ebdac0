"""Exact model-R optimum in O(n): a monotone stack with a one-way crossing pointer."""

from __future__ import annotations

from jaxremat._chain import Chain, Plan
from jaxremat.solvers._terms import plan_from_choices, terms

_NEG_INF = float("-inf")


def solve_optimal(chain: Chain) -> Plan:
  """Minimises ``peak_bytes(chain, plan)`` exactly, in O(n) time.

  The recurrence is ``F(l) = min_{l<r<=n} max(M(l, r) - c[l], G(r))`` with
  ``M(l, r) = max_{l<i<=r} h[i]``, ``G(r) = a_r + F(r)`` and ``G(n) = -inf``
  (see ``_terms.Terms``). Scanning ``l`` from right to left, candidate ends ``r`` are
  grouped into blocks of equal ``M``; a block whose least ``G`` is not below that of a
  nearer block (smaller ``M``) can never win and is dropped. The surviving blocks, from
  far to near, have decreasing ``M`` and increasing ``G``, so ``max(M - c, G)`` is
  unimodal over them. As ``l`` decreases ``c[l]`` does not increase (it needs
  ``0 <= e_{l+1} <= b_{l+1}``, which ``Chain`` enforces), so the crossing only moves
  towards the near end: amortised O(1) per layer.

  References:
    Hong et al. 2025, "GPU Memory Usage Optimization for Backward Propagation in Deep
    Network Training", JPDC (arXiv:2502.12499).
  """
  n = chain.n
  if n <= 1:
    return Plan((), method="optimal")
  t = terms(chain)
  h, c, a = t.h, t.c, chain.act_bytes
  # Blocks from far (index 0) to near: block max of h, least G, the r attaining it.
  xs: list[float] = []
  ys: list[float] = []
  rs: list[int] = []
  f = [0] * (n + 1)
  choice = [n] * (n + 1)
  q = 0  # crossing: the nearest block with xs[q] - c >= ys[q]
  push_x, push_y, push_r = xs.append, ys.append, rs.append
  pop_x, pop_y, pop_r = xs.pop, ys.pop, rs.pop
  for l in range(n - 1, -1, -1):
    r_new = l + 1
    x_new = h[r_new]
    y_new = _NEG_INF if r_new == n else a[r_new] + f[r_new]
    while xs and (xs[-1] <= x_new or ys[-1] >= y_new):
      if xs[-1] <= x_new and ys[-1] < y_new:  # merged into the new block
        y_new, r_new = ys[-1], rs[-1]
      pop_x()
      pop_y()
      pop_r()
    push_x(x_new)
    push_y(y_new)
    push_r(r_new)
    cl = c[l]
    top = len(xs) - 1
    if q > top - 1:
      q = top - 1 if top > 0 else 0
    while q < top and xs[q + 1] - cl >= ys[q + 1]:
      q += 1
    best = xs[q] - cl
    best_r = rs[q]
    if q < top and ys[q + 1] < best:
      best = ys[q + 1]
      best_r = rs[q + 1]
    f[l] = best
    choice[l] = best_r
  return Plan(plan_from_choices(choice, n), method="optimal")
