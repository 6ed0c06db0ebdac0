"""Exact model-G optimum for graph chains (skip tensors), an O(n^2) DP over kept cuts."""

from __future__ import annotations

import itertools
import math

from jaxremat._model.chain import Plan
from jaxremat._errors import ChainTooLongError, InfeasibleBudgetError, UnknownMethodError
from jaxremat._model.graph import GraphChain, graph_peak_bytes, graph_recompute_flops
from jaxremat.solvers._baselines import uniform_plan
from jaxremat.solvers._brute import MAX_LAYERS


def _segment_terms(graph: GraphChain) -> tuple[list[list[int]], list[list[int]]]:
  """``L[l][r - l - 1]`` and ``D[l][r - l - 1]`` (bytes) for every ``0 <= l < r <= n``.

  ``L(l, r)``: segment ``(l, r]``'s peak above the kept values ``H_l``;
  ``D(l, r)``: bytes of ``{v : l < def(v) <= r < use(v)}``, what keeping ``r`` adds
  to the kept values when the previous kept cut is ``l``.
  """
  n = graph.n
  size, made, last = graph.value_bytes, graph.defined, graph.last_use
  grads = [0] * (n + 2)  # cot(C_{i-1} U C_i): values with def <= i <= use
  for v, (d, u) in enumerate(zip(made, last)):
    lo, hi = max(d, 1), min(u, n)
    if lo <= hi:
      grads[lo] += graph.value_cot_bytes[v]
      grads[hi + 1] -= graph.value_cot_bytes[v]
  grads = list(itertools.accumulate(grads))
  by_def = [[] for _ in range(n + 2)]
  by_last = [[] for _ in range(n + 2)]
  for v, (d, u) in enumerate(zip(made, last)):
    by_def[d].append(v)
    by_last[u].append(v)
  big_l, big_d = [], []
  for l in range(n):
    seen: set[int] = set()
    saved = private = best = held_new = 0
    row_l, row_d = [], []
    for r in range(l + 1, n + 1):
      for v in graph.saved[r - 1]:
        if made[v] > l and v not in seen:  # values made before l are in C_l, kept
          seen.add(v)
          saved += size[v]
      private += graph.res_bytes[r - 1]
      best = max(best, saved + private + graph.workspace_bytes[r - 1] + grads[r])
      held_new += sum(size[v] for v in by_def[r]) - sum(size[v] for v in by_last[r] if made[v] > l)
      row_l.append(best)
      row_d.append(held_new)
    big_l.append(row_l)
    big_d.append(row_d)
  return big_l, big_d


def solve_graph_optimal(graph: GraphChain) -> Plan:
  """Minimises ``graph_peak_bytes`` exactly; among optimal plans, the least recompute.

  First pass, right to left: ``F(l) = min_{l<r<=n} max(L(l, r), D(l, r) + F(r))``
  (``D + F`` absent for ``r = n``) is the least peak, above the values kept at or
  before ``l``, of the cuts after a kept cut ``l``; the optimum is
  ``bytes(C_0) + F(0)``. It is exact because the kept values split into disjoint
  ``D`` terms over consecutive kept cuts (``_graph``'s module docstring) and ``L``
  depends on ``l`` and ``r`` only. Second pass at that peak: ``_least_recompute``.

  O(n^2 + n * (values saved + values)) time, O(n^2) memory.
  """
  n = graph.n
  if n <= 1:
    return Plan((), method="optimal")
  big_l, big_d = _segment_terms(graph)
  return Plan(_least_recompute(graph, big_l, big_d, _least_peak(graph, big_l, big_d)),
              method="optimal")


def solve_graph_budget(graph: GraphChain, budget_bytes: int) -> Plan:
  """The plan of fewest recomputed FLOPs whose ``graph_peak_bytes`` is at most ``budget_bytes``.

  Raises:
    InfeasibleBudgetError: the least peak of any plan exceeds the budget (it carries
      that peak as ``min_feasible_bytes``).
  """
  n = graph.n
  big_l, big_d = _segment_terms(graph) if n > 1 else ([], [])
  least = _least_peak(graph, big_l, big_d) if n > 1 else graph_peak_bytes(graph, Plan(()))
  if least > budget_bytes:
    raise InfeasibleBudgetError(
        f"budget_bytes={budget_bytes} is below the least model-G peak of any plan, {least} "
        "bytes.", budget_bytes=budget_bytes, min_feasible_bytes=least)
  if n <= 1:
    return Plan((), method="budget")
  return Plan(_least_recompute(graph, big_l, big_d, budget_bytes), method="budget")


