"""The memory benchmark behind ``jaxremat bench``: strategies x zoo models, predicted vs XLA."""

from __future__ import annotations

import datetime
import platform
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax

from jaxremat._api.apply import apply
from jaxremat._api.loss import training_loss
from jaxremat._errors import NotAChainError
from jaxremat._model.chain import Chain, Plan, peak_bytes, recompute_flops
from jaxremat._backends.measure import measure
from jaxremat.solvers import solve, uniform_plan
from jaxremat.zoo_registry import BenchModel, tagged

#: Strategies each model is measured under; "apply-default" is what ``apply`` picks.
STRATEGIES = ("none", "every-layer", "sqrt", "best-uniform", "optimal", "apply-default")

#: The best checkpoint-every-k plan by XLA's own measurement (every k compiled).
BEST_UNIFORM_XLA = "best-uniform-xla"

#: The models ``jaxremat bench`` runs (the registry's "bench" models), by name.
MODELS: dict[str, BenchModel] = {m.name: m for m in tagged("bench")}

#: The models ``jaxremat bench --quick`` runs when ``--models`` is not given.
QUICK_MODELS = tuple(m.name for m in tagged("bench-quick"))


def init_params(model: Any, x: Any, kwargs: Mapping[str, Any]) -> Any:
  """The model's variables, with any rngs it needs at apply time given at init too."""
  return model.init({"params": jax.random.key(0), **kwargs.get("rngs", {})}, x)


def bench_model(name: str, model: Any, x: Any, kwargs: dict[str, Any],
                strategies: Iterable[str] = STRATEGIES, *, best_uniform_xla: bool = True,
                progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
  """Profiles ``model`` once, then measures each strategy's gradient step with XLA.

  Args:
    name: the model's name in the rows.
    model: a flax.linen module; ``x`` its example input, ``kwargs`` its apply kwargs.
    strategies: solver methods, or ``"apply-default"`` for ``jaxremat.apply``'s plan.
    best_uniform_xla: also compile every checkpoint-every-k plan and record XLA's best.
    progress: called with a line of text after each compile.

  Returns:
    One row per strategy: checkpoints, ``predicted_bytes`` (``predicted_total_bytes``),
    ``model_r_bytes`` (fixed bytes plus model R's peak less ``a_0``), ``measured_bytes``
    (XLA's footprint), its parts, ``xla_flops`` and ``recompute_flops`` (model R's count).

  Raises:
    NotAChainError: the model is planned as a graph (a layer skips to a later one).
  """
  params = init_params(model, x, kwargs)
  base = apply(model.apply, params, x, **kwargs)
  chain = base.chain
  if not isinstance(chain, Chain):
    raise NotAChainError(f"{name}: the benchmark compares chain plans (model R); this model "
                         "is planned as a graph.")
  rows = []

  def record(strategy: str, plan: Plan) -> int:
    start = time.perf_counter()
    r = apply(model.apply, params, x, plan=plan, **kwargs)
    measured = measure(training_loss(r.fn, kwargs), params, x)
    rows.append({
        "model": name, "strategy": strategy, "layers": chain.n,
        "checkpoints": list(plan.checkpoints),
        "predicted_bytes": r.predicted_total_bytes,
        "model_r_bytes": r.fixed_bytes + peak_bytes(chain, plan) - chain.act_bytes[0],
        "measured_bytes": measured.total_bytes,
        "measured_parts": [measured.argument_bytes, measured.output_bytes, measured.temp_bytes,
                           measured.alias_bytes],
        "xla_flops": measured.flops,
        "recompute_flops": recompute_flops(chain, plan),
    })
    progress(f"{name} {strategy}: {measured.total_bytes / 2**20:.2f} MiB measured "
             f"({time.perf_counter() - start:.1f} s)")
    return measured.total_bytes

  for strategy in strategies:
    record(strategy, base.plan if strategy == "apply-default" else solve(chain, strategy))
  if best_uniform_xla and chain.n > 1:
    totals = {}
    for k in range(1, chain.n):
      r = apply(model.apply, params, x, plan=uniform_plan(chain.n, k), **kwargs)
      totals[k] = measure(training_loss(r.fn, kwargs), params, x).total_bytes
      progress(f"{name} every {k}: {totals[k] / 2**20:.2f} MiB measured")
    record(BEST_UNIFORM_XLA, uniform_plan(chain.n, min(totals, key=totals.__getitem__)))
  return rows


def run(names: Iterable[str], *, quick: bool = False,
        progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
  """Benchmarks the named ``MODELS``; with ``quick``, small inputs and no every-k sweep.

  ``progress`` is called with a line of text as work is done. Returns
  ``{"meta": ..., "rows": [...]}``.
  """
  names = list(names)
  unknown = [n for n in names if n not in MODELS]
  if unknown:
    raise ValueError(f"unknown benchmark models {unknown}; choose from {sorted(MODELS)}.")
  rows = []
  for k, name in enumerate(names):
    progress(f"model {k + 1}/{len(names)}: {name} (tracing and profiling)")
    spec = MODELS[name]
    rows += bench_model(name, spec.build(), spec.example(quick), spec.apply_kwargs(), best_uniform_xla=not quick, progress=progress)
  import flax  # only for the versions
  meta = {
      "date": datetime.date.today().isoformat(),
      "backend": jax.default_backend(),
      "device": str(jax.devices()[0].device_kind),
      "machine": platform.processor() or platform.machine(),
      "quick": quick,
      "versions": {"jax": jax.__version__, "flax": flax.__version__,
                   "python": platform.python_version()},
  }
  return {"meta": meta, "rows": rows}


def to_markdown(rows: list[dict[str, Any]]) -> str:
  """A table of the rows: predicted, model R and XLA MiB, the error, recompute GFLOP."""
  lines = ["| model | strategy | checkpoints | predicted MiB | model R MiB | XLA MiB | error "
           "| vs none | recompute GFLOP |", "|---|---|---|---|---|---|---|---|---|"]
  none = {r["model"]: r["measured_bytes"] for r in rows if r["strategy"] == "none"}
  for r in rows:
    err = 100 * (r["predicted_bytes"] - r["measured_bytes"]) / r["measured_bytes"]
    base = none.get(r["model"])
    versus = f"{100 * r['measured_bytes'] / base:.0f}%" if base else "-"
    lines.append(
        f"| {r['model']} | {r['strategy']} | {len(r['checkpoints'])} "
        f"| {r['predicted_bytes'] / 2**20:.2f} | {r['model_r_bytes'] / 2**20:.2f} "
        f"| {r['measured_bytes'] / 2**20:.2f} | {err:+.1f}% | {versus} "
        f"| {r['recompute_flops'] / 1e9:.4f} |")
  return "\n".join(lines) + "\n\n" + STRATEGY_NOTE


#: What each strategy of the table is, printed under it.
STRATEGY_NOTE = (
    "sqrt, best-uniform and optimal are solved on the profile's bytes alone (model R, "
    "`jaxremat.solve(r.chain, method)`), so XLA can rank them otherwise: a best-uniform "
    "plan can measure below optimal's. apply-default is what `jaxremat.apply` returns: "
    "model R's optima refined on the backend's estimate and confirmed by XLA's compiles. "
    f"{BEST_UNIFORM_XLA} is the checkpoint-every-k plan XLA measures least, every k "
    "compiled (not with --quick).")
