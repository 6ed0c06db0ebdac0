"""Verification by compiling: keep the plan XLA measures smallest, or fit a budget as XLA counts it."""

from __future__ import annotations

from collections.abc import Callable

from jaxremat._api.planner import Planner
from jaxremat._api.planning import TIE, fmt_bytes, tighten
from jaxremat._errors import InfeasibleBudgetError
from jaxremat._jaxpr import scan as _scan
from jaxremat._jaxpr.trace import TracedChain
from jaxremat._model.chain import Plan

#: Whole-step compiles ``verify`` makes at most to pick a plan (the chosen plan included).
MAX_COMPILES = 6
#: Extra compiles ``confirm_plan`` makes at most: the estimate's ties of the plan when XLA
#: meets the prediction, other candidates when it misses.
CONFIRM_EXTRA = 3
#: A measured footprint further than this fraction from the prediction is a miss.
CONFIRM_TOLERANCE = 0.03
#: Candidates predicted more than this fraction above the least prediction are not compiled.
PRUNE_ABOVE = 0.10
#: Checkpoint-every-k plans compiled at most, least prediction first, before a budget that
#: no plan the search tried fits is called infeasible (VGG-11 at half its activations on
#: the H100: the profile predicts every-7 22% high, XLA fits it 6% under the budget).
SWEEP_COMPILES = 6
#: The sweep runs only when the least footprint found is at most this fraction over the
#: budget: the profile's misses of checkpoint-every-k plans reach 22% (that VGG-11).
SWEEP_WITHIN = 0.25
_SAME_FOOTPRINT = 0.001  # relative: XLA footprints this close are one figure
#: A plan XLA measures at most this fraction above the least is returned in its place when
#: it recomputes at least this fraction fewer FLOPs: a share of memory this small does not
#: pay for more recompute (a user's nnx Mixer with a scanned stack: every layer
#: recomputed around the segmented scan measured 0.6% less than no checkpoint between
#: layers, at 27% more FLOPs: a step 19% slower than nnx.remat in the scan body, which
#: recomputes as the latter does).
RECOMPUTE_TRADE = 0.01
_FIT_ROUNDS = 6  # whole-step compiles at most while tightening a budget plan

Measured = dict[tuple[int, ...], int]  # XLA's footprint (bytes) by checkpoints


def least_measured(measured: Measured,
                   recompute: Callable[[tuple[int, ...]], float]) -> tuple[int, ...]:
  """The plan (checkpoints) of least ``recompute`` FLOPs among those whose XLA footprint
  (``measured``, bytes) is within ``_SAME_FOOTPRINT`` of the least; then fewest bytes
  (footprints a few bytes apart, alignment, are one figure). Replaced by the plan of
  least recompute within ``RECOMPUTE_TRADE`` of the least footprint where that one
  recomputes ``RECOMPUTE_TRADE`` fewer FLOPs or less."""
  least = min(measured.values())
  key = lambda c: (recompute(c), measured[c], len(c))  # noqa: E731
  best = min((c for c in measured if _same(measured[c], least)), key=key)
  bound = recompute(best) * (1 - RECOMPUTE_TRADE)
  cheaper = [c for c in measured
             if measured[c] <= least * (1 + RECOMPUTE_TRADE) and recompute(c) <= bound]
  return min(cheaper, key=key) if cheaper else best


def shortlist(planner: Planner, plan: Plan, limit: int = MAX_COMPILES,
              spread: bool = False, prune_above: float = PRUNE_ABOVE,
              first: tuple[Plan, ...] = ()) -> list[Plan]:
  """``plan`` and up to ``limit - 1`` of the planner's candidates: where the planner ranks
  its candidates by prediction, least predicted first, leaving out those predicted more
  than ``prune_above`` (a fraction) above the least prediction; else in the planner's
  order.

  ``spread``: the candidates predicted the same footprint as ``plan`` and one checkpoint
  move from it (one added, dropped or moved) go last. After XLA missed ``plan``'s
  prediction, those are likely off the same way (the estimate cannot tell them apart); a
  plan the estimate tells apart, or of another structure, is a new measurement.

  ``first``: plans to compile before the ranked ones, unpruned (a second opinion).
  """
  found = {p.checkpoints: Plan(p.checkpoints) for p in planner.candidates(plan) if not p.is_nested}
  found.pop(plan.checkpoints, None)
  ranked = list(found)
  if planner.ranks_candidates:
    predicted = {c: planner.total_bytes(p) for c, p in found.items()}
    own = planner.total_bytes(plan)
    least = min([own, *predicted.values()])
    ranked = sorted((c for c in found if predicted[c] <= least * (1 + prune_above)),
                    key=lambda c: (predicted[c], planner.recompute_flops(found[c])))
    if spread:  # stable: the candidates predicted as ``plan`` was, a move from it, go last
      moves = lambda c: len(set(c) ^ set(plan.checkpoints))  # noqa: E731
      ranked.sort(key=lambda c: predicted[c] == own and moves(c) <= 2)
  ahead = [p for p in dict.fromkeys(Plan(p.checkpoints) for p in first)
           if p.checkpoints != plan.checkpoints]
  ranked = [c for c in ranked if c not in {p.checkpoints for p in ahead}]
  return [plan, *ahead, *(found[c] for c in ranked)][:limit]


