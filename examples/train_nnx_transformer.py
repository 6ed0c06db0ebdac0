"""Train a flax.nnx character-level transformer on Python's own source, with and without jaxremat.

The text is the source of a few standard-library modules (``inspect.getsource``: nothing
is downloaded). Both models start from the same state (parameters and dropout rng
streams) and see the same batches; their losses agree to float noise while the
jaxremat train step needs less memory (XLA's own statistics).

The train step is the functional nnx pattern: ``nnx.split`` the model and its
``nnx.Optimizer`` once, and ``jax.jit`` a step that merges them, takes
``nnx.value_and_grad`` and updates; on CPU it is compiled with the barrier expander
off, or XLA would undo the remat.

  python examples/train_nnx_transformer.py [--epochs 4] [--batch-size 32] [--max-steps N]
"""

from __future__ import annotations

import argparse
import inspect
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxremat

SOURCES = ("functools", "contextlib", "heapq", "textwrap", "string", "bisect")


def load_text(max_chars: int, test_fraction: float = 0.1):
  """Characters of stdlib sources as int32 ids: train ids, test ids, vocabulary."""
  text = "\n".join(inspect.getsource(__import__(name)) for name in SOURCES)[:max_chars]
  vocab = sorted(set(text))
  ids = np.asarray([vocab.index(c) for c in text], dtype=np.int32)
  n_test = int(len(ids) * test_fraction)
  return ids[:-n_test], ids[-n_test:], vocab


class Embed(nnx.Module):
  """Token plus learned position embeddings."""

  def __init__(self, vocab: int, dim: int, seq_len: int, rngs: nnx.Rngs):
    self.tokens = nnx.Embed(vocab, dim, rngs=rngs)
    self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(), (seq_len, dim)))

  def __call__(self, ids):
    return self.tokens(ids) + self.positions[None, : ids.shape[-1]]


class Block(nnx.Module):
  """Pre-LN transformer block: x + drop(attn(ln(x))), then x + drop(mlp(ln(x)))."""

  def __init__(self, dim: int, heads: int, dropout: float, rngs: nnx.Rngs):
    self.ln1 = nnx.LayerNorm(dim, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(heads, dim, decode=False, rngs=rngs)
    self.ln2 = nnx.LayerNorm(dim, rngs=rngs)
    self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
    self.down = nnx.Linear(4 * dim, dim, rngs=rngs)
    self.drop = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, x):
    length = x.shape[-2]
    causal = jnp.tril(jnp.ones((1, 1, length, length), dtype=bool))  # (batch, heads, q, k)
    x = x + self.drop(self.attn(self.ln1(x), mask=causal))
    return x + self.drop(self.down(nnx.gelu(self.up(self.ln2(x)))))


class CharTransformer(nnx.Module):
  """Embed, a stack of pre-LN blocks (an ``nnx.List``), final LayerNorm, logits."""

  def __init__(self, vocab: int, *, dim: int, heads: int, depth: int, seq_len: int,
               dropout: float, rngs: nnx.Rngs):
    self.embed = Embed(vocab, dim, seq_len, rngs)
    self.blocks = nnx.List([Block(dim, heads, dropout, rngs) for _ in range(depth)])
    self.ln_f = nnx.LayerNorm(dim, rngs=rngs)
    self.head = nnx.Linear(dim, vocab, rngs=rngs)

  def __call__(self, ids):
    x = self.embed(ids)
    for block in self.blocks:
      x = block(x)
    return self.head(self.ln_f(x))


def make_train_step(call, graphdef):
  """``step(state, x, y) -> (state, loss)`` over the split (model, optimizer) state."""

  def loss_fn(model, x, y):
    logits = call(model, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  def step(state, x, y):
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return nnx.split((model, optimizer))[1], loss

  return step, loss_fn


def make_eval_loss(graphdef):
  """``eval_loss(state, x, y)``: the loss with dropout off (no gradients, no remat)."""

  def eval_loss(state, x, y):
    model, _ = nnx.merge(graphdef, state)
    model.eval()
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  return jax.jit(eval_loss)


def compile_step(step, *args):
  """Compiles ``step`` so that remat is real on CPU (the barriers are kept)."""
  return jaxremat.jit(step).lower(*args).compile()


def footprint_bytes(compiled) -> int:
  """XLA's footprint of a compiled program: argument + output + temp - alias."""
  m = compiled.memory_analysis()
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)


