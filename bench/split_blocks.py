"""``jaxremat.fit`` on Flax transformers at their blocks (a chain) and split below their
residual adds (``layer_depth=4``: a graph of the blocks' pieces), at 25/50/75% of the
activations.

    PYTHONPATH=. python bench/split_blocks.py [--models vit,lm1b] [--target h100] \
        [--out bench/results/split-blocks-h100-aot/split-blocks.json]

Per model (``tests/realworld_models.py``, size ``bench``), depth and budget: XLA's
footprint of ``fit``'s plan, its predicted recompute (the target's roofline), the plans
compiled and the seconds ``fit`` took. With a GPU target nothing is timed (``fit``
returns its plan of least predicted recompute that XLA fits); on the local backend
``fit`` times the plans that fit and returns the fastest.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jaxremat

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: its record module
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import realworld_models as rm  # noqa: E402
from record import run_meta, write_result  # noqa: E402

BUDGETS = (0.25, 0.5, 0.75)
DEPTHS = {"blocks": None, "split (layer_depth=4)": 4}


def run_model(name: str, target: str | None) -> list[dict]:
  case = rm.build(name, "bench")
  model, variables = rm.init(case)
  rows = []
  for share in BUDGETS:
    row: dict = {"model": name, "share": share}
    for label, depth in DEPTHS.items():
      start = time.perf_counter()
      try:
        f = jaxremat.fit(model.apply, variables, case.batch, share, layer_depth=depth,
                         target=target, **case.kwargs)
      except jaxremat.InfeasibleBudgetError as err:
        row[label] = {"infeasible": str(err)}
        continue
      row["budget_bytes"] = f.budget_bytes
      row[label] = {"layers": len(f.chain.names), "bytes": f.measured_total_bytes,
                    "predicted_s": f.predicted_seconds, "compiles": len(f.compiled),
                    "fit_s": round(time.perf_counter() - start, 1), "plan": f.plan.describe()}
    rows.append(row)
    print(markdown([row]).splitlines()[-1], flush=True)
  return rows


def markdown(rows: list[dict]) -> str:
  """Per model and budget, per depth: XLA's footprint (MiB), predicted recompute (us),
  compiles and fit's seconds."""
  lines = ["| model | budget | " + " | ".join(f"{d}: MiB, recompute us (compiles, fit s)"
                                             for d in DEPTHS) + " |",
           "|" + "---|" * (len(DEPTHS) + 2)]
  for row in rows:
    cells = []
    for label in DEPTHS:
      s = row[label]
      cells.append("infeasible" if "infeasible" in s else
                   f"{s['bytes'] / 2**20:.2f}, {s['predicted_s'] * 1e6:.1f} "
                   f"({s['compiles']}, {s['fit_s']:.0f} s), {s['layers']} layers")
    budget = f"{row['budget_bytes'] / 2**20:.2f} MiB" if "budget_bytes" in row else "-"
    lines.append(f"| {row['model']} | {row['share']:.0%} = {budget} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", default="vit,lm1b", help="comma-separated realworld models")
  parser.add_argument("--target", help="a GPU target to compile for deviceless (h100, a100)")
  parser.add_argument("--out", default="bench/results/split-blocks-h100-aot/split-blocks.json")
  args = parser.parse_args(argv)
  start = time.perf_counter()
  rows = [r for name in args.models.split(",") for r in run_model(name, args.target)]
  table = markdown(rows)
  print(table)
  write_result(args.out, run_meta(time.perf_counter() - start, target=args.target), rows, table)


if __name__ == "__main__":
  main()
