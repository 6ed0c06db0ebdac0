"""Memory model A (Hong et al.'s first model; Chen 2016, Feng & Huang 2021): the cost function."""

from __future__ import annotations

from jaxremat._model.chain import Chain, Plan, validate_plan


def cost_a(chain: Chain, plan: Plan) -> int:
  """Model-A cost of ``plan`` in bytes, with ``d_i = act_bytes[i]``.

  ``cost_A(C) = sum_{c in C u {0, n}} d_c + max over segments (l, r] of sum_{l<t<r} d_t``:
  every kept activation (the input ``x_0`` and the output ``x_n`` included) plus the
  largest segment interior, the activations recomputed at once during a backward.
  Residual, cotangent, workspace and input-residual bytes are not part of model A.

  Args:
    chain: the per-layer byte counts; only ``act_bytes`` is read.
    plan: checkpoints in ``1..n-1``.

  Returns:
    The cost in bytes. A chain of no layers costs ``d_0``.

  Raises:
    InvalidPlanError: a checkpoint is out of range for ``chain``.
  """
  n = chain.n
  d = chain.act_bytes
  if n == 0:
    return d[0]
  validate_plan(plan, n)
  bounds = (0, *plan.checkpoints, n)
  kept = sum(d[c] for c in bounds)
  interior = max(sum(d[l + 1:r]) for l, r in zip(bounds[:-1], bounds[1:]))
  return kept + interior
