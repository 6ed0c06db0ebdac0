"""Which gradient leaves differ between the plain and the every-layer-remat step, and by how much.

    PYTHONPATH=. python bench/gpu_grad_leaves.py

For the GPU validation's ViT (vit-d384-L12-b256) and GPT (gpt-d512-L8-b8-s1024), prints the largest gradient entry of the whole tree,
the largest difference relative to it, and the four leaves with the largest per-leaf
relative difference (difference, the leaf's largest entry, its path).
"""

import jax
import jax.numpy as jnp
import numpy as np

import jaxremat
from jaxremat import zoo


def main() -> None:
  cases = {
      "vit": (zoo.vit(patch=4, dim=384, depth=12, num_heads=6),
                            jax.random.normal(jax.random.key(1), (256, 32, 32, 3))),
      "gpt": (zoo.gpt(vocab_size=8192, max_len=1024, dim=512, depth=8, num_heads=8),
                               jax.random.randint(jax.random.key(1), (8, 1024), 0, 256)),
  }
  for name, (model, x) in cases.items():
    params = model.init(jax.random.key(0), x)
    loss = lambda f: lambda p, b: jnp.mean(jnp.square(f(p, b).astype(jnp.float32)))
    r = jaxremat.apply(model.apply, params, x)
    remat = jaxremat.apply(model.apply, params, x, plan=jaxremat.solve(r.chain, "every-layer")).fn
    want = jax.jit(jax.grad(loss(model.apply)))(params, x)
    got = jax.jit(jax.grad(loss(remat)))(params, x)
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