def confirm_plan(planner: Planner, plan: Plan, measured_bytes: Callable[[Plan], int],
                 second_opinion: Callable[[], tuple[Plan, ...]] | None = None,
                 known: Measured | None = None) -> tuple[Plan, Measured]:
  """Compiles ``plan`` and keeps XLA's least of what it compiles and of ``known`` (plans
  compiled already, e.g. a scanned model's stacks segmented with no checkpoint between
  layers: candidates too, but no ties of ``plan``).

  When XLA's footprint is within ``CONFIRM_TOLERANCE`` of the prediction, also compiles
  up to ``CONFIRM_EXTRA`` plans the prediction ties with ``plan`` (``planner.ties``: one
  checkpoint from it, or on a chain from model R's optimum, predicted at most 1% above
  it): where the prediction cannot tell plans apart, XLA can. When XLA measures the first
  ties as ``plan``, the last compile goes to a plan of another structure instead
  (``_other_structure``). Otherwise,
  ``CONFIRM_EXTRA`` candidates (``shortlist`` with ``spread``), pruned by their
  prediction only beyond ``PRUNE_ABOVE`` plus the miss: this model's predictions are
  that far off; the planner's ``second_opinion`` first (or the one given: asked only
  on a miss).
  """
  measured = measured_bytes(plan)
  miss = abs(measured - planner.total_bytes(plan)) / measured
  if miss <= CONFIRM_TOLERANCE:
    found = {plan.checkpoints: measured}
    ties = planner.ties(plan, CONFIRM_EXTRA)
    for tie in ties[:CONFIRM_EXTRA - 1]:
      found.setdefault(tie.checkpoints, measured_bytes(tie))
    last = ties[CONFIRM_EXTRA - 1:]
    if len(found) > 1 and all(_same(b, measured) for b in found.values()):
      last = [*_other_structure(planner, plan, found), *last][:1]
    for p in last:
      found.setdefault(p.checkpoints, measured_bytes(p))
    found = {**(known or {}), **found}
    return least_plan(planner, plan, found, "confirmed"), found
  return verify_plan(planner, plan, measured_bytes, limit=1 + CONFIRM_EXTRA,
                     known={**(known or {}), plan.checkpoints: measured}, spread=True,
                     prune_above=PRUNE_ABOVE + miss,
                     first=(second_opinion or planner.second_opinion)(),
                     how="confirmed")


def verify_plan(planner: Planner, plan: Plan, measured_bytes: Callable[[Plan], int],
                limit: int = MAX_COMPILES, known: Measured | None = None,
                spread: bool = False, prune_above: float = PRUNE_ABOVE,
                first: tuple[Plan, ...] = (), how: str = "verified"
                ) -> tuple[Plan, Measured]:
  """Compiles ``shortlist(planner, plan, limit, spread, prune_above, first)`` (less what
  ``known`` holds) and keeps the plan XLA measures smallest (its method marked ``how``
  when it is another plan)."""
  measured = dict(known or {})
  for p in shortlist(planner, plan, limit, spread, prune_above, first):
    if p.checkpoints not in measured:
      measured[p.checkpoints] = measured_bytes(p)
  return least_plan(planner, plan, measured, how), measured


def _same(a: int, b: int) -> bool:
  """Two XLA footprints (bytes) within ``_SAME_FOOTPRINT`` of each other."""
  return abs(a - b) <= min(a, b) * _SAME_FOOTPRINT


def _other_structure(planner: Planner, plan: Plan, measured: Measured) -> list[Plan]:
  """The checkpoint-every-k plan of least prediction, not in ``measured``, that the
  planner does not predict as a tie of ``plan`` (within ``TIE``), if any: once XLA has
  measured the ties alike, a plan of another segment length is a new measurement (a
  GroupNorm conv net on CPU: the ties 6.01 MiB, every-3, predicted 2.8% above, 5.20)."""
  own = planner.total_bytes(plan)
  for p in planner.best_uniform(planner.chain.n):
    if p.checkpoints not in measured and abs(planner.total_bytes(p) - own) > own * TIE:
      return [p]
  return []


def least_plan(planner: Planner, plan: Plan, measured: Measured, how: str) -> Plan:
  """``plan`` when it is ``least_measured``; else that plan, its method marked ``how``."""
  best = least_measured(measured, lambda c: planner.recompute_flops(Plan(c)))
  return plan if best == plan.checkpoints else Plan(best, method=f"{plan.method}+{how}")


