"""Independent oracles shared by the solver and chain tests: model R written out
literally from docs/design.md, plan enumeration and seeded random chains."""

from __future__ import annotations

import bisect
import itertools
import random

from jaxremat import Chain, Plan, peak_bytes
from jaxremat.solvers._terms import plan_from_choices, terms

# Value pools for random chains: zeros, heavy ties, spread values, large byte counts.
POOLS = (
    [0],
    [5],
    [0, 1],
    [0, 0, 0, 1],
    [2, 2, 2, 2, 3],
    [0, 1, 2],
    list(range(10)),
    [0, 7, 7, 7, 100],
    [0, 1, 1000],
    [0, 2**40, 2**40 + 1, 3 * 2**40],
)


def literal_peak(a, b, g, e, w, checkpoints):
  """Model R straight from docs/design.md, 1-based: max over segments (l, r], i in (l, r].

  Live at layer i of segment (l, r]: sum of a_c over c in C ∪ {0} with c <= l, plus
  b_{l+1} + ... + b_i, less e_{l+1}, plus w_i + g_i + g_{i-1}.
  """
  n = len(b)
  b1, e1, w1 = [None, *b], [None, *e], [None, *w]  # b1[t] == b_t
  kept = [0, *checkpoints]
  bounds = [0, *checkpoints, n]
  peak = a[0] + g[0] if n == 0 else None
  for j in range(1, len(bounds)):
    l, r = bounds[j - 1], bounds[j]
    for i in range(l + 1, r + 1):
      held = sum(a[c] for c in kept if c <= l)
      res = sum(b1[t] for t in range(l + 1, i + 1)) - e1[l + 1]
      live = held + res + w1[i] + g[i] + g[i - 1]
      peak = live if peak is None else max(peak, live)
  return peak


def literal_peak_of(chain, checkpoints):
  return literal_peak(chain.act_bytes, chain.res_bytes, chain.cot_bytes, chain.input_res_bytes,
                      chain.workspace_bytes, checkpoints)


def literal_recompute_flops(flops, checkpoints):
  """Layers 1..c_k (every non-final segment) run twice: the sum of their flops."""
  last = max(checkpoints, default=0)
  return sum(flops[t - 1] for t in range(1, last + 1))


def all_plans(n):
  """Every subset of ``1..n-1`` as an increasing tuple (one empty plan when n <= 1)."""
  return [cps for k in range(max(n, 1)) for cps in itertools.combinations(range(1, n), k)]


def random_chain(rng: random.Random, n: int, refine: bool, flop_pool=(0, 1, 1, 3, 10),
                 flop_pools=None) -> Chain:
  """A chain of ``n`` layers with values from one random pool (plus refinements).

  With ``flop_pools``, the FLOPs come from one of them, drawn right after the byte pool.
  """
  pool = rng.choice(POOLS)
  if flop_pools is not None:
    flop_pool = rng.choice(flop_pools)
  a = [rng.choice(pool) for _ in range(n + 1)]
  b = [rng.choice(pool) for _ in range(n)]
  flops = [rng.choice(flop_pool) for _ in range(n)]
  if not refine:
    return Chain(a, b, flops=flops)
  return Chain(
      a, b,
      cot_bytes=[rng.choice(pool) for _ in range(n + 1)],
      input_res_bytes=[rng.choice((0, x, rng.randint(0, x))) for x in b],
      workspace_bytes=[rng.choice(pool) for _ in range(n)],
      flops=flops)


# --- the O(n log n) tie-break search that "optimal" and "budget" used before issue 25 --------
# Kept verbatim in substance: plans must stay identical to what it returned.


def former_stack_solve(chain, act):
  """Hong et al.'s stack solve with ``act`` as the bytes of ``x_0..x_n`` (n >= 2):
  the plan's checkpoints and its peak ``act[0] + F(0)``."""
  n = chain.n
  t = terms(chain)
  h, c = t.h, t.c
  xs, ys, rs = [], [], []
  f = [0] * (n + 1)
  choice = [n] * (n + 1)
  q = 0
  for l in range(n - 1, -1, -1):
    r_new = l + 1
    x_new = h[r_new]
    y_new = float("-inf") if r_new == n else act[r_new] + f[r_new]
    while xs and (xs[-1] <= x_new or ys[-1] >= y_new):
      if xs[-1] <= x_new and ys[-1] < y_new:
        y_new, r_new = ys[-1], rs[-1]
      xs.pop()
      ys.pop()
      rs.pop()
    xs.append(x_new)
    ys.append(y_new)
    rs.append(r_new)
    top = len(xs) - 1
    if q > top - 1:
      q = top - 1 if top > 0 else 0
    while q < top and xs[q + 1] - c[l] >= ys[q + 1]:
      q += 1
    best, best_r = xs[q] - c[l], rs[q]
    if q < top and ys[q + 1] < best:
      best, best_r = ys[q + 1], rs[q + 1]
    f[l], choice[l] = best, best_r
  return plan_from_choices(choice, n), act[0] + f[0]


def former_restricted(chain, last):
  """Least-peak checkpoints ``<= last``: later ``x_r`` made larger than the no-checkpoint peak."""
  n = chain.n
  if n <= 1 or last <= 0:
    return (), peak_bytes(chain, Plan(()))
  act = list(chain.act_bytes)
  act[last + 1:n] = [peak_bytes(chain, Plan(())) + 1] * max(0, n - 1 - last)
  return former_stack_solve(chain, act)


def former_least_recompute(chain, budget, within):
  """The binary search on the last checkpoint, from a fitting plan ``within``."""
  n = chain.n
  prefix = [0, *itertools.accumulate(chain.flops)]

  def fits(last):
    cps, peak = former_restricted(chain, last)
    return cps if peak <= budget else None

  lo, hi = 0, within[-1] if within else 0
  if peak_bytes(chain, Plan(())) <= budget:
    hi = 0
  if hi > 0:
    below = fits(hi - 1)
    if below is None:
      lo = hi
    else:
      hi = below[-1] if below else 0
  while lo < hi:
    mid = (lo + hi) // 2
    cps = fits(mid)
    if cps is not None:
      hi = cps[-1] if cps else 0
    else:
      lo = mid + 1
  same = bisect.bisect_right(prefix, prefix[lo], 0, max(n, 1)) - 1
  return former_restricted(chain, same)[0]


def former_optimal(chain):
  """Checkpoints ``solve(chain, "optimal")`` returned before issue 25."""
  if chain.n <= 1:
    return ()
  first, peak = former_stack_solve(chain, chain.act_bytes)
  return former_least_recompute(chain, peak, first)


def former_budget(chain, budget):
  """Checkpoints ``solve(chain, "budget", budget_bytes=budget)`` returned before issue 25
  (an int budget), or None where it raised for an infeasible budget."""
  if chain.n <= 1:
    return () if literal_peak_of(chain, ()) <= budget else None
  first, peak = former_stack_solve(chain, chain.act_bytes)
  return former_least_recompute(chain, budget, first) if budget >= peak else None
