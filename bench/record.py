"""What a bench script records beside its rows (command, date, machine, versions) and how it
writes them: JSON, and the markdown table beside it."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from typing import Any

import flax
import jax


def run_meta(seconds: float, **extra: Any) -> dict[str, Any]:
  """The command line, today's date, the machine, the versions and ``seconds`` of the run."""
  return {"date": datetime.date.today().isoformat(), "command": " ".join(["python", *sys.argv]),
          "device": f"{jax.default_backend()} ({platform.processor() or platform.machine()}, "
                    f"{os.cpu_count()} cores)",
          "versions": {"jax": jax.__version__, "flax": flax.__version__,
                       "python": platform.python_version()},
          "seconds": round(seconds, 1), **extra}


def header(meta: dict[str, Any]) -> str:
  """One line that says how the table was made."""
  v = meta["versions"]
  return (f"Command: `{meta['command']}` ({meta['device']}, jax {v['jax']}, flax {v['flax']}, "
          f"{meta['date']}, {meta['seconds']} s)")


def write_result(path: str, meta: dict[str, Any], rows: list[dict], table: str,
                 **extra: Any) -> None:
  """``path`` (JSON: meta, rows, ``extra``, table) and the markdown beside it (.md)."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w") as f:
    json.dump({"meta": meta, "rows": rows, **extra, "table": table}, f, indent=1)
  with open(os.path.splitext(path)[0] + ".md", "w") as f:
    f.write(f"{header(meta)}\n\n{table}\n")
