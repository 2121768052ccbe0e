"""storage: the store on disk and the one owner of its protocol.

Modules: ``format`` (segment file layout, headers, control pages, stamps), ``segment``
(allocate, map, seal a segment file), ``locks`` (flock-based lock files and the lock
names), ``writer`` (the append path), ``_supply`` (segments made ahead of need), ``reader``
(a process's read-only view of every segment, row gathers), ``recovery`` (open segments cut
back to their longest valid prefix), ``verify`` and ``info`` (checks and reports), ``ingest``
(whole sealed segments copied in from elsewhere), ``view`` (one-step transitions), ``store``
(create/open, eviction, the public ``ReplayStore``), ``manifest`` (STORE.json and the segment-id
counter), ``claims`` (writer-id claims, evict-then-allocate), ``opening`` (open-or-create for
an env, the one compatibility rule), ``catalog`` (every segment sealed and how it left),
``checks`` and ``_checkkernel`` (each sealed segment checked once; damaged rows patched out of
every reader's view), ``provenance`` (records of the runs that wrote a store).

Invariants kept here: a row is visible only once its writer has published it, and never
changes after; sealed segments are immutable; no row of a sealed segment is served before the segment is
checked, and no damaged row is ever served; the oldest sealed segment is evicted, never an
open one; every lock name, segment state and writer-id claim lives in this room, and no code
outside it reads or writes a store's or writer's private members.
"""

from .exchange import Ingest, SegmentInfo, SegmentRows, SessionIngest, segment_rows
from .opening import open_or_create
from .store import ReplayStore, create_store, open_store
from .view import TransitionBatch
from .writer import Writer

__all__ = ["Ingest", "ReplayStore", "SegmentInfo", "SegmentRows", "SessionIngest", "TransitionBatch", "Writer",
           "create_store", "open_or_create", "open_store", "segment_rows"]
