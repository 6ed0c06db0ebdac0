"""Plot the simulated live bytes of a training step under a plan against other strategies."""

from __future__ import annotations

import os
from collections.abc import Sequence

from jaxremat._model.chain import Chain, Plan
from jaxremat._model.simulate import simulate_timeline

_PHASE_COLOURS = {"forward": "#dbe9f6", "recompute": "#fde4c8", "backward": "#e3f1dc"}


def _pyplot():
  try:
    import matplotlib
  except ImportError:
    raise ImportError(
        'plotting (Remat.plot, Fitted.plot_frontier) needs matplotlib, which is not '
        'installed: pip install "jaxremat[plot]"'
    ) from None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def plot_timelines(path: str | os.PathLike, chain: Chain, plans: Sequence[tuple[str, Plan]],
                   title: str = "") -> None:
  """Draws each plan's live bytes (model R's event simulator) as a step plot over events.

  The first plan is drawn bold with its forward, recompute and backward events shaded;
  each plan's peak is marked and labelled. The file format follows the suffix of ``path``
  (``.png``, ``.svg``, ``.pdf``).

  Args:
    path: where to write the figure.
    chain: the profiled layers.
    plans: ``(label, plan)`` pairs; the first is the chosen one.
    title: a figure title.

  Raises:
    ImportError: matplotlib is not installed.
  """
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(10, 4.2), dpi=120)
  for k, (label, plan) in enumerate(plans):
    timeline = simulate_timeline(chain, plan)
    mib = [v / 2**20 for v in timeline.live_bytes]
    if k == 0:
      start = 0
      for i in range(1, len(timeline.phases) + 1):
        if i == len(timeline.phases) or timeline.phases[i] != timeline.phases[start]:
          ax.axvspan(start - 0.5, i - 0.5, color=_PHASE_COLOURS[timeline.phases[start]], lw=0)
          start = i
    line, = ax.step(range(len(mib)), mib, where="post", lw=2.2 if k == 0 else 1.2,
                    label=f"{label} (peak {max(mib):.2f} MiB)", zorder=3 if k == 0 else 2)
    top = mib.index(max(mib))
    ax.plot([top], [mib[top]], "o", color=line.get_color(), zorder=4)
  for phase, colour in _PHASE_COLOURS.items():
    ax.fill_between([], [], color=colour, label=f"{phase} ({plans[0][0]})")
  ax.set_xlabel("event (buffer allocated or freed)")
  ax.set_ylabel("live activation bytes (MiB, model R)")
  ax.set_title(title)
  ax.set_ylim(bottom=0)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  fig.tight_layout()
  fig.savefig(os.fspath(path))
  plt.close(fig)


def plot_frontier(path: str | os.PathLike, frontier: Sequence[tuple[int, float]],
                  chosen: tuple[int, float], budget_bytes: int,
                  measured_bytes: int | None = None) -> None:
  """Draws predicted footprint (MiB) against the time recomputation adds (ms) for the
  fastest plan at each budget, the chosen plan (and XLA's footprint of it) and the budget."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  mib = 2.0**20
  ax.step([b / mib for b, _ in frontier], [s * 1e3 for _, s in frontier], where="post",
          marker="o", label="fastest plan per budget (predicted)")
  ax.plot([chosen[0] / mib], [chosen[1] * 1e3], "s", color="C3", label="chosen (predicted)")
  if measured_bytes is not None:
    ax.plot([measured_bytes / mib], [chosen[1] * 1e3], "x", color="C3", label="chosen (XLA)")
  ax.axvline(budget_bytes / mib, color="grey", linestyle="--", label="budget")
  ax.set_xlabel("footprint (MiB)")
  ax.set_ylabel("recomputation per step (ms)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
