"""Checkpoint solvers: pure Python and NumPy, no JAX. ``solve`` dispatches by name."""

from __future__ import annotations

from collections.abc import Callable

from jaxremat._model.chain import Chain, Plan
from jaxremat._errors import InvalidArgumentError, InvalidBudgetError, UnknownMethodError
from jaxremat.solvers._baselines import (solve_best_uniform, solve_every_layer, solve_none,
                                         solve_sqrt, uniform_plan)
from jaxremat.solvers._brute import solve_brute
from jaxremat.solvers._brute_a import solve_brute_a
from jaxremat.solvers._budget import solve_budget
from jaxremat.solvers._dp import solve_dp
from jaxremat.solvers._greedy import solve_chen_greedy
from jaxremat.solvers._model_a import cost_a
from jaxremat.solvers._multilevel import solve_multilevel
from jaxremat.solvers._optimal import solve_optimal
from jaxremat.solvers._pareto import pareto
from jaxremat.solvers._quadratic import solve_quadratic

SOLVERS: dict[str, Callable[[Chain], Plan]] = {
    "optimal": solve_optimal,
    "quadratic": solve_quadratic,
    "brute": solve_brute,
    "dp": solve_dp,
    "brute-a": solve_brute_a,
    "none": solve_none,
    "every-layer": solve_every_layer,
    "sqrt": solve_sqrt,
    "best-uniform": solve_best_uniform,
    "chen-greedy": solve_chen_greedy,
    "multilevel": solve_multilevel,
}

# Methods that need ``budget_bytes`` (bytes of model-R peak allowed).
BUDGET_SOLVERS: dict[str, Callable[[Chain, int], Plan]] = {
    "budget": solve_budget,
}


def solve(chain: Chain, method: str = "optimal", *,
          budget_bytes: int | float | None = None) -> Plan:
  """Chooses the checkpoints of ``chain`` with the named method.

  Args:
    chain: the per-layer byte counts (see ``jaxremat.Chain``).
    method: one of ``jaxremat.solvers.SOLVERS`` or ``BUDGET_SOLVERS``:

      - model R (``peak_bytes``): ``"optimal"`` (exact minimum, and among plans of
        that peak the one recomputing least; O(n): three linear passes),
        ``"quadratic"`` (the same optimum by the O(n^2) recurrence), ``"brute"``
        (exhaustive, n <= 20);
      - model A (``cost_a``, Hong et al.'s first model): ``"dp"`` (exact,
        O(n^3) with branch and bound), ``"brute-a"`` (exhaustive, n <= 20);
      - baselines: ``"none"``, ``"every-layer"``, ``"sqrt"`` (Chen 2016),
        ``"best-uniform"`` (the best checkpoint-every-k plan), ``"chen-greedy"``
        (Chen 2016's greedy with its threshold search);
      - ``"multilevel"``: the least peak over nested (multi-level) plans, whose
        ``Plan.inner`` splits recomputed segments again; scored by
        ``jaxremat._model.simulate.simulate_peak_bytes`` (model R on single-level plans),
        never above ``"optimal"``; O(n^3), n <= 400;
      - ``"budget"``: the fewest recomputed FLOPs with ``peak_bytes <= budget_bytes``
        (O(n): two linear passes).
    budget_bytes: the peak allowed (bytes, model R); required by ``"budget"`` and
      refused by every other method.

  Returns:
    A ``Plan`` whose ``method`` names the solver.

  Raises:
    UnknownMethodError: ``method`` is not a known solver.
    InvalidBudgetError: ``budget_bytes`` is missing for ``"budget"``, given to a
      method that takes none, NaN or -inf.
    InfeasibleBudgetError: no plan peaks within ``budget_bytes``; its
      ``min_feasible_bytes`` is the least budget that works.
    InvalidArgumentError: (a TypeError) ``chain`` is not a ``Chain``, or
      ``budget_bytes`` not a number.
  """
  if not isinstance(chain, Chain):
    raise InvalidArgumentError(f"solve expects a jaxremat.Chain, got {type(chain).__name__}.")
  try:
    known = method in SOLVERS or method in BUDGET_SOLVERS
  except TypeError:  # unhashable
    known = False
  if not known:
    raise UnknownMethodError(
        f"unknown method {method!r}; expected one of {sorted([*SOLVERS, *BUDGET_SOLVERS])}.")
  if method in BUDGET_SOLVERS:
    if budget_bytes is None:
      raise InvalidBudgetError(
          f"method={method!r} needs budget_bytes, the peak allowed in bytes (model R); "
          f"e.g. solve(chain, {method!r}, budget_bytes=2 * 2**30).")
    return BUDGET_SOLVERS[method](chain, budget_bytes)
  if budget_bytes is not None:
    raise InvalidBudgetError(
        f"budget_bytes is only used by method={' or '.join(map(repr, sorted(BUDGET_SOLVERS)))}; "
        f"method={method!r} takes "
        f"no budget. Use method='budget' for the fewest recomputed FLOPs within "
        f"{budget_bytes!r} bytes, or drop budget_bytes.")
  return SOLVERS[method](chain)


__all__ = [
    "BUDGET_SOLVERS", "SOLVERS", "cost_a", "pareto", "solve", "solve_best_uniform",
    "solve_brute", "solve_brute_a", "solve_budget", "solve_chen_greedy", "solve_dp",
    "solve_every_layer", "solve_multilevel", "solve_none", "solve_optimal", "solve_quadratic",
    "solve_sqrt", "uniform_plan",
]
