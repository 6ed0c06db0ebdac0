"""jaxremat.fit against the per-tensor policies users pick, at 25/50/75% of the activations.

    PYTHONPATH=. python bench/policies.py [--models vit-d64-L6,mlp-uneven] [--target h100] \
        [--out bench/results/policies-cpu/policies.json]

For each model and each budget (fixed bytes plus 25%, 50%, 75% of the no-remat
activations, XLA-measured), every strategy's XLA footprint, predicted recompute time (the
target's roofline over XLA's cost analysis, ``_backends/policy_options.OptionCosts``) and,
on the local backend, its measured step time (the least of ``3 * --rounds`` runs of the
jitted gradient step; all of a model's distinct programs take turns, so that the machine's
slow spells fall on all alike). Strategies:

* ``fit``: ``jaxremat.fit(..., memory_budget)``, per-residual (on the local backend it
  returns the fastest of the fitting plans it timed: ``timed_by_fit`` in the JSON);
* ``layer budget``: ``jaxremat.apply(..., budget_bytes=)``, layer boundaries only;
* ``nothing``, ``dots``, ``dots-no-batch``: every layer under ``jax.checkpoint`` with
  ``nothing_saveable``, ``dots_saveable``, ``dots_with_no_batch_dims_saveable`` (a
  scanned stack: each of its blocks, as ``nn.remat(Block, policy=...)`` in the scan);
* ``save-qkv`` (MaxText-style): every layer keeps the outputs of its products named
  ``query``, ``key``, ``value`` or ``qkv`` and recomputes the rest;
* ``save-attention-dots`` (MaxText-style "save the dots except the MLP's"): every layer
  keeps the outputs of its products inside an attention module;
* ``offload`` (a GPU target or a local GPU): every layer offloads its products' outputs
  to host memory.

* ``xla auto-remat`` (deviceless GPU targets): the plain model compiled for the target
  told it has exactly the budget of device memory
  (``xla_gpu_memory_limit_slop_factor=100``), so XLA's own rematerialisation aims at the
  budget; its time is not predicted. On CPU: n/a.
A strategy fits a budget when XLA's footprint is at most the budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time
from typing import Any

import jax
import numpy as np

import jaxremat
from jaxremat._api.dropin import input_key, policy_drop_in
from jaxremat._api.loss import training_loss
from jaxremat._api.planner import make_planner
from jaxremat._backends.measure import compile_step
from jaxremat._api.fit_graph import group_cost
from jaxremat._backends.policy_options import LayerOptions, OptionCosts
from jaxremat._backends.roofline import roofline_for
from jaxremat._backends.step_time import best_step_seconds
from jaxremat._backends.targets import Target, get_target
from jaxremat._jaxpr import scan as _scan
from jaxremat._jaxpr.trace import trace
from jaxremat._model.policy_plan import (DOTS, DOTS_NO_BATCH, KEEP, NAMES, RECOMPUTE, Group,
                                         Option, PolicyPlan, from_plan)
from jaxremat.zoo_graphs import DenseNet, UNet
from jaxremat.zoo_registry import tagged

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: its record module
import unseen  # noqa: E402
from record import run_meta, write_result  # noqa: E402

BUDGETS = (0.25, 0.5, 0.75)
_PRODUCTS = ("dot_general", "conv_general_dilated")
_QKV = re.compile(r"/(query|key|value|qkv)[^/]*$")


def _products(layer: Any, pattern: re.Pattern[str] | None = None,
              inside: str | None = None) -> frozenset[int]:
  found = set()
  for k, eqn in enumerate(layer.eqns):
    if eqn.primitive.name not in _PRODUCTS:
      continue
    stack = str(eqn.source_info.name_stack)
    if pattern is not None and not pattern.search(stack):
      continue
    if inside is not None and inside not in stack.lower():
      continue
    found.add(k)
  return frozenset(found)


def per_layer(n: int, option: Any) -> PolicyPlan:
  """Every layer under the option ``option(i)`` gives (a policy applied per block)."""
  return PolicyPlan(tuple(Group(i, i + 1, option(i)) for i in range(n)))


def names_or_recompute(saved: frozenset[int]) -> Option:
  return Option(NAMES, saved=saved) if saved else Option(RECOMPUTE)


def auto_remat_target(name: str, limit_bytes: int) -> Target:
  """Target ``name`` with ``limit_bytes`` of device memory and XLA's remat allowed all of
  it (``xla_gpu_memory_limit_slop_factor=100``): XLA's own rematerialisation then aims
  at that limit."""
  base = get_target(name)
  assert base is not None
  config = re.sub(r"device_memory_size\s*:\s*\d+", f"device_memory_size: {limit_bytes}",
                  base.config)
  return dataclasses.replace(
      base, name=f"{name}@{limit_bytes}", config=config, memory_bytes=limit_bytes,
      compiler_options=(*base.compiler_options, ("xla_gpu_memory_limit_slop_factor", "100")))


def run_model(name: str, model: Any, x: Any, params: Any, kwargs: dict, target: str | None,
              rounds: int) -> list[dict]:
  apply_kwargs = dict(kwargs)
  written = trace(model.apply, params, x, apply_kwargs, None)
  traced, scans = _scan.rewrite(written, "auto")  # as fit segments them
  n = len(traced.layers)
  planner = make_planner(traced, scans, params, x, apply_kwargs, False, get_target(target))
  if traced.is_graph:  # a graph's groups: fit's own costs for them (no chain profile)
    options = LayerOptions(traced, roofline_for(target))
    seconds_of = lambda g: group_cost(options, g).seconds  # noqa: E731
  else:
    options = costs = OptionCosts(traced, planner.chain, roofline_for(target), scans, written)
    seconds_of = lambda g: costs.of(g).seconds  # noqa: E731
  fixed = planner.fixed_bytes
  key = input_key(params, x, apply_kwargs)
  scanned = {s.layer for s in scans}
  steps: dict[Any, Any] = {}  # one compiled step per distinct program, timed together

  def predicted_seconds(plan: PolicyPlan) -> float:
    return sum(seconds_of(g) for g in plan.groups)

  def measured(program: Any, fn: Any) -> int:
    loss = training_loss(fn, apply_kwargs)
    if target:
      return jaxremat.measure(loss, params, x, target=target).total_bytes
    footprint, steps[program] = compile_step(jax.grad(loss), params, x)
    return footprint.total_bytes

  layers = traced.layers
  fixed_plans = {  # a scanned stack's "nothing": each block under jax.checkpoint in the scan
      "nothing": per_layer(n, lambda i: Option(KEEP if i in scanned else RECOMPUTE)),
      "dots": per_layer(n, lambda i: Option(DOTS)),
      "dots-no-batch": per_layer(n, lambda i: Option(DOTS_NO_BATCH)),
  }
  if any(_products(layer, _QKV) for layer in layers):
    fixed_plans["save-qkv"] = per_layer(n, lambda i: names_or_recompute(
        _products(layers[i], _QKV)))
    fixed_plans["save-attention-dots"] = per_layer(n, lambda i: names_or_recompute(
        _products(layers[i], inside="attention")))
  if options.roofline.host_bytes_per_second:  # a GPU target, or a local GPU
    fixed_plans["offload"] = per_layer(n, lambda i: Option(
        NAMES, offloaded=_products(layers[i])) if _products(layers[i]) else Option(RECOMPUTE))
  base_bytes = measured("no remat", model.apply)
  if not target:  # the same program compiled and timed twice: the timing's noise
    measured("no remat, again", model.apply)
  strategies: dict[str, dict[str, Any]] = {}
  for label, plan in fixed_plans.items():
    fn = policy_drop_in(model.apply, plan, None, written, scans, key,
                        per_iteration=label == "nothing")
    strategies[label] = {"bytes": measured(plan, fn), "program": plan,
                         "predicted_s": predicted_seconds(plan)}
  rows = []
  for share in BUDGETS:
    budget = int(fixed + share * (base_bytes - fixed))
    row = {"model": name, "layers": n, "share": share, "budget_bytes": budget,
           "fixed_bytes": fixed, "no_remat_bytes": base_bytes,
           "strategies": {k: dict(v) for k, v in strategies.items()}}
    start = time.perf_counter()
    try:
      fitted = jaxremat.fit(model.apply, params, x, share, target=target, **apply_kwargs)
      fit_s = round(time.perf_counter() - start, 2)
      row["strategies"]["fit"] = {
          "bytes": measured(fitted.plan, fitted.fn), "program": fitted.plan,
          "predicted_s": fitted.predicted_seconds,
          "predicted_bytes": fitted.predicted_total_bytes, "compiles": len(fitted.compiled),
          "fit_s": fit_s, "plan": fitted.plan.describe(),
          "timed_by_fit": [list(t) for t in fitted.timed]}
    except jaxremat.InfeasibleBudgetError as err:
      row["strategies"]["fit"] = {"infeasible": str(err)}
    if target:  # XLA's auto-remat, told the device has exactly the budget (deviceless)
      limited = auto_remat_target(target, budget)
      footprint = jaxremat.measure(training_loss(model.apply, apply_kwargs), params, x,
                                   target=limited).total_bytes
      row["strategies"]["xla auto-remat"] = {"bytes": footprint, "predicted_s": float("nan")}
    try:
      r = jaxremat.apply(model.apply, params, x, budget_bytes=budget, target=target,
                         **apply_kwargs)
      program = ("layer budget", r.plan.checkpoints)
      row["strategies"]["layer budget"] = {
          "bytes": measured(program, r.fn), "program": program,
          "predicted_s": predicted_seconds(from_plan(r.plan.checkpoints, n)),
          "checkpoints": list(r.plan.checkpoints)}
    except jaxremat.InfeasibleBudgetError as err:
      row["strategies"]["layer budget"] = {"infeasible": str(err)}
    rows.append(row)
  # Every distinct program's step timed in turns with the others (on the local backend).
  programs = list(steps)
  seconds = dict(zip(programs, best_step_seconds([steps[p] for p in programs], (params, x),
                                                 rounds=rounds))) if steps else {}
  for row in rows:
    row["no_remat_step_s"] = seconds.get("no remat")
    row["no_remat_again_step_s"] = seconds.get("no remat, again")
    for s in row["strategies"].values():
      if "infeasible" not in s:
        s["step_s"] = seconds.get(s.pop("program", None))
    print(markdown([row]).splitlines()[-1], flush=True)
  return rows


ORDER = ("fit", "layer budget", "nothing", "dots", "dots-no-batch", "save-qkv",
         "save-attention-dots", "offload", "xla auto-remat")


def markdown(rows: list[dict]) -> str:
  """Per model and budget: each strategy's XLA footprint (MiB), predicted recompute time
  and measured step time (ms), ``over`` where it does not fit; which fitting strategy is
  least by predicted recompute time and by measured step time."""
  head = ("| model | budget | no remat MiB / step ms | " + " | ".join(ORDER)
          + " | least predicted | least measured | fit / fastest | same step twice |")
  lines = [head, "|" + "---|" * (len(ORDER) + 7)]
  for row in rows:
    cells, predicted, measured = [], {}, {}
    for key in ORDER:
      s = row["strategies"].get(key)
      if s is None or "infeasible" in s:
        cells.append("n/a" if s is None else "infeasible")
        continue
      fits = s["bytes"] <= row["budget_bytes"]
      if fits and s["predicted_s"] == s["predicted_s"]:  # not NaN: XLA's remat has no estimate
        predicted[key] = s["predicted_s"]
        if s["step_s"] is not None:
          measured[key] = s["step_s"]
      step = f" / {s['step_s'] * 1e3:.1f}" if s["step_s"] is not None else ""
      cost = f" ({s['predicted_s'] * 1e3:.2f}{step})" if s["predicted_s"] == s["predicted_s"] else ""
      cells.append(f"{s['bytes'] / 2**20:.2f}{cost}"
                   + ("" if fits else " over"))
    least = [min(d, key=d.get) if d else "-" for d in (predicted, measured)]
    base = row["no_remat_step_s"]
    ratio = f"{measured['fit'] / min(measured.values()):.3f}" if "fit" in measured else "-"
    noise = f"{_noise(row):+.1%}" if _noise(row) is not None else "-"
    lines.append(
        f"| {row['model']} | {row['share']:.0%} = {row['budget_bytes'] / 2**20:.2f} MiB | "
        f"{row['no_remat_bytes'] / 2**20:.2f}"
        + (f" / {base * 1e3:.1f}" if base is not None else "") + " | "
        + " | ".join(cells) + f" | {least[0]} | {least[1]} | {ratio} | {noise} |")
  return "\n".join(lines)


def _noise(row: dict) -> float | None:
  """The no-remat step's second compile's time over its first's, less one."""
  a, b = row.get("no_remat_step_s"), row.get("no_remat_again_step_s")
  return b / a - 1 if a and b else None


