"""The examples run end to end (shortened) and show what they claim."""

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

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


def test_train_nnx_transformer(capsys):
  example = _load("train_nnx_transformer")
  results = example.main(["--epochs", "1", "--max-steps", "6", "--batch-size", "8",
                          "--seq-len", "32", "--dim", "32", "--depth", "2", "--max-chars", "20000"])
  plain, remat = results["step_loss"]["plain"], results["step_loss"]["jaxremat"]
  assert results["steps"] == len(plain) == len(remat) == 6
  np.testing.assert_allclose(remat, plain, rtol=1e-4)  # same dropout masks, same updates
  test_loss = results["test_loss"]
  np.testing.assert_allclose(test_loss["jaxremat"], test_loss["plain"], rtol=1e-4)
  assert plain[-1] < plain[0]
  assert results["checkpoints"]
  assert results["layer_names"] == ["embed", "blocks.0", "blocks.1", "ln_f", "head"]
  assert results["footprint_bytes"]["jaxremat"] < results["footprint_bytes"]["plain"]
  assert results["grad_footprint_bytes"]["jaxremat"] < results["grad_footprint_bytes"]["plain"]
  out = capsys.readouterr().out
  assert "chosen: optimal" in out and "train step (grad + Adam update)" in out
