"""fit's memory_budget: a share of the activations or bytes, whatever number type holds it."""

import numpy as np
import pytest

from jaxremat._api.memory_budget import budget_in_bytes, is_share


@pytest.mark.parametrize("share", [0.5, np.float64(0.5), np.float32(0.5)])
def test_a_float_in_the_unit_interval_is_a_share_whatever_its_type(share):
  # a user's trial: np.float32(0.5) was read as 0 bytes
  assert is_share(share)
  assert budget_in_bytes(share, 100, 300) == 200  # the fixed bytes and half the rest


@pytest.mark.parametrize("number", [1, np.int64(1), 2.0, np.float32(1e6), 4096])
def test_an_int_or_a_float_above_one_is_bytes(number):
  assert not is_share(number)
  assert budget_in_bytes(number, 100, 300) == int(number)
