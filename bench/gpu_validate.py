"""GPU validation: predicted vs XLA-compiled vs allocator-peak memory, per strategy.

Runs from the source tree with no installs (jax with CUDA, flax, optax and chex must be
present; no network needed):

    PYTHONPATH=. python bench/gpu_validate.py OUTDIR [--quick] [--budget-seconds 540]
    PYTHONPATH=. python bench/gpu_validate.py OUTDIR --compile-only [--dump DUMPS]

Every (model, strategy) runs in a fresh process with XLA_PYTHON_CLIENT_PREALLOCATE=false,
so ``peak_bytes_in_use`` is that configuration's alone. jaxremat's plans are compiled
with XLA's own rematerialisation disabled; XLA's auto-remat is run on the plain model
with its memory limit set to jaxremat's optimal footprint (and around it).
Writes OUTDIR/gpu_validation.json and OUTDIR/gpu_validation.md. ``--compile-only`` only
compiles each plan (and XLA's auto-remat at several slop factors); ``--dump DUMPS`` then
keeps XLA's buffer assignments and live ranges per model and plan under DUMPS, for
``bench/dump_packing.py``. Dumps are not kept in git; the latest H100 results are in
bench/results/gpu-h100/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATEGIES = ("none", "every-layer", "sqrt", "best-uniform", "optimal", "refined")
XLA_REMAT_FRACTIONS = (1.0,)  # XLA limit as a multiple of jaxremat's optimal footprint
RUN_STRATEGIES = (*STRATEGIES, *(f"xla-remat-{f}" for f in XLA_REMAT_FRACTIONS))


def models(quick: bool) -> dict:
  """name -> model of jaxremat/zoo_registry.py: its "gpu" models (``quick``: "gpu-quick")."""
  from jaxremat import zoo_registry
  return {m.name: m for m in zoo_registry.tagged("gpu-quick" if quick else "gpu")}


def worker(spec: dict) -> dict:
  """One configuration in this process: compile, run, read the allocator's peak."""
  sys.path.insert(0, ROOT)
  import jax
  import numpy as np

  import jaxremat
  from jaxremat import zoo_registry
  from jaxremat._api.loss import training_loss
  from jaxremat._backends.measure import default_compiler_options

  entry = zoo_registry.get(spec["model"])
  model, x, kwargs = entry.build(), entry.example(), entry.apply_kwargs()
  params = model.init(jax.random.key(0), x)
  if "batch_stats" in params and "mutable" not in kwargs:
    kwargs = {"mutable": ["batch_stats"]}

  def loss_of(fn):
    return training_loss(fn, kwargs)

  out: dict = {"device": str(jax.devices()[0].device_kind), "backend": jax.default_backend()}
  r = jaxremat.apply(model.apply, params, x, **kwargs)
  out["layers"] = r.chain.n
  kind = spec["strategy"]
  options: dict = {}
  if kind.startswith("xla-remat"):
    fn = model.apply
    plan_bytes = spec["target_bytes"]
    mem = (jax.devices()[0].memory_stats() or {}).get("bytes_limit", 0) or 80 * 2**30
    io_bytes = sum(int(np.size(a)) * a.dtype.itemsize for a in jax.tree_util.tree_leaves((params, x)))
    io_bytes *= 2  # arguments and gradient outputs
    slop = int(max(1, min(100, round(100 * plan_bytes / (0.8 * mem - io_bytes)))))
    options = {"xla_gpu_memory_limit_slop_factor": str(slop)}
    out["slop_factor"] = slop
    out["target_bytes"] = plan_bytes
    predicted = None
  else:
    plan = r.plan if kind == "refined" else jaxremat.solve(r.chain, kind)
    fn = jaxremat.apply(model.apply, params, x, plan=plan, **kwargs).fn
    predicted = r.predict_total_bytes(plan)
    out["checkpoints"] = list(plan.checkpoints)
    out["model_r_total_bytes"] = r.fixed_bytes + jaxremat.peak_bytes(r.chain, plan) - r.chain.act_bytes[0]
    if jax.default_backend() == "gpu":
      options = {"xla_disable_hlo_passes": "rematerialization"}
    if kind == "none":  # calibrated predictions of every strategy, for offline comparison
      rc = jaxremat.apply(model.apply, params, x, calibrate=True, **kwargs)
      out["calibrated_predictions"] = {
          k: rc.predict_total_bytes(rc.plan if k == "refined" else jaxremat.solve(rc.chain, k))
          for k in STRATEGIES}
  if jax.default_backend() == "cpu":
    options.update(default_compiler_options("cpu"))  # keep remat real on CPU
  grad = jax.grad(loss_of(fn))
  compiled = jax.jit(grad).lower(params, x).compile(compiler_options=options or None)
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = (cost[0] if cost else {}) if isinstance(cost, (list, tuple)) else (cost or {})
  jax.block_until_ready(compiled(params, x))
  times = []
  for _ in range(5):
    start = time.perf_counter()
    g = jax.block_until_ready(compiled(params, x))
    times.append(time.perf_counter() - start)
  stats = jax.devices()[0].memory_stats() or {}
  out.update({
      "predicted_bytes": predicted,
      "compiled_bytes": mem.argument_size_in_bytes + mem.output_size_in_bytes
                        + mem.temp_size_in_bytes - mem.alias_size_in_bytes,
      "compiled_parts": [mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.temp_size_in_bytes,
                         mem.alias_size_in_bytes],
      "xla_flops": float(cost.get("flops", 0.0)),
      "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
      "step_seconds_median": float(np.median(times)),
      "compiler_options": options,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
  })
  # Only after the peak is read: the plain gradients, for the equality check.
  want = jax.jit(jax.grad(loss_of(model.apply)))(params, x)
  # Relative to the largest gradient entry of the whole tree: a leaf whose exact gradient
  # is zero (an attention key bias) holds only rounding noise, so a per-leaf ratio is
  # meaningless there (it read 0.39 on the ViT's every-layer plan, all of it noise).
  pairs = [(np.asarray(a, np.float64), np.asarray(b, np.float64))
           for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(g))]
  scale = max(float(np.max(np.abs(a))) for a, _ in pairs) or 1.0
  out["grad_max_rel_error"] = max(float(np.max(np.abs(a - b))) for a, b in pairs) / scale
  return out


