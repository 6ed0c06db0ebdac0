"""Wall time of compiled programs (training steps, probes) on the local device (seconds)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax


def best_step_seconds(steps: Sequence[Callable[..., Any]], args: Sequence[Any],
                      rounds: int = 3, runs: int = 3) -> list[float]:
  """The least wall time (seconds) of each compiled step called on ``args``.

  Each step runs once to warm up, then the steps take turns, ``rounds`` times ``runs``
  calls each, so that a shared machine's slow spells fall on every step alike. The
  least time is kept: noise only adds to a step's time.
  """
  for step in steps:
    jax.block_until_ready(step(*args))
  best = [float("inf")] * len(steps)
  for _ in range(rounds):
    for k, step in enumerate(steps):
      for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(step(*args))
        best[k] = min(best[k], time.perf_counter() - start)
  return best
