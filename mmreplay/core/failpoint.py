"""Named crash points for fault tests (SQLite's crashsql, LevelDB's fault env).

Set ``MMREPLAY_FAILPOINT`` to one of ``NAMES`` (optionally ``NAME:N`` for the N-th time the
point is reached, default the first) in a writer process's environment and that process kills
itself with SIGKILL there (``MMREPLAY_FAILPOINT_SIGNAL=SIGINT``: sends itself that signal instead,
as a Ctrl-C at that point would, and goes on). Unset (always, outside tests), each point costs one
global truth test.
"""

from __future__ import annotations

import os
import signal

NAMES = ("after_payload", "after_stamps", "after_publish", "mid_seal", "after_fallocate", "before_rename",
         "mid_evict", "archive_before_commit", "import_after_build",
         "ingest_after_pending", "ingest_after_build", "catalog_torn_line", "catalog_after_departure")
_SPEC = os.environ.get("MMREPLAY_FAILPOINT") or None
_POINT, _, _COUNT = (_SPEC or "").partition(":")
_LEFT = [int(_COUNT) if _COUNT else 1]
_SIGNAL = getattr(signal, os.environ.get("MMREPLAY_FAILPOINT_SIGNAL") or "SIGKILL")
ACTIVE = _SPEC is not None


def hit(name: str) -> None:
    """Die here (SIGKILL, no cleanup) if this is the configured failpoint's N-th hit (or send the
    configured signal and go on)."""
    if name == _POINT:
        _LEFT[0] -= 1
        if _LEFT[0] == 0 or (_LEFT[0] < 0 and _SIGNAL == signal.SIGKILL):
            os.kill(os.getpid(), _SIGNAL)
