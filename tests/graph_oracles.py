"""Oracles for graph chains: model G replayed buffer by buffer, and random graph chains."""

from __future__ import annotations

import random

from jaxremat._model.graph import GraphChain


class _Memory:
  def __init__(self):
    self.live: dict[tuple, int] = {}
    self.total = self.peak = 0

  def alloc(self, key, size):
    assert key not in self.live, key
    self.live[key] = size
    self.total += size
    self.peak = max(self.peak, self.total)

  def free(self, key):
    self.total -= self.live.pop(key)


def simulate_graph_peak(graph: GraphChain, checkpoints) -> int:
  """One training step under ``checkpoints``, event by event (the model G oracle).

  Buffers: ("x", v) a kept value, ("s", v) a value a unit saves for its backward,
  ("p", t) unit t's other residuals, ("w", t) its workspace, ("g", v) the cotangent of v.
  Forward: the batch values are held; each checkpointed segment leaves the values
  crossing its end cut held; the last segment leaves its residuals. Backward, last
  segment first: a checkpointed segment first recomputes its residuals; unit i's
  backward holds its workspace and starts the cotangents of the values it is the last
  reader of; when it ends, the cotangents of the values it made, its workspace and its
  residuals (a saved value shared with an earlier unit of the segment stays) go. After
  a segment, kept values that no earlier segment's start cut still needs are freed.
  """
  n, m = graph.n, len(graph.value_bytes)
  size, cot = graph.value_bytes, graph.value_cot_bytes

  def crossing(k):
    return {v for v in range(m) if graph.defined[v] <= k < graph.last_use[v]}

  kept = [0, *checkpoints]
  bounds = [0, *checkpoints, n]
  segments = list(zip(bounds[:-1], bounds[1:]))
  mem = _Memory()

  def residuals(l, r):
    for t in range(l + 1, r + 1):
      mem.alloc(("p", t), graph.res_bytes[t - 1])
      for v in graph.saved[t - 1]:
        if ("x", v) not in mem.live and ("s", v) not in mem.live:
          mem.alloc(("s", v), size[v])

  for v in crossing(0):
    mem.alloc(("x", v), size[v])
  for j, (l, r) in enumerate(segments):
    if j < len(segments) - 1:
      for v in crossing(r):
        if ("x", v) not in mem.live:
          mem.alloc(("x", v), size[v])
    else:
      residuals(l, r)
  for v in crossing(n):
    mem.alloc(("g", v), cot[v])
  for j in range(len(segments) - 1, -1, -1):
    l, r = segments[j]
    if j < len(segments) - 1:
      residuals(l, r)
    for i in range(r, l, -1):
      mem.alloc(("w", i), graph.workspace_bytes[i - 1])
      for v in crossing(i - 1) - crossing(i):
        mem.alloc(("g", v), cot[v])
      mem.free(("w", i))
      for v in crossing(i) - crossing(i - 1):
        mem.free(("g", v))
      mem.free(("p", i))
      for v in graph.saved[i - 1]:
        first = min(t for t in range(l + 1, r + 1) if v in graph.saved[t - 1])
        if first == i and ("s", v) in mem.live:
          mem.free(("s", v))
    needed = set().union(*(crossing(k) for k in kept if k < l)) if j > 0 else set()
    for key in [k for k in mem.live if k[0] == "x" and k[1] not in needed]:
      if j > 0:
        mem.free(key)
  rest = set(mem.live)
  assert rest <= {("x", v) for v in crossing(0)} | {("g", v) for v in crossing(0)}, rest
  return mem.peak


def random_graph(rng: random.Random, n: int) -> GraphChain:
  """A random graph chain: skips of every length, shared saved values, zero sizes, ties."""
  pool = rng.choice([[0, 1], [1, 2, 3], list(range(10)), [0, 5, 5, 100]])
  defined, last = [], []
  for _ in range(rng.randint(1, 2)):  # batch values
    defined.append(0)
    last.append(rng.randint(1, n))
  for t in range(1, n + 1):
    for _ in range(rng.choice((1, 1, 2))):
      defined.append(t)
      last.append(rng.choice([min(t + 1, n + 1), rng.randint(t + 1, n + 1)]))
  m = len(defined)
  saved = []
  for t in range(1, n + 1):
    touch = [v for v in range(m) if defined[v] <= t <= last[v]]
    saved.append(rng.sample(touch, rng.randint(0, min(3, len(touch)))))
  return GraphChain(
      value_bytes=[rng.choice(pool) for _ in range(m)],
      value_cot_bytes=[0 if d == 0 else rng.choice(pool) for d in defined],
      defined=defined, last_use=last, saved=saved,
      res_bytes=[rng.choice(pool) for _ in range(n)],
      workspace_bytes=[rng.choice(pool) for _ in range(n)],
      flops=[rng.choice((0, 1, 3)) for _ in range(n)])
