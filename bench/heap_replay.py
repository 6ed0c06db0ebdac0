"""XLA's heap placement replayed over one plan's temp values, against XLA's temp bytes.

    PYTHONPATH=. python bench/heap_replay.py vit-d64-L6 1,2,3,4,5,6,7

Compiles the plan's gradient step (as ``bench/live_peak.py`` does) with an XLA dump,
reads the temp allocation's values off it and prints XLA's temp bytes, their peak live
bytes and the allocation ``replay_temp_bytes`` of bench/xla_heap.py makes of them (XLA's
best-fit heap, largest-first and longest-first, replayed). CPU only.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax

import jaxremat
from jaxremat import zoo_registry

sys.path.insert(0, os.path.dirname(__file__))
import live_peak  # noqa: E402  (bench/live_peak.py: a plan's step and its temp values)
import xla_heap  # noqa: E402  (bench/xla_heap.py: XLA's heap replayed)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("model", help="a bench/memory.py model name (a \"cpu\" model of jaxremat/zoo_registry.py)")
  parser.add_argument("checkpoints", help="the plan's checkpoints, comma-separated")
  args = parser.parse_args()
  if jax.default_backend() != "cpu":
    parser.error("the dumps are read as XLA's CPU backend writes them; run on CPU")
  spec = zoo_registry.get(args.model)
  model, x, params = spec.instantiate()
  plan = jaxremat.Plan(tuple(int(c) for c in args.checkpoints.split(",") if c))
  footprint, values = live_peak.measure_plan(spec, model, params, x, plan)
  print(f"{args.model} {plan.checkpoints}: XLA temp {footprint.temp_bytes} B, live peak "
        f"{xla_heap.live_peak_bytes(values)} B, replay {xla_heap.replay_temp_bytes(values)} B "
        f"({len(values)} values)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
