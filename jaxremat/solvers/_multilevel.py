"""Least peak over multi-level (nested ``jax.checkpoint``) plans: an O(n^3) interval DP."""

from __future__ import annotations

import numpy as np

from jaxremat._chain import Chain, Plan, peak_bytes, recompute_flops
from jaxremat._errors import ChainTooLongError
from jaxremat.solvers._budget import solve_budget
from jaxremat.solvers._optimal import solve_optimal
from jaxremat.solvers._terms import terms

MAX_LAYERS = 400
_LEAF = -1


def solve_multilevel(chain: Chain) -> Plan:
  """The nested plan of least simulated peak (``simulate_peak_bytes``), in O(n^3).

  A node ``(l, r]`` whose input ``x_l`` is held either runs as one segment (a leaf:
  all its residuals kept, peak ``S(l, r)`` above the held bytes, see ``_terms``) or is
  split at its first inner checkpoint ``m``: the part ``(m, r]`` runs its backward
  first with ``x_m`` held as well, then ``(l, m]`` is recomputed from ``x_l`` and runs
  its backward after ``x_m`` was freed. Either part may be split again, so the least
  peak above the held bytes is

      P(l, r) = min( S(l, r), min_{l<m<r} max(P(l, m), a_m + P(m, r)) )

  and the answer peaks at ``a_0 + P(0, n)``. A single-level plan only ever splits the
  part ``(m, r]``, so this is never above ``solve_optimal``. The split part ``(m, r]``
  is a further checkpoint at the same level; a split part ``(l, m]`` becomes the
  plan's ``inner`` entry for the segment starting at ``l``.

  The part ``(l, m]`` reruns once more than its parent, so the recomputed FLOPs obey
  ``R(l, r) = R(l, m) + R(m, r) + f_{l+1} + .. + f_m`` (a leaf: 0). Ties in ``P`` are
  broken by the least ``R``, then the fewest checkpoints, within each sub-problem;
  when no nested plan beats the single-level optimum, the single-level plan with the
  fewest recomputed FLOPs at that peak (``solve_budget``) is returned if it recomputes
  less. Each length of segment is one vectorised NumPy step over all starts.

  Raises:
    ChainTooLongError: more than ``MAX_LAYERS`` (400) layers, about 3 s of work.
  """
  n = chain.n
  if n > MAX_LAYERS:
    raise ChainTooLongError(
        f"method='multilevel' is an O(n^3) search and accepts at most {MAX_LAYERS} layers; "
        f"this chain has {n}. Use method='optimal' (single-level, exact, O(n)).")
  if n <= 1:
    return Plan((), method="multilevel")
  choice, least, flops, count = _tables(chain)
  cps, inner = _node(choice, 0, n)
  nested = Plan(cps, method="multilevel", inner=inner)
  if least == peak_bytes(chain, solve_optimal(chain)):
    single = solve_budget(chain, least)
    key = (recompute_flops(chain, single), len(single.checkpoints))
    if key < (flops, count):
      return Plan(single.checkpoints, method="multilevel")
  return nested


def _tables(chain: Chain) -> tuple[np.ndarray, int, int, int]:
  """Fills ``P``, ``R`` and the split count for every ``(l, l + L]``, shortest first.

  Returns:
    ``choice[l, L]``: the first inner checkpoint of the best plan for ``(l, l + L]``
    (``_LEAF`` for none); then for ``(0, n]`` the peak ``a_0 + P(0, n)`` (bytes), the
    recomputed FLOPs and the checkpoint count.
  """
  n = chain.n
  t = terms(chain)
  act = list(chain.act_bytes)
  prefix = [0]
  for f in chain.flops:
    prefix.append(prefix[-1] + f)
  bound = sum(act) + max(t.h) + max(t.c) + (n + 1) * prefix[-1] + n
  dtype = np.int64 if bound < 2**62 else object
  h = np.array(t.h, dtype=dtype)
  c = np.array(t.c, dtype=dtype)
  a = np.array(act, dtype=dtype)
  pf = np.array(prefix, dtype=dtype)
  # Tables indexed [l, L] for the segment (l, l + L].
  peak = np.zeros((n + 1, n + 1), dtype=dtype)
  flops = np.zeros((n + 1, n + 1), dtype=dtype)
  count = np.zeros((n + 1, n + 1), dtype=np.int64)
  choice = np.full((n + 1, n + 1), _LEAF, dtype=np.int64)
  hmax = h[1:].copy()  # hmax[l] = max(h[l + 1 .. l + L]) for the current L
  for length in range(1, n + 1):
    ls = np.arange(n - length + 1)
    if length > 1:
      hmax = np.maximum(hmax[:-1], h[length:])
    leaf = hmax - c[:n - length + 1]
    peak[ls, length] = leaf
    if length == 1:
      continue
    d = np.arange(1, length)
    ms = ls[:, None] + d[None, :]
    rest = length - d
    left_p, right_p = peak[ls, 1:length], peak[ms, rest]
    split_p = np.maximum(left_p, a[ms] + right_p)
    split_f = pf[ms] - pf[ls][:, None] + flops[ls, 1:length] + flops[ms, rest]
    split_k = count[ls, 1:length] + count[ms, rest] + 1
    # Least (peak, flops, count) per row; among full ties the farthest m.
    best_p = split_p.min(axis=1)
    tie = split_p == best_p[:, None]
    best_f = np.where(tie, split_f, split_f.max() + 1).min(axis=1)
    tie &= split_f == best_f[:, None]
    best_k = np.where(tie, split_k, split_k.max() + 1).min(axis=1)
    tie &= split_k == best_k[:, None]
    pick = length - 2 - np.argmax(tie[:, ::-1], axis=1)
    split = best_p < leaf  # a leaf recomputes nothing and keeps no checkpoint: it wins ties
    rows = ls[split]
    peak[rows, length] = best_p[split]
    flops[rows, length] = best_f[split]
    count[rows, length] = best_k[split]
    choice[rows, length] = rows + 1 + pick[split]
  return choice, int(a[0] + peak[0, n]), int(flops[0, n]), int(count[0, n])


def _node(choice: np.ndarray, l: int, r: int) -> tuple[tuple[int, ...], tuple[tuple[int, Plan], ...]]:
  """Checkpoints and ``inner`` of the best plan for ``(l, r]``, right splits flattened."""
  cps, inner = [], []
  start = l
  while (m := int(choice[start, r - start])) != _LEAF:
    cps.append(m)
    if choice[start, m - start] != _LEAF:
      sub_cps, sub_inner = _node(choice, start, m)
      inner.append((start, Plan(sub_cps, inner=sub_inner)))
    start = m
  return tuple(cps), tuple(inner)
