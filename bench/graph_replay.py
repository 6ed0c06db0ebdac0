"""The compiled profile on graphs of layers: replay against model G and XLA, per plan.

    PYTHONPATH=. python bench/graph_replay.py [--target h100] \
        --out bench/results/graph-replay-cpu/graph-replay.json

Graphs: the zoo's U-Net and DenseNet as written, and the transformers of bench/unseen.py
one name-stack level below their blocks (``finer_depth``, where ``layer_depth="search"``
plans them: the residual adds span attention and MLP). For each, every
checkpoint-every-k plan and model G's optimum are predicted by model G
(``profile="jaxpr"``) and by the replay of the plain step (``profile="compiled"``), and
compiled (``jaxremat.measure``, for ``--target`` when given). Then default ``apply`` with
each profile: XLA's footprint of the plan it returns, and that prediction's error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

import jaxremat
from jaxremat._api.finer import finer_depth
from jaxremat._api.loss import training_loss
from jaxremat._jaxpr.trace import trace
from jaxremat.solvers import uniform_plan
from jaxremat.zoo_graphs import DenseNet, UNet

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: record, unseen
from record import run_meta, write_result  # noqa: E402
from unseen import model_set  # noqa: E402

PROFILES = ("jaxpr", "compiled")


def graphs() -> dict[str, tuple[Callable[[], Any], bool]]:
  """name -> (a builder of ``(fn, params, x, kwargs)``, whether one level below)."""
  x = jax.random.normal(jax.random.key(0), (8, 32, 32, 3))
  found: dict[str, tuple[Callable[[], Any], bool]] = {}
  for name, model in (("U-Net (8, 16, 32)", UNet((8, 16, 32))),
                      ("DenseNet (4, 4)", DenseNet((4, 4), growth=8, stem=16))):
    found[name] = (lambda m=model: (m.apply, jax.jit(m.init)(jax.random.key(1), x), x, {}),
                   False)
  zoo, unseen = model_set("zoo"), model_set("unseen")
  for name in ("vit-d64-L6", "gpt-causal-d64-L6-s128"):
    found[name] = (zoo[name], True)
  for name, build in unseen.items():
    if "pre-LN" in name or "mixer" in name:
      found[name] = (build, True)
  return found


def run(name: str, build: Callable[[], Any], finer: bool, target: str | None) -> dict:
  fn, params, x, kwargs = build()
  depth = finer_depth(trace(fn, params, x, kwargs, None)) if finer else None

  def footprint(f: Callable[..., Any]) -> int:
    return jaxremat.measure(training_loss(f, kwargs), params, x, target=target).total_bytes

  def apply(**options: Any) -> jaxremat.Remat:
    return jaxremat.apply(fn, params, x, layer_depth=depth, target=target, **options, **kwargs)

  predict = {p: apply(profile=p, verify=False) for p in PROFILES}
  n = predict["compiled"].chain.n
  assert predict["compiled"].is_graph, name
  plans = {uniform_plan(n, k).checkpoints for k in range(1, n + 1)}
  plans.add(predict["jaxpr"].plan.checkpoints)  # model G's optimum
  plans_rows = []
  for checkpoints in sorted(plans):
    plan = jaxremat.Plan(checkpoints)
    xla = footprint(apply(plan=plan, profile="jaxpr", verify=False).fn)
    plans_rows.append({"plan": list(checkpoints), "xla": xla,
                       **{p: predict[p].predict_total_bytes(plan) for p in PROFILES}})
  by_default = {}
  for p in PROFILES:
    start = time.time()
    r = apply(profile=p)
    by_default[p] = {"plan": list(r.plan.checkpoints), "xla": r.measured_total_bytes,
                     "predicted": r.predicted_total_bytes, "seconds": time.time() - start}
  print(name, flush=True)
  return {"model": name, "layer_depth": depth, "layers": n, "plans": plans_rows,
          "apply": by_default, "least": min(r["xla"] for r in plans_rows)}


def markdown(rows: list[dict]) -> str:
  mib = 2 ** 20
  lines = ["Per model: the error of each profile's prediction against XLA's footprint over "
           "every checkpoint-every-k plan and model G's optimum (mean |error|, plans within "
           "3%); then default `apply` with each profile: XLA's footprint of its plan (MiB), "
           "the prediction's error, and the plan against the least footprint of those plans.",
           "", "| model | layers (depth) | plans | model G: mean \\|error\\| (within 3%) "
           "| replay: mean \\|error\\| (within 3%) | apply, jaxpr: MiB (error, vs least) "
           "| apply, compiled: MiB (error, vs least) |", "|---|---|---|---|---|---|---|"]
  totals = {p: [] for p in PROFILES}
  for row in rows:
    cells = []
    for p in PROFILES:
      errors = [abs(r[p] / r["xla"] - 1) for r in row["plans"]]
      totals[p] += errors
      cells.append(f"{100 * sum(errors) / len(errors):.1f}% "
                   f"({sum(e <= 0.03 for e in errors)})")
    for p in PROFILES:
      a = row["apply"][p]
      cells.append(f"{a['xla'] / mib:.2f} ({100 * (a['predicted'] / a['xla'] - 1):+.1f}%, "
                   f"{100 * (a['xla'] / row['least'] - 1):+.1f}%)")
    lines.append(f"| {row['model']} | {row['layers']} ({row['layer_depth']}) "
                 f"| {len(row['plans'])} | " + " | ".join(cells) + " |")
  lines.append("")
  for p, name in zip(PROFILES, ("model G", "replay")):
    errors = totals[p]
    lines.append(f"- {name}: {len(errors)} plans, mean |error| "
                 f"{100 * sum(errors) / len(errors):.1f}%, within 3% on "
                 f"{sum(e <= 0.03 for e in errors)}")
  return "\n".join(lines) + "\n"


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", help="compile for this GPU deviceless (h100, a100)")
  parser.add_argument("--models", help="comma-separated substrings of the models to run")
  parser.add_argument("--out", required=True, help="JSON path (markdown written beside it)")
  args = parser.parse_args()
  start = time.time()
  rows = [run(name, build, finer, args.target) for name, (build, finer) in graphs().items()
          if not args.models or any(m in name for m in args.models.split(","))]
  write_result(args.out, run_meta(time.time() - start, target=args.target), rows,
               markdown(rows))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
