"""``jaxremat.apply``: trace, profile, solve and emit in one call."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxremat import _compat
from jaxremat._chain import Chain, Plan, peak_bytes, recompute_flops, validate_plan
from jaxremat._emit import emit
from jaxremat._errors import (InfeasibleBudgetError, InputMismatchError, InvalidArgumentError,
                              InvalidBudgetError, JaxrematError, NotAChainError,
                              UnsupportedModelError)
from jaxremat._estimate import estimate_temp_bytes
from jaxremat._simulate import simulate_peak_bytes
from jaxremat._profile import Buffers, profile
from jaxremat._refine import MAX_LAYERS as MAX_REFINE_LAYERS, neighbours, refine as refine_plan
from jaxremat import _scan, _sharding
from jaxremat._trace import TracedChain, is_array_leaf, split_kwargs, trace
from jaxremat._measure import measure
from jaxremat.solvers import solve, uniform_plan
from jaxremat.solvers._budget import budget_as_int

#: Strategies listed by ``Remat.report`` next to the chosen plan.
REPORTED_METHODS = ("none", "every-layer", "sqrt", "best-uniform", "optimal")


@dataclasses.dataclass(frozen=True, eq=False)
class Remat:
  """The result of ``jaxremat.apply``.

  Attributes:
    fn: a drop-in for ``model_fn``: same signature, same outputs; each non-final
      segment of the plan runs under ``jax.checkpoint``.
    plan: the checkpoints chosen.
    chain: the profiled layers (bytes, FLOPs, names).
    solve_seconds: wall time of the solver.
    fixed_bytes: parameters, batch, array kwargs and parameter gradients (bytes).
    verified: with ``apply(verify=True)``, XLA's footprint (bytes) of each candidate
      plan's training step, by checkpoints.
    scans: one ``ScanPlan`` per scanned layer stack (its segment length, its uniform
      chain), in order.
  """

  fn: Callable[..., Any]
  plan: Plan
  chain: Chain
  solve_seconds: float
  fixed_bytes: int
  traced: TracedChain = dataclasses.field(repr=False)
  buffers: Buffers = dataclasses.field(repr=False)
  verified: dict[tuple[int, ...], int] | None = None
  scans: tuple[_scan.ScanPlan, ...] = ()

  @property
  def predicted_peak_bytes(self) -> int:
    """Model R's activation peak of the plan (bytes; the simulator's for nested plans)."""
    return simulate_peak_bytes(self.chain, self.plan)

  @property
  def predicted_total_bytes(self) -> int:
    """Predicted XLA footprint of ``jax.grad`` of a scalar loss of ``fn`` (bytes)."""
    return self.predict_total_bytes(self.plan)

  def predict_total_bytes(self, plan: Plan) -> int:
    """Predicted XLA footprint of the gradient step under any ``plan`` (bytes).

    Arguments (params, batch, array kwargs) and the parameter gradients are held for the
    whole step; on top of them the temp bytes peak as model R's live buffers less those
    XLA can place in gradient buffers not yet written (``_estimate``). A multi-level
    plan is predicted by the event simulator of model R instead (no hosting).
    """
    if plan.is_nested:
      return self.fixed_bytes + simulate_peak_bytes(self.chain, plan) - self.chain.act_bytes[0]
    return self.fixed_bytes + estimate_temp_bytes(self.chain, self.buffers, plan)

  def plot(self, path: str | os.PathLike[str], compare: tuple[str, ...] = ("none", "every-layer", "sqrt"),
           title: str | None = None) -> None:
    """Saves a step plot of the live bytes through forward, recompute and backward.

    The chosen plan and each strategy in ``compare`` are replayed by model R's event
    simulator (``simulate_peak_bytes``); each curve's peak is marked. Needs matplotlib
    (``pip install "jaxremat[plot]"``).

    Args:
      path: the file to write; its suffix picks the format (``.png``, ``.svg``).
      compare: solver methods drawn next to the chosen plan (bytes over event index).
      title: the figure's title (default: the number of layers).

    Raises:
      ImportError: matplotlib is not installed.
      UnknownMethodError: a name in ``compare`` is not a solver method.
    """
    from jaxremat._plot import plot_timelines  # matplotlib is optional
    plans = [(f"chosen: {self.plan.method or 'plan'}", self.plan)]
    plans += [(method, solve(self.chain, method)) for method in compare]
    plot_timelines(path, self.chain, plans, title=title or f"{self.chain.n} layers")

  def report(self) -> str:
    """A per-layer table and the predicted peak of each strategy."""
    chain, kept = self.chain, set(self.plan.checkpoints)
    last = self.plan.checkpoints[-1] if self.plan.checkpoints else 0
    rows = [("#", "layer", "output", "residuals", "of which input", "plan", "GFLOP")]
    for i in range(1, chain.n + 1):
      status = "kept" if i in kept else ("recomputed" if i <= last else "saved")
      rows.append((
          str(i), chain.names[i - 1], _fmt(chain.act_bytes[i]), _fmt(chain.res_bytes[i - 1]),
          _fmt(chain.input_res_bytes[i - 1]), status, f"{chain.flops[i - 1] / 1e9:.3f}"))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"input x_0: {_fmt(chain.act_bytes[0])}; fixed (params, batch, grads): {_fmt(self.fixed_bytes)}")
    lines.append(f"{'strategy':<14}{'checkpoints':>12}{'model-R peak':>16}{'predicted total':>18}{'recompute GFLOP':>18}")
    for method in dict.fromkeys([*REPORTED_METHODS, self.plan.method]):
      plan = self.plan if method == self.plan.method else solve(chain, method)
      lines.append(
          f"{method:<14}{len(plan.checkpoints):>12}{_fmt(simulate_peak_bytes(chain, plan)):>16}"
          f"{_fmt(self.predict_total_bytes(plan)):>18}{recompute_flops(chain, plan) / 1e9:>18.3f}")
    lines.append(f"chosen: {self.plan.method} checkpoints={list(self.plan.checkpoints)}")
    for s in self.scans:
      lines.append(
          f"scan in layer {s.layer + 1} {s.name!r}: {s.length} iterations, segments of "
          f"{s.segment} (model-R peak {_fmt(s.peak_bytes)}; optimal plan "
          f"{_fmt(s.optimal_peak_bytes)}; none {_fmt(peak_bytes(s.chain, Plan()))})")
    return "\n".join(lines)


def _fmt(num_bytes: int) -> str:
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if abs(num_bytes) >= scale:
      return f"{num_bytes / scale:.2f} {unit}"
  return f"{num_bytes} B"


def apply(
    model_fn: Callable[..., Any],
    params: Any,
    batch: Any,
    *,
    method: str = "optimal",
    budget_bytes: int | None = None,
    plan: Plan | None = None,
    layer_depth: int | None = None,
    refine: bool = True,
    verify: bool | None = None,
    calibrate: bool = False,
    scan_segment: int | str | None = "auto",
    **model_kwargs: Any,
) -> Remat:
  """Chooses checkpoints for ``model_fn`` and returns a rematerialised drop-in.

  Args:
    model_fn: ``model_fn(params, batch, **model_kwargs)``, e.g. a Flax ``model.apply``.
      It must be a chain of layers at the chosen granularity.
    params: the variables (any pytree of arrays).
    batch: an example batch (any pytree of arrays) with the shapes used in training.
      When params or batch are jax.Arrays sharded over several devices (e.g. with a
      ``NamedSharding``), every byte count and prediction is per device: a sharded
      input counts one shard, and each activation the fraction XLA's sharding
      propagation gives it (one compile of the forward pass).
    method: a solver name (see ``jaxremat.solve``); ignored when ``plan`` is given.
      Among plans of equal model-R peak, ``"optimal"`` takes one that recomputes least.
    budget_bytes: fit the training step in this many bytes (the footprint
      ``predicted_total_bytes`` stands for, by model R) with the fewest recomputed
      FLOPs; implies ``method="budget"``. Raises ``InfeasibleBudgetError`` carrying the
      least feasible footprint when no plan fits. A float is rounded down; ``inf``
      means no budget.
    plan: use these checkpoints instead of solving.
    layer_depth: name-stack depth that defines a layer, exactly (1: the root module's
      children, 2: theirs). Default: the root module's children, each split into its own
      children where it makes a large share of the activation bytes and the layers stay
      a chain (the blocks inside an ``Encoder``); ``Remat.traced.decomposition`` says why.
    refine: for ``method="optimal"``, improve the model-R optimum by local search on
      the XLA-aware estimate (``predict_total_bytes``), which knows that XLA can place
      activations in gradient buffers not yet written.
    verify: compile the training step (``jax.grad`` of a sum of mean squares of the
      float outputs; with ``mutable=``, of the prediction alone) for the chosen plan,
      model R's optimum, model A's optimum (Hong et al.'s coarser model, up to 1,000
      layers), the three best uniform plans by the estimate and, for the chosen plan
      and model R's optimum, up to two plans one checkpoint away that the estimate ties
      with it (within 1%), and keep the one XLA measures smallest (within 0.1%, the one
      that recomputes least); with ``scan_segment="auto"``, first measure every segment
      length of each scanned stack likewise. With ``budget_bytes``, instead tighten the
      plan until XLA's footprint fits the budget. Costs one whole-step compile per
      candidate (4 to 10); the figures are kept in ``Remat.verified``. Default: on with
      ``budget_bytes``, off otherwise.
    calibrate: compile each layer's backward alone and take what XLA's temp needs
      beyond its residuals (and beyond the CPU buffers the estimate models itself,
      docs/memory-model.md) as its workspace (one small compile per layer; on the CPU
      zoo it narrows the error on transformer blocks and widens it on ResNets).
    scan_segment: scanned layer stacks (a ``jax.lax.scan`` / ``nn.scan`` at the top
      level of a layer, whose carry is the activation and whose ``xs`` are stacked
      parameters) run as an outer scan over segments of ``k`` iterations, each segment
      under ``jax.checkpoint``. ``"auto"``: the ``k`` (a divisor of the length) of
      least estimated peak for the stack (``jaxremat._scan.choose_segment``); an int:
      that ``k`` for every stack; ``None``: scans are left as they are (one opaque
      layer). Other scans (over batch data, e.g. an RNN over time) are always left as
      they are.
    **model_kwargs: passed to ``model_fn`` on every call (``rngs=``, ``mutable=``,
      ``train=``); array leaves are traced, the rest is static.

  Returns:
    A ``Remat`` whose ``fn(params, batch, **model_kwargs)`` equals ``model_fn``. When a
    layer reads a value made two or more layers earlier (U-Net, DenseNet), the layers
    are planned as a graph instead and a ``GraphRemat`` (same ``fn``, ``plan``,
    ``predicted_total_bytes``, ``report``) is returned; it takes ``method`` in
    ``"optimal"``, ``"none"``, ``"every-layer"``, ``"best-uniform"`` or ``plan``.

  Raises:
    NotAChainError, EmptyModelError, UnsupportedModelError, UnknownMethodError,
    InvalidPlanError, InvalidBudgetError, InfeasibleBudgetError, UnsupportedScanError
    (a reverse scan over stacked parameters, or one whose carry is not the
    activation), and InvalidArgumentError (a TypeError) for arguments of the wrong
    type or range; the table in docs/errors.md lists each case.
  """
  if not callable(model_fn):
    raise InvalidArgumentError(
        f"model_fn must be callable (e.g. model.apply), got {type(model_fn).__name__}.")
  _check_arrays("params", params)
  _check_arrays("batch", batch)
  _check_options(plan, layer_depth)
  if budget_bytes is not None:
    budget_bytes = _check_budget(budget_bytes)
  try:
    traced = trace(model_fn, params, batch, model_kwargs, layer_depth)
  except NotAChainError:  # skip tensors: plan the layers as a graph (jaxremat._graph)
    from jaxremat._graph_api import apply_graph  # it imports this module
    return apply_graph(model_fn, params, batch, method=method, plan=plan, layer_depth=layer_depth,
                       model_kwargs=model_kwargs, calibrate=calibrate, verify=verify,
                       unsupported={"budget_bytes": budget_bytes is not None})
  _check_float_output(traced)
  scans: tuple[_scan.ScanPlan, ...] = ()
  if scan_segment is not None:
    if verify and scan_segment == "auto":
      scan_segment = _measured_segments(traced, lambda t, s: measure(_scalar_loss(
          _DropIn(model_fn, Plan(), layer_depth, t, _key(params, batch, model_kwargs), s),
          model_kwargs), params, batch).total_bytes)
    traced, scans = _scan.rewrite(traced, scan_segment)
  arrays, _, _ = split_kwargs(model_kwargs)
  prof = profile(traced, calibrate=calibrate)
  chain = _scan.with_workspace(prof.chain, scans) if scans else prof.chain
  start = time.perf_counter()
  fixed = _fixed_bytes(params, batch, arrays)
  if _sharding.is_sharded((params, batch, arrays)):  # bytes per device from here on
    flat = jax.tree_util.tree_leaves((params, batch, arrays))
    prof = _sharding.per_device_profile(traced, dataclasses.replace(prof, chain=chain), flat)
    chain = prof.chain
    fixed = (_sharding.tree_device_bytes((params, batch, arrays))
             + _sharding.tree_device_bytes(params, floats_only=True))
  key = _key(params, batch, model_kwargs)
  verified = None
  if verify is None:
    verify = budget_bytes is not None
  if plan is None and budget_bytes is not None:
    try:
      plan = _solve_within(chain, budget_bytes, fixed, method)
    except InfeasibleBudgetError:
      if not verify or budget_bytes < fixed:  # below parameters, batch and gradients
        raise
      plan = None  # model R says no; XLA may still fit one of the fallback plans
    if verify:
      least = solve(chain, "optimal")
      fallback = [refine_plan(chain, prof.buffers, least), least,
                  *_best_uniform_plans(chain, prof.buffers, 3)]
      plan, verified = _fit_measured(
          chain, plan, budget_bytes, fixed, fallback,
          lambda p: measure(_scalar_loss(_DropIn(model_fn, p, layer_depth, traced, key, scans),
                                         model_kwargs), params, batch).total_bytes)
  elif plan is None:
    plan = solve(chain, method)
    if method == "optimal" and refine:
      plan = refine_plan(chain, prof.buffers, plan)
  else:
    validate_plan(plan, chain.n)
  seconds = time.perf_counter() - start
  if verify and method == "optimal" and budget_bytes is None:
    optimum = solve(chain, "optimal")
    candidates = [plan, optimum, *_best_uniform_plans(chain, prof.buffers, 3),
                  *_near_ties(chain, prof.buffers, plan, 2),
                  *_near_ties(chain, prof.buffers, optimum, 2)]
    if chain.n <= _MODEL_A_MAX_LAYERS:
      candidates.append(solve(chain, "dp"))
    verified = {}
    for candidate in dict.fromkeys(Plan(c.checkpoints) for c in candidates):
      drop_in = _DropIn(model_fn, candidate, layer_depth, traced, key, scans)
      verified[candidate.checkpoints] = measure(
          _scalar_loss(drop_in, model_kwargs), params, batch).total_bytes
    best = _least_measured(verified, lambda c: recompute_flops(chain, Plan(c)))
    if best != plan.checkpoints:
      plan = Plan(best, method=f"{plan.method}+verified")
  fn = _DropIn(model_fn, plan, layer_depth, traced, key, scans)
  return Remat(fn=fn, plan=plan, chain=chain, solve_seconds=seconds, fixed_bytes=fixed, traced=traced,
               buffers=prof.buffers, verified=verified, scans=scans)


def _measured_segments(traced: TracedChain, measured_bytes: Callable[..., int]) -> Any:
  """Per scanned stack, the segment length (a divisor of its length) whose training
  step XLA measures smallest, one stack at a time, the others as model R chose."""
  _, scans = _scan.rewrite(traced, "auto")
  segments = [s.segment for s in scans]
  for j, s in enumerate(scans):
    sizes = {}
    for k in _scan.divisors(s.length):
      trial = (*segments[:j], k, *segments[j + 1:])
      sizes[k] = measured_bytes(*_scan.rewrite(traced, trial))
    segments[j] = min(sizes, key=lambda k: (sizes[k], -k))
  return tuple(segments) if scans else "auto"


def _best_uniform_plans(chain: Chain, buffers: Buffers, count: int) -> list[Plan]:
  """The ``count`` checkpoint-every-k plans of least estimated footprint."""
  plans = [uniform_plan(chain.n, k) for k in range(1, chain.n)]
  return sorted(plans, key=lambda p: estimate_temp_bytes(chain, buffers, p))[:count]


def _least_measured(measured: dict[tuple[int, ...], int],
                   recompute: Callable[[tuple[int, ...]], float]) -> tuple[int, ...]:
  """The plan (checkpoints) of least ``recompute`` FLOPs among those whose XLA footprint
  (``measured``, bytes) is within ``_SAME_FOOTPRINT`` of the least; then fewest bytes.
  Footprints a few bytes apart (alignment) are one figure: on the CPU zoo's ResNet-18,
  the least by bytes alone is 16 B smaller and recomputes 19% more."""
  least = min(measured.values())
  close = [c for c in measured if measured[c] <= least * (1 + _SAME_FOOTPRINT)]
  return min(close, key=lambda c: (recompute(c), measured[c], len(c)))


_SAME_FOOTPRINT = 0.001  # relative: 0.1% of the footprint


def _near_ties(chain: Chain, buffers: Buffers, plan: Plan, count: int) -> list[Plan]:
  """Up to ``count`` plans one checkpoint away from ``plan`` (``neighbours``) whose
  estimated temp bytes are within ``_TIE`` of ``plan``'s, least estimate first (then
  least recompute): plans the estimate cannot tell apart, which XLA's footprint can
  (the zoo's ResNet-152: model R's (3, 4, 5, 6) ties with (3, 4, 5, 7) and
  (3, 4, 5, 6, 7); XLA measures 10.15, 9.40 and 9.49 MiB). None beyond refine's
  ``MAX_LAYERS`` layers (``3n`` estimates at most)."""
  n = chain.n
  if n > MAX_REFINE_LAYERS or plan.is_nested:
    return []
  near = set(neighbours(plan.checkpoints, n))
  limit = estimate_temp_bytes(chain, buffers, plan) * (1 + _TIE)
  keys = {c: (estimate_temp_bytes(chain, buffers, Plan(c)), recompute_flops(chain, Plan(c)))
          for c in near}
  ties = sorted((c for c in near if keys[c][0] <= limit), key=keys.__getitem__)
  return [Plan(c) for c in ties[:count]]


_TIE = 0.01  # estimates this close (relative) are a tie: the estimate's errors are larger


def _scalar_loss(fn: Callable[..., Any], model_kwargs: dict[str, Any]) -> Callable[..., Any]:
  """The step ``verify`` measures: a sum of mean squares of the model's float outputs.
  With Flax's ``mutable=``, the output is ``(prediction, updated collections)`` and only
  the prediction is read, as a training loss reads it: the updated BatchNorm statistics
  are state, not differentiated."""
  def loss(params, batch):
    out = fn(params, batch, **model_kwargs)
    if model_kwargs.get("mutable", False) and isinstance(out, tuple) and len(out) == 2:
      out = out[0]
    leaves = jax.tree_util.tree_leaves(out)
    return sum(jax.numpy.mean(jax.numpy.square(x.astype(jax.numpy.float32)))
               for x in leaves if _compat.is_float(x))
  return loss


_MODEL_A_MAX_LAYERS = 1_000  # model A's O(n^3) program: 33 ms at n = 1,000


def _solve_within(chain: Chain, budget_bytes: int, fixed_bytes: int, method: str) -> Plan:
  """The budget plan for a whole-step budget (bytes): model R gets what fixed bytes leave."""
  if method not in ("optimal", "budget"):
    raise InvalidBudgetError(
        f"budget_bytes selects method='budget'; it cannot be combined with method={method!r}.")
  offset = fixed_bytes - chain.act_bytes[0]  # footprint = offset + model-R peak
  try:
    plan = solve(chain, "budget", budget_bytes=budget_bytes - offset)
  except InfeasibleBudgetError as err:
    least = err.min_feasible_bytes + offset
    raise InfeasibleBudgetError(
        f"budget_bytes={budget_bytes} is below the least footprint any plan reaches, "
        f"{least} bytes ({least / 2**30:.3f} GiB: {fixed_bytes} bytes of parameters, "
        "batch and gradients plus the least activation peak). Raise the budget, shrink "
        "the batch, or use a multi-level plan.",
        budget_bytes=budget_bytes, min_feasible_bytes=least) from None
  return plan


_FIT_ROUNDS = 6  # whole-step compiles at most, when fitting a budget to XLA's figure


def _fit_measured(chain: Chain, plan: Plan | None, budget_bytes: int, fixed_bytes: int,
                  fallback: list[Plan], measured_bytes: Callable[[Plan], int]) -> tuple[Plan, dict]:
  """Tightens the model-R budget until XLA's footprint of the plan fits ``budget_bytes``.

  Each round measures the plan; when XLA's figure exceeds the budget by ``d`` bytes, the
  model-R budget is lowered by ``d`` and the plan solved again. When model R runs out of
  plans first, the ``fallback`` plans that fit are tried, least recompute first.
  """
  seen: dict[tuple[int, ...], int] = {}
  model_budget = budget_bytes
  for _ in range(_FIT_ROUNDS if plan is not None else 0):
    seen[plan.checkpoints] = measured = measured_bytes(plan)
    if measured <= budget_bytes:
      return plan, seen
    model_budget -= measured - budget_bytes
    try:
      plan = _solve_within(chain, model_budget, fixed_bytes, "budget")
    except InfeasibleBudgetError:
      break
  for candidate in sorted(dict.fromkeys(Plan(p.checkpoints) for p in fallback),
                          key=lambda p: recompute_flops(chain, p)):
    if candidate.checkpoints not in seen:
      seen[candidate.checkpoints] = measured_bytes(candidate)
    if seen[candidate.checkpoints] <= budget_bytes:
      return Plan(candidate.checkpoints, method="budget"), seen
  least = min(seen.values())
  raise InfeasibleBudgetError(
      f"budget_bytes={budget_bytes}: no plan jaxremat tried fits it as XLA compiles the "
      f"step; the least XLA-measured footprint among them is {least} bytes "
      f"({least / 2**30:.3f} GiB). Raise the budget or shrink the batch.",
      budget_bytes=budget_bytes, min_feasible_bytes=least)


def _check_options(plan: Any, layer_depth: Any) -> None:
  if plan is not None and not isinstance(plan, Plan):
    raise InvalidArgumentError(
        f"plan must be a jaxremat.Plan, got {type(plan).__name__} {plan!r}; wrap the "
        "checkpoint indices, e.g. plan=jaxremat.Plan(checkpoints=(2, 5)).")
  if layer_depth is not None and (isinstance(layer_depth, bool) or not isinstance(layer_depth, int)
                                  or layer_depth < 0):
    raise InvalidArgumentError(
        f"layer_depth must be None or an int >= 0 (0: the root module, 1: its children, "
        f"...), got {layer_depth!r}.")


def _check_budget(budget_bytes: Any) -> int | None:
  """``budget_bytes`` as whole bytes (floats rounded down; +inf: no budget)."""
  try:
    budget = budget_as_int(budget_bytes)
  except TypeError:
    raise InvalidArgumentError(
        f"budget_bytes must be a number of bytes (e.g. 2 * 2**30), got "
        f"{type(budget_bytes).__name__} {budget_bytes!r}.") from None
  if budget is not None and budget < 0:
    raise InvalidBudgetError(
        f"budget_bytes must be a non-negative number of bytes, got {budget_bytes!r}.")
  return budget


def _check_float_output(traced: TracedChain) -> None:
  outs = [getattr(v, "aval", None) for v in traced.outvars]
  if not any(_compat.is_float(aval) for aval in outs):
    dtypes = sorted({str(getattr(aval, "dtype", "?")) for aval in outs})
    raise UnsupportedModelError(
        f"the model's outputs are all of non-float dtypes {dtypes}: there is no gradient "
        "to take through them, so nothing to checkpoint. Return the float values the loss "
        "is computed from (e.g. logits) and take argmax or round outside the model.")


def _check_arrays(what: str, tree: Any) -> None:
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  bad = [(jax.tree_util.keystr(p), type(x).__name__) for p, x in leaves if not is_array_leaf(x)]
  if bad:
    shown = ", ".join(f"{what}{path} is a {kind}" for path, kind in bad[:5])
    raise InvalidArgumentError(
        f"every leaf of {what} must be an array (jax.Array or numpy.ndarray): {shown}. "
        "Convert with jnp.asarray or pass non-array options as keyword arguments.")


def _tree_bytes(tree: Any) -> int:
  return sum(_compat.aval_bytes(x) for x in jax.tree_util.tree_leaves(tree))


def _fixed_bytes(params: Any, batch: Any, arrays: Any) -> int:
  """Bytes held through the whole step: params, batch, array kwargs, parameter gradients."""
  return _tree_bytes(params) + _tree_bytes(batch) + _tree_bytes(arrays) + _float_bytes(params)


def _float_bytes(tree: Any) -> int:
  return sum(_compat.aval_bytes(x) for x in jax.tree_util.tree_leaves(tree) if _compat.is_float(x))


def _key(params: Any, batch: Any, kwargs: dict[str, Any]) -> Any:
  arrays, kw_tree, static = split_kwargs(kwargs)

  def avals(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((tuple(np.shape(x)), str(x.dtype)) for x in leaves)

  try:
    hash(static)
  except TypeError:
    static = tuple(map(id, static))
  return avals(params), avals(batch), avals(arrays), kw_tree, static


def _check_same(what: str, want: Any, got: Any) -> None:
  if want[0] != got[0]:
    raise InputMismatchError(f"{what} has structure {got[0]}, but the plan was made for {want[0]}.")
  diffs = [f"leaf {k}: {g} (expected {w})" for k, (w, g) in enumerate(zip(want[1], got[1])) if w != g]
  if diffs:
    raise InputMismatchError(
        f"{what} do not match the ones the plan was made for: " + "; ".join(diffs[:5]))


class _DropIn:
  """``fn(params, batch, **kwargs)``: the model run segment by segment under the plan.

  New input shapes (another batch size, or per-example shapes under ``vmap``) re-trace
  the model; the plan is reused when the new trace has the same layers.
  """

  def __init__(self, model_fn, plan, layer_depth, traced, key, scans=()):
    self._model_fn = model_fn
    self._segments = tuple(s.segment for s in scans) if scans else None
    self._plan = plan
    self._layer_depth = layer_depth
    self._names = tuple(layer.name for layer in traced.layers)
    self._params_key, self._batch_key = key[0], key[1]
    self._cache = {key: (traced, self._emit(traced))}

  def _trace(self, params, batch, kwargs):
    traced = trace(self._model_fn, params, batch, kwargs, self._layer_depth)
    if self._segments is not None:
      traced, _ = _scan.rewrite(traced, self._segments)
    return traced

  def _emit(self, traced):
    return emit(traced, self._plan)

  def __call__(self, params: Any, batch: Any, **kwargs: Any) -> Any:
    key = _key(params, batch, kwargs)
    if key not in self._cache:
      _check_same("params", self._params_key, key[0])
      if key[1][0] != self._batch_key[0]:
        raise InputMismatchError(
            f"batch has structure {key[1][0]}, but the plan was made for {self._batch_key[0]}.")
      try:
        traced = self._trace(params, batch, kwargs)
      except JaxrematError:
        raise
      except Exception as err:
        raise InputMismatchError(
            f"the model fails on a batch of shapes {[s for s, _ in key[1][1]]} (the plan was "
            f"made for {[s for s, _ in self._batch_key[1]]}): {type(err).__name__}: {err}") from err
      names = tuple(layer.name for layer in traced.layers)
      if names != self._names:
        raise InputMismatchError(
            f"with these inputs the model has layers {list(names)}, but the plan was made "
            f"for {list(self._names)}; call jaxremat.apply again with these inputs.")
      self._cache[key] = (traced, self._emit(traced))
    traced, run = self._cache[key]
    arrays, _, _ = split_kwargs(kwargs)
    flat = jax.tree_util.tree_leaves((params, batch, arrays))
    return jax.tree_util.tree_unflatten(traced.out_tree, run(flat))