def summary(rows: list[dict]) -> str:
  """Counts over the rows: where some strategy fits, where fit fits, where it is least
  by predicted time and by measured step time (strictly, within 2% and 5%)."""
  fitting = [r for r in rows if any("bytes" in s and s["bytes"] <= r["budget_bytes"]
                                    for s in r["strategies"].values())]
  fit = [r for r in fitting if r["strategies"]["fit"].get("bytes", 1 << 62) <= r["budget_bytes"]]

  def best(row: dict, key: str) -> float:
    return min(s[key] for s in row["strategies"].values()
               if "bytes" in s and s["bytes"] <= row["budget_bytes"]
               and s.get(key) is not None and s[key] == s[key])

  lines = [f"- rows {len(rows)}; some strategy fits {len(fitting)}; fit fits {len(fit)}",
           f"- fit least predicted time: {sum(r['strategies']['fit']['predicted_s'] <= best(r, 'predicted_s') * (1 + 1e-9) for r in fit)} of {len(fit)}"]
  timed = [r for r in fit if r["strategies"]["fit"].get("step_s")]
  if timed:
    ratios = [r["strategies"]["fit"]["step_s"] / best(r, "step_s") for r in timed]
    noise = sorted(abs(_noise(r)) for r in timed if _noise(r) is not None)
    lines.append(f"- fit least measured step time: {sum(x <= 1 for x in ratios)} of {len(timed)}; "
                 f"within 2%: {sum(x <= 1.02 for x in ratios)}; within 5%: "
                 f"{sum(x <= 1.05 for x in ratios)}; worst {max(ratios):.3f}x")
    if noise:
      lines.append(f"- the same step compiled and timed twice differs by {noise[len(noise) // 2]:.1%} "
                   f"(median), {noise[-1]:.1%} at most")
  lines.append(time_model_error(rows))
  return "\n".join(lines)


