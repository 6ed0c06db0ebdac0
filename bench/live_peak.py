"""How much of each prediction error is XLA's heap packing: live temp bytes against temp.

    PYTHONPATH=. python bench/live_peak.py bench/results/memory-cpu/memory.json \
        [--models a,b] --out bench/results/live-peak-cpu/live-peak.json

For every row of a ``bench/memory.py`` JSON that has a plan and a prediction, it compiles
the plan's gradient step again (as ``jaxremat.measure`` does) with an XLA dump and reads
off it the temp allocation's values (``bench/xla_heap.py``): their peak live bytes (the
most bytes of the allocation holding a live value at one point of XLA's schedule; an
output written over its operand in place shares its bytes, and counts once), and the
allocation XLA's heap placement makes of them, replayed (``replay_bytes``; it should
equal XLA's temp bytes, and the script says where it does not).

The difference between live bytes and the allocation is packing: room XLA's heap leaves
between the buffers. The prediction models live buffers, so its error splits into a
live-bytes error (the prediction against the footprint with the temp allocation at its
live peak) and packing. CPU only: the dumps are read as XLA's CPU backend writes them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import jax

import jaxremat
from jaxremat._api.loss import training_loss
from jaxremat.zoo_registry import BenchModel, tagged

sys.path.insert(0, os.path.dirname(__file__))
import xla_heap  # noqa: E402  (bench/xla_heap.py: a dump's temp values, XLA's heap replayed)


def measure_plan(spec: BenchModel, model, params, x, plan: jaxremat.Plan):
  """``(Footprint, temp values)`` of ``plan``'s gradient step on ``spec``'s model
  (``xla_heap.measure_with_temp_values`` of the benchmark's loss)."""
  fn = jaxremat.apply(model.apply, params, x, plan=plan, **spec.apply_kwargs()).fn
  return xla_heap.measure_with_temp_values(training_loss(fn, spec.apply_kwargs()), params, x)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("rows", help="a bench/memory.py JSON")
  parser.add_argument("--models", help="comma-separated subset of its models")
  parser.add_argument("--out", required=True, help="JSON path; the markdown table goes beside it")
  args = parser.parse_args()
  if jax.default_backend() != "cpu":
    parser.error("the live-range dump is read as XLA's CPU backend writes it; run on CPU")
  with open(args.rows) as f:
    recorded = [r for r in json.load(f)["rows"]
                if r["checkpoints"] is not None and r["predicted_bytes"] is not None]
  wanted = set(args.models.split(",")) if args.models else None
  specs = {m.name: m for m in tagged("cpu")}
  rows = []
  for name in dict.fromkeys(r["model"] for r in recorded):
    if wanted is not None and name not in wanted:
      continue
    spec = specs[name]
    model, x, params = spec.instantiate()
    base = jaxremat.apply(model.apply, params, x, **spec.apply_kwargs())
    for r in (r for r in recorded if r["model"] == name):
      plan = jaxremat.Plan(tuple(r["checkpoints"]))
      footprint, values = measure_plan(spec, model, params, x, plan)
      fixed = footprint.total_bytes - footprint.temp_bytes
      rows.append({"model": name, "strategy": r["strategy"], "checkpoints": r["checkpoints"],
                   "predicted_bytes": base.predict_total_bytes(plan),
                   "measured_bytes": footprint.total_bytes,
                   "live_bytes": fixed + xla_heap.live_peak_bytes(values),
                   "replay_bytes": fixed + xla_heap.replay_temp_bytes(values)})
      print(_line(rows[-1]), file=sys.stderr, flush=True)
  meta = {"date": datetime.date.today().isoformat(), "command": " ".join(["python", *sys.argv]),
          "source": args.rows,
          "versions": {"jax": jax.__version__, "jaxlib": jax.lib.__version__}}
  with open(args.out, "w") as f:
    json.dump({"meta": meta, "rows": rows}, f, indent=1)
  table = to_markdown(rows)
  off = [r for r in rows if r["replay_bytes"] != r["measured_bytes"]]
  table += (f"\n\nThe heap replay equals XLA's footprint to the byte on {len(rows) - len(off)} of "
            f"{len(rows)} rows" + ("." if not off else ", not on: " + ", ".join(
                f"{r['model']} {r['strategy']} ({r['replay_bytes'] - r['measured_bytes']:+d} B)"
                for r in off) + "."))
  with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
    f.write(f"Command: `{meta['command']}` ({meta['date']}, jax {jax.__version__})\n\n{table}\n")
  print(table)
  return 0


def _line(r: dict) -> str:
  return (f"{r['model']:<24} {r['strategy']:<14} pred {r['predicted_bytes'] / 2**20:7.2f} "
          f"live {r['live_bytes'] / 2**20:7.2f} XLA {r['measured_bytes'] / 2**20:7.2f} MiB, "
          f"replay {r['replay_bytes'] - r['measured_bytes']:+d} B")


def to_markdown(rows: list[dict]) -> str:
  """Per row: predicted, live and XLA footprint (MiB), packing, and both errors (%)."""
  lines = ["| model | strategy | predicted MiB | live MiB | XLA MiB | packing | "
           "error vs XLA | error vs live |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    pred, live, got = r["predicted_bytes"], r["live_bytes"], r["measured_bytes"]
    lines.append(
        f"| {r['model']} | {r['strategy']} | {pred / 2**20:.2f} | {live / 2**20:.2f} | "
        f"{got / 2**20:.2f} | {100 * (got - live) / live:+.1f}% | {100 * (pred - got) / got:+.1f}% | "
        f"{100 * (pred - live) / live:+.1f}% |")
  return "\n".join(lines)


if __name__ == "__main__":
  sys.exit(main())
