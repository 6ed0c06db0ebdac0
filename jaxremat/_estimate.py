"""Estimate XLA's temp bytes for a plan: model R's live buffers, less those XLA can host
in parameter-gradient buffers that are not yet written."""

from __future__ import annotations

import bisect

from jaxremat._chain import Chain, Plan
from jaxremat._profile import Buffers


def estimate_temp_bytes(chain: Chain, buffers: Buffers, plan: Plan) -> int:
  """Peak temp bytes of the gradient step under ``plan``, as XLA is expected to lay it out.

  Walks the backward pass as model R does: at layer ``i`` of segment ``(l, r]`` the
  held checkpoints ``x_c`` (``0 < c <= l``), the residual buffers of layers
  ``l+1..i``, the cotangents ``g_i``, ``g_{i-1}`` and the workspace ``w_i`` are live.
  XLA's buffer assignment may place a live buffer in the output buffer of a parameter
  gradient that is written later (a layer ``j < i``, and before the buffer dies); each
  gradient buffer holds one live buffer, which must fit. Buffers are hosted greedily,
  largest first, each in the smallest gradient buffer that fits. The batch ``x_0`` is
  an argument, not temp.
  """
  n = chain.n
  grads = sorted((size, j) for j in range(1, n + 1) for size in buffers.param_grads[j - 1])
  peak = 0
  held: list[tuple[int, int]] = []  # (bytes, hostable in gradients of layers <= this)
  for l, r in plan.segments(n):
    if l > 0:
      held.append((chain.act_bytes[l], l))
    seg: list[tuple[int, int]] = []
    for i in range(l + 1, r + 1):
      seg += [(size, i - 1) for size in buffers.residuals[i - 1]]
      if i > l + 1:
        seg += [(size, i - 1) for size in buffers.inputs[i - 1]]
      transient = [(chain.cot_bytes[i], i - 1), (chain.cot_bytes[i - 1], i - 1),
                   (chain.workspace_bytes[i - 1], i - 1)]
      live = [b for b in (*held, *seg, *transient) if b[0] > 0]
      peak = max(peak, _unhosted_bytes(live, grads, written_from=i))
  return peak


def _unhosted_bytes(live: list[tuple[int, int]], grads: list[tuple[int, int]], written_from: int) -> int:
  free = [g for g in grads if g[1] < written_from]
  sizes = [g[0] for g in free]
  used = [False] * len(free)
  total = 0
  for size, limit in sorted(live, reverse=True):
    k = bisect.bisect_left(sizes, size)
    while k < len(free) and (used[k] or free[k][1] > limit):
      k += 1
    if k < len(free):
      used[k] = True
    else:
      total += size
  return total
