"""The planner of a graph of layers (skip tensors): model G, or the replay of the compiled
step."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

from jaxremat._api.planning import below_least, every_k_plans, fmt_bytes, near_ties
from jaxremat._backends.refine import MAX_LAYERS as MAX_REFINE_LAYERS
from jaxremat._backends.refine import refine
from jaxremat._backends.replay import Replay
from jaxremat._errors import InfeasibleBudgetError, NotAChainError
from jaxremat._jaxpr.scan import ScanPlan
from jaxremat._model.chain import Plan, validate_plan
from jaxremat._model.graph import GraphChain, graph_peak_bytes, graph_recompute_flops
from jaxremat.solvers._graph import GRAPH_SOLVERS, solve_graph, solve_graph_budget


@dataclasses.dataclass(frozen=True)
class GraphPlanner:
  """Plans for a graph of layers (skip tensors): model G, solved exactly in O(n^2).

  Attributes:
    chain: the profiled graph (values, residuals, FLOPs per layer).
    fixed_bytes: parameters, batch, array kwargs and parameter gradients (bytes).
    not_a_chain: which layer skips which (the reason the model is planned as a graph).
    replay: the compiled plain step, when the compiled profile predicts (else None:
      model G's peak over the fixed bytes).
  """

  chain: GraphChain
  fixed_bytes: int
  not_a_chain: str = ""
  scans: tuple[ScanPlan, ...] = ()
  replay: Replay | None = None

  @property
  def profile(self) -> str:
    """Which profile predicts: ``"compiled"`` (the replay) or ``"jaxpr"`` (model G)."""
    return "compiled" if self.replay is not None else "jaxpr"

  @property
  def ranks_candidates(self) -> bool:
    """Whether verify compiles the candidates of least prediction first: with the replay,
    up to refine's ``MAX_LAYERS`` layers (beyond, n replays would cost minutes: 0.3 s
    each on a ViT of 151 layers). Model G orders the plans of a graph less well than the
    estimate orders a chain's."""
    return self.replay is not None and self.chain.n <= MAX_REFINE_LAYERS

  @property
  def least_temp_bytes(self) -> Callable[[Plan], int] | None:
    """A lower bound of ``temp_bytes`` cheaper to find, where there is one: the replay's
    live bytes (its heap placement leaves room between buffers)."""
    replay = self.replay
    return None if replay is None else lambda p: replay.live_bytes(p.checkpoints)

  def temp_bytes(self, plan: Plan) -> int:
    """Predicted temp bytes of ``plan`` (the footprint less the fixed bytes), to rank by."""
    return self.total_bytes(plan) - (self.replay.fixed_bytes if self.replay else self.fixed_bytes)

  @property
  def input_bytes(self) -> int:
    """Bytes of the batch values the layers read (cut 0)."""
    return self.chain.crossing_bytes(0)

  def solve(self, method: str, refine_plan: bool = True) -> Plan:
    """Model G's plan; its optimum refined against the replay (``refine``) when the
    compiled profile predicts."""
    if method not in GRAPH_SOLVERS:
      raise NotAChainError(
          f"{self.not_a_chain} jaxremat plans such a model as a graph, whose solvers are "
          f"{sorted(GRAPH_SOLVERS)}; method={method!r} is not one of them.")
    plan = solve_graph(self.chain, method)
    if method == "optimal" and refine_plan and self.replay is not None:
      plan = refine(self.chain.n, plan, self.temp_bytes, self.recompute_flops,
                    least_bytes=self.least_temp_bytes)
    return plan

  def solve_budget(self, budget_bytes: int) -> Plan:
    """Model G's plan of least recompute within ``budget_bytes`` (a whole-step budget).
    Where the replay ranks plans (``ranks_candidates``), the least recompute of that
    plan, the checkpoint-every-k plans and the refined optimum that the replay puts
    within the budget."""
    if not self.ranks_candidates:
      return self.model_budget_plan(budget_bytes)
    tried = [*every_k_plans(self.chain.n), self.solve("optimal")]
    with contextlib.suppress(InfeasibleBudgetError):  # the replay may put another within it
      tried.insert(0, self.model_budget_plan(budget_bytes))
    fits = [p for p in tried if self.total_bytes(p) <= budget_bytes]
    if not fits:
      least = min(self.total_bytes(p) for p in tried)
      raise below_least(budget_bytes, least, self.fixed_bytes)
    best = min(fits, key=lambda p: (self.recompute_flops(p), self.total_bytes(p)))
    return Plan(best.checkpoints, method="budget")

  def model_budget_plan(self, budget_bytes: int) -> Plan:
    """Model G's plan of least recompute within a whole-step budget (bytes), whatever the
    replay puts on it: the plans the budget loop compiles (``fit_budget``)."""
    offset = self.fixed_bytes - self.chain.crossing_bytes(0)
    try:
      return solve_graph_budget(self.chain, budget_bytes - offset)
    except InfeasibleBudgetError as err:
      raise below_least(budget_bytes, err.min_feasible_bytes + offset, self.fixed_bytes) from None

  def validate(self, plan: Plan) -> None:
    validate_plan(plan, self.chain.n)
    if plan.is_nested:
      raise NotAChainError(
          f"{self.not_a_chain} jaxremat plans such a model as a graph, which takes "
          "single-level plans only (no Plan.inner).")

  def peak_bytes(self, plan: Plan) -> int:
    """Model G's peak of ``plan`` (bytes)."""
    return graph_peak_bytes(self.chain, plan)

  def total_bytes(self, plan: Plan) -> int:
    """Predicted XLA footprint of the gradient step under ``plan`` (bytes): the replay's,
    or the fixed bytes plus model G's peak less the batch (in the fixed bytes)."""
    if self.replay is not None:
      self.validate(plan)
      return self.replay.total_bytes(plan.checkpoints)
    return self.model_total_bytes(plan)

  def recompute_flops(self, plan: Plan) -> int:
    return graph_recompute_flops(self.chain, plan)

  def model_total_bytes(self, plan: Plan) -> int:
    """The whole-step footprint model G puts on ``plan`` (bytes): the fixed bytes plus
    model G's peak, less the batch (in the fixed bytes)."""
    return self.fixed_bytes + graph_peak_bytes(self.chain, plan) - self.chain.crossing_bytes(0)

  def accepted_bytes(self, plan: Plan) -> int:
    """The footprint ``solve_budget`` judges ``plan`` by (bytes): the replay's where it
    ranks the candidates, else model G's. A budget below it rules the plan out."""
    return self.total_bytes(plan) if self.ranks_candidates else self.model_total_bytes(plan)

  def candidates(self, plan: Plan) -> list[Plan]:
    """Every layer kept, model G's best uniform plan and optimum, the replay's best
    uniform plans (where it ranks them), then the plans one kept cut away from ``plan``,
    least model-G peak first. Compiled in this order where ``ranks_candidates`` is
    False, else least replayed footprint first."""
    g = self.chain
    near = [Plan(tuple(sorted(set(plan.checkpoints) ^ {k}))) for k in range(1, g.n)]
    near.sort(key=lambda p: (graph_peak_bytes(g, p), graph_recompute_flops(g, p)))
    return [*(solve_graph(g, m) for m in ("every-layer", "best-uniform", "optimal")),
            *(self.best_uniform(3) if self.ranks_candidates else []), *near]

  def budget_fallbacks(self) -> list[Plan]:
    return [solve_graph(self.chain, "optimal"), *self.best_uniform(1),
            solve_graph(self.chain, "best-uniform")]

  def best_uniform(self, count: int) -> list[Plan]:
    """The ``count`` checkpoint-every-k plans of least predicted footprint (of least
    model-G peak without the replay, or beyond refine's ``MAX_LAYERS`` layers)."""
    return sorted(every_k_plans(self.chain.n),
                  key=self.temp_bytes if self.ranks_candidates else self.peak_bytes)[:count]

  def second_opinion(self) -> tuple[Plan, ...]:
    """With the compiled profile, model G's optimum (an independent prediction's plan);
    else none."""
    return (solve_graph(self.chain, "optimal"),) if self.replay else ()

  def ties(self, plan: Plan, count: int) -> list[Plan]:
    """With the replay, the plans one checkpoint away that it predicts within ``TIE``
    (``near_ties``). Else none: model G does not tell a graph's plans apart finely
    enough to call two a tie (``verify=True`` compiles the plans one cut away)."""
    return near_ties(self, plan, count) if self.replay else []

  def layer_table(self, plan: Plan) -> list[tuple[str, ...]]:
    g, kept = self.chain, set(plan.checkpoints)
    last = plan.checkpoints[-1] if plan.checkpoints else 0
    rows: list[tuple[str, ...]] = [
        ("#", "layer", "residuals", "cut keeps", "values", "plan", "GFLOP")]
    for t in range(1, g.n + 1):
      cut = (fmt_bytes(g.crossing_bytes(t)), str(len(g.crossing(t)))) if t < g.n else ("", "")
      residuals = g.res_bytes[t - 1] + sum(g.value_bytes[v] for v in g.saved[t - 1])
      status = "kept cut after" if t in kept else ("recomputed" if t <= last else "saved")
      rows.append((str(t), g.names[t - 1], fmt_bytes(residuals), *cut, status,
                   f"{g.flops[t - 1] / 1e9:.3f}"))
    return rows

  def reported_plans(self, plan: Plan) -> dict[str, Plan]:
    return {m: plan if m == plan.method else solve_graph(self.chain, m)
            for m in dict.fromkeys(["none", "every-layer", "best-uniform", "optimal",
                                    plan.method])}


def graph_kept(graph: GraphChain) -> tuple[tuple[int, int, int], ...]:
  """``Replay.kept`` of a graph: the values its layers make, read by later ones."""
  return tuple((made, last, size) for made, last, size
               in zip(graph.defined, graph.last_use, graph.value_bytes) if made > 0)
