"""Checkpoint solvers: pure Python and NumPy, no JAX. ``solve`` dispatches by name."""

from __future__ import annotations

from collections.abc import Callable

from jaxremat._chain import Chain, Plan
from jaxremat._errors import UnknownMethodError
from jaxremat.solvers._baselines import solve_best_uniform, solve_every_layer, solve_none, solve_sqrt, uniform_plan
from jaxremat.solvers._brute import solve_brute
from jaxremat.solvers._optimal import solve_optimal
from jaxremat.solvers._quadratic import solve_quadratic

SOLVERS: dict[str, Callable[[Chain], Plan]] = {
    "optimal": solve_optimal,
    "quadratic": solve_quadratic,
    "brute": solve_brute,
    "none": solve_none,
    "every-layer": solve_every_layer,
    "sqrt": solve_sqrt,
    "best-uniform": solve_best_uniform,
}


def solve(chain: Chain, method: str = "optimal") -> Plan:
  """Chooses the checkpoints of ``chain`` with the named method.

  Args:
    chain: the per-layer byte counts (see ``jaxremat.Chain``).
    method: one of ``jaxremat.solvers.SOLVERS``: ``"optimal"`` (exact model-R minimum,
      O(n)), ``"quadratic"`` (the same optimum by the O(n^2) recurrence), ``"brute"``
      (exhaustive, n <= 20), ``"none"``, ``"every-layer"``, ``"sqrt"`` (Chen 2016) and
      ``"best-uniform"`` (the best checkpoint-every-k plan).

  Returns:
    A ``Plan`` whose ``method`` names the solver.

  Raises:
    UnknownMethodError: ``method`` is not a known solver.
  """
  if not isinstance(chain, Chain):
    raise TypeError(f"solve expects a jaxremat.Chain, got {type(chain).__name__}.")
  try:
    solver = SOLVERS[method]
  except (KeyError, TypeError):
    raise UnknownMethodError(
        f"unknown method {method!r}; expected one of {sorted(SOLVERS)}.") from None
  return solver(chain)


__all__ = [
    "SOLVERS", "solve", "solve_best_uniform", "solve_brute", "solve_every_layer",
    "solve_none", "solve_optimal", "solve_quadratic", "solve_sqrt", "uniform_plan",
]
