"""A bf16 ViT with dropout planned for the H100 (deviceless): the model of a user's trial.

    JAX_PLATFORMS=cpu PYTHONPATH=. python bench/bf16_vit.py --batch 32 \
        --out bench/results/bf16-vit-h100-aot/bf16-vit.json

XLA's GPU schedule pads each bf16 block's attention probabilities for the backward during
the forward; the compiled profile once took the first such padding for the turn into the
backward and replayed segments of several blocks 21-57% low. Rows: default ``apply`` (its
plan, prediction and XLA's figure), each checkpoint-every-k plan predicted by the compiled
profile against XLA, and ``nn.remat`` on every block (no policy, and
``dots_with_no_batch_dims_saveable``) as a user would write it by hand.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

import jaxremat
from jaxremat.solvers import uniform_plan

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: record
from record import run_meta, write_result  # noqa: E402

MiB = 2**20


class Block(nn.Module):
  """Pre-LN encoder block in bf16 with dropout after attention and in the MLP."""

  width: int
  heads: int
  rate: float

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    bf16 = {"dtype": jnp.bfloat16, "param_dtype": jnp.bfloat16}
    h = nn.LayerNorm(**bf16)(x)
    h = nn.MultiHeadDotProductAttention(num_heads=self.heads, dropout_rate=self.rate,
                                        deterministic=deterministic, **bf16)(h, h)
    x = x + nn.Dropout(self.rate)(h, deterministic=deterministic)
    h = nn.gelu(nn.Dense(4 * self.width, **bf16)(nn.LayerNorm(**bf16)(x)))
    h = nn.Dense(self.width, **bf16)(nn.Dropout(self.rate)(h, deterministic=deterministic))
    return x + nn.Dropout(self.rate)(h, deterministic=deterministic)


class ViT(nn.Module):
  """16x16 patches, a class token, ``depth`` blocks in an ``Encoder``, a head."""

  depth: int = 6
  width: int = 384
  heads: int = 6
  rate: float = 0.1
  block: Any = Block

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
    bf16 = {"dtype": jnp.bfloat16, "param_dtype": jnp.bfloat16}
    x = nn.Conv(self.width, (16, 16), strides=(16, 16), name="embedding", **bf16)(x)
    x = x.reshape(x.shape[0], -1, self.width)
    cls = self.param("cls", nn.initializers.zeros, (1, 1, self.width), jnp.bfloat16)
    x = jnp.concatenate([jnp.tile(cls, (x.shape[0], 1, 1)), x], axis=1)
    x = x + self.param("pos", nn.initializers.normal(0.02), (1, x.shape[1], self.width),
                       jnp.bfloat16)
    x = nn.Dropout(self.rate)(x, deterministic=not train)
    x = Encoder(self.depth, self.width, self.heads, self.rate, self.block,
                name="Transformer")(x, not train)
    return nn.Dense(1000, name="head", **bf16)(x[:, 0])


class Encoder(nn.Module):
  depth: int
  width: int
  heads: int
  rate: float
  block: Any

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    for i in range(self.depth):
      x = self.block(self.width, self.heads, self.rate, name=f"block_{i}")(x, deterministic)
    return nn.LayerNorm(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, name="norm")(x)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--target", default="h100")
  parser.add_argument("--out", default=None, help="JSON path (markdown written beside it)")
  args = parser.parse_args(argv)
  start = time.time()
  x = jax.ShapeDtypeStruct((args.batch, 224, 224, 3), jnp.bfloat16)
  rngs = {"dropout": jax.random.key(1)}
  model = ViT()
  variables = jax.eval_shape(lambda k: model.init(k, jnp.zeros(x.shape, x.dtype), train=False),
                             jax.random.key(0))
  common = dict(target=args.target, train=True, rngs=rngs)

  def measured(apply_fn: Any) -> int:
    loss = lambda v, b: apply_fn(v, b, train=True, rngs=rngs).astype(jnp.float32).mean()  # noqa: E731
    return jaxremat.measure(loss, variables, x, target=args.target).total_bytes

  r = jaxremat.apply(model.apply, variables, x, **common)
  rows = [{"plan": "apply", "checkpoints": list(r.plan.checkpoints),
           "predicted_bytes": r.predict_total_bytes(r.plan), "xla_bytes": r.measured_total_bytes}]
  for k in range(1, r.chain.n + 1):
    plan = uniform_plan(r.chain.n, k)
    xla = jaxremat.apply(model.apply, variables, x, plan=plan, **common).measured_total_bytes
    rows.append({"plan": f"every {k}" if k < r.chain.n else "no remat",
                 "checkpoints": list(plan.checkpoints),
                 "predicted_bytes": r.predict_total_bytes(plan), "xla_bytes": xla})
  for label, policy in (("nn.remat every block", None), (
      "nn.remat every block, dots_with_no_batch_dims_saveable",
      jax.checkpoint_policies.dots_with_no_batch_dims_saveable)):
    remat = ViT(block=nn.remat(Block, static_argnums=(2,), policy=policy))
    rows.append({"plan": label, "checkpoints": None, "predicted_bytes": None,
                 "xla_bytes": measured(remat.apply)})
  least = min(row["xla_bytes"] for row in rows)
  lines = ["| plan | checkpoints | predicted MiB | XLA MiB | error | vs least |", "|---|---|---|---|---|---|"]
  for row in rows:
    predicted = row["predicted_bytes"]
    error = f"{100 * (predicted / row['xla_bytes'] - 1):+.1f}%" if predicted else "-"
    lines.append(f"| {row['plan']} | {row['checkpoints'] if row['checkpoints'] is not None else '-'} | "
                 f"{predicted / MiB if predicted else float('nan'):.1f} | "
                 f"{row['xla_bytes'] / MiB:.1f} | {error} | "
                 f"{100 * (row['xla_bytes'] / least - 1):+.1f}% |")
  table = "\n".join(lines) + "\n"
  print(table)
  if args.out:
    write_result(args.out, run_meta(time.time() - start, target=args.target,
                                     batch=args.batch), rows, table)


if __name__ == "__main__":
  main()