def time_model_error(rows: list[dict]) -> str:
  """The time model against the measured step times, each timed strategy of a model once
  (the same strategy at several budgets is one program): its predicted step (the no-remat
  step as measured plus the predicted recompute and offload time) over its measured step,
  less one; beside it the plain step alone, and ``plain + a * recompute + b * (footprint
  - no-remat footprint)`` with ``a, b`` fitted by least squares on the other models
  (leave one model out)."""
  points = {}
  for row in rows:
    base = row.get("no_remat_step_s")
    for key, s in row["strategies"].items():
      predicted, step = s.get("predicted_s"), s.get("step_s")
      if base and step and predicted is not None and math.isfinite(predicted):
        points[(row["model"], key, s["bytes"], step)] = (
            row["model"], base, predicted, (s["bytes"] - row["no_remat_bytes"]) / 2**20, step)
  if not points:
    return "- time model: no timed programs"
  data = list(points.values())
  fitted = []
  for model in sorted({p[0] for p in data}):
    train = [p for p in data if p[0] != model]
    if not train:
      continue
    (a, b), *_ = np.linalg.lstsq(np.array([[p[2], p[3]] for p in train]),
                                 np.array([p[4] - p[1] for p in train]), rcond=None)
    fitted += [(base + a * rec + b * mib) / step - 1
               for m, base, rec, mib, step in data if m == model]

  def stats(errors: list[float]) -> str:
    values = sorted(abs(e) for e in errors)
    return f"mean |error| {sum(values) / len(values):.1%}, median {values[len(values) // 2]:.1%}"

  modelled = stats([(b + r) / t - 1 for _, b, r, _, t in data])
  lines = [f"- time model against {len(data)} measured steps: no-remat step + predicted "
           f"recompute and offload {modelled}; the no-remat step alone "
           f"{stats([b / t - 1 for _, b, _, _, t in data])}"]
  if fitted:
    lines.append(f"- fitted on the other models, no-remat step + a * recompute + b * footprint "
                 f"change (MiB): {stats(fitted)}")
  return "\n".join(lines)


