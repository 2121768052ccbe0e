"""The segment catalog: every segment the store sealed, and how each one left.

``CATALOG.log`` in the store directory is append-only, one line per event, each with its own
crc32c::

    1a2b3c4d {"e":"sealed","rows":4096,"seg":"0000000000003-w001.seg"}
    5e6f7a8b {"e":"evicted","seg":"0000000000003-w001.seg","why":"capacity"}   # or "disk"
    9c0d1e2f {"e":"quarantined","seg":"..."}
    3a4b5c6d {"bad":[[12,16]],"e":"checked","id":[...],"seg":"..."}        # or "masked" (repair)
    7e8f9a0b {"bad":[],"e":"checked","id":[...],"seg":"...","torn":[[40,41]]}  # recovery's torn rows
    1b2c3d4e {"e":"gap","ep":123,"seg":"","w":0,"ci":2}      # a chain position acknowledged lost

(the crc32c of the JSON bytes, in hex, then the JSON: a line is checked without re-encoding it).

Checks (``checks.py``): a writer's ``sealed`` line carries the file's identity (``id``: inode,
size, mtime and ctime in ns) as it was when sealed: the writer checksummed every row it wrote, so
the segment counts as checked while its file keeps that identity. ``checked`` records a check's
damaged rows (``bad``: ``[start, stop)`` slot ranges) for that identity; ``masked`` is the same
written by ``verify --repair``: the damage is acknowledged, and the rows stay excluded. ``torn``:
rows recovery found torn by a power loss (lost, reported then; excluded like damaged rows, never a
problem for ``verify``). ``gap``: a writer session's chain position that no file holds, found while
the catalog was missing or cut, acknowledged as lost (``files.chain_gaps``).

A segment the catalog lists as sealed and not gone, whose file is missing, is **lost** (not
evicted): ``verify`` reports it, ``info`` and ``open_store`` warn. Invariants:

* A departure is written (and fsynced) *before* the file is renamed away, so a kill -9 between
  the two never makes an eviction look like a loss; a segment is catalogued when its writer
  retires it (closed, synced for ``segment`` durability), and any sealed file not yet catalogued (sealed by recovery, copied in by an import
  or ingestion, or written before the catalog existed) when an eviction pass, a writable open
  or ``verify`` sees it.
* Each append is one ``write`` of whole lines on an ``O_APPEND`` descriptor (atomic between
  processes on a local filesystem); departures and masks are fsynced, sealed and checked lines
  need not be (a lost one is written again, or the check done again). A line torn by a crash fails its crc
  and is ignored; the segment it named is catalogued again by the next pass that sees it.
* Readers that cannot write (``mode="r"``, a read-only mount) only read the catalog.
* Past 1 MiB, an eviction pass rewrites the log with what it still says (``compact_if_large``:
  live segments and their checks, quarantines, one ``evictions`` count per reason), atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from ..core import failpoint as _failpoint
from ..core import fs

__all__ = ["CATALOG", "Catalog", "CatalogState", "SegmentRecord", "short_list"]

CATALOG = "CATALOG.log"
DEPARTURES = ("evicted", "quarantined", "removed")


@dataclass(slots=True)
class CatalogState:
    """What the catalog says: sealed segments still expected (name -> rows), and departures."""

    live: dict[str, int] = field(default_factory=dict)
    evicted: dict[str, int] = field(default_factory=dict)
    """Evictions by reason (``capacity``, ``disk``)."""
    quarantined: list[str] = field(default_factory=list)
    checks: dict[str, SegmentRecord] = field(default_factory=dict)
    """The latest check of each segment: its file's identity then, and its damaged rows."""
    torn_lines: int = 0
    max_segment_id: int = -1
    """The highest segment id any line names (a damaged id counter is rebuilt above it)."""
    departed: set[str] = field(default_factory=set)
    """Segments a departure line names (evicted, quarantined or removed)."""
    removed: dict[str, str] = field(default_factory=dict)
    """Segments removed (not evicted): name -> why (``recovery``: it held no row; ``lost``: a repair
    acknowledged its file gone)."""
    evicted_by_writer: dict[int, int] = field(default_factory=dict)
    """Evictions by writer id whose lines name them."""
    folded_by_writer: dict[int, int] = field(default_factory=dict)
    """Evictions a compaction folded into a count, by writer id (their names are gone: they explain
    that many chain positions of the writer's sessions, ``files.chain_gaps``)."""
    gaps: set[tuple[int, int, int]] = field(default_factory=set)
    """Chain positions ``(writer id, session epoch, chain index)`` a repair acknowledged as lost
    (a segment gone while the catalog that would name it was missing or cut)."""


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    """What the catalog remembers of one check: the file's identity and the damaged slot ranges."""

    identity: tuple[int, ...]
    bad: tuple[tuple[int, int], ...] = ()
    masked: bool = False
    """Written by ``verify --repair``: the damage is acknowledged."""
    torn: tuple[tuple[int, int], ...] = ()
    """Rows recovery found torn (never made durable, failing their checks): lost, reported when
    found, left out like damaged rows and never a problem for ``verify``."""


