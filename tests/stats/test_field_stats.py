"""field_stats: streaming mean / std over a store's and an archive's transitions equal numpy's over
the same rows; the cache is keyed by the rows (more rows recompute) and lives beside a writable
store or in the user's cache directory."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mmreplay
from mmreplay.stats import fields as stats_mod
from mmreplay.stats.fields import CACHE_NAME, field_stats


def _fill(store, seed: int, steps: int, lanes: int = 3) -> None:
    rng = np.random.default_rng(seed)
    with store.writer(lanes=lanes) as w:
        for t in range(steps):
            ended = rng.random(lanes) < 0.05
            w.add(obs=rng.normal(t % 7, 1 + t % 3, (lanes, 3)).astype(np.float32),
                  action=rng.integers(0, 4, lanes), reward=rng.normal(size=lanes).astype(np.float32),
                  terminated=ended & (rng.random(lanes) < 0.5), truncated=ended)
        w.close(last_obs=np.full((lanes, 3), 99.0, np.float32))


def _numpy(store, field: str = "obs") -> np.ndarray:
    ids = store.transition_ids()
    return store.rows(field, ids).astype(np.float64)


def test_store_stats_equal_numpy_and_cache_follows_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    schema = mmreplay.Schema.transition(obs_shape=(3,), obs_dtype=np.float32)
    store = mmreplay.create_store(tmp_path / "s", schema, capacity=100_000, segment_records=256)
    _fill(store, 0, 400)
    store.refresh()
    x = _numpy(store)
    st = field_stats(store, "obs", chunk_rows=100)  # several segments, several chunks each
    assert st.count == len(x) and len(x) > 1000
    assert not np.any(x == 99.0) or st.max.max() < 99.0  # final observations are not counted
    np.testing.assert_allclose(st.mean, x.mean(0), rtol=1e-12)
    np.testing.assert_allclose(st.std, x.std(0), rtol=1e-10)
    np.testing.assert_array_equal(st.min, x.min(0))
    np.testing.assert_array_equal(st.max, x.max(0))
    cached = json.loads((tmp_path / "s" / CACHE_NAME).read_text())["obs"]
    assert cached["count"] == st.count and cached["key"] == st.key
    # the cache is read back (a tampered entry with the same key is what comes back) ...
    cached["mean"] = [7.0, 7.0, 7.0]
    (tmp_path / "s" / CACHE_NAME).write_text(json.dumps({"obs": cached}))
    assert field_stats(store).mean.tolist() == [7.0, 7.0, 7.0]
    # ... until the rows change: more rows, a new key, statistics computed again
    _fill(store, 1, 50)
    store.refresh()
    st2 = field_stats(tmp_path / "s")
    x2 = _numpy(store)
    assert st2.key != st.key and st2.count == len(x2) > len(x)
    np.testing.assert_allclose(st2.mean, x2.mean(0), rtol=1e-12)
    a = field_stats(store, "action", cache=False)
    np.testing.assert_allclose(a.mean, _numpy(store, "action").mean(0), rtol=1e-12)
    with pytest.raises(ValueError, match="`field`='nope'"):
        field_stats(store, "nope")
    store.close()


def test_read_only_store_caches_in_user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    schema = mmreplay.Schema.transition(obs_shape=(3,), obs_dtype=np.float32)
    with mmreplay.create_store(tmp_path / "s", schema, capacity=10_000, segment_records=128) as store:
        _fill(store, 2, 100)
    monkeypatch.setattr(stats_mod, "_writable", lambda path: False)  # (root may write anywhere)
    st = field_stats(tmp_path / "s")
    files = list((tmp_path / "xdg" / "mmreplay" / "stats").iterdir())
    assert len(files) == 1 and files[0].name.startswith(mmreplay.open_store(tmp_path / "s").store_uuid.hex())
    assert f"-{st.key.split(':')[2]}-" in files[0].name  # keyed by store id and row count
    assert not (tmp_path / "s" / CACHE_NAME).exists()
    assert field_stats(tmp_path / "s").key == st.key


def test_archive_stats_equal_numpy(tmp_path, monkeypatch):
    pytest.importorskip("zarr")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    schema = mmreplay.Schema.transition(obs_shape=(3,), obs_dtype=np.float32)
    with mmreplay.create_store(tmp_path / "s", schema, capacity=100_000, segment_records=200) as store:
        _fill(store, 3, 300, lanes=2)
        store.refresh()
        x = _numpy(store)
        mmreplay.export_archive(store, tmp_path / "a.zarr")
    st = field_stats(tmp_path / "a.zarr", chunk_rows=64)
    assert st.count == len(x)
    np.testing.assert_allclose(st.mean, x.mean(0), rtol=1e-12)
    np.testing.assert_allclose(st.std, x.std(0), rtol=1e-10)
    assert field_stats(tmp_path / "a.zarr").key == st.key  # from the cache
    # a masked row (a repaired archive) is left out
    import zarr

    g = zarr.open_group(str(tmp_path / "a.zarr"), mode="a")
    n = g["is_last"].shape[0]
    episode, last = g["episode"][:], g["is_last"][:]
    keep = (episode != -1) & ~last
    bad = int(np.flatnonzero(keep)[5])
    mask = np.zeros(n, bool)
    mask[bad] = True
    if "masked" in g:  # the export writes the array (all False here: no damaged row)
        g["masked"][:n] = mask
    else:
        g.create_array("masked", data=mask, chunks=g["is_last"].chunks)
    # a tool that changes a chunk records its new crc32c in the chunk manifest (else readers leave it out)
    import crc32c

    man = g["chunk_crc32c"]
    R = g.attrs["segment_records"]
    o = bad // R
    man[o, man.attrs["columns"].index("masked")] = crc32c.crc32c(np.ascontiguousarray(mask[o * R : (o + 1) * R]))
    obs = g["fields/obs"][:].astype(np.float64)
    st2 = field_stats(tmp_path / "a.zarr")
    assert st2.count == len(x) - 1 and st2.key != st.key
    np.testing.assert_allclose(st2.mean, obs[keep & ~mask].mean(0), rtol=1e-12)
