"""The torture test (issue 3): 100 rounds of several writer processes appending while a sampler
process checks every row it draws; each round one writer is killed with SIGKILL at a random
moment. After each round the store is reopened and every visible row is checked exactly:
acknowledged rows are never lost, no torn row is ever returned, no duplicate, no hole."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _children import SCHEMA
from test_fault_kill import assert_prefix, visible_rows

import mmreplay

CHILD = str(Path(__file__).resolve().parents[1] / "_children.py")
ROUNDS = 100
WRITERS = 3


@pytest.mark.slow
def test_torture_kill9_writers_while_sampling(tmp_path):
    path = tmp_path / "s"
    mmreplay.create_store(path, SCHEMA, capacity=4000, segment_records=128).close()
    rng = np.random.default_rng(2026)
    acked_total: dict[int, int] = {}
    sampler = subprocess.Popen([sys.executable, CHILD, "sampler", str(path), "3600"], stdout=subprocess.PIPE, text=True)
    try:
        for rnd in range(ROUNDS):
            keys = [rnd * WRITERS + i + 1 for i in range(WRITERS)]
            procs = {k: subprocess.Popen([sys.executable, CHILD, "writer", str(path), str(k), "600"],
                                         stdout=subprocess.PIPE, text=True) for k in keys}
            victim = keys[int(rng.integers(WRITERS))]
            target = int(rng.integers(0, 600))
            acked = 0
            while acked < target:  # follow the victim's acknowledgements, then kill it mid-flight
                if not procs[victim].stdout.readline():
                    break
                acked += 1
            time.sleep(float(rng.uniform(0, 0.003)))
            procs[victim].kill()
            for k, p in procs.items():
                rest = len(p.stdout.read().split())
                acked_total[k] = (acked if k == victim else 0) + rest
                p.wait(timeout=120)
                assert k == victim or p.returncode == 0
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