def merge(paths: list[str], out: str) -> None:
  """One table from per-model runs (a GPU session runs each model in its own process); a
  model's rows in a later run replace its rows in earlier ones."""
  by_model: dict[str, list[dict]] = {}
  metas = []
  for path in paths:
    with open(path) as f:
      found = json.load(f)
    for name in {row["model"] for row in found["rows"]}:
      by_model.pop(name, None)
    for row in found["rows"]:
      by_model.setdefault(row["model"], []).append(row)
    metas.append(found["meta"])
  rows = [row for model_rows in by_model.values() for row in model_rows]
  table = markdown(rows) + "\n\n" + summary(rows)
  meta = {**metas[0], "command": "; ".join(dict.fromkeys(c for m in metas
                                                        for c in m["command"].split("; "))),
          "date": ", ".join(dict.fromkeys(m.get("date", "?") for m in metas)),
          "seconds": round(sum(m["seconds"] for m in metas), 1)}
  print(table)
  write_result(out, meta, rows, table)


def models(names: list[str] | None) -> list[tuple[str, Any, Any, Any, dict]]:
  found = []
  named_only = tagged("gpu") if names else ()  # GPU-sized: run only when named
  for spec in (*tagged("cpu"), *tagged("scan"), *named_only):
    if names is None or spec.name in names:
      model, x, params = spec.instantiate()
      found.append((spec.name, model, x, params, spec.apply_kwargs()))
  for name, (model, x) in {**unseen.models(), **GRAPHS}.items():
    short = name.split(" (")[0]
    if names is None or short in names:
      found.append((short, model, x, jax.jit(model.init)(jax.random.key(0), x), {}))
  return found


