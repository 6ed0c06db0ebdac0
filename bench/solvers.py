"""Times ``jaxremat.solve(chain, method)`` on random chains from 10^2 to 10^6 layers.

Usage:
  python bench/solvers.py            # full run, writes bench/results/solvers/solvers.json (+ .md)
  python bench/solvers.py --quick    # small grid, prints the table, writes nothing
  python bench/solvers.py --sizes 10000 100000 1000000 --methods optimal budget stack
  python bench/solvers.py --out f.json --repeat 5

Each (method, n) is timed as the best of ``--repeat`` runs of ``solve`` alone (the chain
is built beforehand). ``stack`` is the bare O(n) stack solve (least peak, no tie-break:
``least_peak_checkpoints``). Exhaustive, quadratic and cubic methods run only up to their
size limits. ``budget`` is given ``--budget-factor`` times the optimal peak. The JSON
records the device, date, versions and command line next to the timings; markdown tables
of times, of each plan's peak and of its recomputed FLOPs relative to ``optimal`` go to
stdout and, beside the JSON, to a .md file. ``dp`` and ``brute-a`` minimise model A, so
their model-R peaks are not optimal.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmark this checkout, not an installed copy

import jaxremat  # noqa: E402
from jaxremat import Chain, recompute_flops  # noqa: E402
from jaxremat import simulate_peak_bytes as peak_bytes  # noqa: E402  (nested plans too)
from jaxremat import Plan  # noqa: E402
from jaxremat.solvers import BUDGET_SOLVERS, SOLVERS, solve  # noqa: E402
from jaxremat.solvers._optimal import least_peak_checkpoints  # noqa: E402

FULL_SIZES = (4, 8, 12, 16, 20, 100, 300, 1000, 3000, 10**4, 3 * 10**4, 10**5, 3 * 10**5, 10**6)
QUICK_SIZES = (4, 8, 12, 100, 1000, 10**4)
# Largest n each method is timed at (None: no limit).
FULL_LIMITS = {"brute": 20, "brute-a": 20, "quadratic": 3000, "best-uniform": 3000,
               "dp": 3 * 10**4, "multilevel": 300}
QUICK_LIMITS = {"brute": 12, "brute-a": 12, "quadratic": 1000, "best-uniform": 1000,
                "dp": 10**4, "multilevel": 100}
METHOD_ORDER = ("optimal", "stack", "quadratic", "brute", "budget", "multilevel", "dp", "brute-a",
                "best-uniform", "chen-greedy", "sqrt", "every-layer", "none")
OUT = ROOT / "bench" / "results" / "solvers" / "solvers.json"
MAX_BYTES = 1 << 24
MAX_FLOPS = 1 << 30


def random_chain(n: int, seed: int) -> Chain:
  """Activation and residual bytes uniform in [1, 2^24), FLOPs in [1, 2^30); g = a."""
  rng = np.random.default_rng(seed)
  act = rng.integers(1, MAX_BYTES, size=n + 1).tolist()
  res = rng.integers(1, MAX_BYTES, size=n).tolist()
  flops = rng.integers(1, MAX_FLOPS, size=n).tolist()  # drawn last: bytes as before
  return Chain(act, res, flops=flops)


def run_method(chain: Chain, method: str, **kwargs) -> Plan:
  """``solve(chain, method)``; ``stack`` is the bare stack solve (checkpoints as a Plan)."""
  if method == "stack":
    return Plan(least_peak_checkpoints(chain), method="stack")
  return solve(chain, method, **kwargs)


def best_time(chain: Chain, method: str, repeat: int, **kwargs):
  """The plan, then the wall and CPU times (seconds) of ``repeat`` runs."""
  wall, cpu = [], []
  plan = None
  for _ in range(repeat):
    start, start_cpu = time.perf_counter(), time.process_time()
    plan = run_method(chain, method, **kwargs)
    wall.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
  return plan, wall, cpu


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def git_revision() -> dict:
  def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout.strip()
  try:
    return {"commit": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
  except (OSError, subprocess.CalledProcessError):
    return {"commit": None, "dirty": None}


def version(dist: str) -> str | None:
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return None


def environment() -> dict:
  return {
      "device": {
          "platform": platform.platform(),
          "machine": platform.machine(),
          "cpu_model": cpu_model(),
          "cpu_count": os.cpu_count(),
          "python": platform.python_version(),
          "python_implementation": platform.python_implementation(),
      },
      "versions": {
          "jaxremat": jaxremat.__version__,
          "numpy": np.__version__,
          "jax": version("jax"),
          "python": sys.version,
          "git": git_revision(),
      },
  }


def fmt_time(seconds: float | None) -> str:
  if seconds is None:
    return "—"
  if seconds < 1e-3:
    return f"{seconds * 1e6:.1f} µs"
  if seconds < 1:
    return f"{seconds * 1e3:.2f} ms"
  return f"{seconds:.2f} s"


def markdown(results: list[dict], sizes, methods) -> str:
  cell = {(r["method"], r["n"]): r for r in results}
  head = "| n | " + " | ".join(methods) + " |"
  rule = "|---:|" + "---:|" * len(methods)
  lines = ["Best-of-runs wall time of `solve(chain, method)` (`stack`: the bare stack solve, "
           "`least_peak_checkpoints`):", "", head, rule]
  for n in sizes:
    row = [fmt_time(cell[(m, n)]["best_s"]) if (m, n) in cell else "—" for m in methods]
    lines.append(f"| {n:,} | " + " | ".join(row) + " |")
  lines += ["", "Best-of-runs CPU time (`time.process_time`; less sensitive to other load on "
            "the machine):", "", head, rule]
  for n in sizes:
    row = [fmt_time(cell[(m, n)]["best_cpu_s"]) if (m, n) in cell else "—" for m in methods]
    lines.append(f"| {n:,} | " + " | ".join(row) + " |")
  lines += ["", "Peak bytes (model R) relative to `optimal`:", "", head, rule]
  for n in sizes:
    row = [f"{cell[(m, n)]['peak_vs_optimal']:.3f}" if (m, n) in cell else "—" for m in methods]
    lines.append(f"| {n:,} | " + " | ".join(row) + " |")
  lines += ["", "Recomputed FLOPs relative to `optimal`:", "", head, rule]
  for n in sizes:
    row = [f"{cell[(m, n)]['recompute_vs_optimal']:.3f}"
           if (m, n) in cell and cell[(m, n)]["recompute_vs_optimal"] is not None else "—"
           for m in methods]
    lines.append(f"| {n:,} | " + " | ".join(row) + " |")
  return "\n".join(lines)


def report(record: dict) -> str:
  """The markdown file written beside the JSON: what ran, where, then the tables."""
  device, git = record["device"], record["versions"]["git"]
  return "\n".join([
      f"# Solver timings, {record['date']}",
      "",
      f"Command: `{shlex.join(record['command'])}`",
      "",
      *([record["note"], ""] if record["note"] else []),
      "Load average (1, 5, 15 min) before and after: "
      + ", ".join(f"{tuple(round(x, 2) for x in record['load_average'][k])}"
                  for k in ("before", "after")) + ".",
      "",
      f"{device['cpu_model']} ({device['cpu_count']} cores), Python {device['python']}, "
      f"numpy {record['versions']['numpy']}, commit {git['commit']}"
      f"{' (dirty)' if git['dirty'] else ''}.",
      "",
      record["table_markdown"],
      "",
  ])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="small grid (n <= 10^4); writes JSON only with --out")
  parser.add_argument("--repeat", type=int, default=3, help="runs per (method, n); best kept")
  parser.add_argument("--seed", type=int, default=0, help="seed of the random chains")
  parser.add_argument("--budget-factor", type=float, default=1.1,
                      help="budget methods get this times the optimal peak (bytes, rounded down)")
  parser.add_argument("--sizes", type=int, nargs="+", default=None,
                      help="chain lengths to time (default: the full or --quick grid)")
  parser.add_argument("--methods", nargs="+", default=None,
                      help="methods to time (default: all, with stack); optimal always runs")
  parser.add_argument("--note", default="", help="a line for the record (e.g. why a reduced grid)")
  parser.add_argument("--out", type=pathlib.Path, default=None,
                      help="JSON path, with a .md beside it (default: " + str(OUT.relative_to(ROOT))
                      + ")")
  args = parser.parse_args(argv)

  sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
  limits = QUICK_LIMITS if args.quick else FULL_LIMITS
  known = {*SOLVERS, *BUDGET_SOLVERS, "stack"}
  unknown = set(args.methods or ()) - known
  if unknown:
    parser.error(f"unknown methods {sorted(unknown)}; expected some of {sorted(known)}")
  wanted = known if args.methods is None else {"optimal", *args.methods}
  methods = [m for m in METHOD_ORDER if m in wanted] + sorted(wanted - set(METHOD_ORDER))
  now = datetime.datetime.now(datetime.timezone.utc)
  load_before = os.getloadavg()

  results = []
  for n in sizes:
    chain = random_chain(n, args.seed + n)
    optimal_peak = optimal_flops = None
    for method in methods:
      limit = limits.get(method)
      if limit is not None and n > limit:
        continue
      kwargs = {}
      if method in BUDGET_SOLVERS:
        optimum = peak_bytes(chain, solve(chain, "optimal"))
        kwargs["budget_bytes"] = int(args.budget_factor * optimum)
      plan, runs, cpu_runs = best_time(chain, method, args.repeat, **kwargs)
      best = min(runs)
      peak = peak_bytes(chain, plan)
      flops = recompute_flops(chain, plan)
      if method == "optimal":
        optimal_peak, optimal_flops = peak, flops
      results.append({
          "method": method, "n": n, "best_s": best, "runs_s": runs,
          "best_cpu_s": min(cpu_runs), "runs_cpu_s": cpu_runs,
          "num_checkpoints": len(plan.checkpoints), "peak_bytes": peak,
          "peak_vs_optimal": peak / optimal_peak if optimal_peak else None,
          "recompute_flops": flops,
          "recompute_vs_optimal": flops / optimal_flops if optimal_flops else None,
          **kwargs,
      })
      print(f"  n={n:>9,} {method:<13} {fmt_time(best):>10}", file=sys.stderr, flush=True)

  table = markdown(results, sizes, methods)
  print(table)
  record = {
      "benchmark": "solvers",
      "date": now.isoformat(timespec="seconds"),
      "command": [sys.executable, *sys.argv] if argv is None else ["bench/solvers.py", *argv],
      "note": args.note,
      "load_average": {"before": load_before, "after": os.getloadavg()},
      **environment(),
      "config": {
          "quick": args.quick, "repeat": args.repeat, "seed": args.seed, "sizes": list(sizes),
          "methods": methods, "limits": limits,
          "timer": "time.perf_counter (wall) and time.process_time (CPU), best of repeat",
          "budget_factor": args.budget_factor,
          "chain": "act_bytes, res_bytes uniform integers in [1, 2^24), flops uniform in "
                   "[1, 2^30), seed = seed + n; cot_bytes = act_bytes, no refinements",
      },
      "results": results,
      "table_markdown": table,
  }
  out = args.out
  if out is None and not args.quick:
    out = OUT
  if out is not None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    out.with_suffix(".md").write_text(report(record))
    print(f"\nwrote {out} and {out.with_suffix('.md').name}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
