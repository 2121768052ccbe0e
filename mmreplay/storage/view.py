"""Views: turn located row ids into batches (here: one-step transitions).

A transition starting at row ``t`` of a lane is ``(obs_t, action_t, reward_t, terminated_t,
truncated_t)`` plus ``next_obs = obs`` of the lane's next row, which may lie in the writer
session's next segment. ``next_obs`` is never stored twice. A row flagged ``is_last`` (an
episode's final observation) never starts a transition, so no transition crosses an episode or
a lane. Every field is gathered with one fancy index over all segments (``reader.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .format import MASKED

if TYPE_CHECKING:
    from .store import ReplayStore


@dataclass(frozen=True, slots=True)
class TransitionBatch:
    """A batch of one-step transitions, as numpy arrays with leading dimension ``B``."""

    obs: np.ndarray | dict[str, np.ndarray]
    """Observation (a dict ``{key: array}`` for a Dict observation space)."""
    action: np.ndarray
    reward: np.ndarray
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


def _obs(store: ReplayStore, k: np.ndarray, slot: np.ndarray) -> np.ndarray | dict[str, np.ndarray]:
    names = store.schema.obs_names
    g = store.reader.gather
    if names == ("obs",):
        return g("obs", k, slot)
    return {n.removeprefix("obs/"): g(n, k, slot) for n in names}


def locate_transitions(store: ReplayStore, k: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(valid, k_next, slot_next)`` for candidate transition starts: a start is an ordinary row
    (not an episode's final observation, not masked) whose next row is written and not masked."""
    r = store.reader
    ok, nk, ns = r.successors(k, slot)
    ok &= r.flag_bytes(k, slot) == 0
    ok &= r.flag_bytes(nk, ns) != MASKED
    return ok, nk, ns


def transitions(store: ReplayStore, k: np.ndarray, slot: np.ndarray, ids: np.ndarray,
                nxt: tuple[np.ndarray, np.ndarray] | None = None) -> TransitionBatch:
    """Build the batch for transitions at snapshot locations ``(k, slot)``."""
    store.schema.require_transition_fields()
    if nxt is None:
        ok, nk, ns = locate_transitions(store, k, slot)
        if not ok.all():
            bad = ids[~ok][:5]
            raise KeyError(f"row ids {bad.tolist()} do not start a transition (episode end or next row not written)")
    else:
        nk, ns = nxt
    g = store.reader.gather
    core = {"obs", "action", "reward", "terminated", "truncated", *store.schema.obs_names}
    return TransitionBatch(
        obs=_obs(store, k, slot),
        action=g("action", k, slot),
        reward=g("reward", k, slot),
        next_obs=_obs(store, nk, ns),
        terminated=g("terminated", k, slot),
        truncated=g("truncated", k, slot),
        ids=ids,
        extra={n: g(n, k, slot) for n in store.schema.names if n not in core},
    )