def compile_only(spec: dict) -> list:
  """Every strategy of one model in this process: XLA's compiled footprint only, no run."""
  sys.path.insert(0, ROOT)
  import jax

  import jaxremat
  from jaxremat import zoo_registry
  from jaxremat._api.loss import training_loss

  entry = zoo_registry.get(spec["model"])
  model, x = entry.build(), entry.example()
  params = model.init(jax.random.key(0), x)
  kwargs = {"mutable": ["batch_stats"]} if "batch_stats" in params else {}

  def loss_of(fn):
    return training_loss(fn, kwargs)

  def compiled_bytes(fn, options, name=None):
    if spec.get("dump") and name:  # XLA's buffer assignment of this step, for offline reading
      options = {**options, "xla_dump_to": os.path.join(spec["dump"], name)}
    mem = jax.jit(jax.grad(loss_of(fn))).lower(params, x).compile(compiler_options=options).memory_analysis()
    if "xla_dump_to" in options:  # keep the optimised HLO, buffer assignment and usage report,
      for f in os.listdir(options["xla_dump_to"]):  # and the device's own target config
        if not ("after_optimizations" in f and f.endswith(".txt")
                or f.endswith("gpu_target_config.pbtxt")):
          os.remove(os.path.join(options["xla_dump_to"], f))
    return mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes - mem.alias_size_in_bytes

  r = jaxremat.apply(model.apply, params, x, **kwargs)
  rc = jaxremat.apply(model.apply, params, x, calibrate=True, **kwargs) if spec.get("calibrate") else None
  no_xla_remat = {"xla_disable_hlo_passes": "rematerialization"} if jax.default_backend() == "gpu" else {"xla_disable_hlo_passes": "cse_barrier_expander"}
  rows = []
  for kind in STRATEGIES:
    plan = r.plan if kind == "refined" else jaxremat.solve(r.chain, kind)
    fn = jaxremat.apply(model.apply, params, x, plan=plan, **kwargs).fn
    rows.append({"strategy": kind, "checkpoints": list(plan.checkpoints), "layers": r.chain.n,
                 "predicted_bytes": r.predict_total_bytes(plan),
                 "model_r_total_bytes": r.fixed_bytes + jaxremat.peak_bytes(r.chain, plan) - r.chain.act_bytes[0],
                 "compiled_bytes": compiled_bytes(fn, no_xla_remat, kind), "device": str(jax.devices()[0].device_kind)})
    if rc is not None:
      rows[-1]["calibrated_predicted_bytes"] = rc.predict_total_bytes(plan)
  best = min(row["compiled_bytes"] for row in rows if row["strategy"] in ("optimal", "refined"))
  if jax.default_backend() == "gpu":
    mem = (jax.devices()[0].memory_stats() or {}).get("bytes_limit", 0) or 80 * 2**30
    for slop in (1, 2, 3, 5, 8) if not spec.get("calibrate") else ():
      rows.append({"strategy": f"xla-remat-slop{slop}", "slop_factor": slop,
                   "xla_limit_bytes_approx": int(0.8 * mem * slop / 100), "jaxremat_best_bytes": best,
                   "compiled_bytes": compiled_bytes(model.apply, {"xla_gpu_memory_limit_slop_factor": str(slop)},
                                                    f"xla-remat-slop{slop}")})
  return rows


