"""fit's time model against step times measured on a GPU (issue 24).

    PYTHONPATH=. python bench/time_model.py MEASURED.json PREDICTED.json [--out F.md]

MEASURED: a ``bench/policies.py`` run on the GPU (its step times; its predictions use
the roofline measured there, ``roofline.local_roofline``). PREDICTED: the same models
run deviceless for that GPU (``--target h200``: the data sheet's roofline over the cost
analysis of a CPU compile). Per strategy whose program both runs compiled alike (the
per-layer policies; ``fit`` and ``layer budget`` where both chose the same plan): the
measured step's time over the no-remat step, against the predicted recompute and offload
time. Summary: the error of ``no-remat step + predicted`` against the measured step, and
whether the prediction orders the strategies as the measured steps do (pairs whose
measured times differ by more than the timing's noise).
"""

from __future__ import annotations

import argparse
import json
import sys


def _program(key: str, s: dict) -> object:
  """What makes two runs' strategies the same program: its name, and its plan."""
  return (key, s.get("plan"), tuple(s.get("checkpoints") or ()))


def points(measured: dict, predicted: dict) -> list[tuple[str, str, float, float, float, float]]:
  """``(model, strategy, no-remat s, measured step s, GPU-roofline s, data-sheet s)``,
  each program once."""
  other = {(r["model"], r["share"]): r for r in predicted["rows"]}
  found = {}
  for row in measured["rows"]:
    twin = other.get((row["model"], row["share"]))
    if twin is None or not row.get("no_remat_step_s"):
      continue
    for key, s in row["strategies"].items():
      t = twin["strategies"].get(key, {})
      if not s.get("step_s") or "predicted_s" not in t or _program(key, s) != _program(key, t):
        continue
      found[(row["model"], _program(key, s))] = (
          row["model"], key, row["no_remat_step_s"], s["step_s"], s["predicted_s"],
          t["predicted_s"])
  return list(found.values())


def report(data: list[tuple[str, str, float, float, float, float]], noise: float) -> str:
  if not data:
    return "No program was timed in the first run and predicted alike in the second."
  lines = ["| model | strategy | step ms | over no-remat ms | predicted, GPU-measured roofline ms "
           "| predicted, data sheet (deviceless) ms |", "|---|---|---|---|---|---|"]
  for model, key, base, step, local, sheet in data:
    lines.append(f"| {model} | {key} | {step * 1e3:.2f} | {(step - base) * 1e3:.2f} | "
                 f"{local * 1e3:.2f} | {sheet * 1e3:.2f} |")

  def error(column: int | None) -> str:  # None: the no-remat step alone
    errors = sorted(abs((p[2] + (p[column] if column else 0)) / p[3] - 1) for p in data)
    return f"mean |error| {sum(errors) / len(errors):.1%}, worst {errors[-1]:.1%}"

  def ordered(column: int) -> str:
    pairs = [(p, q) for i, p in enumerate(data) for q in data[i + 1:]
             if p[0] == q[0] and abs(p[3] - q[3]) > noise * max(p[3], q[3])]
    right = sum((p[3] - q[3]) * (p[column] - q[column]) > 0 for p, q in pairs)
    return f"{right} of {len(pairs)}"

  lines += ["", f"- {len(data)} programs; the step as no-remat + predicted: GPU-measured "
            f"roofline {error(4)}; data sheet {error(5)}; the no-remat step alone "
            f"{error(None)}",
            f"- pairs of strategies ordered as measured (measured apart by more than "
            f"{noise:.1%}): GPU-measured roofline {ordered(4)}; data sheet {ordered(5)}"]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("measured")
  parser.add_argument("predicted")
  parser.add_argument("--noise", type=float, default=0.02,
                      help="pairs measured closer than this share are not counted")
  parser.add_argument("--out")
  args = parser.parse_args(argv)
  with open(args.measured) as f:
    measured = json.load(f)
  with open(args.predicted) as f:
    predicted = json.load(f)
  text = (f"Command: `python {' '.join(sys.argv)}`\n\nMeasured: {measured['meta']['device']}, "
          f"{measured['meta']['date']}; predicted: {predicted['meta']['device']}, target "
          f"{predicted['meta'].get('target')}, {predicted['meta']['date']}\n\n"
          + report(points(measured, predicted), args.noise) + "\n")
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)


if __name__ == "__main__":
  main()
