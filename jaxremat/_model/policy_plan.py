"""Plans that decide, per layer, which residuals to keep, recompute or offload (issue 24).

A ``PolicyPlan`` cuts the chain into groups of consecutive layers. A group of one layer
runs under one ``Option``: keep all its residuals (no remat), recompute them all from the
layer's input, or keep some of its values and recompute the rest (a JAX checkpoint
policy). A group of several layers is recomputed as a whole from its input (the
layer-boundary plan of model R), or on a graph runs as a whole under a policy (a block
split into pieces, under one policy; ``NAMES`` positions then index the group's
equations in order). Each group comes with its bytes and seconds
(``GroupCost``), which is what the solver reads; this module holds no JAX.
"""

from __future__ import annotations

import dataclasses

from jaxremat._errors import InvalidPlanError

#: What a group does with its residuals.
KEEP = "keep"  # no remat: every residual stays on the device
RECOMPUTE = "recompute"  # jax.checkpoint, nothing saveable: keep the input, recompute the rest
DOTS = "dots"  # keep the outputs of matrix products (jax's ``dots_saveable``)
DOTS_NO_BATCH = "dots-no-batch"  # ``dots_with_no_batch_dims_saveable``
NAMES = "names"  # keep (or offload) the outputs of the listed equations of the layer
OPTIONS = (KEEP, RECOMPUTE, DOTS, DOTS_NO_BATCH, NAMES)
#: The options a group of several layers may run under.
RUN_OPTIONS = (RECOMPUTE, DOTS, DOTS_NO_BATCH, NAMES)


@dataclasses.dataclass(frozen=True)
class Option:
  """What one group does with its residuals.

  Attributes:
    kind: one of ``OPTIONS``.
    saved: for ``NAMES``: positions of the layer's equations whose outputs stay on the
      device (the rest is recomputed).
    offloaded: for ``NAMES``: positions of equations whose outputs go to host memory.
  """

  kind: str
  saved: frozenset[int] = frozenset()
  offloaded: frozenset[int] = frozenset()

  def __post_init__(self):
    if self.kind not in OPTIONS:
      raise InvalidPlanError(f"unknown option {self.kind!r}; expected one of {OPTIONS}.")
    if self.kind != NAMES and (self.saved or self.offloaded):
      raise InvalidPlanError(f"option {self.kind!r} takes no saved or offloaded equations.")

  def describe(self) -> str:
    """Short text for reports: ``keep``, ``names(3 saved, 1 offloaded)``."""
    if self.kind != NAMES:
      return self.kind
    parts = [f"{len(self.saved)} saved"] + ([f"{len(self.offloaded)} offloaded"]
                                            if self.offloaded else [])
    return f"names({', '.join(parts)})"


@dataclasses.dataclass(frozen=True)
class Group:
  """Layers ``start+1..stop`` (a slice ``[start, stop)`` of the chain) under ``option``;
  a group of several layers runs under one of ``RUN_OPTIONS``."""

  start: int
  stop: int
  option: Option

  def __post_init__(self):
    if not 0 <= self.start < self.stop:
      raise InvalidPlanError(f"a group needs 0 <= start < stop, got {self.start}, {self.stop}.")
    if self.stop - self.start > 1 and self.option.kind not in RUN_OPTIONS:
      raise InvalidPlanError(
          f"a group of several layers ({self.start + 1}..{self.stop}) is recomputed as a "
          f"whole, or runs under one of {RUN_OPTIONS[1:]}; got option {self.option.kind!r}.")


@dataclasses.dataclass(frozen=True)
class GroupCost:
  """A group with what it costs (bytes, seconds).

  Attributes:
    group: the group.
    stored_bytes: bytes it holds on the device from its forward until its backward.
    transient_bytes: bytes beyond those during its backward (recomputed residuals, the
      backward's workspace and cotangents).
    seconds: time its recomputation (and offload traffic not hidden) adds to the step.
    host_bytes: bytes it offloads to host memory.
  """

  group: Group
  stored_bytes: int
  transient_bytes: int
  seconds: float
  host_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class PolicyPlan:
  """Groups covering layers ``1..n`` in order (see the module docstring)."""

  groups: tuple[Group, ...]

  def validate(self, n: int) -> None:
    """Raises ``InvalidPlanError`` unless the groups cover ``0..n`` in order."""
    at = 0
    for g in self.groups:
      if g.start != at:
        raise InvalidPlanError(f"groups must cover the layers in order; a group starts at "
                               f"{g.start}, expected {at}.")
      at = g.stop
    if at != n:
      raise InvalidPlanError(f"the groups cover {at} layers, the chain has {n}.")

  def describe(self) -> str:
    """One line per group, e.g. ``layers 3-5: recompute``."""
    return "\n".join(
        f"layer {g.stop}: {g.option.describe()}" if g.stop - g.start == 1
        else f"layers {g.start + 1}-{g.stop}: {g.option.describe()}" for g in self.groups)

  def __str__(self) -> str:  # print(fitted.plan): the groups, not the dataclass fields
    return self.describe()


def from_plan(checkpoints: tuple[int, ...], n: int) -> PolicyPlan:
  """A layer-boundary plan (``Plan.checkpoints``) as groups: every segment but the last
  recomputed whole from its input, the last segment's layers kept."""
  bounds = (0, *checkpoints)
  groups = [Group(a, b, Option(RECOMPUTE)) for a, b in zip(bounds[:-1], bounds[1:])]
  groups += [Group(i, i + 1, Option(KEEP)) for i in range(bounds[-1], n)]
  return PolicyPlan(tuple(groups))


def peak_bytes(costs: tuple[GroupCost, ...] | list[GroupCost], final_bytes: int = 0) -> int:
  """Peak bytes (above the fixed bytes) of the groups in order: the largest of every
  group's backward (the stored bytes of the groups before it plus its own stored and
  transient bytes) and the end of the forward (every group's stored bytes plus
  ``final_bytes``, the model's output and its cotangent)."""
  held, peak = 0, 0
  for c in costs:
    peak = max(peak, held + c.stored_bytes + c.transient_bytes)
    held += c.stored_bytes
  return max(peak, held + final_bytes)
