"""The ``jaxremat`` command line: ``demo``, ``plan MODULE:ATTR``, ``fit MODULE:ATTR`` and
``bench``."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

import jaxremat
from jaxremat import _bench
from jaxremat._cli_model import model_inputs
from jaxremat._demo import DEMO_MODELS, format_demo, run_demo
from jaxremat._jaxpr.raised import asks_for_integers, flax_missing
from jaxremat.solvers import SOLVERS


def _budget_bytes(text: str) -> int:
  """``--budget``: whole bytes; a fraction (0.5) is refused, not read as 0 bytes."""
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"not a number of bytes: {text!r} (e.g. 2e9)") from None
  if 0 < value < 1:
    raise argparse.ArgumentTypeError(
        f"{text} is a fraction; the budget is in bytes (e.g. 2e9). For a fraction of the "
        f"activations: jaxremat fit MODULE:ATTR --batch-shape ... --budget {text}.")
  return int(value)


def _layer_depth(text: str) -> int | str:
  """``--layer-depth``: an int, or ``search``."""
  return text if text == "search" else int(text)


def _fit_budget(text: str) -> float:
  """``fit``'s ``--budget``: a share in (0, 1] of the activations, or bytes above 1."""
  try:
    return float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"not a number: {text!r} (e.g. 0.5 for half of the activations, or 2e9 bytes)") from None


def run_plan(spec: str, batch_shape: Sequence[int], dtype: str, method: str,
             budget_bytes: int | None, layer_depth: int | str | None = None,
             model_kwargs: dict[str, Any] | None = None, rngs: Sequence[str] = (),
             verify: bool | None = None,
             target: str | None = None) -> tuple[jaxremat.Remat, dict[str, Any]]:
  """Profiles and solves the model at ``spec`` for a batch of ``batch_shape``.

  The summary's ``layers`` give each layer's output, residual and input-residual bytes
  and FLOPs; for a model planned as a graph (``"graph": true``, a layer reads a value
  made two or more layers earlier) only its name, other residual bytes and FLOPs, as the
  values it passes on belong to cuts, not layers.
  """
  model, params, x, kwargs = model_inputs(spec, batch_shape, dtype, model_kwargs, rngs)
  r = jaxremat.apply(model.apply, params, x, method=method, budget_bytes=budget_bytes,
                     layer_depth=layer_depth, verify=verify, target=target, **kwargs)
  chain = r.chain
  if isinstance(chain, jaxremat.Chain):
    layers = [
        {"name": chain.names[i], "output_bytes": chain.act_bytes[i + 1],
         "residual_bytes": chain.res_bytes[i], "input_residual_bytes": chain.input_res_bytes[i],
         "flops": chain.flops[i]} for i in range(chain.n)]
  else:  # a graph: the values a layer passes on are counted per cut (r.report())
    layers = [{"name": chain.names[i], "residual_bytes": chain.res_bytes[i],
               "flops": chain.flops[i]} for i in range(chain.n)]
  summary = {
      "model": spec, "batch_shape": list(batch_shape), "dtype": dtype, "method": r.plan.method,
      "checkpoints": list(r.plan.checkpoints), "predicted_total_bytes": r.predicted_total_bytes,
      "fixed_bytes": r.fixed_bytes, "solve_seconds": r.solve_seconds, "graph": r.is_graph,
      "decomposition": r.decomposition, "measured_total_bytes": r.measured_total_bytes,
      "as_written_bytes": r.as_written_bytes,
      "compiled": [{"checkpoints": list(c), "measured_total_bytes": b}
                   for c, b in (r.verified or {}).items()],
      "layers": layers,
  }
  return r, summary


