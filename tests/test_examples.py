"""The examples run end to end (shortened) and show what they claim."""

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(name):
  spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


def test_train_linen_cnn(capsys):
  pytest.importorskip("sklearn")
  example = _load("train_linen_cnn")
  results = example.main(["--epochs", "1", "--batch-size", "32", "--max-steps", "12"])
  plain, remat = results["step_loss"]["plain"], results["step_loss"]["jaxremat"]
  assert results["steps"] == len(plain) == len(remat) == 12
  np.testing.assert_allclose(remat, plain, rtol=1e-4)
  epoch_loss = results["epoch_loss"]
  np.testing.assert_allclose(epoch_loss["jaxremat"], epoch_loss["plain"], rtol=1e-4)
  assert plain[-1] < plain[0]
  assert remat[-1] < remat[0]
  footprint = results["footprint_bytes"]
  assert footprint["jaxremat"] < footprint["plain"]
  assert results["grad_footprint_bytes"]["jaxremat"] < results["grad_footprint_bytes"]["plain"]
  out = capsys.readouterr().out
  assert "chosen: optimal" in out and "train step (grad + Adam update)" in out
