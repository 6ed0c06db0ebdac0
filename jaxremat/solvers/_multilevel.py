"""Least peak over multi-level (nested ``jax.checkpoint``) plans: an O(n^3) interval DP."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from jaxremat._model.chain import Chain, Plan, peak_bytes, recompute_flops
from jaxremat._errors import ChainTooLongError
from jaxremat.solvers._budget import solve_budget
from jaxremat.solvers._optimal import solve_optimal
from jaxremat.solvers._terms import terms

MAX_LAYERS = 400
# Work allowed to the exact least-recompute search (split points and memo entries
# scanned, 0.2-0.3 s per million); past it ``_Search.rollout`` plans instead.
SEARCH_STEPS = 5_000_000
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
  part ``(m, r]``, so this is never above ``solve_optimal``. In the plan returned a
  split part ``(m, r]`` is a further checkpoint at the same level, and a split part
  ``(l, m]`` is the ``inner`` entry of the segment starting at ``l``.

  Ties: the fewest recomputed FLOPs, then the fewest checkpoints, among all nested
  plans of least peak. The part ``(l, m]`` reruns once more than its parent, so with a
  byte budget ``beta`` above the held bytes the least recomputation is
  ``T(l, r, beta) = 0`` if ``S(l, r) <= beta``, else the least over ``m`` with
  ``P(l, m) <= beta`` and ``P(m, r) <= beta - a_m`` of
  ``f_{l+1} + .. + f_m + T(l, m, beta) + T(m, r, beta - a_m)``, from
  ``T(0, n, P(0, n))``. It is searched depth first with memoisation and
  branch-and-bound, the bound being the same recursion with every node given the most
  budget it can have, ``P(0, n) - a_l`` (O(n^3), vectorised like ``P``). The budget
  takes many values when byte counts are diverse, so the search stops after
  ``SEARCH_STEPS`` (1-2 s; with 2^20 random byte counts it finishes at n = 100
  and often not at n = 200); the least peak is then kept and the ties are broken by
  ``_Search.rollout`` (O(n^2), not always the least recomputation), or by the
  single-level plan with the fewest recomputed FLOPs (``solve_budget``) when that
  peaks as low and recomputes less.

  Raises:
    ChainTooLongError: more than ``MAX_LAYERS`` (400) layers; at 400 the tables take
      about 0.6 s and the search at most 1-2 s more.
  """
  n = chain.n
  if n > MAX_LAYERS:
    raise ChainTooLongError(
        f"method='multilevel' is an O(n^3) search and accepts at most {MAX_LAYERS} layers; "
        f"this chain has {n}. Use method='optimal' (single-level, exact, O(n)).")
  if n <= 1:
    return Plan((), method="multilevel")
  tab = _Tables(chain)
  search = _Search(chain, tab, SEARCH_STEPS)
  with _recursion_room(2 * n + 50):
    try:
      return _plan(search.least(0, n, tab.least), 0, "multilevel")
    except _SearchTooLong:
      root = search.rollout(0, n, tab.least)
      least = tab.least + chain.act_bytes[0]
      if least == peak_bytes(chain, solve_optimal(chain)):
        single = solve_budget(chain, least)
        if (recompute_flops(chain, single), len(single.checkpoints)) < root.value:
          return Plan(single.checkpoints, method="multilevel")
      return _plan(root, 0, "multilevel")


class _SearchTooLong(Exception):
  pass


@contextlib.contextmanager
def _recursion_room(depth: int) -> Iterator[None]:
  """Room for ``depth`` more Python frames (nesting can be about ``n`` deep)."""
  old = sys.getrecursionlimit()
  sys.setrecursionlimit(old + depth)
  try:
    yield
  finally:
    sys.setrecursionlimit(old)