def run_fit(spec: str, batch_shape: Sequence[int], dtype: str, memory_budget: float,
            layer_depth: int | None = None, model_kwargs: dict[str, Any] | None = None,
            rngs: Sequence[str] = (), verify: bool = True, target: str | None = None,
            time_steps: bool = False) -> tuple[jaxremat.Fitted, dict[str, Any]]:
  """``jaxremat.fit`` of the model at ``spec`` for a batch of ``batch_shape``: abstract
  variables unless ``time_steps`` (which runs the plans that fit, on this machine)."""
  model, params, x, kwargs = model_inputs(spec, batch_shape, dtype, model_kwargs, rngs,
                                          concrete=time_steps, command="fit")
  f = jaxremat.fit(model.apply, params, x, memory_budget, layer_depth=layer_depth,
                   verify=verify, target=target, time_steps=time_steps, **kwargs)
  summary = {
      "model": spec, "batch_shape": list(batch_shape), "dtype": dtype,
      "memory_budget": memory_budget, "budget_bytes": f.budget_bytes,
      "plan": [{"layers": list(f.chain.names[c.group.start:c.group.stop]),
                "option": c.group.option.describe(), "stored_bytes": c.stored_bytes,
                "transient_bytes": c.transient_bytes, "roofline_seconds": c.seconds}
               for c in f.costs],
      "predicted_total_bytes": f.predicted_total_bytes,
      "measured_total_bytes": f.measured_total_bytes, "no_remat_bytes": f.no_remat_bytes,
      "fixed_bytes": f.fixed_bytes, "predicted_seconds": f.predicted_seconds,
      "compiled_bytes": list(f.compiled), "target": f.target,
      "timed": [{"plan": what, "measured_total_bytes": b, "step_seconds": t}
                for what, b, t in f.timed],
      "frontier": [{"bytes": b, "roofline_seconds": t} for b, t in f.frontier],
  }
  return f, summary


def _bench_command(args: argparse.Namespace) -> int:
  if args.models:
    names = [m.strip() for m in args.models.split(",") if m.strip()]
  else:
    names = list(_bench.QUICK_MODELS if args.quick else _bench.MODELS)
  unknown = [m for m in names if m not in _bench.MODELS]
  if unknown:
    print(f"jaxremat bench: unknown models {unknown}; choose from {', '.join(_bench.MODELS)}",
          file=sys.stderr)
    return 2
  start = time.perf_counter()

  def progress(line: str) -> None:
    print(f"[bench {time.perf_counter() - start:6.1f} s] {line}", file=sys.stderr, flush=True)

  result = _bench.run(names, quick=args.quick, progress=progress)
  table = _bench.to_markdown(result["rows"])
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    meta = result["meta"]
    name = f"bench-{meta['backend']}-{meta['date']}{'-quick' if args.quick else ''}"
    stem = os.path.join(args.out, name)
    with open(stem + ".json", "w") as f:
      json.dump({**result, "table": table}, f, indent=1)
    with open(stem + ".md", "w") as f:
      f.write(f"# jaxremat bench{' --quick' if args.quick else ''}, {meta['date']}\n\n"
              f"{meta['backend']} ({meta['device']}, {meta['machine']}), jax "
              f"{meta['versions']['jax']}, flax {meta['versions']['flax']}\n\n{table}\n")
    print(f"jaxremat bench: wrote {stem}.json and {stem}.md", file=sys.stderr)
  print(json.dumps(result, indent=1) if args.json else table)
  return 0


def _as_flags(message: str) -> str:
  """Keyword arguments in a message (``layer_depth=N``, ``budget_bytes``,
  ``memory_budget``, ``time_steps=True``, ``verify=False``, apply's ``verify=True``, the
  batch's shape) as the commands' flags."""
  message = re.sub(r"\blayer_depth='?(\d+|search)'?", r"--layer-depth \1", message)
  message = re.sub(r"\b(budget_bytes|memory_budget)(=| )", lambda m: "--budget ", message)
  message = re.sub(  # BatchAxisWarning's fix, for --batch-shape
      r"If the batch's \(([\d, ]+)\) is one example, pass a batch of them: shape \(N, [\d, ]+\)",
      lambda m: (f"If {m[1].replace(' ', '').rstrip(',')} is one example, give the batch too: "
                 f"--batch-shape N,{m[1].replace(' ', '').rstrip(',')}"), message)
  for keyword, flag in (("layer_depth=", "--layer-depth "), ("time_steps=True", "--time-steps"),
                        ("verify=False", "--no-verify"),
                        ("jaxremat.apply(..., verify=True) (apply_nnx for an nnx module)",
                         "jaxremat plan --verify")):
    message = message.replace(keyword, flag)
  return message


def _batch_shape(text: str) -> list[int]:
  """``--batch-shape``: comma-separated positive ints."""
  try:
    shape = [int(d) for d in text.split(",") if d.strip()]
  except ValueError:
    shape = []
  if not shape or min(shape) < 1:
    raise argparse.ArgumentTypeError(
        f"not a shape: {text!r}; expected comma-separated sizes, batch first (e.g. 32,32,32,3)")
  return shape


