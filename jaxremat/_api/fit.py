"""``jaxremat.fit``: the fastest training step within a memory budget (issue 24).

Where ``apply`` cuts the chain at layer boundaries to reach the least peak, ``fit``
decides per layer what to keep, recompute or offload (``_model.policy_plan``) so that the
step fits a budget and recomputes the least predicted time, and confirms the fit with
XLA's compile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jaxremat._api import checks
from jaxremat._api.advice import coarse_reason, loops_hold_residuals, one_layer_hint
from jaxremat._api.dropin import DropIn, input_key, policy_drop_in
from jaxremat._api.memory_budget import (budget_in_bytes, budget_read_as, check_memory_budget,
                                         is_share)
from jaxremat._api.fit_graph import fit_graph
from jaxremat._api.fitted import Fitted
from jaxremat._api.fit_search import LayerPlans, Search, alternatives
from jaxremat._api.graph_planner import GraphPlanner
from jaxremat._api.loss import LossFn, training_loss_with_arrays
from jaxremat._api.measure import step_bytes
from jaxremat._api.planner import check_holds_inputs, make_planner
from jaxremat._api.planning import fmt_bytes
from jaxremat._api.stopwatch import Stopwatch
from jaxremat._api.verify import measured_segments, sweep_uniform
from jaxremat._backends.measure import compile_step, gradient_step
from jaxremat._backends.policy_options import LayerOptions, OptionCosts, group_costs
from jaxremat._backends.plain_step import compile_replay
from jaxremat._backends.replay import Replay
from jaxremat._backends.roofline import roofline_for
from jaxremat._backends.step_time import ranked, spread, step_seconds
from jaxremat._backends.targets import Target, get_target
from jaxremat._errors import InfeasibleBudgetError
from jaxremat._jaxpr import scan as _scan
from jaxremat._jaxpr.emit import named_products
from jaxremat._jaxpr.trace import TracedChain, split_kwargs
from jaxremat._model.chain import Plan
from jaxremat._model.policy_plan import KEEP, GroupCost, PolicyPlan, peak_bytes
from jaxremat.solvers._policy import as_plan, pareto, policy_frontier

MAX_FIT_COMPILES = 6  # plans compiled to find the fastest predicted that fits (as verify)
MAX_TIMED_ALTERNATIVES = 5  # plans compiled beside the chosen one to time them all
TIMED_MARGIN = 0.1  # alternatives predicted up to 10% over the budget are compiled too


@checks.positional("model_fn", "params", "batch", "memory_budget")
def fit(
    model_fn: Callable[..., Any],
    params: Any,
    batch: Any = checks.REQUIRED,
    memory_budget: float | int = checks.REQUIRED,
    *,
    layer_depth: int | None = None,
    verify: bool = True,
    target: str | Target | None = None,
    time_steps: bool | None = None,
    loss_fn: LossFn | None = None,
    **model_kwargs: Any,
) -> Fitted:
  """The fastest plan whose training step fits ``memory_budget``, per residual.

  Each layer keeps its residuals, recomputes them, keeps only its matrix products'
  outputs (jax's ``dots_saveable`` or ``dots_with_no_batch_dims_saveable``), keeps only
  its costliest products' outputs (named automatically with ``checkpoint_name``), or on
  a GPU (a target, or the local device) offloads them to host memory; runs of layers may
  be recomputed whole. A DP over the chain picks the options of least predicted time
  (XLA's cost analysis through the target's roofline) whose predicted footprint fits.
  The bytes are scaled once so that keeping every residual predicts the no-remat
  footprint. A scanned layer stack (``nn.scan``, ``jax.lax.scan`` over stacked
  parameters) runs segmented as ``apply`` runs it (``scan_segment="auto"``: with
  ``verify``, the segment length XLA measures smallest, one compile per length swept); kept, it
  costs one forward pass of recompute; under ``dots`` or ``dots-no-batch`` it runs one
  iteration per segment under that policy (``nn.remat`` of the block inside the scan).

  A graph of layers (a U-Net's skips; blocks split below their residual adds by
  ``layer_depth``) is solved by model G's DP over kept cuts, a single layer's segment
  allowed any of its options and the layers of one module (a block's pieces) a policy
  as one ``jax.checkpoint``; where its plans miss, or to time them, also the
  layer-boundary budget plan XLA fits (as ``apply(budget_bytes=)``) and the plans of a
  shortlist predicted faster (docs/policies.md, "Graphs").

  Args:
    model_fn, params, batch, layer_depth, target, loss_fn, **model_kwargs: as for
      ``apply`` (``layer_depth`` an int or None: ``"search"`` is ``apply``'s): with
      ``verify``, the budget holds for the step of ``loss_fn``.
    memory_budget: the step's footprint allowed: a float in ``(0, 1]`` is a share of
      the activations (the footprint of the model as written less the fixed bytes; with
      ``verify=False`` and a scanned stack, of it segmented), on top of the fixed bytes;
      an int or a float above 1 is bytes. The step is ``jax.grad`` of the loss: the
      optimizer's state and update are not in it (add them to a budget in bytes).
    verify: compile the chosen plan and, while XLA's footprint exceeds the budget,
      tighten the predicted budget by the excess and solve again; once one fits, loosen
      it by the bytes XLA left unused (or those the plan was predicted over, the more)
      and compile plans predicted faster, returning the fastest predicted that fits (at
      most ``MAX_FIT_COMPILES`` compiles, plus one of the plain step for a fractional
      budget; when none fits and the least found is within 25% of the budget, up to
      6 checkpoint-every-k plans more, least predicted first; the first that fits is
      returned).
      ``False``: the prediction alone, nothing compiled.
    time_steps: also compile up to ``MAX_TIMED_ALTERNATIVES`` other plans that are
      predicted to fit (every layer recomputed, every layer keeping its matrix products,
      the frontier's plan of least footprint and its middle one under the budget, the
      layer-boundary plan),
      run every one that XLA fits (and those that fitted while searching) on this
      machine and return the fastest measured (on a CPU, whose step time grows with
      the footprint, that is often a smaller plan than the one of least predicted
      recompute); of plans whose least time is within the fastest one's median run and
      2% of its least, the one of least footprint. Default: on for the local backend
      with concrete ``params`` and ``batch`` and ``verify``.

  Raises:
    InvalidBudgetError: ``memory_budget`` is not a positive number.
    InfeasibleBudgetError: no plan fits; ``min_feasible_bytes`` is the least footprint
      found (XLA's when ``verify``), and the message says which.
  """
  checks.check_model_fn(model_fn, "fit_nnx(model, batch, memory_budget)",
                        "fit(model.apply, params, batch, memory_budget)")
  checks.check_budget_keyword(model_kwargs, "fit")
  checks.check_given("fit(model_fn, params, batch, memory_budget)", batch=batch,
                     memory_budget=memory_budget)
  checks.check_not_swapped(params, batch,
                           "jaxremat.fit(model.apply, variables, x, memory_budget)")
  checks.check_loss_fn(loss_fn)
  checks.check_arrays("params", params)
  checks.check_arrays("batch", batch)
  checks.check_options(None, layer_depth)
  check_memory_budget(memory_budget)
  if not is_share(memory_budget):  # bytes
    check_holds_inputs(int(memory_budget), params, batch, model_kwargs, "memory_budget",
                       "A float in (0, 1] is a share of the activations instead "
                       "(memory_budget=0.5: half of them).", given=memory_budget)
  resolved = get_target(target)
  timed = checks.check_time_steps(time_steps, verify, resolved, params, batch)
  clock = Stopwatch()
  with clock("trace"):
    traced = checks.traced_model(model_fn, params, batch, model_kwargs, layer_depth, loss_fn,
                                  fit)
  key = input_key(params, batch, model_kwargs)
  arrays = split_kwargs(model_kwargs)[0]  # arguments of the compiled steps
  written = traced

  def segmented_bytes(variant: TracedChain, stacks: tuple[_scan.ScanPlan, ...]) -> int:
    with clock("compile"):  # XLA's footprint with the scanned stacks segmented so
      fn = DropIn(model_fn, Plan(), layer_depth, variant, key, tuple(s.choice for s in stacks))
      return step_bytes(fn, model_kwargs, params, batch, resolved, loss_fn)

  # scanned stacks segmented as apply(verify=True) segments them: the length XLA
  # measures smallest of those swept (every divisor; for an RNN the powers of two too)
  segments = measured_segments(written, segmented_bytes) if verify else "auto"
  traced, scans = _scan.rewrite(written, segments)

  def drop_in(plan: Plan | PolicyPlan) -> DropIn:
    return policy_drop_in(model_fn, plan, layer_depth, written, scans, key)

  steps: dict[PolicyPlan, Any] = {}  # compiled steps kept to time them

  spreads: list[float] = []  # of each timed plan's runs (median over least)

  def time_plans(plans: list[PolicyPlan]) -> list[list[float]]:  # seconds of each run
    with clock("time"):
      times = step_seconds([steps[p] for p in plans], (params, batch, arrays))
    spreads.extend(spread(t) for t in times)
    return times

  def measured(plan: Plan | PolicyPlan, as_written: bool = False) -> int:
    with clock("compile"):
      fn = DropIn(model_fn, plan, layer_depth, written, key) if as_written else drop_in(plan)
      if not (timed and isinstance(plan, PolicyPlan)):
        return step_bytes(fn, model_kwargs, params, batch, resolved, loss_fn)
      loss, _ = training_loss_with_arrays(fn, model_kwargs, loss_fn)
      footprint, steps[plan] = compile_step(gradient_step(loss), params, batch, arrays)
      return footprint.total_bytes

  def replay(layers: TracedChain, kept: tuple[tuple[int, int, int], ...]) -> Replay:
    # the step without checkpoints between the layers, its scans segmented
    loss = training_loss_with_arrays(drop_in(Plan()) if scans else model_fn, model_kwargs,
                                     loss_fn)[0]
    return compile_replay(layers, loss, params, batch, kept, resolved, arrays)

  with clock("profile"):  # as apply: the layer-boundary plans predicted alike
    planner = make_planner(traced, scans, params, batch, model_kwargs, False,
                           resolved, replay if checks.default_profile(
                               resolved, jax.default_backend(), traced) == "compiled" else None,
                           required=False)
  fixed = planner.fixed_bytes
  segmented = frozenset(s.layer for s in scans)  # the scanned stacks fit segments
  if not verify:
    kept = no_remat = planner.total_bytes(Plan())  # a scanned stack's: segmented
  else:  # the compiled profile's compile measured the plain step already
    kept = planner.replay.plain_bytes if planner.replay else measured(Plan())
    no_remat = measured(Plan(), as_written=True) if scans else kept
  budget = budget_in_bytes(memory_budget, fixed, no_remat)
  read_as = budget_read_as(memory_budget, fixed, no_remat)
  if isinstance(planner, GraphPlanner):
    with clock("solve"):
      try:
        found = fit_graph(planner, LayerOptions(traced, roofline_for(resolved)), budget, kept,
                          measured if verify else None, time_plans if timed else None)
      except InfeasibleBudgetError as err:
        raise _infeasible(budget, err.min_feasible_bytes, "XLA-measured, the least of the "
                          "plans fit compiled" if verify else "predicted", traced,
                          read_as, coarse_reason(planner, traced, segmented)) from None
    c = found.chosen
    return Fitted(
        fn=drop_in(c.plan), plan=c.plan, costs=c.costs, chain=planner.chain,
        budget_bytes=budget, fixed_bytes=fixed, no_remat_bytes=no_remat,
        predicted_total_bytes=found.predicted_bytes, predicted_seconds=c.seconds,
        measured_total_bytes=found.footprint, compiled=found.compiled,
        frontier=tuple((b, t) for b, t, _ in pareto([(*p, None) for p in found.points])),
        target=resolved.name if resolved else None, timed=found.timed,
        timing_spread=max(spreads, default=None),
        stage_seconds=dict(clock.seconds), named_products=named_products(traced, c.plan),
        scans=scans)
  with clock("profile"):
    chain = planner.chain
    options = OptionCosts(traced, chain, roofline_for(resolved), scans, written)
    costs = group_costs(options)
  n = chain.n
  final = chain.act_bytes[n] + chain.cot_bytes[n]
  # One calibration: the groups' bytes scaled so that keeping everything predicts its
  # footprint (XLA's, or the backend's estimate without verify).
  keep_all = [c for c in costs if c.group.option.kind == KEEP]
  scale = max(kept - fixed, 1) / max(peak_bytes(keep_all, final), 1)

  def predicted(groups: tuple[GroupCost, ...]) -> int:  # a plan's footprint (bytes)
    return fixed + round(scale * peak_bytes(groups, final))

  allowed = int((budget - fixed) / scale)
  compiled: list[int] = []
  chosen, footprint = None, None
  with clock("solve"):
    points = policy_frontier(costs, n, final)
    frontier = tuple((fixed + round(scale * b), s) for b, s, _ in points)
    search = Search(costs, n, final, allowed, scale,
                    LayerPlans(planner, options, budget, fallbacks=verify), verify, points)
    fitting: list[tuple[tuple[GroupCost, ...], int]] = []  # in the order found, faster each
    for _ in range(MAX_FIT_COMPILES if verify else 1):
      groups = search.next()
      if groups is None or not verify:
        chosen = groups
        break
      got = measured(as_plan(groups))
      compiled.append(got)
      if got <= budget:
        fitting.append((groups, got))
        search.fitted(groups, budget - got, predicted(groups) - got)
      else:
        search.failed(groups, got - budget)
    predicted_least = fixed + round(scale * search.least)  # once the DP found none, else fixed
    if fitting:
      chosen, footprint = fitting[-1]
    elif verify:  # before calling the budget infeasible, the plans a user would try
      layers = search.layer_plans

      def measure_and_record(plan: Plan) -> int:
        compiled.append(measured(as_plan(layers.groups_of(plan))))
        return compiled[-1]

      least = min(compiled) if compiled else predicted_least
      swept = sweep_uniform(planner, budget, least, measure_and_record,
                            lambda p: layers.groups_of(p) in search.tried)
      if swept is not None:
        chosen, footprint = layers.groups_of(swept[0]), swept[1]
  if chosen is None:
    if not compiled:
      raise _infeasible(budget, predicted_least, "predicted", traced, read_as,
                        coarse_reason(planner, traced, segmented))
    deeper = ("; jaxremat.apply(..., layer_depth='search') (apply_nnx for an nnx module), "
              "which plans below these layers too and keeps what XLA measures least, may "
              "reach less" if not segmented and not loops_hold_residuals(
                  planner, traced, segmented) else "")
    raise _infeasible(budget, min(compiled), f"XLA-measured, the least of the {len(compiled)} "
                      f"plans fit compiled{deeper}", traced,
                      read_as, coarse_reason(planner, traced, segmented))
  timings: list[tuple[str, int, float]] = []
  examined = list(search.tried)
  if timed:
    assert footprint is not None
    candidates = [("least predicted recompute", chosen, footprint)]
    candidates += [("another plan that fitted", g, got) for g, got in fitting[-2::-1]]
    within = int((budget * (1 + TIMED_MARGIN) - fixed) / scale)  # in the groups' scale
    for what, groups in alternatives(options, points, search, chosen,
                                      within)[:MAX_TIMED_ALTERNATIVES]:
      got = measured(as_plan(groups))
      compiled.append(got)
      if got <= budget:
        candidates.append((what, groups, got))
    times = time_plans([as_plan(g) for _, g, _ in candidates])
    order = ranked(times, [got for _, _, got in candidates])
    timings = [(candidates[k][0], candidates[k][2], min(times[k])) for k in order]
    _, chosen, footprint = candidates[order[0]]
    examined += [g for _, g, _ in candidates]
  # the plans examined join the sampled frontier where they beat it
  frontier = tuple((b, s) for b, s, _ in pareto(
      [(*point, None) for point in frontier]
      + [(predicted(g), sum(c.seconds for c in g), None) for g in (*examined, chosen)]))
  plan = as_plan(chosen)
  return Fitted(
      fn=drop_in(plan), plan=plan, costs=chosen,
      chain=chain, budget_bytes=budget, fixed_bytes=fixed, no_remat_bytes=no_remat,
      predicted_total_bytes=predicted(chosen),
      predicted_seconds=sum(c.seconds for c in chosen), measured_total_bytes=footprint,
      compiled=tuple(compiled), frontier=frontier,
      target=resolved.name if resolved else None, timed=tuple(timings),
      timing_spread=max(spreads, default=None),
      stage_seconds=dict(clock.seconds), named_products=named_products(traced, plan),
      scans=scans)


def _infeasible(budget: int, least: int, how: str, traced: TracedChain, read_as: str,
                reason: str) -> InfeasibleBudgetError:
  """The error for a budget no plan meets, with ``coarse_reason``'s ``reason`` (layers
  that hold most of the residuals where checkpoints between layers cannot reach)."""
  hint = one_layer_hint(traced) or (
      f"Checkpoints fall between layers only, and {reason}" if reason else "")
  return InfeasibleBudgetError(
      f"no plan fits the step in {budget} bytes ({fmt_bytes(budget)}{read_as}); the least "
      f"footprint found is {least} bytes ({fmt_bytes(least)}, {how}). Raise the budget to at "
      "least that, or use a smaller batch." + (f" {hint}" if hint else ""),
      budget_bytes=budget, min_feasible_bytes=least)
