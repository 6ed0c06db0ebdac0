"""Planning time: how long ``jaxremat.apply`` takes on large models, stage by stage.

    PYTHONPATH=. python bench/planning_time.py [--out bench/results/planning-time/planning-time.json]
        [--only gpt-96,resnet152-224,chain-1000,chain-10000] [--confirm]

Every model is planned from abstract inputs (``jax.eval_shape`` of its init: nothing is
allocated). For each it records ``Remat.stage_seconds`` (trace, profile, solve, emit and,
with ``--confirm``, apply's default compile of the chosen plan), the wall time of the whole call, the layer count and
the slowest stage. Writes JSON and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jaxremat  # noqa: E402
from jaxremat import zoo  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: its record module
from record import run_meta, write_result  # noqa: E402


def _tokens(batch: int, seq: int) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct((batch, seq), jnp.int32)


def _images(batch: int, size: int) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct((batch, size, size, 3), jnp.float32)


def _chain(n: int) -> nn.Sequential:
  """``n`` Dense layers of width 32 with tanh between them: ``2n - 1`` layers."""
  layers: list = []
  for k in range(n):
    layers.append(nn.Dense(32))
    if k < n - 1:
      layers.append(nn.tanh)
  return nn.Sequential(layers)


#: name -> (model, abstract batch, apply kwargs)
MODELS = {
    "gpt-96": lambda: (zoo.gpt(vocab_size=50257, max_len=1024, dim=768, depth=96, num_heads=12),
                       _tokens(8, 1024), {}),
    "resnet152-224": lambda: (zoo.resnet_by_name("resnet152", num_classes=1000, stem="imagenet"),
                              _images(32, 224), {"mutable": ["batch_stats"]}),
    "chain-1000": lambda: (_chain(500), jax.ShapeDtypeStruct((64, 32), jnp.float32), {}),
    "chain-10000": lambda: (_chain(5000), jax.ShapeDtypeStruct((64, 32), jnp.float32), {}),
}


def run(name: str, confirm: bool) -> dict:
  model, x, kwargs = MODELS[name]()
  params = jax.eval_shape(model.init, jax.random.key(0), x)
  start = time.perf_counter()
  r = jaxremat.apply(model.apply, params, x, verify=None if confirm else False, **kwargs)
  total = time.perf_counter() - start
  stages = {k: round(v, 3) for k, v in r.stage_seconds.items()}
  planning = {k: v for k, v in stages.items() if k != "compile"}
  return {"model": name, "layers": r.chain.n, "seconds": round(total, 3), "stages": stages,
          "seconds_without_compiles": round(sum(planning.values()), 3),
          "slowest_stage": max(planning, key=planning.get), "checkpoints": len(r.plan.checkpoints),
          "predicted_total_bytes": r.predicted_total_bytes}


def markdown(rows: list[dict]) -> str:
  lines = ["| model | layers | apply s | without compiles s | trace | profile | solve | emit | "
           "compile | slowest |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    s = r["stages"]
    lines.append(f"| {r['model']} | {r['layers']} | {r['seconds']:.2f} | "
                 f"{r['seconds_without_compiles']:.2f} | {s.get('trace', 0):.2f} | "
                 f"{s.get('profile', 0):.2f} | {s.get('solve', 0):.2f} | {s.get('emit', 0):.2f} | "
                 f"{s.get('compile', 0):.2f} | {r['slowest_stage']} |")
  return "\n".join(lines) + "\n"


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="bench/results/planning-time/planning-time.json")
  parser.add_argument("--only", help="comma-separated subset of: " + ", ".join(MODELS))
  parser.add_argument("--confirm", action="store_true",
                      help="apply's default: compile the chosen plan (else verify=False)")
  args = parser.parse_args()
  names = args.only.split(",") if args.only else list(MODELS)
  start = time.perf_counter()
  rows = []
  for name in names:
    rows.append(run(name, args.confirm))
    print(json.dumps(rows[-1]), flush=True)
  write_result(args.out, run_meta(time.perf_counter() - start), rows, markdown(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
