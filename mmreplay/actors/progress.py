"""The progress bar of a collect run (local or on Ray): a tqdm bar on a terminal with steps,
steps/s, episodes, the mean return of the last 100 episodes and the bytes written; silent when
disabled or when stderr is not a terminal."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


class CollectProgress:
    """A tqdm bar on a terminal (steps, steps/s, episodes, mean return, bytes); silent otherwise.

    ``update(n, result)`` adds ``n`` steps and shows ``result``'s counts (any object with
    ``episode_returns``, ``episodes`` and ``bytes_written``: a ``CollectResult``)."""

    def __init__(self, total: int, enabled: bool | None) -> None:
        if enabled is None:
            enabled = sys.stderr.isatty()
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:  # pragma: no cover - tqdm is a dependency
                return
            self._bar = tqdm(total=total, unit="step", unit_scale=True, dynamic_ncols=True, smoothing=0.1)

    def update(self, n: int, result: Any) -> None:
        """Add ``n`` steps to the bar and show ``result``'s episodes, the mean return of its last 100
        episodes and the MiB written (nothing when silent)."""
        if self._bar is None:
            return
        recent = result.episode_returns[-100:]
        self._bar.set_postfix_str(
            f"episodes={result.episodes} return={np.mean(recent):.1f} written={result.bytes_written / 2**20:.0f}MiB"
            if recent else f"episodes={result.episodes} written={result.bytes_written / 2**20:.0f}MiB", refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        """Close the bar (nothing when silent)."""
        if self._bar is not None:
            self._bar.close()
