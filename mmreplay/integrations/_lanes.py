"""Explicit transitions in, mmreplay rows out: the one write path of the integrations.

SB3's VecEnvs and TorchRL's collectors hand over transitions ``(obs, action, reward,
terminated, truncated, next_obs)`` from envs that reset in the same step, so the envs of one
vector env drift apart (an env whose episode ended needs one more row, its final observation,
than the others). As in ``mmreplay collect --autoreset same-step``, every env therefore gets a
single-lane writer of its own. Per env:

* a step that continues the episode is one row; ``next_obs`` is the obs of the lane's next row,
  so it is not written: it is kept (``pending``) until the next step arrives;
* a terminated or truncated step is its row plus a final-observation row (``next_obs``, zero
  action and reward, no flags), which the writer flags ``is_last``;
* a step whose ``obs`` is not the ``next_obs`` the lane is waiting for (an env reset outside a
  done, e.g. by a new ``learn()``; a gap in the data) first ends the lane's episode at the
  pending ``next_obs`` (``Writer.end_episodes``: no flag, so the transition stays exactly as
  given; ``info`` counts that episode as incomplete);
* ``close()`` writes every pending ``next_obs`` the same way, so no transition is lost.

Invariants: every transition handed over is sampled back exactly (obs, action, reward, flags,
next_obs), whatever its episode boundaries; the newest transition of each env becomes sampleable
when the env's next step (or ``close``/``end_episodes``) arrives. A step of ``n`` envs is ``n``
writer calls (each a single-row append, no Python loop per field); ``extend`` writes ``T`` steps of
one env with one ``add_batch`` (final rows placed by a cumulative sum).
"""

from __future__ import annotations

import atexit
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..storage import ReplayStore
    from ..storage import Durability, Writer

Arrays = dict[str, np.ndarray]
_ONE = np.ones(1, np.bool_)
_ONE.flags.writeable = False


