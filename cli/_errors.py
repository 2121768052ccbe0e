"""One line for every user error: what is wrong and what to do, in CLI terms; no traceback.

:func:`friendly` wraps each command body. A user error (an ``MMReplayError``, an unknown env
id, a missing extra, an fsspec protocol without its package, a path that is a file, a
read-only or full filesystem, an object store (S3 and S3-compatible ones, through s3fs and
botocore) that refuses the credentials, has no such bucket or cannot be reached) becomes a
``click.ClickException``: exit code 1 and one line on stderr, ``Error: <what> (hint: <what to
do>)``; the archive functions name the archive URL in an object store's error themselves
(``mmreplay.archive.remote``). The hint names a command, an option or an environment variable,
never a Python call. Anything else is a bug and keeps its traceback. ``--debug`` (or
``MMREPLAY_DEBUG=1``) re-raises every error with its traceback. A collect worker's error reaches
the CLI as the exception the worker raised and is said the same way (:func:`worker_failure`).
"""

from __future__ import annotations

import errno
import functools
import os
import re
from typing import TYPE_CHECKING, Any, TypeVar

import click

import mmreplay.errors as E

if TYPE_CHECKING:
    from collections.abc import Callable

F = TypeVar("F", bound="Callable[..., Any]")

# hints in CLI terms, by error type (the library's own hints name Python calls)
_HINTS: list[tuple[type[BaseException], str]] = [
    (E.StoreNotFoundError, "check the path; `mmreplay collect ENV_ID --store PATH` or `mmreplay import` makes a store"),
    (E.StoreExistsError, "choose a new path, or add to the store with `mmreplay collect ENV_ID --store PATH`"),
    (E.ReadOnlyStoreError, "copy the store to a writable filesystem, or read it with `mmreplay info` / "
                           "`mmreplay train --offline`"),
    (E.FormatVersionError, "use the mmreplay version that wrote it, or `mmreplay export` it there and import it here"),
    (E.CorruptSegmentError, "run `mmreplay verify PATH --repair`"),
    (E.CorruptStoreError, "restore STORE.json from a copy; `mmreplay verify PATH` lists what else is damaged"),
    (E.WriterBusyError, "another process writes with that writer id; wait for it or use another --store"),
    (E.StoreLockedError, "another process is using the store; wait for it to finish or use another --store"),
    (E.EmptyStoreError, "add data first: `mmreplay collect ENV_ID --store PATH --steps N`"),
    (E.InvalidValueError, "a store refuses NaN and Inf: fix the env or the dataset that gave them"),
    (E.StoreFullError, "use a new --store with a larger --capacity"),
    (E.DiskFullError, "free disk space, or use a smaller --capacity"),
    (E.CorruptArchiveError, "export the store again into a new archive: `mmreplay export STORE --to zarr URL`"),
    (E.ArchiveError, "check the archive path or URL; `mmreplay export STORE --to zarr URL` makes one"),
    (E.RayNotLoopbackError, "start a Ray cluster yourself and pass --ray ADDRESS, or run without --ray"),
]

# a missing module -> the install line that brings it
_EXTRAS = {
    "ale_py": "pip install 'mmreplay[atari]'", "cv2": "pip install 'mmreplay[atari]'",
    "minatar": "pip install 'mmreplay[minatar]'", "minari": "pip install 'mmreplay[minari]'",
    "mujoco": "pip install 'mmreplay[mujoco]'", "MuJoCo": "pip install 'mmreplay[mujoco]'",
    "ray": "pip install 'mmreplay[ray]'", "matplotlib": "pip install 'mmreplay[plot]'",
    "tensorboard": "pip install 'mmreplay[tensorboard]'", "Box2D": "pip install 'gymnasium[box2d]'",
    "s3fs": "pip install s3fs", "gcsfs": "pip install gcsfs", "adlfs": "pip install adlfs",
}


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    return bool(os.environ.get("MMREPLAY_DEBUG")) or bool(root is not None and (root.obj or {}).get("debug"))


