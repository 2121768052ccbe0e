"""Open-or-create: the one way collect, train and cluster actors get a store for an env.

Its compatibility rule (see :func:`open_or_create`) is the only one: callers do not compare
schemas themselves.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import SchemaError, StoreExistsError
from .manifest import COUNTERS, MANIFEST, MANIFEST_COPY
from .store import ReplayStore, create_store

if TYPE_CHECKING:
    from ..core.schema import Schema
    from .store import OnFull


def open_or_create(
    path: str | os.PathLike[str],
    schema: Schema,
    capacity: int = 1_000_000,
    *,
    segment_records: int | None = None,
    new_segment_records: int | None = None,
    on_full: OnFull = "evict",
    metadata: dict[str, Any] | None = None,
    what: str = "this run",
    writers: int = 1,
) -> ReplayStore:
    """Open the store at ``path`` for appending (``mode="a"``), or create it if there is none.

    The one compatibility rule: an existing store is used only if its schema is ``schema``
    (the same fields, in order, with the same dtypes and shapes: the schema hash) and, when
    ``segment_records`` is given, it has that many rows per segment (``new_segment_records``: rows
    per segment of a store created here when ``segment_records`` is not given, checked against
    nothing). ``capacity``, ``on_full``,
    ``metadata`` and ``writers`` (sizes the default segments, see ``create_store``) only apply
    to a store created here. Otherwise ``SchemaError`` names the
    first field (or setting) that differs, with what the store has and what ``what`` gives.

    Two processes creating the store at once both end up appending to one store. A directory
    left by a creation that died before its manifest (nothing but the empty ``segments/`` and
    ``locks/`` and the id counter, and still so a second later) is removed and made again; any
    other directory without a manifest is refused (``StoreNotFoundError``).
    """
    p = Path(path)
    if p.is_dir() and not (p / MANIFEST).exists() and _abandoned_creation(p):
        shutil.rmtree(p, ignore_errors=True)
    if not p.exists():
        try:
            return create_store(p, schema, capacity, segment_records=segment_records or new_segment_records,
                                on_full=on_full,
                                metadata=metadata, writers=writers)
        except StoreExistsError:
            pass
    store = ReplayStore(p, "a")
    have, want = store.schema, schema
    diff = None
    if have.hash != want.hash:
        diff = next((f"field {n!r} is {_field(have, n)} in the store, {what} gives {_field(want, n)}"
                     for n in [*want.names, *have.names] if _field(have, n) != _field(want, n)),
                    "its fields are in another order")
    elif segment_records is not None and store.segment_records != segment_records:
        diff = f"segment_records is {store.segment_records} in the store, {what} uses {segment_records}"
    if diff is not None:
        store.close()
        raise SchemaError(f"{p}: {diff}", hint=f"use a new store path for {what}, or open this one with the "
                                               "schema (env) and settings it was made with")
    return store


def _field(schema: Schema, name: str) -> tuple[str, tuple[int, ...]] | None:
    return (str(schema[name].dtype), schema[name].shape) if name in schema else None


def _abandoned_creation(p: Path, wait_s: float = 1.0) -> bool:
    """``p`` holds only what ``create_store`` makes before the manifest, and no manifest
    appeared within ``wait_s`` (a live creation takes milliseconds)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            names = set(os.listdir(p))
            empty = all(not os.listdir(p / d) for d in ("segments", "locks") if d in names)
        except OSError:
            return False
        if MANIFEST in names or not empty or not names <= {"segments", "locks", COUNTERS, MANIFEST_COPY} | {
                n for n in names if n.startswith(".") and n.endswith(".tmp")}:
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)
