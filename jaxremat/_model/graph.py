"""Graph chains: units in program order whose values may skip over units (U-Net, DenseNet).

A ``GraphChain`` describes a model that is not a chain of layers: its units (Flax
name-stack groups, in the jaxpr's equation order) read values made by any earlier unit.
Cut ``k`` (``0..n``) lies after unit ``k``; its crossing set ``C_k`` holds every value
made at or before unit ``k`` and used after it (model outputs are used after unit ``n``).
A plan keeps cuts (``Plan.checkpoints``, ``1..n-1``); cut 0 (the batch) is always kept.

Model G, the peak of a plan (bytes). The forward pass keeps the union of the crossing
sets of the kept cuts; the last segment also keeps its residuals. The backward pass runs
segment by segment from the last: segment ``(l, r]`` is recomputed from ``C_l`` and, at
its unit ``i`` (from ``r`` down to ``l+1``), the live bytes are

    bytes(H_l)                       kept values still needed: H_l = U_{kept k <= l} C_k
  + bytes(U_{t=l+1..i} S_t \\ H_l)    values units l+1..i save for their backward
  + sum_{t=l+1..i} p_t + w_i         their private residuals, unit i's workspace
  + cot(C_{i-1} U C_i)               cotangents of the values crossing unit i

Every value is counted once however many kept cuts it crosses. On a chain (every unit
reads only its predecessor) model G is model R (``jaxremat.peak_bytes``) exactly.

Why the exact solver is a DP over pairs of kept cuts: a value crossing kept cuts
``k' < k`` is made at or before ``k'``, so ``H_l`` splits into disjoint parts
``D(k', k) = {v : k' < def(v) <= k < use(v)}`` over consecutive kept cuts ``k' < k``;
and the residuals of segment ``(l, r]`` overlap ``H_l`` only in ``C_l``. The peak is
then ``bytes(C_0) + F(0)`` with ``F(l) = min_{r > l} max(L(l, r), D(l, r) + F(r))``
(no ``D + F`` term for ``r = n``), where ``L(l, r)`` is the segment's peak above
``H_l``. See ``jaxremat.solvers._graph``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxremat._model.chain import Chain, Plan, _ints, validate_plan
from jaxremat._errors import InvalidChainError, InvalidPlanError


@dataclasses.dataclass(frozen=True, init=False)
class GraphChain:
  """``n`` units in program order and the values that cross between them, in bytes.

  Attributes:
    value_bytes: bytes of each value ``v`` (a unit's output read later, or a batch input).
    value_cot_bytes: bytes of its cotangent (0 for batch inputs and integer values).
    defined: the unit ``1..n`` that makes each value; 0 for a batch input.
    last_use: the last unit that reads it; ``n + 1`` for a model output.
    saved: per unit ``1..n``, the values (indices into ``value_bytes``) its backward
      saves: inputs it reads or outputs it makes.
    res_bytes: per unit, bytes of the other residuals its backward saves.
    workspace_bytes: per unit, transient bytes during its backward (default 0).
    flops: per unit, forward FLOPs (what a recomputation costs).
    names: a name per unit.
  """

  value_bytes: tuple[int, ...]
  value_cot_bytes: tuple[int, ...]
  defined: tuple[int, ...]
  last_use: tuple[int, ...]
  saved: tuple[tuple[int, ...], ...]
  res_bytes: tuple[int, ...]
  workspace_bytes: tuple[int, ...]
  flops: tuple[int, ...]
  names: tuple[str, ...]

  def __init__(
      self,
      value_bytes: Sequence[int],
      defined: Sequence[int],
      last_use: Sequence[int],
      res_bytes: Sequence[int],
      *,
      value_cot_bytes: Sequence[int] | None = None,
      saved: Sequence[Sequence[int]] | None = None,
      workspace_bytes: Sequence[int] | None = None,
      flops: Sequence[int] | None = None,
      names: Sequence[str] | None = None,
  ):
    n = len(res_bytes)
    m = len(value_bytes)
    size = _ints("value_bytes", value_bytes, m, ())
    cot = _ints("value_cot_bytes", value_cot_bytes, m, size)
    made = _ints("defined", defined, m, ())
    last = _ints("last_use", last_use, m, ())
    bad = [v for v in range(m) if not made[v] < last[v] <= n + 1 or made[v] > n]
    if bad:
      raise InvalidChainError(
          f"values {bad} need 0 <= defined < last_use <= n + 1 = {n + 1}; got defined="
          f"{[made[v] for v in bad]}, last_use={[last[v] for v in bad]}.")
    keep = tuple(tuple(sorted(set(int(v) for v in s))) for s in (saved if saved is not None else [()] * n))
    if len(keep) != n:
      raise InvalidChainError(f"saved has {len(keep)} entries, expected {n}.")
    for t, s in enumerate(keep, start=1):
      wrong = [v for v in s if not (0 <= v < m and made[v] <= t <= last[v])]
      if wrong:
        raise InvalidChainError(
            f"unit {t} saves values {wrong} that it neither makes nor reads (a saved value "
            "v needs defined[v] <= unit <= last_use[v]).")
    nm = tuple(str(s) for s in names) if names is not None else tuple(f"unit_{t}" for t in range(1, n + 1))
    if len(nm) != n:
      raise InvalidChainError(f"names has {len(nm)} entries, expected {n}.")
    fields = dict(value_bytes=size, value_cot_bytes=cot, defined=made, last_use=last, saved=keep,
                  res_bytes=_ints("res_bytes", res_bytes, n, ()),
                  workspace_bytes=_ints("workspace_bytes", workspace_bytes, n, (0,) * n),
                  flops=_ints("flops", flops, n, (0,) * n), names=nm)
    for key, value in fields.items():
      object.__setattr__(self, key, value)

  @property
  def n(self) -> int:
    """Number of units."""
    return len(self.res_bytes)

  def crossing(self, k: int) -> frozenset[int]:
    """``C_k``: the values made at or before unit ``k`` and used after it."""
    return frozenset(v for v, (d, u) in enumerate(zip(self.defined, self.last_use)) if d <= k < u)

  def crossing_bytes(self, k: int) -> int:
    """Bytes of ``C_k``, the cost of keeping cut ``k`` alone."""
    return sum(self.value_bytes[v] for v in self.crossing(k))

  @classmethod
  def from_chain(cls, chain: Chain) -> GraphChain:
    """The graph chain of a chain: value ``i`` is ``x_i``; its model G is model R."""
    n = chain.n
    saved = []
    for t in range(1, n + 1):
      # e_t bytes of b_t are x_{t-1}: saved as that value when it is all of x_{t-1}.
      whole = chain.input_res_bytes[t - 1] == chain.act_bytes[t - 1] and chain.act_bytes[t - 1] > 0
      saved.append((t - 1,) if whole else ())
    own = [chain.input_res_bytes[t - 1] if saved[t - 1] else 0 for t in range(1, n + 1)]
    if any(e and not s for e, s in zip(chain.input_res_bytes, saved)):
      raise InvalidChainError("from_chain needs each input_res_bytes to be 0 or all of x_{i-1}.")
    return cls(
        value_bytes=chain.act_bytes, value_cot_bytes=chain.cot_bytes,
        defined=range(n + 1), last_use=[*range(1, n + 1), n + 1], saved=saved,
        res_bytes=[b - e for b, e in zip(chain.res_bytes, own)],
        workspace_bytes=chain.workspace_bytes, flops=chain.flops, names=chain.names)


def graph_peak_bytes(graph: GraphChain, plan: Plan) -> int:
  """Model G's peak (bytes) of one forward and backward pass under ``plan``.

  The maximum over segments ``(l, r]`` and units ``i`` in them of the live bytes in the
  module docstring: kept values ``H_l`` (each counted once), the segment's saved values
  and private residuals up to unit ``i``, unit ``i``'s workspace and the cotangents of
  ``C_{i-1} U C_i``.

  Raises:
    InvalidPlanError: the plan does not fit the graph, or is multi-level.
  """
  if plan.is_nested:
    raise InvalidPlanError("graph chains take single-level plans (no Plan.inner).")
  n = graph.n
  validate_plan(plan, n)
  size, cot = graph.value_bytes, graph.value_cot_bytes
  held: set[int] = set()
  peak = 0
  for l, r in plan.segments(n):
    held |= graph.crossing(l)
    base = sum(size[v] for v in held)
    saved: set[int] = set()
    private = 0
    for i in range(l + 1, r + 1):
      saved |= set(graph.saved[i - 1]) - held
      private += graph.res_bytes[i - 1]
      grads = sum(cot[v] for v in graph.crossing(i - 1) | graph.crossing(i))
      live = base + sum(size[v] for v in saved) + private + graph.workspace_bytes[i - 1] + grads
      peak = max(peak, live)
  return peak


def graph_recompute_flops(graph: GraphChain, plan: Plan) -> int:
  """FLOPs recomputed: every unit of every non-final segment runs twice."""
  validate_plan(plan, graph.n)
  return sum(graph.flops[: plan.checkpoints[-1] if plan.checkpoints else 0])
