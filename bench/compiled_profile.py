"""Model R's footprint from the jaxpr profile vs from the compiled profile, against XLA.

    PYTHONPATH=. python bench/compiled_profile.py [--models a,b] [--size bench]
        [--out bench/results/compiled-profile-cpu/compiled-profile.json]

For each model (quick zoo models of bench/memory.py and the real-world-structure ViT and
lm1b of tests/realworld_models.py, with dropout at ``--size bench``) and plan (none,
every-layer, best-uniform: the uniform plan of least model-R peak on the jaxpr chain,
optimal: ``solve(chain, "optimal")`` on the jaxpr chain, as apply plans it without
refine), the footprint ``fixed_bytes + simulate_peak_bytes(chain, plan) - a_0`` with
(a) the jaxpr chain (``apply(...).chain``), (b) the compiled chain (``b_i``, ``e_i`` from
``jaxremat._backends.compiled``: values in XLA's temp allocation) and (c) the compiled
chain with the kept values XLA placed in output buffers counted too, against XLA's
footprint of the plan (``jaxremat.measure`` of ``apply(plan=..., verify=False).fn``; for
none, the compile the compiled profile is read from). Only the profile differs.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from typing import Any


import jaxremat
from jaxremat._api.loss import training_loss
from jaxremat._backends.compiled import CompiledProfile, compiled_profile, with_compiled
from jaxremat._jaxpr.trace import trace
from jaxremat.solvers import uniform_plan

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import memory as zoo_bench  # type: ignore[import-not-found]  # noqa: E402
import realworld_models as rm  # type: ignore[import-not-found]  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: its record module
from record import run_meta, write_result  # noqa: E402

ZOO = ("mlp-uneven", "vgg11-w0.25", "resnet18-w0.25", "vit-d64-L6", "gpt-causal-d64-L6-s128")
REALWORLD = ("vit", "lm1b")
PROFILES = ("jaxpr", "compiled", "compiled+out")


def _models(names: list[str], size: str) -> list[tuple[str, str, Any, Any, Any, dict]]:
  """(name, group, apply fn, variables, batch, kwargs) per model."""
  out = []
  by_name = {m.name: m for m in zoo_bench.MODELS}
  for name in names:
    if name in by_name:
      model, x, params = by_name[name].instantiate()
      out.append((name, "zoo", model.apply, params, x, dict(by_name[name].kwargs)))
    else:
      case = rm.build(name, size)
      model, variables = rm.init(case)
      out.append((f"{name}-{size}", "realworld", model.apply, variables, case.batch,
                  dict(case.kwargs)))
  return out


def _with_outputs(found: CompiledProfile) -> CompiledProfile:
  """``found`` with the kept values in output buffers counted as the layers' residuals."""
  import dataclasses
  res = tuple(b + o for b, o in zip(found.res_bytes, found.output_buffer_bytes))
  return dataclasses.replace(found, res_bytes=res)