class LaneWriters:
    """``n`` single-lane writers of ``store`` and the ``next_obs`` each lane waits for.

    Arrays come in the store's dtypes and field shapes (``conform`` makes them so); observations
    are dicts keyed by the schema's observation field names.
    """

    def __init__(self, store: ReplayStore, n: int, *, durability: Durability = "segment",
                 publish_interval_s: float = 1.0) -> None:
        self.store = store
        self.schema = store.schema
        self.obs_names = store.schema.obs_names
        self.writers: list[Writer] = []
        try:
            for _ in range(n):
                # rows reach this process's sampler at its refresh (which publishes them); other processes
                # see them within publish_interval_s: a shorter one wakes each writer's publisher thread
                # every few ms while steps come in, each wake taking the GIL from the training loop
                self.writers.append(store.writer(lanes=1, durability=durability, cast="safe",
                                                 publish_interval_s=publish_interval_s))
        except BaseException:
            for w in self.writers:
                w.close()
            raise
        self.pending = {k: np.zeros((n, *self.schema[k].shape), self.schema[k].dtype) for k in self.obs_names}
        self.has_pending = np.zeros(n, np.bool_)
        self.step_ids = np.full(n, -1, np.int64)  # global row id of each env's row of the last ``step``
        self._final = {f.name: np.zeros((1, *f.shape), f.dtype) for f in self.schema.fields
                       if f.name not in self.obs_names}
        self.closed = False
        atexit.register(self.close)  # after the writers' own hooks, so it runs before them

    @property
    def n(self) -> int:
        return len(self.writers)

    def _cut(self, lanes: np.ndarray) -> None:
        for i in np.flatnonzero(lanes):
            self.writers[i].end_episodes({k: v[i : i + 1] for k, v in self.pending.items()})
        self.has_pending[lanes] = False

    def _continues(self, obs: Arrays, lanes: slice | np.ndarray) -> np.ndarray:
        """Which lanes' ``obs`` equal the ``next_obs`` they wait for (a row per lane of ``lanes``)."""
        if self.n == 1 and all(obs[k].dtype == self.pending[k].dtype and obs[k].tobytes() == self.pending[k].tobytes()
                               for k in self.obs_names):  # one env, the usual case: equal bytes, no array ops
            return _ONE
        same = None
        for k in self.obs_names:
            eq = obs[k] == self.pending[k][lanes]
            eq = eq.reshape(len(eq), -1).all(axis=1)
            same = eq if same is None else same & eq
        assert same is not None
        return same

    def step(self, obs: Arrays, action: np.ndarray, reward: np.ndarray, terminated: np.ndarray,
             truncated: np.ndarray, next_obs: Arrays) -> None:
        """One step of every env: each array has leading dimension ``n``."""
        if len(self.writers) == 1:
            return self._step_one(obs, action, reward, terminated, truncated, next_obs)
        if self.has_pending.any():
            cut = self.has_pending & ~self._continues(obs, slice(None))
            if cut.any():
                self._cut(cut)
        done = terminated | truncated
        final = self._final
        for i, w in enumerate(self.writers):
            j = slice(i, i + 1)
            row = {k: obs[k][j] for k in self.obs_names}
            row.update(action=action[j], reward=reward[j], terminated=terminated[j], truncated=truncated[j])
            w.add(row)
            self.step_ids[i] = w.last_row_id
            if done[i]:  # the final observation: the writer flags it is_last (the row before is done)
                w.add({**final, **{k: next_obs[k][j] for k in self.obs_names}})
        for k in self.obs_names:
            np.copyto(self.pending[k], next_obs[k])
        self.has_pending = ~done

    def _step_one(self, obs: Arrays, action: np.ndarray, reward: np.ndarray, terminated: np.ndarray,
                  truncated: np.ndarray, next_obs: Arrays) -> None:
        """``step`` of one env, the usual SB3 case: the arrays are its rows as they are (no array ops)."""
        if self.has_pending[0] and not self._continues(obs, slice(None))[0]:
            self._cut(self.has_pending.copy())
        w = self.writers[0]
        w.add({**obs, "action": action, "reward": reward, "terminated": terminated, "truncated": truncated})
        self.step_ids[0] = w.last_row_id
        done = bool(terminated[0]) or bool(truncated[0])
        if done:  # the final observation: the writer flags it is_last (the row before is done)
            w.add({**self._final, **next_obs})
        for k in self.obs_names:
            self.pending[k][0] = next_obs[k][0]
        self.has_pending[0] = not done

    def extend(self, lane: int, obs: Arrays, action: np.ndarray, reward: np.ndarray, terminated: np.ndarray,
               truncated: np.ndarray, next_obs: Arrays) -> None:
        """``T`` consecutive steps of env ``lane``: each array has leading dimension ``T``."""
        T = len(reward)
        if T == 0:
            return
        if self.has_pending[lane]:
            first = {k: v[:1] for k, v in obs.items()}
            if not self._continues(first, np.array([lane]))[0]:
                self._cut(np.arange(self.n) == lane)
        done = terminated | truncated
        # a gap inside the block (obs_{t+1} is not next_obs_t of a step that goes on) ends the episode
        gap = np.zeros(T, np.bool_)
        if T > 1:
            same = np.ones(T - 1, np.bool_)
            for k in self.obs_names:
                same &= (obs[k][1:] == next_obs[k][:-1]).reshape(T - 1, -1).all(axis=1)
            gap[:-1] = ~done[:-1] & ~same
        w = self.writers[lane]
        start = 0
        for stop in [*(np.flatnonzero(gap) + 1).tolist(), T]:
            if stop > start:
                part = slice(start, stop)
                w.add_batch(_rows({k: v[part] for k, v in obs.items()}, action[part], reward[part],
                                  terminated[part], truncated[part], {k: v[part] for k, v in next_obs.items()},
                                  done[part], self._final))
                if stop < T:
                    w.end_episodes({k: v[stop - 1 : stop] for k, v in next_obs.items()})
            start = stop
        for k in self.obs_names:
            self.pending[k][lane] = next_obs[k][-1]
        self.has_pending[lane] = not done[-1]

    def end_episodes(self) -> None:
        """End every lane's running episode at the ``next_obs`` it waits for (written now)."""
        self._cut(self.has_pending.copy())

    def publish(self) -> None:
        for w in self.writers:
            w.publish()

    def flush(self) -> None:
        """Publish and make durable every row written (pending ``next_obs`` stay pending)."""
        for w in self.writers:
            w.flush()

    def close(self) -> None:
        """Write every pending ``next_obs`` as its lane's final row, then close the writers."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        errors = []
        for i, w in enumerate(self.writers):
            try:
                last = {k: v[i : i + 1] for k, v in self.pending.items()} if self.has_pending[i] else None
                w.close(last_obs=last)
            except Exception as exc:  # close the others; report the first failure
                errors.append(exc)
        if errors:
            raise errors[0]


def _rows(obs: Arrays, action: np.ndarray, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
          next_obs: Arrays, done: np.ndarray, final: Arrays) -> Arrays:
    """The rows of ``T`` steps of one lane, shaped ``(R, 1, ...)``: each step's row, and after each done
    step its final observation (zero action/reward, no flags)."""
    T = len(done)
    pos = np.arange(T) + np.concatenate([[0], np.cumsum(done)[:-1]])
    R = T + int(done.sum())
    last = pos[done] + 1
    out: Arrays = {}
    for name, x in (*obs.items(), ("action", action), ("reward", reward), ("terminated", terminated),
                    ("truncated", truncated)):
        a = np.empty((R, *x.shape[1:]), final[name].dtype if name in final else x.dtype)
        a[pos] = x
        if name in obs:
            a[last] = next_obs[name][done]
        else:
            a[last] = final[name][0]
        out[name] = a[:, None]
    return out
