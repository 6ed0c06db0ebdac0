"""``jaxremat.apply`` for models that are not chains (skip tensors across layers)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from jaxremat._api.apply import _DropIn, _fixed_bytes, _fmt, _key, _least_measured, _scalar_loss
from jaxremat._model.chain import Plan
from jaxremat._errors import NotAChainError
from jaxremat._model.graph import GraphChain, graph_peak_bytes, graph_recompute_flops
from jaxremat._jaxpr.graph_emit import emit_graph
from jaxremat._backends.graph_profile import profile_graph
from jaxremat._backends.measure import measure
from jaxremat._jaxpr.trace import TracedChain, split_kwargs, trace
from jaxremat.solvers._graph import GRAPH_SOLVERS, solve_graph


@dataclasses.dataclass(frozen=True, eq=False)
class GraphRemat:
  """The result of ``jaxremat.apply`` on a model whose layers are not a chain.

  Attributes:
    fn: a drop-in for ``model_fn``; each non-final segment runs under ``jax.checkpoint``
      with the values crossing its cuts as inputs and outputs.
    plan: the kept cuts (layer boundaries), as ``Plan.checkpoints``.
    chain: the profiled graph (``GraphChain``: values, residuals, FLOPs per layer).
    solve_seconds: wall time of the solver.
    fixed_bytes: parameters, batch, array kwargs and parameter gradients (bytes).
    verified: with ``apply(verify=True)``, XLA's footprint (bytes) of each plan the
      measured local search compiled, by kept cuts.
  """

  fn: Callable[..., Any]
  plan: Plan
  chain: GraphChain
  solve_seconds: float
  fixed_bytes: int
  traced: TracedChain = dataclasses.field(repr=False)
  verified: dict[tuple[int, ...], int] | None = None

  @property
  def predicted_peak_bytes(self) -> int:
    """Model G's peak of the plan (bytes; ``jaxremat._model.graph``)."""
    return graph_peak_bytes(self.chain, self.plan)

  @property
  def predicted_total_bytes(self) -> int:
    """Predicted XLA footprint of ``jax.grad`` of a scalar loss of ``fn`` (bytes)."""
    return self.predict_total_bytes(self.plan)

  def predict_total_bytes(self, plan: Plan) -> int:
    """Fixed bytes plus model G's peak, less the batch (already in the fixed bytes)."""
    return self.fixed_bytes + graph_peak_bytes(self.chain, plan) - self.chain.crossing_bytes(0)

  def report(self) -> str:
    """Per-layer kept-cut costs and the predicted peak of each strategy."""
    g = self.chain
    kept = set(self.plan.checkpoints)
    lines = [f"{'#':>3}  {'layer':<28}{'cut keeps':>12}{'values':>8}  plan"]
    for t in range(1, g.n + 1):
      cut = f"{_fmt(g.crossing_bytes(t)):>12}{len(g.crossing(t)):>8}" if t < g.n else " " * 20
      lines.append(f"{t:>3}  {g.names[t - 1]:<28}{cut}  {'kept cut after' if t in kept else ''}")
    lines.append(f"{'strategy':<14}{'cuts':>6}{'model-G peak':>16}{'predicted total':>18}{'recompute GFLOP':>18}")
    for method in ("none", "every-layer", "best-uniform", "optimal"):
      plan = solve_graph(g, method)
      lines.append(f"{method:<14}{len(plan.checkpoints):>6}{_fmt(graph_peak_bytes(g, plan)):>16}"
                   f"{_fmt(self.predict_total_bytes(plan)):>18}{graph_recompute_flops(g, plan) / 1e9:>18.3f}")
    lines.append(f"chosen: {self.plan.method} cuts={list(self.plan.checkpoints)}")
    return "\n".join(lines)


class _GraphDropIn(_DropIn):
  """``_DropIn`` re-tracing and emitting through the graph path."""

  def _trace(self, params, batch, kwargs):
    return trace(self._model_fn, params, batch, kwargs, self._layer_depth, graph=True)

  def _emit(self, traced):
    return emit_graph(traced, self._plan)


def apply_graph(model_fn: Callable[..., Any], params: Any, batch: Any, *, method: str,
                plan: Plan | None, layer_depth: int | None, model_kwargs: dict[str, Any],
                calibrate: bool, verify: bool, unsupported: dict[str, Any]) -> GraphRemat:
  """``apply``'s path for non-chains: trace as a graph, profile, solve model G exactly, emit.

  With ``verify`` (and no ``plan``), the solver's plan is the start of a local search on XLA's compiled
  footprint of the training step: each round compiles every plan that adds or removes
  one kept cut and moves to the least measured (within 0.1%: least recompute), for at most
  ``_VERIFY_ROUNDS`` rounds (``(n - 1)`` compiles each).

  Raises:
    NotAChainError: an option only chains support was given (``unsupported`` holds
      them, by name), or ``method`` is not one of the graph solvers.
  """
  given = sorted(k for k, v in unsupported.items() if v)
  verify = bool(verify)
  if given or (plan is None and method not in GRAPH_SOLVERS):
    what = ", ".join(given) if given else f"method={method!r}"
    raise NotAChainError(
        f"the model is not a chain of layers (a layer reads a value made two or more layers "
        f"earlier), so jaxremat plans it as a graph, which does not support {what}. Graph "
        f"plans take method= one of {sorted(GRAPH_SOLVERS)} or an explicit plan=.")
  traced = trace(model_fn, params, batch, model_kwargs, layer_depth, graph=True)
  graph = profile_graph(traced, calibrate=calibrate)
  start = time.perf_counter()
  solved = plan is None
  if solved:
    plan = solve_graph(graph, method)
  seconds = time.perf_counter() - start
  arrays, _, _ = split_kwargs(model_kwargs)
  fixed = _fixed_bytes(params, batch, arrays)
  key = _key(params, batch, model_kwargs)
  verified = None
  if verify and solved:
    def measured(cuts):
      drop_in = _GraphDropIn(model_fn, Plan(cuts), layer_depth, traced, key)
      return measure(_scalar_loss(drop_in, model_kwargs), params, batch).total_bytes
    plan, verified = _local_search(graph, plan, measured)
  fn = _GraphDropIn(model_fn, plan, layer_depth, traced, key)
  return GraphRemat(fn=fn, plan=plan, chain=graph, solve_seconds=seconds, fixed_bytes=fixed,
                    traced=traced, verified=verified)


_VERIFY_ROUNDS = 3


def _local_search(graph: GraphChain, plan: Plan,
                  measured: Callable[[tuple[int, ...]], int]) -> tuple[Plan, dict]:
  """One-cut moves from ``plan`` while XLA's footprint (``measured``, bytes) improves."""
  seen = {plan.checkpoints: measured(plan.checkpoints)}
  current = plan.checkpoints
  for _ in range(_VERIFY_ROUNDS):
    for k in range(1, graph.n):
      cuts = tuple(sorted(set(current) ^ {k}))
      if cuts not in seen:
        seen[cuts] = measured(cuts)
    best = _least_measured(seen, lambda c: graph_recompute_flops(graph, Plan(c)))
    if best == current:
      break
    current = best
  if current == plan.checkpoints:
    return plan, seen
  return Plan(current, method=f"{plan.method}+verified"), seen
