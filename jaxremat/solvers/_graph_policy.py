"""The fastest plan of a graph of layers within a byte budget, with options per segment.

Model G (``_model.graph``) cuts a graph at kept cuts; every segment but the last is
recomputed from the values crossing its first cut. Here a segment may instead run under
an option (a JAX checkpoint policy; for a segment of one unit, also no remat): it holds
``kept_bytes`` more from its forward until its backward and adds ``seconds`` (not its
recompute's) to the step. Its backward's peak is the segment's ``L`` either way: every
residual exists then, kept or recomputed. So, left to right over kept cuts, a plan's
state at cut ``r`` is what it holds (the crossing values kept so far, each once, and the
options' bytes) and its seconds; a segment ``(l, r]`` may follow when ``held + L(l, r)``
is within the budget. What may follow a state depends on its held bytes alone, so
keeping each cut's Pareto set of held bytes and seconds makes the DP exact in seconds.
The last segment keeps its residuals.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from jaxremat._errors import InfeasibleBudgetError, InvalidArgumentError
from jaxremat._model.graph import GraphChain
from jaxremat._model.policy_plan import KEEP, RECOMPUTE, Group, Option, PolicyPlan
from jaxremat.solvers._graph import _least_peak, _segment_terms


@dataclasses.dataclass(frozen=True)
class SegmentOption:
  """An option for the segment of ``length`` units from where it is given.

  Attributes:
    option: what it keeps (``KEEP``: every residual; a segment of one unit only).
    kept_bytes: bytes it holds from its forward until its backward beyond the values
      crossing its cuts (bytes).
    seconds: the time its recompute adds to the step (seconds).
    length: how many units the segment runs.
  """

  option: Option
  kept_bytes: int
  seconds: float
  length: int = 1

  def __post_init__(self):
    Group(0, self.length, self.option)  # checks the option may run so many units


_DTYPES = (np.int64, np.float64, np.int64, np.int64, np.int64, np.int64, np.bool_)


@dataclasses.dataclass
class _States:
  """States at one cut, as arrays: held bytes, seconds, peak so far, and the way back
  (previous cut, index of its state there, option index into that unit's options, -1
  for a segment recomputed whole); ``after_keep``: the last segment was a unit kept."""

  held: np.ndarray
  seconds: np.ndarray
  peak: np.ndarray
  back_cut: np.ndarray
  back_state: np.ndarray
  back_option: np.ndarray
  after_keep: np.ndarray

  @classmethod
  def joined(cls, parts: list[_States]) -> _States:
    return cls(*(np.concatenate([getattr(p, f.name) for p in parts])
                 for f in dataclasses.fields(cls)))

  def take(self, index: np.ndarray) -> _States:
    return _States(*(getattr(self, f.name)[index] for f in dataclasses.fields(self)))


def solve_graph_policy(graph: GraphChain, options: Sequence[Sequence[SegmentOption]],
                       recompute_seconds: Sequence[float], budget_bytes: int
                       ) -> tuple[PolicyPlan, int, float]:
  """The plan of least seconds whose model-G peak is within ``budget_bytes`` (among states
  of equal held bytes and seconds, the one peaking least is kept; a plan of equal seconds
  that peaks less may still be passed over).

  Args:
    graph: the units and their values.
    options: per unit ``1..n``, the options of the segments it starts (recomputed
      whole is always one, at the sum of ``recompute_seconds``; an option may recompute
      a segment for less).
    recompute_seconds: per unit, the time recomputing it adds (seconds).
    budget_bytes: the peak allowed (model G's bytes: the batch ``C_0`` included).

  Returns:
    ``(plan, peak bytes, seconds)``: the groups (segments recomputed whole or under an
    option, the last segment's units kept).

  Raises:
    InfeasibleBudgetError: the least model-G peak of any plan exceeds the budget; it is
      ``min_feasible_bytes``.
  """
  n = graph.n
  if len(options) != n or len(recompute_seconds) != n:
    raise InvalidArgumentError(f"options and recompute_seconds need one entry per unit ({n}); "
                               f"got {len(options)} and {len(recompute_seconds)}.")
  big_l, big_d = _segment_terms(graph)
  before = [0.0, *itertools.accumulate(recompute_seconds)]
  start = graph.crossing_bytes(0)
  by_stop: list[dict[int, list[int]]] = [{} for _ in range(n)]  # unit, stop: option indices
  for l, unit in enumerate(options):
    for j, o in enumerate(unit):
      by_stop[l].setdefault(l + o.length, []).append(j)
  incoming: list[list[_States]] = [[] for _ in range(n)]
  incoming[0].append(_States(*(np.array([v], dtype=t) for v, t in zip(
      (start, 0.0, start, -1, -1, -1, False), _DTYPES))))
  states: list[_States] = []
  for l in range(n):
    if not incoming[l]:  # no plan within the budget keeps this cut
      incoming[l].append(_States(*(np.array([], dtype=t) for t in _DTYPES)))
    found = _States.joined(incoming[l])
    # apart: a state after a kept unit may not end the plan, so it prunes no other
    front = _States.joined([found.take(_pareto(found, found.after_keep == flag))
                            for flag in (False, True)])
    states.append(at := front.take(np.argsort(front.held, kind="stable")))
    for r in range(l + 1, n):  # L(l, r) grows with r: stop once no state can go on
      live_limit = budget_bytes - big_l[l][r - l - 1]
      count = int(np.searchsorted(at.held, live_limit, side="right"))
      if count == 0:
        break
      held, seconds = at.held[:count], at.seconds[:count]
      peak = np.maximum(at.peak[:count], held + big_l[l][r - l - 1])
      added, index = held + big_d[l][r - l - 1], np.arange(count)
      cut, none = np.full(count, l), np.full(count, -1)
      incoming[r].append(_States(added, seconds + before[r] - before[l], peak, cut, index,
                                 none, np.zeros(count, dtype=bool)))
      for j in by_stop[l].get(r, ()):
        o = options[l][j]
        incoming[r].append(_States(added + o.kept_bytes, seconds + o.seconds, peak, cut,
                                   index, np.full(count, j),
                                   np.full(count, o.option.kind == KEEP)))
  best = None  # (seconds, peak, last cut, state)
  for c in range(n):
    s = states[c]
    live = s.held + big_l[c][-1]
    for k in np.flatnonzero((live <= budget_bytes) & ~s.after_keep):
      key = (float(s.seconds[k]), int(max(s.peak[k], live[k])), c, int(k))
      best = key if best is None or key < best else best
  if best is None:
    least = _least_peak(graph, big_l, big_d) if n > 1 else start + big_l[0][0]
    raise InfeasibleBudgetError(
        f"no plan peaks within {budget_bytes} bytes; the least model-G peak of any plan is "
        f"{least} bytes.", budget_bytes=budget_bytes, min_feasible_bytes=least)
  seconds_, peak_, c, k = best
  groups = [Group(i, i + 1, Option(KEEP)) for i in range(c, n)]
  while c > 0:
    l, j = int(states[c].back_cut[k]), int(states[c].back_option[k])
    groups.insert(0, Group(l, c, Option(RECOMPUTE) if j < 0 else options[l][j].option))
    c, k = l, int(states[c].back_state[k])
  return PolicyPlan(tuple(groups)), peak_, seconds_


def _pareto(states: _States, among: np.ndarray) -> np.ndarray:
  """Indices of the states of ``among`` (a mask) that no other there beats on both held
  bytes and seconds (of equal ones, the least peak)."""
  index = np.flatnonzero(among)
  order = index[np.lexsort((states.peak[index], states.seconds[index], states.held[index]))]
  seconds = states.seconds[order]
  keep = np.ones(len(order), dtype=bool)
  keep[1:] = seconds[1:] < np.minimum.accumulate(seconds)[:-1]
  return order[keep]


def policy_peak_bytes(graph: GraphChain, plan: PolicyPlan, kept_bytes: dict[Group, int]) -> int:
  """Model G's peak of ``plan`` (bytes), the literal walk the DP solves: its longest run
  of kept single units at the end is the last segment; before it, each group is a
  segment, and one under an option holds ``kept_bytes[group]`` more until its backward."""
  n = graph.n
  plan.validate(n)
  big_l, big_d = _segment_terms(graph)
  groups = plan.groups
  tail = len(groups)
  while tail > 0 and groups[tail - 1].option.kind == KEEP:
    tail -= 1
  tail = min(tail, len(groups) - 1)  # the last unit is in the last segment
  held, peak = graph.crossing_bytes(0), 0
  for g in groups[:tail]:
    l, r = g.start, g.stop
    peak = max(peak, held + big_l[l][r - l - 1])
    held += big_d[l][r - l - 1]
    held += 0 if g.option.kind == RECOMPUTE else kept_bytes.get(g, 0)
  last = groups[tail].start
  return max(peak, held + big_l[last][n - last - 1])
