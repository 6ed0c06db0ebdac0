"""Flax models this project has never seen: apply's plan against every uniform plan.

    PYTHONPATH=. python bench/unseen.py [--out bench/results/unseen-cpu/unseen.json]
    JAX_PLATFORMS=cpu PYTHONPATH=. python bench/unseen.py --target h100 \
        --out bench/results/unseen-h100-aot/unseen.json   # needs jaxremat[cuda12-aot]
    PYTHONPATH=. python bench/unseen.py --set zoo [--target h100] \
        --out bench/results/zoo-least-cpu/zoo-least.json  # the CPU zoo instead (same table)
    PYTHONPATH=. python bench/unseen.py --set realworld ...  # Flax-style transformers, dropout
    PYTHONPATH=. python bench/unseen.py --set recurrent ...  # RNNs over time (nn.RNN)
    PYTHONPATH=. python bench/unseen.py --compiled-only EARLIER.json ...  # that column again
    PYTHONPATH=. python bench/unseen.py --apply-only EARLIER.json ...  # both apply columns again

For each model (defined here, not in the zoo; the first three are issue 21's holdout,
written after every rule): ``jaxremat.apply`` with its defaults and ``profile="jaxpr"``
(the estimate), and again with ``profile="compiled"`` (the replay of the compiled plain
step), XLA's footprint of each one's gradient step against its prediction, the footprint of every checkpoint-every-k plan
(k = 1..n) and of ``apply(verify=True)``'s plan, how far the default plan is above the
least of those, and (CPU) the largest relative gradient difference from the plain model,
beside the noise floor: the same difference for the whole model under one ``jax.checkpoint``
(floating-point reassociation alone; a gradient that is zero in exact arithmetic, such as
attention's key bias, differs by its whole size).
With ``--target``, every compile is XLA's GPU compiler's for that GPU, deviceless.
``--set zoo`` runs the CPU zoo of ``bench/memory.py`` (``zoo_registry.tagged("cpu")``,
with their ``apply`` kwargs) through the same comparison, ``--set realworld`` the linen
models of ``bench/out_of_box.py`` (``tests/realworld_models.py`` at size ``bench``: the
ViT, lm1b and a wmt-like encoder-decoder with dropout, the ResNet with BatchNorm), ``--set
recurrent`` three RNNs over time (``recurrent_models``). The table gives ``apply``'s wall time
(its confirming compiles included). Writes JSON and a markdown table next to it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

import jaxremat
from jaxremat._api.loss import training_loss
from jaxremat.solvers import uniform_plan
from jaxremat.zoo_registry import tagged

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: its record module
from record import run_meta, write_result  # noqa: E402


class _ResConv(nn.Module):
  """GroupNorm, conv, swish, conv, plus the input."""

  features: int

  @nn.compact
  def __call__(self, x):
    y = nn.swish(nn.Conv(self.features, (3, 3))(nn.GroupNorm(num_groups=8)(x)))
    return x + nn.Conv(self.features, (3, 3))(y)


class _MixerBlock(nn.Module):
  """LayerNorm, an MLP over channels, plus the input."""

  hidden: int

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(self.hidden)(nn.LayerNorm()(x))
    return x + nn.Dense(x.shape[-1])(nn.gelu(y))


class _PreLNBlock(nn.Module):
  """Pre-LN transformer block: LayerNorm, self-attention, add; LayerNorm, GELU MLP, add."""

  heads: int
  dtype: Any

  @nn.compact
  def __call__(self, x):
    y = nn.LayerNorm(dtype=self.dtype)(x)
    x = x + nn.MultiHeadDotProductAttention(self.heads, dtype=self.dtype)(y, y)
    y = nn.Dense(4 * x.shape[-1], dtype=self.dtype)(nn.LayerNorm(dtype=self.dtype)(x))
    return x + nn.Dense(x.shape[-1], dtype=self.dtype)(nn.gelu(y))


class _LstmLM(nn.Module):
  """Embedding, two LSTMs over time with dropout after each, a vocabulary head."""

  @nn.compact
  def __call__(self, tokens, train: bool = True):
    x = nn.Embed(1024, 256)(tokens)
    for i in range(2):
      x = nn.RNN(nn.OptimizedLSTMCell(256), name=f"lstm_{i}")(x)
      x = nn.Dropout(0.1, deterministic=not train)(x)
    return nn.Dense(1024)(x)


class _BiLstmTagger(nn.Module):
  """A 1-D conv frontend, two bidirectional LSTMs with a LayerNorm between, a tag head."""

  @nn.compact
  def __call__(self, x):
    x = nn.gelu(nn.Conv(128, (5,))(x))
    for i in range(2):
      x = nn.Bidirectional(nn.RNN(nn.LSTMCell(128)), nn.RNN(nn.LSTMCell(128)),
                           name=f"bi_{i}")(x)
      x = nn.LayerNorm()(x)
    return nn.Dense(20)(x)


class _GruSeq2Seq(nn.Module):
  """A GRU encoder whose final state starts a GRU decoder over the target's embeddings."""

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(512, 192)
    source, target = tokens[:, :64], tokens[:, 64:]
    state, _ = nn.RNN(nn.GRUCell(192), return_carry=True, name="encoder")(embed(source))
    y = nn.RNN(nn.GRUCell(192), name="decoder")(embed(target), initial_carry=state)
    return nn.Dense(512)(nn.gelu(nn.Dense(384)(y)))


