"""Shipping: ingest sealed segments from archives into a learner's local store, exactly once.

Remote actors (``cluster.py``) each write a local store and export its sealed segments into an
archive of their own under a shared root URL (``<root>/actor-NNN-<store uuid>``). The learner
calls :func:`ingest_archives` on the root (or on one archive): every sealed archived segment the
learner's store has not taken yet becomes one new sealed segment of that store, built whole by
``_ingest.build_segment`` (staged, fdatasynced, renamed: readers never see half of it).

Invariants kept here:

* **Exactly once.** A segment's identity is ``(source store uuid, source segment id)``: a store
  never reuses a segment id, so the same segment found again (exported a second time into
  another archive, an export rerun, an actor restarted on the same node that exports its
  recovered store again) is skipped. Identities live in a **ledger** in the learner's store
  (``INGEST_LEDGER.json``, replaced atomically: temp, fsync, rename). Each batch is first
  recorded as *pending* together with the learner segment id it will get, then built, then
  recorded as *done*. After a crash a pending entry whose segment file exists is done (its
  rename happened), one without a file is forgotten and ingested again later: rows are never in
  the store twice, whatever point the learner died at. The ledger also keeps each segment's
  fingerprint (session epoch, chain index, rows) and the crc32c of its rows; the same identity
  with another fingerprint (a copied store directory writing on its own) is a *conflict*: it is
  logged, counted and not ingested. Entries stay after the learner evicts the segment, so an
  evicted segment never comes back.
* **Chains stay valid.** A writer session's segments chain by ``(writer id, session epoch,
  chain index)`` and a lane's next row may lie in the session's next segment. Each source
  session gets one learner ``(writer id, epoch)`` the first time it is seen (a fresh random
  epoch, recorded in the ledger), and its segments keep their chain index, first sequence
  number, lanes and usable rows, so next-obs, n-step windows, frame stacks and sequences span
  segment boundaries in the learner's store exactly as in the actor's. Only sealed archived
  segments are taken (an open one is left until it is exported sealed), and a session's
  segments are taken in segment-id order, so a successor never arrives before its predecessor.
* **A writer session like any other.** Ingest holds the admin lock shared, a writer id of its
  own and, for the whole call, ``locks/ingest.lock`` (one ingester per store); ids are allocated
  and the oldest segments evicted under ``alloc.lock`` as a writer does.
* The learner's store must have the archive's schema and ``segment_records`` (segments are copied
  whole): ``ArchiveError`` says which differs.

zarr and fsspec are imported inside the functions.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import crc32c as _crc32c
import numpy as np

from ..core import failpoint as _failpoint
from ..core.errors import ArchiveError, CorruptArchiveError
from ..core.fs import atomic_write
from .layout import COL, SEALED, Verifier, committed_extent, open_group, read_meta
from .remote import naming

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..storage import Ingest, ReplayStore

log = logging.getLogger(__name__)

LEDGER = "INGEST_LEDGER.json"
LEDGER_FORMAT = "mmreplay-ingest-ledger"
_BATCH = 16  # segments per pending/done ledger write


@dataclass(frozen=True, slots=True)
class IngestReport:
    """What one :func:`ingest_archives` call did."""

    rows: int
    """Rows added to the store now."""
    segments: int
    """Segments added to the store now."""
    skipped: int
    """Sealed archived segments looked at that the store had taken before (a second export, a rerun)."""
    waiting: int
    """Archived segments still open: taken once they are exported sealed."""
    conflicts: int
    """Archived segments whose identity was taken before with other contents (not ingested)."""
    archives: int
    """Archives looked at."""
    masked: int = 0
    """Segments ingested with every row masked: a chunk of theirs is missing or damaged in the archive."""
    unreadable: int = 0
    """Archived segments whose segment table row cannot be trusted: not ingested (looked at again next time)."""


# ledger segment entry: [learner segment id, learner writer id, rows, crc32c, done, source epoch, source chain]
_SID, _WID, _ROWS, _CRC, _DONE, _EPOCH, _CHAIN = range(7)


@dataclass
class _Ledger:
    """What the learner's store has taken, keyed by source identity (see the module docstring)."""

    segments: dict[str, list[int]] = field(default_factory=dict)
    sessions: dict[str, list[int]] = field(default_factory=dict)
    """``"<store uuid>:<writer id>:<epoch>"`` -> ``[learner writer id, learner epoch]``."""
    archives: dict[str, dict[str, Any]] = field(default_factory=dict)
    """archive uuid -> ``{"url", "source_store_uuid", "done_below"}``: ordinals below are settled."""

    @classmethod
    def load(cls, store: ReplayStore) -> _Ledger:
        path = store.path / LEDGER
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return cls()
        except ValueError as exc:  # written atomically: only another program can have damaged it
            raise ArchiveError(f"{path}: unreadable ingest ledger ({exc})",
                               hint="restore it from a backup; without it segments would be ingested again") from None
        if data.get("format") != LEDGER_FORMAT or data.get("version") != 1:
            raise ArchiveError(f"{path}: not an ingest ledger of this mmreplay version")
        return cls(data["segments"], data["sessions"], data["archives"])

    def save(self, store: ReplayStore) -> None:
        body = {"format": LEDGER_FORMAT, "version": 1, "store_uuid": store.store_uuid.hex(),
                "segments": self.segments, "sessions": self.sessions, "archives": self.archives}
        atomic_write(store.path / LEDGER, json.dumps(body, separators=(",", ":")).encode())

    def settle(self, ing: Ingest) -> bool:
        """Resolve pending entries a crash left: done if their segment file exists, else forgotten."""
        from ..core.errors import CorruptSegmentError

        changed = False
        for key, e in list(self.segments.items()):
            if e[_DONE]:
                continue
            changed = True
            try:
                there = ing.segment(e[_SID], e[_WID]) is not None
            except CorruptSegmentError:  # there, damaged (verify reports it)
                there = True
            if there:
                e[_DONE] = 1
            else:
                del self.segments[key]
        return changed


