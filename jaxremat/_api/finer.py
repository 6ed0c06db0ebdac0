"""``layer_depth="search"``: the plan one name-stack level below the layers (a
transformer's blocks split into their attention and MLP), kept when XLA measures it
smaller."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
from jaxremat._api.checks import default_profile
from jaxremat._api.planner import Planner, make_planner, scale_estimate
from jaxremat._api.planning import fmt_bytes
from jaxremat._api.verify import confirm_plan
from jaxremat._backends.replay import Replay
from jaxremat._backends.targets import Target
from jaxremat._errors import JaxrematError
from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.trace import TracedChain, trace
from jaxremat._model.chain import Plan

#: The finer plan is kept when XLA measures it at least this share below the least
#: footprint of the plans compiled at the chosen layers.
FINER_GAIN = 0.01
#: Levels below the layers found first that the search tries at most, one at a time
#: while each measures less than the last.
FINER_LEVELS = 2


@dataclasses.dataclass(frozen=True)
class Finer:
  """The finer layers, their planner and plan, the ``layer_depth`` that traces them, and
  XLA's footprint (bytes) of each plan compiled for them, by checkpoints."""

  traced: TracedChain
  planner: Planner
  plan: Plan
  depth: int
  compiled: dict[tuple[int, ...], int]

  @property
  def footprint(self) -> int:
    """XLA's footprint of the plan (bytes)."""
    return self.compiled[self.plan.checkpoints]


def finer_depth(traced: TracedChain) -> int:
  """The ``layer_depth`` one name-stack level below the deepest module that is a layer:
  the length of the name stack its equations share (``ViT/Transformer/encoderblock_0``
  is 3, and ``layer_depth=3`` makes that block's children layers)."""
  shared = [len(os.path.commonprefix([_compat.module_path(e) for e in layer.eqns]))
            for layer in traced.layers if layer.eqns]
  return max(shared, default=0)


def plan_finer(model_fn: Callable[..., Any], params: Any, batch: Any,
               model_kwargs: dict[str, Any], traced: TracedChain, calibrate: bool,
               target: Target | None, refine: bool,
               measured: Callable[[Plan, TracedChain, int], int],
               compiled: Callable[[TracedChain, tuple[tuple[int, int, int], ...]], Replay],
               profile: str | None, plain_bytes: int | None = None) -> Finer | None:
  """The optimal plan one level below ``traced``'s layers (``finer_depth``), planned (as
  a graph where a block's skip then spans layers) with ``profile`` (by default as for
  any layers, ``checks.default_profile``; ``compiled``: the replay of the plain step over
  given layers), and confirmed as ``apply`` confirms its plan (``confirm_plan``: up to
  three more plans compiled; ``measured(plan, traced, layer_depth)``: XLA's footprint,
  bytes; ``plain_bytes``: XLA's footprint of the step without remat, which the estimate
  is scaled to). None when that level has no more layers, or jaxremat cannot trace or plan
  it."""
  depth = finer_depth(traced)
  try:
    finer = trace(model_fn, params, batch, model_kwargs, depth)
    if len(finer.layers) <= len(traced.layers):
      return None
    replayed = (profile or default_profile(target, jax.default_backend(), finer)
                ) == "compiled"
    planner = make_planner(finer, (), params, batch, model_kwargs, calibrate, target,
                           compiled if replayed else None, required=profile is not None)
    planner = scale_estimate(planner, plain_bytes)
    plan = planner.solve("optimal", refine)
    plan, footprints = confirm_plan(planner, plan, lambda p: measured(p, finer, depth))
    return Finer(finer, planner, plan, depth, footprints)
  except JaxrematError:  # that level cannot be planned: the layers found first stand
    return None


def finer_note(finer: Finer, coarse_bytes: int) -> str:
  """What ``Remat.decomposition`` says of finer layers kept over ``coarse_bytes``."""
  return (f"{finer.traced.decomposition}: below the layers found first "
          f"(layer_depth='search'), as XLA measured them: {fmt_bytes(finer.footprint)} "
          f"against {fmt_bytes(coarse_bytes)}")


def searched_note(finer: Finer | None, least_bytes: int) -> str:
  """What ``Remat.decomposition`` adds when the search keeps the layers found first
  (``least_bytes``: XLA's least footprint over them; ``finer``: the level below, if
  any)."""
  if finer is None:
    return "; layer_depth='search': no level below to plan"
  return (f"; layer_depth='search': one level below measured {fmt_bytes(finer.footprint)} "
          f"against {fmt_bytes(least_bytes)}, these layers kept")
