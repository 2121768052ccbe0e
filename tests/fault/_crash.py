"""Shared by the crash-state tests (``test_crash_states_*.py``, one session each so that xdist's
``--dist loadfile`` spreads them over workers): run a seeded, stratified sample of a recorded
session's crash states through ``mmreplay.testing.crash.Checker`` and fail with the states that
break an invariant."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from click.testing import CliRunner

from mmreplay.cli.main import main as cli
from mmreplay.testing import crash


def run_cli(args: list[str]) -> tuple[int, str, BaseException | None]:
    """An ``mmreplay`` command through click's runner: exit code, output, and an exception other
    than the ``SystemExit`` of an exit code."""
    r = CliRunner().invoke(cli, args)
    return r.exit_code, r.output, None if isinstance(r.exception, SystemExit) else r.exception


def check_states(checker: crash.Checker, states: list[crash.State], work: Path) -> Counter:
    """Check every state; assert none failed (naming the first few); returns the states per label."""
    failures = []
    for i, st in enumerate(states):
        try:
            checker.check(st, work, seed=i, cli=run_cli)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, f"{len(failures)} of {len(states)} crash states fail: " + " | ".join(failures[:4])
    return Counter(st.label for st in states)