def safe_name(model: str) -> str:
  """A model's name as a file name (letters, digits, '.', '_' and '-')."""
  return "".join(c if c.isalnum() or c in "._-" else "_" for c in model)


def run_one(spec: dict, timeout: float, autotune_cache: str | None = None,
            autotune_dump: str | None = None) -> dict:
  # Autotuning allocates scratch memory while compiling, which would set the allocator's
  # peak for every strategy alike. A warm-up process per model fills an on-disk autotune
  # cache; the measured processes read it, so their peak_bytes_in_use is the step's.
  # (Turning autotuning off instead made a ResNet-18 step take 18 s.)
  flags = os.environ.get("XLA_FLAGS", "")
  if autotune_cache:
    flags += f" --xla_gpu_per_fusion_autotune_cache_dir={autotune_cache}"
  if autotune_dump:  # every autotune result of this process, for deviceless compiles to load
    flags += f" --xla_gpu_dump_autotune_results_to={autotune_dump}"
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONPATH=ROOT, XLA_FLAGS=flags.strip())
  try:
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout, env=env)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout:.0f} s"}
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
  if proc.returncode != 0 or not lines:
    return {"error": (proc.stderr or proc.stdout)[-2000:]}
  return json.loads(lines[-1][len("RESULT "):])


def versions() -> dict:
  import flax
  import jax
  import jaxlib
  return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
          "python": platform.python_version()}


