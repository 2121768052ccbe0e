from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import step

from mmreplay.cli.main import main


def test_info_human_and_json(store):
    with store.writer(lanes=2) as w:
        for t in range(20):
            w.add(**step(2, t, term=[t == 5, False]))
    path = str(store.path)
    store.close()
    r = CliRunner().invoke(main, ["info", path])
    assert r.exit_code == 0, r.output
    assert "rows         40" in r.output and "transitions  37" in r.output and "reward" in r.output
    assert "writers      1 (ids 0)" in r.output  # a count, then the ids (it read like a count before)
    r = CliRunner().invoke(main, ["info", path, "--json"])
    data = json.loads(r.output)
    assert (data["rows"], data["transitions"], data["episodes"], data["writers"]) == (40, 37, 1, [0])
    assert data["segments"] == 2 and data["bytes_on_disk"] >= 2 * data["segment_bytes"]


def test_info_on_missing_or_corrupt_store_is_one_line(tmp_path, store):
    r = CliRunner().invoke(main, ["info", str(tmp_path / "nope")])
    assert r.exit_code == 1
    assert r.output.startswith("Error: StoreNotFoundError") and "Traceback" not in r.output
    manifest = store.path / "STORE.json"
    store.close()
    for m in (manifest, store.path / "STORE.copy.json"):  # both copies (one damaged copy costs nothing)
        m.write_text(m.read_text().replace('"capacity": 10000', '"capacity": 10001'))
    r = CliRunner().invoke(main, ["info", str(store.path)])
    assert r.exit_code == 1 and "CorruptStoreError" in r.output and "checksum" in r.output


def test_bad_flags_exit_2():
    r = CliRunner().invoke(main, ["info", "--no-such-flag", "x"])
    assert r.exit_code == 2


def test_python_dash_m_and_help_does_not_import_torch():
    code = "import sys, runpy; sys.argv=['mmreplay','--help']\ntry:\n runpy.run_module('mmreplay', run_name='__main__')\nexcept SystemExit: pass\nprint('TORCH' if 'torch' in sys.modules else 'NOTORCH')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Usage: mmreplay" in out.stdout and "NOTORCH" in out.stdout


def test_collect_and_train_read_their_options_in_one_spec_builder(tmp_path):
    """``mmreplay collect`` builds its EnvSpec, WriterSpec, CollectSpec (and ShipSpec with --ray) in
    one place from the parsed options; ``mmreplay train`` its TrainConfig."""
    from mmreplay.cli.collect import collect_cmd, collect_specs
    from mmreplay.cli.train import train_cmd, train_config

    store = str(tmp_path / "s")
    ctx = collect_cmd.make_context("collect", ["CartPole-v1", "--store", store, "--steps", "10", "--autoreset",
                                               "same-step", "--max-episode-steps", "50", "--workers", "0", "--ray",
                                               "--policy", "eps-greedy:p.pt:0.3", "--durability", "batch"])
    opts = dict(ctx.params)
    env, writer, run, ship = collect_specs(opts.pop("env_id"), opts)
    assert (env.env, env.autoreset_mode, env.max_episode_steps) == ("CartPole-v1", "same_step", 50)
    assert (writer.store, writer.durability, writer.segment_records) == (store, "batch", None)
    assert run.workers == 1 and run.steps == 10 and run.policy.epsilon == 0.3  # --ray: at least one actor
    assert ship is not None and ship.archive_url == store + ".archive" and ship.address is None
    ctx = collect_cmd.make_context("collect", ["CartPole-v1", "--store", store, "--steps", "10", "--workers", "0"])
    opts = dict(ctx.params)
    assert collect_specs(opts.pop("env_id"), opts)[3] is None
    ctx = train_cmd.make_context("train", ["ALE/Pong-v5", "--atari", "--store", store, "--steps", "100"])
    opts = dict(ctx.params)
    opts.pop("quiet")
    cfg = train_config(opts.pop("env_id"), opts)
    assert cfg.atari and cfg.algo.batch_size == 32 and cfg.steps == 100 and cfg.env_spec().atari


