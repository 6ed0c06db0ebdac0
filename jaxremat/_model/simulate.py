"""Event-level simulator of forward, recompute and backward passes under a (nested) plan."""

from __future__ import annotations

import dataclasses

from jaxremat._model.chain import Chain, Plan, validate_plan


@dataclasses.dataclass(frozen=True)
class Timeline:
  """Live bytes after each allocation or free of one simulated training step.

  Attributes:
    live_bytes: the sum of live buffers (bytes) after event ``k``.
    phases: ``"forward"``, ``"recompute"`` or ``"backward"``: the pass event ``k`` is in.
  """

  live_bytes: tuple[int, ...]
  phases: tuple[str, ...]

  @property
  def peak_bytes(self) -> int:
    """The largest entry of ``live_bytes`` (bytes)."""
    return max(self.live_bytes)


class _Memory:
  """The live buffers (bytes), the running peak of their sum and, optionally, its history."""

  def __init__(self, record: bool = False):
    self.live: dict[tuple[str, int], int] = {}
    self.total = 0
    self.peak = 0
    self.phase = "forward"
    self.history: list[tuple[int, str]] | None = [] if record else None

  def alloc(self, key: tuple[str, int], size: int) -> None:
    assert key not in self.live, key
    self.live[key] = size
    self.total += size
    self.peak = max(self.peak, self.total)
    if self.history is not None:
      self.history.append((self.total, self.phase))

  def free(self, key: tuple[str, int]) -> None:
    self.total -= self.live.pop(key)
    if self.history is not None:
      self.history.append((self.total, self.phase))


class _Run:
  """One training step's forward and backward under a plan, event by event.

  A node is a segment ``(l, r]`` with its sub-plan (``None``: a leaf). Buffers:
  ``("x", c)`` a held checkpoint ``x_c`` (``a_c`` bytes), ``("res", i)`` layer ``i``'s
  residuals (``b_i``, less ``e_{l+1}`` for the first layer of a leaf starting at ``l``,
  whose input ``x_l`` is held), ``("g", i)`` the cotangent of ``x_i`` and ``("w", i)``
  layer ``i``'s backward workspace. Activations passed between layers are transient and,
  as in model R, not counted beyond the residuals that keep them.
  """

  def __init__(self, chain: Chain, record: bool = False):
    self.chain = chain
    self.mem = _Memory(record)
    self.runs = [0] * chain.n  # forward executions of layer i + 1

  @staticmethod
  def children(l: int, r: int, sub: Plan) -> list[tuple[int, int, Plan | None]]:
    bounds = (l, *sub.checkpoints, r)
    inner = dict(sub.inner)
    return [(s, t, inner.get(s)) for s, t in zip(bounds[:-1], bounds[1:])]

  def forward_discarding(self, l: int, r: int) -> None:
    """Layers ``l+1..r`` under ``jax.checkpoint``: run once, nothing kept (nested ones too)."""
    for i in range(l + 1, r + 1):
      self.runs[i - 1] += 1

  def forward_leaf(self, l: int, r: int) -> None:
    """Layers ``l+1..r`` keeping all their residuals (``x_l`` is held)."""
    a = self.chain
    for i in range(l + 1, r + 1):
      self.runs[i - 1] += 1
      own_input = a.input_res_bytes[l] if i == l + 1 else 0
      self.mem.alloc(("res", i), a.res_bytes[i - 1] - own_input)

  def backward_leaf(self, l: int, r: int) -> None:
    """Layers ``r..l+1`` backward; ``g_r`` is live before, ``g_l`` is left live."""
    a = self.chain
    for i in range(r, l, -1):
      self.mem.alloc(("w", i), a.workspace_bytes[i - 1])
      self.mem.alloc(("g", i - 1), a.cot_bytes[i - 1])
      self.mem.free(("w", i))
      self.mem.free(("g", i))
      self.mem.free(("res", i))

  def step(self, plan: Plan) -> None:
    """Forward of the root ``(0, n]`` then its backward, with an explicit task stack.

    Forward of a node: every sub-segment but the last runs under its checkpoint and
    leaves its output held, then the last one runs forward per its own structure.
    Backward of a node: the last sub-segment's backward, then for each earlier one from
    right to left its recomputation from its held input and its backward; a
    sub-segment's held input is freed when its backward is done.
    """
    n = self.chain.n
    self.mem.alloc(("x", 0), self.chain.act_bytes[0])
    tasks: list[tuple] = [("bwd", 0, n, plan), ("seed",), ("fwd", 0, n, plan)]
    while tasks:
      kind, *args = tasks.pop()
      if kind == "seed":
        self.mem.phase = "backward"
        self.mem.alloc(("g", n), self.chain.cot_bytes[n])
      elif kind == "free":
        self.mem.free(("x", args[0]))
      elif kind == "fwd":
        l, r, sub = args
        if self.mem.phase != "forward":
          self.mem.phase = "recompute"
        if sub is None:
          self.forward_leaf(l, r)
          continue
        kids = self.children(l, r, sub)
        for s, t, _ in kids[:-1]:
          self.forward_discarding(s, t)
          self.mem.alloc(("x", t), self.chain.act_bytes[t])
        tasks.append(("fwd", *kids[-1]))
      else:
        l, r, sub = args
        self.mem.phase = "backward"
        if sub is None:
          self.backward_leaf(l, r)
          continue
        kids = self.children(l, r, sub)
        for j, kid in enumerate(kids):  # pushed left to right: run right to left
          if j > 0:
            tasks.append(("free", kid[0]))
          tasks.append(("bwd", *kid))
          if j < len(kids) - 1:
            tasks.append(("fwd", *kid))  # recompute from the held input
    assert set(self.mem.live) == {("x", 0), ("g", 0)}, self.mem.live


