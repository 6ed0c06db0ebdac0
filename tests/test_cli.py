"""The command line: ``jaxremat plan``, ``jaxremat demo`` and ``jaxremat bench``."""

import json
import re
import subprocess
import sys

import jax
import pytest
import jax.numpy as jnp

import jaxremat
from jaxremat import _bench, _cli_model, _demo, cli
from jaxremat._api.loss import training_loss

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set


def test_plan_prints_the_report_and_json(capsys):
  assert cli.main(["plan", "jaxremat.zoo:all_conv", "--batch-shape", "4,16,16,3"]) == 0
  text = capsys.readouterr().out
  assert "layers_0" in text and "chosen: optimal" in text
  assert cli.main(["plan", "jaxremat.zoo:all_conv", "--batch-shape", "4,16,16,3", "--json"]) == 0
  summary = json.loads(capsys.readouterr().out)
  n = len(summary["layers"])
  assert n >= 20  # 10 convs and their ReLUs, flatten, the classifier
  assert all(1 <= c < n for c in summary["checkpoints"])
  assert summary["layers"][0]["output_bytes"] == 4 * 16 * 16 * 16 * 4
  # every plan apply compiled, the chosen one's figure among them
  compiled = {tuple(c["checkpoints"]): c["measured_total_bytes"] for c in summary["compiled"]}
  assert compiled[tuple(summary["checkpoints"])] == summary["measured_total_bytes"]
  assert summary["as_written_bytes"] >= min(compiled.values())


def test_plan_with_an_infeasible_budget_says_the_least(capsys):
  assert cli.main(["plan", "jaxremat.zoo:all_conv", "--batch-shape", "4,16,16,3", "--budget", "1000"]) == 2
  err = capsys.readouterr().err
  assert "that the parameters, the batch and the parameter gradients hold" in err
  assert "--budget 1000 (1000 B) is below" in err  # the flag as typed (it read "--budget1000")


def test_plan_refuses_a_fraction_as_a_budget(capsys):
  # a user's trial: --budget 0.5 was read as 0 bytes
  with pytest.raises(SystemExit):
    cli.main(["plan", "jaxremat.zoo:all_conv", "--batch-shape", "4,16,16,3", "--budget", "0.5"])
  assert "0.5 is a fraction; the budget is in bytes" in capsys.readouterr().err


def test_fit_meets_a_share_of_the_activations_and_says_so_in_json(capsys, tmp_path):
  args = ["fit", "jaxremat.zoo:all_conv", "--batch-shape", "4,16,16,3", "--budget", "0.5"]
  assert cli.main([*args, "--plot", str(tmp_path / "frontier.png")]) == 0
  assert "within the budget" in capsys.readouterr().out
  assert (tmp_path / "frontier.png").read_bytes()[:4] == b"\x89PNG"
  assert cli.main([*args, "--json"]) == 0
  summary = json.loads(capsys.readouterr().out)
  fixed, no_remat = summary["fixed_bytes"], summary["no_remat_bytes"]
  assert summary["budget_bytes"] == fixed + int(0.5 * (no_remat - fixed))
  assert summary["measured_total_bytes"] <= summary["budget_bytes"]
  # the plan's groups cover every layer once, in order
  assert all(group["transient_bytes"] >= 0 for group in summary["plan"])
  names = [name for group in summary["plan"] for name in group["layers"]]
  assert len(names) == len(set(names)) >= 20
  # XLA's figure of the returned plan, by a compile of its own
  model, params, x, _ = cli.model_inputs("jaxremat.zoo:all_conv", (4, 16, 16, 3), "float32",
                                         {}, (), concrete=True)
  f = jaxremat.fit(model.apply, params, x, 0.5, time_steps=False)
  footprint = jaxremat.measure(training_loss(f.fn, {}), params, x).total_bytes
  assert footprint == summary["measured_total_bytes"]


