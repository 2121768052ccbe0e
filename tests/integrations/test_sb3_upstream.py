"""Stable-Baselines3's own ``tests/test_buffers.py``, run with ``MMReplayBuffer`` in place of SB3's
``ReplayBuffer`` and ``DictReplayBuffer``.

SB3's file is not copied into this repository: ``fetch_sb3_tests.py`` (run by ``make test`` before
the suite) fetches the stable-baselines3 source distribution of the installed version from the
package index once and caches the file under the virtual environment
(``<sys.prefix>/share/mmreplay-test-cache/``); the tests only read that cache, so they talk to
nothing but loopback. When it could not be fetched, the whole module is skipped with the reason.

The file runs as SB3 wrote it, no assertion changed: its ``from stable_baselines3.common.buffers
import ...`` hands it two ``MMReplayBuffer`` subclasses named ``ReplayBuffer`` and
``DictReplayBuffer`` whose only change is a fresh store ``path`` (under the case's ``tmp_path``) for
each construction. Its ``RolloutBuffer`` cases (on-policy buffers, which mmreplay does not replace)
are skipped, and so are its CUDA cases on a machine without CUDA (as SB3 skips them).
"""

from __future__ import annotations

import builtins
import importlib.metadata
import sys
import types
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("stable_baselines3")

import stable_baselines3.common.buffers as sb3_buffers  # noqa: E402

from mmreplay.integrations.sb3 import MMReplayBuffer  # noqa: E402

SB3_VERSION = importlib.metadata.version("stable-baselines3")
CACHE = Path(sys.prefix) / "share" / "mmreplay-test-cache" / f"stable-baselines3-{SB3_VERSION}"


def _cached() -> Path:
    """SB3's ``tests/test_buffers.py`` of the installed version, as ``fetch_sb3_tests.py`` cached it
    (``make test`` runs that before the suite: the tests talk to nothing but loopback)."""
    target = CACHE / "test_buffers.py"
    if not target.exists():
        why = (CACHE / "SKIP").read_text() if (CACHE / "SKIP").exists() else "not fetched yet"
        pytest.skip(f"SB3's test file for stable-baselines3=={SB3_VERSION} is not cached ({why}): "
                    "`python tests/integrations/fetch_sb3_tests.py` fetches it", allow_module_level=True)
    return target


# -- the stand-ins SB3's file imports --------------------------------------------------------------
_case: dict[str, Any] = {"tmp": None, "built": []}


def _stand_in(name: str) -> type:
    """An ``MMReplayBuffer`` subclass called ``name`` that gives each construction a fresh store."""

    def __init__(self: MMReplayBuffer, *args: Any, **kwargs: Any) -> None:
        assert _case["tmp"] is not None, "constructed outside a test case"
        path = _case["tmp"] / f"store-{len(_case['built'])}"
        MMReplayBuffer.__init__(self, *args, path=path, **kwargs)
        _case["built"].append(self)

    return type(name, (MMReplayBuffer,), {"__init__": __init__, "__module__": __name__, "__qualname__": name})


ReplayBufferStandIn = _stand_in("ReplayBuffer")
DictReplayBufferStandIn = _stand_in("DictReplayBuffer")


def _load(path: Path) -> types.ModuleType:
    """SB3's test module, executed with the stand-ins where it imports SB3's replay buffers."""
    buffers = types.ModuleType(sb3_buffers.__name__)
    buffers.__dict__.update(vars(sb3_buffers))
    buffers.ReplayBuffer = ReplayBufferStandIn  # type: ignore[attr-defined]
    buffers.DictReplayBuffer = DictReplayBufferStandIn  # type: ignore[attr-defined]

    def __import__(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if name == sb3_buffers.__name__ and fromlist:
            return buffers
        return builtins.__import__(name, globals, locals, fromlist, level)

    module = types.ModuleType("sb3_upstream_test_buffers")
    module.__file__ = str(path)
    module.__dict__["__builtins__"] = {**vars(builtins), "__import__": __import__}
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


upstream = _load(_cached())
# the cases that build a replay buffer (test_buffer_dtypes builds SB3's RolloutBuffer beside it)
test_replay_buffer_normalization = upstream.test_replay_buffer_normalization
test_device_buffer = upstream.test_device_buffer
test_buffer_dtypes = upstream.test_buffer_dtypes


@pytest.fixture(autouse=True)
def _fresh_stores(request: pytest.FixtureRequest, tmp_path: Path):
    """Each case: its stores under its ``tmp_path``, closed at its end; RolloutBuffer-only cases skipped."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    if params.get("replay_buffer_cls") in (sb3_buffers.RolloutBuffer, sb3_buffers.DictRolloutBuffer):
        pytest.skip("an on-policy RolloutBuffer case: MMReplayBuffer does not replace SB3's rollout buffers")
    _case["tmp"], _case["built"] = tmp_path, []
    yield
    built, _case["tmp"], _case["built"] = _case["built"], None, []
    for b in built:
        b.close()


def test_the_cases_run_on_mmreplay(tmp_path):
    """The stand-ins SB3's file sees are MMReplayBuffers writing stores (not SB3's own buffers)."""
    assert upstream.ReplayBuffer is ReplayBufferStandIn and upstream.DictReplayBuffer is DictReplayBufferStandIn
    from gymnasium import spaces

    b = upstream.ReplayBuffer(10, spaces.Box(0, 1, (2,)), spaces.Discrete(2), device="cpu")
    assert isinstance(b, MMReplayBuffer) and (Path(b.path) / "STORE.json").exists()
    assert str(b.path).startswith(str(tmp_path))