def _line(event: dict[str, object]) -> bytes:
    body = json.dumps(event, sort_keys=True, separators=(",", ":")).encode()
    return b"%08x %s\n" % (crc32c(body), body)


def _parse(raw: bytes) -> dict[str, object] | None:
    """The event of one line, or ``None`` for a line that fails its crc (torn by a crash)."""
    if len(raw) < 10 or raw[8:9] != b" ":
        return None
    try:
        crc = int(raw[:8], 16)
    except ValueError:
        return None
    body = raw[9:]
    if crc32c(body) != crc:
        return None
    try:
        event = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) and _well_formed(event) else None


def _is_count(v: object) -> bool:
    """A JSON integer that counts something (rows, evictions, a slot): not negative, not a bool."""
    return type(v) is int and v >= 0


def _well_formed(event: dict[str, object]) -> bool:
    """Whether an event's fields have their types (a line with a good crc may still be another
    version's, or garbage): ``e`` a string; ``seg`` a plain file name, required by the events
    about one segment; ``rows``, ``n`` counts; ``why`` a string; ``id`` a list of integers,
    required by checks; ``bad`` and ``torn`` lists of ``[start, stop)`` pairs of counts; a ``gap``'s
    ``w``, ``ep`` and ``ci`` counts. Fields may be absent
    where :meth:`Catalog.read` has a default. An event of a kind this version does not know is
    well formed (and ignored)."""
    kind, seg = event.get("e"), event.get("seg", "")
    if not isinstance(kind, str) or not isinstance(seg, str) or "/" in seg or "\0" in seg:
        return False
    if not seg and (kind in ("sealed", "checked", "masked") or kind in DEPARTURES):
        return False
    if not all(_is_count(event.get(k, 0)) for k in ("rows", "n")) or not isinstance(event.get("why", ""), str):
        return False
    ident = event.get("id", [])
    if "id" not in event and kind in ("checked", "masked"):
        return False
    if not isinstance(ident, list) or not all(type(i) is int for i in ident):
        return False
    if kind == "gap" and not all(_is_count(event.get(k)) for k in ("w", "ep", "ci")):
        return False
    if kind == "writer_evictions" and not (_is_count(event.get("w")) and _is_count(event.get("n"))):
        return False
    return all(_ranges(event.get(k, [])) for k in ("bad", "torn"))


def _ranges(rs: object) -> bool:
    """A list of ``[start, stop)`` pairs of counts."""
    return isinstance(rs, list) and all(isinstance(r, list) and len(r) == 2 and _is_count(r[0]) and _is_count(r[1])
                                        and r[0] <= r[1] for r in rs)


def short_list(names: list[str], most: int = 5) -> str:
    """``a, b, c`` or ``a, b, c, d, e and 12 more``: a message stays one readable line."""
    head = ", ".join(names[:most])
    return head if len(names) <= most else f"{head} and {len(names) - most} more"


