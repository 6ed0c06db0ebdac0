"""``jaxremat.fit`` on a graph of layers (skip tensors: a U-Net's encoder-to-decoder skips,
blocks split below their residual adds).

The chain's DP over groups does not hold where values skip layers; model G does. Its DP
over kept cuts, with a segment of one layer allowed to run under an option (keep its
matrix products, its costliest ones, offload them, no remat) and the layers of one
module allowed to run as one ``jax.checkpoint`` under such a policy (a block split into
pieces, as ``nn.remat(Block, policy=...)`` runs it; costed compiled whole, also when
recomputed), gives the plan of least predicted recompute within the budget
(``solvers._graph_policy``), its bytes calibrated as a chain's are. XLA judges it; after a miss it is solved again for less. Where none of
those fits, or to time the candidates, ``fit`` also compiles a shortlist: the
layer-boundary budget plan XLA fits (as ``apply(budget_bytes=)`` finds it:
``fit_budget``) and the plans a user would write by hand that the roofline puts faster
(every layer under one option; that plan keeping its products where it recomputes).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable

from jaxremat._api.graph_planner import GraphPlanner
from jaxremat._api.verify import fit_budget
from jaxremat._backends.policy_options import LayerOptions
from jaxremat._backends.step_time import ranked
from jaxremat._errors import InfeasibleBudgetError
from jaxremat._jaxpr.compat import aval_bytes
from jaxremat._model.chain import Plan
from jaxremat._model.graph import graph_peak_bytes
from jaxremat._model.policy_plan import (
  DOTS,
  DOTS_NO_BATCH,
  KEEP,
  RECOMPUTE,
  Group,
  GroupCost,
  Option,
  PolicyPlan,
  from_plan,
)
from jaxremat.solvers._graph_policy import SegmentOption, solve_graph_policy

#: Compiles of the DP's plans; and, apart, of the shortlist's (beyond ``fit_budget``'s).
MAX_GRAPH_COMPILES = 6
LAYER_PLAN = "layer-boundary plan"


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A plan fit may compile: what it is, its groups with their bytes and seconds, and its
  predicted footprint (bytes) where something predicts it."""

  what: str
  costs: tuple[GroupCost, ...]
  predicted_bytes: int | None = None

  @property
  def plan(self) -> PolicyPlan:
    return PolicyPlan(tuple(c.group for c in self.costs))

  @property
  def seconds(self) -> float:
    """The time its recompute adds to a step by the roofline (seconds)."""
    return sum(c.seconds for c in self.costs)


@dataclasses.dataclass(frozen=True)
class GraphFit:
  """What ``fit_graph`` found.

  Attributes:
    chosen: the plan returned.
    footprint: XLA's footprint of it (bytes), None without compiles.
    predicted_bytes: its predicted footprint (bytes): the DP's, or the planner's for the
      layer-boundary plan; None for a plan of the shortlist, which nothing predicts.
    compiled: XLA's footprint (bytes) of each plan compiled, in order.
    points: ``(XLA bytes, roofline seconds)`` of each shortlisted plan compiled.
    timed: ``(what, XLA bytes, step seconds)`` of the plans timed, the returned first.
  """

  chosen: Candidate
  footprint: int | None
  predicted_bytes: int | None
  compiled: tuple[int, ...]
  points: tuple[tuple[int, float], ...]
  timed: tuple[tuple[str, int, float], ...] = ()


