"""The frontier of peak bytes against recomputed FLOPs: every plan no other plan beats on both."""

from __future__ import annotations

import bisect

from jaxremat._model.chain import Chain, Plan, peak_bytes, recompute_flops
from jaxremat._errors import InvalidArgumentError
from jaxremat.solvers._optimal import least_peak_plan, prefix_flops


def pareto(chain: Chain) -> list[tuple[int, int, Plan]]:
  """The Pareto frontier of ``(peak_bytes, recompute_flops)`` over all plans of ``chain``.

  A plan recomputes ``f_1 + ... + f_L`` with ``L`` its last checkpoint, so the frontier
  is walked from the most recomputation down: for a FLOP level ``F`` the least peak is
  that of the plans whose checkpoints lie up to the last ``L`` with
  ``f_1 + ... + f_L <= F`` (``least_peak_plan``, O(n)); the plan found sets the next
  level just below its own FLOPs. At most two solves per FLOP level visited: O(n^2)
  in the worst case.

  Args:
    chain: the per-layer byte counts and FLOPs.

  Returns:
    ``(peak_bytes, recompute_flops, plan)`` triples, sorted by increasing peak (bytes)
    and so by decreasing recomputed FLOPs; no triple is dominated by any plan. Each
    plan is the one ``solve(chain, "budget", budget_bytes=peak)`` returns, with
    ``method="budget"``. The first triple has the least peak of all plans and the last
    one recomputes the fewest FLOPs.

  Raises:
    InvalidArgumentError: (a TypeError) ``chain`` is not a ``Chain``.
  """
  if not isinstance(chain, Chain):
    raise InvalidArgumentError(f"pareto expects a jaxremat.Chain, got {type(chain).__name__}.")
  n = chain.n
  prefix = prefix_flops(chain)
  hi = max(n, 1)  # last checkpoints range over 0..n-1
  level = prefix[hi - 1]
  found: list[tuple[int, int, Plan]] = []
  while True:
    last = bisect.bisect_right(prefix, level, 0, hi) - 1
    plan = Plan(least_peak_plan(chain, last), method="budget")
    flops = recompute_flops(chain, plan)
    if flops < level:  # same peak reachable at a lower level: settle the level there first
      level = flops
      continue
    found.append((peak_bytes(chain, plan), flops, plan))
    if flops == 0:
      break
    level = flops - 1
  # Levels were visited from most to fewest FLOPs with non-decreasing peaks; of equal
  # peaks only the cheapest (the last) is on the frontier.
  found.reverse()
  frontier: list[tuple[int, int, Plan]] = []
  for point in found:
    if not frontier or point[0] < frontier[-1][0]:
      frontier.append(point)
  frontier.reverse()
  return frontier
