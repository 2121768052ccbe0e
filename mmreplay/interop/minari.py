"""Minari interop: export a store's episodes as a Minari dataset, and import one into a store.

Episodes map exactly, in both directions: an mmreplay episode of T actions is T+1 rows (the
last one ``is_last``, holding the final observation); in Minari it is ``observations`` with T+1
entries and ``actions``, ``rewards``, ``terminations``, ``truncations`` with T (those of the
first T rows). Dtypes are kept as stored. A Dict observation (``obs/<key>`` fields, nested keys
joined by ``/``) becomes a dict of arrays; other schema fields travel as ``infos`` entries of
T+1 values (and come back as fields of the same names). Image observations are written as raw
arrays (``jpeg_encoding=False``): Minari's JPEG default is lossy.

What is exported: every complete episode (its first row starts a writer session's lane or
follows an ``is_last`` row, and it ends in an ``is_last`` row), in the order of their first rows'
ids. Running episodes, episodes whose first rows were evicted, and episodes holding a masked
(damaged) row are left out whole and counted in the report: no episode boundary is made up
around a damaged row. ``mmreplay collect`` and ``train`` store the last step of an episode the end of the
run cuts as a truncation (Minari's and D4RL's ``timeouts`` convention), so it is exported with
``truncations[-1] = True``. An episode cut without that mark (a store written before, a writer
the user closed mid-episode, a killed one; ``info()`` counts them as ``episodes_incomplete``)
ends with ``terminations[-1] == truncations[-1] == False``, as in the store (a round trip of a
Minari dataset stays exact).

Spaces and env spec: taken from the arguments, else from what a Minari import recorded in the
store's metadata (``minari_observation_space`` / ``minari_action_space``), else inferred from the
schema (Box with the dtype's full range; an integer scalar action becomes ``Discrete(max + 1)``
over the exported actions). The env spec (``metadata["env_spec"]``, as ``mmreplay collect``
records it) is kept in the dataset without the env having to be installed.

Import writes one writer session whose rows carry their own ``is_last`` (``_ingest``), so an
episode that is neither terminated nor truncated still ends in its final observation. Minari is
an optional extra (``pip install "mmreplay[minari]"``), imported inside the functions.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..archive.zarr_io import ArchiveError
from ..core.episodes import LaneCarry, masked_last, row_flags, segment_episodes
from ..core.errors import SchemaError
from ..core.schema import Field, Schema
from ..storage import MASKED

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ..storage import ReplayStore

__all__ = ["MinariReport", "export_minari", "import_minari"]

_CORE = ("action", "reward", "terminated", "truncated")
_BATCH_EPISODES = 64


@dataclass(frozen=True, slots=True)
class MinariReport:
    """What an export or import did."""

    dataset_id: str
    """The Minari dataset's id."""
    episodes: int
    """Episodes written (export: into the dataset; import: into the store)."""
    steps: int
    """Actions (transitions), T summed over episodes."""
    skipped: int
    """Episodes left out (export: running, begun before the oldest row, or holding a masked row)."""
    masked: int = 0
    """Of those, episodes holding a masked row (a damaged row: left out whole)."""


def _require_minari() -> Any:
    try:
        import minari
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError('Minari support needs the minari extra: pip install "mmreplay[minari]" '
                          f'(minari[hdf5] and pillow) ({exc})') from None
    return minari


