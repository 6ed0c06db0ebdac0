"""Sharded training step on an 8-device CPU mesh: equal gradients, per-device bytes.

XLA_FLAGS must be set before jax initialises, so the checks run in a subprocess
(tests/sharded_check.py) and report their figures as JSON.
"""

import json
import os
import re
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

SCRIPT = pathlib.Path(__file__).with_name("sharded_check.py")
# Per-device prediction vs XLA's figure. The prediction is low, by 26% (remat) and 32% (none)
# on jax 0.10.2: XLA probably keeps each Dense input all-gathered over the "model" axis for the
# kernel gradient (twice its shard), and collectives' buffers are not modelled.
TOLERANCE = 0.35


@pytest.fixture(scope="module")
def figures():
  path = os.pathsep.join([str(SCRIPT.parent.parent), os.environ.get("PYTHONPATH", "")])
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", PYTHONPATH=path)
  done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-4000:]  # includes the gradient check's message
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_runs_on_the_mesh(figures):
  assert figures["devices"] == 8 and figures["mesh"] == {"data": 4, "model": 2}


def test_xla_statistics_are_per_device(figures):
  # The compiled step's arguments are exactly one shard of each parameter and of the batch.
  assert figures["argument_bytes"] == figures["params_batch_bytes_per_device"]
  assert figures["argument_bytes"] < figures["params_batch_bytes"]
  assert figures["measured_remat"] < figures["measured_one_device"]


def test_profile_is_per_device(figures):
  assert figures["profiled_input_bytes"] == figures["batch_shard_bytes"]


def test_the_compiled_profile_refuses_sharded_inputs(figures):
  # docs/errors.md, row compiled-profile-sharded (a case here: it needs the 8-device mesh)
  assert re.search(r"profile='compiled' replays.*sharded inputs.*profile='jaxpr'",
                   figures["compiled_profile_refusal"]), figures["compiled_profile_refusal"]


def test_remat_lowers_the_per_device_footprint(figures):
  assert figures["checkpoints"]
  assert figures["measured_remat"] < figures["measured_none"], figures
  # ... and is not above the best checkpoint-every-k plan XLA measures (every k compiled).
  assert figures["measured_remat"] <= figures["measured_best_uniform"], figures


@pytest.mark.parametrize("plan", ["remat", "none"])
def test_per_device_prediction_within_tolerance(figures, plan):
  predicted, measured = figures[f"predicted_{plan}"], figures[f"measured_{plan}"]
  assert (1 - TOLERANCE) * measured <= predicted <= measured, (predicted, measured)
