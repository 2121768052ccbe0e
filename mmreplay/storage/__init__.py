"""storage: the store on disk and the one owner of its protocol.

Modules: ``format`` (segment file layout, headers, control pages, stamps), ``segment``
(allocate, map, seal a segment file), ``locks`` (flock-based lock files and the lock
names), ``writer`` (the append path), ``segment_supply`` (segments made ahead of need), ``reader``
(a process's read-only view of every segment, row gathers), ``recovery`` (open segments cut
back to their longest valid prefix), ``verify`` and ``info`` (checks and reports), ``ingest``
(whole sealed segments copied in from elsewhere), ``view`` (one-step transitions), ``store``
(create/open, eviction, the public ``ReplayStore``), ``manifest`` (STORE.json and the segment-id
counter), ``claims`` (writer-id claims, evict-then-allocate), ``opening`` (open-or-create for
an env, the one compatibility rule), ``catalog`` (every segment sealed and how it left),
``checks`` and ``check_kernel`` (each sealed segment checked once; damaged rows patched out of
every reader's view), ``provenance`` (records of the runs that wrote a store).

Invariants kept here: a row is visible only once its writer has published it, and never
changes after; sealed segments are immutable; no row of a sealed segment is served before the segment is
checked, and no damaged row is ever served; the oldest sealed segment is evicted, never an
open one; every lock name, segment state and writer-id claim lives in this room, and no code
outside it reads or writes a store's or writer's private members.
"""

from ..core.batch import TransitionBatch
from .exchange import Ingest, SegmentInfo, SegmentRows, SessionIngest, segment_rows
from .format import CONTROL_OFFSET, CONTROL_SLOT_SIZE, HEADER_SIZE, MASKED, PAGE_SIZE
from .format import kernel as storage_kernels
from .manifest import MANIFEST, default_segment_records, read_manifest, segment_records_for
from .opening import open_or_create
from .store import ReplayStore, create_store, open_store
from .snapshot import (PRED_GONE, SEG_BASE, SEG_BUCKET, SEG_COLS, SEG_COMMITTED, SEG_CUM_END, SEG_FIRST, SEG_ID,
                    SEG_LANES, SEG_NBUCKETS, SEG_PRED, SEG_SHIFT, SEG_SUCC, SEG_USABLE, Snapshot, index_draws)
from .transitions import transitions_at
from .writer import Durability, Writer

__all__ = [
    # the user's objects and calls
    "Durability", "ReplayStore", "TransitionBatch", "Writer", "create_store", "open_or_create", "open_store",
    "read_manifest", "default_segment_records", "segment_records_for", "MANIFEST",
    # the seam for archives, shipping and imports: rows in and out as whole segments
    "Ingest", "SegmentInfo", "SegmentRows", "SessionIngest", "segment_rows",
    # the read contract samplers and their kernels use: the reader's segment table and row flags
    "MASKED", "PRED_GONE", "SEG_BASE", "SEG_BUCKET", "SEG_COLS", "SEG_COMMITTED", "SEG_CUM_END", "SEG_FIRST",
    "SEG_ID", "SEG_LANES", "SEG_NBUCKETS", "SEG_PRED", "SEG_SHIFT", "SEG_SUCC", "SEG_USABLE", "Snapshot",
    "index_draws", "storage_kernels", "transitions_at",
    # file layout facts, for tools that inspect or damage segment files (the damage suite)
    "CONTROL_OFFSET", "CONTROL_SLOT_SIZE", "HEADER_SIZE", "PAGE_SIZE",
]
