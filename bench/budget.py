"""Budget mode: does XLA's footprint of ``apply(budget_bytes=B)`` stay within B, and at
what recompute?

    PYTHONPATH=. python bench/budget.py [--models vgg11-w0.25,...] [--target h100] \
        [--out bench/results/budget-cpu/budget.json]

For each model (default: the "cpu" models of jaxremat/zoo_registry.py) B is set to 50% and
75% of the way from the least footprint jaxremat reaches (``apply(verify=True)``) to the
no-remat footprint, both XLA-measured. Per budget: the plan's checkpoints, its XLA
footprint, its recompute (FLOPs, as a share of the every-layer plan's), and each plan
compiled on the way with the planner's prediction beside XLA's figure: where the two part,
the budget loop had to tighten (the stall a lent H200 showed: one plan compiled again
and again, then the every-layer fallback).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jaxremat
from jaxremat._api.loss import training_loss
from jaxremat._model.chain import Plan
from jaxremat.zoo_registry import MODELS, tagged

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: its record module
from record import run_meta, write_result  # noqa: E402

FRACTIONS = (0.5, 0.75)


def run_model(spec, target: str | None) -> list[dict]:
  model, x, params = spec.instantiate()
  kwargs = spec.apply_kwargs()
  none = jaxremat.measure(training_loss(model.apply, kwargs), params, x,
                          target=target).total_bytes
  least = min(jaxremat.apply(model.apply, params, x, verify=True, target=target,
                             **kwargs).verified.values())
  rows = []
  for fraction in FRACTIONS:
    budget = int(least + fraction * (none - least))
    row = {"model": spec.name, "fraction": fraction, "budget_bytes": budget,
           "least_bytes": least, "no_remat_bytes": none}
    try:
      r = jaxremat.apply(model.apply, params, x, budget_bytes=budget, target=target, **kwargs)
    except jaxremat.InfeasibleBudgetError as err:
      rows.append({**row, "infeasible": err.min_feasible_bytes})
      continue
    planner = r._model  # the planner apply used: its predictions and recompute
    every = planner.recompute_flops(Plan(tuple(range(1, planner.chain.n))))
    row.update(checkpoints=list(r.plan.checkpoints), bytes=r.measured_total_bytes,
               recompute_share=planner.recompute_flops(r.plan) / max(every, 1),
               compiled=[[list(c), planner.total_bytes(Plan(c)), b]
                         for c, b in (r.verified or {}).items()])
    rows.append(row)
    print(markdown([row]).splitlines()[-1], file=sys.stderr, flush=True)
  return rows


def markdown(rows: list[dict]) -> str:
  lines = ["| model | budget MiB | XLA MiB | within | checkpoints | recompute (share of "
           "every layer) | compiled: predicted / XLA MiB |", "|---|---|---|---|---|---|---|"]
  for row in rows:
    head = f"| {row['model']} | {row['fraction']:.0%} = {row['budget_bytes'] / 2**20:.2f}"
    if "infeasible" in row:
      lines.append(f"{head} | infeasible: least {row['infeasible'] / 2**20:.2f} | - | - | - | - |")
      continue
    compiled = "; ".join(f"{len(c)} cp {p / 2**20:.2f} / {b / 2**20:.2f}"
                         for c, p, b in row["compiled"])
    lines.append(f"{head} | {row['bytes'] / 2**20:.2f} | "
                 f"{'yes' if row['bytes'] <= row['budget_bytes'] else 'NO'} | "
                 f"{len(row['checkpoints'])} | {row['recompute_share']:.0%} | {compiled} |")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", help="comma-separated zoo model names (default: the CPU zoo)")
  parser.add_argument("--target", help="a GPU target to compile for deviceless (h100, h200)")
  parser.add_argument("--out", default="bench/results/budget-cpu/budget.json")
  args = parser.parse_args()
  by_name = {m.name: m for m in MODELS}
  specs = ([by_name[n] for n in args.models.split(",")] if args.models else tagged("cpu"))
  start = time.perf_counter()
  rows = [row for spec in specs for row in run_model(spec, args.target)]
  table = markdown(rows)
  print(table)
  write_result(args.out, run_meta(time.perf_counter() - start, target=args.target), rows, table)
  return 0


if __name__ == "__main__":
  sys.exit(main())