def group_cost(layers: LayerOptions, group: Group) -> GroupCost:
  """A group's bytes and seconds on a graph. One layer: as ``LayerOptions.measure`` gives
  them (stored: what its VJP saves beyond its inputs; seconds: its recompute's and its
  offload's, none when kept). The layers of one module (``module_runs``) under any
  option, and several under a policy: as ``LayerOptions.measure_run`` gives them, from
  the run compiled whole. Other runs recomputed: they hold their inputs (the values they
  read from outside, parameters aside) and recompute each layer apart. Transient bytes
  are not modelled on a graph (0): XLA judges."""
  host, moved = layers.offload(group)
  if group.stop - group.start == 1:
    stored, seconds = layers.measure(group.start, group.option)
    return GroupCost(group, stored, 0, seconds + moved, host)
  names = tuple(layer.name for layer in layers.traced.layers)
  if group.option.kind != RECOMPUTE or (group.start, group.stop) in module_runs(names):
    stored, seconds = layers.measure_run(group)
    return GroupCost(group, stored, 0, seconds + moved, host)
  inside = layers.traced.layers[group.start:group.stop]
  made = {v for layer in inside for e in layer.eqns for v in e.outvars}
  read = dict.fromkeys(v for layer in inside for v in layer.inputs if v not in made)
  seconds = sum(layers.measure(i, Option(RECOMPUTE))[1]
                for i in range(group.start, group.stop))
  return GroupCost(group, sum(aval_bytes(v.aval) for v in read), 0, seconds)


def held_at_least(candidate: Candidate) -> int:
  """Bytes the plan holds at the end of its forward pass at least (a lower bound): what
  its groups' VJPs save beyond their inputs (a group of several layers recomputed holds
  inputs that other groups may hold too, and counts 0)."""
  return sum(c.stored_bytes for c in candidate.costs
             if c.group.stop - c.group.start == 1 or c.group.option.kind != RECOMPUTE)


def run_label(names: tuple[str, ...]) -> str:
  """A report's name for a run of layers: the module holding them all and its first and
  last layer in it, ``decoder: block_0 .. block_2 (3 layers)``, else ``first .. last``."""
  paths = [name.split("/")[:-1] for name in names]
  common = next((k for k in range(min(map(len, paths))) if len({p[k] for p in paths}) > 1),
                min(map(len, paths)))
  if common == 0:
    return f"{names[0]} .. {names[-1]}"
  inside = lambda name: "/".join(name.split("/")[common:])  # noqa: E731
  return (f"{'/'.join(paths[0][:common])}: {inside(names[0])} .. {inside(names[-1])} "
          f"({len(names)} layers)")