# -- episodes of a store -------------------------------------------------------------------------
def store_episodes(store: ReplayStore) -> tuple[list[np.ndarray], int, int]:
    """Global row ids of every complete episode with at least one action and no masked row (each
    in time order); how many episodes were left out (running, begun before the oldest row, a
    lone final row of one begun before it, or holding a masked row); and how many of those held a masked row (a
    damaged row: its episode is left out whole, never cut into pieces that look complete)."""
    store.wait_checked()
    r = store.reader
    s = r.snapshot
    R = store.segment_records
    cache: dict[tuple[int, int, int], LaneCarry] = {}
    gids, eps, firsts, lasts, bads = [], [], [], [], []
    flags = [f for f in ("terminated", "truncated") if f in store.schema]
    for k, sid in enumerate(s.segment_ids.tolist()):
        h = r.segments[sid].header
        n, w = int(s.committed[k]), int(s.windows[k])
        raw = np.array(r.is_last[w, :n])
        masked = raw == MASKED
        # the steps' flags matter only around masked rows and in each lane's last row (the carry):
        # read for those rows alone (all of them in a segment holding a masked row)
        tail = 0 if not n or masked.any() else (-(-n // h.lanes) - 1) * h.lanes
        done = np.zeros(n, np.bool_)
        for f in flags:
            done[tail:] |= row_flags(r.columns[f][w, tail:n])
        carry = cache.get((h.writer_id, h.session_epoch, h.chain_index - 1)) if h.chain_index else None
        last = masked_last(raw == 1, masked, done, lanes=h.lanes, carry=carry)
        ep, first, out = segment_episodes(last, segment_id=sid, segment_records=R, lanes=h.lanes,
                                          chain_index=h.chain_index, carry=carry, done=done & ~masked)
        cache[(h.writer_id, h.session_epoch, h.chain_index)] = out
        gids.append(sid * R + np.arange(n, dtype=np.int64))
        eps.append(ep)
        firsts.append(first)
        lasts.append(last)
        bads.append(ep[masked])
    if not gids:
        return [], 0, 0
    gid, ep, first, last = (np.concatenate(x) for x in (gids, eps, firsts, lasts))
    if not len(gid):  # (every segment empty)
        return [], 0, 0
    damaged = np.unique(np.concatenate(bads))
    complete = np.setdiff1d(np.intersect1d(gid[first], ep[last]), damaged)
    if (ep[1:] < ep[:-1]).any():  # (one lane: in order already)
        order = np.argsort(ep, kind="stable")  # rows were concatenated in id order: stable keeps time order
        gid, ep = gid[order], ep[order]
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(ep)) + 1, [len(ep)]])  # one span per episode
    keep = np.isin(ep[bounds[:-1]], complete)  # per episode, not per row
    parts = [gid[a:b] for a, b in zip(bounds[:-1][keep].tolist(), bounds[1:][keep].tolist())]
    out = [e for e in parts if len(e) > 1]
    # T = 0 (a lane's first row, closed before a step: a worker stopped at once) is no episode: neither
    # kept nor counted as left out (info() counts episodes by their steps' flags)
    return out, len(keep) - len(parts), len(damaged)


