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

    A worker's own records (``<run>.wNNN``, kind ``worker``: what it stored, how it ended, the
    steps it cut) are folded into their run's as ``workers``. A run still recorded as ``running``
    is told how it ended when it is not running any more (``runs_status``): its steps are then
    the sum of what its workers recorded."""
    records, workers = [], {}
    d = store_dir / "provenance"
    for f in sorted(d.glob("*.json")) if d.is_dir() else ():
        try:
            rec = {"name": f.stem, **json.loads(f.read_text())}
        except (OSError, ValueError):
            continue
        if rec.get("kind") == "worker" and rec.get("run"):
            workers.setdefault(str(rec["run"]), []).append(rec)
        else:
            records.append(rec)
    for rec in records:
        ws = workers.pop(rec["name"], [])
        if ws:
            rec["workers"] = ws
        if rec.get("status") == "running":
            rec["status"] = run_status(rec, ws)
            if rec["status"] != "running" and ws:
                rec["steps_stored"] = sum(int(w.get("steps", 0)) for w in ws)
                rec["episodes"] = sum(int(w.get("episodes", 0)) for w in ws)
    records += [w for ws in workers.values() for w in ws]  # workers of a run whose own record is gone
    return records


def cut_rows(records: list[dict[str, Any]]) -> set[int]:
    """Global row ids of the steps the end of a run cut (stored as truncated), from every run's workers."""
    out: set[int] = set()
    for rec in records:
        for w in [rec, *rec.get("workers", ())]:
            out.update(int(i) for i in w.get("cut_rows", ()) if int(i) >= 0)
    return out


def _alive(rec: dict[str, Any]) -> bool | None:
    """Whether the process that wrote ``rec`` still runs (None: it ran on another host)."""
    if rec.get("host") not in (None, socket.gethostname()) or not rec.get("pid"):
        return None
    try:
        os.kill(int(rec["pid"]), 0)
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
    if parent or any(alive):
        return "running"
    if parent is None and not workers:
        return "running?"
    states = {w.get("status") for w in workers}
    if not workers or "running" in states:
        return "died"
    for s in ("failed", "interrupted"):
        if s in states:
            return s
    return "done"