class _Tables:
  """``S``, ``P``, the search bound and a per-sub-problem tie-break, as ``[l][r]`` lists.

  Attributes:
    s, p: ``S(l, r)`` and ``P(l, r)`` (bytes above the held ones).
    bound: least FLOPs recomputed in ``(l, r]`` when it has ``P(0, n) - a_l`` bytes
      (``P(0, n)`` for ``l = 0``), the most any node starting at ``l`` can have; a
      lower bound of ``T(l, r, beta)`` for every budget ``beta`` it can be given.
    flops, count: recomputed FLOPs and checkpoints of ``(l, r]`` when every sub-problem
      is solved on its own: least ``P``, then FLOPs, then checkpoints (the estimate
      ``_Search.rollout`` plans by).
    least: ``P(0, n)``.
    prefix: ``f_1 + .. + f_i`` for ``i = 0..n`` (FLOPs).
  """

  def __init__(self, chain: Chain):
    n = chain.n
    t = terms(chain)
    act = list(chain.act_bytes)
    prefix = [0]
    for f in chain.flops:
      prefix.append(prefix[-1] + f)
    big = sum(act) + max(t.h) + max(t.c) + (n + 1) * (prefix[-1] + n) + 1
    dtype = np.int64 if 2 * big < 2**62 else object  # exact integers either way

    def full(shape, value):
      return np.full(shape, value, dtype=dtype)

    h = np.array(t.h, dtype=dtype)
    c = np.array(t.c, dtype=dtype)
    a = np.array(act, dtype=dtype)
    pf = np.array(prefix, dtype=dtype)
    s = np.zeros((n + 1, n + 1), dtype=dtype)
    for l in range(n):
      s[l, l + 1:] = np.maximum.accumulate(h[l + 1:]) - c[l]
    p = np.zeros_like(s)
    flops = np.zeros_like(s)
    count = np.zeros((n + 1, n + 1), dtype=np.int64)
    for length in range(1, n + 1):
      ls = np.arange(n - length + 1)
      rs = ls + length
      leaf = s[ls, rs]
      p[ls, rs] = leaf
      if length == 1:
        continue
      ms = ls[:, None] + np.arange(1, length)[None, :]
      rr = rs[:, None]
      split_p = np.maximum(p[ls[:, None], ms], a[ms] + p[ms, rr])
      split_f = pf[ms] - pf[ls][:, None] + flops[ls[:, None], ms] + flops[ms, rr]
      split_k = count[ls[:, None], ms] + count[ms, rr] + 1
      best_p = split_p.min(axis=1)
      tie = split_p == best_p[:, None]
      best_f = np.where(tie, split_f, full(split_f.shape, big)).min(axis=1)
      tie &= split_f == best_f[:, None]
      best_k = np.where(tie, split_k, n + 1).min(axis=1)
      split = best_p < leaf  # a leaf recomputes nothing and keeps nothing: it wins ties
      rows = ls[split]
      p[rows, rs[split]] = best_p[split]
      flops[rows, rs[split]] = best_f[split]
      count[rows, rs[split]] = best_k[split]
    least = p[0, n]
    most = least - a
    most[0] = least
    bound = full(s.shape, big)
    for length in range(1, n + 1):
      ls = np.arange(n - length + 1)
      rs = ls + length
      value = np.where(s[ls, rs] <= most[ls], full(ls.shape, 0), full(ls.shape, big))
      if length > 1:
        ms = ls[:, None] + np.arange(1, length)[None, :]
        rr = rs[:, None]
        ok = (p[ls[:, None], ms] <= most[ls][:, None]) & (p[ms, rr] <= most[ms])
        split_f = pf[ms] - pf[ls][:, None] + bound[ls[:, None], ms] + bound[ms, rr]
        value = np.minimum(value, np.where(ok, split_f, full(split_f.shape, big)).min(axis=1))
      bound[ls, rs] = value
    self.s, self.p, self.bound = s.tolist(), p.tolist(), bound.tolist()
    self.flops, self.count, self.least = flops.tolist(), count.tolist(), int(least)
    self.prefix = prefix


class _Node(NamedTuple):
  """A plan of a segment and its cost; ``pick == _LEAF`` for one segment.

  Attributes:
    value: (recomputed FLOPs, checkpoints).
    q: its peak above the held bytes (bytes).
    pick: its first inner checkpoint ``m``; ``left`` and ``right`` the plans of the
      parts before and after it.
  """

  value: tuple[int, int]
  q: int
  pick: int
  left: _Node | None
  right: _Node | None


