"""Model-based test: the store against a plain-Python list of rows per writer session and lane.

Random appends (single steps and time-major batches), episode ends by termination or truncation,
next-step autoresets, writer closes with and without a final observation, eviction at a small
capacity, and close/reopen. After every step: every row the store holds is a row the model holds,
byte for byte; the store's sampleable transitions are exactly the model's transitions whose two
rows survive; no row is lost beyond what the capacity allows.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import mmreplay

SCHEMA = mmreplay.Schema.transition(obs_shape=(3,), obs_dtype=np.float32)


class StoreMachine(RuleBasedStateMachine):
    @initialize(capacity=st.sampled_from([24, 10_000]), tmp=st.just(None))
    def setup(self, capacity, tmp):
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="mmreplay-stateful-")
        self.capacity = capacity
        self.store = mmreplay.create_store(f"{self.dir}/s", SCHEMA, capacity=capacity, segment_records=8)
        self.writer = None
        self.session = 0
        self.model: dict[tuple[int, int], list[dict]] = {}  # (session, lane) -> rows
        self.prev_done: list[bool] = []
        self.counter = 0

    def teardown(self):
        import shutil

        if getattr(self, "store", None) is not None:
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- writer lifecycle -------------------------------------------------------------------
    @precondition(lambda self: self.writer is None)
    @rule(lanes=st.integers(1, 3))
    def open_writer(self, lanes):
        self.session += 1
        self.writer = self.store.writer(lanes=lanes)
        self.lanes = lanes
        self.prev_done = [False] * lanes
        for lane in range(lanes):
            self.model[(self.session, lane)] = []

    def _rows(self, T, dones):
        """Build T steps of rows and the model's copy of them."""
        steps = []
        for t in range(T):
            obs, act, rew, term, trunc = [], [], [], [], []
            for lane in range(self.lanes):
                rows = self.model[(self.session, lane)]
                self.counter += 1
                kind = dones[t][lane]
                row = {
                    "obs": np.array([self.session, lane, len(rows)], np.float32),
                    "action": self.counter,
                    "reward": float(self.counter % 7),
                    "terminated": kind == 1,
                    "truncated": kind == 2,
                    "is_last": self.prev_done[lane],
                }
                self.prev_done[lane] = kind != 0
                rows.append(row)
                obs.append(row["obs"])
                act.append(row["action"])
                rew.append(row["reward"])
                term.append(row["terminated"])
                trunc.append(row["truncated"])
            steps.append({"obs": np.stack(obs), "action": np.array(act, np.int64),
                          "reward": np.array(rew, np.float32), "terminated": np.array(term),
                          "truncated": np.array(trunc)})
        return steps

    @precondition(lambda self: self.writer is not None)
    @rule(data=st.data())
    def add_step(self, data):
        dones = [data.draw(st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=self.lanes, max_size=self.lanes))]
        (s,) = self._rows(1, dones)
        self.writer.add(**s)

    @precondition(lambda self: self.writer is not None)
    @rule(data=st.data(), T=st.integers(0, 12))
    def add_batch(self, data, T):
        dones = [data.draw(st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=self.lanes, max_size=self.lanes))
                 for _ in range(T)]
        steps = self._rows(T, dones)
        if T == 0:
            batch = {f.name: np.zeros((0, self.lanes, *f.shape), f.dtype) for f in SCHEMA.fields}
        else:
            batch = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
        self.writer.add_batch(batch)

    @precondition(lambda self: self.writer is not None)
    @rule(final=st.booleans())
    def close_writer(self, final):
        if final:
            obs = []
            for lane in range(self.lanes):
                rows = self.model[(self.session, lane)]
                row = {"obs": np.array([self.session, lane, len(rows)], np.float32), "action": 0, "reward": 0.0,
                       "terminated": False, "truncated": False, "is_last": True}
                rows.append(row)
                obs.append(row["obs"])
            self.writer.close(last_obs=np.stack(obs))
        else:
            self.writer.close()
        self.writer = None

    @rule()
    def reopen(self):
        self.store.close()
        self.writer = None
        self.store = mmreplay.open_store(f"{self.dir}/s", mode="a")

    # -- checks ----------------------------------------------------------------------------
    @invariant()
    def matches_model(self):
        if not hasattr(self, "store"):
            return
        self.store.refresh()
        r = self.store.reader
        snap = r.snapshot
        present = {}
        for k in range(len(snap.segment_ids)):
            n = int(snap.committed[k])
            w = int(snap.windows[k])
            obs = r.columns["obs"][w, :n]
            for i in range(n):
                key = tuple(int(v) for v in obs[i])
                present[key] = (r.columns["action"][w, i], r.columns["reward"][w, i], r.columns["terminated"][w, i],
                                r.columns["truncated"][w, i], r.is_last[w, i])
        model_rows = {}
        model_trans = set()
        for (session, lane), rows in self.model.items():
            for i, row in enumerate(rows):
                key = (session, lane, i)
                model_rows[key] = row
                if not row["is_last"] and i + 1 < len(rows):
                    model_trans.add(key)
        for key, vals in present.items():
            row = model_rows[key]  # KeyError: the store holds a row the model never wrote
            assert vals == (row["action"], np.float32(row["reward"]), row["terminated"], row["truncated"],
                            row["is_last"]), key
        assert len(present) >= min(self.capacity, len(model_rows))
        if self.capacity >= 10_000:
            assert set(present) == set(model_rows)
        expect = {k for k in model_trans if k in present and (k[0], k[1], k[2] + 1) in present}
        ids = self.store.transition_ids()
        got = set()
        if len(ids):
            b = self.store.transitions(ids)
            for o, no in zip(b.obs, b.next_obs):
                key = tuple(int(v) for v in o)
                assert tuple(int(v) for v in no) == (key[0], key[1], key[2] + 1)
                got.add(key)
        assert got == expect
        if expect:
            b = mmreplay.UniformSampler(self.store, seed=0).sample(16)
            assert {tuple(int(v) for v in o) for o in b.obs} <= expect


StoreMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestStore = StoreMachine.TestCase
