"""Train a linen CNN on scikit-learn's digits with and without jaxremat.

Both models start from the same parameters and see the same batches; their losses agree
to float noise while the jaxremat train step needs less memory (XLA's own statistics).

  python examples/train_linen_cnn.py [--epochs 8] [--batch-size 128] [--max-steps N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import jaxremat

IMAGE_SIZE = 32  # the 8x8 digits are upsampled so that activations dominate memory
STAGES = ((16, 1), (16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (128, 2))  # (features, stride)


def make_model(num_classes: int = 10) -> nn.Sequential:
  """3x3 convs with ReLU (strided ones downsample), flatten, Dense."""
  layers: list = []
  for features, stride in STAGES:
    layers += [nn.Conv(features, (3, 3), strides=stride), nn.relu]
  layers += [lambda x: x.reshape(x.shape[0], -1), nn.Dense(num_classes)]
  return nn.Sequential(layers)


def load_data(test_fraction: float = 0.2, seed: int = 0):
  """Digits as (N, 32, 32, 1) float32 in [0, 1] and int32 labels: train and test split."""
  digits = load_digits()
  x = digits.images.astype(np.float32)[..., None] / 16.0
  x = np.asarray(jax.image.resize(x, (x.shape[0], IMAGE_SIZE, IMAGE_SIZE, 1), "bilinear"))
  y = digits.target.astype(np.int32)
  order = np.random.default_rng(seed).permutation(len(y))
  n_test = int(len(y) * test_fraction)
  test, train = order[:n_test], order[n_test:]
  return (x[train], y[train]), (x[test], y[test])


def make_train_step(apply_fn, optimizer):
  """``step(params, opt_state, x, y) -> (params, opt_state, loss)`` with Adam."""

  def loss_fn(params, x, y):
    logits = apply_fn(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  def step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step, loss_fn


def compile_step(step, *args):
  """Compiles ``step`` so that remat is real on CPU (the barriers are kept)."""
  return jaxremat.jit(step).lower(*args).compile()


def footprint_bytes(compiled) -> int:
  """XLA's footprint of a compiled program: argument + output + temp - alias."""
  m = compiled.memory_analysis()
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)


def batches(n: int, batch_size: int, rng: np.random.Generator):
  """Shuffled index batches of exactly ``batch_size`` (the last partial one is dropped)."""
  order = rng.permutation(n)
  for start in range(0, n - batch_size + 1, batch_size):
    yield order[start:start + batch_size]


def _mib(num_bytes: int) -> str:
  return f"{num_bytes / 2**20:.2f} MiB"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--epochs", type=int, default=8)
  parser.add_argument("--batch-size", type=int, default=128)
  parser.add_argument("--max-steps", type=int, default=None,
                      help="stop after this many steps in all (for quick runs)")
  parser.add_argument("--learning-rate", type=float, default=2e-3)
  parser.add_argument("--seed", type=int, default=0)
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Trains both models; returns losses, accuracies and footprints."""
  args = parse_args(argv)
  start = time.perf_counter()
  (x_train, y_train), (x_test, y_test) = load_data(seed=args.seed)
  if args.batch_size > len(y_train):
    raise SystemExit(f"--batch-size must be at most {len(y_train)} (the training set).")
  print(f"digits: {len(y_train)} train, {len(y_test)} test, {IMAGE_SIZE}x{IMAGE_SIZE}x1; "
        f"batch {args.batch_size}; backend {jax.default_backend()}")

  model = make_model()
  x0, y0 = jnp.asarray(x_train[:args.batch_size]), jnp.asarray(y_train[:args.batch_size])
  params = model.init(jax.random.key(args.seed), x0)
  r = jaxremat.apply(model.apply, params, x0)
  print(r.report())

  optimizer = optax.adam(args.learning_rate)
  opt_state = optimizer.init(params)
  fns = {"plain": model.apply, "jaxremat": r.fn}
  steps, losses, compiled = {}, {}, {}
  for name, fn in fns.items():
    steps[name], losses[name] = make_train_step(fn, optimizer)
    compiled[name] = compile_step(steps[name], params, opt_state, x0, y0)
  footprints = {name: footprint_bytes(c) for name, c in compiled.items()}
  # jax.grad of the loss alone: the program r.predicted_total_bytes predicts.
  grad_footprints = {
      name: jaxremat.measure(lambda p, b, f=f: f(p, *b), params, (x0, y0)).total_bytes
      for name, f in losses.items()}

  state = {name: (params, opt_state) for name in fns}
  evaluate = jax.jit(lambda p, x: jnp.argmax(model.apply(p, x), axis=-1))
  rng = np.random.default_rng(args.seed)
  results: dict[str, Any] = {
      "epoch_loss": {name: [] for name in fns},
      "step_loss": {name: [] for name in fns},
      "test_accuracy": {name: [] for name in fns},
  }
  step = 0
  print(f"\n{'epoch':>5}{'steps':>7}{'loss plain':>14}{'loss jaxremat':>15}{'max rel diff':>14}"
        f"{'test acc plain':>16}{'test acc jaxremat':>19}")
  for epoch in range(1, args.epochs + 1):
    epoch_losses = {name: [] for name in fns}
    for idx in batches(len(y_train), args.batch_size, rng):
      if args.max_steps is not None and step >= args.max_steps:
        break
      x, y = jnp.asarray(x_train[idx]), jnp.asarray(y_train[idx])
      for name in fns:
        p, o = state[name]
        p, o, loss = compiled[name](p, o, x, y)
        state[name] = (p, o)
        epoch_losses[name].append(float(loss))
      step += 1
    if not epoch_losses["plain"]:
      break
    for name in fns:
      results["step_loss"][name] += epoch_losses[name]
      results["epoch_loss"][name].append(float(np.mean(epoch_losses[name])))
      pred = np.asarray(evaluate(state[name][0], jnp.asarray(x_test)))
      results["test_accuracy"][name].append(float(np.mean(pred == y_test)))
    a, b = np.asarray(epoch_losses["plain"]), np.asarray(epoch_losses["jaxremat"])
    diff = float(np.max(np.abs(a - b) / np.abs(a)))
    print(f"{epoch:>5}{step:>7}{results['epoch_loss']['plain'][-1]:>14.6f}"
          f"{results['epoch_loss']['jaxremat'][-1]:>15.6f}{diff:>14.1e}"
          f"{results['test_accuracy']['plain'][-1]:>16.4f}"
          f"{results['test_accuracy']['jaxremat'][-1]:>19.4f}")

  step_fp, grad_fp = footprints, grad_footprints
  print("\nXLA-measured footprint (argument + output + temp - alias), same compiler options:")
  print(f"  train step (grad + Adam update): plain {_mib(step_fp['plain'])}, "
        f"jaxremat {_mib(step_fp['jaxremat'])} ({step_fp['jaxremat'] / step_fp['plain']:.1%})")
  print(f"  gradient only (jaxremat.measure): plain {_mib(grad_fp['plain'])}, "
        f"jaxremat {_mib(grad_fp['jaxremat'])} ({grad_fp['jaxremat'] / grad_fp['plain']:.1%}); "
        f"predicted {_mib(r.predicted_total_bytes)}")
  seconds = time.perf_counter() - start
  print(f"done: {step} steps per model in {seconds:.1f} s")
  results.update(
      footprint_bytes=footprints,
      grad_footprint_bytes=grad_footprints,
      predicted_grad_bytes=r.predicted_total_bytes,
      checkpoints=list(r.plan.checkpoints),
      steps=step,
      seconds=seconds,
  )
  return results


if __name__ == "__main__":
  main()
