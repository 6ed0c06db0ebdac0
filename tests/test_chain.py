"""Tests of Chain, Plan, peak_bytes and recompute_flops against literal model-R code."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest

from jaxremat import (Chain, InvalidChainError, InvalidPlanError, JaxrematError, Plan,
                      peak_bytes, recompute_flops)

# The worked example of docs/design.md ("Memory model R").
from oracles import literal_peak_of, literal_recompute_flops, random_chain  # noqa: E402

WORKED_A = [1, 2, 2, 2, 1]
WORKED_B = [3, 3, 3, 3]

def random_plan(rng: random.Random, n: int) -> tuple[int, ...]:
  p = rng.random()
  return tuple(c for c in range(1, n) if rng.random() < p)


# --- the worked example ---------------------------------------------------------------


@pytest.mark.parametrize("checkpoints, expected", [
    ((), 16), ((2,), 12), ((1, 2, 3), 13), ((2, 3), 11)])
def test_worked_example(checkpoints, expected):
  chain = Chain(WORKED_A, WORKED_B)
  assert peak_bytes(chain, Plan(checkpoints)) == expected
  assert literal_peak_of(chain, checkpoints) == expected


def test_worked_example_optimum_is_11_at_2_3():
  chain = Chain(WORKED_A, WORKED_B)
  peaks = {cps: peak_bytes(chain, Plan(cps))
           for k in range(4) for cps in itertools.combinations((1, 2, 3), k)}
  assert min(peaks.values()) == 11
  assert [cps for cps, p in peaks.items() if p == 11] == [(2, 3)]


def test_worked_example_cot_defaults_to_act():
  assert Chain(WORKED_A, WORKED_B).cot_bytes == tuple(WORKED_A)
  explicit = Chain(WORKED_A, WORKED_B, cot_bytes=WORKED_A)
  for cps in [(), (2,), (1, 2, 3), (2, 3)]:
    assert peak_bytes(explicit, Plan(cps)) == peak_bytes(Chain(WORKED_A, WORKED_B), Plan(cps))


# --- refinements by hand ----------------------------------------------------------------


def test_input_res_subtracted_once_at_each_segment_start():
  # a = 4 each, b = 5 each, e = 4 each (each layer saves its 4-byte input), g = a.
  chain = Chain([4, 4, 4], [5, 5], input_res_bytes=[4, 4])
  # One segment (0, 2]: held a_0 = 4; layer 2: 4 + (5 + 5 - e_1) + g_2 + g_1 = 18.
  assert peak_bytes(chain, Plan(())) == 18
  # (0, 1]: 4 + (5 - 4) + 8 = 13; (1, 2]: 8 + (5 - e_2) + 8 = 17.
  assert peak_bytes(chain, Plan((1,))) == 17


def test_workspace_added_at_its_layer_only():
  chain = Chain([0, 0, 0], [0, 0], workspace_bytes=[0, 9])
  assert peak_bytes(chain, Plan(())) == 9
  chain = Chain([0, 0, 0], [1, 0], workspace_bytes=[9, 0])
  # Layer 1: 1 + 9; layer 2: b_1 + b_2 = 1 (the workspace of layer 1 is gone).
  assert peak_bytes(chain, Plan(())) == 10
  assert peak_bytes(chain, Plan((1,))) == 10


def test_later_checkpoints_are_freed():
  # x_2 is large; segment (0, 2] runs its backward after x_2 was freed.
  chain = Chain([0, 0, 100, 0], [50, 1, 1], cot_bytes=[0, 0, 0, 0])
  # (2, 3]: a_0 + a_2 + b_3 = 101; (0, 2]: a_0 + b_1 + b_2 = 51 (not 151).
  assert peak_bytes(chain, Plan((2,))) == 101
  # (0, 1]: 50; (1, 3]: a_0 + a_1 + b_2 + b_3 = 2.
  assert peak_bytes(chain, Plan((1,))) == 50


def test_single_layer_chain():
  chain = Chain([3, 5], [7], cot_bytes=[2, 4], input_res_bytes=[3], workspace_bytes=[1])
  # 3 + (7 - 3) + 1 + 4 + 2
  assert peak_bytes(chain, Plan(())) == 14


# --- peak_bytes against the literal formula --------------------------------------------


@pytest.mark.parametrize("batch", range(6))
@pytest.mark.parametrize("refine", [False, True], ids=["plain", "refined"])
def test_peak_matches_literal_on_random_chains(batch, refine):
  for seed in range(batch * 500, (batch + 1) * 500):
    rng = random.Random(seed * 2 + refine)
    n = rng.randint(1, 12)
    chain = random_chain(rng, n, refine)
    plans = {random_plan(rng, n) for _ in range(3)} | {(), tuple(range(1, n))}
    for cps in plans:
      assert peak_bytes(chain, Plan(cps)) == literal_peak_of(chain, cps), (seed, chain, cps)


@pytest.mark.parametrize("refine", [False, True], ids=["plain", "refined"])
def test_peak_matches_literal_on_every_plan_of_small_chains(refine):
  for seed in range(300):
    rng = random.Random(10**6 + seed * 2 + refine)
    n = rng.randint(1, 6)
    chain = random_chain(rng, n, refine)
    for k in range(n):
      for cps in itertools.combinations(range(1, n), k):
        assert peak_bytes(chain, Plan(cps)) == literal_peak_of(chain, cps), (seed, chain, cps)


def test_peak_accepts_numpy_integers():
  chain = Chain(np.array(WORKED_A, dtype=np.int64), np.array(WORKED_B, dtype=np.int32))
  assert all(type(v) is int for v in chain.act_bytes + chain.res_bytes)
  assert peak_bytes(chain, Plan(np.array([2, 3]))) == 11


# --- recompute_flops --------------------------------------------------------------------


def test_recompute_flops_by_hand():
  chain = Chain([1] * 5, [1] * 4, flops=[10, 20, 30, 40])
  assert recompute_flops(chain, Plan(())) == 0
  assert recompute_flops(chain, Plan((1,))) == 10
  assert recompute_flops(chain, Plan((1, 3))) == 60
  assert recompute_flops(chain, Plan((3,))) == 60
  assert recompute_flops(chain, Plan((1, 2, 3))) == 60


def test_recompute_flops_matches_literal_on_random_chains():
  for seed in range(2000):
    rng = random.Random(seed)
    n = rng.randint(1, 15)
    chain = random_chain(rng, n, refine=False)
    cps = random_plan(rng, n)
    assert recompute_flops(chain, Plan(cps)) == literal_recompute_flops(chain.flops, cps)


def test_recompute_flops_validates_plan():
  with pytest.raises(InvalidPlanError, match=r"out of range for a chain of 3 layers"):
    recompute_flops(Chain([1] * 4, [1] * 3), Plan((3,)))


# --- Chain fields and defaults ----------------------------------------------------------


def test_chain_defaults():
  chain = Chain([1, 2, 3], [4, 5])
  assert chain.n == 2
  assert chain.cot_bytes == (1, 2, 3)
  assert chain.input_res_bytes == (0, 0)
  assert chain.workspace_bytes == (0, 0)
  assert chain.flops == (0, 0)
  assert chain.names == ("layer_1", "layer_2")


def test_chain_is_frozen():
  chain = Chain([1, 2], [3])
  with pytest.raises(dataclasses.FrozenInstanceError):
    chain.act_bytes = (0, 0)  # type: ignore[misc]


def test_chain_of_zero_layers():
  chain = Chain([5], [])
  assert chain.n == 0
  assert Plan(()).segments(0) == [(0, 0)]


# --- Chain validation -------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    (dict(act_bytes=[1, 2], res_bytes=[1, 2]), r"act_bytes has 2 entries, expected 3"),
    (dict(act_bytes=[], res_bytes=[]), r"act_bytes has 0 entries, expected 1"),
    (dict(act_bytes=[1, 2, 3, 4], res_bytes=[1, 2]), r"act_bytes has 4 entries, expected 3"),
    (dict(act_bytes=[1, 2, 3], res_bytes=[1, 2], cot_bytes=[1, 2]),
     r"cot_bytes has 2 entries, expected 3"),
    (dict(act_bytes=[1, 2, 3], res_bytes=[1, 2], input_res_bytes=[0]),
     r"input_res_bytes has 1 entries, expected 2"),
    (dict(act_bytes=[1, 2, 3], res_bytes=[1, 2], workspace_bytes=[0, 0, 0]),
     r"workspace_bytes has 3 entries, expected 2"),
    (dict(act_bytes=[1, 2, 3], res_bytes=[1, 2], flops=[1]), r"flops has 1 entries, expected 2"),
    (dict(act_bytes=[1, 2, 3], res_bytes=[1, 2], names=["x"]), r"names has 1 entries, expected 2"),
])
def test_chain_rejects_wrong_lengths(kwargs, message):
  with pytest.raises(InvalidChainError, match=message):
    Chain(**kwargs)


@pytest.mark.parametrize("field", [
    "act_bytes", "res_bytes", "cot_bytes", "input_res_bytes", "workspace_bytes", "flops"])
def test_chain_rejects_negatives(field):
  kwargs = dict(act_bytes=[1, 2, 3], res_bytes=[4, 5], cot_bytes=[1, 2, 3],
                input_res_bytes=[0, 0], workspace_bytes=[0, 0], flops=[0, 0])
  kwargs[field] = list(kwargs[field])
  kwargs[field][-1] = -1
  with pytest.raises(InvalidChainError, match=rf"{field} must be non-negative"):
    Chain(**kwargs)


def test_chain_rejects_input_res_above_res():
  with pytest.raises(InvalidChainError, match=r"input_res_bytes\[i\] is part of res_bytes\[i\] "
                     r"and cannot exceed it"):
    Chain([1, 2, 3], [4, 5], input_res_bytes=[4, 6])
  Chain([1, 2, 3], [4, 5], input_res_bytes=[4, 5])  # equal is fine


def test_errors_are_value_errors():
  for err in (InvalidChainError, InvalidPlanError):
    assert issubclass(err, JaxrematError) and issubclass(err, ValueError)


# --- Plan validation --------------------------------------------------------------------


@pytest.mark.parametrize("checkpoints", [(2, 1), (1, 1), (3, 2, 4), (1, 3, 3)])
def test_plan_rejects_non_increasing(checkpoints):
  with pytest.raises(InvalidPlanError, match=r"checkpoints must be strictly increasing"):
    Plan(checkpoints)


@pytest.mark.parametrize("checkpoints, bad", [
    ((0,), r"\[0\]"), ((4,), r"\[4\]"), ((5,), r"\[5\]"), ((-1,), r"\[-1\]"),
    ((0, 2, 4), r"\[0, 4\]")])
def test_plan_rejects_out_of_range(checkpoints, bad):
  chain = Chain([1] * 5, [1] * 4)
  message = rf"checkpoint indices {bad} are out of range for a chain of 4 layers; " \
            r"valid indices are 1\.\.3"
  with pytest.raises(InvalidPlanError, match=message):
    peak_bytes(chain, Plan(checkpoints))
  with pytest.raises(InvalidPlanError, match=message):
    Plan(checkpoints).segments(4)


def test_plan_rejects_any_checkpoint_on_single_layer():
  with pytest.raises(InvalidPlanError, match=r"out of range for a chain of 1 layers"):
    peak_bytes(Chain([1, 1], [1]), Plan((1,)))


def test_plan_segments_and_normalisation():
  plan = Plan([np.int64(2), 5], method="x")
  assert plan.checkpoints == (2, 5)
  assert all(type(c) is int for c in plan.checkpoints)
  assert plan.segments(7) == [(0, 2), (2, 5), (5, 7)]
  assert Plan().segments(3) == [(0, 3)]
  assert Plan().checkpoints == ()
