"""The demo behind ``jaxremat demo``: a conv chain profiled, solved, emitted and measured
with XLA under each strategy."""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

import jaxremat
from jaxremat import zoo
from jaxremat._api.loss import training_loss

DEMO_METHODS = ("none", "every-layer", "sqrt", "best-uniform", "optimal", "apply")
DEMO_MODELS = ("all-conv", *sorted(zoo.VGG_CONFIGS))


def _max_rel_error(want: Any, got: Any) -> float:
  worst = 0.0
  for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    worst = max(worst, float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30)))
  return worst


def run_demo(model_name: str, width: float, batch: int, image_size: int) -> dict[str, Any]:
  """Profiles, solves, emits and measures a conv chain; returns the rows of the table.

  ``"apply"`` is what ``jaxremat.apply`` returns by default (the model-R optimum, least
  recompute among ties, refined on the XLA-aware estimate); ``"optimal"`` is model R's
  optimum alone.
  """
  model = zoo.all_conv() if model_name == "all-conv" else zoo.vgg(model_name, width=width)
  x = jax.random.normal(jax.random.key(1), (batch, image_size, image_size, 3))
  params = model.init(jax.random.key(0), x)
  start = time.perf_counter()
  r = jaxremat.apply(model.apply, params, x)
  profile_seconds = time.perf_counter() - start
  assert isinstance(r.chain, jaxremat.Chain), "the demo models (all-conv, VGG) are chains"
  want = jax.jit(jax.grad(training_loss(model.apply, {})))(params, x)
  rows = []
  for method in DEMO_METHODS:
    plan = r.plan if method == "apply" else jaxremat.solve(r.chain, method)
    rm = jaxremat.apply(model.apply, params, x, plan=plan)
    footprint = jaxremat.measure(training_loss(rm.fn, {}), params, x)
    got = jaxremat.jit(jax.grad(training_loss(rm.fn, {})))(params, x)
    rows.append({
        "method": method,
        "checkpoints": list(plan.checkpoints),
        "predicted_bytes": rm.predicted_total_bytes,
        "measured_bytes": footprint.total_bytes,
        "temp_bytes": footprint.temp_bytes,
        "xla_flops": footprint.flops,
        "grad_max_rel_error": _max_rel_error(want, got),
    })
  return {
      "model": (f"{model_name}" + ("" if model_name == "all-conv" else f" width={width}")
                + f" batch={batch} input={image_size}x{image_size}x3"),
      "layers": r.chain.n,
      "backend": jax.default_backend(),
      "jax": jax.__version__,
      "profile_seconds": profile_seconds,
      "solve_seconds": r.solve_seconds,
      "report": r.report(),
      "rows": rows,
  }


def format_demo(result: dict[str, Any]) -> str:
  base = next(row for row in result["rows"] if row["method"] == "none")
  lines = [
      f"jaxremat demo: {result['model']}, {result['layers']} layers, backend {result['backend']}, jax {result['jax']}",
      "",
      result["report"],
      "",
      "XLA-measured footprint of the gradient step (argument + output + temp - alias):",
      f"{'strategy':<14}{'predicted MiB':>14}{'measured MiB':>14}{'error':>8}{'vs none':>9}{'XLA GFLOP':>11}{'grad err':>10}",
  ]
  for row in result["rows"]:
    pred, meas = row["predicted_bytes"], row["measured_bytes"]
    lines.append(
        f"{row['method']:<14}{pred / 2**20:>14.2f}{meas / 2**20:>14.2f}{100 * (pred - meas) / meas:>+7.1f}%"
        f"{100 * meas / base['measured_bytes']:>8.1f}%{row['xla_flops'] / 1e9:>11.3f}{row['grad_max_rel_error']:>10.1e}")
  lines.append("")
  lines.append(f"profile {result['profile_seconds']:.2f} s, optimal solve {1e3 * result['solve_seconds']:.3f} ms")
  return "\n".join(lines)
