"""``jaxremat.apply``: trace, profile, solve and emit in one call."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

from jaxremat._api import checks
from jaxremat._api.advice import (MIN_SAVING, coarse_reason, search_hint, warn_as_written,
                                  warn_if_coarse, warn_boundaries_kept, warn_one_layer)
from jaxremat._api.dropin import DropIn, input_key
from jaxremat._api.finer import (FINER_GAIN, FINER_LEVELS, finer_note, plan_finer,
                                 searched_note)
from jaxremat._api.loss import LossFn, training_loss_with_arrays
from jaxremat._api.measure import step_bytes
from jaxremat._api.planner import (ChainPlanner, Planner, check_budget_method,
                                   check_holds_inputs, make_planner, scale_estimate,
                                   sharded_inputs)
from jaxremat._api.result import AS_WRITTEN, Remat
from jaxremat._api.stopwatch import Stopwatch
from jaxremat._api.verify import (Measured, confirm_plan, fit_budget, measured_segments,
                                  verify_plan)
from jaxremat._backends.plain_step import PlainStep, compile_plain_step
from jaxremat._backends.replay import Replay, chain_kept
from jaxremat._backends.targets import Target, get_target
from jaxremat._jaxpr import scan as _scan
from jaxremat._jaxpr.scan import ScanPlan
from jaxremat._jaxpr.trace import TracedChain
from jaxremat._model.chain import Plan


@checks.positional("model_fn", "params", "batch")
def apply(
    model_fn: Callable[..., Any],
    params: Any,
    batch: Any = checks.REQUIRED,
    *,
    method: str = "optimal",
    budget_bytes: int | float | None = None,
    plan: Plan | None = None,
    layer_depth: int | str | None = None,
    refine: bool = True,
    verify: bool | None = None,
    calibrate: bool = False,
    profile: str | None = None,
    scan_segment: int | str | None = "auto",
    target: str | Target | None = None,
    loss_fn: LossFn | None = None,
    **model_kwargs: Any,
) -> Remat:
  """Chooses checkpoints for ``model_fn`` and returns a rematerialised drop-in.

  Args:
    model_fn: ``model_fn(params, batch, **model_kwargs)``, e.g. a Flax ``model.apply``.
    params: the variables (any pytree of arrays). When params or batch are sharded
      over several devices (e.g. with a ``NamedSharding``), every byte count and
      prediction is per device.
    batch: an example batch (any pytree of arrays) with the shapes used in training.
    method: a solver name (see ``jaxremat.solve``); ignored when ``plan`` is given.
      Among plans of equal peak, ``"optimal"`` takes one that recomputes least.
    budget_bytes: fit the training step in this many bytes with the fewest recomputed
      FLOPs; implies ``method="budget"``. Raises ``InfeasibleBudgetError`` carrying the
      least footprint reached when no plan fits. A float is rounded down; ``inf`` means
      no budget.
    plan: use these checkpoints instead of solving.
    layer_depth: name-stack depth that defines a layer, exactly (1: the root module's
      children, 2: theirs); each call of a module called in a loop, each call reading
      the last (shared weights), is a layer. Default: the root module's children, each
      split into its own children where it makes a large share of the activation bytes
      and the layers stay a chain (the blocks inside an ``Encoder``);
      ``Remat.decomposition`` says why.
      ``"search"``: those layers, then one level below them and, while XLA measures
      less, a second (a transformer's blocks split into their attention and MLP,
      planned as a graph); each level's optimal plan confirmed as by default (up to 4
      compiles), the least kept when it is at least 1% below the level above. Not with
      ``plan``, ``budget_bytes``, another ``method`` or ``verify=False``; a model whose
      scanned stack is segmented is not searched.
    refine: for ``method="optimal"``, improve model R's optimum (a chain's) or model G's
      (a graph's, with the compiled profile) by local search on the prediction of XLA's
      footprint (``predict_total_bytes``).
    verify: compile the training step (``jax.grad`` of ``loss_fn``) for what the default
      compiles (below), then up to ``MAX_COMPILES - 1`` candidates predicted within 10%
      of the least (model R's and model A's optima, the best uniform plans, the
      estimate's near ties), and keep the one XLA measures smallest (within 0.1%, the
      one that recomputes least; within 1%, one that recomputes at least 1% fewer
      FLOPs): never above the default's plan but by that trade; with
      ``scan_segment="auto"``, first measure every segment length of each scanned stack.
      With ``budget_bytes``, instead tighten the plan until XLA's footprint fits. With
      ``plan``, measure that plan only. The figures are kept in ``Remat.verified``.
      Default (None): confirm the chosen plan (or the given ``plan``) with one compile.
      When XLA's footprint is within 3% of the prediction, also compile up to 3 plans
      the estimate ties with it (one checkpoint from it or from model R's optimum,
      predicted at most 1% above it; when XLA measures the first two as the plan, the
      third is the checkpoint-every-k plan of least prediction that is no such tie); when
      it is further off, the 3 leading candidates
      (with the compiled profile, the estimate's best checkpoint-every-k plan first);
      keep XLA's least. With a scanned stack and ``scan_segment="auto"``, the chosen
      plan first measures each stack's segment length (two or three compiles a stack).
      With ``budget_bytes``, fit the budget as above. With another ``method`` than
      ``"optimal"``, both compile that solver's plan once, for XLA's figure (no
      candidates; the plan is returned as the solver gave it). ``False``:
      compile nothing (the prediction alone).
    calibrate: compile each layer's backward alone and take what XLA's temp needs beyond
      its residuals as its workspace (one small compile per layer). A convolution
      compiled alone needs more than in the whole step: conv nets are over-predicted.
    profile: what predicts XLA's footprint of a plan. ``"jaxpr"``: the estimate, from
      the jaxpr and the backend's rules, scaled to XLA's footprint of the model as
      written where ``apply`` compiles it anyway (its own plan for a chain, no budget,
      ``verify`` not False): the plan without checkpoints then predicts XLA's figure.
      ``"compiled"``: the compiled profile: the training step without checkpoints
      between the layers (its scans segmented) is compiled once (for ``target``) and
      each plan replays XLA's own schedule and buffers of it (docs/memory-model.md); not
      with sharded inputs. Default (None): ``"compiled"`` for a graph of layers (whose
      jaxpr profile is model G alone), and for a chain without segmented scans on a GPU
      (a ``target``, or the local device) or drawing random bits (dropout: XLA:CPU
      keeps the bits as the key's kind makes them), where the model allows it; else
      ``"jaxpr"``, its step as written compiled with a dump:
      when XLA misses the estimate's plan by more than 3%, the compiled profile's plan
      is the first candidate compiled, and if XLA measures it least, the compiled
      profile predicts it. ``Remat.profile`` says which predicted.
    scan_segment: scanned layer stacks (a ``jax.lax.scan`` / ``nn.scan`` at the top
      level of a layer, whose carry is the activation and whose ``xs`` are stacked
      parameters) and RNNs over time (``nn.RNN``: a scan whose ``xs`` come from the
      batch; ``ScanPlan.recurrent``) run as an outer scan over segments of ``k``
      iterations, each under ``jax.checkpoint`` (where ``k`` does not divide the
      length, the last segment is shorter). ``"auto"``: the ``k`` XLA measures
      smallest, of every divisor of the length and the estimate's choice (for an RNN
      the powers of two too) with ``verify=True``; by default, for the plan ``apply``
      chooses, of the estimate's choice and the lengths beside it (two or three
      compiles a stack); else the estimate's choice (a divisor for a stack, any ``k``
      for an RNN, whose last chunk is padded). A ``k`` of 1 measured so is compiled
      twice: an inner scan of one block, and the checkpointed block itself
      (``nn.scan(nn.remat(block))``; ``ScanPlan.block``), and the smaller kept. An int:
      that ``k`` for every stack (inner scans); ``None``: scans are left as they are
      (one opaque layer).
    target: plan for this GPU instead of the local backend, from any machine (no GPU
      needed): ``"h100"``, ``"h200"``, ``"a100"``, a target-config text or file, or a
      ``Target``.
      The profile models that GPU's XLA, and every compile (the confirming one, verify,
      budgets) is XLA's GPU compiler's for it (JAX's CUDA plugin is needed:
      ``TargetUnavailableError`` says how to install it). params and batch may be
      ``jax.ShapeDtypeStruct``s; nothing is allocated.
    loss_fn: the training loss of the model's output, ``loss_fn(output) -> float
      scalar`` (with ``mutable=``, of the prediction alone), in every step compiled here
      (the compiled profile, the confirm, verify, budgets), e.g. ``lambda logits:
      optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()``: a
      cross-entropy's softmax is activation memory too. Default: the sum of the mean
      squares of the float outputs. With ``verify=False`` and the jaxpr profile nothing is
      compiled and it is only checked. Labels it closes over are constants of the
      compiled step (with abstract inputs and no labels at hand, build them in the
      function, e.g. ``jnp.zeros``).
    **model_kwargs: the keyword arguments of a training call of ``model_fn`` (``rngs=``,
      ``mutable=``, ``train=``), with which it is traced and compiled here; array leaves
      are traced, the rest is static. ``fn`` takes them on every call, as ``model_fn``
      does: they are not remembered.

  Returns:
    A ``Remat`` whose ``fn(params, batch, **model_kwargs)`` equals ``model_fn``. When a
    layer reads a value made two or more layers earlier (U-Net, DenseNet), the layers
    are planned as a graph (``Remat.is_graph``): its ``chain`` is a ``GraphChain`` and
    ``method`` is one of ``"optimal"``, ``"none"``, ``"every-layer"``,
    ``"best-uniform"``, ``"brute"``.

  Raises:
    NotAChainError, EmptyModelError, UnsupportedModelError, UnknownMethodError,
    InvalidPlanError, InvalidBudgetError, InfeasibleBudgetError, UnsupportedScanError
    and InvalidArgumentError (a TypeError) for arguments of the wrong type or range;
    the table in docs/errors.md lists each case.
  """
  checks.check_model_fn(model_fn)
  checks.check_budget_keyword(model_kwargs, "apply")
  checks.check_given("apply(model_fn, params, batch)", batch=batch)
  checks.check_not_swapped(params, batch, "jaxremat.apply(model.apply, variables, x)")
  checks.check_loss_fn(loss_fn)
  checks.check_arrays("params", params)
  checks.check_arrays("batch", batch)
  checks.check_options(plan, layer_depth, allow_search=True)
  budget = checks.check_budget(budget_bytes) if budget_bytes is not None else None
  search = layer_depth == checks.SEARCH
  if search:
    checks.check_search(plan, method, budget, verify)
    layer_depth = None
  assert not isinstance(layer_depth, str)
  if budget is not None:
    check_holds_inputs(budget, params, batch, model_kwargs, "budget_bytes",
                       "Raise the budget or shrink the batch.")
  if profile is not None:
    checks.check_profile(profile)
  if budget is not None:
    check_budget_method(method)
    verify = verify is None or bool(verify)
  resolved = get_target(target)
  clock = Stopwatch()
  with clock("trace"):
    traced = checks.traced_model(model_fn, params, batch, model_kwargs, layer_depth, loss_fn,
                                  apply)
  key = input_key(params, batch, model_kwargs)

  footprints: dict[tuple[Any, ...], int] = {}  # XLA's, by program: none compiled twice

  def measured(plan: Plan, traced: TracedChain = traced, scans: tuple[ScanPlan, ...] = (),
               depth: int | None = layer_depth) -> int:
    program = _program(plan, scans, depth)
    if program not in footprints:
      with clock("compile"):
        drop_in = DropIn(model_fn, plan, depth, traced, key, _segments(scans))
        footprints[program] = step_bytes(drop_in, model_kwargs, params, batch, resolved,
                                         loss_fn)
    return footprints[program]

  written = traced  # the model as written: no checkpoints, its scans as they are
  scans: tuple[ScanPlan, ...] = ()
  if scan_segment is not None:
    segment: int | str | tuple[int, ...] = scan_segment
    # the segment length XLA measures smallest: of those swept (_scan.sweep_lengths)
    # with verify; by default (the plan apply chooses and confirms), of the estimate's
    # and the lengths beside it
    if scan_segment == "auto" and (verify or (verify is None and plan is None
                                              and method == "optimal")):
      segment = measured_segments(traced, lambda t, s: measured(Plan(), t, s),
                                  nearby=verify is None)
    traced, scans = _scan.rewrite(traced, segment)

  @functools.cache  # compiled once, replayed over the layers of every level
  def plain_step() -> PlainStep:
    # no checkpoint between the layers; the scans segmented as every plan runs them
    fn = (DropIn(model_fn, Plan(), layer_depth, traced, key, _segments(scans)) if scans
          else model_fn)
    loss, arrays = training_loss_with_arrays(fn, model_kwargs, loss_fn)
    return compile_plain_step(loss, params, batch, resolved, arrays)

  def compiled(layers: TracedChain, kept: tuple[tuple[int, int, int], ...]) -> Replay:
    return plain_step().replay(layers, kept)  # the compiled profile

  replayed = (profile or checks.default_profile(resolved, jax.default_backend(),
                                                traced)) == "compiled"
  with clock("profile"):
    planner = make_planner(traced, scans, params, batch, model_kwargs, calibrate,
                           resolved, compiled if replayed else None,
                           required=profile is not None)
  measure_plan = lambda p: measured(p, traced, scans)  # noqa: E731
  chosen = plan is None
  # The step as written, compiled for the report anyway, first: XLA's total over the
  # estimate's, which then only spreads it over the layers. Where the compiled profile
  # can replay it, compiled with a dump: a second opinion when XLA misses the estimate.
  plain_bytes, second = None, None
  if (chosen and budget is None and verify is not False and not traced.is_graph
      and planner.profile == "jaxpr"):
    if scans:  # the stacks segmented, no checkpoint between layers: compiled where the
      plain_bytes = measured(Plan(), traced, scans)  # segment length was measured
    elif profile is None and not sharded_inputs(params, batch, model_kwargs):
      plain_bytes = footprints[_program(Plan(), (), layer_depth)] = plain_step().total_bytes
      assert isinstance(planner, ChainPlanner)
      second = _SecondOpinion(planner, traced, compiled, refine)
    else:
      plain_bytes = measured(Plan(), written)
  planner = scale_estimate(planner, plain_bytes)
  # the stacks segmented with no checkpoint between layers, compiled: a candidate too
  known: Measured | None = {(): plain_bytes} if scans and plain_bytes is not None else None
  with clock("solve"):
    plan, verified = _choose(planner, plan, method, budget, refine, verify, measure_plan,
                             second, known, searchable=not scans)
  if second is not None and second.proposed(plan):
    planner = second.planner()  # it proposed the plan XLA measured least: it predicts it
  # The layers found first answer for the model as written; a search may plan deeper ones.
  first, planned_depth, decomposition = planner, layer_depth, traced.decomposition
  if search and scans:
    decomposition += "; layer_depth='search': not searched below a segmented scanned stack"
  elif search:
    assert verified  # check_search: the plan was confirmed or verified
    coarse = least = min(verified.values())
    for level in range(FINER_LEVELS):  # one level down while XLA measures less
      with clock("solve"):
        finer = plan_finer(model_fn, params, batch, model_kwargs, traced, calibrate, resolved,
                           refine, lambda p, t, d: measured(p, t, (), d), compiled, profile,
                           plain_bytes)
      if finer is None or finer.footprint >= least * (1 - FINER_GAIN):
        if level == 0:
          decomposition += searched_note(finer, least)
        break
      traced, planner, plan, planned_depth = finer.traced, finer.planner, finer.plan, finer.depth
      least, verified = finer.footprint, finer.compiled
      decomposition = finer_note(finer, coarse)
  as_written = None
  # the scanned stacks the plan segments (None: the user left scans as they are)
  segmented = None if scan_segment is None else frozenset(s.layer for s in scans)
  # Compiled plans, all of jaxremat's choosing: never return one above the model as written.
  if chosen and budget is None and verified and scan_segment in ("auto", None):
    if first.replay and first.replay.plain_bytes and not scans:
      as_written = first.replay.plain_bytes  # the compiled profile compiled it
    else:
      as_written = measured(Plan(), written)
    # a plan saving (next to) nothing only recomputes; of the least compiled, as the
    # trade rule may return a plan within 1% above it (a user's seq2seq: as written 26.55,
    # the least 26.07 MiB, the plan returned 26.32)
    least = min(verified.values())
    above = verified.get(plan.checkpoints, least) > as_written
    if method == "optimal" and (  # another solver's plan is returned as asked
        above
        or (as_written - least < MIN_SAVING * as_written and (plan.checkpoints or scans))):
      warn_as_written(as_written, least, coarse_reason(planner, traced, segmented))
      plan, traced, scans = Plan((), method=AS_WRITTEN), written, ()
      planner, planned_depth, decomposition = first, layer_depth, written.decomposition
  coarse = (chosen and method == "optimal" and plan.method != AS_WRITTEN
            and warn_if_coarse(planner, plan, traced, segmented,
                               _measured_saving(as_written, verified, plan)))
  if (chosen and method == "optimal" and layer_depth is None and not search and not scans
      and not coarse and verified and plan.checkpoints in verified):  # default layers
    decomposition += search_hint(planner, traced, verified[plan.checkpoints])
  if chosen and method != "none" and not scans and plan.method != AS_WRITTEN:
    warn_one_layer(traced)
    if not plan.checkpoints and len(traced.layers) > 1:
      warn_boundaries_kept(traced, explained=coarse)
  with clock("emit"):
    fn = DropIn(model_fn, plan, planned_depth, traced, key, _segments(scans))
  return Remat(fn=fn, plan=plan, chain=planner.chain, solve_seconds=clock.seconds["solve"],
               fixed_bytes=planner.fixed_bytes, verified=verified, scans=scans,
               as_written_bytes=as_written,
               decomposition=decomposition, stage_seconds=dict(clock.seconds),
               target=resolved.name if resolved else None, _planner=planner,
               device_memory_bytes=resolved.memory_bytes if resolved else None)


def _measured_saving(as_written: int | None, verified: dict[tuple[int, ...], int] | None,
                     plan: Plan) -> tuple[int, int] | None:
  """XLA's footprints of the model as written and of ``plan`` (bytes), where both were
  compiled."""
  if as_written is None or not verified or plan.checkpoints not in verified:
    return None
  return as_written, verified[plan.checkpoints]


def _program(plan: Plan, scans: tuple[ScanPlan, ...], depth: int | None) -> tuple[Any, ...]:
  """What a compiled step of ``plan`` at ``depth`` depends on: no program compiled twice."""
  return (plan.checkpoints, plan.inner,
          tuple((s.layer, s.choice) for s in scans if s.rematerialised), depth)


class _SecondOpinion:
  """The compiled profile beside the estimate, made and solved only when asked (when
  XLA misses the estimate's plan): its optimal plan is then a candidate."""

  def __init__(self, estimate: ChainPlanner, traced: TracedChain,
               compiled: Callable[[TracedChain, tuple[tuple[int, int, int], ...]], Replay],
               refine: bool):
    self._estimate, self._traced, self._compiled, self._refine = estimate, traced, compiled, refine
    self._planner: ChainPlanner | None = None
    self._plan: Plan | None = None

  def planner(self) -> ChainPlanner:
    if self._planner is None:
      replay = self._compiled(self._traced, chain_kept(self._estimate.chain.act_bytes))
      self._planner = dataclasses.replace(self._estimate, replay=replay)
    return self._planner

  def __call__(self) -> tuple[Plan, ...]:
    self._plan = self.planner().solve("optimal", self._refine)
    return (self._plan,)

  def proposed(self, plan: Plan) -> bool:
    """Whether ``plan`` is the compiled profile's, asked for."""
    return self._plan is not None and plan.checkpoints == self._plan.checkpoints


def _choose(planner: Planner, plan: Plan | None, method: str, budget: int | None, refine: bool,
            verify: bool | None, measure_plan: Callable[[Plan], int],
            second: _SecondOpinion | None = None, known: Measured | None = None,
            searchable: bool = True) -> tuple[Plan, Measured | None]:
  """The plan: the given one, the budget plan (fitted to XLA's figure unless ``verify`` is
  False), or the solver's (confirmed by default, verified among candidates with
  ``verify``; ``second``: the compiled profile's opinion, asked when XLA misses the
  estimate; ``known``: plans compiled already, candidates of the confirm); and what was
  compiled. ``searchable``: ``layer_depth='search'`` applies (no segmented scanned
  stack), for the error of an infeasible budget."""
  if plan is not None:
    planner.validate(plan)
    return plan, {plan.checkpoints: measure_plan(plan)} if verify is not False else None
  if budget is not None:
    if verify:  # where the model says no, XLA may still fit one of the fallback plans
      return fit_budget(planner, budget, measure_plan, searchable)
    return planner.solve_budget(budget), None
  plan = planner.solve(method, refine)
  if verify and method == "optimal":  # what the default compiles, then the candidates
    return verify_plan(planner, plan, measure_plan,
                       known=confirm_plan(planner, plan, measure_plan, second, known)[1])
  if verify is None and method == "optimal":
    return confirm_plan(planner, plan, measure_plan, second, known)
  if verify is not False:  # another solver's plan, as asked: compiled once, for the report
    return plan, {plan.checkpoints: measure_plan(plan)}
  return plan, None


def _segments(scans: tuple[ScanPlan, ...]) -> tuple[int, ...] | None:
  return tuple(s.choice for s in scans) if scans else None