# -- spaces --------------------------------------------------------------------------------------
def _box(dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
    from gymnasium import spaces

    if dtype.kind == "f":
        return spaces.Box(-np.inf, np.inf, shape, dtype)
    if dtype == np.bool_:
        return spaces.MultiBinary(list(shape) or 1) if shape else spaces.Discrete(2)
    info = np.iinfo(dtype)
    return spaces.Box(info.min, info.max, shape, dtype)


def _infer_spaces(store: ReplayStore, episodes: list[np.ndarray]) -> tuple[Any, Any]:
    from gymnasium import spaces

    schema = store.schema
    obs = schema.obs_names
    if obs == ("obs",):
        obs_space = _box(schema["obs"].dtype, schema["obs"].shape)
    else:
        obs_space = _dict_space({n.removeprefix("obs/"): _box(schema[n].dtype, schema[n].shape) for n in obs})
    a = schema["action"]
    if a.dtype.kind in "iu" and a.shape == ():
        hi = max((int(store.rows("action", e[:-1]).max(initial=0)) for e in episodes), default=0)
        act_space = spaces.Discrete(hi + 1)
    else:
        act_space = _box(a.dtype, a.shape)
    return obs_space, act_space


def _dict_space(flat: dict[str, Any]) -> Any:
    from gymnasium import spaces

    tree: dict[str, Any] = {}
    for key, sp in flat.items():
        node = tree
        *parents, leaf = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = sp

    def build(d: dict[str, Any]) -> Any:
        return spaces.Dict({k: build(v) if isinstance(v, dict) else v for k, v in d.items()})

    return build(tree)


def _spaces(store: ReplayStore, episodes: list[np.ndarray], observation_space: Any, action_space: Any) -> tuple[Any, Any]:
    from minari.serialization import deserialize_space

    md = store.metadata
    if observation_space is None and "minari_observation_space" in md:
        observation_space = deserialize_space(md["minari_observation_space"])
    if action_space is None and "minari_action_space" in md:
        action_space = deserialize_space(md["minari_action_space"])
    if observation_space is None or action_space is None:
        obs, act = _infer_spaces(store, episodes)
        observation_space = observation_space if observation_space is not None else obs
        action_space = action_space if action_space is not None else act
    return observation_space, action_space


# -- export --------------------------------------------------------------------------------------
def _nest(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in flat.items():
        node = out
        *parents, leaf = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


def _runs(store: ReplayStore, gids: np.ndarray) -> list[tuple[int, int, int, int]]:
    """The rows ``gids`` as runs ``(window, first slot, stop, step)``: rows of one lane in one
    segment, one after another (an episode is one run, or two where it crosses into the next
    segment), each read with a slice; ``KeyError`` if a row is not visible or is masked, as
    ``store.rows`` raises."""
    r = store.reader
    k, slot = r.locate(gids)
    lanes = r.snapshot.lanes[k]
    cut = np.flatnonzero((np.diff(k) != 0) | (np.diff(slot) != lanes[:-1])) + 1
    first, last = np.concatenate([[0], cut]), np.concatenate([cut - 1, [len(gids) - 1]])
    runs = list(zip(r.snapshot.windows[k[first]].tolist(), slot[first].tolist(), (slot[last] + 1).tolist(),
                    lanes[first].tolist()))
    sids = r.snapshot.segment_ids[k[first]].tolist()
    damaged = {sid for sid in set(sids) if len(r.damaged_slots(sid)[0])}  # the others hold no masked row
    if damaged and any((r.is_last[w, a:b:step] == MASKED).any()
                       for (w, a, b, step), sid in zip(runs, sids) if sid in damaged):
        raise KeyError("some rows to export are masked (damaged rows are never served; `mmreplay info` counts them)")
    return runs


def _buffers(store: ReplayStore, episodes: list[np.ndarray]) -> list[Any]:
    """One ``EpisodeBuffer`` per episode (global row ids, in time order). Each field is copied
    once for all the episodes given, by slices of the mapped segments (no per-row gather), and
    each episode's arrays are views of that copy."""
    from minari.data_collector import EpisodeBuffer

    schema = store.schema
    obs_names = schema.obs_names
    runs = _runs(store, np.concatenate(episodes))
    ends = np.cumsum([len(e) for e in episodes]).tolist()
    spans = list(zip([0, *ends[:-1]], ends))

    def rows(name: str) -> list[np.ndarray]:  # T+1 rows an episode: views of one copy (slices, not np.split)
        col = store.reader.columns[name]
        whole = np.concatenate([col[w, a:b:step] for w, a, b, step in runs])
        return [whole[a:b] for a, b in spans]

    def steps(name: str) -> list[np.ndarray]:  # the first T: the last row holds the final observation only
        return [v[:-1] for v in rows(name)]

    if obs_names == ("obs",):
        obs: list[Any] = rows("obs")
    else:
        per = {n.removeprefix("obs/"): rows(n) for n in obs_names}
        obs = [_nest({n: v[i] for n, v in per.items()}) for i in range(len(episodes))]
    extras = [f.name for f in schema.fields if f.name not in obs_names and f.name not in _CORE]
    info = {n: rows(n) for n in extras}
    act, rew, term, trunc = (steps(n) for n in _CORE)
    return [EpisodeBuffer(observations=obs[i], actions=act[i], rewards=rew[i], terminations=term[i],
                          truncations=trunc[i], infos=_nest({n: v[i] for n, v in info.items()}) if extras else None)
            for i in range(len(episodes))]


def export_minari(
    store: ReplayStore | str | os.PathLike[str],
    dataset_id: str,
    *,
    observation_space: Any = None,
    action_space: Any = None,
    env_spec: Any = None,
    data_format: str = "hdf5",
    description: str | None = None,
    author: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MinariReport:
    """Write the store's complete episodes as the local Minari dataset ``dataset_id``.

    The dataset goes where Minari keeps local datasets (``MINARI_DATASETS_PATH``, default
    ``~/.minari/datasets``) and must not exist yet. Images are stored losslessly. ``env_spec``
    (a gymnasium ``EnvSpec`` or its JSON) defaults to the store's ``metadata["env_spec"]``.
    ``progress(episodes_done, episodes_total)`` is called after each batch of episodes.
    """
    from ..storage import ReplayStore, open_store

    minari = _require_minari()
    own = not isinstance(store, ReplayStore)
    st = open_store(store, mode="r") if own else store
    try:
        st.schema.require_transition_fields()
        episodes, skipped, masked = store_episodes(st)
        if not episodes:
            raise ArchiveError(f"{st.path} holds no complete episode to export", hint="close the writers with last_obs=")
        obs_space, act_space = _spaces(st, episodes, observation_space, action_space)
        spec = env_spec if env_spec is not None else st.metadata.get("env_spec")
        if spec is not None and not isinstance(spec, str):
            spec = spec.to_json()
        steps = 0
        ds = None
        for i in range(0, len(episodes), _BATCH_EPISODES):
            batch = _buffers(st, episodes[i : i + _BATCH_EPISODES])
            steps += sum(len(e) - 1 for e in episodes[i : i + _BATCH_EPISODES])
            if ds is None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # author/permalink/eval env not given
                    ds = minari.create_dataset_from_buffers(
                        dataset_id, batch, env=None, observation_space=obs_space, action_space=act_space,
                        description=description, author=author, algorithm_name="mmreplay export",
                        data_format=data_format, jpeg_encoding=False)
                extra = {"mmreplay_schema": json.dumps(st.schema.to_json())}  # field order, for a re-import
                ds.storage.update_metadata({**extra, **({"env_spec": spec} if spec is not None else {})})
            else:
                ds.update_dataset_from_buffer(batch)
            if progress is not None:
                progress(min(i + _BATCH_EPISODES, len(episodes)), len(episodes))
        return MinariReport(dataset_id, len(episodes), steps, skipped, masked)
    finally:
        if own:
            st.close()


# -- import --------------------------------------------------------------------------------------
def _flatten(prefix: str, value: Any) -> dict[str, np.ndarray]:
    if isinstance(value, dict):
        out: dict[str, np.ndarray] = {}
        for k, v in value.items():
            out.update(_flatten(f"{prefix}/{k}" if prefix else str(k), v))
        return out
    if isinstance(value, tuple):
        raise SchemaError(f"field {prefix!r}: Tuple spaces are not supported by mmreplay schemas")
    return {prefix: np.asarray(value)}


def _rows(ep: Any, extras: tuple[str, ...]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One Minari episode as T+1 rows (the last holds the final observation) and their is_last."""
    T = len(ep.rewards)
    rows = _flatten("obs", ep.observations)
    step = {"action": np.asarray(ep.actions), "reward": np.asarray(ep.rewards),
            "terminated": np.asarray(ep.terminations, np.bool_), "truncated": np.asarray(ep.truncations, np.bool_)}
    for name, a in step.items():
        if len(a) != T:
            raise SchemaError(f"episode {ep.id}: {name} has {len(a)} entries, rewards {T}")
        rows[name] = np.concatenate([a, np.zeros((1, *a.shape[1:]), a.dtype)])
    infos = _flatten("", ep.infos or {})
    for name in extras:
        if name not in infos:
            raise SchemaError(f"episode {ep.id}: infos lack {name!r}, which the first episode had")
        rows[name] = infos[name]
    for name, a in rows.items():
        if len(a) != T + 1:
            raise SchemaError(f"episode {ep.id}: {name!r} has {len(a)} entries, expected T+1 = {T + 1}")
    last = np.zeros(T + 1, np.bool_)
    last[-1] = True
    return rows, last


def _schema_of(ep: Any, infos: bool) -> tuple[Schema, tuple[str, ...]]:
    rows = _flatten("obs", ep.observations)
    fields = [Field(n, a.dtype, a.shape[1:]) for n, a in rows.items()]
    fields.append(Field("action", np.asarray(ep.actions).dtype, np.asarray(ep.actions).shape[1:]))
    fields.append(Field("reward", np.asarray(ep.rewards).dtype))
    fields += [Field("terminated", np.dtype(np.bool_)), Field("truncated", np.dtype(np.bool_))]
    T = len(ep.rewards)
    taken = {f.name for f in fields} | {"is_last"}
    extras = []
    if infos:
        for name, a in _flatten("", ep.infos or {}).items():
            if a.dtype.kind in "biuf" and a.ndim >= 1 and len(a) == T + 1 and name not in taken:
                fields.append(Field(name, a.dtype, a.shape[1:]))
                extras.append(name)
    return Schema(fields), tuple(extras)


def _original_order(schema: Schema, recorded: str | None) -> Schema:
    """The schema an mmreplay export recorded, if it has the same fields (Minari sorts dict keys)."""
    if not recorded:
        return schema
    try:
        old = Schema.from_json(json.loads(recorded))
    except (ValueError, SchemaError):
        return schema
    return old if set(old.fields) == set(schema.fields) else schema


def _episodes(ds: Any) -> Iterator[Any]:
    yield from ds.iterate_episodes()


def import_minari(
    dataset_id: str,
    path: str | os.PathLike[str],
    *,
    infos: bool = True,
    capacity: int | None = None,
    segment_records: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MinariReport:
    """Create a store at ``path`` holding every episode of the local Minari dataset ``dataset_id``.

    The schema comes from the first episode's arrays (dtypes kept); ``infos`` entries with T+1
    numeric values become extra fields. The spaces, the env spec and the dataset id are kept in
    the store's metadata, so :func:`export_minari` writes the same dataset back.
    ``capacity`` defaults to the dataset's rows (no eviction).
    """
    from minari.serialization import serialize_space

    from ..storage import SessionIngest
    from ..storage import create_store

    minari = _require_minari()
    try:
        ds = minari.load_dataset(dataset_id)
    except (FileNotFoundError, ValueError) as exc:
        raise ArchiveError(f"cannot load Minari dataset {dataset_id!r}: {exc}",
                           hint="check MINARI_DATASETS_PATH and the dataset id (minari list local)") from None
    total = int(ds.total_episodes)
    if total == 0:
        raise ArchiveError(f"Minari dataset {dataset_id!r} has no episodes")
    it = _episodes(ds)
    first = next(it)
    schema, extras = _schema_of(first, infos)
    md = ds.storage.metadata
    schema = _original_order(schema, md.get("mmreplay_schema"))
    metadata = {"source": "minari", "minari_dataset_id": dataset_id,
                "minari_observation_space": serialize_space(ds.observation_space),
                "minari_action_space": serialize_space(ds.action_space)}
    if md.get("env_spec"):
        metadata["env_spec"] = md["env_spec"]
    rows = int(ds.total_steps) + total
    store = create_store(path, schema, capacity or max(rows, 1), segment_records=segment_records, metadata=metadata)
    steps = done = 0
    try:
        with SessionIngest(store, lanes=1) as ing:
            for ep in _chain(first, it):
                fields, last = _rows(ep, extras)
                fields = {f.name: _cast(f, fields[f.name], ep.id) for f in schema.fields}
                ing.append(fields, last)
                steps += len(last) - 1
                done += 1
                if progress is not None:
                    progress(done, total)
    finally:
        store.close()
    return MinariReport(dataset_id, done, steps, 0)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _cast(f: Field, a: np.ndarray, ep_id: int) -> np.ndarray:
    if a.dtype == f.dtype:
        return a
    if np.can_cast(a.dtype, f.dtype, "safe"):
        return a.astype(f.dtype)
    raise SchemaError(f"episode {ep_id}: field {f.name!r} is {a.dtype}, the first episode's was {f.dtype}")