def _missing_extra(exc: BaseException) -> str | None:
    """The install line for an ImportError or gymnasium DependencyNotInstalled, if we know one."""
    name = getattr(exc, "name", None)
    text = str(exc)
    for mod, line in _EXTRAS.items():
        if name == mod or (name and name.startswith(mod + ".")) or f"'{mod}'" in text or f" {mod} " in f" {text} ":
            return line
    m = re.search(r"pip install ('[^']+'|\"[^\"]+\"|[\w.\[\]-]+)", text)
    return f"pip install {m.group(1)}" if m else None


def describe(exc: BaseException) -> tuple[str, str] | None:
    """``(message, hint)`` for a user error, ``None`` for anything else (a bug)."""
    if isinstance(exc, E.MMReplayError):
        msg = f"{type(exc).__name__}: {Exception.__str__(exc)}"  # without the library's Python-call hint
        if isinstance(exc, E.ObjectStoreError):  # (its hint names environment variables: CLI terms already)
            return msg, exc.hint
        if type(exc) is E.ArchiveError and "hint" in vars(exc):  # what to do about this archive, said where raised
            return msg, exc.hint
        for cls, hint in _HINTS:
            if isinstance(exc, cls):
                return msg, hint
        return msg, exc.hint
    from mmreplay.archive import object_store_error  # (an S3 error that left elsewhere than an archive call)

    remote = object_store_error(exc)
    if remote is not None:
        return remote
    mod = type(exc).__module__
    if mod.startswith("gymnasium.error"):
        kind = type(exc).__name__
        if kind == "DependencyNotInstalled":  # its own "run `pip install ...`" is the hint, not said twice
            first = re.sub(r",? *(run|try)? *`?pip install [^`]*`?\.?$", "", str(exc).splitlines()[0]).rstrip(" ,")
            return first, _missing_extra(exc) or "install the env's package"
        if kind in ("NameNotFound", "VersionNotFound", "NamespaceNotFound", "UnregisteredEnv", "DeprecatedEnv",
                    "Error"):
            return str(exc), "list env ids with `python -c \"import gymnasium; gymnasium.pprint_registry()\"`"
        return None
    if isinstance(exc, ImportError):
        line = _missing_extra(exc)
        return (str(exc).splitlines()[0], line) if line else None
    if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC,
                                                   errno.EDQUOT, errno.EEXIST, errno.ENOTDIR, errno.EISDIR,
                                                   errno.ENOENT, errno.ENAMETOOLONG):
        where = exc.filename or ""
        what = f"{where}: {exc.strerror}" if where else (exc.strerror or str(exc))
        hint = {errno.EROFS: "choose a path on a writable filesystem",
                errno.EACCES: "choose a path you may write to", errno.EPERM: "choose a path you may write to",
                errno.ENOSPC: "free disk space or choose another filesystem",
                errno.EDQUOT: "free disk space or choose another filesystem",
                errno.EEXIST: "choose a path that does not exist yet",
                errno.ENOTDIR: "a part of the path is a file: choose a directory path",
                errno.EISDIR: "the path is a directory: choose a file path",
                errno.ENOENT: "check the path", errno.ENAMETOOLONG: "choose a shorter path"}[exc.errno]
        return what, hint
    return None


def worker_failure(text: str, exc: BaseException | None) -> str:
    """A failed collect worker in one line: from the exception it raised (``CollectResult.exceptions``,
    pickled across the process boundary), a user error's message with its CLI hint; else (a bug, or a
    worker that died without raising) the last line of ``text``, its traceback or how it died."""
    found = describe(exc) if exc is not None else None
    if found is not None:
        return one_line(*found)
    return text.strip().splitlines()[-1] if text.strip() else "unknown error"


def one_line(message: str, hint: str | None) -> str:
    """``message (hint: ...)`` on one line."""
    text = " ".join(message.split())
    return f"{text} (hint: {hint})" if hint else text


def friendly(fn: F) -> F:
    """Run a command body; a user error becomes a one-line ``ClickException`` (exit 1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit,
                KeyboardInterrupt):
            raise
        except Exception as exc:
            found = None if _debug() else describe(exc)
            if found is None:
                raise
            raise click.ClickException(one_line(*found)) from None

    return wrapper  # type: ignore[return-value]