def fit_budget(planner: Planner, budget_bytes: int, measured_bytes: Callable[[Plan], int],
               searchable: bool = True) -> tuple[Plan, Measured]:
  """The budget plan, tightened until XLA's footprint of it fits ``budget_bytes``.

  The model's own budget plans (model R's or G's, ``model_budget_plan``), each compiled
  once: one over the budget by ``d`` bytes lowers the model's budget by ``d``, and below
  the model's figure for it (``tighten``), and the plan is solved again. Not the replay's
  plans: on the H100 its tightening ruled out plans XLA fitted (the ResNet-18 at half its
  activations: 4% more recompute; the bf16 uneven MLP at 75%: twice as much). When the
  model runs out of plans first, the planner's fallback plans are measured, least
  recompute first, and the first that fits is kept; then the checkpoint-every-k plans
  (``sweep_uniform``), then the least-peak plan default ``apply`` solves for.

  Raises:
    InfeasibleBudgetError: no plan tried fits; it carries the least XLA-measured footprint
      (its message points to ``layer_depth='search'`` where ``searchable``: no segmented
      scanned stack).
  """
  seen: Measured = {}

  def measure(plan: Plan) -> int:
    if plan.checkpoints not in seen:
      seen[plan.checkpoints] = measured_bytes(plan)
    return seen[plan.checkpoints]

  plan = tighten(planner.model_budget_plan, planner.model_total_bytes, measure, budget_bytes,
                 _FIT_ROUNDS)
  if plan is not None:
    return plan, seen
  fallback = dict.fromkeys(Plan(p.checkpoints) for p in planner.budget_fallbacks())
  for candidate in sorted(fallback, key=planner.recompute_flops):
    if measure(candidate) <= budget_bytes:
      return Plan(candidate.checkpoints, method="budget"), seen
  least = min(seen.values())
  swept = sweep_uniform(planner, budget_bytes, least, measure, lambda p: p.checkpoints in seen)
  if swept is not None:
    return Plan(swept[0].checkpoints, method="budget"), seen
  smallest = planner.solve("optimal")  # the least-peak plan, as default apply solves it
  if measure(smallest) <= budget_bytes:
    return Plan(smallest.checkpoints, method="budget"), seen
  least = min(seen.values())
  raise InfeasibleBudgetError(
      f"budget_bytes={budget_bytes} ({fmt_bytes(budget_bytes)}) is below the least footprint "
      f"XLA compiled for the {len(seen)} plans jaxremat tried, the least-peak plan among "
      f"them: {least} bytes ({fmt_bytes(least)}). Raise the budget or shrink the batch"
      + (" (apply(layer_depth='search') plans below these layers too and keeps what XLA "
         "measures least)." if searchable else "."),
      budget_bytes=budget_bytes, min_feasible_bytes=least)


def sweep_uniform(planner: Planner, budget_bytes: int, least_bytes: int,
                  measured_bytes: Callable[[Plan], int], was_compiled: Callable[[Plan], bool]
                  ) -> tuple[Plan, int] | None:
  """The first checkpoint-every-k plan XLA fits in ``budget_bytes``, with its footprint
  (bytes), of the ``SWEEP_COMPILES`` not compiled yet that the planner predicts smallest:
  the plans a user would try by hand, once the prediction has missed. None when none of
  them fits, or none is compiled: ``least_bytes`` (the least footprint found so far) is
  more than ``SWEEP_WITHIN`` over the budget."""
  if least_bytes > budget_bytes * (1 + SWEEP_WITHIN):
    return None
  fresh = [p for p in planner.best_uniform(planner.chain.n) if not was_compiled(p)]
  for plan in fresh[:SWEEP_COMPILES]:
    footprint = measured_bytes(plan)
    if footprint <= budget_bytes:
      return plan, footprint
  return None


def measured_segments(traced: TracedChain,
                      measured_bytes: Callable[[TracedChain, tuple[_scan.ScanPlan, ...]], int],
                      nearby: bool = False) -> tuple[int, ...] | str:
  """Per scanned stack, the segment length whose training step XLA measures smallest, of
  ``_scan.sweep_lengths`` (the divisors of its length and the estimate's length,
  ``choose_segment``; for an RNN the powers of two below it), one stack at a time, the
  others as model R chose; a length of one is compiled in both forms (an inner scan of
  one block, and the block itself: ``_scan.BLOCK``). ``nearby``: of the estimate's
  length and those next to it only (two to four compiles a stack, where the sweep is one
  each)."""
  _, scans = _scan.rewrite(traced, "auto")
  segments = [s.segment for s in scans]
  for j, s in enumerate(scans):
    lengths = _scan.sweep_lengths(s.length, s.segment, s.recurrent)
    if len(lengths) == 1:
      continue  # one iteration: nothing to choose
    if nearby:
      at = lengths.index(s.segment)
      lengths = lengths[max(at - 1, 0):at + 2]
    if lengths[0] == 1:
      lengths.insert(0, _scan.BLOCK)  # a tie keeps the inner scan (the larger k below)
    sizes = {}
    for k in lengths:
      trial = (*segments[:j], k, *segments[j + 1:])
      sizes[k] = measured_bytes(*_scan.rewrite(traced, trial))
    segments[j] = min(sizes, key=lambda k: (sizes[k], -k))
  return tuple(segments) if scans else "auto"
