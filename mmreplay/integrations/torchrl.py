"""TorchRL: ``MMReplayStorage`` (a ``torchrl.data`` ``Storage``) and ``MMReplaySampler``, so a
TorchRL ``ReplayBuffer`` keeps its transitions in an mmreplay store::

    from mmreplay.integrations.torchrl import MMReplaySampler, MMReplayStorage, collate
    rb = TensorDictReplayBuffer(storage=MMReplayStorage("/data/rb", max_size=100_000),
                                sampler=MMReplaySampler(), collate_fn=collate, batch_size=128)
    rb.extend(collector_batch)          # [T] or [n_envs, T] TensorDicts, as collectors give them
    loss = dqn_loss(rb.sample())        # ("next", "observation"), ("next", "done"), ...

What it keeps:

* TorchRL's key layout in and out: ``obs_keys`` (default ``"observation"``), ``action_key``,
  ``("next", <obs key>)``, ``("next", "reward")`` and ``("next", "done" | "terminated" |
  "truncated")`` with their trailing ``1``; sampled batches also hold the root ``"done"``,
  ``"terminated"`` and ``"truncated"`` (False: a transition never starts at a done state). Other
  keys (``"collector"``, ``"index"``, ``"step_count"``...) are not stored.
* mmreplay's rows: a batch of dims ``[T]`` is one env's consecutive steps, ``[n_envs, T]`` one per
  env (a single-lane writer each, ``_lanes``); ``("next", obs)`` is the next row of the env's lane,
  never stored twice; a gap (``obs[t+1] != ("next", obs)[t]`` without a done) ends the episode
  there, so any data round-trips exactly. The store is created from the first batch written (the
  schema ``Schema.from_spaces`` would give for scalar rewards and flags), or opened if it exists.
* The writer's cursor is ignored: the store appends and evicts its oldest segments beyond
  ``max_size`` rows (FIFO, as ``RoundRobinWriter``). ``len(storage)`` counts the sampleable
  transitions; each env's newest step becomes one when its next step (or ``close()``) arrives.

Samplers: ``MMReplaySampler`` draws with ``mmreplay.UniformSampler`` (one compiled pass that
locates, checks and gathers; indices are store row ids). TorchRL's ``RandomSampler`` and
``SamplerWithoutReplacement`` work too: they index ``[0, len(storage))`` over the transitions,
a map rebuilt after each write (O(rows)). TorchRL's ``PrioritizedSampler`` keys priorities by
those positions, which shift as segments are evicted, and ``SliceSampler`` needs trajectory keys
this storage does not return: use ``mmreplay.PrioritizedSampler`` / ``SequenceSampler`` for them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage

from ..core.errors import SchemaError
from ..core.schema import Field, Schema
from ..loader import tensor_batch
from ..sampling.uniform import UniformSampler
from ..storage import MANIFEST
from ..storage import open_or_create
from ..storage import open_store
from ._lanes import LaneWriters

__all__ = ["MMReplaySampler", "MMReplayStorage", "collate"]

_FLAGS = ("done", "terminated", "truncated")


def collate(data: TensorDictBase) -> TensorDictBase:
    """The ``collate_fn`` for a buffer on ``MMReplayStorage``: batches come ready (identity)."""
    return data


class MMReplayStorage(Storage):
    """A TorchRL storage over the mmreplay store at ``path`` (created by the first write if missing).

    Parameters
    ----------
    path
        The store directory.
    max_size
        Capacity in rows of a new store (oldest segments evicted beyond it).
    obs_keys
        The observation keys (each also read under ``"next"``).
    action_key
        The action key.
    segment_records
        Rows per segment of a new store (default: the store's, which follows ``max_size`` and the
        number of envs so a full store holds at most 1.25 x ``max_size`` + (envs + 1) x 1,024 rows).
    durability, seed, refresh_interval_s
        As for ``mmreplay.Writer`` / ``mmreplay.UniformSampler``.
    """

    max_size: int
    """Capacity in rows of a new store (TorchRL's ``Storage.max_size``)."""

    def __init__(self, path: str | os.PathLike[str], max_size: int = 1_000_000, *,
                 obs_keys: tuple[str, ...] = ("observation",), action_key: str = "action",
                 segment_records: int | None = None, durability: str = "segment", seed: int | None = None,
                 refresh_interval_s: float = 1.0) -> None:
        super().__init__(max_size)
        self.path = str(path)
        """The store directory."""
        self.obs_keys = tuple(obs_keys)
        """The observation keys of the TensorDicts (each also read under ``"next"``)."""
        self.action_key = action_key
        """The action key of the TensorDicts."""
        self._names = {k: "obs" if len(self.obs_keys) == 1 else f"obs/{k}" for k in self.obs_keys}
        self._opts = dict(segment_records=segment_records, durability=durability, seed=seed,
                          refresh_interval_s=refresh_interval_s)
        self.store: Any = None
        """The ``mmreplay.ReplayStore`` (``mode="a"``), or ``None`` until the first write makes it."""
        self._lanes: LaneWriters | None = None
        self.sampler: UniformSampler | None = None
        """The ``mmreplay.UniformSampler`` over ``store`` that ``MMReplaySampler`` draws through (``None`` with no store)."""
        self._dense: np.ndarray | None = None  # transition ids behind positions [0, len)
        self._snap: Any = None  # the reader snapshot ``_dense`` was computed from
        self._drawn: tuple[torch.Tensor, Any] | None = None
        if Path(self.path, MANIFEST).exists():
            self._attach(open_store(self.path, mode="a"))

    # -- opening ----------------------------------------------------------------------------
    def _attach(self, store: Any) -> None:
        want = [self._names[k] for k in self.obs_keys]
        if sorted(store.schema.obs_names) != sorted(want):
            store.close()
            raise SchemaError(f"{self.path} holds observation fields {list(store.schema.obs_names)}; "
                              f"obs_keys={self.obs_keys} give {want}")
        self.store = store
        self.sampler = UniformSampler(store, seed=self._opts["seed"], refresh_interval_s=self._opts["refresh_interval_s"])

    def _schema_of(self, data: TensorDictBase, nd: int) -> Schema:
        fields = []
        for key in self.obs_keys:
            x = _get(data, key)
            fields.append(Field(self._names[key], _np_dtype(x), tuple(x.shape[nd:])))
        a = _get(data, self.action_key)
        fields.append(Field("action", _np_dtype(a), tuple(a.shape[nd:])))
        r = _get(data, ("next", "reward"))
        fields += [Field("reward", _np_dtype(r), _squeeze1(tuple(r.shape[nd:]))),
                   Field("terminated", np.dtype(np.bool_)), Field("truncated", np.dtype(np.bool_))]
        return Schema(fields)

    def _open_for(self, data: TensorDictBase, nd: int) -> None:
        if self.store is None:
            schema = self._schema_of(data, nd)
            # default segments follow the capacity and the writers (one per env): the store's own rule
            envs = 1 if nd == 1 else int(data.batch_size[0])
            self._attach(open_or_create(self.path, schema, self.max_size, segment_records=self._opts["segment_records"],
                                        metadata={"writer": "torchrl"}, what="this TensorDict", writers=envs))
        lanes = 1 if nd == 1 else int(data.batch_size[0])
        if self._lanes is None:
            self._lanes = LaneWriters(self.store, lanes, durability=self._opts["durability"])
        elif lanes != self._lanes.n:
            raise SchemaError(f"this storage writes {self._lanes.n} env(s) per batch; got a batch of dims "
                              f"{list(data.batch_size)} (give [T] for one env, [n_envs, T] for several)")

    # -- Storage API ------------------------------------------------------------------------
    def set(self, cursor: Any, data: TensorDictBase, *, set_cursor: bool = True) -> None:
        """Append ``data`` (dims ``[T]`` or ``[n_envs, T]``); ``cursor`` is ignored (the store appends)."""
        if not set_cursor:  # ``storage[index] = data``, ``writer.write_at``: an overwrite
            raise NotImplementedError("an mmreplay store is append-only: stored transitions cannot be overwritten")
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"MMReplayStorage stores TensorDicts, got {type(data).__name__}")
        nd = data.batch_dims
        if nd not in (1, 2):
            raise SchemaError(f"expected a TensorDict of dims [T] or [n_envs, T], got {list(data.batch_size)}")
        self._open_for(data, nd)
        data = data.cpu() if data.device not in (None, torch.device("cpu")) else data
        cols = self._columns(data, nd)
        lanes = self._lanes
        assert lanes is not None
        for i in range(lanes.n):  # one add_batch per env (vectorized over its steps)
            pick = (lambda a: a) if nd == 1 else (lambda a, i=i: a[i])  # noqa: E731
            obs = {name: pick(cols[name]) for name in self.store.schema.obs_names}
            nxt = {name: pick(cols["next/" + name]) for name in self.store.schema.obs_names}
            lanes.extend(i, obs, pick(cols["action"]), pick(cols["reward"]), pick(cols["terminated"]),
                         pick(cols["truncated"]), nxt)
        lanes.publish()
        self._dense = None

    def _columns(self, data: TensorDictBase, nd: int) -> dict[str, np.ndarray]:
        schema, lead = self.store.schema, tuple(data.batch_size)
        out = {}
        for key in self.obs_keys:
            name = self._names[key]
            out[name] = _array(data, key, schema[name], lead)
            out["next/" + name] = _array(data, ("next", key), schema[name], lead)
        out["action"] = _array(data, self.action_key, schema["action"], lead)
        out["reward"] = _array(data, ("next", "reward"), schema["reward"], lead)
        nxt = _get(data, "next")
        flags = {k: _array(data, ("next", k), Field(k, np.dtype(np.bool_)), lead) for k in _FLAGS if k in nxt.keys()}
        if "done" not in flags and "terminated" not in flags:
            raise SchemaError("the TensorDict needs ('next', 'done') or ('next', 'terminated')")
        term = flags.get("terminated", flags.get("done"))
        trunc = flags.get("truncated")
        if trunc is None:
            trunc = flags["done"] & ~term if "done" in flags else np.zeros_like(term)
        out["terminated"], out["truncated"] = term, trunc
        return out

    def draw(self, batch_size: int) -> torch.Tensor:
        """Row ids of ``batch_size`` uniform transitions (``MMReplaySampler``); the batch is kept
        for the ``get`` that follows."""
        if self.sampler is None:
            raise RuntimeError("the storage is empty: write data before sampling")
        b = self.sampler.sample(batch_size)
        index = torch.from_numpy(b.ids)
        self._drawn = (index, b)
        return index

    def get(self, index: Any) -> TensorDictBase:
        """The transitions at ``index``: positions in ``[0, len(self))``, or the row ids ``draw`` returned."""
        drawn, self._drawn = self._drawn, None
        if drawn is not None and index is drawn[0]:
            return self._to_td(drawn[1])
        ids = self._dense_ids()[np.asarray(index, np.int64)]
        return self._to_td(self.store.transitions(np.atleast_1d(ids)))

    def _to_td(self, b: Any) -> TensorDictBase:
        t = tensor_batch(b, "cpu")
        B = len(b.ids)
        obs = t.obs if isinstance(t.obs, dict) else {"": t.obs}
        nobs = t.next_obs if isinstance(t.next_obs, dict) else {"": t.next_obs}
        term, trunc = t.terminated.reshape(B, 1), t.truncated.reshape(B, 1)
        nxt = {"reward": t.reward.reshape(B, *self._reward_shape()), "done": term | trunc,
               "terminated": term, "truncated": trunc}
        root = {self.action_key: t.action, **{k: torch.zeros(B, 1, dtype=torch.bool) for k in _FLAGS}}
        for key in self.obs_keys:
            sub = "" if len(self.obs_keys) == 1 else key
            root[key], nxt[key] = obs[sub], nobs[sub]
        return TensorDict({**root, "next": TensorDict(nxt, batch_size=[B])}, batch_size=[B])

    def _reward_shape(self) -> tuple[int, ...]:
        shape = self.store.schema["reward"].shape
        return shape if shape else (1,)

    def _dense_ids(self) -> np.ndarray:
        if self.store is None:
            return np.zeros(0, np.int64)
        self.store.refresh_if_stale(self._opts["refresh_interval_s"])
        if self._dense is None or self.store.reader.snapshot is not self._snap:
            self._snap = self.store.reader.snapshot
            self._dense = self.store.transition_ids()
        return self._dense

    def _rand_given_ndim(self, batch_size: int) -> torch.Tensor:
        return torch.randint(0, len(self), (batch_size,), generator=self._rng)

    def __len__(self) -> int:
        return len(self._dense_ids())

    def contains(self, item: Any) -> Any:
        """Whether each position in ``item`` is below the storage's length (a tensor of bools)."""
        return torch.as_tensor(item) < len(self)

    def state_dict(self) -> dict[str, Any]:
        """The store's path only: the rows stay in the store (TorchRL's checkpoint holds no copy)."""
        return {"path": self.path}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Accept a ``state_dict`` of this same store (the rows are already there); another path is a ``ValueError``."""
        if state_dict.get("path") != self.path:
            raise ValueError(f"this storage is the store at {self.path}, the state is of {state_dict.get('path')}")

    def _empty(self) -> None:
        raise NotImplementedError("an mmreplay store keeps its rows; use a new `path` to start empty")

    def flush(self) -> None:
        """Make every written row durable (msync); each env's newest step stays pending."""
        if self._lanes is not None:
            self._lanes.flush()

    def close(self) -> None:
        """Write each env's pending step and close the store (idempotent)."""
        if self.store is None:
            return
        try:
            if self._lanes is not None:
                self._lanes.close()
        finally:
            if self.sampler is not None:
                self.sampler.close()
            self.store.close()
            self.store = self._lanes = self.sampler = None

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("MMReplayStorage is not picklable: open the store by path in each process")

    def __repr__(self) -> str:
        return f"MMReplayStorage({self.path!r}, max_size={self.max_size})"


