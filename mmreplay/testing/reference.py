"""Plain-Python episodes and references for the contract suite (no pytest here).

An episode of ``T`` actions has ``T + 1`` observations, the last one final. Every observation
names where it comes from: ``obs = (episode index, t, lane, noise)``, so a row read back from
any store identifies its episode and step whatever ids or lanes the store gave it.

The references are deliberately simple loops over these lists, written once here and shared by
every backend's tests: transitions, n-step returns and discounts, frame stacks (clamped at the
episode start) and sequence windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.schema import Schema

OBS_DIM = 4
SCHEMA = Schema.transition(obs_shape=(OBS_DIM,), obs_dtype=np.float32)
"""obs (4,) float32, action int64, reward float32, terminated, truncated."""


@dataclass(frozen=True)
class Episode:
    """One episode of one lane: ``obs`` has ``T + 1`` rows, the other arrays ``T``."""

    index: int
    """The episode's place in the list ``make_episodes`` returns."""
    lane: int
    """The lane that writes it."""
    obs: np.ndarray
    """``(T + 1, 4)`` float32: every observation, the final one last."""
    action: np.ndarray
    """``(T,)`` int64."""
    reward: np.ndarray
    """``(T,)`` float32."""
    terminated: np.ndarray
    """``(T,)`` bool: True at the last step only, when the episode ended terminated."""
    truncated: np.ndarray
    """``(T,)`` bool: True at the last step only, when the episode ended truncated."""

    @property
    def T(self) -> int:  # noqa: N802 - the usual name
        """The episode's number of actions (its rows are ``T + 1``, the last holding the final observation)."""
        return len(self.action)


def make_episodes(lanes: int = 3, rows_per_lane: int = 40, *, seed: int = 0, max_len: int = 8) -> list[Episode]:
    """A small deterministic set of complete episodes of ``lanes`` lanes, ``rows_per_lane`` rows
    each (so a vector loop writes them in step). Episodes inside a lane end terminated or
    truncated at random; the last one of lane ``l`` ends terminated (``l % 3 == 1``), truncated
    (``2``) or neither (``0``: cut by ``Writer.close(last_obs=...)``). Lengths run from 1 to
    ``max_len`` actions, so n-step windows and frame stacks meet both episode ends."""
    rng = np.random.default_rng(seed)
    out: list[Episode] = []
    for lane in range(lanes):
        left = rows_per_lane
        while left > 0:
            T = int(rng.integers(1, max_len + 1))
            if left - (T + 1) < 2:  # the rest of the lane: never leave a lone row
                T = left - 1
            if T < 1:
                raise ValueError("rows_per_lane must be >= 2")
            left -= T + 1
            if left == 0:
                kind = lane % 3
            else:
                kind = 1 + int(rng.integers(0, 2))
            i = len(out)
            obs = np.zeros((T + 1, OBS_DIM), np.float32)
            obs[:, 0], obs[:, 1], obs[:, 2] = i, np.arange(T + 1), lane
            obs[:, 3] = rng.integers(-100, 100, T + 1)
            term, trunc = np.zeros(T, bool), np.zeros(T, bool)
            term[-1], trunc[-1] = kind == 1, kind == 2
            out.append(Episode(i, lane, obs, rng.integers(0, 4, T).astype(np.int64),
                               rng.integers(-3, 4, T).astype(np.float32), term, trunc))
    return out


def write_episodes(store, episodes: list[Episode], *, chunk: int = 16) -> None:
    """Write ``episodes`` with one writer session, one lane per episode lane, as a
    next-step-autoreset vector loop: a final observation is the row after the last step,
    written with action 0 and reward 0; each lane's last one goes in ``close(last_obs=...)``."""
    if not episodes:
        return
    lanes = max(e.lane for e in episodes) + 1
    per_lane: list[list[tuple]] = [[] for _ in range(lanes)]
    for e in episodes:
        for t in range(e.T):
            per_lane[e.lane].append((e.obs[t], e.action[t], e.reward[t], e.terminated[t], e.truncated[t]))
        per_lane[e.lane].append((e.obs[e.T], 0, 0.0, False, False))
    n = {len(rows) for rows in per_lane}
    if len(n) != 1:
        raise ValueError("every lane must hold the same number of rows")
    steps = n.pop() - 1
    names = ("obs", "action", "reward", "terminated", "truncated")
    dtypes = (np.float32, np.int64, np.float32, np.bool_, np.bool_)
    with store.writer(lanes=lanes) as w:
        for t0 in range(0, steps, chunk):
            block = [[per_lane[lane][t] for lane in range(lanes)] for t in range(t0, min(t0 + chunk, steps))]
            w.add_batch({name: np.array([[row[j] for row in step] for step in block], dt)
                         for j, (name, dt) in enumerate(zip(names, dtypes))})
        w.close(last_obs=np.stack([per_lane[lane][-1][0] for lane in range(lanes)]))


def key_of(obs) -> tuple[int, int]:
    """(episode index, t) of an observation row."""
    return int(obs[0]), int(obs[1])


def transitions(episodes: list[Episode]) -> dict[tuple[int, int], dict]:
    """{(episode, t): obs, action, reward, terminated, truncated, next_obs} for every step."""
    return {(e.index, t): {"obs": e.obs[t], "action": e.action[t], "reward": e.reward[t],
                           "terminated": e.terminated[t], "truncated": e.truncated[t], "next_obs": e.obs[t + 1]}
            for e in episodes for t in range(e.T)}


def n_step(e: Episode, t: int, n: int, gamma: float) -> tuple[float, float, int, bool, bool]:
    """(return, discount, bootstrap t, terminated, truncated) of the n-step window at step ``t``:
    rewards summed up to ``n`` steps or the episode end; discount 0 after a termination, else
    gamma^m for the m steps taken."""
    g, disc, u = 0.0, 1.0, t
    while True:
        g += disc * float(e.reward[u])
        if e.terminated[u]:
            return g, 0.0, u + 1, True, False
        disc *= gamma
        if u + 1 == e.T:  # the next row is the final observation
            return g, disc, u + 1, False, bool(e.truncated[u])
        if u + 1 - t == n:
            return g, disc, u + 1, False, False
        u += 1


def stack(t: int, k: int) -> list[int]:
    """The steps of a ``k``-frame stack ending at ``t``, clamped at the episode start."""
    return [max(t - j, 0) for j in range(k - 1, -1, -1)]


def sequence(e: Episode, t: int, total: int) -> dict[str, list]:
    """The part of a window of ``total`` rows starting at step ``t`` that lies in its episode:
    steps t.. of the observations up to the final one, the mask (steps, not the final
    observation) and ``is_last``; rows after the final observation belong to whatever the lane
    holds next (``mask`` False)."""
    ts = list(range(t, min(t + total, e.T + 1)))
    return {"t": ts, "mask": [u < e.T for u in ts], "is_last": [u == e.T for u in ts]}


def chi_square(counts: np.ndarray, expected_p: np.ndarray) -> tuple[float, float]:
    """(statistic, limit): the limit is df + 6 sqrt(2 df), far in the chi-square tail (p below
    1e-6 for df around 100), so a correct sampler passes with any fixed seed, while with ~2,000
    expected draws a cell a wrong distribution moves by 10% over a fifth of the cells fails."""
    counts = np.asarray(counts, np.float64)
    e = np.asarray(expected_p, np.float64) / np.sum(expected_p) * counts.sum()
    chi2 = float(((counts - e) ** 2 / e).sum())
    df = len(counts) - 1
    return chi2, df + 6 * np.sqrt(2 * df)
