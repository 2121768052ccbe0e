"""The batch type every reader of a store returns: ``TransitionBatch``.

Storage's ``ReplayStore.transitions()`` and every sampler return it, so it lives on the floor
both stand on. Plain numpy arrays; no behaviour beyond its length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class TransitionBatch:
    """A batch of one-step transitions, as numpy arrays with leading dimension ``B``."""

    obs: np.ndarray | dict[str, np.ndarray]
    """Observation (a dict ``{key: array}`` for a Dict observation space)."""
    action: np.ndarray
    """Action taken at ``obs``."""
    reward: np.ndarray
    """Reward of that step (with ``n_step`` > 1: the discounted m-step return, see ``discount``)."""
    next_obs: np.ndarray | dict[str, np.ndarray]
    """Observation of the lane's next row: the final observation when the episode ended."""
    terminated: np.ndarray
    """True when the episode ended by termination: do not bootstrap from ``next_obs``."""
    truncated: np.ndarray
    """True when the episode was cut (time limit): bootstrap from ``next_obs``."""
    ids: np.ndarray
    """Global row ids of the transitions' first rows (stable while the rows live)."""
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    """Any other schema field, taken from the first row."""
    weights: np.ndarray | None = None
    """Importance-sampling weights (prioritized replay), ``None`` for uniform sampling."""
    discount: np.ndarray | None = None
    """With ``n_step``/``frame_stack`` views: the bootstrap factor ``gamma^m`` (0 when the window
    ended by termination); ``reward`` is then the discounted m-step return. ``None`` for plain
    one-step batches (use ``gamma * (1 - terminated)``)."""

    def __len__(self) -> int:
        return len(self.ids)