class MMReplaySampler(Sampler):
    """Uniform sampling with replacement by mmreplay's compiled sampler (for ``MMReplayStorage``)."""

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        """``batch_size`` positions of ``storage`` (an ``MMReplayStorage``) drawn uniformly with replacement
        by mmreplay's compiled sampler, and no extra info."""
        if not isinstance(storage, MMReplayStorage):
            raise TypeError(f"MMReplaySampler samples an MMReplayStorage, not {type(storage).__name__}")
        return storage.draw(batch_size), {}

    def _empty(self) -> None:
        pass

    def dumps(self, path: Any) -> None:
        """Nothing to write: the sampler keeps no state (its draws come from the storage's sampler)."""

    def loads(self, path: Any) -> None:
        """Nothing to read (see ``dumps``)."""

    def state_dict(self) -> dict[str, Any]:
        """Empty: the sampler keeps no state."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to load (see ``state_dict``)."""


def _get(data: TensorDictBase, key: Any) -> torch.Tensor:
    x = data.get(key, None)
    if x is None:
        raise SchemaError(f"the TensorDict has no key {key!r} (its keys: {sorted(map(str, data.keys(True)))})")
    return x


def _np_dtype(x: torch.Tensor) -> np.dtype[Any]:
    return torch.empty(0, dtype=x.dtype).numpy().dtype


def _squeeze1(shape: tuple[int, ...]) -> tuple[int, ...]:
    return () if shape == (1,) else shape


def _array(data: TensorDictBase, key: Any, f: Field, lead: tuple[int, ...]) -> np.ndarray:
    """``data[key]`` as a numpy array of ``lead + f.shape`` (a trailing 1 of scalars is dropped)."""
    x = _get(data, key)
    want = lead + f.shape
    if tuple(x.shape) not in (want, want + (1,) if not f.shape else want):
        raise SchemaError(f"field {f.name!r} ({key!r}): expected shape {list(want)}"
                          f"{' (or a trailing 1)' if not f.shape else ''}, got {list(x.shape)}")
    a = x.detach().numpy().reshape(want)
    if a.dtype != f.dtype:
        if not np.can_cast(a.dtype, f.dtype, "same_kind"):
            raise SchemaError(f"field {f.name!r} ({key!r}): expected dtype {f.dtype}, got {a.dtype}")
        a = a.astype(f.dtype)
    return a
