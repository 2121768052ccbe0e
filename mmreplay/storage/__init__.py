"""storage: the store on disk, and the one owner of its protocol.

Floors, lowest first (a module imports only modules of its floor or below; no circle, type-only
imports counted; no ``_private`` name crosses modules):

* **format**: ``format`` (segment file layout: header, control slots, records, stamps, row
  digests), ``check_kernel`` (the compiled check of commit groups, stamping, id lookup),
  ``snapshot`` (the reader's snapshot and the segment table the sampling kernels read), ``locks``
  (flock lock files and their names), ``catalog`` (every segment sealed and how it left),
  ``manifest`` (STORE.json and its copy, the segment-id counter, the segment-sizing rule),
  ``provenance`` (records of the runs that wrote a store);
* **files**: ``segment`` (make, map, seal one segment file), ``checks`` (each sealed segment checked
  once; damaged rows masked in every reader's view), ``files`` (``StoreFiles``: the store's
  directory and the protocol over it: paths, locks, ids, catalog, segment states, eviction);
* **write**: ``claims`` (writer-id claims, evict-then-allocate), ``recovery`` (a dead writer's
  open tail cut back; every other unfinished segment sealed, damage masked), ``segment_supply``
  (segments made ahead of need and retired), ``step_spec`` (the generated check and copy of one
  step), ``writer`` (the append path);
* **read**: ``reader`` (a process's view of every segment, row gathers, the transition-start
  rule), ``transitions`` (one-step transition batches), ``verify`` (checks and repair), ``info``
  (statistics for ``info()``; ``disk_footprint``: a store's size on disk and evictions, read without
  opening it);
* **store**: ``store`` (``ReplayStore``, the user's object: create, open, write, read, inspect);
* **seams**: ``exchange`` (rows in and out as whole segments: ``Ingest``, ``SessionIngest``,
  ``segment_rows``), ``opening`` (open-or-create for an env, the one compatibility rule).

Other rooms (and the command line) use only the names exported here: the user's objects, the
exchange seam, and the read contract the samplers' kernels use (the segment table's columns, the
row flags).

Invariants kept here: a row is visible only once its writer has published it, and never
changes after; sealed segments are immutable; no row of a sealed segment is served before the
segment is checked, and no damaged row is ever served; damage costs exactly the damaged rows
(no file holding a row is removed because another is damaged); the oldest sealed segment is
evicted, never an open one; every lock name, segment state and writer-id claim lives in this room.
"""

from ..core.batch import TransitionBatch
from .checks import usable_cores
from .exchange import Ingest, SegmentInfo, SegmentRows, SessionIngest, segment_rows
from .format import CONTROL_OFFSET, CONTROL_SLOT_SIZE, HEADER_SIZE, MASKED, PAGE_SIZE, Header, read_control
from .format import kernel as storage_kernels
from .info import DiskFootprint, disk_footprint
from .manifest import MANIFEST, default_segment_records, read_manifest, segment_records_for
from .opening import open_or_create
from .segment import parse_segment_name
from .store import ReplayStore, create_store, open_store
from .snapshot import (PRED_GONE, SEG_BASE, SEG_BUCKET, SEG_COLS, SEG_COMMITTED, SEG_CUM_END, SEG_FIRST, SEG_ID,
                    SEG_LANES, SEG_NBUCKETS, SEG_PRED, SEG_SHIFT, SEG_SUCC, SEG_USABLE, Snapshot, index_draws)
from .transitions import transitions_at
from .writer import Durability, Writer

__all__ = [
    # the user's objects and calls
    "Durability", "ReplayStore", "TransitionBatch", "Writer", "create_store", "open_or_create", "open_store",
    "read_manifest", "default_segment_records", "segment_records_for", "MANIFEST",
    # what a store takes on disk and evicted, without opening it (a run's summary, `mmreplay collect`)
    "DiskFootprint", "disk_footprint",
    # the cores this process may use: how many threads a whole-store pass runs (field_stats, checks)
    "usable_cores",
    # the seam for archives, shipping and imports: rows in and out as whole segments
    "Ingest", "SegmentInfo", "SegmentRows", "SessionIngest", "segment_rows",
    # the read contract samplers and their kernels use: the reader's segment table and row flags
    "MASKED", "PRED_GONE", "SEG_BASE", "SEG_BUCKET", "SEG_COLS", "SEG_COMMITTED", "SEG_CUM_END", "SEG_FIRST",
    "SEG_ID", "SEG_LANES", "SEG_NBUCKETS", "SEG_PRED", "SEG_SHIFT", "SEG_SUCC", "SEG_USABLE", "Snapshot",
    "index_draws", "storage_kernels", "transitions_at",
    # file layout facts, for tools that inspect or damage segment files (the damage suite, the crash explorer)
    "CONTROL_OFFSET", "CONTROL_SLOT_SIZE", "HEADER_SIZE", "PAGE_SIZE", "Header", "parse_segment_name", "read_control",
]
