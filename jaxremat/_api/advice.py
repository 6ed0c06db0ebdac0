"""Warnings that say when a plan saves little and what would save more."""

from __future__ import annotations

import os
import warnings

from jaxremat._api.planner import Planner
from jaxremat._api.planning import fmt_bytes
from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.trace import Layer, TracedChain
from jaxremat._model.chain import Chain, Plan
from jaxremat._model.graph import GraphChain

#: A plan saving less than this fraction of the no-remat footprint saves little.
LITTLE = 0.10
#: A layer holding more than this fraction of the residual bytes hides the others.
DOMINANT = 0.5
#: A plan that recomputes must save at least this fraction of the model as written's
#: footprint (XLA's) to be returned; else ``fn`` runs the model as written.
MIN_SAVING = 0.01
#: A layer whose residuals are over this many times its output holds large values inside
#: (a transformer block's attention scores and hidden activations), which checkpoints
#: inside it may drop (``search_hint``).
WIDE = 8
#: Loops whose iterations a checkpoint between layers cannot reach.
_LOOPS = frozenset({"scan", "while"})


class NoSavingWarning(UserWarning):
  """The chosen plan compiled less than ``MIN_SAVING`` below the model as written (and
  would recompute for next to nothing), or keeps every layer boundary, so ``fn`` runs the
  model unchanged."""


def warn_as_written(as_written_bytes: int, least_bytes: int, reason: str = "") -> None:
  """Warns (``NoSavingWarning``) that ``apply`` returns the model as written: XLA measured
  its step at ``as_written_bytes``, the least plan compiled at ``least_bytes``; ``reason``
  (``coarse_reason``'s) says why, where the layers are too coarse."""
  warnings.warn(NoSavingWarning(
      f"jaxremat: the plan did not compile {MIN_SAVING:.0%} or more below the model as "
      f"written ({as_written_bytes} bytes by XLA; the least plan compiled {least_bytes}), "
      "so r.fn runs the model unchanged rather than recompute for little. " + (
          f"Checkpoints fall between layers only, and {reason}" if reason else
          "It may already be rematerialised (jax.checkpoint or nn.remat inside it), or its "
          "layers too coarse: see r.report() and layer_depth.")), stacklevel=3)


def one_layer_hint(traced: TracedChain) -> str:
  """Why the model traced as one layer and what gives it more, in a sentence ("" when it
  has more than one layer, or its one layer is a scan: that one is segmented unless
  ``scan_segment=None`` says not to)."""
  if len(traced.layers) != 1 or any(e.primitive.name == "scan" for e in traced.layers[0].eqns):
    return ""
  named = any(_compat.name_stack(e) for e in traced.layers[0].eqns)
  return (
      f"The model traced as one layer ({traced.layers[0].name!r}), and checkpoints go "
      "between layers. " + (
          ("Pass layer_depth= to plan its submodules as layers."
           if _has_submodules(traced.layers[0]) else "It has no submodules to plan.")
          if named else
          "Layers are the modules named in the trace (Flax linen modules, jax.named_scope) "
          "and this trace names none: for a flax.nnx model call "
          "jaxremat.apply_nnx(model, batch) (jaxremat.fit_nnx for a budget), which names "
          "its modules; else run each block "
          "under jax.named_scope."))


def warn_one_layer(traced: TracedChain) -> None:
  """Warns (``NoSavingWarning``) that the model is one layer, so ``fn`` runs it unchanged."""
  hint = one_layer_hint(traced)
  if hint:
    warnings.warn(NoSavingWarning(f"jaxremat: r.fn runs the model unchanged. {hint}"),
                  stacklevel=3)


def warn_boundaries_kept(traced: TracedChain, explained: bool = False) -> None:
  """Warns (``NoSavingWarning``) that the plan keeps every layer boundary: because the
  model rematerialises already (a layer runs ``jax.checkpoint``, ``nn.remat`` or
  ``nnx.remat`` inside it), or, unless another warning ``explained`` why, because no
  checkpoint is predicted to save memory."""
  inside = [layer.name for layer in traced.layers
            if any(e.primitive.name in _compat.REMAT_PRIMITIVES for e in layer.eqns)]
  if inside:
    warnings.warn(NoSavingWarning(
        f"jaxremat: r.fn runs the model as written: it rematerialises already "
        f"(jax.checkpoint, nn.remat or nnx.remat inside {', '.join(map(repr, inside[:3]))}"
        f"{', ...' if len(inside) > 3 else ''}), and no checkpoint between layers is "
        "predicted to save more. Take the remat out of the model to let jaxremat place it."),
        stacklevel=3)
  elif not explained:
    warnings.warn(NoSavingWarning(
        f"jaxremat: r.fn runs the model as written: no checkpoint between its "
        f"{len(traced.layers)} layers is predicted to save memory (see r.report())."),
        stacklevel=3)


