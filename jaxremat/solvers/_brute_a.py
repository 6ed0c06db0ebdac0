"""Exhaustive search over all 2^(n-1) plans under model A: the oracle for ``dp`` (n <= 20)."""

from __future__ import annotations

import itertools

from jaxremat._chain import Chain, Plan, recompute_flops
from jaxremat._errors import ChainTooLongError
from jaxremat.solvers._model_a import cost_a

MAX_LAYERS = 20


def solve_brute_a(chain: Chain) -> Plan:
  """The plan of least ``cost_a``; among ties the least recomputed FLOPs, then fewest checkpoints.

  Raises:
    ChainTooLongError: ``chain`` has more than 20 layers.
  """
  n = chain.n
  if n > MAX_LAYERS:
    raise ChainTooLongError(
        f"method='brute-a' enumerates 2^(n-1) plans and accepts at most {MAX_LAYERS} "
        f"layers; this chain has {n}. Use method='dp' (exact for model A).")
  best_key, best = None, Plan((), method="brute-a")
  for mask in itertools.product((False, True), repeat=max(n - 1, 0)):
    plan = Plan(tuple(i + 1 for i, keep in enumerate(mask) if keep), method="brute-a")
    key = (cost_a(chain, plan), recompute_flops(chain, plan), len(plan.checkpoints))
    if best_key is None or key < best_key:
      best_key, best = key, plan
  return best
