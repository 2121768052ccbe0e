"""Provenance records: one small JSON file per run that wrote to a store (env id, seeds, policy).

Records live in ``provenance/<name>.json`` beside the manifest, each replaced atomically
(``core.fs.atomic_write``), so concurrent runs never rewrite the manifest or each other's records.
A collect run's workers keep records of their own beside their run's (``<run>.wNNN.json``,
rewritten as they go): a run whose processes were killed still says what they stored, and how
a run ended is told from its records and whether its processes live (``run_status``).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from ..core import fs
from ..core.fs import atomic_write


def record_provenance(store_dir: Path, record: dict[str, Any], name: str | None = None) -> str:
    """Write (or rewrite) record ``name`` (a fresh time-ordered name if ``None``); returns the name."""
    if name is None:
        ns = time.time_ns()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(ns // 10**9))
        name = f"{stamp}.{ns % 10**9:09d}Z-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"provenance record name {name!r} must be a plain file name")
    d = store_dir / "provenance"
    if not d.is_dir():
        fs.mkdir(d, exist_ok=True)
        fs.fsync_dir(store_dir)  # the records' directory survives a power loss with them
    atomic_write(d / f"{name}.json", json.dumps(record, indent=1, sort_keys=True, default=str).encode())
    return name


def read_provenance(store_dir: Path) -> list[dict[str, Any]]:
    """Every run's record, oldest first (by name); unreadable records are skipped.

    A record is data another process wrote, possibly killed mid-way, possibly another version: a
    file that is not a JSON object (empty, torn, a list, a number, nested past the parser's
    depth, a directory) is skipped, and a field of an unexpected type is read as absent where it
    counts (``cut_rows``, ``run_status``, the sums below), never trusted. ``name`` is always the
    file's. A worker's own records (``<run>.wNNN``, kind ``worker``: what it stored, how it ended,
    the steps it cut) are folded into their run's as ``workers`` (the list replaces the count a
    collect run records there). A run still recorded as ``running`` is told how it ended when it
    is not running any more (``run_status``): its steps are then the sum of what its workers
    recorded."""
    records, workers = [], {}
    d = store_dir / "provenance"
    for f in sorted(d.glob("*.json")) if d.is_dir() else ():
        try:
            data = json.loads(f.read_bytes()) if f.is_file() else None
        except (OSError, ValueError, RecursionError):  # torn, not UTF-8, nested too deep, gone meanwhile
            continue
        if not isinstance(data, dict):
            continue
        rec = {**data, "name": f.stem}
        if rec.get("kind") == "worker" and isinstance(rec.get("run"), str) and rec["run"]:
            workers.setdefault(rec["run"], []).append(rec)
        else:
            records.append(rec)
    for rec in records:
        ws = workers.pop(rec["name"], [])
        if ws:
            rec["workers"] = ws
        if rec.get("status") == "running":
            rec["status"] = run_status(rec, ws)
            if rec["status"] != "running" and ws:
                rec["steps_stored"] = sum(_count(w.get("steps")) for w in ws)
                rec["episodes"] = sum(_count(w.get("episodes")) for w in ws)
    records += [w for ws in workers.values() for w in ws]  # workers of a run whose own record is gone
    return records


def _count(value: object) -> int:
    """A count a record holds: a non-negative JSON integer, else 0 (a field of another type is absent)."""
    return value if type(value) is int and value >= 0 else 0


def _row_ids(value: object) -> list[int]:
    """The global row ids a record's ``cut_rows`` holds: the entries that are row ids (integers in
    ``[0, 2**63)``); anything else (a string, a torn list's ``None``, a float) is left out."""
    if not isinstance(value, list):
        return []
    return [i for i in value if type(i) is int and 0 <= i < 2**63]


def cut_rows(records: list[dict[str, Any]]) -> set[int]:
    """Global row ids of the steps the end of a run cut (stored truncated), from every run's workers.

    A run's ``workers`` counts only as a list of worker records: a collect run records the number
    of its workers there, and it stays so when it was killed before they wrote theirs."""
    out: set[int] = set()
    for rec in records:
        ws = rec.get("workers")
        for w in [rec, *(ws if isinstance(ws, list) else ())]:
            if isinstance(w, dict):
                out.update(_row_ids(w.get("cut_rows")))
    return out


def _alive(rec: dict[str, Any]) -> bool | None:
    """Whether the process that wrote ``rec`` still runs (None: it ran on another host, or the record
    names no process: its ``pid`` is not a positive integer)."""
    host, pid = rec.get("host"), rec.get("pid")
    if (host is not None and host != socket.gethostname()) or type(pid) is not int or not 0 < pid < 2**31:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_status(rec: dict[str, Any], workers: list[dict[str, Any]]) -> str:
    """How a run recorded as ``running`` stands: ``running`` while its process (or a worker) lives;
    else ``done`` when every worker recorded that it finished (the parent died before saying so),
    ``interrupted`` when one was stopped, ``failed`` when one failed, ``died`` when they were
    killed; ``running?`` when it ran on another host (nothing here can tell)."""
    parent = _alive(rec)
    alive = [_alive(w) for w in workers if w.get("status") == "running"]
    states = {w.get("status") if isinstance(w.get("status"), str) else None for w in workers}
    if parent or any(alive):
        return "running"
    if parent is None and not workers:
        return "running?"
    if not workers or "running" in states:
        return "died"
    for s in ("failed", "interrupted"):
        if s in states:
            return s
    return "done"
