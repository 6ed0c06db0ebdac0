"""Prefix terms of model R shared by the exact solvers."""

from __future__ import annotations

import dataclasses
import itertools
import operator

import numpy as np

from jaxremat._model.chain import Chain


@dataclasses.dataclass(frozen=True)
class Terms:
  """Model R rewritten as ``S(l, r) = max_{l<i<=r} h[i] - c[l]`` (bytes).

  ``h[i] = B_i + w_i + g_i + g_{i-1}`` for ``i = 1..n`` (``h[0]`` unused) and
  ``c[l] = B_l + e_{l+1}`` for ``l = 0..n-1``, with ``B_i = b_1 + ... + b_i``.
  A segment ``(l, r]`` then peaks at ``held(l) + S(l, r)``. ``c`` never decreases
  (``e_{l+1} <= b_{l+1}``). ``to_end[l] = S(l, n)`` for ``l = 0..n-1``: the last
  segment starting at ``l``.
  """

  h: list[int]
  c: list[int]
  to_end: list[int]


def terms(chain: Chain) -> Terms:
  """The ``Terms`` of ``chain``, exact integers (computed in int64 where none can overflow)."""
  fast = _terms_int64(chain)
  return fast if fast is not None else _terms_exact(chain)


def _terms_int64(chain: Chain) -> Terms | None:
  """``terms`` in NumPy int64, or None where a term might reach ``2**62`` bytes."""
  try:
    b = np.asarray(chain.res_bytes, dtype=np.int64)
    g = np.asarray(chain.cot_bytes, dtype=np.int64)
    e, w = _int64(chain.input_res_bytes), _int64(chain.workspace_bytes)
  except OverflowError:
    return None
  # Every term is at most this bound; its float value errs far less than 2**61 to 2**63.
  if float(b.sum(dtype=np.float64)) + 2 * float(g.max()) + float(np.max(w) + np.max(e)) >= 2**61:
    return None
  prefix = np.concatenate(([0], np.cumsum(b)))
  h = prefix[1:] + w + g[1:] + g[:-1]
  c = prefix[:-1] + e
  to_end = np.maximum.accumulate(h[::-1])[::-1] - c
  return Terms(h=[0, *h.tolist()], c=c.tolist(), to_end=to_end.tolist())


def _int64(values: tuple[int, ...]) -> np.ndarray | int:
  """``values`` as int64 (OverflowError beyond), or 0 when all are 0: nothing to add."""
  return np.asarray(values, dtype=np.int64) if any(values) else 0


def _terms_exact(chain: Chain) -> Terms:
  n = chain.n
  b, g, e, w = chain.res_bytes, chain.cot_bytes, chain.input_res_bytes, chain.workspace_bytes
  prefix = [0, *itertools.accumulate(b)]
  h = [0] + [prefix[i] + w[i - 1] + g[i] + g[i - 1] for i in range(1, n + 1)]
  c = [prefix[l] + e[l] for l in range(n)]
  to_end = list(map(operator.sub, itertools.accumulate(reversed(h[1:]), max), reversed(c)))
  return Terms(h=h, c=c, to_end=to_end[::-1])


def plan_from_choices(choice: list[int], n: int) -> tuple[int, ...]:
  """Follows ``choice[l]`` (the end of the segment starting at ``l``) from 0 to ``n``."""
  cps = []
  r = choice[0]
  while r < n:
    cps.append(r)
    r = choice[r]
  return tuple(cps)
