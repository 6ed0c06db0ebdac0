"""Memory benchmark: XLA-compiled footprint and recompute of each remat strategy on the zoo.

    PYTHONPATH=. python bench/memory.py [--quick] [--models a,b] [--strategies x,y]
        [--out bench/results/memory-cpu/memory.json] [--plots docs/img]
    PYTHONPATH=. python bench/memory.py --replot bench/results/memory-cpu/memory.json --plots docs/img

For each zoo model (``MODELS``, CPU-sized) and strategy (``STRATEGIES``) it records
jaxremat's predicted footprint where it makes one (``predicted_total_bytes``), XLA's
compiled footprint of the gradient step (argument + output + temp - alias, with the
optimization barriers kept on CPU; ``jaxremat.measure``) and the recomputed FLOPs: the
compiled step's cost-analysis FLOPs minus those of the step without remat.
``DEFAULT_STRATEGIES`` is every strategy but ``apply-verify`` (name it in --strategies).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

import jaxremat
from jaxremat import zoo
from jaxremat._api.loss import training_loss
from jaxremat.solvers import uniform_plan
from jaxremat.zoo_registry import BenchModel, tagged

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: its record module
from record import run_meta, write_result  # noqa: E402

#: The benchmark's models: the registry's CPU zoo, sizes that compile in seconds on 2 CPU cores.
MODELS: tuple[BenchModel, ...] = tagged("cpu")


@dataclasses.dataclass
class Context:
  """One model, initialised, with what the strategies share."""

  model: nn.Sequential
  params: Any
  x: Any
  kwargs: dict
  base: jaxremat.Remat  # apply() with its defaults: jaxremat's optimal plan
  none_bytes: int = 0  # XLA footprint without remat
  uniform_candidates: int = 3

  def measure(self, fn: Callable[..., Any]) -> jaxremat.Footprint:
    return jaxremat.measure(training_loss(fn, self.kwargs), self.params, self.x)

  def plan_fn(self, plan: jaxremat.Plan) -> Callable[..., Any]:
    return jaxremat.apply(self.model.apply, self.params, self.x, plan=plan, **self.kwargs).fn


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What a strategy produced: the function to measure and what is known of it."""

  fn: Callable[..., Any] | None
  plan: jaxremat.Plan | None = None
  predicted_bytes: int | None = None
  note: str = ""
  measured: jaxremat.Footprint | None = None  # when the strategy measured it already


def _plan(method: str) -> Callable[[Context], Outcome]:
  def run(ctx: Context) -> Outcome:
    plan = jaxremat.solve(ctx.base.chain, method)
    return Outcome(ctx.plan_fn(plan), plan, ctx.base.predict_total_bytes(plan))
  return run


def _none(ctx: Context) -> Outcome:
  plan = jaxremat.Plan(())
  return Outcome(ctx.model.apply, plan, ctx.base.predict_total_bytes(plan))


def _best_uniform(ctx: Context) -> Outcome:
  """The checkpoint-every-k plan XLA measures smallest, over a few k: the three best by
  jaxremat's estimate and, for more candidates, k spread geometrically over 1..n-1."""
  n = ctx.base.chain.n
  ks = range(1, n)
  if n - 1 > ctx.uniform_candidates:
    by_estimate = sorted(ks, key=lambda k: ctx.base.predict_total_bytes(uniform_plan(n, k)))
    m = ctx.uniform_candidates - 3
    spread = {round((n - 1) ** (t / (m - 1))) for t in range(m)} if m >= 2 else set()
    ks = sorted({*by_estimate[:min(3, ctx.uniform_candidates)], *spread} & set(ks))
  tried = {}
  for k in ks:
    plan = uniform_plan(n, k)
    fn = ctx.plan_fn(plan)
    tried[k] = (ctx.measure(fn), plan, fn)
  k = min(tried, key=lambda k: (tried[k][0].total_bytes, -k))
  measured, plan, fn = tried[k]
  return Outcome(fn, plan, ctx.base.predict_total_bytes(plan), note=f"k={k} of {sorted(tried)}",
                 measured=measured)