def read_ledger(store: ReplayStore) -> dict[str, Any]:
    """The store's ingest ledger as plain data (empty if nothing was ingested)."""
    led = _Ledger.load(store)
    return {"segments": led.segments, "sessions": led.sessions, "archives": led.archives}


def archive_urls(url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """``url`` itself if it is an archive, else the archives directly under it (sorted; none if missing)."""
    with naming(url):
        return _archive_urls(url, storage_options)


def _archive_urls(url: str | os.PathLike[str], storage_options: dict[str, Any] | None) -> list[str]:
    text = str(url)
    if "://" not in text:  # a local or shared-filesystem path: no fsspec needed
        root = Path(text)
        if (root / "zarr.json").exists():
            return [text]
        if not root.is_dir():
            return []
        return [str(root / c.name) for c in sorted(root.iterdir(), key=lambda c: c.name)
                if not c.name.startswith(".") and (c / "zarr.json").exists()]
    import fsspec

    fs, base = fsspec.core.url_to_fs(text, **(storage_options or {}))
    base = base.rstrip("/")
    if fs.exists(f"{base}/zarr.json"):
        return [text]
    if not fs.isdir(base):
        return []
    out = []
    for child in sorted(fs.ls(base, detail=False)):
        name = posixpath.basename(str(child).rstrip("/"))
        if not name.startswith(".") and fs.exists(f"{base}/{name}/zarr.json"):
            out.append(f"{text.rstrip('/')}/{name}")
    return out


@dataclass(slots=True)
class _Job:
    key: str
    """Source identity: ``"<store uuid>:<segment id>"``."""
    ordinal: int
    row: np.ndarray
    session: str
    """Source session: ``"<store uuid>:<writer id>:<epoch>"``."""
    entry: list[int] | None = None


def ingest_archives(
    store: ReplayStore | str | os.PathLike[str],
    url: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    storage_options: dict[str, Any] | None = None,
    max_segments: int | None = None,
) -> IngestReport:
    """Add every sealed segment of the archive(s) at ``url`` that ``store`` has not taken yet.

    Parameters
    ----------
    store
        The learner's store (opened with ``mode="a"``) or its path. Writers and readers may be
        active; a concurrent ingest into the same store waits for this one.
    url
        An archive, a directory (or object-store prefix) holding archives, or several of them.
    max_segments
        Take at most this many segments now (the rest on a later call).

    Returns an :class:`IngestReport`. Rows are visible to the store's readers after their next
    ``refresh()``. A ``kill -9`` at any point loses nothing that a later call does not add, and
    never adds a row twice (see the module docstring). A segment with a missing or damaged chunk
    is ingested with every row masked (``masked`` counts them; one line each), one whose segment
    table row cannot be trusted is not ingested (``unreadable``; tried again next call): every chunk
    is checked against the archive's chunk manifest (``layout.Verifier``). Raises ``ArchiveError``
    for an archive of another schema or ``segment_records``.
    """
    from ..storage import Ingest, ReplayStore, open_store

    own = not isinstance(store, ReplayStore)
    st = open_store(store, mode="a") if own else store
    urls = [url] if isinstance(url, (str, os.PathLike)) else list(url)
    try:
        if st.mode != "a":
            from ..core.errors import ReadOnlyStoreError

            raise ReadOnlyStoreError(f"{st.path} was opened with mode='r'; ingesting needs mode='a'")
        with Ingest(st, gate=True) as ing:  # one shipping ingest at a time, a writer id of its own
            ledger = _Ledger.load(st)
            if ledger.settle(ing):
                ledger.save(st)
            found = [(a, a == str(u)) for u in urls for a in archive_urls(u, storage_options)]
            with naming(urls[0] if len(urls) == 1 else ", ".join(map(str, urls))):
                return _ingest_all(st, ledger, found, ing, storage_options, max_segments)
    finally:
        if own:
            st.close()


def _ingest_all(store: ReplayStore, ledger: _Ledger, urls: list[tuple[str, bool]], ing: Ingest,
                storage_options: dict[str, Any] | None, max_segments: int | None) -> IngestReport:
    tot = {"rows": 0, "segments": 0, "skipped": 0, "waiting": 0, "conflicts": 0, "archives": 0, "masked": 0,
           "unreadable": 0}
    left = max_segments if max_segments is not None else 1 << 62
    for u, named in urls:
        if left <= 0:
            break
        g = open_group(u, "r", storage_options)
        if not named and not isinstance(g.attrs.get("mmreplay"), dict):
            log.debug("%s: no archive metadata yet (being created?); looked at next time", u)
            continue  # found under a root: its first export may be writing the layout right now
        left -= _ingest_one(store, ledger, g, u, ing, left, tot)
        tot["archives"] += 1
    return IngestReport(tot["rows"], tot["segments"], tot["skipped"], tot["waiting"], tot["conflicts"],
                        tot["archives"], tot["masked"], tot["unreadable"])


def _check_compatible(store: ReplayStore, meta: dict[str, Any], url: str) -> None:
    if meta["schema_hash"] != f"{store.schema.hash:016x}":
        raise ArchiveError(f"{url} holds another schema than {store.path}",
                           hint="ingest archives of the same env (and --atari setting) only")
    if int(meta["segment_records"]) != store.segment_records:
        raise ArchiveError(f"{url} has segment_records={meta['segment_records']}, {store.path} has "
                           f"{store.segment_records}; segments are copied whole",
                           hint=f"create the learner's store with segment_records={meta['segment_records']}")


def _ingest_one(store: ReplayStore, ledger: _Ledger, g: Any, url: str, ing: Ingest, left: int,
                tot: dict[str, int]) -> int:
    """Ingest one archive (zarr group ``g`` at ``url``; at most ``left`` segments); returns segments added."""
    meta = read_meta(g, url)
    _check_compatible(store, meta, url)
    src = str(meta["source_store_uuid"])
    auid = str(meta["archive_uuid"])
    fresh = auid not in ledger.archives
    arec = ledger.archives.setdefault(auid, {"url": url, "source_store_uuid": src, "done_below": 0})
    arec["url"] = url
    count, _ = committed_extent(g)
    start = min(int(arec["done_below"]), count)
    # settled ordinals are not read again: a call costs the same late in a run
    v = Verifier(g, url, store.schema, store.segment_records, count, start)
    table, unreadable = v.table()
    settled = np.zeros(count + 1, np.bool_)  # a False sentinel: done_below = first unsettled ordinal
    settled[:start] = True
    jobs = []
    for o in range(start, count):
        row = table[o - start]
        if o in unreadable:  # its table row cannot be trusted: not taken, looked at again next time
            tot["unreadable"] += 1
            log.warning("%s: archived segment #%d not ingested: %s", url, o, unreadable[o])
            continue
        if int(row[COL["state"]]) != SEALED:
            tot["waiting"] += 1
            continue
        key = f"{src}:{int(row[COL['segment_id']])}"
        e = ledger.segments.get(key)
        if e is None:
            jobs.append(_Job(key, o, row, f"{src}:{int(row[COL['writer_id']])}:{int(row[COL['session_epoch']])}"))
            continue
        settled[o] = True
        if (e[_EPOCH], e[_CHAIN], e[_ROWS]) == (int(row[COL["session_epoch"]]), int(row[COL["chain_index"]]),
                                                int(row[COL["committed"]])):
            tot["skipped"] += 1
        else:
            tot["conflicts"] += 1
            log.warning("%s: segment %s was ingested before with other contents (a copied store directory?); "
                        "not ingested again", url, key)
    jobs.sort(key=lambda j: int(j.row[COL["segment_id"]]))  # chain order within each session
    jobs = jobs[:left]
    for i in range(0, len(jobs), _BATCH):
        batch = jobs[i:i + _BATCH]
        _plan_batch(ledger, batch, ing)
        ledger.save(store)  # pending: a crash from here on is settled by the next call
        if _failpoint.ACTIVE:
            _failpoint.hit("ingest_after_pending")
        try:
            for job in batch:
                rows, why = _build(store, ledger, v, job, ing)
                tot["rows"] += rows
                if why:
                    tot["masked"] += 1
                    log.warning("%s: segment %s ingested with its %d rows masked: %s", url, job.key, rows, why)
                if _failpoint.ACTIVE:
                    _failpoint.hit("ingest_after_build")
                tot["segments"] += 1
                settled[job.ordinal] = True
        finally:
            for job in batch:  # built ones are done; unbuilt ones are forgotten (taken next time)
                if job.entry is not None and not job.entry[_DONE]:
                    del ledger.segments[job.key]
            arec["done_below"] = int(np.argmin(settled))
            ledger.save(store)
    done_below = int(np.argmin(settled))
    if fresh or done_below != arec["done_below"]:
        arec["done_below"] = done_below
        ledger.save(store)
    return len(jobs)


def _plan_batch(ledger: _Ledger, batch: list[_Job], ing: Ingest) -> None:
    """Give each job its learner segment id (evicting like a writer) and record it pending."""
    for job in batch:
        row = job.row
        if job.session not in ledger.sessions:  # a new source session: its learner (writer id, epoch)
            ledger.sessions[job.session] = [ing.writer_id, secrets.randbits(63) | 1]
        sid = ing.new_segment_id()
        job.entry = ledger.segments[job.key] = [sid, ledger.sessions[job.session][0], int(row[COL["committed"]]), 0,
                                                0, int(row[COL["session_epoch"]]), int(row[COL["chain_index"]])]


def _build(store: ReplayStore, ledger: _Ledger, v: Verifier, job: _Job, ing: Ingest) -> tuple[int, str]:
    """Read one archived segment (its chunks checked: ``layout.Verifier``) and build it as the
    learner segment its ledger entry names, its masked rows masked again; a segment with a missing
    or damaged chunk is built with every row masked (its rows are not data). Returns ``(rows, why)``."""
    row, e = job.row, job.entry
    assert e is not None
    R = store.segment_records
    n = int(row[COL["committed"]])
    usable = int(row[COL["usable_records"]])
    if not 0 < n <= usable <= R:
        raise CorruptArchiveError(f"segment_table row {job.ordinal} has committed={n}, usable={usable}, "
                                  f"segment_records={R}")
    names = [*(f"fields/{f.name}" for f in store.schema.fields), "is_last", "episode",
             *(["masked"] if "masked" in v.g else [])]
    data, why = v.segment(job.ordinal, names)
    if why:
        fields = {f.name: np.zeros((n, *f.shape), f.dtype) for f in store.schema.fields}
        last, masked = np.zeros(n, np.bool_), np.ones(n, np.bool_)
    else:
        fields = {f.name: np.ascontiguousarray(data[f"fields/{f.name}"][:n]) for f in store.schema.fields}
        last = np.ascontiguousarray(data["is_last"][:n], np.bool_)
        masked = (np.asarray(data["masked"][:n], np.bool_) if "masked" in data
                  else np.asarray(data["episode"][:n], np.int64) == -1)
    crc = 0
    for f in store.schema.fields:
        crc = _crc32c.crc32c(fields[f.name], crc)
    crc = _crc32c.crc32c(last, crc)
    ing.build(segment_id=e[_SID], writer_id=e[_WID], lanes=int(row[COL["lanes"]]),
              session_epoch=ledger.sessions[job.session][1], chain_index=int(row[COL["chain_index"]]),
              first_seq=int(row[COL["first_seq"]]), usable_records=usable, created_ns=int(row[COL["created_ns"]]),
              fields=fields, is_last=last, masked=masked)
    e[_CRC] = int(crc)
    e[_DONE] = 1
    return n, why


__all__ = ["LEDGER", "IngestReport", "archive_urls", "ingest_archives", "read_ledger"]
