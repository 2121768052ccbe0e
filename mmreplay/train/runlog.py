"""Run metrics: one CSV file per run (plus TensorBoard when installed) and the learning-curve plot.

``<run_dir>/metrics.csv`` has a fixed header (:data:`COLUMNS`); a row is written every
``log_every`` steps and after every evaluation, with empty cells for what was not measured.
Rows are flushed as they are written, so a killed run keeps every row it logged. On ``--resume``
the rows logged after the checkpoint's step are dropped first (the run repeats those steps), so
the file always reads as one run.

TensorBoard (``tensorboard`` package, an optional extra) gets the same scalars under
``<run_dir>/tb``; matplotlib (also optional) is needed only by :func:`plot_run`.
"""

from __future__ import annotations

import csv
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

COLUMNS = (
    "step",           # env steps (online) or learner updates (offline)
    "updates",        # learner updates so far
    "time_s",         # wall time of the run (summed over resumed sessions)
    "episodes",       # training episodes completed so far (online)
    "return_mean",    # mean return of the training episodes completed since the last row
    "eval_return",    # mean greedy return over eval_episodes (eval rows only)
    "eval_std",
    "loss",           # mean loss since the last row
    "q_mean",         # mean Q(s, a) of the sampled batches since the last row
    "epsilon",
    "steps_per_s",    # env steps per second since the last row (online)
    "updates_per_s",  # learner updates per second since the last row
    "data_wait",      # fraction of the learner's time spent waiting for batches
)


class RunLog:
    """Append metric rows to ``<run_dir>/metrics.csv`` (and TensorBoard when available)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, resume_step: int | None = None,
                 tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.csv"
        if resume_step is not None and self.path.exists():
            _truncate_after(self.path, resume_step)
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        self._fh = open(self.path, "a" if resume_step is not None else "w", newline="")  # noqa: SIM115
        self._csv = csv.DictWriter(self._fh, fieldnames=COLUMNS, extrasaction="raise")
        if fresh or resume_step is None:
            self._csv.writeheader()
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=resume_step)
            except ImportError:
                log.info("tensorboard is not installed: metrics go to %s only", self.path)

    def write(self, **row: Any) -> None:
        """One row; unknown keys raise ``ValueError``, missing ones are left empty."""
        clean = {k: _fmt(v) for k, v in row.items() if v is not None}
        self._csv.writerow(clean)
        self._fh.flush()
        if self._tb is not None:
            step = int(row["step"])
            for key, value in row.items():
                if key not in ("step",) and isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(f"mmreplay/{key}", value, step)

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def _truncate_after(path: Path, step: int) -> None:
    """Drop the rows logged after ``step`` (atomically)."""
    from ..core.fs import atomic_write

    with open(path, newline="") as fh:
        lines = fh.read().splitlines(keepends=True)
    if not lines:
        return
    keep = [lines[0]] + [ln for ln in lines[1:] if ln.strip() and _row_step(ln) <= step]
    atomic_write(path, "".join(keep).encode())


def _row_step(line: str) -> float:
    try:
        return float(line.split(",", 1)[0])
    except ValueError:
        return math.inf


def read_metrics(run_dir: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The metrics of a run as float arrays keyed by column (NaN where a cell is empty)."""
    path = Path(run_dir) / "metrics.csv"
    if not path.exists():
        raise FileNotFoundError(f"no metrics.csv in {run_dir} (is it a run directory of `mmreplay train`?)")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {c: np.array([float(r[c]) if r.get(c) not in (None, "") else np.nan for r in rows], np.float64)
            for c in COLUMNS}


def plot_run(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
             title: str | None = None, compare: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """Write a PNG learning curve of a run: training return vs env steps, with the eval points.
    With ``compare`` (other run directories, e.g. other seeds or another trainer's metrics in the
    same CSV format), every run's evaluation points are drawn on one figure, one labelled line per
    run, without the training curves.

    Needs matplotlib (optional extra). Returns the path written (default
    ``<run_dir>/learning_curve.png``); raises ``ValueError`` (writing nothing) when no run has a
    return to draw yet.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'mmreplay[plot]'") from exc
    runs = [Path(run_dir), *(Path(c) for c in compare)]
    metrics = [read_metrics(r) for r in runs]
    out_path = Path(out) if out is not None else runs[0] / "learning_curve.png"
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    drawn = False
    for run, m in zip(runs, metrics):
        step = m["step"]
        tr = ~np.isnan(m["return_mean"])
        if tr.any() and not compare:
            ax.plot(step[tr], m["return_mean"][tr], lw=1.2, alpha=0.8, label="training episodes (mean)")
        ev = ~np.isnan(m["eval_return"])
        if ev.any():
            std = np.nan_to_num(m["eval_std"][ev])
            where = run.resolve()
            label = f"{where.parent.name}/{where.name} (greedy)" if compare else "greedy evaluation (mean ± std)"
            ax.errorbar(step[ev], m["eval_return"][ev], yerr=std, fmt="o-" if compare else "o", ms=4, capsize=3,
                        lw=1, label=label)
        drawn = drawn or tr.any() or ev.any()
    if not drawn:  # an empty PNG would pass for a curve
        plt.close(fig)
        raise ValueError(f"{runs[0]}: no training episode and no evaluation recorded yet (metrics.csv holds no "
                         "return): nothing to plot")
    online = any(bool(np.nan_to_num(m["episodes"]).max(initial=0) > 0) for m in metrics) or bool(compare)
    ax.set_xlabel("env steps" if online else "learner updates")
    ax.set_ylabel("episode return")
    ax.set_title(title or runs[0].resolve().name)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path)
    plt.close(fig)
    return out_path