class Catalog:
    """The catalog of one store directory (cheap to make; reads the file on demand)."""

    def __init__(self, store_dir: Path) -> None:
        self.path = Path(store_dir) / CATALOG
        self._known: set[str] | None = None  # segments this handle saw catalogued as sealed
        self._compacted_bytes = 0  # the log's size after this handle last compacted it

    def read(self) -> CatalogState:
        """Replay the log (lines that fail their crc, or whose fields are not of their types, are
        counted as torn and skipped)."""
        state = CatalogState()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self._known = set()
            return state
        for raw in data.splitlines():
            if not raw.strip():
                continue
            event = _parse(raw)
            if event is None:
                state.torn_lines += 1
                continue
            seg, kind = str(event.get("seg")), event.get("e")
            if seg[:13].isascii() and seg[:13].isdigit():
                state.max_segment_id = max(state.max_segment_id, int(seg[:13]))
            if kind == "sealed":
                state.live[seg] = int(event.get("rows", 0))  # type: ignore[call-overload]
                if "id" in event:
                    state.checks[seg] = SegmentRecord(tuple(event["id"]))  # type: ignore[arg-type]
            elif kind in ("checked", "masked"):
                rec = SegmentRecord(tuple(event["id"]),  # type: ignore[arg-type]
                                    tuple((int(a), int(b)) for a, b in event.get("bad", ())),  # type: ignore[union-attr]
                                    kind == "masked",
                                    tuple((int(a), int(b)) for a, b in event.get("torn", ())))  # type: ignore[union-attr]
                old = state.checks.get(seg)
                if old is not None and old.masked and old.identity == rec.identity and set(rec.bad) <= set(old.bad):
                    continue  # a later check of the same file finds what a repair masked: still masked
                state.checks[seg] = rec
            elif kind == "evictions":  # a compaction's count of the evictions it folded
                why = str(event.get("why", "capacity"))
                state.evicted[why] = state.evicted.get(why, 0) + int(event.get("n", 0))  # type: ignore[call-overload]
            elif kind == "writer_evictions":  # the same, by writer
                w = int(event.get("w", 0))  # type: ignore[call-overload]
                state.folded_by_writer[w] = state.folded_by_writer.get(w, 0) + int(event.get("n", 0))  # type: ignore[call-overload]
            elif kind == "gap":
                state.gaps.add((int(event["w"]), int(event["ep"]), int(event["ci"])))  # type: ignore[call-overload]
            elif kind in DEPARTURES:
                state.live.pop(seg, None)
                state.departed.add(seg)
                if kind == "evicted":
                    why = str(event.get("why", "capacity"))
                    state.evicted[why] = state.evicted.get(why, 0) + 1
                    if seg[13:15] == "-w" and seg[15:18].isdigit():
                        w = int(seg[15:18])
                        state.evicted_by_writer[w] = state.evicted_by_writer.get(w, 0) + 1
                elif kind == "quarantined":
                    state.quarantined.append(seg)
                else:
                    state.removed[seg] = str(event.get("why", ""))
        self._known = set(state.live)
        return state

    def _append(self, event: dict[str, object], more: bytes = b"", *, sync: bool = True) -> None:
        line = _line(event) + more
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:  # the first line: the log's directory entry is made durable with it
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            sync = True
            created = True
        else:
            created = False
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # end a line a crash tore, so this one parses on its own
            if _failpoint.ACTIVE and event["e"] == "sealed":
                fs.write(fd, line[: len(line) // 2])  # a torn line, as a crash mid-write leaves it
                _failpoint.hit("catalog_torn_line")
                fs.write(fd, line[len(line) // 2 :])
            else:
                fs.write(fd, line)
            if sync:
                fs.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fs.fsync_dir(self.path.parent)

    def sync(self) -> None:
        """fsync the log: every line written so far survives a power loss."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            fs.fsync(fd)
        finally:
            os.close(fd)

    def sealed(self, name: str, rows: int, identity: tuple[int, ...] | None = None) -> None:
        """Record that segment ``name`` was sealed with ``rows`` committed rows (once per handle);
        ``identity``: its file's, from the writer that checksummed every row (see above)."""
        self.sealed_many({name: rows}, {name: identity} if identity else None)

    def sealed_many(self, segments: dict[str, int], identities: dict[str, tuple[int, ...]] | None = None) -> None:
        """Record every sealed segment of ``segments`` (name -> rows) not catalogued yet, with one
        unsynced write; ``identities``: files their writer checksummed (a ``checked`` line for a
        segment catalogued already)."""
        if self._known is None:
            self.read()
        assert self._known is not None
        ids = identities or {}
        new = [(n, r) for n, r in sorted(segments.items()) if n not in self._known]
        events = [{"e": "sealed", "seg": n, "rows": int(r), **({"id": list(ids[n])} if n in ids else {})}
                  for n, r in new]
        # catalogued already (an eviction pass saw it first): the writer's identity is a check
        events += [{"e": "checked", "seg": n, "id": list(i), "bad": []} for n, i in sorted(ids.items())
                   if n in self._known and n in segments]
        if not events:
            return
        # no fsync: a sealed line lost in a crash is written again by the next pass that sees the
        # file, and a departure (fsynced) flushes the lines before it
        self._append(events[0], b"".join(_line(e) for e in events[1:]), sync=False)
        self._known.update(n for n, _ in new)

    def checked(self, name: str, identity: tuple[int, ...], bad: tuple[tuple[int, int], ...], *,
                masked: bool = False, torn: tuple[tuple[int, int], ...] = ()) -> None:
        """Record a check of segment ``name`` (file ``identity``) and its damaged slot ranges;
        ``masked``: written by a repair that acknowledges them; ``torn``: rows recovery found torn
        (lost and reported; fsynced, like a mask)."""
        event: dict[str, object] = {"e": "masked" if masked else "checked", "seg": name, "id": list(identity),
                                    "bad": [list(r) for r in bad]}
        if torn:
            event["torn"] = [list(r) for r in torn]
        self._append(event, sync=masked or bool(torn))  # a lost check is only done again

    def gap(self, writer_id: int, epoch: int, chain_index: int) -> None:
        """Record (fsynced) that a repair acknowledged chain position ``(writer_id, epoch,
        chain_index)`` as lost: no file holds it and no line names it."""
        self._append({"e": "gap", "seg": "", "w": int(writer_id), "ep": int(epoch), "ci": int(chain_index)})

    def departed(self, name: str | list[str], event: str, why: str | None = None, *, sync: bool = True) -> None:
        """Record, before the files go, that segment ``name`` (or each of a list, with one write
        and one fsync) leaves: ``evicted`` (``why``: ``capacity`` or ``disk``), ``quarantined``
        or ``removed``. ``sync=False``: the caller calls ``sync()`` before any of the files is
        unlinked (eviction renames them ``.deleted`` first)."""
        assert event in DEPARTURES
        names = [name] if isinstance(name, str) else list(name)
        events = [{"e": event, "seg": n, **({"why": why} if why else {})} for n in names]
        self._append(events[0], b"".join(_line(e) for e in events[1:]), sync=sync)
        if _failpoint.ACTIVE and event == "evicted":
            _failpoint.hit("catalog_after_departure")
        if self._known is not None:
            self._known.difference_update(names)

    def compact_if_large(self, present: set[str], max_bytes: int = 1 << 20) -> bool:
        """Rewrite the log with what it still says, once it is over ``max_bytes``: live sealed
        segments (with their files' checks), quarantined ones, and one ``evictions`` count per
        reason in place of every departed segment's lines. Small segments of a small store come
        and go every few thousand rows, and every open and ``info`` reads the whole log.

        The caller holds ``alloc.lock`` and the admin lock shared (a writer session), so no
        sealed line, departure (evictions and recovery write theirs under ``alloc.lock``) or
        mask (``verify --repair`` holds admin exclusively) is written meanwhile; a reader's
        ``checked`` line written meanwhile may be lost (that check is done again). It runs again
        only once the log has doubled since this handle last compacted it (a store with many
        live segments stays above ``max_bytes``). ``present``: the segment files in the
        directory now. Returns whether it rewrote the log (temp file, fsync, rename: a crash
        leaves the old log or the new one).
        """
        try:
            if os.stat(self.path).st_size <= max(max_bytes, 2 * self._compacted_bytes):
                return False
        except FileNotFoundError:
            return False
        self.rewrite(present)
        return True

    def rewrite(self, present: set[str]) -> None:
        """Rewrite the log with what its readable lines still say (see ``compact_if_large``; a
        ``verify --repair`` also drops the lines a crash cut or damage spoilt this way), atomically.
        ``present``: the segment files in the directory now."""
        from ..core.fs import atomic_write

        state = self.read()
        events: list[dict[str, object]] = [{"e": "evictions", "why": why, "n": n} for why, n in sorted(state.evicted.items())]
        by_writer = {w: state.evicted_by_writer.get(w, 0) + state.folded_by_writer.get(w, 0)
                     for w in {*state.evicted_by_writer, *state.folded_by_writer}}
        events += [{"e": "writer_evictions", "seg": "", "w": w, "n": n} for w, n in sorted(by_writer.items())]
        events += [{"e": "quarantined", "seg": n} for n in state.quarantined]
        events += [{"e": "removed", "seg": n, **({"why": w} if w else {})} for n, w in sorted(state.removed.items())]
        events += [{"e": "sealed", "seg": n, "rows": r} for n, r in sorted(state.live.items())]
        for name, rec in sorted(state.checks.items()):
            if name in state.live or name in present:
                events.append({"e": "masked" if rec.masked else "checked", "seg": name, "id": list(rec.identity),
                               "bad": [list(r) for r in rec.bad], **({"torn": [list(r) for r in rec.torn]}
                                                                     if rec.torn else {})})
        events += [{"e": "gap", "seg": "", "w": w, "ep": ep, "ci": ci} for w, ep, ci in sorted(state.gaps)]
        data = b"".join(_line(e) for e in events)
        atomic_write(self.path, data)
        self._known = set(state.live)
        self._compacted_bytes = len(data)