def _jax_policy(policy) -> Callable[[Context], Outcome]:
  def run(ctx: Context) -> Outcome:
    whole = jax.checkpoint(lambda p, x: ctx.model.apply(p, x, **ctx.kwargs), policy=policy)
    return Outcome(lambda p, x, **_: whole(p, x))
  return run


def _flax_remat(ctx: Context) -> Outcome:
  return Outcome(zoo.remat_layers(ctx.model).apply)


def _apply(ctx: Context) -> Outcome:
  return Outcome(ctx.base.fn, ctx.base.plan, ctx.base.predicted_total_bytes)


def _apply_verify(ctx: Context) -> Outcome:
  r = jaxremat.apply(ctx.model.apply, ctx.params, ctx.x, verify=True, **ctx.kwargs)
  return Outcome(r.fn, r.plan, r.predicted_total_bytes, note=f"{len(r.verified)} plans compiled")


def _budget(fraction: float) -> Callable[[Context], Outcome]:
  """``apply(budget_bytes=...)``: fixed bytes plus ``fraction`` of no-remat's activations
  (XLA's footprint without remat less parameters, batch and gradients)."""
  def run(ctx: Context) -> Outcome:
    fixed = ctx.base.fixed_bytes
    budget = int(fixed + fraction * (ctx.none_bytes - fixed))
    try:
      r = jaxremat.apply(ctx.model.apply, ctx.params, ctx.x, budget_bytes=budget, **ctx.kwargs)
    except jaxremat.InfeasibleBudgetError as err:
      return Outcome(None, note=f"budget {budget} B infeasible: least {err.min_feasible_bytes} B")
    return Outcome(r.fn, r.plan, r.predicted_total_bytes,
                   note=f"budget {budget} B, {len(r.verified or ())} plans compiled")
  return run


#: name -> (description, how to build it). "none" runs first: the others are relative to it.
STRATEGIES: dict[str, tuple[str, Callable[[Context], Outcome]]] = {
    "none": ("no remat (the model as written)", _none),
    "every-layer": ("every layer its own rematerialised segment", _plan("every-layer")),
    "sqrt": ("Chen et al. 2016: segments of ceil(sqrt(n)) layers", _plan("sqrt")),
    "best-uniform": ("checkpoint every k layers, k XLA measures best among a few", _best_uniform),
    "jax-nothing-saveable": ("jax.checkpoint(model, policy=nothing_saveable)",
                             _jax_policy(jax.checkpoint_policies.nothing_saveable)),
    "jax-dots-saveable": ("jax.checkpoint(model, policy=dots_saveable)",
                          _jax_policy(jax.checkpoint_policies.dots_saveable)),
    "flax-remat-layers": ("nn.remat on every layer of the Sequential", _flax_remat),
    "model-a-dp": ("Hong et al.'s model A optimum: solve(chain, 'dp')", _plan("dp")),
    "apply": ("jaxremat.apply: model R optimum, refined on the estimate", _apply),
    "apply-verify": ("jaxremat.apply(verify=True): the candidate XLA measures least",
                     _apply_verify),
    "budget-75%": ("apply(budget_bytes=fixed + 75% of no-remat activations)", _budget(0.75)),
    "budget-50%": ("apply(budget_bytes=fixed + 50% of no-remat activations)", _budget(0.5)),
}

#: Strategies run unless --strategies says otherwise (apply-verify costs 4-10 compiles more).
DEFAULT_STRATEGIES = tuple(s for s in STRATEGIES if s != "apply-verify")

#: Single-level strategies that minimise memory (item compared in docs/memory-model.md).
MEMORY_STRATEGIES = ("every-layer", "sqrt", "best-uniform", "jax-nothing-saveable",
                     "jax-dots-saveable", "flax-remat-layers", "model-a-dp", "apply")


