"""Independent oracles shared by the solver and chain tests: model R written out
literally from DESIGN.md, plan enumeration and seeded random chains."""

from __future__ import annotations

import itertools
import random

from jaxremat import Chain

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
  """Model R straight from DESIGN.md, 1-based: max over segments (l, r], i in (l, r].

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
