"""Wall time of compiled programs (training steps, probes) on the local device (seconds)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

ROUNDS, RUNS = 3, 3  # turns the steps take, calls of each step per turn


def step_seconds(steps: Sequence[Callable[..., Any]], args: Sequence[Any],
                 rounds: int = ROUNDS, runs: int = RUNS) -> list[list[float]]:
  """The wall times (seconds) of ``rounds * runs`` calls of each compiled step on ``args``.

  Each step runs once to warm up, then the steps take turns, ``rounds`` times ``runs``
  calls each, so that a shared machine's slow spells fall on every step alike.
  """
  for step in steps:
    jax.block_until_ready(step(*args))
  times: list[list[float]] = [[] for _ in steps]
  for _ in range(rounds):
    for k, step in enumerate(steps):
      for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(step(*args))
        times[k].append(time.perf_counter() - start)
  return times


def best_step_seconds(steps: Sequence[Callable[..., Any]], args: Sequence[Any],
                      rounds: int = ROUNDS, runs: int = RUNS) -> list[float]:
  """The least wall time (seconds) of each compiled step, of ``step_seconds``' calls:
  noise only adds to a step's time."""
  return [min(t) for t in step_seconds(steps, args, rounds, runs)]


def spread(times: Sequence[float]) -> float:
  """How far a step's median time is above its least (a share): differences between
  steps' least times below it are within the machine's noise."""
  ordered = sorted(times)
  return ordered[len(ordered) // 2] / ordered[0] - 1


#: Step times within this share of the fastest (and within its noise) are a tie.
TIE = 0.02


def ranked(times: Sequence[Sequence[float]], footprints: Sequence[int]) -> list[int]:
  """The timed steps' indices, the one to return first: of the steps whose least time is
  at most the fastest one's median run and within ``TIE`` of its least (a tie within this
  machine's noise), the one of least footprint (bytes), so that reruns agree more often
  and the tie goes to memory; then the others by least time."""
  least = [min(t) for t in times]
  fastest = sorted(times[min(range(len(times)), key=least.__getitem__)])
  tie = min(fastest[len(fastest) // 2], fastest[0] * (1 + TIE))
  tied = [k for k in range(len(times)) if least[k] <= tie]
  first = min(tied, key=lambda k: (footprints[k], least[k]))
  return [first, *sorted((k for k in range(len(times)) if k != first), key=least.__getitem__)]
