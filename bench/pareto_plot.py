"""Plot the memory/recompute frontier of a zoo model: ``jaxremat.pareto`` of its chain.

    python bench/pareto_plot.py [--out docs/img/pareto-vgg16.png]

Needs matplotlib (``pip install ".[plot]"``). Every point is a plan of least recomputed
FLOPs for its model-R peak; the single-level baselines are marked for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import jaxremat  # noqa: E402
from jaxremat import zoo  # noqa: E402

BASELINES = ("none", "every-layer", "sqrt", "best-uniform", "chen-greedy", "optimal")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="docs/img/pareto-vgg16.png")
  parser.add_argument("--batch", type=int, default=128)
  args = parser.parse_args()
  model = zoo.vgg("vgg16")
  x = jax.ShapeDtypeStruct((args.batch, 32, 32, 3), "float32")
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), jax.numpy.zeros(x.shape)))
  params = jax.tree_util.tree_map(lambda s: jax.numpy.zeros(s.shape, s.dtype), params)
  chain = jaxremat.apply(model.apply, params, jax.numpy.zeros(x.shape), refine=False).chain
  frontier = jaxremat.pareto(chain)
  peaks = [p / 2**20 for p, _, _ in frontier]
  flops = [f / 1e9 for _, f, _ in frontier]
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  ax.step(peaks, flops, where="post", color="tab:blue", label="jaxremat budget plans (Pareto frontier)")
  ax.plot(peaks, flops, "o", color="tab:blue", markersize=3)
  points = {}
  for method in BASELINES:
    plan = jaxremat.solve(chain, method)
    points[method] = (jaxremat.peak_bytes(chain, plan), jaxremat.recompute_flops(chain, plan))
    ax.plot(points[method][0] / 2**20, points[method][1] / 1e9, "s", label=method)
  ax.set_xlabel("model-R activation peak (MiB)")
  ax.set_ylabel("recomputed forward GFLOP per step")
  ax.set_title(f"VGG-16, batch {args.batch}, 32x32: memory against recompute")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(args.out, dpi=120)
  print(json.dumps({"frontier_points": len(frontier), "baselines": points, "out": args.out}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