def windows(ids: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
  """Non-overlapping (input, next-character target) windows of ``seq_len``."""
  n = (len(ids) - 1) // seq_len
  x = ids[: n * seq_len].reshape(n, seq_len)
  y = ids[1 : n * seq_len + 1].reshape(n, seq_len)
  return x, y


def batches(n: int, batch_size: int, rng: np.random.Generator):
  """Shuffled index batches of exactly ``batch_size`` (the last partial one is dropped)."""
  order = rng.permutation(n)
  for start in range(0, n - batch_size + 1, batch_size):
    yield order[start:start + batch_size]


def _mib(num_bytes: int) -> str:
  return f"{num_bytes / 2**20:.2f} MiB"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--epochs", type=int, default=4)
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--max-steps", type=int, default=None,
                      help="stop after this many steps in all (for quick runs)")
  parser.add_argument("--seq-len", type=int, default=128)
  parser.add_argument("--dim", type=int, default=64)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--depth", type=int, default=4)
  parser.add_argument("--dropout", type=float, default=0.1)
  parser.add_argument("--max-chars", type=int, default=120_000)
  parser.add_argument("--learning-rate", type=float, default=3e-3)
  parser.add_argument("--seed", type=int, default=0)
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Trains both models; returns losses, footprints and the plan."""
  args = parse_args(argv)
  start = time.perf_counter()
  train_ids, test_ids, vocab = load_text(args.max_chars)
  x_train, y_train = windows(train_ids, args.seq_len)
  x_test, y_test = windows(test_ids, args.seq_len)
  if args.batch_size > len(x_train):
    raise SystemExit(f"--batch-size must be at most {len(x_train)} (the training windows).")
  print(f"text: {len(train_ids) + len(test_ids)} characters of {', '.join(SOURCES)} "
        f"(vocabulary {len(vocab)}); {len(x_train)} train / {len(x_test)} test windows of "
        f"{args.seq_len}; batch {args.batch_size}; backend {jax.default_backend()}")

  model = CharTransformer(
      len(vocab), dim=args.dim, heads=args.heads, depth=args.depth, seq_len=args.seq_len,
      dropout=args.dropout, rngs=nnx.Rngs(params=args.seed, dropout=args.seed + 1))
  optimizer = nnx.Optimizer(model, optax.adam(args.learning_rate), wrt=nnx.Param)
  x0, y0 = jnp.asarray(x_train[:args.batch_size]), jnp.asarray(y_train[:args.batch_size])
  r = jaxremat.apply_nnx(model, x0)
  print(r.report())

  graphdef, state0 = nnx.split((model, optimizer))
  calls = {"plain": lambda m, x: m(x), "jaxremat": r.fn}
  steps, losses, compiled = {}, {}, {}
  for name, call in calls.items():
    steps[name], losses[name] = make_train_step(call, graphdef)
    compiled[name] = compile_step(steps[name], state0, x0, y0)
  footprints = {name: footprint_bytes(c) for name, c in compiled.items()}
  # nnx.grad of the loss alone: the program r.predicted_total_bytes predicts.
  model_def, model_state = nnx.split(model)
  grad_footprints = {
      name: jaxremat.compile_footprint(
          lambda s, x, y, f=f: nnx.grad(f)(nnx.merge(model_def, s), x, y),
          model_state, x0, y0).total_bytes
      for name, f in losses.items()}

  eval_loss = make_eval_loss(graphdef)
  state = {name: state0 for name in calls}  # the same arrays: identical initial state
  rng = np.random.default_rng(args.seed)
  results: dict[str, Any] = {
      "epoch_loss": {name: [] for name in calls},
      "step_loss": {name: [] for name in calls},
      "test_loss": {name: [] for name in calls},
  }
  step = 0
  print(f"\n{'epoch':>5}{'steps':>7}{'loss plain':>14}{'loss jaxremat':>15}{'max rel diff':>14}"
        f"{'test plain':>13}{'test jaxremat':>15}")
  for epoch in range(1, args.epochs + 1):
    epoch_losses = {name: [] for name in calls}
    for idx in batches(len(x_train), args.batch_size, rng):
      if args.max_steps is not None and step >= args.max_steps:
        break
      x, y = jnp.asarray(x_train[idx]), jnp.asarray(y_train[idx])
      for name in calls:
        state[name], loss = compiled[name](state[name], x, y)
        epoch_losses[name].append(float(loss))
      step += 1
    if not epoch_losses["plain"]:
      break
    for name in calls:
      results["step_loss"][name] += epoch_losses[name]
      results["epoch_loss"][name].append(float(np.mean(epoch_losses[name])))
      test = [float(eval_loss(state[name], jnp.asarray(x_test[i]), jnp.asarray(y_test[i])))
              for i in batches(len(x_test), min(args.batch_size, len(x_test)),
                               np.random.default_rng(0))]
      results["test_loss"][name].append(float(np.mean(test)))
    a, b = np.asarray(epoch_losses["plain"]), np.asarray(epoch_losses["jaxremat"])
    diff = float(np.max(np.abs(a - b) / np.abs(a)))
    print(f"{epoch:>5}{step:>7}{results['epoch_loss']['plain'][-1]:>14.6f}"
          f"{results['epoch_loss']['jaxremat'][-1]:>15.6f}{diff:>14.1e}"
          f"{results['test_loss']['plain'][-1]:>13.4f}"
          f"{results['test_loss']['jaxremat'][-1]:>15.4f}")

  step_fp, grad_fp = footprints, grad_footprints
  print("\nXLA-measured footprint (argument + output + temp - alias), same compiler options:")
  print(f"  train step (grad + Adam update): plain {_mib(step_fp['plain'])}, "
        f"jaxremat {_mib(step_fp['jaxremat'])} ({step_fp['jaxremat'] / step_fp['plain']:.1%})")
  print(f"  gradient only (nnx.grad): plain {_mib(grad_fp['plain'])}, "
        f"jaxremat {_mib(grad_fp['jaxremat'])} ({grad_fp['jaxremat'] / grad_fp['plain']:.1%}); "
        f"predicted {_mib(r.predicted_total_bytes)}")
  print(f"plan: {r.plan.method}, checkpoints after "
        f"{[r.chain.names[c - 1] for c in r.plan.checkpoints]}")
  seconds = time.perf_counter() - start
  print(f"done: {step} steps per model in {seconds:.1f} s")
  results.update(
      footprint_bytes=footprints,
      grad_footprint_bytes=grad_footprints,
      predicted_grad_bytes=r.predicted_total_bytes,
      checkpoints=list(r.plan.checkpoints),
      layer_names=list(r.chain.names),
      steps=step,
      seconds=seconds,
  )
  return results


if __name__ == "__main__":
  main()
