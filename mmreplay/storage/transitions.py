"""Views: turn located row ids into batches of one-step transitions (``core.batch.TransitionBatch``).

A transition starting at row ``t`` of a lane is ``(obs_t, action_t, reward_t, terminated_t,
truncated_t)`` plus ``next_obs = obs`` of the lane's next row, which may lie in the writer
session's next segment. ``next_obs`` is never stored twice. A row flagged ``is_last`` (an
episode's final observation) never starts a transition, so no transition crosses an episode or
a lane. Every field is gathered with one fancy index over all segments (``reader.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.batch import TransitionBatch

if TYPE_CHECKING:
    from ..core.schema import Schema
    from .reader import StoreReader


def _obs(reader: StoreReader, schema: Schema, k: np.ndarray, slot: np.ndarray) -> np.ndarray | dict[str, np.ndarray]:
    names = schema.obs_names
    if names == ("obs",):
        return reader.gather("obs", k, slot)
    return {n.removeprefix("obs/"): reader.gather(n, k, slot) for n in names}


def transitions_at(reader: StoreReader, schema: Schema, k: np.ndarray, slot: np.ndarray, ids: np.ndarray,
                   nxt: tuple[np.ndarray, np.ndarray] | None = None) -> TransitionBatch:
    """The batch of the transitions at ``reader``'s snapshot locations ``(k, slot)`` (global ids
    ``ids``) of a store of ``schema``; ``nxt``: where each one's next row is, if the caller located
    it (else checked here: ``KeyError`` for a location that starts no transition)."""
    schema.require_transition_fields()
    if nxt is None:
        ok, nk, ns = reader.transition_starts(k, slot)
        if not ok.all():
            bad = ids[~ok][:5]
            raise KeyError(f"row ids {bad.tolist()} do not start a transition (episode end or next row not written)")
    else:
        nk, ns = nxt
    g = reader.gather
    core = {"obs", "action", "reward", "terminated", "truncated", *schema.obs_names}
    return TransitionBatch(
        obs=_obs(reader, schema, k, slot),
        action=g("action", k, slot),
        reward=g("reward", k, slot),
        next_obs=_obs(reader, schema, nk, ns),
        terminated=g("terminated", k, slot),
        truncated=g("truncated", k, slot),
        ids=ids,
        extra={n: g(n, k, slot) for n in schema.names if n not in core},
    )
