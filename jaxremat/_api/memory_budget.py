"""``fit``'s ``memory_budget``: checked, read as bytes, and said back in messages."""

from __future__ import annotations

import numbers

from jaxremat._api.planning import fmt_bytes
from jaxremat._errors import InvalidArgumentError, InvalidBudgetError


def check_memory_budget(memory_budget: object) -> None:
  """Raises unless ``memory_budget`` is a positive finite number (not a bool)."""
  if isinstance(memory_budget, bool) or not isinstance(memory_budget, numbers.Real):
    shape = tuple(getattr(memory_budget, "shape", None) or ())
    got = (f"an array of shape {shape}: the model's other inputs go by keyword, "
           "fit(model.apply, params, batch, 0.5, t=t)" if shape else
           f"{type(memory_budget).__name__} {memory_budget!r}")
    raise InvalidArgumentError(
        f"memory_budget must be a share of the activations in (0, 1] or a number of bytes, "
        f"got {got}.")
  value = float(memory_budget)
  if not value > 0 or value == float("inf"):
    raise InvalidBudgetError(
        f"memory_budget must be a share of the activations in (0, 1] or a positive number "
        f"of bytes, got {memory_budget!r}.")


def is_share(memory_budget: float | int) -> bool:
  """A float (numpy's too) in (0, 1] is a share of the activations; an int or a larger
  float, bytes."""
  return not isinstance(memory_budget, numbers.Integral) and memory_budget <= 1


def budget_in_bytes(memory_budget: float | int, fixed: int, no_remat: int) -> int:
  """The budget in bytes: a float in (0, 1] is that share of the activations above
  the fixed bytes."""
  if is_share(memory_budget):
    return int(fixed + memory_budget * max(no_remat - fixed, 0))
  return int(memory_budget)


def budget_read_as(memory_budget: float | int, fixed: int, no_remat: int) -> str:
  """How a share budget was read, for messages ("" for bytes)."""
  if not is_share(memory_budget):
    return ""
  return (f": memory_budget={memory_budget} is the fixed {fmt_bytes(fixed)} (parameters, "
          f"batch, gradients) plus {memory_budget * 100:g}% of the "
          f"{fmt_bytes(max(no_remat - fixed, 0))} of activations above them without remat")
