"""Packing in recorded XLA dumps: temp bytes, live peak and heap replay per compiled step.

    PYTHONPATH=. python bench/dump_packing.py DUMPS [--out F.md]

DUMPS is a directory of XLA dumps or a .tar.xz of one. Dumps are not kept in git: make
them with ``PYTHONPATH=. python bench/gpu_validate.py OUT --compile-only --dump DUMPS`` on
a GPU (the archives of the H100 run in bench/results/gpu-h100/ are in commit 929b4fa,
``bench/results/gpu-h100-2026-11-23-run2/xla-dumps-*.tar.xz``).

Reads every ``*jit_loss*after_optimizations-{buffer-assignment,live-range}.txt`` pair in
the archive (one directory per model and plan, as ``gpu_validate.py --dump`` writes
them) with ``bench/xla_heap.py``: the step's temp allocation, the peak live bytes of its
values, and the allocation XLA's heap placement makes of them, replayed at each buffer
alignment tried (the first that reproduces XLA's figure is reported). No accelerator is
needed: the figures are read off dumps a GPU run recorded.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xla_heap  # noqa: E402  (bench/xla_heap.py: a dump's temp values, XLA's heap replayed)

_ALIGNMENTS = (64, 128, 256)  # bytes: 64 reproduces the CPU dumps, 256 the H100 ones


def rows(root: str) -> list[dict]:
  """One row per dumped step under ``root``: ``{"step", "temp", "live", "replay",
  "alignment"}`` (bytes; ``alignment`` is None where no alignment reproduces XLA)."""
  out = []
  for assignment in sorted(glob.glob(os.path.join(
      root, "**", "*jit_loss*after_optimizations-buffer-assignment.txt"), recursive=True)):
    live_range = assignment.replace("-buffer-assignment.txt", "-live-range.txt")
    temp, values = xla_heap.read_temp_values(assignment, live_range)
    replays = {a: xla_heap.replay_temp_bytes(values, a) for a in _ALIGNMENTS}
    match = next((a for a, r in replays.items() if r == temp), None)
    out.append({"step": os.path.relpath(os.path.dirname(assignment), root), "temp": temp,
                "live": xla_heap.live_peak_bytes(values),
                "replay": replays[match if match else _ALIGNMENTS[-1]], "alignment": match})
  return out


def to_markdown(rows_: list[dict]) -> str:
  mib = 2**20
  lines = ["| step | XLA temp MiB | live peak MiB | packing | replay − XLA (B) | alignment |",
           "|---|---|---|---|---|---|"]
  for r in rows_:
    packing = (r["temp"] - r["live"]) / r["live"] if r["live"] else 0.0
    lines.append(f"| {r['step']} | {r['temp'] / mib:.2f} | {r['live'] / mib:.2f} | "
                 f"{100 * packing:+.2f}% | {r['replay'] - r['temp']:+d} | {r['alignment']} |")
  exact = sum(r["replay"] == r["temp"] for r in rows_)
  lines.append(f"\nThe replay equals XLA's temp allocation on {exact} of {len(rows_)} steps.")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("archive", help="a .tar.xz of XLA dumps, or a directory of them")
  parser.add_argument("--out", help="markdown path (default: print)")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    root = args.archive
    if os.path.isfile(root):
      with tarfile.open(root) as archive:
        archive.extractall(tmp, filter="data")
      root = tmp
    table = to_markdown(rows(root))
  text = f"Command: `python {' '.join(sys.argv)}`\n\n{table}\n"
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
