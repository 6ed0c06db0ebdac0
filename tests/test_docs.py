"""The docs: the API reference is generated from the current docstrings; links resolve."""

import importlib.util
import pathlib
import re

import jax
import pytest

import jaxremat

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def _load(name):
  spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_api_reference_is_up_to_date():
  text = (DOCS / "api.md").read_text()
  assert text == _load("gen_api").render(), "docs/api.md is out of date: run python docs/gen_api.py"
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
def test_quickstart_runs_and_prints_what_it_shows(tmp_path, monkeypatch):
  """Every python block of the quickstart runs, in order, in one namespace; on the jax
  version the page names, each prints exactly the text block after it."""
  gen = _load("gen_quickstart")
  monkeypatch.chdir(tmp_path)
  text = gen.QUICKSTART.read_text()
  runs, namespace = gen.run(text)
  assert len(runs) >= 5
  assert namespace["r6"].verified[namespace["r6"].plan.checkpoints] <= 6 * 2**20
  assert namespace["remat"].total_bytes < namespace["plain"].total_bytes
  if jax.__version__ == gen.recorded_version(text):
    assert gen.render(text, runs) == text, "run python docs/gen_quickstart.py"
