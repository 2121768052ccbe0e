"""Turn library errors into one-line click errors (exit 1, message plus hint, no traceback)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, TypeVar

import click

from mmreplay.core.errors import MMReplayError

if TYPE_CHECKING:
    from collections.abc import Callable

F = TypeVar("F", bound="Callable[..., Any]")


def friendly(fn: F) -> F:
    """Run a command body; an ``MMReplayError`` becomes a ``ClickException`` (exit 1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MMReplayError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None

    return wrapper  # type: ignore[return-value]
