"""Re-compile the recorded H100 plans deviceless, and compare with the recorded footprints.

For each jaxremat row of a recorded ``gpu_validate.py --compile-only`` run (model, batch,
strategy and the plan's checkpoints are in its JSON), rebuilds the model and the plan's
drop-in as ``gpu_validate.py`` did, compiles its gradient step for the ``h100`` target
(``jaxremat._backends.targets``; XLA's own remat off, as recorded) on this machine without a
GPU, and writes the recorded and deviceless footprints side by side. Needs JAX's CUDA plugin
(``pip install "jaxremat[cuda12-aot]"``); each model runs in a fresh process with
``JAX_PLATFORMS=cpu``:

    PYTHONPATH=. python bench/gpu_aot.py OUTDIR [--recorded JSON] [--dumps DIR]
        [--only MODELS] [--budget-seconds 1500]

Writes OUTDIR/gpu-aot.json and OUTDIR/gpu-aot.md. Where a row differs by 1 MiB or more,
its reason compares the library calls (cuDNN convolutions, cuBLAS and Triton GEMMs, and
their largest workspace) of the deviceless step with those of the recorded one, read from
the recorded run's XLA dumps (``--dumps DIR``: DIR/<model>/<strategy>/*after_optimizations.txt,
e.g. the archives of commit 929b4fa unpacked). Models that the time budget leaves out
are listed as not run. The ``xla-remat-slopN`` rows (XLA's auto-remat under a memory
limit the runtime reports) are not re-compiled.

With ``--autotune DIR`` (a GPU run's ``gpu_validate.py --autotune-dump``), each compile loads
the device's own autotune choices and makes the same library and Triton choices; this needs
the compiler of jax 0.11 (``pip install --no-deps "jax-cuda12-pjrt>=0.11"``), which reads
that format.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX starts: the CUDA plugin needs it
from bench.gpu_validate import STRATEGIES, models, safe_name
from jaxremat._backends.autotune import autotuned_target
from jaxremat._backends.targets import GPU_AOT_OPTIONS

RECORDED = os.path.join(ROOT, "bench", "results", "gpu-h100", "compile-only.json")
MIB = 2**20
#: XLA's own rematerialisation off, as in the recorded runs of jaxremat's plans.
NO_XLA_REMAT = {"xla_disable_hlo_passes": "rematerialization"}
#: A cuDNN or cuBLAS call in optimised HLO: its output tuple ends with its workspace (u8).
LIBRARY_CALL = re.compile(r'= \((?P<shapes>[^)]*)\) custom-call\(.*?custom_call_target="__cu'
                          r'(?P<library>dnn|blas)')
TRITON_GEMM = re.compile(r'"kind":"__triton(?:_nested)?_gemm(?:_fusion)?"')


def library_calls(hlo: str) -> dict:
  """XLA's library calls in an optimised HLO module: name -> [count, largest workspace bytes]."""
  calls = {"cuDNN conv": [0, 0], "cuBLAS GEMM": [0, 0],
           "Triton GEMM": [len(TRITON_GEMM.findall(hlo)), 0]}
  for m in LIBRARY_CALL.finditer(hlo):
    workspace = re.search(r"[us]8\[(\d+)\]\{0\}\s*$", m.group("shapes"))
    entry = calls["cuDNN conv" if m.group("library") == "dnn" else "cuBLAS GEMM"]
    entry[0] += 1
    entry[1] = max(entry[1], int(workspace.group(1)) if workspace else 0)
  return calls


def worker(spec: dict) -> list:
  """Every distinct plan of one model, compiled for the H100 target in this process."""
  import jax
  import jax.numpy as jnp

  import jaxremat
  from jaxremat import zoo_registry
  from jaxremat._api.loss import training_loss
  from jaxremat._backends import targets

  entry = zoo_registry.get(spec["model"])
  model, x = entry.build(), entry.example()
  shapes = jax.eval_shape(model.init, jax.random.key(0), x)
  params = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  kwargs = {"mutable": ["batch_stats"]} if "batch_stats" in params else {}
  seen: dict[tuple, dict] = {}
  rows = []
  for strategy, checkpoints in spec["plans"]:
    key = tuple(checkpoints)
    if key not in seen:  # strategies that chose the same plan compile once
      start = time.perf_counter()
      fn = jaxremat.apply(model.apply, params, x, plan=jaxremat.Plan(checkpoints=key),
                          **kwargs).fn
      compiled = targets.compile_on_target(jax.grad(training_loss(fn, kwargs)), (params, x), "h100",
                                           spec["options"])
      mem = compiled.memory_analysis()
      parts = [mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.temp_size_in_bytes,
               mem.alias_size_in_bytes]
      seen[key] = {"deviceless_bytes": parts[0] + parts[1] + parts[2] - parts[3],
                   "deviceless_parts": parts, "deviceless_calls": library_calls(compiled.as_text()),
                   "seconds": round(time.perf_counter() - start, 1)}
    rows.append({"strategy": strategy, "checkpoints": checkpoints, **seen[key]})
  return rows


def options_for(model: str, autotune: str | None) -> dict:
  """XLA options of a model's deviceless compiles: remat off; without autotune results
  for the model, Triton GEMMs off (the target's default); with them, those loaded
  (``jaxremat.autotuned_target``)."""
  path = os.path.join(os.path.abspath(autotune or ""), f"{safe_name(model)}.textproto")
  if not autotune or not os.path.exists(path):
    return {**dict(GPU_AOT_OPTIONS), **NO_XLA_REMAT}
  return {**dict(autotuned_target("h100", path).compiler_options), **NO_XLA_REMAT}


