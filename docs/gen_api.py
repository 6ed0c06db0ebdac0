"""Writes docs/api.md, the API reference, from the docstrings of ``jaxremat.__all__``.

    python docs/gen_api.py          # rewrite docs/api.md
    python docs/gen_api.py --check  # exit 1 when docs/api.md is out of date
"""

from __future__ import annotations

import inspect
import pathlib
import re
import sys

import jaxremat

API_MD = pathlib.Path(__file__).resolve().parent / "api.md"

_HEADER = """# API reference

Generated from the docstrings by `python docs/gen_api.py` (a test checks it is up to
date). Everything listed is exported from `jaxremat`; see [quickstart.md](quickstart.md)
for a tour and [errors.md](errors.md) for what each error means.
"""

_KINDS = (("Functions", "function"), ("Classes", "class"), ("Errors", "error"))


def _kind(obj: object) -> str:
  if inspect.isclass(obj):
    return "error" if issubclass(obj, BaseException) else "class"
  return "function"


def _signature(name: str, obj: object) -> str:
  try:
    text = f"{name}{inspect.signature(obj)}"
  except (TypeError, ValueError):
    return name
  return re.sub(r"(: |-> )'([^']*)'", r"\1\2", text)  # string annotations, unquoted


def _doc(obj: object) -> str:
  return inspect.getdoc(obj) or "(no docstring)"


def _members(cls: type) -> list[str]:
  """Public methods and properties defined on the class itself, as markdown."""
  out = []
  for member, value in vars(cls).items():
    if member.startswith("_"):
      continue
    if isinstance(value, property):
      out.append(f"#### `{cls.__name__}.{member}` (property)\n\n{_doc(value)}\n")
    elif inspect.isfunction(value):
      sig = _signature(member, value).replace("(self, ", "(").replace("(self)", "()")
      out.append(f"#### `{cls.__name__}.{sig}`\n\n```\n{_doc(value)}\n```\n")
  return out


def render() -> str:
  """The text of docs/api.md."""
  parts = [_HEADER]
  names = sorted(jaxremat.__all__, key=str.lower)
  for title, kind in _KINDS:
    chosen = [n for n in names if _kind(getattr(jaxremat, n)) == kind]
    parts.append(f"## {title}\n")
    parts.append("".join(f"- [`{n}`](#{n.lower()})\n" for n in chosen))
    for name in chosen:
      obj = getattr(jaxremat, name)
      parts.append(f"### {name}\n")
      if kind == "error":
        bases = ", ".join(b.__name__ for b in obj.__bases__)
        parts.append(f"`class {name}({bases})`\n\n{_doc(obj)}\n")
        continue
      parts.append(f"```python\n{'class ' if kind == 'class' else ''}{_signature(name, obj)}\n```\n")
      parts.append(f"```\n{_doc(obj)}\n```\n")
      if kind == "class":
        parts.extend(_members(obj))
  return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str]) -> int:
  text = render()
  if "--check" in argv:
    if API_MD.read_text() != text:
      print(f"{API_MD} is out of date: run python docs/gen_api.py", file=sys.stderr)
      return 1
    return 0
  API_MD.write_text(text)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
