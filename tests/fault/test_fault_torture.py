"""The torture test (issue 3): 100 rounds of several writer processes appending while a sampler
process checks every row it draws; each round one writer is killed with SIGKILL at a random
moment. After each round the store is reopened and every visible row is checked exactly:
acknowledged rows are never lost, no torn row is ever returned, no duplicate, no hole. Writers
fork from a server that imported mmreplay once (``fork_server``)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _children import SCHEMA, piped_writer
from test_fault_kill import assert_prefix, visible_rows

import mmreplay

CHILD = str(Path(__file__).resolve().parents[1] / "_children.py")
ROUNDS = 100
WRITERS = 3


def fork_server() -> multiprocessing.context.BaseContext:
    """A multiprocessing context whose processes fork from a server that has imported mmreplay
    once: a writer starts in milliseconds, not the ~0.4 s of a fresh interpreter (3 of them a
    round, 100 rounds). Each is still its own process, killed with SIGKILL."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["numpy", "mmreplay", "_children"])
    return ctx


@pytest.mark.slow
def test_torture_kill9_writers_while_sampling(tmp_path):
    path = tmp_path / "s"
    mmreplay.create_store(path, SCHEMA, capacity=4000, segment_records=128).close()
    rng = np.random.default_rng(2026)
    ctx = fork_server()
    acked_total: dict[int, int] = {}
    sampler = subprocess.Popen([sys.executable, CHILD, "sampler", str(path), "3600"], stdout=subprocess.PIPE, text=True)
    try:
        for rnd in range(ROUNDS):
            keys = [rnd * WRITERS + i + 1 for i in range(WRITERS)]
            procs, acks = {}, {}
            for k in keys:
                acks[k], send = ctx.Pipe(duplex=False)
                procs[k] = ctx.Process(target=piped_writer, args=(str(path), k, 600, send))
                procs[k].start()
                send.close()  # the child's copy is the only writer left: EOF when it exits or dies
            victim = keys[int(rng.integers(WRITERS))]
            target = int(rng.integers(0, 600))
            acked = 0
            while acked < target:  # follow the victim's acknowledgements, then kill it mid-flight
                try:
                    acks[victim].recv()
                except EOFError:
                    break
                acked += 1
            time.sleep(float(rng.uniform(0, 0.003)))
            procs[victim].kill()
            for k, p in procs.items():
                rest = count_acks(acks[k])
                acked_total[k] = (acked if k == victim else 0) + rest
                p.join(timeout=120)
                assert k == victim or p.exitcode == 0
            assert sampler.poll() is None, sampler.stdout.read()  # the sampler never saw a bad row
            s = mmreplay.open_store(path, mode="a")  # recovery of the killed writer
            assert s.verify() == []
            s.close()
            rows = visible_rows(path)  # checks every visible row's content
            for k in keys:
                assert_prefix(rows.get(k, np.zeros(0, np.int64)), acked_total[k], evicted_ok=True)
    finally:
        sampler.terminate()
        out = sampler.communicate()[0].split("\n")
    counts = [int(line.split()[1]) for line in out if line.startswith("ok ")]
    assert counts and counts[-1] >= 200, out[-3:]  # the sampler really drew batches throughout


def count_acks(conn) -> int:
    """The acknowledgements still to be read on ``conn``, up to its end."""
    n = 0
    try:
        while True:
            conn.recv()
            n += 1
    except EOFError:
        return n
    finally:
        conn.close()
