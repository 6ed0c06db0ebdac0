"""Hong et al.'s exact program for model A, with branch-and-bound on the largest segment."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from jaxremat._model.chain import Chain, Plan


def least_checkpoint_sum(act_bytes: Sequence[int],
                         max_interior: int) -> tuple[int, tuple[int, ...]]:
  """Least ``sum_{c in C u {0, n}} d_c`` over plans whose segment interiors are <= ``max_interior``.

  With ``S_k = d_1 + ... + d_k`` the interior of segment ``(l, r]`` is
  ``S_{r-1} - S_l``; ``G(0) = d_0`` and ``G(r) = d_r + min G(l)`` over the ``l < r``
  with ``S_{r-1} - S_l <= max_interior``. Those ``l`` form a window whose left end only
  moves right as ``r`` grows (``d >= 0``), so a monotone deque of ``G`` gives each
  ``G(r)`` in amortised O(1): O(n) in all.

  Args:
    act_bytes: ``d_0..d_n`` (bytes), all non-negative.
    max_interior: the largest interior allowed, ``M >= 0`` (bytes).

  Returns:
    ``(G(n), checkpoints)``: the least kept sum (bytes) and a plan attaining it.
  """
  d = act_bytes
  n = len(d) - 1
  prefix = [0] * (n + 1)
  for k in range(1, n + 1):
    prefix[k] = prefix[k - 1] + d[k]
  g = [0] * (n + 1)
  back = [0] * (n + 1)
  g[0] = d[0]
  window = collections.deque([0])
  lo = 0
  for r in range(1, n + 1):
    need = prefix[r - 1] - max_interior  # feasible l: prefix[l] >= need
    while prefix[lo] < need:
      lo += 1
    while window[0] < lo:
      window.popleft()
    best = window[0]
    g[r] = d[r] + g[best]
    back[r] = best
    while window and g[window[-1]] >= g[r]:
      window.pop()
    window.append(r)
  cps = []
  r = back[n]
  while r > 0:
    cps.append(r)
    r = back[r]
  return g[n], tuple(reversed(cps))


def _largest_interior(act_bytes: Sequence[int], checkpoints: tuple[int, ...]) -> int:
  bounds = (0, *checkpoints, len(act_bytes) - 1)
  return max(sum(act_bytes[l + 1:r]) for l, r in zip(bounds[:-1], bounds[1:]))


def solve_dp(chain: Chain) -> Plan:
  """Minimises ``cost_a(chain, plan)`` (model A) exactly.

  Hong et al.'s program: for every candidate largest interior ``M`` (the O(n^2)
  segment sums) the least kept sum ``G_M`` is an O(n) sliding-window DP
  (``least_checkpoint_sum``), and the optimum is ``min_M M + G_M``: O(n^3) in all.
  Here ``M`` ranges over the integers ``0..d_1 + ... + d_{n-1}`` instead, searched by
  branch and bound, which is exact because ``G_M`` does not increase with ``M``:

  - the plan found at ``M`` has largest interior ``m <= M`` and costs ``m + G_M``, and
    ``G`` is constant on ``[m, M]``, so that whole range is settled by one DP;
  - on an unsettled range ``[lo, hi]`` with ``G_M >= g`` known, every ``M`` costs at
    least ``lo + g``; the range is dropped once that reaches the best cost found.

  Ranges are split at their midpoint and the O(n^2) candidate list is never built.
  Random chains of 1,000 layers take tens to a few hundred DPs (tens of milliseconds);
  the worst case is O(log(sum d)) DPs per candidate. Among plans of equal cost the
  first one found is kept (deterministic).

  References:
    Hong et al. 2025, "GPU Memory Usage Optimization for Backward Propagation in Deep
    Network Training", JPDC (arXiv:2502.12499), Section 3 (model A).
  """
  n = chain.n
  if n <= 1:
    return Plan((), method="dp")
  d = chain.act_bytes
  top = sum(d[1:n])
  g_top, best_plan = least_checkpoint_sum(d, top)
  best = _largest_interior(d, best_plan) + g_top
  # Unsettled ranges of M, each with a lower bound on G over it.
  ranges = [(0, _largest_interior(d, best_plan) - 1, g_top)]
  while ranges:
    lo, hi, g_low = ranges.pop()
    if lo > hi or lo + g_low >= best:
      continue
    mid = (lo + hi) // 2
    g_mid, cps = least_checkpoint_sum(d, mid)
    m = _largest_interior(d, cps)
    if m + g_mid < best:
      best, best_plan = m + g_mid, cps
    # Smaller M last on the stack, so it is explored first.
    ranges.append((mid + 1, hi, g_low))
    ranges.append((lo, m - 1, g_mid))
  return Plan(best_plan, method="dp")
