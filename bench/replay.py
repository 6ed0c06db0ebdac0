"""The compiled profile's replay against the jaxpr estimate and XLA, per checkpoint-every-k plan.

    PYTHONPATH=. python bench/replay.py bench/results/unseen-cpu/unseen.json \
        [--set unseen|zoo|realworld] [--target h100] --out bench/results/replay-cpu/replay.json

For each model of the set, the footprint of every checkpoint-every-k plan (k = n: no
remat) as the jaxpr estimate predicts it (``apply(profile="jaxpr")``), as the compiled
profile replays it (``jaxremat._backends.replay``: one compile of the plain step with a
dump), and as XLA compiles it (the plan's row in a ``bench/unseen.py`` JSON of the same
set and target, whose figures do not depend on jaxremat's planner).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import jaxremat
from jaxremat._api.graph_planner import graph_kept
from jaxremat._api.loss import training_loss_with_arrays
from jaxremat._backends.plain_step import compile_replay
from jaxremat._backends.replay import Replay, chain_kept
from jaxremat._backends.targets import get_target
from jaxremat._jaxpr.trace import trace
from jaxremat.solvers import uniform_plan

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: record, unseen
from record import run_meta, write_result  # noqa: E402
from unseen import SETS, model_set  # noqa: E402


def plain_replay(fn, params, x, kwargs, target: str | None = None
                 ) -> tuple[Replay, jaxremat.Remat]:
  """The plain step's ``Replay`` (one compile with a dump, for ``target`` when given)
  and ``apply``'s result (its estimate)."""
  r = jaxremat.apply(fn, params, x, verify=False, target=target, profile="jaxpr", **kwargs)
  traced = trace(fn, params, x, kwargs, None)
  loss, arrays = training_loss_with_arrays(fn, kwargs)
  kept = graph_kept(r.chain) if r.is_graph else chain_kept(r.chain.act_bytes)
  return compile_replay(traced, loss, params, x, kept, get_target(target), arrays), r


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("measured", help="a bench/unseen.py JSON of the same set (XLA's figures)")
  parser.add_argument("--set", default="unseen", choices=SETS)
  parser.add_argument("--target", help="compile for this GPU deviceless (h100, a100)")
  parser.add_argument("--out", required=True, help="JSON path (markdown written beside it)")
  args = parser.parse_args()
  start = time.time()
  recorded = {r["model"]: r for r in json.load(open(args.measured))["rows"]}
  rows = []
  for name, build in model_set(args.set).items():
    if name not in recorded:
      continue
    fn, params, x, kwargs = build()
    replay, r = plain_replay(fn, params, x, kwargs, args.target)
    planner = r._model
    for k in range(1, r.chain.n + 1):
      plan = uniform_plan(r.chain.n, k)
      rows.append({"model": name, "k": k, "xla": recorded[name]["uniform_bytes"][str(k)],
                   "estimate": planner.total_bytes(plan),
                   "replay": replay.total_bytes(plan.checkpoints)})
    print(name, flush=True)
  write_result(args.out, run_meta(time.time() - start, target=args.target), rows,
               to_markdown(rows))
  return 0


def to_markdown(rows: list[dict]) -> str:
  lines = ["Error of each prediction against XLA's footprint, per checkpoint-every-k plan "
           "(k = n: no remat): estimate / replay.", ""]
  by_model = collections.defaultdict(list)
  for r in rows:
    by_model[r["model"]].append(r)
  for name, found in by_model.items():
    cells = " ".join(f"{r['k']}: {_err(r, 'estimate')}/{_err(r, 'replay')}" for r in found)
    lines.append(f"- {name}: {cells}")
  lines += ["", "| prediction | rows | mean \\|error\\| | worst | within 3% |", "|---|---|---|---|---|"]
  for key in ("estimate", "replay"):
    errors = [abs(r[key] / r["xla"] - 1) for r in rows]
    lines.append(f"| {key} | {len(errors)} | {100 * sum(errors) / len(errors):.1f}% "
                 f"| {100 * max(errors):.1f}% | {sum(e <= 0.03 for e in errors)} |")
  return "\n".join(lines) + "\n"


def _err(row: dict, key: str) -> str:
  return f"{100 * (row[key] / row['xla'] - 1):+.0f}%"


if __name__ == "__main__":
  raise SystemExit(main())
