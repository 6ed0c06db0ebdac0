"""How much of each prediction error is XLA's heap packing: live temp bytes against temp.

    PYTHONPATH=. python bench/live_peak.py bench/results/memory-cpu-DATE.json \
        [--models a,b] --out bench/results/live-peak-cpu-DATE.json

For every row of a ``bench/memory.py`` JSON that has a plan and a prediction, it compiles
the plan's gradient step again (as ``jaxremat.measure`` does) with an XLA dump and reads
off it the temp allocation's size and its peak live bytes: the most bytes of the temp
allocation that hold a live value at one point of XLA's schedule
(``*-buffer-assignment.txt`` gives each value's offset and size, ``*-live-range.txt``
its live range, both ends included; an output written over its operand in place shares
its bytes, and counts once).

The difference is packing: room XLA's heap leaves between the buffers (fragmentation).
The prediction models live buffers, so its error splits into a live-bytes error (the
prediction against the footprint with the temp allocation at its live peak) and
packing. CPU only: the dumps are read as XLA's CPU backend writes them.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import sys
import tempfile

import jax

import jaxremat
from jaxremat._bench import loss_of

sys.path.insert(0, os.path.dirname(__file__))
import memory  # noqa: E402  (bench/memory.py: the zoo models and their batches)

_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)")
_VALUE = re.compile(r"^ value: <\d+ (\S+?) @0> \(size=(\d+),offset=(\d+)\)")
_RANGE = re.compile(r"^\s+(\S+\{[\d,]*\}):(\d+)-(\d+)$")


def temp_live_bytes(buffer_assignment: str, live_range: str) -> tuple[int, int]:
  """``(temp allocation bytes, its peak live bytes)`` from one step's two dumps."""
  temp, spans = temp_spans(buffer_assignment, live_range)
  return temp, live_peak_bytes(spans)


def live_peak_bytes(spans: list[tuple[int, int, int, int]]) -> int:
  """The most bytes of the allocation holding a live value at one point (``spans`` as
  ``temp_spans`` gives them; values sharing bytes in place count once)."""
  peak = 0
  for t in {first for first, _, _, _ in spans}:  # the live bytes peak where a value starts
    live = sorted((lo, hi) for first, last, lo, hi in spans if first <= t <= last)
    covered, end = 0, 0
    for lo, hi in live:  # the union of the live byte ranges
      covered += max(0, hi - max(lo, end))
      end = max(end, hi)
    peak = max(peak, covered)
  return peak


def temp_spans(buffer_assignment: str, live_range: str) -> tuple[int, list[tuple[int, int, int, int]]]:
  """``(temp allocation bytes, its values)`` from one step's two dumps, each value as
  ``(first, last, lo, hi)``: its live range in XLA's schedule (both ends included) and
  the byte range XLA gave it in the allocation."""
  values, temp = [], None
  inside = False
  with open(buffer_assignment) as f:
    for line in f:
      allocation = _ALLOCATION.match(line)
      if allocation:
        inside = "preallocated-temp" in line
        if inside:
          temp = int(allocation.group(1))
      elif inside:
        value = _VALUE.match(line)
        if value:
          name = value.group(1)  # "add.3" or "add.3{}", or "reduce-window{1}" in a tuple
          name += "" if name.endswith("}") else "{}"
          values.append((name, int(value.group(3)), int(value.group(2))))
  if temp is None:
    return 0, []
  ranges = {}
  with open(live_range) as f:
    for line in f:
      match = _RANGE.match(line)
      if match:
        ranges[match.group(1)] = (int(match.group(2)), int(match.group(3)))
  return temp, [(*ranges[name], offset, offset + size) for name, offset, size in values]


def measure_with_live_temp(fn, kwargs, params, x) -> tuple[jaxremat.Footprint, int]:
  """``jaxremat.measure`` of ``fn``'s gradient step, and its temp allocation's peak live
  bytes (read off an XLA dump)."""
  return measure_with_dump(fn, kwargs, params, x, temp_live_bytes)


def measure_with_dump(fn, kwargs, params, x, read):
  """``jaxremat.measure`` of ``fn``'s gradient step, and ``read(buffer_assignment,
  live_range)`` of its XLA dump, whose first item must be the step's temp bytes."""
  with tempfile.TemporaryDirectory() as out:
    footprint = jaxremat.measure(loss_of(fn, kwargs), params, x,
                                 compiler_options={"xla_dump_to": out})
    found = {kind: glob.glob(os.path.join(out, f"*jit_loss*after_optimizations-{kind}.txt"))
             for kind in ("buffer-assignment", "live-range")}
    if any(len(paths) != 1 for paths in found.values()):
      raise RuntimeError(f"expected one dump of each kind for the step, found {found}")
    temp, rest = read(found["buffer-assignment"][0], found["live-range"][0])
    if temp != footprint.temp_bytes:
      raise RuntimeError(f"the dump's temp allocation ({temp} B) is not the step's "
                         f"({footprint.temp_bytes} B)")
    return footprint, rest


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
  specs = {m.name: m for m in memory.MODELS}
  rows = []
  for name in dict.fromkeys(r["model"] for r in recorded):
    if wanted is not None and name not in wanted:
      continue
    spec = specs[name]
    model, x = spec.build(), spec.batch()
    params = jax.jit(model.init)(jax.random.key(0), x)
    base = jaxremat.apply(model.apply, params, x, **spec.kwargs)
    for r in (r for r in recorded if r["model"] == name):
      plan = jaxremat.Plan(tuple(r["checkpoints"]))
      fn = jaxremat.apply(model.apply, params, x, plan=plan, **spec.kwargs).fn
      footprint, live = measure_with_live_temp(fn, spec.kwargs, params, x)
      rows.append({"model": name, "strategy": r["strategy"], "checkpoints": r["checkpoints"],
                   "predicted_bytes": base.predict_total_bytes(plan),
                   "measured_bytes": footprint.total_bytes,
                   "live_bytes": footprint.total_bytes - footprint.temp_bytes + live})
      print(_line(rows[-1]), file=sys.stderr, flush=True)
  meta = {"date": datetime.date.today().isoformat(), "command": " ".join(["python", *sys.argv]),
          "source": args.rows,
          "versions": {"jax": jax.__version__, "jaxlib": jax.lib.__version__}}
  with open(args.out, "w") as f:
    json.dump({"meta": meta, "rows": rows}, f, indent=1)
  table = to_markdown(rows)
  with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
    f.write(f"Command: `{meta['command']}` ({meta['date']}, jax {jax.__version__})\n\n{table}\n")
  print(table)
  return 0


def _line(r: dict) -> str:
  return (f"{r['model']:<24} {r['strategy']:<14} pred {r['predicted_bytes'] / 2**20:7.2f} "
          f"live {r['live_bytes'] / 2**20:7.2f} XLA {r['measured_bytes'] / 2**20:7.2f} MiB")


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