class CoarseLayersWarning(UserWarning):
  """One layer holds most of what the backward pass keeps, so the plan saves little."""


def warn_if_coarse(planner: Planner, plan: Plan, traced: TracedChain,
                   segmented: frozenset[int] | None = frozenset(),
                   measured: tuple[int, int] | None = None) -> bool:
  """Warns (``CoarseLayersWarning``) when ``plan`` saves under ``LITTLE`` of the footprint
  without remat (XLA's, from ``measured`` = (as written, the plan's) bytes, when given;
  else the memory model's) and ``coarse_reason`` finds layers that checkpoints cannot
  reach inside; whatever it saves, where ``unreached_loops`` finds loops holding most
  residuals that a checkpoint around their body would reach. Returns whether it warned."""
  held = planner.fixed_bytes - planner.input_bytes  # a cheap model: fixed bytes + peak
  none = held + planner.peak_bytes(Plan(()))
  if none <= 0:
    return False
  if measured is not None and measured[0] > 0:
    saving, by = 1 - measured[1] / measured[0], "XLA-measured"
  else:
    saving, by = 1 - (held + planner.peak_bytes(plan)) / none, "by the memory model"
  reason = (coarse_reason(planner, traced, segmented) if saving < LITTLE
            else unreached_loops(planner, traced, segmented))
  if reason:
    warnings.warn(CoarseLayersWarning(
        f"jaxremat: the plan saves {saving:.0%} of the step's footprint ({by}); checkpoints "
        f"fall between layers only, and {reason}"), stacklevel=3)
  return bool(reason)


def coarse_reason(planner: Planner, traced: TracedChain,
                  segmented: frozenset[int] | None = frozenset()) -> str:
  """Which layers hide the residuals from checkpoints between layers, and what reaches
  inside them, in words: one layer holding over ``DOMINANT`` of the residual bytes with
  submodules of its own, or layers running loops that are not scanned stacks jaxremat
  plans (not in ``segmented``; None: the user left scans as they are, say nothing of
  loops) holding that much together; else ``""``."""
  res = planner.chain.res_bytes
  if not res or sum(res) <= 0:
    return ""
  k = max(range(len(res)), key=res.__getitem__)
  loops = loop_layers(traced, segmented)
  names = planner.chain.names
  if res[k] / sum(res) > DOMINANT and _has_submodules(traced.layers[k]):
    return (f"layer {names[k]!r} holds {res[k] / sum(res):.0%} of the residual bytes. Pass "
            f"layer_depth={split_depth(traced.layers[k])} to plan its submodules as layers, or "
            "group its inner blocks into modules called one after the other.")
  if not loops_hold_residuals(planner, traced, segmented):
    return ""
  return loop_hint([names[i] for i in loops], _loop_share(planner, loops),
                   all(_loop_body_remat(traced.layers[i]) for i in loops))


def loops_hold_residuals(planner: Planner, traced: TracedChain,
                         segmented: frozenset[int] | None = frozenset()) -> bool:
  """Whether layers running loops jaxremat does not segment hold over ``DOMINANT`` of the
  residual bytes: no plan of layers, at any depth, reaches inside them."""
  loops = loop_layers(traced, segmented)
  return bool(loops) and _loop_share(planner, loops) > DOMINANT


def _loop_share(planner: Planner, loops: list[int]) -> float:
  res = planner.chain.res_bytes
  return sum(res[i] for i in loops) / sum(res) if sum(res) > 0 else 0.0


def unreached_loops(planner: Planner, traced: TracedChain,
                    segmented: frozenset[int] | None = frozenset()) -> str:
  """``loop_hint`` where layers running loops jaxremat does not segment, none of whose
  bodies runs under a checkpoint, hold over ``DOMINANT`` of the residual bytes: each step
  of them keeps its residuals whatever the plan, and ``nn.remat`` on the body reaches them
  (a user's LSTM LM, before jaxremat segmented RNNs over time: the plan saved 10%, 98.12
  -> 88.17 MiB, nn.RNN(nn.remat(Cell)) 45%, 54.12 MiB); else ``""``."""
  loops = loop_layers(traced, segmented)
  if (not loops_hold_residuals(planner, traced, segmented)
      or any(_loop_body_remat(traced.layers[i]) for i in loops)):
    return ""
  return loop_hint([planner.chain.names[i] for i in loops], _loop_share(planner, loops))