def bench_model(spec: BenchModel, strategies: list[str], uniform_candidates: int) -> list[dict]:
  """Measures every strategy on one model; returns one row per strategy."""
  model, x, params = spec.instantiate()
  start = time.perf_counter()
  kwargs = spec.apply_kwargs()
  base = jaxremat.apply(model.apply, params, x, **kwargs)
  _log(f"  {spec.name}: {base.chain.n} layers, apply took {time.perf_counter() - start:.1f} s")
  ctx = Context(model, params, x, kwargs, base, uniform_candidates=uniform_candidates)
  none = ctx.measure(model.apply)
  ctx.none_bytes = none.total_bytes
  rows = []
  for name in strategies:
    start = time.perf_counter()
    out = STRATEGIES[name][1](ctx)
    measured = out.measured or (ctx.measure(out.fn) if out.fn is not None else None)
    if name == "none":
      measured = none
    rows.append({
        "model": spec.name, "strategy": name, "layers": base.chain.n,
        "checkpoints": list(out.plan.checkpoints) if out.plan is not None else None,
        "predicted_bytes": out.predicted_bytes,
        "measured_bytes": measured.total_bytes if measured else None,
        "measured_parts": ([measured.argument_bytes, measured.output_bytes, measured.temp_bytes,
                            measured.alias_bytes] if measured else None),
        "xla_flops": measured.flops if measured else None,
        "recompute_flops": measured.flops - none.flops if measured else None,
        "none_flops": none.flops, "fixed_bytes": base.fixed_bytes, "note": out.note,
    })
    _log(f"    {name:<22} {_mib(rows[-1]['measured_bytes']):>9} MiB  "
         f"({time.perf_counter() - start:.1f} s) {out.note}")
  return rows


def _log(text: str) -> None:
  print(text, file=sys.stderr, flush=True)


def _mib(num_bytes: int | None) -> str:
  return "-" if num_bytes is None else f"{num_bytes / 2**20:.2f}"


def to_markdown(rows: list[dict]) -> str:
  """One line per (model, strategy); ``vs none`` and recompute are against no remat."""
  lines = ["| model | strategy | checkpoints | predicted MiB | XLA MiB | error | vs none "
           "| recompute GFLOP | recompute % |",
           "|---|---|---|---|---|---|---|---|---|"]
  none = {r["model"]: r for r in rows if r["strategy"] == "none"}
  for r in rows:
    base = none.get(r["model"])
    got, want = r["measured_bytes"], r["predicted_bytes"]
    err = f"{100 * (want - got) / got:+.1f}%" if got and want else "-"
    rel = f"{100 * got / base['measured_bytes']:.0f}%" if got and base else "-"
    flops = r["recompute_flops"]
    rec = f"{flops / 1e9:.3f}" if flops is not None else "-"
    pct = f"{100 * flops / r['none_flops']:.0f}%" if flops is not None and r["none_flops"] else "-"
    kept = len(r["checkpoints"]) if r["checkpoints"] is not None else "-"
    lines.append(f"| {r['model']} | {r['strategy']} | {kept} | {_mib(want)} | {_mib(got)} | {err} "
                 f"| {rel} | {rec} | {pct} |")
  return "\n".join(lines)


