"""The error hierarchy: every error jaxremat raises on bad input is a JaxrematError."""

from __future__ import annotations


class JaxrematError(Exception):
  """Base class of every error jaxremat raises on bad input."""


class InvalidArgumentError(JaxrematError, TypeError, ValueError):
  """An argument has the wrong type or an out-of-range value (a non-array leaf in
  ``params``, a ``plan`` that is not a ``Plan``, a negative ``layer_depth``)."""


class InvalidChainError(JaxrematError, ValueError):
  """A Chain was built from inconsistent byte counts."""


class InvalidPlanError(JaxrematError, ValueError):
  """A Plan's checkpoints are not valid for the chain it is applied to."""


class UnknownMethodError(JaxrematError, ValueError):
  """``solve`` was asked for a method it does not have."""


class ChainTooLongError(JaxrematError, ValueError):
  """An exhaustive solver was asked to solve a chain too long for it."""


class NotAChainError(JaxrematError, ValueError):
  """The traced model is not a chain of layers at the chosen granularity."""


class EmptyModelError(JaxrematError, ValueError):
  """The traced model has no layers to checkpoint."""


class InputMismatchError(JaxrematError, ValueError):
  """Inputs given to a remat function do not fit the model it was built for."""


class UnsupportedModelError(JaxrematError, ValueError):
  """The model does something jaxremat cannot re-execute safely."""


class InvalidBudgetError(JaxrematError, ValueError):
  """``budget_bytes`` is missing, NaN or -inf, or given to a method that takes no budget."""


class InfeasibleBudgetError(JaxrematError, ValueError):
  """No plan keeps the peak within the byte budget.

  Attributes:
    budget_bytes: the budget that was asked for (bytes).
    min_feasible_bytes: the least peak any plan reaches (bytes), i.e. the smallest
      budget that would have been feasible.
  """

  def __init__(self, message: str, *, budget_bytes: int, min_feasible_bytes: int):
    super().__init__(message)
    self.budget_bytes = budget_bytes
    self.min_feasible_bytes = min_feasible_bytes

  def __reduce__(self):
    return _rebuild_infeasible, (str(self), self.budget_bytes, self.min_feasible_bytes)


def _rebuild_infeasible(message: str, budget_bytes: int,
                        min_feasible_bytes: int) -> InfeasibleBudgetError:
  return InfeasibleBudgetError(message, budget_bytes=budget_bytes,
                               min_feasible_bytes=min_feasible_bytes)


class UnsupportedScanError(UnsupportedModelError):
  """A scan over stacked parameters that jaxremat cannot segment (see ``apply(scan_segment=)``)."""


class TargetUnavailableError(JaxrematError, RuntimeError):
  """A compile target (``target="h100"``) needs XLA's GPU compiler, which is not available:
  JAX's CUDA plugin is not installed, or it did not register because JAX was started
  without ``JAX_PLATFORMS=cpu`` on a machine without a GPU. The message says what to do."""
