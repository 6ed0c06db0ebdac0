"""Wall time per stage of ``apply`` (trace, profile, solve, compile, emit)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class Stopwatch:
  """Wall time per stage (seconds); a stage entered inside another pauses the outer one."""

  def __init__(self) -> None:
    self.seconds: dict[str, float] = {}
    self._running: list[tuple[str, float]] = []

  @contextlib.contextmanager
  def __call__(self, stage: str) -> Iterator[None]:
    now = time.perf_counter()
    if self._running:
      outer, since = self._running[-1]
      self.seconds[outer] = self.seconds.get(outer, 0.0) + now - since
    self._running.append((stage, now))
    try:
      yield
    finally:
      end = time.perf_counter()
      _, since = self._running.pop()
      self.seconds[stage] = self.seconds.get(stage, 0.0) + end - since
      if self._running:
        self._running[-1] = (self._running[-1][0], end)
