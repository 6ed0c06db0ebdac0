"""GPU predictions against recorded GPU measurements, computed on any machine.

    PYTHONPATH=. python bench/gpu_offline.py bench/results/gpu-h100/compile-only.json [--out F.md]

For each model of a ``gpu_validate.py --compile-only`` result, traces the model here and
profiles it as XLA's GPU backend keeps it (``profile(backend="gpu")``), predicts the
footprint of each recorded plan and compares it with the XLA-compiled footprint the GPU
run recorded for that plan. Tracing needs no GPU; the figures compared against are the
GPU's own.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jaxremat  # noqa: E402
from jaxremat import zoo_registry  # noqa: E402
from jaxremat._api import apply as _api  # noqa: E402
from jaxremat._backends import profile as _profile  # noqa: E402
from jaxremat._model.chain import Plan  # noqa: E402
from gpu_validate import models  # noqa: E402


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("results", help="a gpu_validation.json (compiled footprints of recorded plans)")
  parser.add_argument("--out", help="also write the table here (markdown)")
  parser.add_argument("--models", help="comma-separated subset")
  parser.add_argument("--backend", default="gpu",
                      help="the backend to profile for (default gpu; another name, e.g. tpu, "
                           "profiles without the GPU rules, as jaxremat did on GPU before them)")
  args = parser.parse_args()
  recorded = json.load(open(args.results))
  _api.profile = functools.partial(_profile.profile, backend=args.backend)
  specs = {**models(quick=False), **{m.name: m for m in zoo_registry.tagged("gpu-earlier")}}
  lines = ["| model | strategy | predicted MiB (GPU model) | XLA compiled MiB (GPU) | error |", "|---|---|---|---|---|"]
  errors = []
  plans = ["| model | plan apply picks here with this profile (on a GPU, ties may break otherwise) | predicted MiB |",
           "|---|---|---|"]  # not compiled here
  for name in dict.fromkeys(row["model"] for row in recorded["results"]):
    if name not in specs or (args.models and name not in args.models.split(",")):
      continue
    model, x = specs[name].build(), specs[name].example()
    abstract = jax.eval_shape(model.init, jax.random.key(0), x)
    params = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), abstract)
    kwargs = {"mutable": ["batch_stats"]} if "batch_stats" in params else {}
    r = jaxremat.apply(model.apply, params, x, **kwargs)
    plans.append(f"| {name} | {list(r.plan.checkpoints)} | {r.predicted_total_bytes / 2**20:.1f} |")
    for row in recorded["results"]:
      if row["model"] != name or row.get("checkpoints") is None or row.get("compiled_bytes") is None:
        continue
      predicted = r.predict_total_bytes(Plan(tuple(row["checkpoints"])))
      err = 100 * (predicted - row["compiled_bytes"]) / row["compiled_bytes"]
      errors.append(abs(err))
      lines.append(f"| {name} | {row['strategy']} | {predicted / 2**20:.1f} | {row['compiled_bytes'] / 2**20:.1f} | {err:+.1f}% |")
      print(lines[-1], flush=True)
  summary = (f"{len(errors)} rows: mean |error| {np.mean(errors):.1f}%, worst {np.max(errors):.1f}%, "
             f"{sum(e <= 5 for e in errors)} within 5%, {sum(e <= 10 for e in errors)} within 10%")
  print(summary)
  print("\n".join(plans))
  if args.out:
    with open(args.out, "w") as f:
      f.write(f"# GPU predictions against recorded GPU compiles\n\n`{' '.join(sys.argv)}` "
              f"(jax {jax.__version__}, traced on {jax.default_backend()}, profiled for {args.backend})\n\n" + "\n".join(lines) + f"\n\n{summary}\n\n" + "\n".join(plans) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
