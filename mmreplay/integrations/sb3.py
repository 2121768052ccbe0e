"""Stable-Baselines3: ``MMReplayBuffer``, an SB3 ``ReplayBuffer`` whose data lives in a store.

Use it with any off-policy algorithm (DQN, SAC, TD3, DDPG)::

    from mmreplay.integrations.sb3 import MMReplayBuffer
    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=MMReplayBuffer,
                replay_buffer_kwargs=dict(path="/data/cartpole-dqn"))

What it keeps:

* SB3's contract: it is a ``ReplayBuffer`` (``isinstance`` checks pass) but allocates none of SB3's
  arrays; ``add(obs, next_obs, action, reward, done, infos)`` takes what SB3's ``ReplayBuffer.add``
  takes (``next_obs`` already holds ``infos[i]["terminal_observation"]`` for done envs; actions
  reshaped to ``(n_envs, action_dim)``, observations and rewards broadcast and cast as SB3's
  assignment into its arrays does) and ``sample(batch_size, env)`` returns ``ReplayBufferSamples``
  (``DictReplayBufferSamples`` for Dict observations) on SB3's device with SB3's shapes and dtypes:
  actions ``(B, action_dim)``, rewards and dones ``(B, 1)`` float32. ``dones`` is ``terminated``
  with ``handle_timeout_termination=True`` (SB3's ``done * (1 - timeout)``), else ``terminated or
  truncated``; VecNormalize (``env=``) normalizes observations and rewards at sampling as in SB3.
  Unlike SB3's buffer it refuses non-finite floats (``InvalidValueError``, the store's rule).
* SB3's attributes (``sampling="sb3"``): ``pos``, ``full``, ``size()`` and ``reset()`` are SB3's, and
  ``observations``, ``next_observations``, ``actions``, ``rewards``, ``dones``, ``timeouts`` are
  SB3's arrays ``(buffer_size, n_envs, ...)`` in its dtypes and ring order, assembled from the store
  on each access (``buffer_size * n_envs`` row reads; refused with ``MemoryError`` over
  ``max_assemble_bytes``, 1 GiB by default). They are copies: read-only, but ``dones`` (SB3's
  ``learn`` writes it with ``optimize_memory_usage``; the write changes nothing stored). Slots never
  filled hold zeros and sample as zeros, as in SB3's zero-filled arrays (SB3's own tests set
  ``full = True`` on an empty buffer and sample).
* The store's rows: ``Schema.from_spaces`` (the schema ``mmreplay collect`` makes for the same
  env, so actors can write into the same store), one single-lane writer per env (``_lanes``),
  ``truncated`` from ``infos[i]["TimeLimit.truncated"]``. Box actions are stored as SB3 hands
  them over (scaled to [-1, 1] by SAC, TD3 and DDPG): a store this buffer creates says so in its
  metadata, ``"action_scale": "unit"`` and ``"action_space": {"low": [...], "high": [...]}`` (the
  env's bounds, flat lists of floats), for readers that need env-scale actions; a buffer opened on
  a store whose metadata says ``"action_scale": "env"`` warns that the scales will mix.
  ``optimize_memory_usage`` changes nothing: ``next_obs`` is never stored twice anyway, and may be
  combined with ``handle_timeout_termination`` (SB3 refuses that pair for its own buffer).
* Persistence: a buffer with the path of an existing store continues on its rows (a new
  process, a new model; no ``save_replay_buffer`` needed) and several processes may write one
  store while each samples all of it (with ``sampling="store"``; rows of other processes within
  ``refresh_interval_s`` plus the 1 s in which a writer publishes them).
  Pickling (``save_replay_buffer``) saves the path and settings, not the rows (nor the slot
  table: a loaded buffer lays the store's transitions into it anew).
* Sampling, two ways (``sampling=``):

  - ``"sb3"`` (default): SB3's own draws. The buffer keeps SB3's slot table, ``(pos, env)`` over the
    last ``buffer_size`` steps it added (one row id per slot, 8 bytes), and draws slots with numpy's
    global generator exactly as SB3's ``ReplayBuffer`` does (``sample``, then ``_get_samples``, the
    ``optimize_memory_usage`` variant included). A seeded run samples the very transitions SB3's
    own buffer would, so it trains the same model. The newest step of each env is drawn too:
    its ``next_obs`` is served from memory until the env's next step writes it. A store that
    already holds transitions when the buffer opens fills the table with its newest ones (as SB3's
    ``load_replay_buffer`` would). Rows written by other processes are not drawn; a slot whose
    row is no longer stored (evicted, repaired) is replaced by a uniform draw over the store.
  - ``"store"``: uniform over every transition in the store (other processes' rows within
    ``refresh_interval_s``) with the buffer's own seeded generator (its seed is drawn from numpy's
    global generator, which SB3's ``seed=`` sets, unless ``seed=`` is given). Each env's newest
    step becomes sampleable when the env's next step is added (its ``next_obs`` is that row).

  ``close()`` (or interpreter exit) writes each env's pending ``next_obs``.
* Capacity: FIFO by whole segments. A new store keeps ``buffer_size`` rows with ``"store"``
  sampling, 1.25 x ``buffer_size`` with ``"sb3"`` (so the slot table's steps stay stored with the
  final-observation rows among them); default segments follow the capacity.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples

from ..core.errors import SchemaError
from ..core.schema import Schema
from ..loader import tensor_batch
from ..sampling.uniform import UniformSampler
from ..storage import open_or_create
from ..storage import TransitionBatch, transitions_at
from ._lanes import LaneWriters

if TYPE_CHECKING:
    from stable_baselines3.common.vec_env import VecNormalize

__all__ = ["MMReplayBuffer"]


class MMReplayBuffer(ReplayBuffer):
    """An SB3 replay buffer backed by an mmreplay store at ``path``.

    Parameters
    ----------
    buffer_size, observation_space, action_space, device, n_envs, optimize_memory_usage, handle_timeout_termination
        As for SB3's ``ReplayBuffer`` (SB3's algorithms pass them).
    path
        The store directory: created from the spaces if missing, else opened and appended to
        (its schema must be the one the spaces give: ``SchemaError`` names the field otherwise).
    segment_records
        Rows per segment file of a new store (default: the store's, which follows ``buffer_size``
        and ``n_envs`` so a full buffer holds at most 1.25 x ``buffer_size`` + (n_envs + 1) x 1,024 rows).
    durability
        The writers' durability level (``"process"``, ``"segment"``, ``"batch"``; see ``mmreplay.Writer``).
    sampling
        ``"sb3"``: SB3's own draws over this buffer's last ``buffer_size`` steps (seeded runs sample
        what SB3's buffer would); ``"store"``: uniform over every transition in the store (rows of
        other processes too). See the module's docstring.
    seed
        Seed of the ``"store"`` sampler's generator; ``None`` draws one from ``numpy.random``.
    refresh_interval_s
        How often the sampler looks for rows written by other processes.
    sampler_kwargs
        More ``mmreplay.UniformSampler`` options (``mode="windowed"``, ``cache_bytes``,
        ``prefetch_batches``) for stores larger than RAM, with ``sampling="store"``.
    max_assemble_bytes
        The largest SB3 array (``observations``, ``next_observations``, ``actions``, ``rewards``,
        ``dones``, ``timeouts``) an attribute access assembles; a larger one raises ``MemoryError``
        (default 1 GiB; also settable on the buffer).

    Attributes
    ----------
    observations, next_observations, actions, rewards, dones, timeouts
        SB3's arrays, in SB3's shapes ``(buffer_size, n_envs, ...)``, dtypes and ring order (``[pos,
        env]`` is the slot SB3 would fill there), ``sampling="sb3"`` only. Each access assembles a
        new array from the store: ``buffer_size * n_envs`` row reads and as many bytes as SB3's own
        array, so read it once (``obs = buffer.observations``), not in a loop. Read-only except
        ``dones``, whose writes change nothing stored (SB3's ``learn`` with
        ``optimize_memory_usage`` marks the last step done there to cut an episode, which this buffer
        does by itself). Empty slots hold zeros, as in SB3's arrays.
    pos, full
        SB3's next slot and whether the slot table wrapped (``sampling="sb3"``; settable, as SB3's).
    """

    MAX_ASSEMBLE_BYTES = 1 << 30
    """Default of ``max_assemble_bytes``: the largest array an attribute such as ``observations`` assembles."""

    # annotations only (SB3's constructor sets them), so the reference documents them
    pos: int
    """SB3's next slot in the slot table (``sampling="sb3"``; settable, as SB3's)."""
    full: bool
    """Whether the slot table wrapped (``sampling="sb3"``; settable, as SB3's)."""
    n_envs: int
    """The number of envs (lanes) each ``add`` carries."""

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        *,
        path: str | Path,
        segment_records: int | None = None,
        durability: Literal["process", "segment", "batch"] = "segment",
        sampling: Literal["sb3", "store"] = "sb3",
        seed: int | None = None,
        refresh_interval_s: float = 1.0,
        sampler_kwargs: dict[str, Any] | None = None,
        max_assemble_bytes: int = MAX_ASSEMBLE_BYTES,
    ) -> None:
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        """Steps of the vector env the slot table holds (``buffer_size // n_envs``, as SB3's)."""
        self.optimize_memory_usage = optimize_memory_usage
        """As given: it changes nothing here (``next_obs`` is never stored twice; see the module docstring)."""
        self.handle_timeout_termination = handle_timeout_termination
        """As SB3's: sampled ``dones`` are ``terminated`` when True, else ``terminated or truncated``."""
        self.path = str(path)
        """The store directory."""
        if sampling not in ("sb3", "store"):
            raise ValueError(f"sampling must be 'sb3' or 'store', got {sampling!r}")
        self.sampling = sampling
        """``"sb3"`` or ``"store"`` (see the class docstring)."""
        self.max_assemble_bytes = int(max_assemble_bytes)
        """The largest SB3 array an attribute access assembles (settable); larger raises ``MemoryError``."""
        self._options = dict(segment_records=segment_records, durability=durability, seed=seed,
                             refresh_interval_s=refresh_interval_s, sampler_kwargs=sampler_kwargs)
        # sb3 sampling: the store row id of each (pos, env) slot, -1 while empty (SB3's pos and full)
        self._slots = np.full((self.buffer_size, n_envs) if sampling == "sb3" else (0, n_envs), -1, np.int64)
        self._warned = False
        self._last = -1  # the slot of the newest step, whose next_obs is pending in the lanes ("sb3")
        # a seed drawn here would shift numpy's global stream that SB3's own buffer leaves alone
        self._open(buffer_size, seed if seed is not None or sampling == "sb3" else np.random.randint(2**63 - 1))

    def _open(self, capacity: int, seed: int | None) -> None:
        o = self._options
        schema = Schema.from_spaces(self.observation_space, self.action_space)
        if self.sampling == "sb3":  # the slot table's steps plus the final-observation rows among them
            capacity += capacity // 4
        # default segments follow the capacity and the writers (one per env): the store's own rule
        self.store = open_or_create(self.path, schema, capacity, segment_records=o["segment_records"],
                                    metadata=self._new_store_metadata(), what="this SB3 model's spaces",
                                    writers=self.n_envs)
        if isinstance(self.action_space, spaces.Box) and self.store.metadata.get("action_scale") == "env":
            warnings.warn(f"{self.path}: the store's actions are in the env's bounds (metadata action_scale='env'); "
                          "SB3's SAC/TD3/DDPG add actions scaled to [-1, 1], so its rows will mix both scales",
                          stacklevel=3)
        try:
            self.lanes = LaneWriters(self.store, self.n_envs, durability=o["durability"])
            self.sampler = UniformSampler(self.store, seed=seed, refresh_interval_s=o["refresh_interval_s"],
                                          **(o["sampler_kwargs"] or {}))
        except BaseException:
            self.store.close()
            raise
        self._obs_names = schema.obs_names
        self._dict_obs = isinstance(self.observation_space, spaces.Dict)
        self._act_dtype = np.dtype(self._maybe_cast_dtype(self.action_space.dtype))
        self._seed = seed
        n, fields = self.n_envs, self.store.schema
        self._shapes = {f.name: (n, *f.shape) for f in fields.fields}  # what add() hands to the lanes
        self._dtypes = {f.name: f.dtype for f in fields.fields}
        self._reward_dtype = fields["reward"].dtype
        if self.sampling == "sb3":
            self._fill_slots()

    def _new_store_metadata(self) -> dict[str, Any]:
        """The metadata of a store this buffer creates: the writer and, for a Box action space, the
        actions' scale. SB3's off-policy algorithms add Box actions squashed to [-1, 1]
        (``policy.scale_action``): ``action_scale`` is ``"unit"`` and ``action_space`` holds the env's
        bounds (``low``, ``high``: flat lists of floats in C order) to map them back. A Box with an
        infinite bound (which SB3's algorithms refuse) gets neither key."""
        meta: dict[str, Any] = {"writer": "stable-baselines3"}
        a = self.action_space
        if isinstance(a, spaces.Box):
            low = np.asarray(a.low, np.float64).reshape(-1)
            high = np.asarray(a.high, np.float64).reshape(-1)
            if np.isfinite(low).all() and np.isfinite(high).all():
                meta["action_scale"] = "unit"
                meta["action_space"] = {"low": low.tolist(), "high": high.tolist()}
        return meta

    def _fill_slots(self) -> None:
        """Lay the store's newest transitions into the slot table, oldest first (a reopened buffer)."""
        ids = self.store.transition_ids() if self.store.num_rows else np.zeros(0, np.int64)
        steps = min(len(ids) // self.n_envs, self.buffer_size)
        if steps:
            self._slots[:steps] = ids[len(ids) - steps * self.n_envs :].reshape(steps, self.n_envs)
        self.full = steps == self.buffer_size
        self.pos = 0 if self.full else steps
        self._last = -1  # no next_obs pending

    # -- SB3's buffer API -----------------------------------------------------------------
    def add(self, obs: Any, next_obs: Any, action: np.ndarray, reward: np.ndarray, done: np.ndarray,
            infos: list[dict[str, Any]]) -> None:
        """Append one step of the ``n_envs`` envs (what SB3's ``_store_transition`` passes).

        Takes what SB3's ``ReplayBuffer.add`` takes: ``action`` reshaped to the ``n_envs`` actions (any
        shape of that size, e.g. an unbatched ``(10, 7)`` action of one env); observations, ``reward``
        and ``done`` as SB3 assigns them into its arrays (``(n_envs, *shape)``, ``(n_envs, 1)`` for
        Discrete values, or broadcast to it; values cast to the space's dtype); ``infos`` one dict per
        env, whose ``"TimeLimit.truncated"`` marks a done as a truncation (with
        ``handle_timeout_termination=False`` SB3 reads no ``infos``: then any other ``infos`` counts
        every done as a termination). Non-finite floats are refused (``InvalidValueError``).
        ``SchemaError`` names the field and the expected shape otherwise.
        """
        n = self.n_envs
        try:
            given = len(infos)
        except TypeError:
            given = -1
        if given != n:
            if self.handle_timeout_termination:
                raise SchemaError(f"`infos` has {given if given >= 0 else 'no'} entries, expected one dict per env "
                                  f"(n_envs={n})")
            infos = _NO_INFOS * n
        if n == 1 and type(done) is np.ndarray and done.shape == (1,) and done.dtype == np.bool_:
            # one env, as DummyVecEnv hands it over: the flags from two Python bools (no array ops)
            terminated, truncated = _FLAGS[bool(done[0]), bool(infos[0].get("TimeLimit.truncated", False))]
        else:
            timeout = np.array([info.get("TimeLimit.truncated", False) for info in infos], np.bool_)
            done = _as(np.asarray(done), (n,), _BOOL, "done")
            terminated, truncated = done & ~timeout, done & timeout
        fields = self._fields_of(obs, "obs")
        nxt = self._fields_of(next_obs, "next_obs")
        action = _as(np.asarray(action), self._shapes["action"], self._dtypes["action"], "action", reshape=True)
        reward = _as(np.asarray(reward), (n,), self._reward_dtype, "reward")
        self.lanes.step(fields, action, reward, terminated, truncated, nxt)
        if self.sampling == "sb3":
            self._slots[self.pos] = self.lanes.step_ids
            self._last = self.pos  # the slot whose next_obs is pending (the lanes')
            self.pos += 1
            if self.pos == self.buffer_size:
                self.full, self.pos = True, 0

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """``batch_size`` transitions drawn with replacement: SB3's own draws (``sampling="sb3"``) or
        uniformly over the whole store (``"store"``)."""
        if self.sampling == "store":
            return self.samples_of(self.sampler.sample(batch_size), env)
        return super().sample(batch_size, env)  # SB3's own draw of slots (then our _get_samples)

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """``sampling="sb3"``: SB3's slots ``batch_inds`` (envs drawn as SB3 does); ``"store"``: the
        transitions starting at store row ids ``batch_inds``."""
        if self.sampling == "store":
            return self.samples_of(self.store.transitions(np.asarray(batch_inds, np.int64)), env)
        envs = np.random.randint(0, high=self.n_envs, size=(len(batch_inds),))
        return self.samples_of(self.slot_transitions(np.asarray(batch_inds), envs), env)

    def slot_transitions(self, pos: np.ndarray, envs: np.ndarray) -> TransitionBatch:
        """The transitions in SB3 slots ``(pos, envs)`` (``sampling="sb3"``), as an mmreplay batch.

        A slot never filled (``full`` set by hand on a buffer not yet full) gives a transition of zeros,
        as SB3's zero-filled arrays do; a slot whose row is no longer stored, a uniform draw over
        the store (with a warning, once)."""
        store = self.store
        store.sync_local()  # rows this buffer added are visible
        ids = self._slots[pos, envs]
        # an env's newest step: its next_obs is still pending in memory
        newest = pos == self._last
        if not newest.any() or not (newest := newest & self.lanes.has_pending[envs]).any():
            if len(ids) and ids.min() >= 0:
                try:  # the usual case: every slot a stored transition, gathered by the sampler's compiled kernel
                    return self.sampler.view(ids)
                except KeyError:
                    pass
        ok, k, slot = store.reader.visible(ids)  # not ok where never filled (-1)
        empty = ids < 0
        if ok.any():
            whole, nk, ns = store.reader.transition_starts(k, slot)
        else:
            whole = nk = ns = ok
        whole &= ok & ~newest
        newest &= ok
        parts, order = [], []
        if whole.any():
            parts.append(transitions_at(store.reader, store.schema, k[whole], slot[whole], ids[whole],
                                        nxt=(nk[whole], ns[whole])))
            order.append(np.flatnonzero(whole))
        if newest.any():
            b = transitions_at(store.reader, store.schema, k[newest], slot[newest], ids[newest],
                               nxt=(k[newest], slot[newest]))
            nxt = {n.removeprefix("obs/"): v[envs[newest]] for n, v in self.lanes.pending.items()}
            parts.append(_replace(b, next_obs=nxt["obs"] if set(nxt) == {"obs"} else nxt))
            order.append(np.flatnonzero(newest))
        if empty.any():
            parts.append(self._zeros(int(empty.sum())))
            order.append(np.flatnonzero(empty))
        if (lost := ~(whole | newest | empty)).any():  # rows gone: a uniform draw over the store instead
            if not self._warned:
                self._warned = True
                warnings.warn(f"{self.path}: some of SB3's slots point to rows no longer stored (evicted or "
                              "masked); they are replaced by uniform draws over the store", stacklevel=3)
            parts.append(self.sampler.sample(int(lost.sum())))
            order.append(np.flatnonzero(lost))
        return _concat(parts, np.argsort(np.concatenate(order), kind="stable"))

    def _zeros(self, m: int) -> TransitionBatch:
        """``m`` transitions of zeros in the store's dtypes (never-filled slots, as in SB3's arrays)."""
        schema = self.store.schema

        def z(name: str) -> np.ndarray:
            return np.zeros((m, *schema[name].shape), schema[name].dtype)

        def obs() -> Any:
            return z("obs") if not self._dict_obs else {n.removeprefix("obs/"): z(n) for n in self._obs_names}

        return TransitionBatch(obs=obs(), action=z("action"), reward=z("reward"), next_obs=obs(),
                               terminated=z("terminated"), truncated=z("truncated"), ids=np.full(m, -1, np.int64))

    def samples_of(self, b: TransitionBatch, env: VecNormalize | None = None) -> Any:
        """An mmreplay batch as SB3's ``ReplayBufferSamples`` on this buffer's device."""
        B = len(b)
        if env is not None:  # VecNormalize: normalize as SB3 does, in numpy
            b = _replace(b, obs=self._normalize_obs(b.obs, env), next_obs=self._normalize_obs(b.next_obs, env),
                         reward=self._normalize_reward(b.reward.astype(np.float32), env))
        done = b.terminated if self.handle_timeout_termination else b.terminated | b.truncated
        # SB3's shapes and dtypes made in numpy (cheaper than torch ops on small arrays), then one conversion
        t = tensor_batch(TransitionBatch(
            obs=self._obs_shaped(b.obs, B), action=b.action.reshape(B, self.action_dim).astype(self._act_dtype, copy=False),
            reward=b.reward.reshape(B, 1).astype(np.float32, copy=False), next_obs=self._obs_shaped(b.next_obs, B),
            terminated=done.reshape(B, 1).astype(np.float32), truncated=None, ids=b.ids), self.device)
        cls = DictReplayBufferSamples if self._dict_obs else ReplayBufferSamples
        return cls(t.obs, t.action, t.next_obs, t.terminated, t.reward)  # terminated: SB3's float dones

    def size(self) -> int:
        """Steps per env in the slot table (``"sb3"``, as SB3), or the store's rows per env
        (``"store"``: final-observation rows included), at most ``buffer_size``."""
        if self.sampling == "sb3":
            return self.buffer_size if self.full else self.pos
        return min(self.store.num_rows // self.n_envs, self.buffer_size)

    def reset(self) -> None:
        """As SB3's: ``pos = 0`` and ``full = False`` (``sampling="sb3"``), so ``sample`` draws only the
        steps added after it, which overwrite the slots one by one (the slots past ``pos`` keep their
        old steps, as SB3's arrays do). The store keeps every row. Not supported with
        ``sampling="store"``, which draws over every row of the store: use a new ``path`` for an
        empty buffer."""
        if self.sampling != "sb3":
            raise NotImplementedError("MMReplayBuffer(sampling='store') draws over every row of its store, which keeps "
                                      "its rows: give the buffer a new `path` to start empty")
        self.pos, self.full = 0, False

    # -- SB3's arrays, assembled on access ------------------------------------------------------
    @property
    def observations(self) -> np.ndarray | dict[str, np.ndarray]:
        """SB3's ``observations``: ``(buffer_size, n_envs, *obs_shape)`` in the space's dtype (a dict
        for Dict spaces), assembled from the store on each access (see the class's Attributes)."""
        return self._assemble("observations")

    @property
    def next_observations(self) -> np.ndarray | dict[str, np.ndarray]:
        """SB3's ``next_observations``: each slot's next observation (the final one at an episode
        end; an env's newest step's from memory), as ``observations``. Present with
        ``optimize_memory_usage`` too (SB3 keeps none then)."""
        return self._assemble("next_observations")

    @property
    def actions(self) -> np.ndarray:
        """SB3's ``actions``: ``(buffer_size, n_envs, action_dim)``, float64 actions as float32."""
        return self._assemble("actions")

    @property
    def rewards(self) -> np.ndarray:
        """SB3's ``rewards``: ``(buffer_size, n_envs)`` float32."""
        return self._assemble("rewards")

    @property
    def dones(self) -> np.ndarray:
        """SB3's ``dones``: ``(buffer_size, n_envs)`` float32, 1 where the episode ended (terminated
        or truncated). A writable copy: writing it changes nothing stored."""
        return self._assemble("dones")

    @property
    def timeouts(self) -> np.ndarray:
        """SB3's ``timeouts``: ``(buffer_size, n_envs)`` float32, 1 where a done was a time-limit
        truncation; zeros with ``handle_timeout_termination=False``, as SB3 keeps them."""
        return self._assemble("timeouts")

    def _slot_bytes(self, what: str) -> int:
        schema = self.store.schema
        if what in ("observations", "next_observations"):
            return sum(schema[n].row_bytes for n in self._obs_names)
        if what == "actions":
            return self.action_dim * self._act_dtype.itemsize
        return 4

    def _assemble(self, what: str) -> Any:
        """SB3's array ``what`` over the slot table, read from the store (zeros in empty slots)."""
        if self.sampling != "sb3":
            raise AttributeError(f"MMReplayBuffer(sampling='store') has no SB3 slot table, so no `{what}` array: "
                                 "read buffer.store (e.g. store.transitions(store.transition_ids())) or use "
                                 "sampling='sb3'")
        bs, n = self._slots.shape
        nbytes = bs * n * self._slot_bytes(what)
        if nbytes > self.max_assemble_bytes:
            raise MemoryError(f"MMReplayBuffer.{what} would assemble {nbytes:,} bytes ({bs:,} x {n} slots) from "
                              f"{self.path}, over max_assemble_bytes={self.max_assemble_bytes:,}: sample() batches, "
                              "read buffer.store, or raise buffer.max_assemble_bytes")
        store = self.store
        store.sync_local()
        ids = self._slots.reshape(-1)
        ok, k, slot = store.reader.visible(ids)
        if (lost := int((~ok & (ids >= 0)).sum())):
            warnings.warn(f"{self.path}: {lost} of SB3's slots point to rows no longer stored (evicted or masked); "
                          f"`{what}` holds zeros there", stacklevel=3)
        gather, schema = store.reader.gather, store.schema

        def column(name: str, where: np.ndarray, kk: np.ndarray, ss: np.ndarray) -> np.ndarray:
            out = np.zeros((bs * n, *schema[name].shape), schema[name].dtype)
            if len(kk):
                out[where] = gather(name, kk, ss)
            return out

        def own(name: str) -> np.ndarray:  # the slot's own row
            return column(name, ok, k[ok], slot[ok])

        if what == "observations":
            out = {nm: own(nm) for nm in self._obs_names}
        elif what == "next_observations":
            env = np.arange(bs * n) % n
            newest = ok & (np.arange(bs * n) // n == self._last) & self.lanes.has_pending[env]
            rest = np.flatnonzero(ok & ~newest)
            whole, nk, ns = store.reader.transition_starts(k[rest], slot[rest])
            rest = rest[whole]
            out = {}
            for nm in self._obs_names:
                out[nm] = column(nm, rest, nk[whole], ns[whole])
                out[nm][newest] = self.lanes.pending[nm][env[newest]]
        elif what == "actions":
            return _frozen(own("action").reshape(bs, n, self.action_dim).astype(self._act_dtype, copy=False))
        elif what == "rewards":
            return _frozen(own("reward").reshape(bs, n).astype(np.float32))
        elif what == "dones":
            return (own("terminated") | own("truncated")).reshape(bs, n).astype(np.float32)  # writable (see dones)
        else:  # timeouts
            flags = own("truncated") if self.handle_timeout_termination else np.zeros(bs * n, np.bool_)
            return _frozen(flags.reshape(bs, n).astype(np.float32))
        if not self._dict_obs:
            return _frozen(out["obs"].reshape(bs, n, *self.obs_shape))
        shapes: dict[str, tuple[int, ...]] = self.obs_shape  # type: ignore[assignment]
        return {(key := nm.removeprefix("obs/")): _frozen(v.reshape(bs, n, *shapes[key])) for nm, v in out.items()}

    # -- mmreplay's extras ----------------------------------------------------------------
    def flush(self) -> None:
        """Publish every row added and make it durable (msync), whatever the durability level."""
        self.lanes.flush()

    def close(self) -> None:
        """Write each env's pending step, close the writers and the store (idempotent)."""
        if self.store.reader is None:
            return
        try:
            self.lanes.close()
        finally:
            self.sampler.close()
            self.store.close()

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("store", "lanes", "sampler", "_slots")}
        self.lanes.publish()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("max_assemble_bytes", self.MAX_ASSEMBLE_BYTES)  # pickled before it existed
        self.__dict__.update(state)
        self._slots = np.full((self.buffer_size if self.sampling == "sb3" else 0, self.n_envs), -1, np.int64)
        self._open(self.buffer_size * self.n_envs, None if self._seed is None else self._seed + 1)

    # -- conversions ------------------------------------------------------------------------
    def _fields_of(self, obs: Any, what: str) -> dict[str, np.ndarray]:
        """SB3 observations (an array, or a dict for Dict spaces) as the store's obs fields."""
        if not self._dict_obs:
            return {"obs": _as(np.asarray(obs), self._shapes["obs"], self._dtypes["obs"], "obs", what)}
        if not isinstance(obs, dict):
            raise SchemaError(f"`{what}` must be a dict of arrays for a Dict observation space")
        out = {}
        for name in self._obs_names:
            if name[4:] not in obs:
                raise SchemaError(f"`{what}` lacks key {name[4:]!r}")
            out[name] = _as(np.asarray(obs[name[4:]]), self._shapes[name], self._dtypes[name], name,
                            f"{what}[{name[4:]!r}]")
        return out

    def _obs_shaped(self, x: Any, B: int) -> Any:
        if isinstance(x, dict):
            return {k: v.reshape(B, *self.obs_shape[k]) for k, v in x.items()}  # type: ignore[index]
        return x.reshape(B, *self.obs_shape)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _flag(value: bool) -> np.ndarray:
    a = np.full(1, value, np.bool_)
    a.flags.writeable = False
    return a


# one env's (terminated, truncated) by (done, timeout): SB3's done split by its TimeLimit.truncated info
_FLAGS = {(done, timeout): (_flag(done and not timeout), _flag(done and timeout))
          for done in (False, True) for timeout in (False, True)}


_BOOL = np.dtype(np.bool_)
_NO_INFOS: list[dict[str, Any]] = [{}]


def _as(x: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, name: str, what: str = "", *,
        reshape: bool = False) -> np.ndarray:
    """``x`` as ``shape`` (``(n_envs, *field shape)``) and ``dtype``, by SB3's rules, or ``SchemaError``
    naming the field.

    Shapes: ``reshape`` (SB3's rule for actions) takes any ``x`` of that size; otherwise ``x`` is
    reshaped when it has ``n_envs`` rows of the right size (SB3 passes Discrete values as
    ``(n_envs,)`` or ``(n_envs, 1)``), else broadcast to ``shape`` as SB3's assignment into its
    arrays does (one env's unbatched observation, a scalar reward). Dtypes: cast as that assignment
    casts (numpy's unsafe casting).
    """
    if x.shape != shape:
        size = math.prod(shape)
        if x.size == size and (reshape or (x.ndim and x.shape[0] == shape[0])):
            x = x.reshape(shape)
        else:
            try:
                if reshape:
                    raise ValueError
                x = np.broadcast_to(x, shape)
            except ValueError:
                raise SchemaError(f"field {name!r}{f' (`{what}`)' if what else ''}: expected shape {shape} (n_envs="
                                  f"{shape[0]}){' or any shape of that size' if reshape else ''}, got {x.shape}"
                                  ) from None
    if x.dtype is not dtype and x.dtype != dtype:
        try:
            x = x.astype(dtype)
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"field {name!r}{f' (`{what}`)' if what else ''}: expected dtype {dtype}, got {x.dtype} "
                              f"({exc})") from None
    return x


def _replace(b: TransitionBatch, **changes: Any) -> TransitionBatch:
    return dataclasses.replace(b, **changes)


def _concat(parts: list[TransitionBatch], take: np.ndarray) -> TransitionBatch:
    """The batches' transitions one after the other, then reordered by ``take``."""
    def cat(xs: list[Any]) -> Any:
        if isinstance(xs[0], dict):
            return {k: np.concatenate([x[k] for x in xs])[take] for k in xs[0]}
        return np.concatenate(xs)[take]

    return TransitionBatch(**{f.name: None if getattr(parts[0], f.name) is None else cat([getattr(p, f.name) for p in parts])
                              for f in dataclasses.fields(TransitionBatch)})