def recurrent_models() -> dict:
  """name -> (model, batch, apply kwargs): RNNs over time, written after jaxremat segmented
  them, kept out of every tuning step."""
  key = jax.random.key(5)
  tokens = jax.random.randint(key, (16, 128), 0, 512)
  return {
      "LSTM LM (2 x nn.RNN 256, 128 steps, dropout)": (
          _LstmLM(), tokens, {"rngs": {"dropout": jax.random.key(7)}}),
      "BiLSTM tagger (conv, 2 x nn.Bidirectional 128)": (
          _BiLstmTagger(), jax.random.normal(key, (16, 96, 32)), {}),
      "GRU seq2seq (encoder state starts the decoder)": (_GruSeq2Seq(), tokens, {}),
  }


def _flatten(x):
  return x.reshape(x.shape[0], -1)


def models() -> dict:
  """name -> (model, batch)."""
  key = jax.random.key(3)
  conv = nn.Sequential([
      nn.Conv(24, (5, 5)), nn.gelu, nn.Conv(48, (3, 3), strides=2), nn.relu,
      functools.partial(nn.avg_pool, window_shape=(2, 2), strides=(2, 2)),
      nn.Conv(96, (3, 3)), nn.relu,
      functools.partial(nn.max_pool, window_shape=(3, 3), strides=(2, 2), padding="SAME"),
      nn.Conv(96, (3, 3)), nn.relu, _flatten, nn.Dense(10)])
  mlp = nn.Sequential([nn.Dense(700), nn.tanh, nn.Dense(300), nn.relu, nn.Dense(1500), nn.tanh,
                       nn.Dense(90), nn.relu, nn.Dense(800), nn.relu, nn.Dense(40), nn.relu,
                       nn.Dense(10)])
  res_conv = nn.Sequential([nn.Conv(32, (3, 3)), *[_ResConv(32) for _ in range(6)],
                            lambda x: x.mean(axis=(1, 2)), nn.Dense(10)])
  mixer = nn.Sequential([nn.Dense(96), *[_MixerBlock(384) for _ in range(8)],
                         lambda x: x.mean(axis=1), nn.Dense(10)])
  pool = functools.partial(nn.avg_pool, window_shape=(2, 2), strides=(2, 2))
  avg_conv = nn.Sequential([
      nn.Conv(32, (3, 3)), nn.relu, nn.Conv(32, (3, 3)), nn.relu, pool,
      nn.Conv(64, (3, 3)), nn.relu, nn.Conv(64, (3, 3)), nn.relu, pool,
      nn.Conv(128, (3, 3)), nn.relu, pool, _flatten, nn.Dense(10)])
  u_mlp = nn.Sequential([layer for width in (1024, 512, 128, 512, 1024)
                         for layer in (nn.Dense(width), nn.gelu)] + [nn.Dense(10)])
  gn_conv = nn.Sequential([
      layer for features, stride in ((16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (64, 1))
      for layer in (nn.Conv(features, (3, 3), strides=(stride, stride)), nn.GroupNorm(8),
                    nn.swish)] + [lambda x: x.mean(axis=(1, 2)), nn.Dense(10)])
  bf16 = jnp.bfloat16
  pre_ln = nn.Sequential([nn.Dense(128, dtype=bf16), *[_PreLNBlock(4, bf16) for _ in range(6)],
                          lambda x: x.mean(axis=1), nn.Dense(10, dtype=bf16)])
  return {
      # Kept out of every tuning step (issue 21's holdout): written after the rules.
      "avg-pool conv net (conv/relu pairs, avg pools)": (
          avg_conv, jax.random.normal(key, (32, 48, 48, 3))),
      "U-shaped GELU MLP (1024-512-128-512-1024)": (u_mlp, jax.random.normal(key, (512, 256))),
      "bf16 pre-LN blocks (6, d 128)": (
          pre_ln, jax.random.normal(key, (16, 64, 32)).astype(bf16)),
      "conv-stack (5x5/3x3, avg+max pool)": (conv, jax.random.normal(key, (16, 40, 40, 3))),
      "mlp (700-300-1500-90-800-40-10)": (mlp, jax.random.normal(key, (384, 200))),
      "residual conv blocks (GroupNorm)": (res_conv, jax.random.normal(key, (8, 24, 24, 3))),
      "residual mixer blocks (LayerNorm)": (mixer, jax.random.normal(key, (16, 64, 48))),
      # From a user's trial (2026-11-28); confirm's other-structure compile was made for it.
      "GroupNorm conv stages (conv/GroupNorm/swish)": (
          gn_conv, jax.random.normal(key, (16, 32, 32, 3))),
  }


def _max_rel_diff(a, b) -> float:
  diffs = [float(jnp.max(jnp.abs(u - v)) / (jnp.max(jnp.abs(v)) + 1e-30))
           for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))]
  return max(diffs)