def plot(rows: list[dict], out_dir: str, suffix: str = "cpu") -> list[str]:
  """Grouped bars of memory per strategy per model, and memory against recompute FLOPs."""
  import matplotlib  # optional dependency: only the plots need it
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = list(dict.fromkeys(r["model"] for r in rows))
  strategies = [s for s in dict.fromkeys(r["strategy"] for r in rows)]
  none = {r["model"]: r for r in rows if r["strategy"] == "none"}
  cell = {(r["model"], r["strategy"]): r for r in rows if r["measured_bytes"]}
  colors = plt.get_cmap("tab20")(range(len(strategies)))
  os.makedirs(out_dir, exist_ok=True)

  fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(names)), 4.8))
  width = 0.85 / len(strategies)
  for k, s in enumerate(strategies):
    xs = [i + (k - len(strategies) / 2) * width for i, m in enumerate(names) if (m, s) in cell]
    ys = [100 * cell[m, s]["measured_bytes"] / none[m]["measured_bytes"]
          for m in names if (m, s) in cell]
    ax.bar(xs, ys, width, label=s, color=colors[k], align="edge")
  ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=8)
  ax.set_ylabel("XLA footprint of the gradient step (% of no remat)")
  ax.axhline(100, color="gray", lw=0.8)
  ax.set_ylim(0, 145)  # room for the legend above the bars
  ax.legend(fontsize=7, ncol=6, loc="upper center")
  ax.set_title(f"Memory per strategy ({suffix}, XLA compiled statistics)")
  fig.tight_layout()
  bars = os.path.join(out_dir, f"memory-strategies-{suffix}.png")
  fig.savefig(bars, dpi=120)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(7.5, 5))
  markers = "os^vD<>pP*Xh"
  for k, s in enumerate(strategies):
    pts = [(100 * cell[m, s]["recompute_flops"] / none[m]["none_flops"],
            100 * cell[m, s]["measured_bytes"] / none[m]["measured_bytes"])
           for m in names if (m, s) in cell and none[m]["none_flops"]]
    if pts:
      ax.scatter(*zip(*pts), label=s, color=colors[k], marker=markers[k % len(markers)], s=28)
  ax.set_xlabel("recomputed FLOPs (% of the no-remat gradient step)")
  ax.set_ylabel("XLA footprint (% of no remat)")
  ax.set_title(f"Memory against recompute, every model ({suffix})")
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  scatter = os.path.join(out_dir, f"memory-vs-recompute-{suffix}.png")
  fig.savefig(scatter, dpi=120)
  plt.close(fig)
  return [bars, scatter]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", help="JSON path; the markdown table goes beside it (.md)")
  parser.add_argument("--quick", action="store_true", help="only the models marked quick")
  parser.add_argument("--models",
                      help=f"comma-separated subset of: {', '.join(m.name for m in MODELS)}")
  parser.add_argument("--only", help=argparse.SUPPRESS)  # the former one-model flag
  names = ", ".join(STRATEGIES).replace("%", "%%")  # argparse %-formats help strings
  parser.add_argument("--strategies", help=f"comma-separated subset of: {names}")
  parser.add_argument("--uniform-candidates", type=int, default=3,
                      help="k compiled for best-uniform: the 3 best by the estimate, and above 4 "
                           "also k spread over 1..n-1 (default 3)")
  parser.add_argument("--plots", help="directory for the PNG plots (needs matplotlib)")
  parser.add_argument("--replot", help="plot the rows of this JSON instead of measuring")
  args = parser.parse_args()
  if args.replot:
    with open(args.replot) as f:
      rows = json.load(f)["rows"]
    print("\n".join(plot(rows, args.plots or "docs/img")))
    return 0
  wanted = (args.models or args.only or "").split(",")
  by_name = {m.name: m for m in MODELS}
  chosen = ([by_name[w] for w in wanted if w in by_name] if wanted != [""]
            else [m for m in MODELS if "cpu-quick" in m.tags or not args.quick])
  unknown = set(wanted) - {m.name for m in MODELS} - {""}
  strategies = (args.strategies.split(",") if args.strategies else list(DEFAULT_STRATEGIES))
  unknown |= set(strategies) - set(STRATEGIES)
  if unknown:
    parser.error(f"unknown model or strategy names: {sorted(unknown)}")
  strategies = ["none", *[s for s in strategies if s != "none"]]
  rows: list[dict] = []
  start = time.perf_counter()
  for k, spec in enumerate(chosen):
    _log(f"[{k + 1}/{len(chosen)}] {spec.name} ({time.perf_counter() - start:.0f} s so far)")
    rows += bench_model(spec, strategies, args.uniform_candidates)
    if args.out:  # after every model, so that a cut-short run keeps what it measured
      _write(args.out, rows, strategies, time.perf_counter() - start, done=k + 1 == len(chosen))
  print(to_markdown(rows))
  if args.plots:
    _log("plots: " + ", ".join(plot(rows, args.plots)))
  return 0


def _write(path: str, rows: list[dict], strategies: list[str], seconds: float, done: bool) -> None:
  """The JSON (rows, table, device, versions, command) and the markdown table beside it."""
  meta = run_meta(seconds, complete=done, strategies={s: STRATEGIES[s][0] for s in strategies})
  write_result(path, meta, rows, to_markdown(rows) + ("" if done else "\n(cut short)"))

if __name__ == "__main__":
  sys.exit(main())