def test_fit_with_an_infeasible_budget_names_the_least_in_flags(capsys):
  args = ["fit", "jaxremat.zoo:all_conv", "--batch-shape", "4,16,16,3", "--budget", "0.01"]
  assert cli.main(args) == 2
  err = capsys.readouterr().err
  assert "InfeasibleBudgetError: no plan fits" in err and "the least footprint found is" in err
  assert "--budget 0.01 is the fixed" in err  # the flag, not memory_budget=0.01
  with pytest.raises(SystemExit):
    cli.main(["fit", "jaxremat.zoo:all_conv", "--batch-shape", "4,16,16,3", "--budget", "half"])
  assert "not a number: 'half'" in capsys.readouterr().err


def test_plan_takes_mutable_in_the_model_kwargs(tmp_path, monkeypatch, capsys):
  # as the Python API passes it; it went into model.init, whose params came back empty
  (tmp_path / "bn_net.py").write_text(
      "import flax.linen as nn\n"
      "Net = lambda: nn.Sequential([nn.Dense(32), nn.BatchNorm(use_running_average=False),\n"
      "                             nn.relu, nn.Dense(32), nn.relu, nn.Dense(4)])\n")
  monkeypatch.chdir(tmp_path)
  args = ["plan", "bn_net:Net", "--batch-shape", "8,16", "--json",
          "--model-kwargs", '{"mutable": ["batch_stats"]}']
  assert cli.main(args) == 0
  assert json.loads(capsys.readouterr().out)["layers"]


def test_demo_runs_and_remat_keeps_gradients(capsys):
  assert cli.main(["demo", "--batch", "2", "--image-size", "16", "--json"]) == 0
  result = json.loads(capsys.readouterr().out)
  rows = {row["method"]: row for row in result["rows"]}
  assert set(rows) == set(_demo.DEMO_METHODS)
  assert all(row["grad_max_rel_error"] < 1e-5 for row in rows.values())
  assert rows["apply"]["measured_bytes"] < rows["none"]["measured_bytes"]


def test_bench_quick_json_matches_measure(capsys, tmp_path):
  assert cli.main(["bench", "--quick", "--json", "--models", "tiny-mlp", "--out", str(tmp_path)]) == 0
  captured = capsys.readouterr()
  result = json.loads(captured.out)
  assert "tiny-mlp" in captured.err  # progress goes to stderr
  assert set(result) == {"meta", "rows"} and result["meta"]["quick"]
  rows = {row["strategy"]: row for row in result["rows"]}
  assert set(rows) == set(_bench.STRATEGIES)
  for row in rows.values():
    assert {"model", "checkpoints", "predicted_bytes", "measured_bytes", "recompute_flops",
            "xla_flops"} <= set(row)
  # The measured figures are jaxremat.measure's of the same plan, rebuilt independently.
  spec = _bench.MODELS["tiny-mlp"]
  model, x = spec.build(), spec.example(quick=True)
  params = model.init(jax.random.key(0), x)
  for strategy in ("none", "optimal"):
    plan = jaxremat.Plan(tuple(rows[strategy]["checkpoints"]))
    r = jaxremat.apply(model.apply, params, x, plan=plan, verify=False)
    footprint = jaxremat.measure(lambda p, b: jnp.mean(jnp.square(r.fn(p, b))), params, x)
    assert rows[strategy]["measured_bytes"] == footprint.total_bytes
    assert rows[strategy]["recompute_flops"] == jaxremat.recompute_flops(r.chain, plan)
  written = sorted(p.suffix for p in tmp_path.iterdir())
  assert written == [".json", ".md"]


def test_bench_rejects_unknown_models(capsys):
  assert cli.main(["bench", "--models", "tiny-mlp,gpt5"]) == 2
  assert "unknown models ['gpt5']" in capsys.readouterr().err


LOCAL_MODEL = """
import flax.linen as nn

class Block(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = True):
    y = nn.Dropout(0.1, deterministic=not train)(nn.gelu(nn.Dense(32)(x)))
    return x + nn.Dense(x.shape[-1])(y)

class Net(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = True):
    for i in range(3):
      x = Block(name=f"block{i}")(x, train)
    return nn.Dense(4)(x)
"""