Case = tuple[Callable[..., Any], Any, Any, dict]  # (apply fn, variables, batch, apply kwargs)


def model_set(name: str) -> dict[str, Callable[[], Case]]:
  """name -> a builder of the model's ``Case``, for the set ``name`` (``SETS``)."""
  def linen(model: nn.Module, x: Any, kwargs: dict) -> Callable[[], Case]:
    return lambda: (model.apply, jax.jit(model.init)(jax.random.key(0), x), x, kwargs)

  if name == "unseen":
    return {n: linen(m, x, {}) for n, (m, x) in models().items()}
  if name == "zoo":
    return {m.name: linen(m.build(), m.example(), m.apply_kwargs()) for m in tagged("cpu")}
  if name == "recurrent":
    return {n: linen(m, x, kw) for n, (m, x, kw) in recurrent_models().items()}
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                  "tests"))
  import realworld_models as rm  # type: ignore[import-not-found]  # noqa: PLC0415

  def realworld(family: str) -> Case:
    case = rm.build(family, "bench")
    model, variables = rm.init(case)
    return model.apply, variables, case.batch, dict(case.kwargs)

  return {f"{f}-bench": functools.partial(realworld, f) for f in ("vit", "lm1b", "wmt", "resnet")}


SETS = ("unseen", "zoo", "realworld", "recurrent")


def _measurer(params: Any, x: Any, target: str | None, kwargs: dict
              ) -> Callable[[Callable[..., Any]], int]:
  """XLA's footprint (bytes) of a model function's training step on ``params`` and
  ``x`` (on ``target`` when given, deviceless)."""
  def footprint(fn: Callable[..., Any]) -> int:
    return jaxremat.measure(training_loss(fn, kwargs), params, x, target=target).total_bytes

  return footprint


