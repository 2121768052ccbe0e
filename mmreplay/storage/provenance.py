"""Provenance records: one small JSON file per run that wrote to a store (env id, seeds, policy).

Records live in ``provenance/<name>.json`` beside the manifest, each replaced atomically
(``core.fs.atomic_write``), so concurrent runs never rewrite the manifest or each other's records.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

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
    d.mkdir(exist_ok=True)
    atomic_write(d / f"{name}.json", json.dumps(record, indent=1, sort_keys=True, default=str).encode())
    return name


def read_provenance(store_dir: Path) -> list[dict[str, Any]]:
    """Every record, oldest first (by name); unreadable records are skipped."""
    out = []
    d = store_dir / "provenance"
    for f in sorted(d.glob("*.json")) if d.is_dir() else ():
        try:
            out.append({"name": f.stem, **json.loads(f.read_text())})
        except (OSError, ValueError):
            continue
    return out
