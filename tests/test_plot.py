"""The live-bytes timeline of the event simulator and ``Remat.plot``."""

import random

import jax
import jax.numpy as jnp
import pytest

import jaxremat
from jaxremat import zoo
from jaxremat._model.simulate import simulate_timeline

from oracles import all_plans, literal_peak_of, random_chain


@pytest.mark.parametrize("seed", range(40))
def test_timeline_peak_is_model_r_on_single_level_plans(seed):
  rng = random.Random(seed)
  chain = random_chain(rng, rng.randint(0, 7), refine=bool(seed % 2))
  for checkpoints in all_plans(chain.n):
    timeline = simulate_timeline(chain, jaxremat.Plan(checkpoints))
    assert max(timeline.live_bytes) == literal_peak_of(chain, checkpoints)
    assert timeline.live_bytes[0] == chain.act_bytes[0]  # x_0 alone
    assert set(timeline.phases) <= {"forward", "recompute", "backward"}
    assert ("recompute" in timeline.phases) == bool(checkpoints)


def test_timeline_peak_is_the_simulator_on_nested_plans():
  chain = random_chain(random.Random(3), 9, refine=True)
  plan = jaxremat.solve(chain, "multilevel")
  assert simulate_timeline(chain, plan).peak_bytes == jaxremat.simulate_peak_bytes(chain, plan)


def test_timeline_rejects_a_plan_for_another_chain():
  chain = jaxremat.Chain([1, 2, 3], [1, 1])
  with pytest.raises(jaxremat.InvalidPlanError, match="out of range"):
    simulate_timeline(chain, jaxremat.Plan((4,)))


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_writes_the_file(tmp_path, suffix):
  pytest.importorskip("matplotlib")
  model = zoo.mlp([16, 32, 16, 8])
  x = jnp.ones((4, 8))
  r = jaxremat.apply(model.apply, model.init(jax.random.key(0), x), x)
  path = tmp_path / f"timeline{suffix}"
  r.plot(path)
  assert path.stat().st_size > 1000