def run_model(name: str, apply_fn: Callable[..., Any], params: Any, x: Any,
              target: str | None = None, kwargs: dict | None = None) -> dict:
  """Default apply's plan against every checkpoint-every-k plan and ``verify=True``'s
  plan: XLA's footprints (on ``target`` when given, deviceless) and the prediction;
  ``kwargs`` go to ``apply_fn`` (``mutable=``, ``rngs=``, ``train=``)."""
  kwargs = dict(kwargs or {})
  footprint = _measurer(params, x, target, kwargs)
  r, default = _default_apply(apply_fn, params, x, target, kwargs, footprint)
  measured = default["apply_bytes"]
  none = footprint(apply_fn)
  uniform = {}
  for k in range(1, r.chain.n + 1):
    plan = uniform_plan(r.chain.n, k)
    uniform[k] = footprint(jaxremat.apply(apply_fn, params, x, plan=plan, verify=False,
                                          target=target, **kwargs).fn)
  best_k = min(uniform, key=uniform.get)
  start = time.perf_counter()
  verified = jaxremat.apply(apply_fn, params, x, verify=True, target=target, profile="jaxpr",
                            **kwargs)
  verify_seconds = time.perf_counter() - start
  verified_bytes = footprint(verified.fn)
  compiled = _compiled_profile(apply_fn, params, x, target, kwargs, footprint)
  given = _as_given(apply_fn, params, x, target, kwargs, footprint)
  least = min(verified_bytes, uniform[best_k], *(verified.verified or {}).values(),
              *(compiled or {}).get("verified", {}).values(),
              *(given or {}).get("verified", {}).values())
  for found in (compiled, given):
    if found:
      found["vs_least"] = found.get("bytes", found.get("apply_bytes")) / least - 1
  row = {
      "model": name, "layers": r.chain.n, **default, "target": target, "none_bytes": none,
      "best_uniform_k": best_k, "best_uniform_bytes": uniform[best_k],
      "apply_vs_best_uniform": measured / uniform[best_k] - 1,
      "verify_bytes": verified_bytes, "verify_seconds": verify_seconds,
      "verify_vs_best_uniform": verified_bytes / uniform[best_k] - 1,
      "least_bytes": least, "apply_vs_least": measured / least - 1,
      "uniform_bytes": uniform, "grad_max_rel_diff": None, "grad_noise_floor": None,
      "compiled_profile": compiled, "as_given": given,
  }
  if target is None:
    grads = jaxremat.jit(jax.grad(training_loss(r.fn, kwargs)))(params, x)
    plain = jax.jit(jax.grad(training_loss(apply_fn, kwargs)))(params, x)
    row["grad_max_rel_diff"] = _max_rel_diff(grads, plain)
    whole = lambda p, b, **kw: jax.checkpoint(lambda p_, b_: apply_fn(p_, b_, **kw))(p, b)  # noqa: E731
    floor = jaxremat.jit(jax.grad(training_loss(whole, kwargs)))(params, x)
    row["grad_noise_floor"] = _max_rel_diff(floor, plain)
  return row


def _default_apply(apply_fn, params, x, target, kwargs, footprint,
                   profile: str | None = "jaxpr") -> tuple[Any, dict]:
  """Default apply with ``profile`` (None: no profile given, as a user calls it): the
  result, and its row's columns (plan, XLA's footprint, prediction, seconds, compiles,
  the profile that predicted, every plan compiled)."""
  start = time.perf_counter()
  r = jaxremat.apply(apply_fn, params, x, target=target, profile=profile, **kwargs)
  seconds = time.perf_counter() - start
  measured = footprint(r.fn)
  return r, {"plan": list(r.plan.checkpoints), "compiled": len(r.verified or {}),
             "apply_seconds": seconds, "apply_bytes": measured,
             "predicted_bytes": r.predicted_total_bytes,
             "prediction_error": r.predicted_total_bytes / measured - 1,
             "profile": r.profile,
             "verified": {",".join(map(str, c)): b for c, b in (r.verified or {}).items()}}


def _as_given(apply_fn, params, x, target, kwargs, footprint) -> dict | None:
  """On the local backend, apply as a user calls it (no profile given: the estimate,
  asking the compiled profile when XLA misses it; the compiled profile for graphs and
  dropout); None for a target, whose default is the compiled profile's column."""
  if target is not None:
    return None
  return _default_apply(apply_fn, params, x, target, kwargs, footprint, profile=None)[1]


