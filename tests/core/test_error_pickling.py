"""Errors cross processes whole: every ``MMReplayError`` pickles with its type, message, hint and
fields (a collect worker sends the exception it raised to its parent)."""

from __future__ import annotations

import errno
import pickle

import pytest

import mmreplay.errors as E

CLASSES = [getattr(E, n) for n in E.__all__]


def test_the_hierarchy_is_listed_whole():
    import mmreplay.core.errors as core

    defined = {n for n, c in vars(core).items() if isinstance(c, type) and issubclass(c, core.MMReplayError)}
    assert defined == set(E.__all__)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("hint", [None, "do this instead"])
def test_every_error_pickles_with_its_message_and_hint(cls, hint):
    exc = cls("what went wrong", hint=hint)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls and back.args == exc.args and str(back) == str(exc)
    assert back.hint == (hint if hint is not None else cls.hint) and back.__dict__ == exc.__dict__


def test_fields_of_their_own_survive_pickling():
    seg = pickle.loads(pickle.dumps(E.CorruptSegmentError("bad rows", kind="rows")))
    assert seg.kind == "rows" and seg.hint == E.CorruptSegmentError.hint
    full = pickle.loads(pickle.dumps(E.DiskFullError("cannot allocate 8 bytes: File too large", err=errno.EFBIG)))
    assert (full.errno, full.strerror) == (errno.EFBIG, "cannot allocate 8 bytes: File too large")
    assert str(full) == str(E.DiskFullError("cannot allocate 8 bytes: File too large", err=errno.EFBIG))
    missing = E.StoreNotFoundError("no store at /x")
    missing.filename = "/x"
    back = pickle.loads(pickle.dumps(missing))
    assert back.filename == "/x" and str(back) == str(missing) and isinstance(back, FileNotFoundError)
