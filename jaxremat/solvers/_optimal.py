"""Exact model-R optimum, then least recomputation, in O(n): monotone stacks and deques."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from itertools import islice

from jaxremat._model.chain import Chain, Plan
from jaxremat.solvers._terms import Terms, plan_from_choices, terms

_INF = float("inf")
_NEG_INF = float("-inf")
# Every G(r) = a_r + F(r) for r < n and every M(l, r) - c[l] is >= 0 bytes: -1 stands for
# G(n) = -inf, and the sentinel block below the stack, (+inf, -2), is never popped.
_END = -1
_SENTINEL = -2


def solve_optimal(chain: Chain) -> Plan:
  """The plan of least ``peak_bytes`` that recomputes the fewest FLOPs, in O(n).

  Three linear passes: ``least_peak_value`` (Hong et al.'s monotone stack, right to
  left) gives the least peak ``P``; ``least_last`` (monotone deques, left to right) the
  least ``L`` such that a plan with checkpoints ``<= L`` peaks at ``P``; and
  ``least_peak_choices`` restricted to checkpoints ``<= L'`` the plan. A plan
  recomputes ``f_1 + ... + f_L`` with ``L`` its last checkpoint and no plan of peak
  ``P`` ends below ``L``, so those recomputing least are the ones with checkpoints up to
  ``L'``, the last index ``<= n-1`` with ``f_{L+1} = ... = f_{L'} = 0``. Ties among
  them go as before: the former O(n log n) binary search on ``L`` ended with this same
  restricted solve on the same ``L'``.
  """
  n = chain.n
  if n <= 1:
    return Plan((), method="optimal")
  t, a = terms(chain), chain.act_bytes
  last = cheapest_last(chain.flops, least_last(t, a, a[0] + least_peak_value(t, a)))
  return Plan(plan_from_choices(least_peak_choices(t, a, last), n), method="optimal")


def prefix_flops(chain: Chain) -> list[int]:
  """``prefix[L] = f_1 + ... + f_L`` (FLOPs), what a plan with last checkpoint ``L`` recomputes."""
  prefix = [0] * (chain.n + 1)
  for i, f in enumerate(chain.flops, start=1):
    prefix[i] = prefix[i - 1] + f
  return prefix


def least_peak_plan(chain: Chain, last: int) -> tuple[int, ...]:
  """Checkpoints of least ``peak_bytes`` among the plans whose checkpoints are all ``<= last``.

  One O(n) stack solve (``least_peak_choices``).

  Args:
    chain: the per-layer byte counts.
    last: the largest checkpoint allowed (0 or less: none).
  """
  n = chain.n
  if n <= 1:
    return ()
  choice = least_peak_choices(terms(chain), chain.act_bytes, max(0, min(last, n - 1)))
  return plan_from_choices(choice, n)


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
  n = chain.n
  if n <= 1:
    return ()
  return plan_from_choices(least_peak_choices(terms(chain), chain.act_bytes, n - 1), n)


def least_last(t: Terms, a: Sequence[int], budget_bytes: int) -> int | None:
  """The least ``L`` such that a plan with checkpoints ``<= L`` peaks at most ``budget_bytes``.

  ``_budget.least_last_checkpoint``'s left-to-right DP in O(n). ``D(r)``, the least
  held bytes over the plans of layers ``1..r`` that keep ``x_r`` and fit, is
  ``a_r + min D(l)`` over the candidates ``l < r`` whose segment fits:
  ``D(l) - c[l] + M(l, r) <= budget``. As ``r`` grows ``M(l, r)`` does not shrink, so
  a candidate that stops fitting never fits again and is dropped for good; and a
  candidate ``l`` with ``D(l) > D(l')`` for a later ``l'`` is dominated (``c[l'] >= c[l]``
  and ``M(l', r) <= M(l, r)``: ``l'`` fits whenever ``l`` does), so it is dropped as
  ``l'`` arrives. The candidates left have non-decreasing ``D`` from front to back and
  the front, once it fits, is the least ``D`` that fits. Its ``M(front, r)``
  is a running maximum; when the front goes, the next one's ``M`` is the head of a
  monotone deque of the maxima of ``h`` over ``(front, r]``, a window whose two ends
  only move right. Every index enters and leaves each deque once: O(n). The answer is
  the first ``r`` with ``D(r) + S(r, n) <= budget`` (0 for ``D(0) = a_0``).

  Args:
    t: the chain's ``terms`` (``n >= 1`` layers).
    a: ``a_0..a_n``, bytes of each activation.
    budget_bytes: the most bytes the plan may peak at (model R).

  Returns:
    ``L`` in ``0..n-1``, or None when no plan fits the budget.
  """
  h, c, to_end = t.h, t.c, t.to_end
  n = len(c)
  held = a[0]  # D(front)
  if held + to_end[0] <= budget_bytes:
    return 0
  spare = held - c[0]  # D(front) - c[front]
  top = _NEG_INF  # M(front, r)
  candidates = collections.deque([(0, held, spare)])  # (l, D(l), D(l) - c[l])
  window = collections.deque()  # indices in (front, r] of decreasing h
  for r, h_r, a_r, c_r, end in zip(range(1, n), islice(h, 1, n), islice(a, 1, n),
                                   islice(c, 1, n), islice(to_end, 1, n)):
    while window and h[window[-1]] <= h_r:
      window.pop()
    window.append(r)
    if h_r > top:
      top = h_r
    while spare + top > budget_bytes:  # the front's segment no longer fits
      candidates.popleft()
      if not candidates:
        return None
      front, held, spare = candidates[0]
      while window[0] <= front:
        window.popleft()
      top = h[window[0]]
    held_r = a_r + held
    if held_r + end <= budget_bytes:
      return r
    while candidates[-1][1] > held_r:
      candidates.pop()
    candidates.append((r, held_r, held_r - c_r))
  return None


def cheapest_last(flops: Sequence[int], last: int) -> int:
  """The last ``L'`` in ``last..n-1`` with ``f_{last+1} = ... = f_{L'} = 0``: the largest
  last checkpoint recomputing as few FLOPs as ``last``."""
  end = last
  while end < len(flops) - 1 and flops[end] == 0:
    end += 1
  return end


def least_peak_value(t: Terms, a: Sequence[int]) -> int:
  """``F(0)`` of the stack solve of ``least_peak_checkpoints`` (bytes; ``n >= 1``): the least
  peak is ``a_0 + F(0)``. ``least_peak_choices``' scan without the choices (faster)."""
  h, c = t.h, t.c
  n = len(c)
  best = t.to_end[n - 1]
  xs: list[float] = [_INF, h[n]]
  ys: list[int] = [_SENTINEL, _END]
  q = 1
  x_q, x_next, y_next = h[n], _NEG_INF, _INF
  push_x, push_y, pop_x, pop_y = xs.append, ys.append, xs.pop, ys.pop
  for x_new, a_r, cl in zip(islice(reversed(h), 1, n), islice(reversed(a), 1, n),
                            islice(reversed(c), 1, n)):
    y_new = a_r + best
    while xs[-1] <= x_new or ys[-1] >= y_new:
      y = pop_y()
      if y < y_new:
        y_new = y
      pop_x()
    push_x(x_new)
    push_y(y_new)
    top = len(xs) - 1
    if top <= q + 1:  # a pop reached block q + 1: the copies are stale
      if q >= top:
        q = top - 1 if top > 1 else 1
      x_q = xs[q]
      x_next, y_next = (xs[q + 1], ys[q + 1]) if q < top else (_NEG_INF, _INF)
    while x_next - cl >= y_next:
      q += 1
      x_q = x_next
      x_next, y_next = (xs[q + 1], ys[q + 1]) if q < top else (_NEG_INF, _INF)
    best = x_q - cl
    if y_next < best:
      best = y_next
  return best


def least_peak_choices(t: Terms, a: Sequence[int], last: int) -> list[int]:
  """The stack solve of ``least_peak_checkpoints`` over plans with checkpoints ``<= last``.

  Returns ``choice`` (``choice[l]``: the end of the segment that starts at ``l``) for
  ``plan_from_choices``. ``0 <= last <= n-1``. For ``l >= last`` only ``r = n`` is
  allowed: ``F(l) = S(l, n)``, one block ``(M(l, n), -inf, n)``, and the scan starts
  below it. This is, plan for plan, the solve of the chain with every ``x_r``,
  ``r > last``, made larger than the no-checkpoint peak (the former restriction): blocks
  whose ``G`` reaches that size never win (the bottom block is below it); they lie on top
  of the stack (``G`` increases towards the top), and a new block either pops them all
  without taking their ``G`` or leaves every block below them as it is, so those evolve
  as if they were absent.
  """
  h, c = t.h, t.c
  n = len(c)
  choice = [n] * (n + 1)
  best = t.to_end[last]
  # Blocks from far (index 0) to near: block max of h, least G, the r attaining it; a
  # sentinel block below the bottom one is never popped.
  xs: list[float] = [_INF, best + c[last]]
  ys: list[int] = [_SENTINEL, _END]
  rs: list[int] = [n, n]
  # The crossing q, the nearest block with xs[q] - c >= ys[q], and copies of blocks q and
  # q + 1 (-inf, +inf when there is none: never crossed, never better).
  q = 1
  x_q, r_q, x_next, y_next, r_next = xs[1], n, _NEG_INF, _INF, n
  push_x, push_y, push_r = xs.append, ys.append, rs.append
  pop_x, pop_y, pop_r = xs.pop, ys.pop, rs.pop
  skip = n - last  # reversed(h) and reversed(a) start at index n, reversed(c) at n - 1
  for l, r_new, x_new, a_r, cl in zip(range(last - 1, -1, -1), range(last, 0, -1),
                                      islice(reversed(h), skip, n), islice(reversed(a), skip, n),
                                      islice(reversed(c), skip, n)):
    y_new = a_r + best
    while xs[-1] <= x_new or ys[-1] >= y_new:
      y, r = pop_y(), pop_r()
      if y < y_new:  # merged into the new block
        y_new, r_new = y, r
      pop_x()
    push_x(x_new)
    push_y(y_new)
    push_r(r_new)
    top = len(xs) - 1
    if top <= q + 1:  # a pop reached block q + 1: the copies are stale
      if q >= top:
        q = top - 1 if top > 1 else 1
      x_q, r_q = xs[q], rs[q]
      x_next, y_next, r_next = (xs[q + 1], ys[q + 1], rs[q + 1]) if q < top else (
          _NEG_INF, _INF, n)
    while x_next - cl >= y_next:
      q += 1
      x_q, r_q = x_next, r_next
      x_next, y_next, r_next = (xs[q + 1], ys[q + 1], rs[q + 1]) if q < top else (
          _NEG_INF, _INF, n)
    best = x_q - cl
    if y_next < best:
      best = y_next
      choice[l] = r_next
    else:
      choice[l] = r_q
  return choice
