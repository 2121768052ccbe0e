"""The crash-state explorer at full size: every state a crash may leave (``mmreplay.testing.crash``).

Records writer sessions (several segments, an eviction, a flush and a close) with each durability
level and with two lanes published in commit groups of three, builds every distinct state a crash
after each persisting call may leave (kill -9; power loss back to the last sync; each pending page
lost, stale or zeroed; each pending size, append or directory change lost or cut), and checks every
one: a read-only open with every sampler and view against a reference store, a writable open,
``verify --repair`` twice, ``verify`` and ``info --json``. Then, from a sample of those states,
records recovery and repair themselves and checks every state a crash in the middle of them may
leave. The test suite checks a seeded sample of ~580 states; this checks them all:

    python benchmarks/crash_states.py                    # every session, every state (~25 min)
    python benchmarks/crash_states.py --sessions segment --recovery-bases 50

It prints, per session, the operations recorded, the distinct states by kind, the states that broke
an invariant (the target is 0; the first few are named), the rows promised durable that every state
kept, and the rows the states' files showed that were reported when not served.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from click.testing import CliRunner

from mmreplay.cli.main import main as cli
from mmreplay.testing import crash

SESSIONS = {
    "segment": {"durability": "segment"},
    "batch": {"durability": "batch"},
    "process": {"durability": "process"},
    "lanes": {"durability": "segment", "lanes": 2, "publish_rows": 3, "steps": 40},
}


def run_cli(args: list[str]) -> tuple[int, str, BaseException | None]:
    r = CliRunner().invoke(cli, args)
    return r.exit_code, r.output, None if isinstance(r.exception, SystemExit) else r.exception


def check_all(ck: crash.Checker, states: list[crash.State], work: Path) -> dict[str, object]:
    """Check every state; the figures."""
    fails: list[str] = []
    durable = shown = reported = 0
    for i, st in enumerate(states):
        try:
            res = ck.check(st, work, seed=i, cli=run_cli)
        except AssertionError as exc:
            fails.append(str(exc).splitlines()[0][:300])
            continue
        durable += res.durable
        shown += res.shown_not_served
        reported += res.reported
    return {"states": len(states), "by_kind": dict(Counter(s.label for s in states)), "failures": len(fails),
            "first_failures": fails[:5], "durable_rows_kept": durable, "shown_rows_not_served": shown,
            "rows_reported": reported}


def run_session(name: str, root: Path, recovery_bases: int) -> dict[str, object]:
    t0 = time.perf_counter()
    rec = crash.record_session(root / name, **SESSIONS[name])
    states = rec.recorder.session_states()
    out: dict[str, object] = {"session": name, "operations": len(rec.recorder.snaps)}
    with crash.Checker(rec) as ck:
        out["crash"] = check_all(ck, states, root / "work")
        if recovery_bases:
            bases = crash.stratified([s for s in states if s.label != "kill-9"], recovery_bases, seed=0)
            mid = [st for b in bases for st in ck.recovery_states(b, root / "recovering")]
            out["recovery_bases"] = len(bases)
            out["crash_during_recovery"] = check_all(ck, mid, root / "work")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", nargs="+", default=list(SESSIONS), choices=list(SESSIONS))
    ap.add_argument("--recovery-bases", type=int, default=100,
                    help="states whose recovery and repair are recorded and crashed in turn (per session)")
    ap.add_argument("--dir", type=Path, default=None, help="work directory (a temporary one by default)")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="mmreplay-crash-"))
    try:
        for name in args.sessions:
            res = run_session(name, root, args.recovery_bases)
            print(json.dumps(res), flush=True)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
