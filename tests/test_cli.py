"""The command line: ``jaxremat plan`` and ``jaxremat demo``."""

import json

from jaxremat import cli


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


def test_plan_with_an_infeasible_budget_says_the_least(capsys):
  assert cli.main(["plan", "jaxremat.zoo:all_conv", "--batch-shape", "4,16,16,3", "--budget", "1000"]) == 2
  assert "least footprint any plan reaches" in capsys.readouterr().err


def test_demo_runs_and_remat_keeps_gradients(capsys):
  assert cli.main(["demo", "--batch", "2", "--image-size", "16", "--json"]) == 0
  result = json.loads(capsys.readouterr().out)
  rows = {row["method"]: row for row in result["rows"]}
  assert set(rows) == set(cli.DEMO_METHODS)
  assert all(row["grad_max_rel_error"] < 1e-5 for row in rows.values())
  assert rows["apply"]["measured_bytes"] < rows["none"]["measured_bytes"]
