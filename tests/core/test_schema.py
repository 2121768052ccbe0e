from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from mmreplay import Field, InvalidValueError, Schema, SchemaError


def test_from_spaces_maps_every_supported_space():
    obs = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-1, 1, (2,), np.float32),
            "cam": gym.spaces.Box(0, 255, (4, 4), np.uint8),
            "inner": gym.spaces.Dict({"flag": gym.spaces.MultiBinary(3)}),
        }
    )
    s = Schema.from_spaces(obs, gym.spaces.MultiDiscrete([3, 4]))
    # gymnasium keeps Dict keys sorted
    assert s.names == ("obs/cam", "obs/inner/flag", "obs/pos", "action", "reward", "terminated", "truncated")
    assert s["obs/cam"].dtype == np.uint8 and s["obs/cam"].shape == (4, 4)
    assert s["obs/inner/flag"].shape == (3,)
    assert s["action"].shape == (2,)
    assert s.obs_names == ("obs/cam", "obs/inner/flag", "obs/pos")
    d = Schema.from_spaces(gym.spaces.Box(0, 1, (3,)), gym.spaces.Discrete(5))
    assert d["action"].dtype == np.int64 and d["action"].shape == ()
    with pytest.raises(SchemaError, match="not supported"):
        Schema.from_spaces(gym.spaces.Text(5), gym.spaces.Discrete(2))


def test_schema_roundtrips_and_hash_is_stable():
    s = Schema.transition((84, 84), np.uint8, extra=[Field("info/lives", np.int8)])
    again = Schema.from_json(s.to_json())
    assert again == s and again.hash == s.hash
    assert Schema.transition((84, 84), np.float32).hash != s.hash


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ([Field("a", np.float32), Field("a", np.int8)], "duplicate"),
        ([Field("is_last", np.bool_)], "reserved"),
        ([], "at least one"),
    ],
)
def test_bad_schemas_are_refused(fields, match):
    with pytest.raises(SchemaError, match=match):
        Schema(fields)


def test_field_refuses_object_and_big_endian_dtypes():
    with pytest.raises(SchemaError, match="fixed-size"):
        Field("x", np.dtype(object))
    with pytest.raises(SchemaError, match="big-endian"):
        Field("x", np.dtype(">f4"))


def _batch(n=4):
    return {
        "obs": np.zeros((n, 3), np.float32),
        "action": np.zeros(n, np.int64),
        "reward": np.zeros(n, np.float32),
        "terminated": np.zeros(n, bool),
        "truncated": np.zeros(n, bool),
    }


S = Schema.transition((3,), np.float32)


def test_validate_accepts_good_batch_and_reports_lead():
    out, lead = S.validate_batch(_batch(), None)
    assert lead == (4,)
    assert list(out) == list(S.names)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"obs": np.zeros((4, 2), np.float32)}, r"field 'obs': expected shape .* got \(4, 2\)"),
        ({"obs": np.zeros((4, 3), np.float64)}, r"field 'obs': expected dtype float32, got float64"),
        ({"action": np.zeros(4, np.float32)}, r"field 'action': expected dtype int64, got float32"),
        ({"reward": np.zeros(3, np.float32)}, r"field 'reward': expected leading shape \(4,\), got \(3,\)"),
        ({"extra": np.zeros(4)}, r"unexpected \['extra'\]"),
        ({"obs": np.array([object()] * 4)}, r"field 'obs'.*object"),
    ],
)
def test_validate_names_field_expected_and_got(change, match):
    b = {**_batch(), **change}
    with pytest.raises(SchemaError, match=match):
        S.validate_batch(b, None)


def test_missing_field_is_named():
    b = _batch()
    del b["truncated"]
    with pytest.raises(SchemaError, match=r"missing \['truncated'\]"):
        S.validate_batch(b, None)


def test_scalar_vs_batched_confusion():
    b = {k: v[0] for k, v in _batch().items()}  # one unbatched row given where lanes=4 expected
    with pytest.raises(SchemaError, match="leading shape"):
        S.validate_batch(b, (4,))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_policies(bad, caplog):
    b = _batch()
    b["reward"] = b["reward"].copy()
    b["reward"][2] = bad
    with pytest.raises(InvalidValueError, match=r"field 'reward' has a non-finite value .* at index \(2,\)"):
        S.validate_batch(b, None)
    S.validate_batch(b, None, nonfinite="allow")
    S.validate_batch(b, None, nonfinite="warn")
    assert "non-finite" in caplog.text


def test_large_finite_float32_values_are_not_mistaken_for_overflow():
    b = _batch()
    b["obs"] = np.full((4, 3), np.finfo(np.float32).max, np.float32)
    S.validate_batch(b, None)


def test_casts():
    b = _batch()
    b["obs"] = b["obs"].astype(np.float16)
    with pytest.raises(SchemaError, match="cast='safe' would accept it"):
        S.validate_batch(b, None)
    out, _ = S.validate_batch(b, None, cast="safe")
    assert out["obs"].dtype == np.float32
    b["obs"] = np.zeros((4, 3), ">f4")  # big-endian: swapped only with cast='safe'
    with pytest.raises(SchemaError):
        S.validate_batch(b, None)
    assert S.validate_batch(b, None, cast="safe")[0]["obs"].dtype == np.dtype("<f4")
    b["obs"] = np.zeros((4, 3), np.float64)
    with pytest.raises(SchemaError):
        S.validate_batch(b, None, cast="safe")
    assert S.validate_batch(b, None, cast="same_kind")[0]["obs"].dtype == np.float32