def _print_warnings(command: str, caught: list[warnings.WarningMessage]) -> None:
  """Each warning once: jaxremat's in the CLI's words (``--layer-depth N``, not
  ``layer_depth=N``), others (a library's deprecations) as they are."""
  seen: set[tuple[type[Warning], str]] = set()
  for w in caught:
    if (w.category, str(w.message)) in seen:
      continue
    seen.add((w.category, str(w.message)))
    if w.category.__module__.startswith("jaxremat") or str(w.message).startswith("jaxremat"):
      message = str(w.message).removeprefix("jaxremat: ")
      print(f"jaxremat {command}: {w.category.__name__}: {_as_flags(message)}",
            file=sys.stderr)
    else:
      print(f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}", file=sys.stderr)


def _flag_hint(err: Exception, dtype: str) -> str:
  """flax's errors of a call missing its arguments (``flax_missing``) or of float inputs
  where it takes integers (``nn.Embed``'s token ids), in the CLI's flags."""
  missing = flax_missing(err)
  if missing is None:
    try:
      floats = jnp.issubdtype(jnp.dtype(dtype), jnp.floating)
    except TypeError:  # not a dtype: the model's error stands alone
      return ""
    return ("It takes integer inputs (token ids, as nn.Embed does): --dtype int32."
            if floats and asks_for_integers(err) else "")
  keyword, name = missing
  if keyword == "rngs":
    return f"Name its rng stream: --rngs {name}."
  return f"""Make the collection mutable: --model-kwargs '{{"mutable": ["{name}"]}}'."""


