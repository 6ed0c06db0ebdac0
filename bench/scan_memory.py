"""XLA's footprint of scanned layer stacks (tests/test_scan.py's models) under every
segment length, the one jaxremat's estimate chooses, verify=True's ("block": one block a
segment without an inner scan), and of the stack written with
``nn.remat(block, prevent_cse=False)`` inside ``nn.scan`` by hand; prints a Markdown table.

  PYTHONPATH=. python bench/scan_memory.py

Recorded in bench/results/scan-sharding-cpu/scan-sharding.md.
"""

import sys

import flax.linen as nn
import jax

sys.path.insert(0, "tests")
import jaxremat  # noqa: E402
from test_scan import MODELS, _apply_fn, _loss  # noqa: E402


def main():
  print(f"jax {jax.__version__}, backend {jax.default_backend()}; footprint = XLA's "
        "argument + output + temp - alias of jax.grad of a mean-square loss (bytes)\n")
  print("| model | n | plain | k: footprint | chosen k | verify k | model-R optimal / uniform k "
        "| nn.remat in nn.scan |")
  print("|---|---|---|---|---|---|---|---|")
  for name in ("nn.scan-mlp", "nn.scan-preln-transformer", "lax.scan"):
    model, params, x = MODELS[name]()
    fn = _apply_fn(model)
    plan = jaxremat.Plan()
    chosen = jaxremat.apply(fn, params, x, plan=plan).scans[0]
    n = chosen.length
    plain = jaxremat.measure(_loss(fn), params, x).total_bytes
    sizes = {k: jaxremat.measure(_loss(jaxremat.apply(fn, params, x, scan_segment=k, plan=plan).fn),
                                 params, x).total_bytes for k in range(1, n) if n % k == 0}
    checked = jaxremat.apply(fn, params, x, plan=plan, verify=True)
    verified = checked.scans[0]
    cells = ", ".join(f"{k}: {v}" for k, v in sizes.items())
    by_hand = "n/a"  # lax.scan: no flax block to wrap
    if hasattr(model, "block"):
      hand = _apply_fn(model.clone(block=nn.remat(model.block, prevent_cse=False)))
      by_hand = str(jaxremat.measure(_loss(hand), params, x).total_bytes)
    verify_k = (f"{verified.segment}{' (block)' if verified.block else ''}: "
                f"{checked.measured_total_bytes}")
    print(f"| {name} | {n} | {plain} | {cells} | {chosen.segment} | {verify_k} | "
          f"{chosen.optimal_peak_bytes} / {chosen.peak_bytes} | {by_hand} |")


if __name__ == "__main__":
  main()