@functools.cache
def module_runs(names: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
  """``(start, stop)`` of every run of two or more consecutive layers inside one module
  (names ``Encoder/block_3/...``: a block's pieces, its MLP's), shortest first."""
  paths = [name.split("/") for name in names]
  runs = set()
  for depth in range(1, max(map(len, paths), default=1)):
    inside = [tuple(p[:depth]) if len(p) > depth else i for i, p in enumerate(paths)]
    start = 0
    for _, run in itertools.groupby(inside):
      length = len(list(run))
      if length >= 2:
        runs.add((start, start + length))
      start += length
  return tuple(sorted(runs, key=lambda run: (run[1] - run[0], run)))


def shortlist(layers: LayerOptions, layer_plan: Plan | None, layer_bytes: int | None = None
              ) -> list[Candidate]:
  """Every layer under one option, the layer-boundary plan (predicted ``layer_bytes``),
  and that plan with each layer it recomputes keeping its matrix products instead;
  distinct plans, least roofline seconds first."""
  n = len(layers.traced.layers)
  found: dict[PolicyPlan, str] = {}
  for kind in (KEEP, DOTS_NO_BATCH, DOTS, RECOMPUTE):
    found.setdefault(PolicyPlan(tuple(Group(i, i + 1, Option(kind)) for i in range(n))),
                     f"every layer: {kind}")
  if layer_plan is not None:
    boundary = from_plan(layer_plan.checkpoints, n)
    found[boundary] = LAYER_PLAN  # last: it overrides a uniform plan of the same groups
    for kind in (DOTS_NO_BATCH, DOTS):
      products = tuple(Group(i, i + 1, Option(kind if g.option.kind == RECOMPUTE else KEEP))
                       for g in boundary.groups for i in range(g.start, g.stop))
      found.setdefault(PolicyPlan(products), f"{LAYER_PLAN}, its recompute keeping {kind}")
  made = [Candidate(what, tuple(group_cost(layers, g) for g in plan.groups),
                    layer_bytes if what == LAYER_PLAN else None)
          for plan, what in found.items()]
  return sorted(made, key=lambda c: c.seconds)


class GraphDP:
  """``solve_graph_policy`` over the graph's profile, its bytes calibrated: model G's peak
  scaled so that keeping every residual predicts ``plain_bytes`` (the footprint without
  remat: XLA's, or the planner's prediction), as ``fit`` scales a chain's groups."""

  def __init__(self, planner: GraphPlanner, layers: LayerOptions, plain_bytes: int):
    self.graph, self.layers, self.fixed = planner.chain, layers, planner.fixed_bytes
    n = self.graph.n
    self.base = self.graph.crossing_bytes(0)  # the batch: in the fixed bytes already
    none = graph_peak_bytes(self.graph, Plan(()))
    self.scale = max(plain_bytes - self.fixed, 1) / max(none - self.base, 1)
    costs = [[group_cost(layers, Group(i, i + 1, o))
              for o in (Option(KEEP), *layers.options(i)) if o.kind != RECOMPUTE]
             for i in range(n)]
    for l, r in module_runs(tuple(layer.name for layer in layers.traced.layers)):
      if r < n:  # (the last segment keeps its layers) recomputed too: compiled whole
        costs[l] += [group_cost(layers, Group(l, r, o)) for o in layers.options(l, r)]
    self.options = [[SegmentOption(c.group.option, c.stored_bytes, c.seconds,
                                   c.group.stop - c.group.start)
                     for c in unit if math.isfinite(c.seconds)] for unit in costs]
    self.recompute = [layers.measure(i, Option(RECOMPUTE))[1] for i in range(n)]

  def total(self, peak: int) -> int:
    """The whole step's predicted footprint (bytes) of a model-G peak."""
    return self.fixed + round(self.scale * (peak - self.base))

  def solve(self, budget: int) -> tuple[Candidate, int]:
    """The plan of least predicted seconds whose predicted footprint is within ``budget``
    (bytes, the whole step), with that footprint.

    Raises:
      InfeasibleBudgetError: none is; ``min_feasible_bytes`` is the least predicted.
    """
    allowed = self.base + int((budget - self.fixed) / self.scale)
    try:
      plan, peak, _ = solve_graph_policy(self.graph, self.options, self.recompute, allowed)
    except InfeasibleBudgetError as err:
      least = self.total(err.min_feasible_bytes)
      raise InfeasibleBudgetError(
          f"no plan is predicted within {budget} bytes; the least predicted is {least} bytes.",
          budget_bytes=budget, min_feasible_bytes=least) from None
    costs = tuple(group_cost(self.layers, g) for g in plan.groups)
    total = self.total(peak)
    return Candidate("graph DP: least predicted", costs, total), total


def fit_graph(planner: GraphPlanner, layers: LayerOptions, budget: int, plain_bytes: int,
              measured: Callable[[PolicyPlan], int] | None,
              time_plans: Callable[[list[PolicyPlan]], list[list[float]]] | None) -> GraphFit:
  """The plan of least predicted recompute that XLA fits in ``budget`` (bytes): the graph
  DP's (``GraphDP``), solved for less by XLA's excess after each miss. Where none fits in
  ``MAX_GRAPH_COMPILES`` compiles, or with ``time_plans`` (then the fastest measured of
  every plan that fits is returned, ``step_time.ranked``), also the shortlist: the
  layer-boundary budget plan XLA fits (``fit_budget``) and the plans of ``shortlist``
  predicted faster than it.

  Args:
    planner: the graph's planner.
    layers: its layers' options.
    budget: the whole step's budget (bytes).
    plain_bytes: the footprint without remat (bytes; XLA's with ``measured``).
    measured: XLA's footprint of a plan (bytes); None: the DP's plan as predicted.
    time_plans: the measured times (seconds) of each run of each plan compiled already.

  Raises:
    InfeasibleBudgetError: nothing fits; ``min_feasible_bytes`` is the least footprint
      found (XLA's with ``measured``, else predicted).
  """
  n = planner.chain.n
  if measured is None:
    only, total = GraphDP(planner, layers, plain_bytes).solve(budget)
    return GraphFit(only, None, total, (), ((total, only.seconds),))
  if plain_bytes <= budget:  # no remat fits: nothing is faster
    keep = Candidate("no remat", tuple(group_cost(layers, g) for g in from_plan((), n).groups),
                     plain_bytes)
    return GraphFit(keep, plain_bytes, plain_bytes, (), ((plain_bytes, 0.0),))
  dp = GraphDP(planner, layers, plain_bytes)
  seen: dict[PolicyPlan, int] = {}
  compiled: list[int] = []

  def footprint(plan: PolicyPlan) -> int:
    if plan not in seen:
      seen[plan] = measured(plan)
      compiled.append(seen[plan])
    return seen[plan]

  examined: list[Candidate] = []
  fitting: list[Candidate] = []  # those XLA fits
  allowed = budget
  for _ in range(MAX_GRAPH_COMPILES):  # each a new plan: after a miss the DP's peak falls
    try:
      found, total = dp.solve(allowed)
    except InfeasibleBudgetError:
      break
    got = footprint(found.plan)
    examined.append(found)
    if got <= budget:
      fitting.append(found)
      break
    allowed = min(allowed, total) - (got - budget)  # over: ask for less, by XLA's excess
  if not fitting or time_plans is not None:
    more = _shortlisted(planner, layers, budget, footprint, time_plans is not None)
    examined += more
    fitting += [c for c in more if seen[c.plan] <= budget
                and c.plan not in {f.plan for f in fitting}]
  if not fitting:
    least = min(seen.values(), default=plain_bytes)
    raise InfeasibleBudgetError(
        f"no plan fits the step in {budget} bytes; the least footprint found is {least} "
        "bytes (XLA-measured)", budget_bytes=budget, min_feasible_bytes=least)
  points = tuple((seen[c.plan], c.seconds) for c in examined)
  chosen = min(fitting, key=lambda c: c.seconds)
  timed: tuple[tuple[str, int, float], ...] = ()
  if time_plans is not None:
    times = time_plans([c.plan for c in fitting])
    order = ranked(times, [seen[c.plan] for c in fitting])
    timed = tuple((fitting[k].what, seen[fitting[k].plan], min(times[k])) for k in order)
    chosen = fitting[order[0]]
  return GraphFit(chosen, seen[chosen.plan], chosen.predicted_bytes, tuple(compiled), points,
                  timed)


def _shortlisted(planner: GraphPlanner, layers: LayerOptions, budget: int,
                 footprint: Callable[[PolicyPlan], int], every: bool) -> list[Candidate]:
  """The layer-boundary budget plan XLA fits (``fit_budget``; absent when none does),
  last, after the plans of ``shortlist`` predicted faster that were compiled (up to
  ``MAX_GRAPH_COMPILES``; until one fits, or with ``every`` past it)."""
  n = planner.chain.n
  layer_plan = None
  try:
    layer_plan, _ = fit_budget(planner, budget, lambda p: footprint(from_plan(p.checkpoints, n)))
  except InfeasibleBudgetError:
    pass  # a plan of per-layer options may still fit
  candidates = shortlist(layers, layer_plan,
                         planner.total_bytes(layer_plan) if layer_plan else None)
  layer = [c for c in candidates if c.what == LAYER_PLAN]
  limit = layer[0].seconds if layer else math.inf
  compiled: list[Candidate] = []
  for c in candidates:
    if c.seconds >= limit or len(compiled) >= MAX_GRAPH_COMPILES:
      break
    if c.plan == from_plan((), n) or planner.fixed_bytes + held_at_least(c) > budget:
      continue  # no remat, or a plan that cannot fit: not worth a compile
    compiled.append(c)
    if footprint(c.plan) <= budget and not every:
      break
  return compiled + layer
