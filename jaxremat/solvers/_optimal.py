"""Exact model-R optimum in O(n): a monotone stack with a one-way crossing pointer.

Among the plans of least peak, the one that recomputes least (DESIGN.md's tie rule).
"""

from __future__ import annotations

import bisect

from jaxremat._model.chain import Chain, Plan, peak_bytes
from jaxremat.solvers._terms import Terms, plan_from_choices, terms

_NEG_INF = float("-inf")


def solve_optimal(chain: Chain) -> Plan:
  """The plan of least ``peak_bytes`` that recomputes the fewest FLOPs.

  One O(n) solve (``least_peak_checkpoints``) finds the least peak; plans of that peak
  differ in their last checkpoint ``L``, and so in what they recompute
  (``f_1 + ... + f_L``). ``least_recompute_checkpoints`` then finds the least such
  ``L``: one more O(n) solve when the first plan's ``L`` is already least, else a
  binary search of O(n) solves, O(n log n) in all.
  """
  if chain.n <= 1:
    return Plan((), method="optimal")
  first, peak = _least_peak(terms(chain), chain.act_bytes, chain.n)
  return Plan(least_recompute_checkpoints(chain, peak, first), method="optimal")


def prefix_flops(chain: Chain) -> list[int]:
  """``prefix[L] = f_1 + ... + f_L`` (FLOPs), what a plan with last checkpoint ``L`` recomputes."""
  prefix = [0] * (chain.n + 1)
  for i, f in enumerate(chain.flops, start=1):
    prefix[i] = prefix[i - 1] + f
  return prefix


def least_peak_plan(chain: Chain, last: int, *,
                    no_checkpoint_peak: int | None = None) -> tuple[int, ...]:
  """Checkpoints of least ``peak_bytes`` among the plans whose checkpoints are all ``<= last``.

  Keeping ``x_r`` for ``r > last`` is made never worth it by giving it more bytes than
  the plan without checkpoints peaks at (a kept ``x_r`` is live in every later segment),
  and the exact O(n) solver does the rest: O(n).

  Args:
    chain: the per-layer byte counts.
    last: the largest checkpoint allowed (0: none).
    no_checkpoint_peak: ``peak_bytes(chain, Plan(()))`` if already known (bytes).
  """
  if no_checkpoint_peak is None:
    no_checkpoint_peak = peak_bytes(chain, Plan(()))
  return _restricted(chain, terms(chain), last, no_checkpoint_peak)[0]


def _restricted(chain: Chain, t: Terms, last: int, no_checkpoint_peak: int) -> tuple[tuple[int, ...], int]:
  """``least_peak_plan`` and its peak (bytes), given the chain's ``terms``."""
  n = chain.n
  if n <= 1 or last <= 0:
    return (), no_checkpoint_peak
  act = list(chain.act_bytes)
  act[last + 1:n] = [no_checkpoint_peak + 1] * max(0, n - 1 - last)
  return _least_peak(t, act, n)


def least_recompute_checkpoints(chain: Chain, budget_bytes: int,
                                within: tuple[int, ...]) -> tuple[int, ...]:
  """Checkpoints with ``peak_bytes <= budget_bytes`` that recompute the fewest FLOPs,
  then of least peak.

  A plan recomputes ``f_1 + ... + f_L`` with ``L`` its last checkpoint, and the least
  peak over plans with checkpoints ``<= L`` does not increase with ``L``: the least
  ``L`` that fits is found by probing ``L`` below the last checkpoint of ``within`` (a
  plan known to fit), the next one down first, then by binary search. Among the plans
  recomputing just as little (checkpoints up to the last ``L'`` with the same prefix
  FLOPs), the one of least peak is returned.
  """
  n = chain.n
  most = peak_bytes(chain, Plan(()))
  prefix = prefix_flops(chain)
  t = terms(chain)

  def fits(last: int) -> tuple[int, ...] | None:
    cps, peak = _restricted(chain, t, last, most)
    return cps if peak <= budget_bytes else None

  lo, hi = 0, within[-1] if within else 0
  if most <= budget_bytes:  # no checkpoints at all fits
    hi = 0
  if hi > 0:
    below = fits(hi - 1)
    if below is None:  # within's L is already least: two solves in all
      lo = hi
    else:
      hi = below[-1] if below else 0
  while lo < hi:  # least L with a fitting plan; one fits with L = hi throughout
    mid = (lo + hi) // 2
    cps = fits(mid)
    if cps is not None:
      hi = cps[-1] if cps else 0
    else:
      lo = mid + 1
  same = bisect.bisect_right(prefix, prefix[lo], 0, max(n, 1)) - 1  # last L' <= n-1 as cheap
  return _restricted(chain, t, same, most)[0]


def least_peak_checkpoints(chain: Chain) -> tuple[int, ...]:
  """Checkpoints of a plan of least ``peak_bytes(chain, plan)``, exactly, in O(n) time.

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
  if chain.n <= 1:
    return ()
  return _least_peak(terms(chain), chain.act_bytes, chain.n)[0]


def _least_peak(t: Terms, a, n: int) -> tuple[tuple[int, ...], int]:
  """The stack solve of ``least_peak_checkpoints`` with ``a`` as the bytes of ``x_0..x_n``;
  also the least peak it reaches, ``a_0 + F(0)`` (bytes). Needs ``n >= 2``."""
  h, c = t.h, t.c
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
  return plan_from_choices(choice, n), a[0] + f[0]