def test_plan_takes_a_local_module_layer_depth_and_model_kwargs(tmp_path, monkeypatch, capsys):
  """A model in the current directory, without PYTHONPATH; dropout needs rngs=."""
  (tmp_path / "local_net.py").write_text(LOCAL_MODEL)
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
  args = ["plan", "local_net:Net", "--batch-shape", "8,16", "--model-kwargs", '{"train": true}',
          "--rngs", "dropout", "--json"]
  assert cli.main([*args, "--layer-depth", "1"]) == 0
  summary = json.loads(capsys.readouterr().out)
  assert [layer["name"] for layer in summary["layers"]][:3] == ["block0", "block1", "block2"]
  assert summary["decomposition"] == "layer_depth=1 (4 layers)"
  assert cli.main([*args, "--layer-depth", "2"]) == 0
  deeper = [layer["name"] for layer in json.loads(capsys.readouterr().out)["layers"]]
  assert len(deeper) > 4 and any(n.startswith("block0/") for n in deeper)
  assert cli.main(args) == 0  # the default decomposition, whatever it chose, is reported
  default = json.loads(capsys.readouterr().out)["decomposition"]
  assert default
  assert cli.main([*args, "--layer-depth", "search"]) == 0  # deeper only if XLA measured less
  searched = json.loads(capsys.readouterr().out)["decomposition"]
  base = re.sub(r"; '[^']*' holds .* plans inside the layers too$", "", default)  # the hint
  assert (searched.startswith(base + "; layer_depth='search'")
          or "(layer_depth='search'), as XLA measured them" in searched)


def test_plan_says_what_is_wrong_with_the_module_or_kwargs(capsys):
  with pytest.raises(SystemExit, match="cannot import 'no_such_module'"):
    cli.main(["plan", "no_such_module:Net", "--batch-shape", "4,4"])
  assert cli.main(["plan", "jaxremat.zoo:all_conv", "--batch-shape", "2,8,8,3",
                   "--model-kwargs", "{train: 1}"]) == 2
  assert "--model-kwargs is not JSON" in capsys.readouterr().err


def test_plan_points_an_nnx_module_to_apply_nnx(tmp_path, monkeypatch):
  (tmp_path / "nnx_net.py").write_text(
      "from flax import nnx\n"
      "class Net(nnx.Module):\n"
      "  def __init__(self, *, rngs):\n"
      "    self.dense = nnx.Linear(4, 4, rngs=rngs)\n"
      "  def __call__(self, x):\n"
      "    return self.dense(x)\n"
      "def make():\n"
      "  return Net(rngs=nnx.Rngs(0))\n"
      "def sized(width):\n"
      "  return None\n")
  monkeypatch.chdir(tmp_path)
  for spec in ("nnx_net:make", "nnx_net:Net"):  # what it returns; the class itself
    with pytest.raises(SystemExit, match=r"flax\.nnx module.*jaxremat\.apply_nnx"):
      cli.main(["plan", spec, "--batch-shape", "2,4"])
  with pytest.raises(SystemExit, match=r"calling nnx_net:sized\(\) failed.*'width'"):
    _cli_model.load_model("nnx_net:sized")
  with pytest.raises(SystemExit, match=r"^jaxremat fit: .*flax\.nnx module.*jaxremat\.fit_nnx"):
    cli.main(["fit", "nnx_net:make", "--batch-shape", "2,4", "--budget", "0.5"])


def test_plan_warnings_name_the_commands_flags(tmp_path, monkeypatch, capsys):
  """apply's advice (layer_depth=) reaches a CLI user as the flag (--layer-depth)."""
  (tmp_path / "wrapped_net.py").write_text(
      "import flax.linen as nn\n"
      "class Inner(nn.Module):\n"
      "  @nn.compact\n"
      "  def __call__(self, x):\n"
      "    for _ in range(3):\n"
      "      x = nn.relu(nn.Dense(16)(x))\n"
      "    return x\n"
      "class Wrapped(nn.Module):\n"
      "  @nn.compact\n"
      "  def __call__(self, x):\n"
      "    return Inner(name='inner')(x)\n")
  monkeypatch.chdir(tmp_path)
  assert cli.main(["plan", "wrapped_net:Wrapped", "--batch-shape", "8,16",
                   "--layer-depth", "1"]) == 0
  err = capsys.readouterr().err
  assert "NoSavingWarning" in err and "--layer-depth" in err and "layer_depth=" not in err


