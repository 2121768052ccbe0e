"""An archive's metadata counts its episodes by how they ended, as ``mmreplay info`` counts them in
the store, across incremental exports (a segment re-exported as it grew is counted again)."""

from __future__ import annotations

import mmreplay
from mmreplay.archive import export_archive


def _counts(store_path) -> dict[str, int]:
    with mmreplay.open_store(store_path) as s:
        info = s.info()
    return {k: info[f"episodes_{k}"] for k in ("terminated", "truncated", "cut", "incomplete")}


def test_the_archive_counts_episodes_as_info_does_across_incremental_exports(tmp_path):
    import zarr

    path, url = tmp_path / "s", tmp_path / "a.zarr"
    mmreplay.collect("CartPole-v1", path, 600, workers=0, seed=0, segment_records=256, progress=False)
    first = export_archive(path, url, include_open=True)
    assert first.episodes == _counts(path) and first.episodes["terminated"] > 0 and first.episodes["cut"] == 1
    mmreplay.collect("CartPole-v1", path, 600, workers=0, seed=1, progress=False)  # more rows, a new session
    second = export_archive(path, url, include_open=True)
    want = _counts(path)
    assert second.episodes == want and want["cut"] == 2, (second.episodes, want)
    attrs = zarr.open_group(str(url), mode="r").attrs
    assert attrs["episodes"] == want and attrs["episodes_uncounted"] == []
    assert sum(c["terminated"] for c in attrs["episode_ends"].values()) == want["terminated"]