def _run(chain: Chain, plan: Plan, record: bool = False) -> _Run:
  validate_plan(plan, chain.n)
  run = _Run(chain, record)
  run.step(plan)
  return run


def simulate_peak_bytes(chain: Chain, plan: Plan) -> int:
  """Peak live bytes of one forward and backward pass under a single- or multi-level plan.

  Replays the pass event by event with explicit buffers: ``x_0`` is always held; a
  checkpoint is held from when it is produced until the backward of the segment it
  starts is done; a layer's residuals live from its (re)computation to its backward;
  ``g_i``, ``g_{i-1}`` and ``w_i`` are live during layer ``i``'s backward. A segment
  under ``jax.checkpoint`` keeps only its input when first run; in the backward pass it
  is recomputed from that input, its own ``inner`` sub-segments again under nested
  checkpoints. On single-level plans this equals ``peak_bytes`` (model R) exactly.

  Args:
    chain: the per-layer byte counts.
    plan: a ``Plan``, possibly with ``inner`` (multi-level).

  Returns:
    The peak in bytes.

  Raises:
    InvalidPlanError: the plan does not fit the chain.
  """
  return _run(chain, plan).mem.peak


def simulate_timeline(chain: Chain, plan: Plan) -> Timeline:
  """The live bytes event by event of the pass ``simulate_peak_bytes`` replays.

  The first entry is ``x_0`` alone; ``Timeline.peak_bytes`` equals
  ``simulate_peak_bytes(chain, plan)`` (and model R's ``peak_bytes`` for single-level
  plans).

  Raises:
    InvalidPlanError: the plan does not fit the chain.
  """
  history = _run(chain, plan, record=True).mem.history
  assert history is not None  # kept with record=True
  return Timeline(live_bytes=tuple(t for t, _ in history), phases=tuple(p for _, p in history))


def recompute_counts(chain: Chain, plan: Plan) -> list[int]:
  """How many times each layer's forward runs beyond the first, ``[layer 1, .., layer n]``.

  A layer runs once more for each enclosing segment (at any level) that is not the last
  of its parent, i.e. that runs under its own ``jax.checkpoint``.

  Raises:
    InvalidPlanError: the plan does not fit the chain.
  """
  return [k - 1 for k in _run(chain, plan).runs]
