"""The fastest plan of a graph of layers within a byte budget, with options per unit.

Model G (``_model.graph``) cuts a graph at kept cuts; every segment but the last is
recomputed from the values crossing its first cut. Here a segment of one unit may instead
run under an option (a JAX checkpoint policy, or no remat): it holds ``kept_bytes`` more
from its forward until its backward and adds ``seconds`` (not its recompute's) to the
step. Its backward's peak is the segment's ``L`` either way: every residual exists then,
kept or recomputed. So, left to right over kept cuts, a plan's state at cut ``r`` is what
it holds (the crossing values kept so far, each once, and the options' bytes) and its
seconds; a segment ``(l, r]`` may follow when ``held + L(l, r)`` is within the budget.
Two states at a cut compare on those two numbers alone, so keeping each cut's Pareto set
(least seconds for each held) makes the DP exact. The last segment keeps its residuals.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from jaxremat._errors import InfeasibleBudgetError, InvalidArgumentError
from jaxremat._model.graph import GraphChain
from jaxremat._model.policy_plan import KEEP, RECOMPUTE, Group, Option, PolicyPlan
from jaxremat.solvers._graph import _least_peak, _segment_terms


@dataclasses.dataclass(frozen=True)
class UnitOption:
  """One unit's option as a segment of its own.

  Attributes:
    option: what it keeps (``KEEP``: every residual).
    kept_bytes: bytes it holds from its forward until its backward beyond the values
      crossing its cuts (bytes).
    seconds: the time its recompute adds to the step (seconds).
  """

  option: Option
  kept_bytes: int
  seconds: float


@dataclasses.dataclass(frozen=True)
class _State:
  held: int
  seconds: float
  peak: int
  back: tuple[int, int, UnitOption | None] | None  # (previous cut, its state, option)


def solve_graph_policy(graph: GraphChain, options: Sequence[Sequence[UnitOption]],
                       recompute_seconds: Sequence[float], budget_bytes: int
                       ) -> tuple[PolicyPlan, int, float]:
  """The plan of least seconds whose model-G peak is within ``budget_bytes``, among equal
  seconds the one peaking least.

  Args:
    graph: the units and their values.
    options: per unit ``1..n``, its options as a segment of its own other than
      ``RECOMPUTE`` (recomputed whole is always one, at ``recompute_seconds``).
    recompute_seconds: per unit, the time recomputing it adds (seconds).
    budget_bytes: the peak allowed (model G's bytes: the batch ``C_0`` included).

  Returns:
    ``(plan, peak bytes, seconds)``: the groups (segments recomputed whole, units under
    an option, the last segment's units kept).

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
  states: list[list[_State]] = [[_State(start, 0.0, start, None)]]
  for r in range(1, n):
    found = []
    for l in range(r):
      for k, s in enumerate(states[l]):
        live = s.held + big_l[l][r - l - 1]
        if live > budget_bytes:
          continue
        peak, added = max(s.peak, live), s.held + big_d[l][r - l - 1]
        found.append(_State(added, s.seconds + before[r] - before[l], peak, (l, k, None)))
        if r == l + 1:
          found += [_State(added + o.kept_bytes, s.seconds + o.seconds, peak, (l, k, o))
                    for o in options[l]]
    # apart: a state after a kept unit may not end the plan, so it prunes no other
    states.append(_pareto([s for s in found if not _kept_unit(s)])
                  + _pareto([s for s in found if _kept_unit(s)]))
  finals = [(s.seconds, max(s.peak, s.held + big_l[c][-1]), c, k)
            for c in range(n) for k, s in enumerate(states[c])
            if s.held + big_l[c][-1] <= budget_bytes and not _kept_unit(s)]
  if not finals:
    least = _least_peak(graph, big_l, big_d) if n > 1 else start + big_l[0][0]
    raise InfeasibleBudgetError(
        f"no plan peaks within {budget_bytes} bytes; the least model-G peak of any plan is "
        f"{least} bytes.", budget_bytes=budget_bytes, min_feasible_bytes=least)
  seconds, peak, c, k = min(finals)
  groups = [Group(i, i + 1, Option(KEEP)) for i in range(c, n)]
  back = states[c][k].back
  while back is not None:
    l, k, option = back
    groups.insert(0, Group(l, c, Option(RECOMPUTE)) if option is None
                  else Group(l, c, option.option))
    c, back = l, states[l][k].back
  return PolicyPlan(tuple(groups)), peak, seconds


def _kept_unit(state: _State) -> bool:
  """Whether the state's last segment is a unit under ``KEEP``: the last segment (kept)
  may not follow one, so that a plan's last segment is its run of kept units at the end."""
  return state.back is not None and state.back[2] is not None and (
      state.back[2].option.kind == KEEP)


def _pareto(states: list[_State]) -> list[_State]:
  """The states no other beats on both held bytes and seconds (ties: least peak)."""
  front: list[_State] = []
  for s in sorted(states, key=lambda s: (s.held, s.seconds, s.peak)):
    if not front or s.seconds < front[-1].seconds - 1e-15 * max(1.0, abs(s.seconds)):
      front.append(s)
  return front


def policy_peak_bytes(graph: GraphChain, plan: PolicyPlan,
                      kept_bytes: dict[tuple[int, Option], int]) -> int:
  """Model G's peak of ``plan`` (bytes), the literal walk the DP solves: its longest run
  of kept single units at the end is the last segment; before it, each group is a
  segment, and a unit under an option holds ``kept_bytes[(unit index, option)]`` more
  until its backward."""
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
    held += 0 if g.option.kind == RECOMPUTE else kept_bytes.get((l, g.option), 0)
  last = groups[tail].start
  return max(peak, held + big_l[last][n - last - 1])
