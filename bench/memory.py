"""Memory benchmark: predicted vs XLA-compiled footprint of the gradient step, per strategy.

    python bench/memory.py [--out bench/results/memory-cpu-DATE.json]

For each zoo model (CPU-sized) and strategy it records jaxremat's prediction
(``predicted_total_bytes``), model R alone, and XLA's compiled footprint (argument +
output + temp - alias; barriers kept on CPU). ``best-uniform-xla`` is the best
checkpoint-every-k plan by XLA's own measurement (every k compiled), the strongest
single-level baseline a user could find by trial and error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys

import flax
import jax
import jax.numpy as jnp

import jaxremat
from jaxremat import zoo
from jaxremat.solvers import uniform_plan

STRATEGIES = ("none", "every-layer", "sqrt", "best-uniform", "optimal", "apply-default")


def models() -> dict:
  """name -> (model, input, apply kwargs): sizes that compile in seconds on 2 CPU cores."""
  key = jax.random.key(1)
  img = jax.random.normal(key, (16, 32, 32, 3))
  return {
      "vgg11-w0.25": (zoo.vgg("vgg11", width=0.25), img, {}),
      "all-conv": (zoo.all_conv(), img, {}),
      "resnet-3stage-w16": (zoo.resnet((1, 1, 1), width=16), img, {"mutable": ["batch_stats"]}),
      "mlp-uneven": (zoo.mlp([512, 1024, 256, 2048, 128, 512, 10]), jax.random.normal(key, (256, 300)), {}),
      "mlp-uneven-bf16": (zoo.mlp([512, 1024, 256, 2048, 128, 512, 10], dtype=jnp.bfloat16),
                          jax.random.normal(key, (256, 300)).astype(jnp.bfloat16), {}),
      "dropout-mlp": (zoo.DropoutMLP((512, 1024, 256, 1024, 10)), jax.random.normal(key, (256, 300)),
                      {"rngs": {"dropout": jax.random.key(3)}}),
  }


def loss_of(fn, kwargs):
  def loss(params, x):
    out = fn(params, x, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    return jnp.mean(jnp.square(out.astype(jnp.float32)))
  return loss


def bench_model(name, model, x, kwargs) -> list[dict]:
  params = model.init({"params": jax.random.key(0), **kwargs.get("rngs", {})}, x)
  base = jaxremat.apply(model.apply, params, x, **kwargs)
  rows = []

  def record(strategy, plan):
    r = jaxremat.apply(model.apply, params, x, plan=plan, **kwargs)
    measured = jaxremat.measure(loss_of(r.fn, kwargs), params, x)
    rows.append({
        "model": name, "strategy": strategy, "layers": base.chain.n,
        "checkpoints": list(plan.checkpoints),
        "predicted_bytes": r.predicted_total_bytes,
        "model_r_bytes": r.fixed_bytes + jaxremat.peak_bytes(r.chain, plan) - r.chain.act_bytes[0],
        "measured_bytes": measured.total_bytes,
        "measured_parts": [measured.argument_bytes, measured.output_bytes, measured.temp_bytes,
                           measured.alias_bytes],
        "xla_flops": measured.flops,
    })
    return measured.total_bytes

  for strategy in STRATEGIES:
    plan = base.plan if strategy == "apply-default" else jaxremat.solve(base.chain, strategy)
    record(strategy, plan)
  best = None
  for k in range(1, base.chain.n):
    r = jaxremat.apply(model.apply, params, x, plan=uniform_plan(base.chain.n, k), **kwargs)
    total = jaxremat.measure(loss_of(r.fn, kwargs), params, x).total_bytes
    if best is None or total < best[0]:
      best = (total, k)
  record("best-uniform-xla", uniform_plan(base.chain.n, best[1]))
  return rows


def to_markdown(rows: list[dict]) -> str:
  lines = ["| model | strategy | checkpoints | predicted MiB | model R MiB | XLA MiB | error | vs none |",
           "|---|---|---|---|---|---|---|---|"]
  none = {r["model"]: r["measured_bytes"] for r in rows if r["strategy"] == "none"}
  for r in rows:
    err = 100 * (r["predicted_bytes"] - r["measured_bytes"]) / r["measured_bytes"]
    lines.append(
        f"| {r['model']} | {r['strategy']} | {len(r['checkpoints'])} | {r['predicted_bytes'] / 2**20:.2f} "
        f"| {r['model_r_bytes'] / 2**20:.2f} | {r['measured_bytes'] / 2**20:.2f} | {err:+.1f}% "
        f"| {100 * r['measured_bytes'] / none[r['model']]:.0f}% |")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", help="JSON path (default: print only)")
  parser.add_argument("--only", help="one model name")
  args = parser.parse_args()
  rows = []
  for name, (model, x, kwargs) in models().items():
    if args.only and name != args.only:
      continue
    rows += bench_model(name, model, x, kwargs)
    print(f"done {name}", file=sys.stderr, flush=True)
  table = to_markdown(rows)
  print(table)
  if args.out:
    meta = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
            "device": f"{jax.default_backend()} ({platform.processor() or platform.machine()})",
            "versions": {"jax": jax.__version__, "flax": flax.__version__, "python": platform.python_version()}}
    with open(args.out, "w") as f:
      json.dump({"meta": meta, "rows": rows, "table": table}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
