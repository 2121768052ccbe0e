"""Named crash points for fault tests (SQLite's crashsql, LevelDB's fault env).

Set ``MMREPLAY_FAILPOINT`` to one of ``NAMES`` (optionally ``NAME:N`` for the N-th time the
point is reached, default the first) in a writer process's environment and that process kills
itself with SIGKILL there. Unset (always, outside tests), each point costs one global truth
test.
"""

from __future__ import annotations

import os
import signal

NAMES = ("after_payload", "after_stamps", "after_publish", "mid_seal", "after_fallocate", "before_rename",
         "mid_evict", "archive_before_commit",
         "ingest_after_pending", "ingest_after_build", "catalog_torn_line", "catalog_after_departure")
_SPEC = os.environ.get("MMREPLAY_FAILPOINT") or None
_POINT, _, _COUNT = (_SPEC or "").partition(":")
_LEFT = [int(_COUNT) if _COUNT else 1]
ACTIVE = _SPEC is not None


def hit(name: str) -> None:
    """Die here (SIGKILL, no cleanup) if this is the configured failpoint's N-th hit."""
    if name == _POINT:
        _LEFT[0] -= 1
        if _LEFT[0] <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
