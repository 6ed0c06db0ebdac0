"""Baseline plans a user would otherwise pick: none, every layer, Chen's sqrt(n), uniform."""

from __future__ import annotations

import math

from jaxremat._model.chain import Chain, Plan, peak_bytes


def solve_none(chain: Chain) -> Plan:
  """No checkpoints: one segment, nothing recomputed."""
  return Plan((), method="none")


def solve_every_layer(chain: Chain) -> Plan:
  """Every layer output kept: each layer is its own rematerialised segment."""
  return Plan(tuple(range(1, chain.n)), method="every-layer")


def uniform_plan(n: int, k: int, method: str = "uniform") -> Plan:
  """Checkpoints every ``k`` layers: ``k, 2k, ...`` below ``n``."""
  if k < 1:
    raise ValueError(f"segment length k must be >= 1, got {k}.")
  return Plan(tuple(range(k, n, k)), method=method)


def solve_sqrt(chain: Chain) -> Plan:
  """Chen et al. 2016: segments of ``ceil(sqrt(n))`` layers.

  References:
    Chen, Xu, Zhang, Guestrin 2016, "Training Deep Nets with Sublinear Memory Cost"
    (arXiv:1604.06174).
  """
  return uniform_plan(chain.n, max(1, math.ceil(math.sqrt(chain.n))), method="sqrt")


def solve_best_uniform(chain: Chain) -> Plan:
  """The best uniform segmentation under model R: every ``k`` tried, least peak kept."""
  n = chain.n
  plans = [uniform_plan(n, k, method="best-uniform") for k in range(1, max(n, 1) + 1)]
  return min(plans, key=lambda p: (peak_bytes(chain, p), p.checkpoints[-1] if p.checkpoints else 0))
