"""The store contract (``mmreplay.testing.StoreContract``) applied to every way of making a
store: created directly, rebuilt from a zarr archive (``open_archive``), and imported from a
Minari dataset (skipped without minari)."""

from __future__ import annotations

import pytest

import mmreplay
from mmreplay.archive import export_archive, open_archive
from mmreplay.testing import SCHEMA, StoreContract, write_episodes

SEGMENT_RECORDS = 16  # 120 rows in 8 segments: episodes cross segment boundaries


def created(path, episodes):
    store = mmreplay.create_store(path, SCHEMA, segment_records=SEGMENT_RECORDS)
    write_episodes(store, episodes)
    return store


class TestCreatedStore(StoreContract):
    def make_store(self, tmp_path, episodes):
        return created(tmp_path / "store", episodes)


class TestArchivedStore(StoreContract):
    """Exported to a zarr archive, then opened with ``open_archive`` (a local cache store)."""

    def make_store(self, tmp_path, episodes):
        src = created(tmp_path / "src", episodes)
        export_archive(src, tmp_path / "a.zarr", include_open=True)
        src.close()
        return open_archive(tmp_path / "a.zarr", tmp_path / "cache")


class TestMinariStore(StoreContract):
    """Exported as a Minari dataset, imported back into a new store (one writer session: other
    ids and lanes, the same episodes)."""

    @pytest.fixture(autouse=True)
    def minari_home(self, tmp_path, monkeypatch):
        pytest.importorskip("minari")
        pytest.importorskip("h5py")
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))

    def make_store(self, tmp_path, episodes):
        src = created(tmp_path / "src", episodes)
        mmreplay.export_minari(src, "mmreplay/contract/episodes-v0")
        src.close()
        mmreplay.import_minari("mmreplay/contract/episodes-v0", tmp_path / "back", segment_records=SEGMENT_RECORDS)
        return mmreplay.open_store(tmp_path / "back")

    def make_empty_store(self, tmp_path):
        pytest.skip("a Minari dataset holds at least one episode (export refuses an empty store)")
