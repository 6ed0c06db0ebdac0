"""The docs: the API reference is generated from the current docstrings; links resolve."""

import importlib.util
import pathlib
import re

import pytest

import jaxremat

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def _gen_api():
  spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_api_reference_is_up_to_date():
  text = (DOCS / "api.md").read_text()
  assert text == _gen_api().render(), "docs/api.md is out of date: run python docs/gen_api.py"
  for name in jaxremat.__all__:
    assert f"### {name}\n" in text


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_relative_links_resolve(page):
  text = (DOCS / page).read_text()
  for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
    if "://" in target:
      continue
    assert (DOCS / target).resolve().exists(), f"{page} links to missing {target}"


@pytest.mark.xla
def test_quickstart_code_runs(tmp_path, monkeypatch):
  """Every python block of the quickstart runs, in order, in one namespace."""
  monkeypatch.chdir(tmp_path)
  blocks = re.findall(r"```python\n(.*?)```", (DOCS / "quickstart.md").read_text(), re.S)
  assert len(blocks) >= 5
  namespace: dict = {}
  for block in blocks:
    exec(compile(block, "quickstart.md", "exec"), namespace)  # noqa: S102
  assert namespace["r6"].verified[namespace["r6"].plan.checkpoints] <= 6 * 2**20
  assert namespace["remat"].total_bytes < namespace["plain"].total_bytes