@pytest.mark.parametrize("argv, lib", [
    (["ALE/Pong-v5", "--atari", "--steps", "100"], {"env_id": "ALE/Pong-v5", "atari": True, "steps": 100}),
    (["MinAtar/Breakout-v1", "--steps", "100"], {"env_id": "MinAtar/Breakout-v1", "steps": 100}),
    (["CartPole-v1", "--lr", "0.001"], {"env_id": "CartPole-v1", "learning_rate": 0.001}),
    (["--offline", "--algo", "td3bc", "--eval-env", "Hopper-v5"],
     {"offline": True, "algo": "td3bc", "eval_env": "Hopper-v5"}),
])
def test_the_cli_and_the_library_make_the_same_run_of_the_same_inputs(tmp_path, argv, lib):
    """The preset is picked in the library (``mmreplay.train.config_for``): the config the CLI makes
    of its options is the one a Python caller gets for the same inputs, field by field (what
    config.json holds)."""
    from dataclasses import asdict

    from mmreplay.cli.train import train_cmd, train_config
    from mmreplay.train import config_for

    store = str(tmp_path / "s")
    opts = dict(train_cmd.make_context("train", [*argv, "--store", store]).params)
    opts.pop("quiet")
    cli = train_config(opts.pop("env_id"), opts)
    env = lib.pop("env_id", None)
    assert asdict(cli) == asdict(config_for(env, store=store, **lib))


def test_train_help_says_the_default_each_preset_applies_written_from_the_presets():
    """No default is typed twice: the bracketed defaults in ``mmreplay train --help`` come from the
    presets (``mmreplay.train.config_for`` per env family)."""
    from mmreplay.cli.train import preset_defaults
    from mmreplay.train import config_for

    out = " ".join(CliRunner().invoke(main, ["train", "--help"], terminal_width=1000).output.split())
    fams = [dict(family="classic"), dict(family="atari"), dict(family="minatar"), dict(family="box", algo="td3bc")]
    for field, flag in (("steps", "--steps"), ("eval_every", "--eval-every"), ("learning_starts", "--learning-starts"),
                        ("batch_size", "--batch-size"), ("capacity", "--capacity")):
        shown = preset_defaults(field)
        assert shown is not None and shown in f"{out}", (flag, shown)
        assert f"{flag} INTEGER" in out
        values = {config_for(**kw).flat().get(field) for kw in fams} - {None}
        assert len(values) > 1 and all(f"{v:,}" in shown for v in values), (shown, values)
    assert preset_defaults("eval_every") == "[10,000; box 5,000; atari 250,000; minatar 50,000]"
    assert preset_defaults("target_update_interval") == "[128; offline 1,000; atari 1,000; minatar 1,000]"


def test_collect_options_that_cannot_apply_to_an_existing_store_are_said_in_their_terms(tmp_path, monkeypatch):
    """``--segment-records`` other than the store's: a usage error naming the flag (exit 2), before
    any worker starts; ``--capacity`` given for an existing store: a note that the store keeps its
    own; more ``--workers`` than cores: a note."""
    import os

    store = str(tmp_path / "s")
    base = ["collect", "CartPole-v1", "--store", store, "--steps", "20", "--seed", "0", "--no-progress"]
    r = CliRunner().invoke(main, [*base, "--workers", "0"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, [*base, "--workers", "0", "--segment-records", "5000"])
    assert r.exit_code == 2 and "--segment-records" in r.output and "rows per segment" in r.output, r.output
    assert "SchemaError" not in r.output
    r = CliRunner().invoke(main, [*base, "--workers", "0", "--capacity", "10"])
    assert r.exit_code == 0 and "note: --capacity applies to a new store" in r.output and "1,000,000" in r.output, (
        r.output)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    r = CliRunner().invoke(main, [*base, "--workers", "2"])
    assert r.exit_code == 0 and "note: --workers 2 on 1 core(s)" in r.output, r.output


@pytest.mark.parametrize("argv, flag", [(["--lr", "-1"], "--learning-rate"), (["--gamma", "1.5"], "--gamma"),
                                        (["--exploration-fraction", "-0.5"], "--exploration-fraction")])
def test_a_bad_train_value_is_a_usage_error_in_the_flags_name(tmp_path, argv, flag):
    """The config's checks say the option, exit 2 (as click's own type and range checks), before
    anything is made."""
    r = CliRunner().invoke(main, ["train", "CartPole-v1", "--store", str(tmp_path / "s"), *argv])
    assert r.exit_code == 2 and f"Invalid value for {flag}:" in r.output, r.output
    assert "_" not in r.output.splitlines()[-1].split(":")[1], r.output  # no config field name
    assert not (tmp_path / "s").exists() and not (tmp_path / "runs").exists()
