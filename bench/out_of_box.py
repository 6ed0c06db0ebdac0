"""Out of the box: default apply on models nested as real code nests them, against the baselines.

    PYTHONPATH=. python bench/out_of_box.py [--size bench] [--models vit,lm1b]
        [--out bench/results/out-of-box-cpu/out-of-box.json]

For each model of tests/realworld_models.py (a ViT whose blocks sit in an ``Encoder``, an
lm1b-like LM whose blocks sit in a ``Decoder`` and read a mask built at the root, a
wmt-like encoder-decoder whose decoder blocks read the encoder's output, a ResNet
in stages, an ``nn.scan`` stack in a child, an nnx MiniGPT in an ``nnx.Sequential`` or an
``nnx.List``): the layers default ``apply`` finds (count and its decomposition sentence),
XLA's footprint of the gradient step under default ``apply``, under ``layer_depth=1``
(the root's children, the previous default), under ``layer_depth="search"`` (and its
wall time), without remat, with every block
rematerialised the framework's way (``nn.remat`` / ``nnx.remat``), and under the best
checkpoint-every-k plan over the layers default ``apply`` chose (every k compiled), and
``apply``'s own wall time. Writes JSON and a markdown table next to it.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
import realworld_models as rm

from jaxremat.solvers import uniform_plan

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: its record module
from record import run_meta, write_result  # noqa: E402

OUT = "bench/results/out-of-box-cpu/out-of-box.json"


def run_model(name: str, size: str) -> dict:
  """Footprints (bytes) and timings of one model; see the module docstring."""
  case = rm.build(name, size)
  model, variables = rm.init(case)
  start = time.perf_counter()
  r = rm.apply(case, model, variables)
  apply_seconds = time.perf_counter() - start
  flat = rm.apply(case, model, variables, layer_depth=1)
  start = time.perf_counter()
  search = rm.apply(case, model, variables, layer_depth="search")
  search_seconds = time.perf_counter() - start
  remat_model, remat_variables = rm.init(case, remat=True)
  n = r.chain.n
  uniform = {k: rm.footprint(case, rm.apply(case, model, variables, plan=uniform_plan(n, k)).fn,
                             model, variables) for k in range(1, n)}
  best_k = min(uniform, key=uniform.get)
  return {
      "model": name, "layers": n, "names": list(r.chain.names),
      "decomposition": r.decomposition, "plan": list(r.plan.checkpoints),
      "apply_seconds": round(apply_seconds, 2),
      "apply_bytes": rm.footprint(case, r.fn, model, variables),
      "predicted_bytes": r.predicted_total_bytes,
      "search_bytes": rm.footprint(case, search.fn, model, variables),
      "search_decomposition": search.decomposition,
      "search_seconds": round(search_seconds, 2),
      "flat_layers": flat.chain.n,
      "flat_bytes": rm.footprint(case, flat.fn, model, variables),
      "none_bytes": rm.footprint(case, rm.plain_call(case, model), model, variables),
      "per_block_bytes": rm.footprint(case, rm.plain_call(case, remat_model), remat_model,
                                      remat_variables),
      "best_uniform_k": best_k, "best_uniform_bytes": uniform[best_k],
      "uniform_bytes": uniform,
  }


def markdown(rows: list[dict]) -> str:
  mib = 2**20
  columns = ("model", "layers found", "default apply MiB", "layer_depth=1 MiB", "no remat MiB",
             "per-block remat MiB", "best uniform MiB (k)", "default vs per-block", "apply s",
             "layer_depth='search' MiB (s)")
  lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
  for r in rows:
    lines.append(
        f"| {r['model']} | {r['layers']} (root's children: {r['flat_layers']}) "
        f"| {r['apply_bytes'] / mib:.2f} | {r['flat_bytes'] / mib:.2f} "
        f"| {r['none_bytes'] / mib:.2f} | {r['per_block_bytes'] / mib:.2f} "
        f"| {r['best_uniform_bytes'] / mib:.2f} ({r['best_uniform_k']}) "
        f"| {100 * (r['apply_bytes'] / r['per_block_bytes'] - 1):+.1f}% "
        f"| {r['apply_seconds']:.1f} "
        f"| {r['search_bytes'] / mib:.2f} ({r['search_seconds']:.1f}) |")
  lines += ["", "Decompositions chosen by default `apply`:", ""]
  lines += [f"- {r['model']}: {r['decomposition']}" for r in rows]
  lines += ["", "With `layer_depth='search'`:", ""]
  lines += [f"- {r['model']}: {r['search_decomposition']}" for r in rows]
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", default="bench", choices=sorted(rm.SIZES))
  parser.add_argument("--models", default=",".join(rm.NAMES))
  parser.add_argument("--out", default=OUT, help="JSON path (markdown written beside it)")
  args = parser.parse_args(argv)
  start = time.time()
  rows = []
  for name in args.models.split(","):
    rows.append(run_model(name, args.size))
    r = rows[-1]
    print(f"{name}: {r['layers']} layers, apply {r['apply_bytes'] / 2**20:.2f} MiB, per-block "
          f"{r['per_block_bytes'] / 2**20:.2f}, best uniform {r['best_uniform_bytes'] / 2**20:.2f}",
          flush=True)
  meta = run_meta(time.time() - start, size=rm.SIZES[args.size])
  table = f"Size {args.size}: {meta['size']}\n\n{markdown(rows)}"
  print(table)
  write_result(args.out, meta, rows, table)


if __name__ == "__main__":
  main()
