"""Runs docs/quickstart.md's python blocks and writes what each prints into the text block after it.

    python docs/gen_quickstart.py          # rewrite the outputs in docs/quickstart.md
    python docs/gen_quickstart.py --check  # exit 1 when an output is out of date

The outputs are those of the jax version named in the page (``RECORDED_WITH``); a test
runs the blocks on every version and compares the outputs on that one.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import sys

import jax

QUICKSTART = pathlib.Path(__file__).resolve().parent / "quickstart.md"
_BLOCK = re.compile(r"```python\n(.*?)```(\n\n```text\n(.*?)```)?", re.S)
_RECORDED = re.compile(r"outputs recorded with jax (\d+\.\d+\.\d+)")


def run(text: str) -> tuple[list[tuple[re.Match, str]], dict]:
  """Executes every python block in order in one namespace; each match with its stdout."""
  namespace: dict = {}
  runs = []
  for match in _BLOCK.finditer(text):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      exec(compile(match.group(1), "quickstart.md", "exec"), namespace)  # noqa: S102
    runs.append((match, out.getvalue()))
  return runs, namespace


def recorded_version(text: str) -> str:
  found = _RECORDED.search(text)
  return found.group(1) if found else ""


def render(text: str, runs: list[tuple[re.Match, str]]) -> str:
  """``text`` with each python block's text block replaced by what it printed."""
  pieces, last = [], 0
  for match, printed in runs:
    if match.group(2) is None:
      continue
    start = match.start(3)
    pieces += [text[last:start], printed]
    last = match.end(3)
  pieces.append(text[last:])
  out = "".join(pieces)
  return _RECORDED.sub(f"outputs recorded with jax {jax.__version__}", out)


def main() -> int:
  text = QUICKSTART.read_text()
  new = render(text, run(text)[0])
  if "--check" in sys.argv:
    return 0 if new == text else 1
  QUICKSTART.write_text(new)
  return 0


if __name__ == "__main__":
  sys.exit(main())