def _least_peak(graph: GraphChain, big_l: list[list[int]], big_d: list[list[int]]) -> int:
  """The least model-G peak (bytes) of any plan: ``bytes(C_0) + F(0)``. Needs ``n >= 2``."""
  n = graph.n
  f = [0] * (n + 1)
  for l in range(n - 1, -1, -1):
    f[l] = min(max(big_l[l][r - l - 1], big_d[l][r - l - 1] + f[r]) if r < n else big_l[l][-1]
               for r in range(l + 1, n + 1))
  return graph.crossing_bytes(0) + f[0]


def _least_recompute(graph: GraphChain, big_l: list[list[int]], big_d: list[list[int]],
                     peak: int) -> tuple[int, ...]:
  """Kept cuts of the plan recomputing least among those peaking at most ``peak`` (bytes).

  Left to right: ``E(r)``, the least kept bytes at a kept cut ``r`` with every segment
  so far within ``peak`` (least is best: every later segment adds to it), then the
  smallest last kept cut ``c`` whose final segment fits: the plan recomputes units
  ``1..c``, the fewest FLOPs of any plan within ``peak``. Needs a plan within ``peak``.
  """
  n = graph.n
  held = [math.inf] * n
  prev = [0] * n
  held[0] = graph.crossing_bytes(0)
  for r in range(1, n):
    for l in range(r):
      if held[l] + big_l[l][r - l - 1] <= peak and held[l] + big_d[l][r - l - 1] < held[r]:
        held[r], prev[r] = held[l] + big_d[l][r - l - 1], l
  last = next(c for c in range(n) if held[c] + big_l[c][-1] <= peak)
  cps = []
  while last > 0:
    cps.append(last)
    last = prev[last]
  return tuple(reversed(cps))


def solve_graph_brute(graph: GraphChain) -> Plan:
  """Every plan tried (n <= 20): least peak, then least recompute, then fewest cuts."""
  n = graph.n
  if n > MAX_LAYERS:
    raise ChainTooLongError(
        f"method='brute' enumerates 2^(n-1) plans and accepts at most {MAX_LAYERS} units; "
        f"this graph has {n}. Use method='optimal' (exact, O(n^2)).")
  plans = [Plan(c, method="brute") for k in range(max(n, 1)) for c in itertools.combinations(range(1, n), k)]
  return min(plans, key=lambda p: (graph_peak_bytes(graph, p), graph_recompute_flops(graph, p),
                                   len(p.checkpoints)))


def solve_graph_best_uniform(graph: GraphChain) -> Plan:
  """The best checkpoint-every-k plan under model G."""
  n = graph.n
  plans = [uniform_plan(n, k, method="best-uniform") for k in range(1, max(n, 1) + 1)]
  return min(plans, key=lambda p: (graph_peak_bytes(graph, p), p.checkpoints[-1] if p.checkpoints else 0))


GRAPH_SOLVERS = {
    "optimal": solve_graph_optimal,
    "brute": solve_graph_brute,
    "none": lambda graph: Plan((), method="none"),
    "every-layer": lambda graph: Plan(tuple(range(1, graph.n)), method="every-layer"),
    "best-uniform": solve_graph_best_uniform,
}


def solve_graph(graph: GraphChain, method: str = "optimal") -> Plan:
  """Chooses the kept cuts of ``graph`` with the named method (one of ``GRAPH_SOLVERS``).

  Raises:
    UnknownMethodError: ``method`` is not a graph solver.
    TypeError: ``graph`` is not a ``GraphChain``.
  """
  if not isinstance(graph, GraphChain):
    raise TypeError(f"solve_graph expects a GraphChain, got {type(graph).__name__}.")
  if method not in GRAPH_SOLVERS:
    raise UnknownMethodError(
        f"unknown method {method!r} for a model that is not a chain of layers; expected one "
        f"of {sorted(GRAPH_SOLVERS)}.")
  return GRAPH_SOLVERS[method](graph)
