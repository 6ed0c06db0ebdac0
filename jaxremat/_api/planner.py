"""One planning interface over chains (model R) and graphs (model G), predicted by the
XLA-aware estimate (chains), model G (graphs) or the replay of the compiled step (both)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from jaxremat._api import checks
from jaxremat._api.graph_planner import GraphPlanner, graph_kept
from jaxremat._api.planning import (TIE, below_least, every_k_plans, fmt_bytes, near_ties,
                                    tighten)
from jaxremat._backends.estimate import estimate_temp_bytes
from jaxremat._backends.graph_profile import profile_graph
from jaxremat._backends.profile import Buffers, profile
from jaxremat._backends.refine import MAX_LAYERS as MAX_REFINE_LAYERS
from jaxremat._backends.refine import refine
from jaxremat._backends.replay import Replay, chain_kept
from jaxremat._backends.targets import Target
from jaxremat._errors import (InfeasibleBudgetError, InvalidArgumentError, InvalidBudgetError,
                              NotAChainError)
from jaxremat._jaxpr import sharding as _sharding
from jaxremat._jaxpr.scan import ScanPlan
from jaxremat._jaxpr.trace import TracedChain, split_kwargs
from jaxremat._model.chain import Chain, Plan, recompute_flops, validate_plan
from jaxremat._model.simulate import simulate_peak_bytes
from jaxremat.solvers import solve

#: Strategies listed by ``Remat.report`` next to the chosen plan.
REPORTED_METHODS = ("none", "every-layer", "sqrt", "best-uniform", "optimal")
#: Longest chain predicted by the estimate, whose buffer walk is O(n^2) (3,000 layers:
#: 10 s); longer chains are predicted by model R.
ESTIMATE_MAX_LAYERS = 1_000
_MODEL_A_MAX_LAYERS = 1_000  # model A's O(n^3) program: 33 ms at n = 1,000
#: Model R budget plans tried against the replay's footprint before the fallback plans.
PREDICTED_TIGHTENINGS = 32


@dataclasses.dataclass(frozen=True)
class ChainPlanner:
  """Plans for a chain: model R's solvers, refined and predicted by the XLA-aware estimate
  (the jaxpr profile) or by the replay of the compiled plain step (the compiled profile).

  Attributes:
    chain: the profiled layers (bytes, FLOPs, names).
    buffers: the buffers behind the chain's byte counts, for the estimate.
    fixed_bytes: parameters, batch, array kwargs and parameter gradients (bytes).
    scans: one ``ScanPlan`` per scanned layer stack.
    replay: the compiled plain step, when the compiled profile predicts (else None).
    temp_scale: the estimate's temp bytes times this (``scaled_to``: XLA's step without
      remat over the estimate's); 1.0 where nothing was compiled.
  """

  chain: Chain
  buffers: Buffers
  fixed_bytes: int
  scans: tuple[ScanPlan, ...] = ()
  replay: Replay | None = None
  temp_scale: float = 1.0
  ranks_candidates = True  # verify compiles the candidates of least prediction first

  @property
  def profile(self) -> str:
    """Which profile predicts: ``"compiled"`` (the replay) or ``"jaxpr"`` (the estimate)."""
    return "compiled" if self.replay is not None else "jaxpr"

  @property
  def least_temp_bytes(self) -> Callable[[Plan], int] | None:
    """A lower bound of ``temp_bytes`` cheaper to find, where there is one: the replay's
    live bytes (its heap placement leaves room between buffers)."""
    replay = self.replay
    return None if replay is None else lambda p: replay.live_bytes(p.checkpoints)

  def temp_bytes(self, plan: Plan) -> int:
    """Predicted XLA temp bytes of a single-level ``plan``, to rank plans by: the replay's
    heap placement of its values (the footprint it predicts, less the fixed bytes), or
    the estimate's (``estimate_temp_bytes``)."""
    if self.replay is not None:
      return self.replay.total_bytes(plan.checkpoints) - self.replay.fixed_bytes
    return round(self.temp_scale * estimate_temp_bytes(self.chain, self.buffers, plan))

  def scaled_to(self, plain_step_bytes: int) -> ChainPlanner:
    """This planner with the estimate's temp bytes scaled so that the plan without
    checkpoints predicts ``plain_step_bytes`` (XLA's footprint of the step without remat):
    the estimate spreads the bytes over the layers, XLA's compile says how many the step
    holds (the bf16 pre-LN blocks: XLA:CPU's f32 buffers around bf16 products, 30%
    above the estimate). Plans rank as before. The replay, and chains past
    ``ESTIMATE_MAX_LAYERS``, are left as they are."""
    temp = estimate_temp_bytes(self.chain, self.buffers, Plan())
    held = plain_step_bytes - self.fixed_bytes
    if self.replay is not None or self.chain.n > ESTIMATE_MAX_LAYERS or min(temp, held) <= 0:
      return self
    return dataclasses.replace(self, temp_scale=held / temp)

  @property
  def input_bytes(self) -> int:
    """Bytes of the model's input ``x_0`` (part of the batch)."""
    return self.chain.act_bytes[0]

  def solve(self, method: str, refine_plan: bool = True) -> Plan:
    plan = solve(self.chain, method)
    if method == "optimal" and refine_plan:
      plan = refine(self.chain.n, plan, self.temp_bytes, self.recompute_flops,
                    least_bytes=self.least_temp_bytes)
    return plan

  def solve_budget(self, budget_bytes: int) -> Plan:
    """The plan of least recompute within a whole-step budget (bytes): model R's, given
    what the fixed bytes leave. With the compiled profile, model R's budget is tightened
    (``tighten``) until the replay puts the plan within the budget too; where that finds
    none, the fallback plan of least recompute that the replay fits."""
    if self.replay is None:
      return self.model_budget_plan(budget_bytes)
    plan = tighten(self.model_budget_plan, self.model_total_bytes, self.total_bytes,
                   budget_bytes, PREDICTED_TIGHTENINGS)
    if plan is not None:
      return plan
    fallbacks = self.budget_fallbacks()
    fits = [p for p in fallbacks if self.total_bytes(p) <= budget_bytes]
    if not fits:
      least = min(self.total_bytes(p) for p in fallbacks)
      raise below_least(budget_bytes, least, self.fixed_bytes)
    return Plan(min(fits, key=self.recompute_flops).checkpoints, method="budget")

  def model_budget_plan(self, budget_bytes: int) -> Plan:
    """Model R's plan of least recompute within a whole-step budget (bytes), whatever the
    replay puts on it: the plans the budget loop compiles (``fit_budget``)."""
    offset = self.fixed_bytes - self.chain.act_bytes[0]
    try:
      return solve(self.chain, "budget", budget_bytes=budget_bytes - offset)
    except InfeasibleBudgetError as err:
      raise below_least(budget_bytes, err.min_feasible_bytes + offset, self.fixed_bytes) from None

  def model_total_bytes(self, plan: Plan) -> int:
    """The whole-step footprint model R puts on ``plan``, as its budget solver counts it
    (bytes): the fixed bytes plus model R's peak, less the input (in the fixed bytes)."""
    return self.fixed_bytes - self.chain.act_bytes[0] + simulate_peak_bytes(self.chain, plan)

  def accepted_bytes(self, plan: Plan) -> int:
    """The footprint ``solve_budget`` judges ``plan`` by (bytes): the replay's with the
    compiled profile, else model R's. A budget below it rules the plan out."""
    return self.total_bytes(plan) if self.replay is not None else self.model_total_bytes(plan)

  def validate(self, plan: Plan) -> None:
    validate_plan(plan, self.chain.n)

  def peak_bytes(self, plan: Plan) -> int:
    """Model R's activation peak of ``plan`` (bytes; the simulator's for nested plans)."""
    return simulate_peak_bytes(self.chain, plan)

  def total_bytes(self, plan: Plan) -> int:
    """Predicted XLA footprint of the gradient step under ``plan`` (bytes).

    Arguments and parameter gradients are held for the whole step; on top of them the
    temp bytes peak as the estimate's live buffers (``estimate_temp_bytes``). With the
    compiled profile, the replay's footprint (XLA's own fixed bytes, the replayed temp).
    A multi-level plan, or a chain longer than ``ESTIMATE_MAX_LAYERS``, is predicted by
    model R's event simulator instead.
    """
    if plan.is_nested or self.chain.n > ESTIMATE_MAX_LAYERS:
      return self.model_total_bytes(plan)
    if self.replay is not None:
      return self.replay.total_bytes(plan.checkpoints)
    return self.fixed_bytes + self.temp_bytes(plan)

  def recompute_flops(self, plan: Plan) -> int:
    """FLOPs ``plan`` recomputes: its layers', and each segmented scanned stack's blocks
    once more (each segment's forward again in the backward pass), whatever the plan."""
    return recompute_flops(self.chain, plan) + sum(
        sum(s.chain.flops) for s in self.scans if s.rematerialised)

  def candidates(self, plan: Plan) -> list[Plan]:
    """Plans worth a compile beside ``plan``: model R's optimum, the best uniform plans by
    the estimate, the estimate's near ties of both, and model A's optimum."""
    optimum = solve(self.chain, "optimal")
    found = [optimum, *self.best_uniform(3), *self.near_ties(plan, 2),
             *self.near_ties(optimum, 2)]
    if self.chain.n <= _MODEL_A_MAX_LAYERS:
      found.append(solve(self.chain, "dp"))
    return found

  def second_opinion(self) -> tuple[Plan, ...]:
    """With the compiled profile, the checkpoint-every-k plan the estimate predicts
    smallest: a candidate from an independent prediction, for when XLA missed the
    replay's (the realworld ResNet on the H100: the replay's plan 10% low, the estimate's
    every-2 the least of every plan compiled). Else none."""
    if self.replay is None:
      return ()
    return tuple(dataclasses.replace(self, replay=None).best_uniform(1))

  def budget_fallbacks(self) -> list[Plan]:
    """Plans to try when model R finds none within a budget that XLA may still meet."""
    least = solve(self.chain, "optimal")
    return [refine(self.chain.n, least, self.temp_bytes, self.recompute_flops,
                   least_bytes=self.least_temp_bytes), least,
            *self.best_uniform(3)]

  def best_uniform(self, count: int) -> list[Plan]:
    """The ``count`` checkpoint-every-k plans of least estimated footprint (beyond refine's
    ``MAX_LAYERS`` layers, of least model-R peak: n estimates would cost minutes)."""
    plans = every_k_plans(self.chain.n)
    if self.chain.n > MAX_REFINE_LAYERS:
      return sorted(plans, key=self.peak_bytes)[:count]
    return sorted(plans, key=self.temp_bytes)[:count]

  def near_ties(self, plan: Plan, count: int) -> list[Plan]:
    return near_ties(self, plan, count)

  def ties(self, plan: Plan, count: int) -> list[Plan]:
    """Up to ``count`` plans the estimate cannot tell from ``plan``: the near ties of
    ``plan`` and of model R's optimum that it predicts at most ``TIE`` above ``plan``,
    least estimate first (then least recompute). Refine's one-checkpoint toggles stop at
    a local least, so the optimum's neighbours can be below it."""
    own = self.temp_bytes(plan)
    found = {p.checkpoints: p for p in [*self.near_ties(plan, count),
                                       *self.near_ties(solve(self.chain, "optimal"), count)]}
    found.pop(plan.checkpoints, None)
    keys = {c: (self.temp_bytes(p), recompute_flops(self.chain, p)) for c, p in found.items()}
    ranked = sorted((c for c in found if keys[c][0] <= own * (1 + TIE)), key=keys.__getitem__)
    return [found[c] for c in ranked[:count]]

  def layer_table(self, plan: Plan) -> list[tuple[str, ...]]:
    chain, kept = self.chain, set(plan.checkpoints)
    last = plan.checkpoints[-1] if plan.checkpoints else 0
    rows: list[tuple[str, ...]] = [
        ("#", "layer", "output", "residuals", "of which input", "plan", "GFLOP")]
    for i in range(1, chain.n + 1):
      # a kept layer's output is held; the layer runs again with its segment
      status = "output kept" if i in kept else ("recomputed" if i <= last else "saved")
      rows.append((str(i), chain.names[i - 1], fmt_bytes(chain.act_bytes[i]),
                   fmt_bytes(chain.res_bytes[i - 1]), fmt_bytes(chain.input_res_bytes[i - 1]),
                   status, f"{chain.flops[i - 1] / 1e9:.3f}"))
    return rows

  def reported_plans(self, plan: Plan) -> dict[str, Plan]:
    return {m: plan if m == plan.method else solve(self.chain, m)
            for m in dict.fromkeys([*REPORTED_METHODS, plan.method])}