def refresh(row: dict, apply_fn: Callable[..., Any], params: Any, x: Any,
            target: str | None = None, kwargs: dict | None = None,
            default: bool = False) -> dict:
  """``row`` of an earlier ``run_model`` with its compiled profile's columns run again
  (the other columns do not depend on that profile), and with ``default`` the default
  apply's too (the checkpoint-every-k and ``verify=True`` columns do not depend on how
  apply confirms); the least footprint is the least of the earlier plans and the plans
  compiled now."""
  kwargs = dict(kwargs or {})
  footprint = _measurer(params, x, target, kwargs)
  if default:
    row = {**row, **_default_apply(apply_fn, params, x, target, kwargs, footprint)[1]}
    row["apply_vs_best_uniform"] = row["apply_bytes"] / row["best_uniform_bytes"] - 1
  compiled = _compiled_profile(apply_fn, params, x, target, kwargs, footprint)
  given = (_as_given(apply_fn, params, x, target, kwargs, footprint) if default
           else row.get("as_given"))
  least = min(row["least_bytes"], row["apply_bytes"],
              *(compiled or {}).get("verified", {}).values(),
              *(given or {}).get("verified", {}).values())
  for found in (compiled, given):
    if found:
      found["vs_least"] = found.get("bytes", found.get("apply_bytes")) / least - 1
  return {**row, "least_bytes": least, "apply_vs_least": row["apply_bytes"] / least - 1,
          "compiled_profile": compiled, "as_given": given, "compiled_refreshed": True}


def _compiled_profile(apply_fn, params, x, target, kwargs, footprint) -> dict | None:
  """Default apply with ``profile="compiled"``: its plan, XLA's footprint of it, its
  prediction, seconds and compiles (None where the model is no plain chain)."""
  start = time.perf_counter()
  try:
    r = jaxremat.apply(apply_fn, params, x, target=target, profile="compiled", **kwargs)
  except jaxremat.InvalidArgumentError as err:
    print(f"  profile='compiled': {err}")
    return None
  seconds = time.perf_counter() - start
  measured = footprint(r.fn)
  return {"plan": list(r.plan.checkpoints), "bytes": measured,
          "predicted_bytes": r.predicted_total_bytes,
          "prediction_error": r.predicted_total_bytes / measured - 1, "seconds": seconds,
          "compiled": len(r.verified or {}),
          "verified": {",".join(map(str, c)): b for c, b in (r.verified or {}).items()}}


