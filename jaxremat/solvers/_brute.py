"""Exhaustive search over all 2^(n-1) plans: the oracle for tests (n <= 20)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from jaxremat._model.chain import Chain, Plan, peak_bytes, recompute_flops
from jaxremat._errors import ChainTooLongError

MAX_LAYERS = 20


def exhaustive(chain: Chain, cost: Callable[[Chain, Plan], int], method: str, instead: str) -> Plan:
  """The plan of least ``cost`` over all 2^(n-1) plans; among ties, the least
  recomputed FLOPs, then the fewest checkpoints.

  Raises:
    ChainTooLongError: ``chain`` has more than ``MAX_LAYERS`` layers (the message
      suggests method ``instead``).
  """
  n = chain.n
  if n > MAX_LAYERS:
    raise ChainTooLongError(
        f"method={method!r} enumerates 2^(n-1) plans and accepts at most {MAX_LAYERS} "
        f"layers; this chain has {n}. Use {instead}.")
  best_key, best = None, Plan((), method=method)
  for mask in itertools.product((False, True), repeat=max(n - 1, 0)):
    plan = Plan(tuple(i + 1 for i, keep in enumerate(mask) if keep), method=method)
    key = (cost(chain, plan), recompute_flops(chain, plan), len(plan.checkpoints))
    if best_key is None or key < best_key:
      best_key, best = key, plan
  return best


def solve_brute(chain: Chain) -> Plan:
  """The plan of least ``peak_bytes``; among ties, the least recomputed FLOPs."""
  return exhaustive(chain, peak_bytes, "brute", "method='optimal' (exact, O(n))")
