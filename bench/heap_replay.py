"""Whether XLA's heap packing can be replayed from its own values: a best-fit heap over
the temp values of a compiled step, against XLA's temp allocation and live peak.

    PYTHONPATH=. python bench/heap_replay.py vit-d64-L6 1,2,3,4,5,6,7

Compiles the plan's gradient step (as ``bench/live_peak.py`` does) with an XLA dump,
takes every value of the temp allocation with its size and live range, and places them
as XLA's heap simulator does (``GlobalDecreasingSizeBestFitHeap``: largest first, or
longest-lived first, each in the smallest free gap over its live range that fits,
64-byte aligned; the smaller of the two heaps is kept). The values are taken one by one:
what XLA joins into one buffer (an in-place output and its operand, a tuple's
elements) is not known from the dump's values. CPU only.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax

import jaxremat

sys.path.insert(0, os.path.dirname(__file__))
import live_peak  # noqa: E402  (bench/live_peak.py: the dump's temp values)
import memory  # noqa: E402  (bench/memory.py: the zoo models and their batches)

_ALIGNMENT = 64  # bytes: XLA's CPU buffer alignment


def best_fit_heap_bytes(values: list[tuple[int, int, int]], order: str) -> int:
  """Heap bytes of ``values`` (first step, last step, bytes) placed largest first
  (``order="spatial"``) or longest-lived first (``"temporal"``), each at the smallest
  free gap over its live range that fits it, else above every value live then."""
  key = ((lambda v: (-v[2], v[0] - v[1])) if order == "spatial"
         else (lambda v: (v[0] - v[1], -v[2])))
  placed: list[tuple[int, int, int, int]] = []  # (first, last, lo, hi)
  top = 0
  for first, last, size in sorted(values, key=key):
    size = -(-size // _ALIGNMENT) * _ALIGNMENT
    taken = sorted((lo, hi) for f, l, lo, hi in placed if f <= last and first <= l)
    gaps, end = [], 0
    for lo, hi in taken:
      if lo - end >= size:
        gaps.append((lo - end, end))
      end = max(end, hi)
    offset = min(gaps)[1] if gaps else end
    placed.append((first, last, offset, offset + size))
    top = max(top, offset + size)
  return top


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("model", help="a bench/memory.py model name")
  parser.add_argument("checkpoints", help="the plan's checkpoints, comma-separated")
  args = parser.parse_args()
  if jax.default_backend() != "cpu":
    parser.error("the dumps are read as XLA's CPU backend writes them; run on CPU")
  spec = {m.name: m for m in memory.MODELS}[args.model]
  model, x = spec.build(), spec.batch()
  params = jax.jit(model.init)(jax.random.key(0), x)
  plan = jaxremat.Plan(tuple(int(c) for c in args.checkpoints.split(",") if c))
  fn = jaxremat.apply(model.apply, params, x, plan=plan, **spec.kwargs).fn
  footprint, spans = live_peak.measure_with_dump(fn, spec.kwargs, params, x, live_peak.temp_spans)
  values = [(first, last, hi - lo) for first, last, lo, hi in spans]
  heaps = {order: best_fit_heap_bytes(values, order) for order in ("spatial", "temporal")}
  mib = 2**20
  print(f"{args.model} {plan.checkpoints}: XLA temp {footprint.temp_bytes / mib:.3f} MiB, "
        f"live peak {live_peak.live_peak_bytes(spans) / mib:.3f} MiB, best-fit replay "
        f"{min(heaps.values()) / mib:.3f} MiB (spatial {heaps['spatial'] / mib:.3f}, "
        f"temporal {heaps['temporal'] / mib:.3f}; {len(values)} values)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
