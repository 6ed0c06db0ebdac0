"""Chen et al. 2016's greedy planner with its search over the per-segment budget."""

from __future__ import annotations

import math

from jaxremat._model.chain import Chain, Plan, peak_bytes, recompute_flops

NUM_GUESSES = 3  # memonger's ``nbegin``: the threshold is re-guessed from each plan
NUM_TRIALS = 6  # memonger's ``ntrial``: grid steps after the guesses


def greedy_plan(chain: Chain, threshold_bytes: int) -> tuple[tuple[int, ...], int, int]:
  """One greedy pass: keep ``x_i`` once the running segment exceeds the threshold.

  The running segment size is the residual bytes ``b_t`` of its layers, the bytes a
  segment holds while it is recomputed for its backward (in Chen's fine-grained graph
  this is the sum of the intermediate outputs). Only ``x_1..x_{n-1}`` can be kept.

  Args:
    chain: the per-layer byte counts.
    threshold_bytes: the budget ``B`` per segment (bytes); a segment whose size
      exceeds it is closed by keeping its last output.

  Returns:
    ``(checkpoints, kept_bytes, largest_segment_bytes)``: the plan, the activation
    bytes it keeps, and the largest closed segment's size (memonger's ``save_size``
    and ``max_size``).
  """
  b, a = chain.res_bytes, chain.act_bytes
  cps = []
  local = kept = largest = 0
  for i in range(1, chain.n):
    local += b[i - 1]
    if local > threshold_bytes:
      cps.append(i)
      kept += a[i]
      largest = max(largest, local)
      local = 0
  return tuple(cps), kept, largest


def solve_chen_greedy(chain: Chain) -> Plan:
  """Chen et al. 2016's greedy plan, with the threshold search of their ``memonger``.

  The threshold starts at 0 (every layer with residuals is kept). Each of the first
  ``NUM_GUESSES`` plans yields the next guess ``floor(sqrt(kept * largest / 2))``, the
  balance point of the sqrt(n) analysis; then ``NUM_TRIALS`` thresholds are tried on an
  even grid from the smallest ``largest`` seen up to ``sqrt(2)`` times the last guess.
  Of all plans tried, the one with the least model-R ``peak_bytes`` is kept (ties: the
  least recomputed FLOPs, then the first tried). Everything is in exact integer bytes,
  where memonger rounds to MiB.

  References:
    Chen, Xu, Zhang, Guestrin 2016, "Training Deep Nets with Sublinear Memory Cost"
    (arXiv:1604.06174), Algorithm 3 and Section 4.3; ``search_plan`` and
    ``make_mirror_plan`` in github.com/dmlc/mxnet-memonger.
  """
  tried: list[tuple[int, ...]] = []
  threshold = 0
  min_threshold = None
  for _ in range(NUM_GUESSES):
    cps, kept, largest = greedy_plan(chain, threshold)
    tried.append(cps)
    min_threshold = largest if min_threshold is None else min(min_threshold, largest)
    threshold = math.isqrt(kept * largest // 2)
  max_threshold = math.isqrt(2 * threshold * threshold)  # floor(sqrt(2) * threshold)
  step = (max_threshold - min_threshold) // NUM_TRIALS
  if step > 0:
    threshold = min_threshold + step
    for _ in range(NUM_TRIALS):
      tried.append(greedy_plan(chain, threshold)[0])
      threshold += step
  best_key, best = None, ()
  for cps in tried:
    plan = Plan(cps, method="chen-greedy")
    key = (peak_bytes(chain, plan), recompute_flops(chain, plan))
    if best_key is None or key < best_key:
      best_key, best = key, cps
  return Plan(best, method="chen-greedy")