def search_hint(planner: Planner, traced: TracedChain, footprint_bytes: int) -> str:
  """Where one layer's residuals make over ``DOMINANT`` of what the plan holds above the
  fixed bytes (``footprint_bytes``: XLA's footprint of the plan), over ``WIDE`` times its
  output, and the layer has modules of its own, the note that ``layer_depth='search'``
  plans inside the layers (no checkpoint between layers goes below that layer's
  residuals); else ``""``. A user's nnx LM: every block recomputed alone, 63.25 MiB, a
  block's residuals 34.33 MiB, 34 times its output; the search 45.47 MiB. The zoo's GPT
  (48 times): 17.86 → 13.61 MiB; its ResNet-18 (6 times): the search kept the blocks."""
  res, above = planner.chain.res_bytes, footprint_bytes - planner.fixed_bytes
  if not res or above <= 0:
    return ""
  k = max(range(len(res)), key=res.__getitem__)
  if (res[k] <= DOMINANT * above or res[k] <= WIDE * _output_bytes(planner.chain, k)
      or not _has_submodules(traced.layers[k])):
    return ""
  return (f"; {planner.chain.names[k]!r} holds {fmt_bytes(res[k])} of residuals, "
          f"{res[k] / above:.0%} of what the plan holds above the fixed bytes: "
          "layer_depth='search' plans inside the layers too")


def _output_bytes(chain: Chain | GraphChain, k: int) -> int:
  """The bytes layer ``k`` (0-based) makes for the layers after it."""
  if isinstance(chain, Chain):
    return chain.act_bytes[k + 1]
  return sum(b for b, unit in zip(chain.value_bytes, chain.defined) if unit == k + 1)


def loop_layers(traced: TracedChain, segmented: frozenset[int] | None) -> list[int]:
  """The layers that run a loop jaxremat does not segment (not in ``segmented``; None:
  the user left scans as they are, so none is counted)."""
  return [i for i, layer in enumerate(traced.layers) if segmented is not None
          and i not in segmented and any(e.primitive.name in _LOOPS for e in layer.eqns)]


def loop_hint(names: list[str], share: float, body_remat: bool = False) -> str:
  """That the layers ``names``, holding ``share`` of the residual bytes, run loops that
  checkpoints between layers cannot reach inside, and what does (``body_remat``: the
  loops' bodies run under a checkpoint already)."""
  listed = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
  held = ((f"layer {listed} holds" if len(names) == 1 else f"layers {listed} hold")
          + f" {share:.0%} of the residual bytes in loops (a fori_loop, while_loop, or a "
          "scan without xs) that jaxremat does not split")
  if body_remat:
    return (held + ". Their bodies are rematerialised already (jax.checkpoint or nn.remat "
            "inside), so each step keeps its carry alone: to keep fewer, run the loop as an "
            "outer loop over chunks of steps, each chunk under jax.checkpoint, or shorten "
            "the loop or the batch.")
  return (held + ": it segments scans over stacked parameters (nn.scan's layer stacks) and "
          "over the batch's steps (nn.RNN). Wrap the loop's body in jax.checkpoint to keep "
          "only its carry per step, or write the loop as a jax.lax.scan over its xs.")


def _loop_body_remat(layer: Layer) -> bool:
  """True when every loop of ``layer`` runs a checkpoint inside its body."""
  return all(any(e.primitive.name in _compat.REMAT_PRIMITIVES
                 for body in _compat.param_jaxprs(loop.params)
                 for e in _compat.all_eqns(body.eqns))
             for loop in layer.eqns if loop.primitive.name in _LOOPS)


def _has_submodules(layer: Layer) -> bool:
  """True when some equation of ``layer`` runs in a module below the layer's own."""
  depth = min(len(_compat.module_path(e)) for e in layer.eqns)
  return any(len(_compat.module_path(e)) > depth for e in layer.eqns)


def split_depth(layer: Layer) -> int:
  """The ``layer_depth`` that makes ``layer``'s child modules layers, looking through a
  module with a single child (``Transformer.decode``'s ``decoder``): the length of the
  name stack its equations share, grown while they share one child below it."""
  paths = [_compat.module_path(e) for e in layer.eqns]
  depth = len(os.path.commonprefix(paths))
  while len({p[:depth + 1] for p in paths if len(p) > depth}) == 1:
    depth += 1
  return depth
