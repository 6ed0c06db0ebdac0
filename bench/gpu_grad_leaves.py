"""Which gradient leaves differ between the plain and the every-layer-remat step, and by how much.

    PYTHONPATH=. python bench/gpu_grad_leaves.py

(Recorded on an H100 in bench/results/gpu-h100/grad-leaves-2026-11-23-first.txt.)

For the GPU validation's ViT (vit-d384-L12-b256) and GPT (gpt-d512-L8-b8-s1024), prints
the largest gradient entry of the whole tree, the largest difference relative to it, and
the four leaves with the largest per-leaf relative difference (difference, the leaf's
largest entry, its path).
"""

import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jaxremat  # noqa: E402
from jaxremat import zoo_registry  # noqa: E402
from jaxremat._api.loss import training_loss  # noqa: E402

#: Printed label -> "gpu" model of jaxremat/zoo_registry.py.
CASES = {"vit": "vit-d384-L12-b256", "gpt": "gpt-d512-L8-b8-s1024"}


def main() -> None:
  for name, model_name in CASES.items():
    entry = zoo_registry.get(model_name)
    model, x, kwargs = entry.build(), entry.example(), entry.apply_kwargs()
    params = model.init(jax.random.key(0), x)
    r = jaxremat.apply(model.apply, params, x, **kwargs)
    remat = jaxremat.apply(model.apply, params, x, plan=jaxremat.solve(r.chain, "every-layer"), **kwargs).fn
    want = jax.jit(jax.grad(training_loss(model.apply, kwargs)))(params, x)
    got = jax.jit(jax.grad(training_loss(remat, kwargs)))(params, x)
    rows = []
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree_util.tree_leaves(got)):
      a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
      rows.append((float(np.max(np.abs(a - b))), float(np.max(np.abs(a))), jax.tree_util.keystr(path)))
    scale = max(row[1] for row in rows)
    print(name, "global max|g|", scale, "max|diff|/global", max(row[0] for row in rows) / scale)
    for row in sorted(rows, key=lambda row: -row[0] / max(row[1], 1e-30))[:4]:
      print("  ", row)


if __name__ == "__main__":
  main()