#: Models whose layers are a graph (skip tensors), planned by fit's graph DP.
GRAPHS = {
    "unet-16-32-64-b16": (UNet((16, 32, 64)), jax.random.normal(jax.random.key(3),
                                                               (16, 64, 64, 3))),
    "densenet-4x4-g16-b16": (DenseNet((4, 4), growth=16, stem=32),
                             jax.random.normal(jax.random.key(3), (16, 32, 32, 3))),
}


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", help="comma-separated model names (default: the CPU zoo, "
                      "bench/unseen.py's models and the graphs of GRAPHS; GPU-sized zoo "
                      "models when named)")
  parser.add_argument("--target", help="a GPU target to compile for deviceless (h100, a100)")
  parser.add_argument("--rounds", type=int, default=5,
                      help="rounds of timing, every program 3 runs a round (the least kept)")
  parser.add_argument("--out", default="bench/results/policies-cpu/policies.json")
  parser.add_argument("--merge", nargs="+", metavar="JSON",
                      help="write one table of these runs' rows to --out, nothing run")
  args = parser.parse_args(argv)
  if args.merge:
    merge(args.merge, args.out)
    return
  start = time.perf_counter()
  rows = []
  for name, model, x, params, kwargs in models(args.models.split(",") if args.models else None):
    rows += run_model(name, model, x, params, kwargs, args.target, args.rounds)
  table = markdown(rows) + "\n\n" + summary(rows)
  print(table)
  write_result(args.out, run_meta(time.perf_counter() - start, target=args.target), rows, table)


if __name__ == "__main__":
  main()