def test_fit_says_in_flags_what_a_models_call_or_a_budget_lacks(tmp_path, monkeypatch, capsys):
  """A user's trial: a missing --rngs gave flax's 40-line traceback; a bad --batch-shape
  a traceback; errors and reports named Python's keywords (memory_budget, verify=False)."""
  (tmp_path / "local_net.py").write_text(LOCAL_MODEL)
  monkeypatch.chdir(tmp_path)
  args = ["fit", "local_net:Net", "--batch-shape", "8,16", "--model-kwargs", '{"train": true}']
  assert cli.main([*args, "--budget", "0.5"]) == 2
  err = capsys.readouterr().err
  assert "the model raised InvalidRngError" in err and "--rngs dropout" in err
  assert cli.main([*args, "--rngs", "dropout", "--budget", "0"]) == 2
  assert "--budget must be" in capsys.readouterr().err
  assert cli.main([*args, "--rngs", "dropout", "--budget", "0.5", "--no-verify"]) == 0
  report = capsys.readouterr().out
  assert "not compiled (--no-verify)" in report and "verify=False" not in report
  with pytest.raises(SystemExit):
    cli.main(["fit", "local_net:Net", "--batch-shape", "8,abc", "--budget", "0.5"])
  assert "not a shape: '8,abc'" in capsys.readouterr().err


def test_plan_warns_when_the_batch_shape_lacks_the_batch_axis(capsys):
  """A user's trial: a 3-D --batch-shape for a conv net was planned silently as one
  unbatched image (flax reads it so)."""
  assert cli.main(["plan", "jaxremat.zoo:all_conv", "--batch-shape", "16,16,3"]) == 0
  err = capsys.readouterr().err
  assert "jaxremat plan: BatchAxisWarning: the model's output has shape (2, 10)" in err
  assert "--batch-shape N,16,16,3" in err and err.count("BatchAxisWarning") == 1
  assert cli.main(["plan", "jaxremat.zoo:all_conv", "--batch-shape", "4,16,16,3"]) == 0
  assert "BatchAxisWarning" not in capsys.readouterr().err


def test_plan_says_how_to_plan_a_model_of_two_inputs(tmp_path, monkeypatch, capsys):
  """A user's trial: a diffusion U-Net taking (x, t) gave a raw traceback."""
  (tmp_path / "denoiser.py").write_text(
      "import flax.linen as nn\n"
      "class Net(nn.Module):\n"
      "  @nn.compact\n"
      "  def __call__(self, x, t):\n"
      "    return nn.Dense(4)(x) + t[:, None]\n"
      "def make():\n"
      "  return Net()\n")
  monkeypatch.chdir(tmp_path)
  for spec in ("denoiser:Net", "denoiser:make"):  # a factory's name is not the module's
    assert cli.main(["plan", spec, "--batch-shape", "2,4"]) == 2
    err = capsys.readouterr().err
    assert "InvalidArgumentError: the model takes 't' besides the batch" in err
    assert "passes it one random batch" in err and "t=t" in err


def test_a_model_failing_on_the_batch_shape_names_the_flags_to_check(capsys):
  """A user's trial: a batch shape without the batch axis gave JAX's traceback alone."""
  with pytest.raises(IndexError):  # the model's own traceback follows the line
    cli.main(["plan", "jaxremat.zoo:gpt", "--batch-shape", "16", "--dtype", "int32"])
  err = capsys.readouterr().err
  assert "jaxremat plan: the model raised IndexError" in err
  assert "on a random batch of shape (16) and dtype int32: is --batch-shape" in err
  assert "a model taking a dict or tuple batch is planned from Python" in err


def test_plan_says_a_token_model_takes_integer_inputs(capsys):
  """A user's trial: the default float batch into a GPT gave flax's traceback."""
  args = ["plan", "jaxremat.zoo:gpt", "--batch-shape", "2,16"]
  assert cli.main(args) == 2
  assert "It takes integer inputs (token ids, as nn.Embed does): --dtype int32." in (
      capsys.readouterr().err)
  assert cli.main([*args, "--dtype", "int32"]) == 0


def test_python_dash_m_runs_the_command():
  done = subprocess.run([sys.executable, "-m", "jaxremat", "plan", "--help"],
                        capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr
  assert "--method {" in done.stdout and "the solver" in done.stdout