Planner = ChainPlanner | GraphPlanner


def scale_estimate(planner: Planner, plain_step_bytes: int | None) -> Planner:
  """``planner`` with its estimate scaled to XLA's footprint of the step without remat
  (bytes; ``ChainPlanner.scaled_to``), where it predicts by the estimate of a chain."""
  if plain_step_bytes is None or not isinstance(planner, ChainPlanner):
    return planner
  return planner.scaled_to(plain_step_bytes)


def sharded_inputs(params: Any, batch: Any, model_kwargs: dict[str, Any]) -> bool:
  """Whether params, batch or an array keyword argument is spread over several devices
  (the compiled profile replays one device's program: not then)."""
  return _sharding.is_sharded((params, batch, split_kwargs(model_kwargs)[0]))


def make_planner(traced: TracedChain, scans: tuple[ScanPlan, ...], params: Any, batch: Any,
                 model_kwargs: dict[str, Any], calibrate: bool, target: Target | None,
                 compiled: Callable[[TracedChain, tuple[tuple[int, int, int], ...]], Replay]
                 | None = None,
                 required: bool = True) -> Planner:
  """Profiles the traced layers into the planner for their structure (chain or graph), as
  XLA for ``target`` (default: the local backend) keeps them. ``compiled`` (the
  compiled profile): the replay of the plain step (its scans segmented as ``scans``
  says), given its layers and the values a cut may keep (``Replay.kept``); on a model it
  cannot replay (sharded inputs), an error when ``required``, else the jaxpr profile;
  not ``required``, a chain with segmented scans keeps the jaxpr profile too."""
  arrays, _, _ = split_kwargs(model_kwargs)
  fixed = checks.fixed_bytes(params, batch, arrays)
  sharded = sharded_inputs(params, batch, model_kwargs)
  platform = "gpu" if target else None
  if platform and sharded:
    raise InvalidArgumentError(
        "a target= plans for one GPU; pass unsharded params and batch (or "
        "jax.ShapeDtypeStructs of one device's shapes).")
  if compiled is not None and sharded:
    if required:
      raise InvalidArgumentError(
          "profile='compiled' replays the layers of one compiled program; this model has "
          "sharded inputs. Use profile='jaxpr' (the estimate).")
    compiled = None  # by default, the estimate where the replay cannot go
  if compiled is not None and scans and not required and traced.not_a_chain is None:
    # By default a chain's segmented scans keep the estimate, whose segment workspace is
    # compiled alone (bench/unseen.py --set recurrent, deviceless H100: the LSTM LM's
    # plan, 33.14 MiB either way, predicted +1.5% by it, -10.6% by the replay; the
    # BiLSTM's -5.5% and -9.2%); a graph's get the replay, where the jaxpr profile has
    # only model G (its GRU seq2seq on CPU: 20.43 MiB predicted 37.8% low, 18.93 -8.9%).
    compiled = None
  if traced.not_a_chain is not None:  # traced.is_graph
    if sharded:
      raise NotAChainError(
          f"{traced.not_a_chain} jaxremat plans such a model as a graph, which does not "
          "take sharded inputs yet; pass unsharded params and batch.")
    segmented = {s.layer for s in scans if s.rematerialised}  # compiled alone, as below
    graph = profile_graph(traced, calibrate or segmented, platform, target)
    graph = dataclasses.replace(graph, flops=_scan_flops(graph.flops, scans))
    return GraphPlanner(graph, fixed, traced.not_a_chain,
                        replay=compiled(traced, graph_kept(graph)) if compiled else None)
  # A segmented scan's backward (one segment recomputed, then its backward loop) is
  # compiled alone for its workspace, for the target.
  segmented = {s.layer for s in scans if s.rematerialised}
  prof = profile(traced, calibrate=calibrate or segmented, backend=platform, target=target)
  chain = prof.chain
  if sharded:  # bytes per device from here on
    flat = jax.tree_util.tree_leaves((params, batch, arrays))
    prof = _sharding.per_device_profile(traced, dataclasses.replace(prof, chain=chain), flat)
    chain = prof.chain
    fixed = (_sharding.tree_device_bytes((params, batch, arrays))
             + _sharding.tree_device_bytes(params, floats_only=True))
  if scans:
    chain = dataclasses.replace(chain, flops=_scan_flops(chain.flops, scans))
  return ChainPlanner(chain, prof.buffers, fixed, scans,
                      compiled(traced, chain_kept(chain.act_bytes)) if compiled else None)