def _model_command(args: argparse.Namespace) -> int:
  """``jaxremat plan`` and ``jaxremat fit``: the report (or ``--json``), errors in flags."""
  shape = args.batch_shape
  try:
    model_kwargs = json.loads(args.model_kwargs)
  except json.JSONDecodeError as err:
    print(f"jaxremat {args.command}: --model-kwargs is not JSON ({err}): "
          f"{args.model_kwargs!r}", file=sys.stderr)
    return 2
  rngs = [n for n in args.rngs.split(",") if n]
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      result: jaxremat.Remat | jaxremat.Fitted
      if args.command == "plan":
        result, summary = run_plan(args.model, shape, args.dtype, args.method, args.budget,
                                   layer_depth=args.layer_depth, model_kwargs=model_kwargs,
                                   rngs=rngs, verify=True if args.verify else None,
                                   target=args.target)
      else:
        result, summary = run_fit(args.model, shape, args.dtype, args.budget,
                                  layer_depth=args.layer_depth, model_kwargs=model_kwargs,
                                  rngs=rngs, verify=not args.no_verify, target=args.target,
                                  time_steps=args.time_steps)
  except jaxremat.JaxrematError as err:
    print(f"jaxremat {args.command}: {type(err).__name__}: {_as_flags(str(err))}",
          file=sys.stderr)
    return 2
  except Exception as err:  # the model's own: flax's two of a call missing its arguments
    hint = _flag_hint(err, args.dtype)
    first = (str(err).splitlines() or [""])[0]
    if not hint:  # the model's traceback follows, for its own bugs
      print(f"jaxremat {args.command}: the model raised {type(err).__name__} ({first}) on "
            f"a random batch of shape ({','.join(map(str, shape))}) and dtype {args.dtype}: "
            "is --batch-shape the batch's, batch axis first, and --dtype the inputs'? The "
            "command feeds the model one array; a model taking a dict or tuple batch is "
            "planned from Python (jaxremat.apply(model.apply, variables, batch)).",
            file=sys.stderr)
      raise
    print(f"jaxremat {args.command}: the model raised {type(err).__name__}: {first} {hint}",
          file=sys.stderr)
    return 2
  _print_warnings(args.command, caught)
  print(json.dumps(summary, indent=2) if args.json else _as_flags(result.report()))
  if getattr(args, "plot", None):
    assert isinstance(result, jaxremat.Fitted)
    try:
      result.plot_frontier(args.plot)
    except ImportError as err:
      print(f"jaxremat fit: {err}", file=sys.stderr)
      return 2
    print(f"jaxremat fit: drew the frontier to {args.plot}", file=sys.stderr)
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="jaxremat", description=jaxremat.__doc__)
  sub = parser.add_subparsers(dest="command", required=True)
  demo = sub.add_parser("demo", help="profile, solve, emit and measure a built-in conv net")
  demo.add_argument("--model", default="all-conv", choices=DEMO_MODELS)
  demo.add_argument("--width", type=float, default=0.25, help="VGG channel multiplier")
  demo.add_argument("--batch", type=int, default=32)
  demo.add_argument("--image-size", type=int, default=32)
  demo.add_argument("--json", action="store_true", help="print the result as JSON")
  model_args = argparse.ArgumentParser(add_help=False)  # the model: plan's and fit's
  model_args.add_argument("model", help="MODULE:ATTR, a flax.linen Module or a callable "
                          "returning one")
  model_args.add_argument("--batch-shape", required=True, type=_batch_shape,
                          help="comma-separated input shape, batch first (e.g. 32,32,32,3)")
  model_args.add_argument("--dtype", default="float32",
                          help="the random batch's dtype (int32 for token ids; default float32)")
  model_args.add_argument("--model-kwargs", default="{}",
                          help='JSON keyword arguments for model.apply, e.g. \'{"train": true}\'')
  model_args.add_argument("--rngs", default="",
                          help="comma-separated rng stream names the model needs, e.g. dropout")
  model_args.add_argument("--target", help="plan for this GPU from any machine: h100, h200, "
                          "a100 or a target-config file (needs JAX's CUDA plugin and "
                          "JAX_PLATFORMS=cpu)")
  model_args.add_argument("--json", action="store_true", help="print the plan as JSON")
  plan = sub.add_parser("plan", parents=[model_args],
                        help="profile a Flax model by import path and print its plan")
  plan.add_argument("--method", default="optimal", choices=sorted(SOLVERS),
                    help="the solver (default: optimal, model R's optimum refined against "
                    "XLA's footprint); with --budget, the budget solver is used")
  plan.add_argument("--budget", type=_budget_bytes, default=None,
                    help="whole-step budget in bytes (e.g. 2e9)")
  plan.add_argument("--layer-depth", type=_layer_depth, default=None,
                    help="name-stack depth of a layer (default: found automatically, the "
                    "root module's children split where they are large), or 'search': "
                    "also plan one and two levels below and keep what XLA measures least")
  plan.add_argument("--verify", action="store_true",
                    help="compile the leading candidate plans and keep XLA's smallest")
  fit = sub.add_parser("fit", parents=[model_args],
                       help="the fastest plan, per residual, whose step fits a memory budget")
  fit.add_argument("--budget", type=_fit_budget, required=True,
                   help="a share in (0, 1] of the activations (0.5: half of them) or the "
                   "whole step's bytes (e.g. 2e9)")
  fit.add_argument("--layer-depth", type=int, default=None,
                   help="name-stack depth of a layer (default: found automatically)")
  fit.add_argument("--no-verify", action="store_true",
                   help="the prediction alone: compile nothing")
  fit.add_argument("--plot", metavar="PATH", help="also draw the memory-versus-time "
                   "frontier to PATH (.png, .svg, .pdf; needs matplotlib)")
  fit.add_argument("--time-steps", action="store_true",
                   help="initialise the model, run the plans that fit on this machine and "
                   "return the fastest measured")
  bench = sub.add_parser("bench", help="measure every strategy on zoo models with XLA (slow)")
  bench.add_argument("--models", help="comma-separated, from: " + ", ".join(_bench.MODELS)
                     + f" (default: all; with --quick: {','.join(_bench.QUICK_MODELS)})")
  bench.add_argument("--quick", action="store_true",
                     help="small inputs, no sweep of every checkpoint-every-k plan")
  bench.add_argument("--json", action="store_true", help="print the rows as JSON")
  bench.add_argument("--out", help="directory to write bench-<backend>-<date>[-quick].json and .md to")
  args = parser.parse_args(argv)
  if args.command == "bench":
    return _bench_command(args)
  if args.command in ("plan", "fit"):
    return _model_command(args)
  if args.command == "demo":
    result = run_demo(args.model, args.width, args.batch, args.image_size)
    print(json.dumps(result, indent=2) if args.json else format_demo(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