def to_markdown(results: list) -> str:
  lines = ["| model | strategy | predicted MiB | XLA compiled MiB | allocator peak MiB | pred. err vs compiled | step ms | grad rel err |",
           "|---|---|---|---|---|---|---|---|"]
  mib = lambda v: f"{v / 2**20:.1f}" if isinstance(v, (int, float)) else "-"
  for row in results:
    if "step_seconds_median" not in row and "error" not in row:
      pred, comp = row.get("predicted_bytes"), row.get("compiled_bytes")
      err = f"{100 * (pred - comp) / comp:+.1f}%" if pred else "-"
      lines.append(f"| {row['model']} | {row['strategy']} | {mib(pred)} | {mib(comp)} | - | {err} | - | - |")
      continue
    if "error" in row:
      lines.append(f"| {row['model']} | {row.get('strategy', 'all')} | error: {row['error'].splitlines()[-1][:80] if row['error'] else ''} |||||| ")
      continue
    pred, comp = row.get("predicted_bytes"), row.get("compiled_bytes")
    err = f"{100 * (pred - comp) / comp:+.1f}%" if pred else "-"
    lines.append(f"| {row['model']} | {row['strategy']} | {mib(pred)} | {mib(comp)} | {mib(row.get('peak_bytes_in_use'))} | {err} | {1e3 * row['step_seconds_median']:.2f} | {row['grad_max_rel_error']:.1e} |")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("outdir", nargs="?")
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--budget-seconds", type=float, default=540.0)
  parser.add_argument("--worker")
  parser.add_argument("--only", help="run just these models (comma-separated names from models())")
  parser.add_argument("--strategies", help="run just these strategies (comma-separated, of "
                      f"{', '.join(RUN_STRATEGIES)}; xla-remat needs optimal or refined too)")
  parser.add_argument("--calibrate", action="store_true", help="also record calibrated predictions")
  parser.add_argument("--compile-only", action="store_true",
                      help="XLA compiled footprints only: one process per model, nothing run")
  parser.add_argument("--dump", help="with --compile-only: write XLA's dumps under this directory")
  parser.add_argument("--autotune-dump", help="with --compile-only: write XLA's autotune results "
                      "of each model to DIR/<model>.textproto (bench/gpu_aot.py --autotune DIR)")
  args = parser.parse_args()
  if args.worker:
    spec = json.loads(args.worker)
    result = compile_only(spec) if spec.get("compile_only") else worker(spec)
    print("RESULT " + json.dumps(result), flush=True)
    return 0
  if not args.outdir:
    parser.error("OUTDIR is required")
  chosen = args.strategies.split(",") if args.strategies else RUN_STRATEGIES
  if args.strategies and args.compile_only:
    parser.error("--strategies selects the processes of a run; --compile-only compiles every strategy")
  if unknown := [c for c in chosen if c not in RUN_STRATEGIES]:
    parser.error(f"unknown strategies {unknown}: expected some of {', '.join(RUN_STRATEGIES)}")
  if any(c.startswith("xla-remat") for c in chosen) and not {"optimal", "refined"} & set(chosen):
    parser.error("xla-remat's memory limit is jaxremat's footprint: add optimal or refined to --strategies")
  os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # this process must not hold the GPU
  os.makedirs(args.outdir, exist_ok=True)
  start = time.time()
  results = []
  meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "command": " ".join(sys.argv),
          "versions": versions(), "host": platform.node()}
  import jax
  on_gpu = jax.default_backend() == "gpu"
  for name in models(args.quick):
    if args.only and name not in args.only.split(","):
      continue
    if args.compile_only:
      left = args.budget_seconds - (time.time() - start)
      if left < 20:
        break
      spec = {"model": name, "compile_only": True, "calibrate": args.calibrate}
      if args.dump:
        spec["dump"] = os.path.join(os.path.abspath(args.dump), name)
      dump = None
      if args.autotune_dump:
        os.makedirs(args.autotune_dump, exist_ok=True)
        dump = os.path.join(os.path.abspath(args.autotune_dump), f"{safe_name(name)}.textproto")
      rows = run_one(spec, timeout=min(left, 300), autotune_dump=dump)
      rows = rows if isinstance(rows, list) else [rows]
      results += [{"model": name, **row} for row in rows]
      print(json.dumps(results[-len(rows):])[:3000], flush=True)
      continue
    optimal_bytes = None
    cache = tempfile.mkdtemp(prefix=f"autotune-{name}-") if on_gpu else None
    if cache:  # fill the autotune cache: the plain and the optimal step's kernels
      for strategy in ("none", "optimal"):
        if args.budget_seconds - (time.time() - start) < 60:
          break
        run_one({"model": name, "strategy": strategy}, timeout=120, autotune_cache=cache)
    for strategy in RUN_STRATEGIES:
      if strategy not in chosen:
        continue
      left = args.budget_seconds - (time.time() - start)
      if left < 20:
        results.append({"model": name, "strategy": strategy, "error": "skipped: time budget spent"})
        continue
      if strategy.startswith("xla-remat") and (not optimal_bytes or not on_gpu):
        continue  # XLA's rematerialisation pass exists only on GPU
      spec = {"model": name, "strategy": strategy}
      if strategy.startswith("xla-remat"):
        spec["target_bytes"] = int(optimal_bytes * float(strategy.rsplit("-", 1)[1]))
      row = {"model": name, "strategy": strategy, **run_one(spec, timeout=min(left, 240), autotune_cache=cache)}
      if strategy in ("optimal", "refined") and "compiled_bytes" in row:
        optimal_bytes = min(optimal_bytes or row["compiled_bytes"], row["compiled_bytes"])
      results.append(row)
      print(json.dumps(row)[:400], flush=True)
      with open(os.path.join(args.outdir, "gpu_validation.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
  meta["device"] = next((r.get("device") for r in results if "device" in r), None)
  meta["seconds"] = time.time() - start
  with open(os.path.join(args.outdir, "gpu_validation.json"), "w") as f:
    json.dump({"meta": meta, "results": results}, f, indent=1)
  with open(os.path.join(args.outdir, "gpu_validation.md"), "w") as f:
    f.write(f"# GPU validation\n\n{json.dumps(meta)}\n\n{to_markdown(results)}\n")
  print(to_markdown(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