def _scan_flops(flops: tuple[int, ...], scans: tuple[ScanPlan, ...]) -> tuple[int, ...]:
  """Per layer FLOPs with each scan's layer given all its iterations' (XLA's cost
  analysis counts a loop's body once: a stack's forward is its blocks')."""
  summed = list(flops)
  for s in scans:
    summed[s.layer] = sum(s.chain.flops)
  return tuple(summed)


def check_holds_inputs(budget_bytes: int, params: Any, batch: Any, model_kwargs: dict[str, Any],
                       name: str, hint: str, given: Any = None) -> None:
  """Rejects a budget (bytes) below what every training step holds whatever the plan:
  parameters, batch, array keyword arguments and parameter gradients. Nothing traced or
  compiled. ``given``: the budget as the user wrote it, when not ``budget_bytes``."""
  arrays, _, _ = split_kwargs(model_kwargs)
  held = checks.fixed_bytes(params, batch, arrays)
  if budget_bytes < held:
    shown = (budget_bytes if given is None or given == budget_bytes
             else f"{given!r}, read as {budget_bytes} byte{'' if budget_bytes == 1 else 's'}")
    raise InfeasibleBudgetError(
        f"{name}={shown} ({fmt_bytes(budget_bytes)}) is below the {held} bytes "
        f"({fmt_bytes(held)}) that the parameters, the batch and the parameter gradients "
        f"hold in every training step, before any activation: no plan fits it. {hint}",
        budget_bytes=budget_bytes, min_feasible_bytes=held)


def check_budget_method(method: str) -> None:
  if method not in ("optimal", "budget"):
    raise InvalidBudgetError(
        f"budget_bytes selects method='budget'; it cannot be combined with method={method!r}.")
