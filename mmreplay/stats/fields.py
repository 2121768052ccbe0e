"""Streaming statistics of a field over a store's or an archive's transitions: :func:`field_stats`.

The rows counted are the transitions' first rows, the rows a D4RL dataset's ``observations`` array
holds: never an episode's final observation (``is_last``), never a damaged row. Over a store they
are the store's transition starts (``ReplayStore.valid_transition_mask`` per segment, the rows
``transition_ids()`` lists); over a zarr archive (``mmreplay.archive``), the rows of an episode
(``episode != -1``) that are not ``is_last``, not ``masked`` (the bool array a repaired archive
carries at the group root, when it has one) and not the last row an unfinished episode has in it
(no next observation). Each archive chunk is checked against the archive's chunk manifest
(``mmreplay.archive.layout.Verifier``): a segment with a missing or damaged chunk is left out
whole and named on one line, and the rows that may have their next observation in it (the open
episodes' last rows so far) are not counted.

Invariants:

* the data is read one segment (one archive chunk) at a time and at most ``chunk_rows`` rows of
  it at once, in float64, and folded into running ``(count, mean, M2)`` sums with Chan et al.'s
  pairwise update: memory is bounded whatever the size of the store (larger than RAM works), and
  nothing loops in Python per row;
* the result equals numpy's ``mean(0)`` / ``std(0)`` (ddof 0) over the same rows up to float64
  rounding;
* results are cached, keyed by what they depend on: a store's uuid, its row count and a
  fingerprint of its segments (ids, committed counts) and damaged rows; an archive's source store
  uuid, committed extent, masked-row count and the segments left out. Any change of rows recomputes. The cache file is
  ``<store>/field-stats.json`` when the store directory is writable, else
  ``<user cache>/mmreplay/stats/<store uuid>-<rows>-<fingerprint>.json`` (``$XDG_CACHE_HOME``, or
  ``~/.cache``); archives are cached in the user cache directory.

zarr is imported only for archives; ``import mmreplay`` does not load this module.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..storage import ReplayStore

__all__ = ["FieldStats", "field_stats"]

CACHE_NAME = "field-stats.json"


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FieldStats:
    """Per-element statistics of one field over the transitions' first rows (float64 arrays of the
    field's shape)."""

    field: str
    """The field, as given to ``field_stats`` (``"obs"``, ``"obs/key"``, ``"action"``...)."""
    count: int
    """Rows counted."""
    mean: np.ndarray
    """Mean of each element."""
    std: np.ndarray
    """Population standard deviation (numpy's ``std(ddof=0)``)."""
    min: np.ndarray
    """Smallest value of each element."""
    max: np.ndarray
    """Largest value of each element."""
    key: str
    """What the statistics depend on (see the module docstring): a changed key recomputes them."""

    def to_json(self) -> dict[str, Any]:
        """The statistics as JSON (arrays as flat lists plus their shape): what the cache file holds."""
        return {"field": self.field, "count": self.count, "key": self.key, "shape": list(self.mean.shape),
                **{k: getattr(self, k).ravel().tolist() for k in ("mean", "std", "min", "max")}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FieldStats:
        """The statistics ``to_json`` wrote (float64 arrays of the field's shape)."""
        shape = tuple(d["shape"])
        arrays = {k: np.asarray(d[k], np.float64).reshape(shape) for k in ("mean", "std", "min", "max")}
        return cls(field=d["field"], count=int(d["count"]), key=d["key"], **arrays)


class _Running:
    """Running count, mean, M2 (sum of squared deviations), min and max, merged a chunk at a time."""

    def __init__(self) -> None:
        self.n = 0
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None
        self.lo: np.ndarray | None = None
        self.hi: np.ndarray | None = None

    def add(self, x: np.ndarray, sign: int = 1) -> None:
        """Fold the rows ``x`` (``(n, *shape)``) in; ``sign=-1`` takes rows counted before back out."""
        n = len(x)
        if n == 0:
            return
        x = np.asarray(x, np.float64)
        m = x.mean(0)
        m2 = ((x - m) ** 2).sum(0)
        if sign > 0:
            self.merge(n, m, m2, x.min(0), x.max(0))
            return
        if self.mean is None:
            raise ValueError("nothing to remove rows from")
        # the inverse of the merge (min / max stay: rows taken out were inside them already)
        rest = self.n - n
        if rest <= 0:
            self.n, self.mean, self.m2 = 0, None, None
            return
        mean_rest = (self.mean * self.n - m * n) / rest
        delta = m - mean_rest
        self.m2 = self.m2 - m2 - delta**2 * (rest * n / self.n)
        self.mean, self.n = mean_rest, rest

    def merge(self, n: int, mean: np.ndarray, m2: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Fold in the moments of ``n`` rows (``moments_kernel.moments``' output, or ``add``'s)."""
        if n == 0:
            return
        if self.mean is None:
            self.n, self.mean, self.m2, self.lo, self.hi = n, mean, m2, lo, hi
            return
        total = self.n + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.n * n / total)
        self.n = total
        self.lo, self.hi = np.minimum(self.lo, lo), np.maximum(self.hi, hi)

    def result(self, field: str, shape: tuple[int, ...], key: str) -> FieldStats:
        if self.n == 0 or self.mean is None:
            from ..core.errors import EmptyStoreError

            raise EmptyStoreError(f"no transition to compute statistics of `{field}` over")
        std = np.sqrt(np.maximum(self.m2, 0.0) / self.n)
        return FieldStats(field, self.n, self.mean.reshape(shape), std.reshape(shape), self.lo.reshape(shape),
                          self.hi.reshape(shape), key)


def field_stats(
    source: ReplayStore | str | os.PathLike[str],
    field: str = "obs",
    *,
    cache: bool | str | os.PathLike[str] = True,
    chunk_rows: int = 1 << 16,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FieldStats:
    """Mean, standard deviation, min and max of ``field`` over the transitions' first rows.

    Parameters
    ----------
    source
        An open :class:`mmreplay.ReplayStore`, a store directory, or a zarr archive (a path or
        fsspec URL of :func:`mmreplay.export_archive`'s output).
    field
        A numeric schema field (``"obs"``, ``"obs/key"``, ``"action"``, ``"reward"``...).
    cache
        ``True``: read and write the cache (see the module docstring); ``False``: compute afresh,
        write nothing; a directory: the cache directory to use instead of the user's.
    chunk_rows
        Most rows read (and converted to float64) at once.
    progress
        Called as ``progress(done, total)`` after each segment (archive chunk).

    Raises ``ValueError`` naming the field when the source has no such numeric field, and
    ``EmptyStoreError`` when there is no transition.
    """
    from ..storage import ReplayStore

    if chunk_rows < 1:
        raise ValueError(f"`chunk_rows` must be >= 1, got {chunk_rows}")
    if isinstance(source, ReplayStore):
        return _store_stats(source, field, cache, chunk_rows, progress)
    path = Path(os.fspath(source)) if "://" not in str(source) else None
    if path is not None and (path / "STORE.json").exists():
        from ..storage import open_store

        with open_store(path, mode="r") as store:
            return _store_stats(store, field, cache, chunk_rows, progress)
    from ..archive.remote import naming

    with naming(source):
        return _archive_stats(str(source), field, cache, chunk_rows, storage_options, progress)


def _check_field(schema: Any, field: str) -> tuple[int, ...]:
    if field not in schema:
        raise ValueError(f"`field`={field!r} is not in the schema (fields: {[f.name for f in schema.fields]})")
    f = schema[field]
    if f.dtype.kind not in "biuf":
        raise ValueError(f"`field`={field!r} has dtype {f.dtype}: statistics need a numeric field")
    return tuple(f.shape)


def _user_cache(cache: bool | str | os.PathLike[str]) -> Path:
    if cache is not True and cache is not False:
        return Path(os.fspath(cache))
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mmreplay" / "stats"


def _read_cached(path: Path, field: str, key: str) -> FieldStats | None:
    try:
        entry = json.loads(path.read_text()).get(field)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    try:
        return FieldStats.from_json(entry)
    except (KeyError, ValueError, TypeError):
        return None


def _write_cached(path: Path, stats: FieldStats) -> bool:
    """Add ``stats`` to the cache file at ``path`` (atomically); False when it cannot be written."""
    from ..core.fs import atomic_write

    try:
        entries = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError):
        entries = {}
    entries[stats.field] = stats.to_json()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, (json.dumps(entries) + "\n").encode())
    except OSError:
        return False
    return True


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK)


def _cached(cache: bool | str | os.PathLike[str], beside: Path | None, name: str, field: str, key: str,
            compute: Callable[[], FieldStats]) -> FieldStats:
    """The cached statistics when their key matches, else ``compute()`` (cached beside the data when
    ``beside`` is a writable directory, else in the cache directory)."""
    if cache is False:
        return compute()
    places = []
    if beside is not None and cache is True and _writable(beside):
        places.append(beside / CACHE_NAME)
    places.append(_user_cache(cache) / f"{name}.json")
    for p in places:
        hit = _read_cached(p, field, key)
        if hit is not None:
            return hit
    stats = compute()
    for p in places:
        if _write_cached(p, stats):
            break
    return stats


# -- stores ---------------------------------------------------------------------------------------
def _store_key(store: ReplayStore) -> tuple[str, str]:
    s = store.reader.snapshot
    h = hashlib.sha1()
    h.update(np.asarray(s.segment_ids, np.int64).tobytes())
    h.update(np.asarray(s.committed, np.int64).tobytes())
    h.update(str((store.masked_rows(), store.check_counts().get("damaged_rows", 0))).encode())
    rows = int(s.total_rows)
    uuid = store.store_uuid.hex()
    return f"store:{uuid}:{rows}:{h.hexdigest()[:16]}", f"{uuid}-{rows}-{h.hexdigest()[:12]}"


def _store_stats(store: ReplayStore, field: str, cache: bool | str | os.PathLike[str], chunk_rows: int,
                 progress: Callable[[int, int], None] | None) -> FieldStats:
    shape = _check_field(store.schema, field)
    store.refresh()
    store.wait_checked()  # every sealed segment counts (unchecked ones are not served yet)
    key, name = _store_key(store)

    def one(k: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        from .moments_kernel import moments

        with store.scan_segment(k, [field]) as views:  # read ahead, the next segment asked for meanwhile
            keep = store.valid_transition_mask(k)  # (inside: its flag bytes are on every page of the segment)
            return moments(views[field].reshape(len(keep), -1), keep)

    def compute() -> FieldStats:
        from ..storage import usable_cores

        run = _Running()
        n = len(store.reader.snapshot.segment_ids)
        # one segment per core at a time (the kernel runs without the GIL); merged in segment order,
        # so the result does not depend on which thread finished first
        with ThreadPoolExecutor(max(1, min(n, usable_cores()))) as pool:
            for k, part in enumerate(pool.map(one, range(n))):
                run.merge(*part)
                if progress is not None:
                    progress(k + 1, n)
        return run.result(field, shape, key)

    return _cached(cache, store.path, name, field, key, compute)


# -- archives -------------------------------------------------------------------------------------
def _archive_stats(url: str, field: str, cache: bool | str | os.PathLike[str], chunk_rows: int,
                   storage_options: dict[str, Any] | None, progress: Callable[[int, int], None] | None) -> FieldStats:
    from ..core.schema import Schema
    from ..archive.layout import Verifier, committed_extent, open_group, read_meta

    g = open_group(url, "r", storage_options)
    meta = read_meta(g, url)
    schema = Schema.from_json(meta["schema"])
    shape = _check_field(schema, field)
    segments, _ = committed_extent(g)
    R = int(meta["segment_records"])
    names = set(g.array_keys())
    has_mask = "masked" in names
    v = Verifier(g, url, schema, R, segments)
    _, unreadable = v.table()
    # each segment's chunks, checked against the chunk manifest: a segment with a missing or damaged one is left
    # out whole (its rows are not data), said on one line each
    need = ["episode", "is_last", f"fields/{field}", *(["masked"] if has_mask else [])]
    bad: dict[int, str] = dict(unreadable)
    masked = 0
    for i in range(segments):
        if i in bad:
            continue
        for name in need[:2] + need[3:]:
            a, why = v.chunk(name, i)
            if a is None:
                bad[i] = why
                break
            if name == "masked":  # the masked rows are part of the key: a repair changes the statistics
                masked += int(np.count_nonzero(a))
    for i, why in sorted(bad.items()):
        log.warning("%s: archived segment #%d left out of the statistics: %s", url, i, why)
    src = meta.get("source_store_uuid", "unknown")
    total = segments * R
    key = f"archive:{src}:{segments}:{total}:{masked}:{sorted(bad)}"
    name = f"archive-{src}-{segments}-{masked}-{len(bad)}"

    def compute() -> FieldStats:
        run = _Running()
        pending: dict[int, np.ndarray] = {}  # episode -> its last row so far, when that row is not is_last
        for i in range(segments):
            if i in bad:  # its rows are not data: the episodes that reach into it are cut there
                for e in list(pending):
                    run.add(pending.pop(e), sign=-1)
                continue
            episode = np.asarray(v.chunk("episode", i)[0])
            last = np.asarray(v.chunk("is_last", i)[0], bool)
            keep = (episode != -1) & ~last
            if has_mask:
                keep &= ~np.asarray(v.chunk("masked", i)[0], bool)
            rows = np.flatnonzero(episode != -1)
            # each episode's last row in this chunk: a row counted now that may turn out to have no successor
            ep_rev = episode[rows][::-1]
            eps, first_rev = np.unique(ep_rev, return_index=True)
            tail = rows[::-1][first_rev]
            for e in eps[np.isin(eps, list(pending))] if pending else ():
                pending.pop(int(e))  # it continues in this chunk: its earlier last row has a successor
            x = None
            need = keep.any() or len(tail)
            if need:
                a, why = v.chunk(f"fields/{field}", i)
                if a is None:  # (found only now: the field's chunk is read last)
                    log.warning("%s: archived segment #%d left out of the statistics: %s", url, i, why)
                    for e in list(pending):
                        run.add(pending.pop(e), sign=-1)
                    continue
                x = np.asarray(a)
            for lo in range(0, len(keep), chunk_rows):
                m = keep[lo:lo + chunk_rows]
                if m.any():
                    run.add(x[lo:lo + chunk_rows][m].reshape(int(m.sum()), -1))
            open_tail = tail[keep[tail]]  # the chunk's last row of an episode, counted, not is_last
            for e, r in zip(episode[open_tail].tolist(), open_tail.tolist()):
                pending[int(e)] = np.asarray(x[r], np.float64).reshape(1, -1)
            if progress is not None:
                progress(i + 1, segments)
        for row in pending.values():  # rows with no next observation in the archive: not transitions
            run.add(row, sign=-1)
        return run.result(field, shape, key)

    return _cached(cache, None, name, field, key, compute)
