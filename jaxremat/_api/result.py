"""``Remat``: what ``jaxremat.apply`` returns (the drop-in, its plan, predictions, report)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from jaxremat._api.advice import MIN_SAVING
from jaxremat._api.planner import ChainPlanner, Planner
from jaxremat._api.planning import fmt_bytes
from jaxremat._errors import NotAChainError
from jaxremat._jaxpr.scan import ScanPlan
from jaxremat._model.chain import Chain, Plan, peak_bytes
from jaxremat._model.graph import GraphChain
from jaxremat.solvers import solve


#: ``Plan.method`` of the plan ``apply`` returns when it runs the model as written.
AS_WRITTEN = "as written"
#: The report's name for a plan the user passed (``plan=``), whose method is empty.
GIVEN = "the plan given"
#: A step above this share of the device's memory may have been rematerialised by XLA.
XLA_REMAT_SHARE = 0.9
#: The share of a GPU's memory JAX's allocator preallocates by default.
JAX_MEMORY_FRACTION = 0.75


@dataclasses.dataclass(frozen=True, eq=False)
class Remat:
  """The result of ``jaxremat.apply``.

  Attributes:
    fn: a drop-in for ``model_fn``: same signature, same outputs; each non-final
      segment of the plan runs under ``jax.checkpoint``.
    plan: the checkpoints chosen (on a graph: the kept cuts after layers).
    chain: the profiled layers: a ``Chain`` (bytes, FLOPs, names), or a ``GraphChain``
      when a layer reads a value made two or more layers earlier (U-Net, DenseNet).
    solve_seconds: wall time of the solver (seconds).
    fixed_bytes: parameters, batch, array kwargs and parameter gradients (bytes).
    verified: with ``apply(verify=True)`` or a budget, XLA's footprint (bytes) of each
      plan compiled, by checkpoints.
    scans: one ``ScanPlan`` per scanned layer stack (its segment length, its uniform
      chain), in order.
    decomposition: which layers ``apply`` found and why (the root module's children, the
      ones it split into their own children, or an explicit ``layer_depth``).
    target: the GPU target the plan was made for (``apply(target=...)``), else None.
    stage_seconds: wall time of each stage of ``apply`` (seconds): ``trace``,
      ``profile``, ``solve``, ``compile`` (verification and budget fitting) and ``emit``.
    as_written_bytes: XLA's footprint (bytes) of the training step of the model as
      written (no checkpoints, its scans as they are), when ``apply`` chose and
      compiled plans (by default it does; not with ``budget_bytes``, ``plan`` or a
      fixed ``scan_segment``); where no plan of the default ``method`` compiled below it,
      ``plan`` is ``Plan((), method="as written")`` and ``fn`` runs the model unchanged.
    device_memory_bytes: the memory of ``target``'s device (bytes), where its config
      declares it; the report says whether the step fits in it.
  """

  fn: Callable[..., Any]
  plan: Plan
  chain: Chain | GraphChain
  solve_seconds: float
  fixed_bytes: int
  verified: dict[tuple[int, ...], int] | None = None
  scans: tuple[ScanPlan, ...] = ()
  decomposition: str = ""
  target: str | None = None
  stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
  as_written_bytes: int | None = None
  device_memory_bytes: int | None = None
  _planner: Planner | None = dataclasses.field(default=None, repr=False)

  @property
  def _model(self) -> Planner:
    """The planner ``apply`` profiled the layers with (its memory model and solvers)."""
    if self._planner is None:
      raise ValueError("this Remat has no planner: build it with jaxremat.apply.")
    return self._planner

  @property
  def is_graph(self) -> bool:
    """True when the layers were planned as a graph (model G), not a chain (model R)."""
    return isinstance(self.chain, GraphChain)

  @property
  def profile(self) -> str:
    """What predicted the plans' footprints: ``"jaxpr"`` (the estimate, or model G on a
    graph) or ``"compiled"`` (the plain step XLA compiled, replayed)."""
    return self._model.profile

  @property
  def predicted_peak_bytes(self) -> int:
    """The memory model's activation peak of the plan (bytes): model R, or model G."""
    return self._model.peak_bytes(self.plan)

  @property
  def predicted_total_bytes(self) -> int:
    """Predicted XLA footprint of ``jax.grad`` of a scalar loss of ``fn`` (bytes)."""
    return self.predict_total_bytes(self.plan)

  @property
  def measured_total_bytes(self) -> int | None:
    """XLA's compiled footprint of the chosen plan's gradient step (bytes), when
    ``apply`` compiled it (by default it does), else None."""
    if self.plan.method == AS_WRITTEN:
      return self.as_written_bytes
    return (self.verified or {}).get(self.plan.checkpoints)

  def predict_total_bytes(self, plan: Plan) -> int:
    """Predicted XLA footprint of the gradient step under any ``plan`` (bytes).

    Arguments (params, batch, array kwargs) and the parameter gradients are held for the
    whole step; on top of them the temp bytes peak as the backend's estimate of its live
    buffers (chains), or as model G's peak (graphs); with ``profile="compiled"``, as the
    replay of the compiled plain step. A multi-level plan is predicted by model R's event
    simulator.
    """
    return self._model.total_bytes(plan)

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
      NotAChainError: the layers were planned as a graph (no timeline to replay).
    """
    if not isinstance(self._planner, ChainPlanner):
      raise NotAChainError(
          "Remat.plot replays model R's timeline; this model was planned as a graph.")
    from jaxremat._api.plot import plot_timelines  # matplotlib is optional
    chain = self._planner.chain
    plans = [(f"chosen: {self.plan.method or GIVEN}", self.plan)]
    plans += [(method, solve(chain, method)) for method in compare]
    plot_timelines(path, chain, plans, title=title or f"{chain.n} layers")

  def _device_line(self, memory: int) -> str:
    """Whether the chosen plan's step (XLA's figure, else the prediction) and the model as
    written fit in the share of the device's ``memory`` (bytes) JAX's allocator takes by
    default, in a sentence."""
    usable = int(JAX_MEMORY_FRACTION * memory)
    step = self.measured_total_bytes or self._model.total_bytes(self.plan)
    text = (f"the {self.target}'s device memory {fmt_bytes(memory)}, of which JAX's allocator "
            f"takes {JAX_MEMORY_FRACTION:.0%} by default ({fmt_bytes(usable)}; "
            "XLA_PYTHON_CLIENT_MEM_FRACTION sets the share): the chosen plan's gradient step "
            f"({fmt_bytes(step)}) {'fits' if step <= usable else 'does not fit'}")
    written = self.as_written_bytes if self.plan.method != AS_WRITTEN else None
    if written is not None:
      text += (f", the model as written ({fmt_bytes(written)}) "
               + ("fits" if written <= usable else "does not fit"))
    if max(step, written or 0) > XLA_REMAT_SHARE * memory:  # XLA's own remat may have run
      text += (" (XLA rematerialises a step near or above the device's memory on its own: "
               "these figures are after that)")
    if written is not None and written <= usable:
      text += (". These are the gradient step's bytes alone: where the model as written "
               "fits beside the optimizer's state (Adam's: twice the parameters) and a larger "
               "batch is not wanted, it needs no remat and runs faster as written")
    return text

  def report(self) -> str:
    """A per-layer table and the predicted peak of each strategy."""
    planner, plan = self._model, self.plan
    rows = planner.layer_table(plan)
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    model = "model-G" if self.is_graph else "model-R"
    if self.target:
      lines.append(f"target: {self.target} (XLA's GPU compiler, deviceless)")
    if self.decomposition:
      lines.append(f"layers: {self.decomposition}")
    lines.append(f"input x_0: {fmt_bytes(planner.input_bytes)}; fixed (params, batch, grads): "
                 f"{fmt_bytes(self.fixed_bytes)}; predicted by the {self.profile} profile")
    scale = planner.temp_scale if isinstance(planner, ChainPlanner) else 1.0
    if f"{scale:.2f}" != "1.00":
      lines.append(f"predicted totals scale the estimate's temp bytes by {scale:.2f}, so "
                   "that the model as written is predicted as XLA measured it (model-R peaks "
                   "are unscaled)")
    plans = planner.reported_plans(plan)
    if self.scans:
      lines.append("every strategy runs the scans segmented (below); 'none' places "
                   "no checkpoint between the layers")
    label = {m: f"{m} (scans segmented)" if m == "none" and self.scans else m or GIVEN
             for m in plans}
    w = max(14, *(len(name) + 2 for name in label.values()))
    lines.append(f"{'strategy':<{w}}{'checkpoints':>12}{model + ' peak':>16}"
                 f"{'predicted total':>18}{'recompute GFLOP':>18}")
    for method, p in plans.items():
      lines.append(
          f"{label[method]:<{w}}{len(p.checkpoints):>12}{fmt_bytes(planner.peak_bytes(p)):>16}"
          f"{fmt_bytes(planner.total_bytes(p)):>18}{planner.recompute_flops(p) / 1e9:>18.3f}")
    if self.as_written_bytes is not None:
      lines.append(f"the model as written (no plan), XLA-measured: "
                   f"{fmt_bytes(self.as_written_bytes)}")
    scanned = "".join(f"; scan {s.name!r} in layer {s.layer + 1}: a checkpoint every "
                      f"{s.segment} of its {s.length} iterations" for s in self.scans)
    lines.append(f"chosen: {plan.method or GIVEN} checkpoints={list(plan.checkpoints)}{scanned}")
    if self.measured_total_bytes is not None:
      predicted, measured = planner.total_bytes(plan), self.measured_total_bytes
      off = predicted / measured - 1
      lines.append(f"XLA-measured footprint of the chosen plan: {fmt_bytes(measured)} "
                   f"(predicted {fmt_bytes(predicted)}: {abs(off):.1%} "
                   f"{'low' if off < 0 else 'high'}; {len(self.verified or {})} plan(s) "
                   "compiled)")
    if self.device_memory_bytes:
      lines.append(self._device_line(self.device_memory_bytes))
    compiled = self.verified or {}
    if len(compiled) > 1:
      written = plan.method == AS_WRITTEN  # not one of them where scans were segmented
      lines.append("plans compiled, XLA-measured (predicted)" + (
          f", none of them {MIN_SAVING:.0%} or more below the model as written (the plans "
          "run any scanned stack segmented):" if written else ":"))
      if written and self.as_written_bytes is not None:
        lines.append(f"  {fmt_bytes(self.as_written_bytes):>10}  the model as written  <- chosen")
      for checkpoints, measured in sorted(compiled.items(), key=lambda kv: kv[1]):
        same = [m for m, p in plans.items()
                if p.checkpoints == checkpoints and not p.inner and m != AS_WRITTEN]
        chosen = checkpoints == plan.checkpoints and not plan.inner and not written
        lines.append(
            f"  {fmt_bytes(measured):>10} ({fmt_bytes(planner.total_bytes(Plan(checkpoints)))})"
            f"  {list(checkpoints)}{'  = ' + ', '.join(same) if same else ''}"
            f"{'  <- chosen' if chosen else ''}")
      searched = "layer_depth='search'" in self.decomposition
      if (len(compiled) > 2 and not searched
          and max(compiled.values()) <= min(compiled.values()) * 1.001):
        lines.append("  every plan compiled measures the same: XLA's peak is inside a layer "
                     "no checkpoint between layers reaches" + (
                         "; layer_depth='search' plans below these layers too"
                         if not self.scans else ""))
    for s in self.scans:
      unit = "step" if s.recurrent else "block"
      lines.append(
          f"scan in layer {s.layer + 1} {s.name!r}: {s.length} iterations, segments of "
          f"{s.segment}{' (the checkpointed ' + unit + ' itself)' if s.block else ''}; model "
          f"R's peak of the {'loop' if s.recurrent else 'stack'} alone, as a chain of its "
          f"{unit}s (not of the whole step): "
          f"{fmt_bytes(s.peak_bytes)} so segmented, {fmt_bytes(s.optimal_peak_bytes)} at its "
          f"optimum, {fmt_bytes(peak_bytes(s.chain, Plan()))} with no checkpoint inside it")
    return "\n".join(lines)