def markdown(rows: list[dict]) -> str:
  mib = 2**20
  lines = ["| model | layers | no remat MiB | apply MiB | predicted MiB | prediction error "
           "| best uniform MiB (k) | apply vs best uniform | `verify=True` vs best uniform "
           "| apply vs least of verify's and uniform | apply s (compiles) "
           "| grad max rel diff (noise floor) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    grad = ("n/a" if r["grad_max_rel_diff"] is None else
            f"{r['grad_max_rel_diff']:.1e} ({r['grad_noise_floor']:.1e})")
    lines.append(
        f"| {r['model']} | {r['layers']} | {r['none_bytes'] / mib:.2f} | {r['apply_bytes'] / mib:.2f} "
        f"| {r['predicted_bytes'] / mib:.2f} | {100 * r['prediction_error']:+.1f}% "
        f"| {r['best_uniform_bytes'] / mib:.2f} ({r['best_uniform_k']}) "
        f"| {100 * r['apply_vs_best_uniform']:+.1f}% "
        f"| {100 * r['verify_vs_best_uniform']:+.1f}% ({r['verify_seconds']:.0f} s) "
        f"| {100 * r['apply_vs_least']:+.1f}% "
        f"| {r['apply_seconds']:.1f} ({r['compiled']}) | {grad} |")
  lines += ["", "Default apply by profile (`apply(profile=...)`): XLA's footprint of its plan, "
            "the prediction's error, against the least of every plan measured here.", "",
            "| model | jaxpr MiB | error | vs least | compiled MiB | error | vs least "
            "| compiled s (compiles) |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    c = r.get("compiled_profile")
    tail = ("| n/a | | | |" if not c else
            f"| {c['bytes'] / mib:.2f} | {100 * c['prediction_error']:+.1f}% "
            f"| {100 * c['vs_least']:+.1f}% | {c['seconds']:.1f} ({c['compiled']}) |")
    lines.append(f"| {r['model']} | {r['apply_bytes'] / mib:.2f} "
                 f"| {100 * r['prediction_error']:+.1f}% | {100 * r['apply_vs_least']:+.1f}% {tail}")
  given = [r for r in rows if r.get("as_given")]
  if given:
    lines += ["", "Apply as a user calls it (no `profile=`): the profile that predicted "
              "its plan, XLA's footprint, the prediction's error, against the least.", "",
              "| model | profile | MiB | error | vs least | s (compiles) |",
              "|---|---|---|---|---|---|"]
    for r in given:
      g = r["as_given"]
      lines.append(f"| {r['model']} | {g['profile']} | {g['apply_bytes'] / mib:.2f} "
                   f"| {100 * g['prediction_error']:+.1f}% | {100 * g['vs_least']:+.1f}% "
                   f"| {g['apply_seconds']:.1f} ({g['compiled']}) |")
  for profile, get in (("jaxpr", lambda r: r),
                       ("compiled", lambda r: r.get("compiled_profile")),
                       ("no profile given", lambda r: r.get("as_given"))):
    found = [get(r) for r in rows if get(r)]
    error = [abs(f["prediction_error"]) for f in found]
    least = [f.get("apply_vs_least", f.get("vs_least")) for f in found]
    if found:
      lines.append(f"- {profile}: prediction within 3% on {sum(e <= 0.03 for e in error)} of "
                   f"{len(found)} (mean |error| {100 * sum(error) / len(error):.1f}%); within 2% "
                   f"of the least on {sum(v <= 0.02 for v in least)}")
  return "\n".join(lines) + "\n"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=None, help="JSON path (markdown written beside it)")
  parser.add_argument("--target", help="compile for this GPU deviceless (h100, a100)")
  parser.add_argument("--models", help="comma-separated prefixes of model names")
  parser.add_argument("--set", default="unseen", choices=SETS, help="which models")
  parser.add_argument("--compiled-only", metavar="JSON",
                      help="re-run only the compiled profile's columns over this earlier run "
                           "of the same set and target (its other columns are kept; its "
                           "models --models leaves out keep their rows; a model it lacks is "
                           "run whole)")
  parser.add_argument("--apply-only", metavar="JSON",
                      help="as --compiled-only, and default apply's columns too")
  args = parser.parse_args(argv)
  start = time.time()
  rows = []
  wanted = args.models.split(",") if args.models else None
  earlier_run = args.apply_only or args.compiled_only
  previous = json.load(open(earlier_run)) if earlier_run else None
  earlier = {r["model"]: r for r in previous["rows"]} if previous else None
  for name, build in model_set(args.set).items():
    if wanted and not any(name.startswith(w) for w in wanted):
      if earlier and name in earlier:
        rows.append(earlier[name])  # not asked for: the earlier run's row
      continue
    apply_fn, params, x, kwargs = build()
    if earlier is None or name not in earlier:
      rows.append(run_model(name, apply_fn, params, x, args.target, kwargs))
    else:
      rows.append(refresh(earlier[name], apply_fn, params, x, args.target, kwargs,
                          default=bool(args.apply_only)))
    r = rows[-1]
    print(f"{name}: apply {r['apply_bytes'] / 2**20:.2f} MiB, predicted {r['predicted_bytes'] / 2**20:.2f} "
          f"({100 * r['prediction_error']:+.1f}%), best uniform {r['best_uniform_bytes'] / 2**20:.2f} "
          f"(k={r['best_uniform_k']}, apply {100 * r['apply_vs_best_uniform']:+.1f}%)", flush=True)
  table = markdown(rows)
  print(table)
  if args.out:
    kept = ({"other_columns_from": {k: previous["meta"][k] for k in ("date", "command", "seconds")}}
            if previous else {})
    write_result(args.out, run_meta(time.time() - start, target=args.target, **kept), rows, table)


if __name__ == "__main__":
  main()
