"""``Fitted``: what ``jaxremat.fit`` returns, and its report and frontier plot."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jaxremat._api.fit_graph import run_label
from jaxremat._api.planning import fmt_bytes
from jaxremat._backends.step_time import ROUNDS, RUNS
from jaxremat._jaxpr.scan import ScanPlan
from jaxremat._model.chain import Chain
from jaxremat._model.graph import GraphChain
from jaxremat._model.policy_plan import GroupCost, PolicyPlan

_LABEL_WIDTH = 72  # characters at most of the report's layers column


@dataclasses.dataclass(frozen=True)
class Fitted:
  """The result of ``jaxremat.fit``.

  Attributes:
    fn: a drop-in for ``model_fn`` (same signature and outputs) running the plan.
    plan: the groups of layers and what each keeps, recomputes or offloads.
    costs: the chosen groups with their bytes and seconds.
    chain: the profiled layers (bytes per layer as XLA is modelled to keep them; a
      ``GraphChain`` for a graph of layers).
    budget_bytes: the budget (bytes, the whole step: parameters, batch, gradients too).
    fixed_bytes: parameters, batch, array kwargs and parameter gradients (bytes).
    no_remat_bytes: the step's footprint without remat (bytes; XLA-measured when
      ``verify``), the base of a fractional budget.
    predicted_total_bytes: the plan's predicted footprint (bytes); None for a graph's
      plan of the shortlist (uniform per-layer options), which nothing predicts
      (``measured_total_bytes`` is its footprint).
    predicted_seconds: the time its recomputation and offload add to a step (seconds,
      by the target's roofline).
    measured_total_bytes: XLA's footprint of the plan (bytes), None without ``verify``.
    compiled: XLA's footprint (bytes) of each plan compiled while fitting, in order.
    frontier: ``(predicted bytes, predicted seconds)`` of the fastest plan at each
      budget from the least footprint to no remat (the memory-versus-time frontier),
      of the DP's plans at budgets spread over that range and the plans fit examined;
      on a graph, ``(XLA bytes, predicted seconds)`` of the plans compiled (with
      ``verify=False``, the DP's plan as predicted).
    target: the GPU target planned for, or None for the local backend.
    timed: with ``time_steps``: ``(what, XLA bytes, step seconds)`` of each plan that
      fits and was timed on this machine, the returned one first; else empty.
    timing_spread: with ``time_steps``: how far the median of a timed plan's runs lies
      above their least, the largest over the plans (a share, 0.1 = 10%): step times
      closer than that are within this machine's noise; else None.
    stage_seconds: wall time of each stage (seconds).
    named_products: one line per product a group keeps by name (``names(k saved)``,
      ``names(k offloaded)``): its layer, ``checkpoint_name``, equation and output.
    scans: the scans (layer stacks, RNNs over time) the plan runs segmented, whatever
      its layers' options (``ScanPlan``).
  """

  fn: Callable[..., Any]
  plan: PolicyPlan
  costs: tuple[GroupCost, ...]
  chain: Chain | GraphChain
  budget_bytes: int
  fixed_bytes: int
  no_remat_bytes: int
  predicted_total_bytes: int | None
  predicted_seconds: float
  measured_total_bytes: int | None
  compiled: tuple[int, ...]
  frontier: tuple[tuple[int, float], ...]
  target: str | None = None
  timed: tuple[tuple[str, int, float], ...] = ()
  timing_spread: float | None = None
  stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
  named_products: tuple[str, ...] = ()
  scans: tuple[ScanPlan, ...] = ()

  def report(self) -> str:
    """What each group does, the budget, the prediction and XLA's figure, the frontier."""
    names = self.chain.names
    labels = [names[c.group.start] if c.group.stop - c.group.start == 1
              else run_label(names[c.group.start:c.group.stop]) for c in self.costs]
    width = min(max([38, *map(len, labels)]) + 2, _LABEL_WIDTH)
    lines = [f"{'layers':<{width}}{'option':>22}{'stored':>12}{'transient':>12}"
             f"{'roofline ms':>12}"]
    for c, label in zip(self.costs, labels):
      g = c.group
      transient = fmt_bytes(c.transient_bytes) if isinstance(self.chain, Chain) else "-"
      if len(label) >= width:  # the ends tell layers apart
        label = "..." + label[-(width - 4):]
      lines.append(f"{label:<{width}}{g.option.describe():>22}{fmt_bytes(c.stored_bytes):>12}"
                   f"{transient:>12}{c.seconds * 1e3:>12.3f}")
    if self.named_products:
      lines.append("products kept by name (the rest of their layers is recomputed):")
      lines += [f"  {line}" for line in self.named_products]
    lines += [f"scan {s.name!r} in layer {s.layer + 1}: {s.length} iterations in checkpointed "
              f"segments of {s.segment}, recomputed one at a time in the backward pass"
              for s in self.scans if s.rematerialised]
    lines.append("")
    if self.target:
      lines.append(f"target: {self.target} (XLA's GPU compiler, deviceless)")
    lines.append(f"budget {fmt_bytes(self.budget_bytes)}; no remat {fmt_bytes(self.no_remat_bytes)}; "
                 f"fixed (params, batch, grads) {fmt_bytes(self.fixed_bytes)}")
    predicted = ("- (a plan of the graph's shortlist: XLA's compile judges its fit)"
                 if self.predicted_total_bytes is None
                 else fmt_bytes(self.predicted_total_bytes))
    lines.append(f"predicted footprint {predicted}; recompute "
                 f"{self.predicted_seconds * 1e3:.3f} ms per step by the roofline (XLA's FLOPs "
                 "and bytes at the device's peak rates: a ranking, not a step time)")
    if self.measured_total_bytes is not None:
      measured = self.measured_total_bytes
      error = (0.0 if self.predicted_total_bytes is None else
               100 * (self.predicted_total_bytes - measured) / measured)
      miss = "" if error == 0 else f" (the prediction {abs(error):.1f}% " + (
          "high)" if error > 0 else "low)")
      lines.append(f"XLA-measured footprint {fmt_bytes(measured)}{miss}, within the budget; "
                   + (f"{len(self.compiled)} plan(s) compiled, XLA's footprint of each in "
                      "order: " + ", ".join(fmt_bytes(b) for b in self.compiled)
                      if self.compiled else "the step with every layer kept, compiled "
                      "first (no other plan compiled)")
                   + ("" if self.timed else "; returned: the one of least predicted "
                      "recompute within the budget"))
    else:
      lines.append("not compiled (verify=False): the footprint is the prediction's")
    for k, (what, total, seconds) in enumerate(self.timed):
      lines.append(f"{'returned' if k == 0 else 'timed':<9}{what:<34}{fmt_bytes(total):>12}"
                   f"{seconds * 1e3:>10.2f} ms per step (measured)")
    if self.timed and self.timing_spread is not None:
      lines.append(f"(the least of {ROUNDS * RUNS} runs each; a plan's median run was up to "
                   f"{100 * self.timing_spread:.0f}% slower than its least: step times closer "
                   "than that are within this machine's noise)")
    points = [f"{fmt_bytes(b)}: {s * 1e3:.3f}" for b, s in self.frontier]
    xla = not isinstance(self.chain, Chain) and self.measured_total_bytes is not None
    lines.append(f"frontier ({'XLA' if xla else 'predicted'} footprint: roofline ms):")
    lines += ["  " + ", ".join(points[k:k + 6]) for k in range(0, len(points), 6)]
    return "\n".join(lines)

  def plot_frontier(self, path: str) -> None:
    """Draws the memory-versus-time frontier with the chosen plan and the budget marked
    (needs matplotlib: ``pip install "jaxremat[plot]"``)."""
    from jaxremat._api.plot import plot_frontier
    chosen = self.predicted_total_bytes or self.measured_total_bytes or 0
    plot_frontier(path, self.frontier, (chosen, self.predicted_seconds),
                  self.budget_bytes, self.measured_total_bytes)