def bench_model(name: str, group: str, fn: Any, params: Any, x: Any, kwargs: dict) -> list[dict]:
  """One row per plan: the three predictions and XLA's footprint (bytes)."""
  start = time.perf_counter()
  r = jaxremat.apply(fn, params, x, verify=False, refine=False, **kwargs)
  base = r.chain
  if not isinstance(base, jaxremat.Chain):
    raise RuntimeError(f"{name} is planned as a graph, not a chain")
  traced = trace(fn, params, x, kwargs)
  if tuple(layer.name for layer in traced.layers) != base.names:
    raise RuntimeError(f"{name}: apply's layers are not trace's")
  loss = training_loss(fn, kwargs)
  found = compiled_profile(traced, loss, params, x)
  chains = {"jaxpr": base, "compiled": with_compiled(base, found),
            "compiled+out": with_compiled(base, _with_outputs(found))}
  n = base.n
  best_k = min(range(1, max(n, 2)),
               key=lambda k: jaxremat.simulate_peak_bytes(base, uniform_plan(n, k)))
  plans = {"none": jaxremat.Plan(()), "every-layer": jaxremat.solve(base, "every-layer"),
           f"best-uniform k={best_k}": uniform_plan(n, best_k),
           "optimal": jaxremat.solve(base, "optimal")}
  rows = []
  for label, plan in plans.items():
    if label == "none":
      measured = found.footprint.total_bytes if found.footprint else 0
    else:
      planned = jaxremat.apply(fn, params, x, plan=plan, verify=False, **kwargs)
      measured = jaxremat.measure(training_loss(planned.fn, kwargs), params, x).total_bytes
    row: dict[str, Any] = {"model": name, "group": group, "layers": n, "plan": label,
                           "checkpoints": list(plan.checkpoints), "measured_bytes": measured,
                           "fixed_bytes": r.fixed_bytes}
    for profile, chain in chains.items():
      predicted = r.fixed_bytes + jaxremat.simulate_peak_bytes(chain, plan) - chain.act_bytes[0]
      row[f"{profile}_bytes"] = predicted
      row[f"{profile}_error"] = round((predicted - measured) / measured, 4)
    rows.append(row)
  rows[0]["res_bytes"] = {p: sum(c.res_bytes) for p, c in chains.items()}
  _log(f"  {name}: {n} layers, {time.perf_counter() - start:.1f} s; errors "
       + "; ".join(f"{row['plan']}: " + " ".join(f"{row[p + '_error']:+.1%}" for p in PROFILES)
                   for row in rows))
  return rows


def summary(rows: list[dict]) -> list[dict]:
  """Mean |error| per model group and profile, and over all rows."""
  out = []
  for group in (*dict.fromkeys(r["group"] for r in rows), "all"):
    chosen = [r for r in rows if group in ("all", r["group"])]
    out.append({"group": group, "rows": len(chosen), **{
        p: round(sum(abs(r[f"{p}_error"]) for r in chosen) / len(chosen), 4) for p in PROFILES}})
  return out


def to_markdown(rows: list[dict]) -> str:
  mib = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
  lines = ["| model | plan | XLA MiB | (a) jaxpr MiB | err | (b) compiled MiB | err | "
           "(c) compiled+out MiB | err |", "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['model']} | {r['plan']} | {mib(r['measured_bytes'])} | "
                 + " | ".join(f"{mib(r[p + '_bytes'])} | {r[p + '_error']:+.1%}" for p in PROFILES)
                 + " |")
  lines += ["", "Mean |error|:", "", "| group | rows | (a) jaxpr | (b) compiled | (c) compiled+out |",
            "|---|---|---|---|---|"]
  for s in summary(rows):
    lines.append(f"| {s['group']} | {s['rows']} | "
                 + " | ".join(f"{s[p]:.1%}" for p in PROFILES) + " |")
  return "\n".join(lines)


def _log(text: str) -> None:
  print(text, file=sys.stderr, flush=True)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default=",".join((*ZOO, *REALWORLD)))
  parser.add_argument("--size", default="bench", help="size of the real-world models")
  parser.add_argument("--out", help="JSON path; the markdown table goes beside it (.md)")
  args = parser.parse_args()
  start = time.perf_counter()
  rows: list[dict] = []
  for spec in _models(args.models.split(","), args.size):
    rows += bench_model(*spec)
    if args.out:
      _write(args.out, rows, time.perf_counter() - start)
  print(to_markdown(rows))
  return 0


def _write(path: str, rows: list[dict], seconds: float) -> None:
  meta = run_meta(seconds, profiles={
      "jaxpr": "(a) apply's jaxpr profile", "compiled": "(b) b_i, e_i from the compiled plain "
      "step, temp values", "compiled+out": "(c) as (b), with the kept values XLA placed in "
      "output buffers"})
  write_result(path, meta, rows, to_markdown(rows), summary=summary(rows))

if __name__ == "__main__":
  sys.exit(main())
