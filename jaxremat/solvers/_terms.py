"""Prefix terms of model R shared by the exact solvers."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from jaxremat._model.chain import Chain


@dataclasses.dataclass(frozen=True)
class Terms:
  """Model R rewritten as ``S(l, r) = max_{l<i<=r} h[i] - c[l]`` (bytes).

  ``h[i] = B_i + w_i + g_i + g_{i-1}`` for ``i = 1..n`` (``h[0]`` unused) and
  ``c[l] = B_l + e_{l+1}`` for ``l = 0..n-1``, with ``B_i = b_1 + ... + b_i``.
  A segment ``(l, r]`` then peaks at ``held(l) + S(l, r)``.
  """

  h: list[int]
  c: list[int]


def terms(chain: Chain) -> Terms:
  n = chain.n
  b, g, e, w = chain.res_bytes, chain.cot_bytes, chain.input_res_bytes, chain.workspace_bytes
  bound = sum(b) + 2 * max(g, default=0) + max(w, default=0) + max(e, default=0)
  if bound < 2**62:  # int64 cannot overflow: vectorised
    prefix = np.concatenate(([0], np.cumsum(np.asarray(b, dtype=np.int64))))
    g64 = np.asarray(g, dtype=np.int64)
    h = np.concatenate(([0], prefix[1:] + np.asarray(w, dtype=np.int64) + g64[1:] + g64[:-1]))
    c = prefix[:-1] + np.asarray(e, dtype=np.int64)
    return Terms(h=h.tolist(), c=c.tolist())
  prefix = [0, *itertools.accumulate(b)]
  h = [0] + [prefix[i] + w[i - 1] + g[i] + g[i - 1] for i in range(1, n + 1)]
  c = [prefix[l] + e[l] for l in range(n)]
  return Terms(h=h, c=c)


def plan_from_choices(choice: list[int], n: int) -> tuple[int, ...]:
  """Follows ``choice[l]`` (the end of the segment starting at ``l``) from 0 to ``n``."""
  cps = []
  r = choice[0]
  while r < n:
    cps.append(r)
    r = choice[r]
  return tuple(cps)
