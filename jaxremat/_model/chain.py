"""The chain memory model R: per-layer byte counts, checkpoint plans, the peak formula."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxremat._errors import InvalidChainError, InvalidPlanError


def _ints(name: str, values: Sequence[int] | None, length: int, default: Sequence[int]) -> tuple[int, ...]:
  if values is None:
    return tuple(int(v) for v in default)
  out = tuple(int(v) for v in values)
  if len(out) != length:
    raise InvalidChainError(f"{name} has {len(out)} entries, expected {length}.")
  if any(v < 0 for v in out):
    raise InvalidChainError(f"{name} must be non-negative, got {out}.")
  return out


@dataclasses.dataclass(frozen=True, init=False)
class Chain:
  """A chain of ``n`` layers ``x_i = f_i(x_{i-1})`` described in bytes and FLOPs.

  Attributes:
    act_bytes: ``a_0..a_n``, bytes of each activation ``x_i`` (``x_0`` is the input).
    res_bytes: ``b_1..b_n``, bytes of the residuals layer ``i``'s backward needs.
    cot_bytes: ``g_0..g_n``, bytes of the cotangent of ``x_i`` (default: ``act_bytes``).
    input_res_bytes: ``e_1..e_n``, the part of ``b_i`` that is the layer's own input
      ``x_{i-1}``; not counted again when ``x_{i-1}`` is the held checkpoint (default 0).
    workspace_bytes: ``w_1..w_n``, transient bytes during layer ``i``'s backward (default 0).
    flops: ``f_1..f_n``, forward FLOPs of each layer (what a recomputation costs).
    names: a name per layer, for reports.
  """

  act_bytes: tuple[int, ...]
  res_bytes: tuple[int, ...]
  cot_bytes: tuple[int, ...]
  input_res_bytes: tuple[int, ...]
  workspace_bytes: tuple[int, ...]
  flops: tuple[int, ...]
  names: tuple[str, ...]

  def __init__(
      self,
      act_bytes: Sequence[int],
      res_bytes: Sequence[int],
      *,
      cot_bytes: Sequence[int] | None = None,
      input_res_bytes: Sequence[int] | None = None,
      workspace_bytes: Sequence[int] | None = None,
      flops: Sequence[int] | None = None,
      names: Sequence[str] | None = None,
  ):
    n = len(res_bytes)
    act = _ints("act_bytes", act_bytes, n + 1, ())
    res = _ints("res_bytes", res_bytes, n, ())
    cot = _ints("cot_bytes", cot_bytes, n + 1, act)
    inp = _ints("input_res_bytes", input_res_bytes, n, (0,) * n)
    if any(e > b for e, b in zip(inp, res)):
      raise InvalidChainError(
          "input_res_bytes[i] is part of res_bytes[i] and cannot exceed it; got "
          f"input_res_bytes={inp}, res_bytes={res}.")
    work = _ints("workspace_bytes", workspace_bytes, n, (0,) * n)
    fl = _ints("flops", flops, n, (0,) * n)
    nm = tuple(str(s) for s in names) if names is not None else tuple(f"layer_{i}" for i in range(1, n + 1))
    if len(nm) != n:
      raise InvalidChainError(f"names has {len(nm)} entries, expected {n}.")
    for field, value in zip(
        ("act_bytes", "res_bytes", "cot_bytes", "input_res_bytes", "workspace_bytes", "flops", "names"),
        (act, res, cot, inp, work, fl, nm)):
      object.__setattr__(self, field, value)

  @property
  def n(self) -> int:
    """Number of layers."""
    return len(self.res_bytes)


@dataclasses.dataclass(frozen=True)
class Plan:
  """A checkpoint plan: the layer outputs ``x_c`` kept during the forward pass.

  ``checkpoints`` holds indices in ``1..n-1``; they split the chain into segments
  ``(c_{j-1}, c_j]``. Every segment but the last runs under its own ``jax.checkpoint``.

  ``inner`` makes the plan multi-level: a pair ``(l, sub)`` splits the segment that
  starts at ``l`` by ``sub.checkpoints`` (absolute layer indices strictly inside it);
  inside that segment every sub-segment but the last runs under a nested
  ``jax.checkpoint``, so when the segment is recomputed only the sub-segment boundaries
  are kept, and the sub-segments are recomputed again one by one. ``sub`` may itself
  have ``inner``.
  """

  checkpoints: tuple[int, ...] = ()
  method: str = ""
  inner: tuple[tuple[int, Plan], ...] = ()

  def __post_init__(self):
    cps = tuple(int(c) for c in self.checkpoints)
    if list(cps) != sorted(set(cps)):
      raise InvalidPlanError(f"checkpoints must be strictly increasing, got {cps}.")
    object.__setattr__(self, "checkpoints", cps)
    inner = tuple(sorted((int(l), sub) for l, sub in self.inner))
    if len({l for l, _ in inner}) != len(inner) or not all(isinstance(s, Plan) for _, s in inner):
      raise InvalidPlanError(f"inner must pair distinct segment starts with Plans, got {self.inner}.")
    object.__setattr__(self, "inner", inner)

  @property
  def is_nested(self) -> bool:
    """True for a multi-level plan."""
    return bool(self.inner)

  def segments(self, n: int) -> list[tuple[int, int]]:
    """The segments ``(l, r]`` of a chain of ``n`` layers, as ``(l, r)`` pairs."""
    validate_plan(self, n)
    bounds = (0, *self.checkpoints, n)
    return list(zip(bounds[:-1], bounds[1:]))


def validate_plan(plan: Plan, n: int, start: int = 0, *, nested: bool = False) -> None:
  """Raises InvalidPlanError unless the plan fits a chain of ``n`` layers.

  Checkpoints lie in ``start+1..n-1`` (``start`` is the segment a nested plan splits);
  every ``inner`` entry names a segment start and splits it strictly inside.
  """
  bad = [c for c in plan.checkpoints if not start + 1 <= c <= n - 1]
  if bad and nested:
    raise InvalidPlanError(
        f"inner checkpoints {bad} lie outside the segment ({start}, {n}] they split; "
        f"valid indices are {start + 1}..{n - 1}.")
  if bad:
    raise InvalidPlanError(
        f"checkpoint indices {bad} are out of range for a chain of {n} layers; "
        f"valid indices are 1..{n - 1} (the output of layer i is checkpoint i).")
  bounds = (start, *plan.checkpoints, n)
  stops = dict(zip(bounds[:-1], bounds[1:]))
  for l, sub in plan.inner:
    if l not in stops:
      raise InvalidPlanError(
          f"inner plan for segment start {l}, but the segments start at {sorted(stops)}.")
    validate_plan(sub, stops[l], start=l, nested=True)


def peak_bytes(chain: Chain, plan: Plan) -> int:
  """Peak bytes of the backward pass under model R (docs/design.md), with refinements.

  For each segment ``(l, r]`` and each layer ``i`` in it, the live bytes are the held
  checkpoints ``x_c`` with ``c <= l`` (``x_0`` included), the residuals of layers
  ``l+1..i`` (less ``e_{l+1}``, the part that is the held ``x_l``), ``w_i``, ``g_i``
  and ``g_{i-1}``.
  """
  n = chain.n
  if n == 0:
    return chain.act_bytes[0] + chain.cot_bytes[0]
  if plan.is_nested:
    raise InvalidPlanError(
        "peak_bytes is model R for single-level plans; a multi-level plan's peak comes "
        "from the event simulator (jaxremat.simulate_peak_bytes).")
  a, b, g = chain.act_bytes, chain.res_bytes, chain.cot_bytes
  e, w = chain.input_res_bytes, chain.workspace_bytes
  held = 0
  peak = 0
  for l, r in plan.segments(n):
    held += a[l]
    res = -e[l]  # e is 0-based: e[l] is e_{l+1}
    for i in range(l + 1, r + 1):
      res += b[i - 1]
      peak = max(peak, held + res + w[i - 1] + g[i] + g[i - 1])
  return peak


def recompute_flops(chain: Chain, plan: Plan) -> int:
  """FLOPs recomputed by ``plan``: every layer of every non-final segment runs twice.

  For a multi-level plan a layer reruns once per enclosing segment, at any level, that
  is not the last of its parent: the sum of ``recompute_counts`` times the layer FLOPs.
  """
  validate_plan(plan, chain.n)
  if plan.is_nested:
    return sum(k * f for k, f in zip(_rerun_counts(plan, 0, chain.n), chain.flops))
  last = plan.checkpoints[-1] if plan.checkpoints else 0
  return sum(chain.flops[:last])


def _rerun_counts(plan: Plan, l: int, r: int) -> list[int]:
  """Extra forward runs of layers ``l+1..r`` under ``plan`` splitting segment ``(l, r]``:
  one per enclosing segment, at any level, that is not the last of its parent."""
  counts = [0] * (r - l)
  bounds = (l, *plan.checkpoints, r)
  inner = dict(plan.inner)
  for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
    rerun = 1 if k < len(bounds) - 2 else 0
    sub = _rerun_counts(inner[a], a, b) if a in inner else [0] * (b - a)
    for i in range(a, b):
      counts[i - l] += rerun + sub[i - a]
  return counts
