"""Every code block in README.md is executed or checked, so the README cannot rot (and the
command lines of the pages under docs/ are parsed too).

* every ``python`` block runs alone, in a fresh interpreter of its own (a reader copies one
  block, not the page), with the paths ``/data/`` and ``/tmp/`` and ``tempfile``'s directory
  pointed into a temporary directory; a line ``print(...)  # -> TEXT`` must print TEXT (in
  order). A block that imports an optional extra that is not installed is skipped, naming it.
* ``sh`` lines that start with ``mmreplay`` are parsed by the real click command (every option
  must exist and its value must parse); synopsis lines (with ``[...]`` or CAPITAL placeholders)
  only need their subcommand to exist. ``python -m mmreplay --help`` is run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from mmreplay.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


# the guide's other pages: their command lines are parsed too (their python is not run)
PAGES = ("README.md", "docs/results.md", "docs/guarantees.md", "docs/integrations.md")


def blocks(lang: str, pages: tuple[str, ...] = ("README.md",)) -> list[str]:
    return [body for page in pages for kind, body in FENCE.findall((ROOT / page).read_text()) if kind == lang]


def _paths(text: str, tmp: Path) -> str:
    return text.replace("/data/", f"{tmp}/data/").replace("/tmp/", f"{tmp}/")


# the optional extras (pyproject.toml) a block may import: module -> extra
EXTRAS = {"stable_baselines3": "sb3", "torchrl": "torchrl", "tensordict": "torchrl", "minari": "minari",
          "ray": "ray", "matplotlib": "plot", "tensorboard": "tensorboard", "ale_py": "atari", "cv2": "atari",
          "minatar": "minatar", "mujoco": "mujoco"}
IMPORT = re.compile(r"^\s*(?:from|import)\s+(\w+)", re.M)
EXPECT = re.compile(r"^\s*print\(.*#\s*->\s*(.+?)\s*$", re.M)


def python_blocks() -> list[tuple[str, str]]:
    """``(id, code)`` of each python block of the README; the id names the section it is in."""
    text, out, heading = (ROOT / "README.md").read_text(), [], "top"
    for m in re.finditer(r"^(#+) ([^\n]+)$|" + FENCE.pattern, text, re.S | re.M):
        if m.group(1):
            heading = re.sub(r"\W+", "-", m.group(2).split(":")[0]).lower()[:24].strip("-")
        elif m.group(3) == "python":
            out.append((f"{len(out) + 1}-{heading}", m.group(4)))
    return out


def missing_extras(code: str) -> list[str]:
    import importlib.util

    return sorted({f"{mod} (pip install 'mmreplay[{EXTRAS[mod]}]')" for mod in IMPORT.findall(code)
                   if mod in EXTRAS and importlib.util.find_spec(mod) is None})


def test_every_python_block_is_found():
    found = python_blocks()
    assert len(found) == len(blocks("python")) >= 10 and all("mmreplay" in code for _, code in found)


@pytest.mark.slow
@pytest.mark.parametrize("code", [c for _, c in python_blocks()], ids=[i for i, _ in python_blocks()])
def test_python_block_runs_alone(code, tmp_path):
    if missing := missing_extras(code):
        pytest.skip(f"needs {', '.join(missing)}")
    (tmp_path / "data").mkdir()
    script = tmp_path / "block.py"
    script.write_text(_paths(code, tmp_path))
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(filter(None, (
        str(ROOT), os.environ.get("PYTHONPATH"))))}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"this README block fails when run alone:\n{code}\n{out.stderr[-3000:]}"
    printed = iter(out.stdout.splitlines())
    for want in EXPECT.findall(code):  # each in order, on a line of its own
        assert any(line.strip() == want for line in printed), (
            f"the README says `{want}` is printed; the block printed:\n{out.stdout}")


def _is_synopsis(args: list[str]) -> bool:
    return any("[" in a or a.isupper() or "..." in a for a in args[1:])


def test_sh_blocks_parse_with_the_real_cli(tmp_path):
    lines = [ln.split(" # ")[0].strip() for b in blocks("sh", PAGES) for ln in b.splitlines()]
    commands = [shlex.split(ln) for ln in lines if ln.startswith("mmreplay ")]
    assert len(commands) >= 5
    for args in commands:
        name, rest = args[1], args[2:]
        ctx = main.make_context("mmreplay", [name], resilient_parsing=True)
        cmd = main.get_command(ctx, name)
        assert cmd is not None, f"the guide uses `mmreplay {name}`, which does not exist"
        if _is_synopsis(args) or "--help" in rest:
            continue
        try:
            cmd.make_context(name, [_paths(a, tmp_path) for a in rest], parent=ctx)
        except click.BadParameter as exc:
            if "does not exist" not in str(exc):  # a path the example names but this test does not make
                pytest.fail(f"guide line `{' '.join(args)}` does not parse: {exc}")
        except click.UsageError as exc:  # pragma: no cover - the message says which line
            pytest.fail(f"guide line `{' '.join(args)}` does not parse: {exc}")
    if any(ln.startswith("python -m mmreplay --help") for ln in lines):
        out = subprocess.run([sys.executable, "-m", "mmreplay", "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "collect" in out.stdout


def test_install_lists_every_extra():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    text = (ROOT / "README.md").read_text()
    install = text[text.index("## Install\n"):text.index("\n## ", text.index("## Install\n") + 1)]
    assert set(re.findall(r"^\| `([\w-]+)` \|", install, re.M)) == set(extras)
    assert "pip install -e ." in install


def test_shell_completion_lines_give_a_completion_script():
    lines = "\n".join(ln for b in blocks("sh") for ln in b.splitlines())
    shells = re.findall(r"_MMREPLAY_COMPLETE=(\w+)_source mmreplay\b", lines)
    assert sorted(shells) == ["bash", "fish", "zsh"]
    for shell in shells:  # as the `mmreplay` console script runs it
        out = subprocess.run([sys.executable, "-c", "from mmreplay.cli.main import main; main(prog_name='mmreplay')"],
                             env={**os.environ, "_MMREPLAY_COMPLETE": f"{shell}_source"},
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "_mmreplay_completion" in out.stdout, out.stderr


def test_plain_zarr_recipe_leaves_out_an_episode_holding_a_masked_row(tmp_path):
    """The README's plain-zarr block, run on an archive whose store had a damaged row: the row is
    archived masked, and the recipe's ``complete`` episodes are every ended episode but its."""
    import numpy as np

    import mmreplay
    from mmreplay.archive import export_archive

    (code,) = [b for b in blocks("python") if "g = zarr.open_group(archive" in b]
    recipe = "import numpy as np\nimport zarr\n" + code[code.index("g = zarr.open_group(archive"):]  # past its setup
    path = tmp_path / "s"
    with mmreplay.create_store(path, mmreplay.Schema.transition(obs_shape=(4,), obs_dtype=np.float32),
                               capacity=10_000, segment_records=64) as s:
        t = np.arange(128, dtype=np.float32)  # one lane, episodes of 13 steps; obs (t, 1, 2, 3): (1, 2, 3) never zeros
        with s.writer(lanes=1) as w:
            w.add_batch(obs=np.stack([t, t * 0 + 1, t * 0 + 2, t * 0 + 3], 1)[:, None],
                        action=t.astype(np.int64)[:, None], reward=t[:, None],
                        terminated=(t % 13 == 12)[:, None], truncated=np.zeros((128, 1), bool))
        layout = s.layout
    with open(sorted((path / "segments").glob("*.seg"))[0], "r+b") as fh:  # row 20's obs: its checksum fails
        fh.seek(layout.column("obs").offset + 20 * layout.record_bytes)
        fh.write(b"\xff" * 4)
    assert export_archive(path, tmp_path / "cartpole.zarr").damaged_rows == 1
    ns: dict[str, object] = {"archive": str(tmp_path / "cartpole.zarr")}
    exec(compile(recipe, "README.md", "exec"), ns)  # noqa: S102 - the README's own code
    episode, masked, complete = ns["episode"], ns["masked"], ns["complete"]
    assert np.flatnonzero(masked).tolist() == [20]
    ended = np.intersect1d(episode[ns["is_first"]], episode[ns["is_last"]])  # what the recipe took before
    assert episode[20] in ended and episode[20] not in complete
    assert sorted(complete.tolist()) == sorted(set(ended.tolist()) - {int(episode[20])}) and len(complete) >= 8
    assert (ns["obs"][np.isin(episode, complete), 1:] != 0).all()  # no zeroed row in a complete episode
