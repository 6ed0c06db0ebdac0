"""Exhaustive search over all 2^(n-1) plans under model A: the oracle for ``dp`` (n <= 20)."""

from __future__ import annotations

from jaxremat._model.chain import Chain, Plan
from jaxremat.solvers._brute import exhaustive
from jaxremat.solvers._model_a import cost_a


def solve_brute_a(chain: Chain) -> Plan:
  """The plan of least ``cost_a``; among ties the least recomputed FLOPs, then fewest checkpoints.

  Raises:
    ChainTooLongError: ``chain`` has more than 20 layers.
  """
  return exhaustive(chain, cost_a, "brute-a", "method='dp' (exact for model A)")