def run_model(spec: dict, timeout: float) -> list | dict:
  path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), ROOT) if p)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path)
  try:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                          check=False, capture_output=True, text=True, timeout=timeout, env=env)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout:.0f} s"}
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
  if proc.returncode != 0 or not lines:
    return {"error": (proc.stderr or proc.stdout)[-1500:]}
  return json.loads(lines[-1][len("RESULT "):])


def reason(diff: int, got: dict, recorded: dict | None) -> str:
  """Why the deviceless footprint differs: the library calls that autotuning chose otherwise."""
  if abs(diff) < MIB:
    return ""
  if recorded is None:
    return "no recorded dump to compare"
  mib = lambda b: f"{b / MIB:.1f} MiB"
  said = [f"{name} {recorded[name][0]} on the H100, {got[name][0]} deviceless"
          + (f" (largest workspace {mib(recorded[name][1])} vs {mib(got[name][1])})"
             if recorded[name][1] != got[name][1] else "")
          for name in got if recorded[name] != got[name]]
  return "; ".join(said) or "same library calls: buffer placement differs"


def recorded_calls(dumps: str | None, model: str, strategy: str) -> dict | None:
  found = glob.glob(os.path.join(dumps or "", model, strategy, "*after_optimizations.txt"))
  if not dumps or not found:
    return None
  with open(found[0]) as f:
    return library_calls(f.read())


def versions() -> dict:
  found = {}
  for name in ("jax", "jaxlib", "flax", "jax-cuda12-plugin", "jax-cuda12-pjrt",
               "jax-cuda13-plugin", "jax-cuda13-pjrt"):
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return {**found, "python": platform.python_version()}


def to_markdown(meta: dict, rows: list, not_run: list) -> str:
  within = sum(abs(r["diff_bytes"]) < MIB for r in rows)
  lines = [
      "# Deviceless H100 compiles vs the recorded H100 run", "",
      f"{json.dumps(meta)}", "",
      (f"{within} of {len(rows)} re-compiled rows within 1 MiB of the recorded H100 "
       f"footprint. Not run: {', '.join(not_run) or 'none'}."), "",
      "| model | strategy | recorded H100 MiB | deviceless MiB | difference MiB | why |",
      "|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(f"| {r['model']} | {r['strategy']} | {r['recorded_bytes'] / MIB:.1f} | "
                 f"{r['deviceless_bytes'] / MIB:.1f} | {r['diff_bytes'] / MIB:+.1f} | "
                 f"{r['reason']} |")
  return "\n".join(lines) + "\n"


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("outdir", nargs="?")
  parser.add_argument("--recorded", default=RECORDED, help="a gpu_validate --compile-only JSON")
  parser.add_argument("--dumps", help="the recorded run's XLA dumps, DIR/<model>/<strategy>/")
  parser.add_argument("--only", help="just these models (comma-separated)")
  parser.add_argument("--budget-seconds", type=float, default=1500.0)
  parser.add_argument("--autotune", help="a directory of XLA autotune results per model "
                      "(<model>.textproto, gpu_validate.py --autotune-dump): each compile loads "
                      "its model's (jaxremat.autotuned_target), and Triton GEMMs are left to them; "
                      "needs jax-cuda12-pjrt 0.11 or later")
  parser.add_argument("--worker")
  args = parser.parse_args()
  if args.worker:
    print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
    return 0
  if not args.outdir:
    parser.error("OUTDIR is required")
  with open(args.recorded) as f:
    recorded = json.load(f)
  start = time.time()
  meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(),
          "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
          "versions": versions(), "host": platform.node(), "machine": platform.machine(),
          "cpus": os.cpu_count(), "target": "h100",
          "compiler_options": {**NO_XLA_REMAT, **({"autotune_results": args.autotune}
                                                  if args.autotune else dict(GPU_AOT_OPTIONS))},
          "recorded": {"file": os.path.relpath(args.recorded, ROOT), "dumps": args.dumps,
                       **{k: recorded["meta"].get(k) for k in ("date", "versions", "device")}}}
  rows, not_run = [], []
  for name in models(quick=False):
    if args.only and name not in args.only.split(","):
      continue
    mine = [r for r in recorded["results"]
            if r["model"] == name and r.get("strategy") in STRATEGIES]
    left = args.budget_seconds - (time.time() - start)
    if not mine or left < 30:
      not_run.append(name if mine else f"{name} (no recorded rows)")
      continue
    spec = {"model": name, "options": options_for(name, args.autotune),
            "plans": [(r["strategy"], r["checkpoints"]) for r in mine]}
    result = run_model(spec, timeout=left)
    if isinstance(result, dict):
      not_run.append(f"{name} ({result['error'].strip().splitlines()[-1][:120]})")
      continue
    for rec, got in zip(mine, result):
      diff = got["deviceless_bytes"] - rec["compiled_bytes"]
      calls = recorded_calls(args.dumps, name, rec["strategy"])
      rows.append({"model": name, **got, "recorded_bytes": rec["compiled_bytes"],
                   "recorded_calls": calls, "diff_bytes": diff,
                   "reason": reason(diff, got["deviceless_calls"], calls)})
    print("\n".join(to_markdown(meta, rows, not_run).splitlines()[-len(result):]), flush=True)
  meta["seconds"] = round(time.time() - start)
  os.makedirs(args.outdir, exist_ok=True)
  with open(os.path.join(args.outdir, "gpu-aot.json"), "w") as f:
    json.dump({"meta": meta, "not_run": not_run, "results": rows}, f, indent=1)
  with open(os.path.join(args.outdir, "gpu-aot.md"), "w") as f:
    f.write(to_markdown(meta, rows, not_run))
  print(to_markdown(meta, rows, not_run))
  return 0


if __name__ == "__main__":
  sys.exit(main())
