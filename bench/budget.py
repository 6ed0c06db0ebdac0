"""Budget mode on the zoo: does XLA's footprint of ``apply(budget_bytes=B)`` stay within B?

    python bench/budget.py [--out bench/results/budget-cpu/budget.md]

For each CPU-sized zoo model (the "cpu" models of jaxremat/zoo_registry.py), B is set to 50% and 75% of the way from
the least footprint jaxremat reaches to the no-remat footprint (both XLA-measured).
"""

from __future__ import annotations

import argparse
import sys

import jax

import jaxremat
from jaxremat._api.loss import training_loss
from jaxremat.zoo_registry import tagged


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out")
  args = parser.parse_args()
  lines = [f"jax {jax.__version__}, backend {jax.default_backend()}", "",
           "| model | budget bytes | XLA-measured bytes | within | checkpoints | compiles |",
           "|---|---|---|---|---|---|"]
  for spec in tagged("cpu"):
    name, model, x, kwargs = spec.name, spec.build(), spec.example(), spec.apply_kwargs()
    params = model.init({"params": jax.random.key(0), **kwargs.get("rngs", {})}, x)
    none = jaxremat.measure(training_loss(model.apply, kwargs), params, x).total_bytes
    best = jaxremat.apply(model.apply, params, x, verify=True, **kwargs)
    least = min(best.verified.values())
    for fraction in (0.5, 0.75):
      budget = int(least + fraction * (none - least))
      try:
        r = jaxremat.apply(model.apply, params, x, budget_bytes=budget, **kwargs)
      except jaxremat.InfeasibleBudgetError as err:
        lines.append(f"| {name} | {budget} | infeasible: least {err.min_feasible_bytes} | - | - | - |")
        continue
      measured = jaxremat.measure(training_loss(r.fn, kwargs), params, x).total_bytes
      lines.append(f"| {name} | {budget} | {measured} | {'yes' if measured <= budget else 'NO'} "
                   f"| {len(r.plan.checkpoints)} | {len(r.verified)} |")
    print(lines[-1], file=sys.stderr, flush=True)
  text = "\n".join(lines)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(f"Command: python bench/budget.py --out {args.out}\n\n{text}\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