class _Search:
  """``T(l, r, beta)`` of ``solve_multilevel`` as (FLOPs, checkpoints), memoised.

  ``T(l, r, .)`` does not increase with the budget, so a plan found best for ``beta``
  that peaks at ``q`` is best for every budget in ``[q, beta]``: the memo keeps these
  intervals per segment, and a plan found for a larger budget bounds ``T`` from below.
  """

  def __init__(self, chain: Chain, tab: _Tables, steps: int):
    self.a = chain.act_bytes
    self.tab = tab
    self.steps = steps
    self.memo: dict[tuple[int, int], list[tuple[int, _Node]]] = {}

  def leaf(self, l: int, r: int) -> _Node:
    return _Node((0, 0), self.tab.s[l][r], _LEAF, None, None)

  def lower(self, l: int, r: int, beta: int) -> tuple[int, int]:
    """A lower bound of ``T(l, r, beta)`` (exact when known); needs ``P(l, r) <= beta``."""
    if self.tab.s[l][r] <= beta:
      return (0, 0)
    low = (self.tab.bound[l][r], 1)
    known = self.memo.get((l, r), ())
    self.steps -= len(known)
    for top, node in known:
      if top >= beta and node.value > low:
        low = node.value
    return low

  def least(self, l: int, r: int, beta: int) -> _Node:
    """The plan of ``(l, r]`` of least (FLOPs, checkpoints) within ``beta``; needs ``P <= beta``."""
    tab, a, pf = self.tab, self.a, self.tab.prefix
    if tab.s[l][r] <= beta:
      return self.leaf(l, r)
    known = self.memo.setdefault((l, r), [])
    self.steps -= len(known)
    for top, node in known:
      if node.q <= beta <= top:
        return node
    self.steps -= r - l
    if self.steps < 0:
      raise _SearchTooLong
    p_l, p = tab.p[l], tab.p
    splits = []
    for m in range(l + 1, r):
      if p_l[m] <= beta and p[m][r] <= beta - a[m]:
        left, right = self.lower(l, m, beta), self.lower(m, r, beta - a[m])
        splits.append((pf[m] - pf[l] + left[0] + right[0], 1 + left[1] + right[1], m))
    splits.sort()
    best = None
    for *low, m in splits:
      if best is not None and tuple(low) >= best.value:
        break
      left = self.least(l, m, beta)
      right_low = self.lower(m, r, beta - a[m])
      cost = (pf[m] - pf[l] + left.value[0] + right_low[0], 1 + left.value[1] + right_low[1])
      if best is not None and cost >= best.value:
        continue
      right = self.least(m, r, beta - a[m])
      value = (pf[m] - pf[l] + left.value[0] + right.value[0],
               1 + left.value[1] + right.value[1])
      if best is None or value < best.value:
        best = _Node(value, max(left.q, a[m] + right.q), m, left, right)
    assert best is not None  # P(l, r) <= beta < S(l, r): some split fits
    known.append((beta, best))
    return best

  def rollout(self, l: int, r: int, beta: int) -> _Node:
    """A good plan within ``beta`` in O(n^2): each split chosen by the cost its parts
    have under the per-sub-problem tie-break (``_Tables.flops``), then the parts
    planned the same way with their own budgets; never worse than that tie-break."""
    tab, a, pf = self.tab, self.a, self.tab.prefix
    if tab.s[l][r] <= beta:
      return self.leaf(l, r)
    p_l, p, f, k = tab.p[l], tab.p, tab.flops, tab.count
    _, _, m = min((pf[m] - pf[l] + f[l][m] + f[m][r], 1 + k[l][m] + k[m][r], m)
                  for m in range(l + 1, r) if p_l[m] <= beta and p[m][r] <= beta - a[m])
    left, right = self.rollout(l, m, beta), self.rollout(m, r, beta - a[m])
    value = (pf[m] - pf[l] + left.value[0] + right.value[0], 1 + left.value[1] + right.value[1])
    return _Node(value, max(left.q, a[m] + right.q), m, left, right)


def _plan(node: _Node, l: int, method: str = "") -> Plan:
  """The ``Plan`` of a split ``node`` starting at ``l``: split right parts become further
  checkpoints at the same level, split left parts ``inner`` plans."""
  cps, inner = [], []
  while node.pick != _LEAF:
    cps.append(node.pick)
    if node.left.pick != _LEAF:
      inner.append((l, _plan(node.left, l)))
    l, node = node.pick, node.right
  return Plan(tuple(cps), method=method, inner=tuple(inner))
