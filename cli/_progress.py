"""The CLI's progress bars: a ``progress(done, total)`` callback for the library's long passes, and
the ``--progress/--no-progress`` option that turns it on (default: when stderr is a terminal)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@contextmanager
def _progress(enabled: bool | None, unit: str) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(done, total)`` callback drawing a tqdm bar (when tqdm is installed and wanted)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    try:
        from tqdm import tqdm
    except ImportError:
        enabled = False
    if not enabled:
        yield None
        return
    bar: Any = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit=unit, unit_scale=True, file=sys.stderr)
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


_PROGRESS = click.option("--progress/--no-progress", default=None,
                         help="Show a progress bar (default: when stderr is a terminal and tqdm is installed).")
