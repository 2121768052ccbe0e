"""The train room by algorithm: each algorithm is one module and one registry line, nothing else
dispatches on an algorithm's name, a new algorithm registered from outside the package trains and
resumes through the library and through ``mmreplay train``, and a run's config is the same whether
the CLI or ``config_for`` made it."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

import mmreplay  # noqa: E402
from mmreplay.train import (  # noqa: E402
    algorithm_names,
    config_for,
    from_dict,
    get_algorithm,
    load_checkpoint,
    register_algorithm,
    resume_config,
    train,
)
from mmreplay.train.algos import Algorithm  # noqa: E402
from mmreplay.train.algos.dqn import QLearningConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ALGOS = ROOT / "mmreplay" / "train" / "algos"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


# -- the AST rule -------------------------------------------------------------------------------------
def _names_an_algorithm(node: ast.AST) -> bool:
    """``x.algo``, ``x.algo.name``, ``algo``, ``algo_name``, ``d["algo"]``, ``d.get("algo")``: an
    expression holding an algorithm (or its name)."""
    text = ast.unparse(node)
    return (isinstance(node, ast.Attribute) and (node.attr == "algo" or text.endswith(".algo.name"))) \
        or (isinstance(node, ast.Name) and node.id in ("algo", "algo_name")) \
        or (isinstance(node, ast.Subscript) and "'algo'" in ast.unparse(node.slice)) \
        or (isinstance(node, ast.Call) and text.split("(")[0].endswith(".get") and "'algo'" in text)


def _literals(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_literals(e) for e in node.elts)


def algorithm_dispatch(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, code)`` of every string literal equal to a registered name and every comparison of an
    algorithm (or its name) with string literals in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.Compare):
            ops = [node.left, *node.comparators]
            if any(_names_an_algorithm(o) for o in ops) and any(_literals(o) for o in ops):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Match) and _names_an_algorithm(node.subject):
            found.append((node.lineno, f"match {ast.unparse(node.subject)}"))
    return found


def test_outside_the_algorithms_modules_nothing_dispatches_on_an_algorithms_name():
    """Outside ``mmreplay/train/algos/`` (the algorithms' modules and the registry), no module of the
    package or the CLI spells a registered algorithm's name or compares an algorithm with a literal:
    what differs by algorithm is asked of its registry entry or its config."""
    names = set(algorithm_names())
    bad = []
    for p in sorted([*(ROOT / "mmreplay").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]):
        if p.is_relative_to(ALGOS):
            continue
        bad += [f"{p.relative_to(ROOT)}:{line}: {code}" for line, code in algorithm_dispatch(p.read_text(), names)]
    assert bad == [], "\n".join(bad)


def test_the_rule_finds_what_it_looks_for():
    names = {"dqn", "td3bc"}
    src = ("if cfg.algo == 'dqn': pass\nif cfg.algo.name in ('a', 'b'): pass\nx = {'td3bc': 1}\n"
           "match algo:\n    case _: pass\nif d.get('algo') != 'x': pass\nif kind == 'box': pass\n"
           "if saved['algo'] != other['algo']: pass\n")
    lines = sorted({line for line, _ in algorithm_dispatch(src, names)})
    assert lines == [1, 2, 3, 4, 6], lines  # not a kind, not two runtime names


# -- a toy algorithm, registered from here --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ToyConfig(QLearningConfig):
    """A toy: the Q network regressed on the one-step reward (no bootstrap)."""

    name: ClassVar[str] = "toy"
    PRESETS: ClassVar = {"offline": dict(learning_rate=5e-3)}

    toy_scale: float = 1.0
    """Multiplies the rewards the Q values are regressed on."""


def toy_loss(ln: Any, b: Any) -> tuple[Any, Any, None]:
    q_sa = ln.q_fwd(b.obs).float().gather(1, b.action.long().view(-1, 1)).squeeze(1)
    return torch.nn.functional.mse_loss(q_sa, ln.algo.toy_scale * b.reward.float()), q_sa, None


def _toy_learner(setup: Any) -> Any:
    from mmreplay.train import QLearner

    return QLearner.for_setup(setup, toy_loss, target=False)


@pytest.fixture()
def toy():
    register_algorithm(Algorithm("toy", ToyConfig, {"discrete": _toy_learner}, summary="a toy"))
    try:
        yield
    finally:
        from mmreplay.train import algos

        algos._REGISTRY.pop("toy", None)  # the test's own entry


@pytest.fixture(scope="module")
def cart(tmp_path_factory):
    path = tmp_path_factory.mktemp("toy") / "cart"
    mmreplay.collect("CartPole-v1", path, 400, workers=0, seed=0, progress=False)
    return path


def test_a_toy_algorithm_trains_and_resumes_through_the_library_and_the_cli(toy, cart, tmp_path):
    from click.testing import CliRunner

    from mmreplay.cli.main import main

    cfg = config_for(store=str(cart), offline=True, algo="toy", toy_scale=2.0, steps=30, eval_episodes=0,
                     run_dir=str(tmp_path / "lib"), tensorboard=False)
    assert cfg.algo == ToyConfig(learning_rate=5e-3, target_update_interval=1000, toy_scale=2.0)  # its preset
    res = train(cfg)
    assert res.updates == 30
    from mmreplay.train import read_metrics

    loss = read_metrics(tmp_path / "lib")["loss"]
    assert np.isfinite(loss[~np.isnan(loss)]).all() and (~np.isnan(loss)).any()
    with pytest.raises(ValueError, match=r"`cql_alpha` is not a setting of --algo toy \(it is cql's\)"):
        resume_config(tmp_path / "lib", steps=50, cql_alpha=0.5)  # never dropped in silence
    res = train(resume_config(tmp_path / "lib", steps=50))
    assert res.updates == 50
    saved = json.loads((tmp_path / "lib" / "config.json").read_text())
    assert saved["algo"]["name"] == "toy" and saved["algo"]["toy_scale"] == 2.0
    args = ["train", "--offline", "--store", str(cart), "--algo", "toy", "--steps", "30", "--eval-episodes", "0",
            "--run-dir", str(tmp_path / "cli"), "--no-tensorboard", "-q"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, [*args[:7], "40", *args[8:], "--resume"])
    assert r.exit_code == 0 and "40" in r.output, r.output
    lib = json.loads((tmp_path / "lib" / "config.json").read_text())
    cli = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert cli["algo"] == {**lib["algo"], "toy_scale": 1.0}  # the same preset both ways


def test_an_unknown_algorithm_and_a_setting_of_another_one_are_said_in_the_flags_terms(cart, tmp_path):
    from click.testing import CliRunner

    from mmreplay.cli.main import main

    r = CliRunner().invoke(main, ["train", "--offline", "--store", str(cart), "--algo", "nope"])
    assert r.exit_code == 2 and "'nope' is not one of" in r.output, r.output
    r = CliRunner().invoke(main, ["train", "CartPole-v1", "--store", str(tmp_path / "s"), "--cql-alpha", "0.5"])
    assert r.exit_code == 2 and "--cql-alpha is not a setting of --algo dqn (it is cql's)" in r.output, r.output
    assert not (tmp_path / "s").exists()
    r = CliRunner().invoke(main, ["train", "--offline", "--store", str(cart), "--algo", "iql", "--tau", "1"])
    assert r.exit_code == 2 and "--tau: must lie in (0, 1) for iql" in r.output, r.output  # the algorithm's own check


# -- the flat config.json of older runs ------------------------------------------------------------------
@pytest.mark.parametrize("run", ["dqn_cartpole", "td3bc_pendulum"])
def test_a_flat_config_json_maps_onto_the_nested_layout(run):
    """The fixtures' checkpoints hold the flat config.json layout (every setting of every algorithm at
    the top level): each setting lands where it lives now, with its value."""
    flat = load_checkpoint(FIXTURES / run / "run" / "checkpoint.pt")["config"]
    assert "replay" not in flat and "cql_alpha" in flat  # the flat layout, every algorithm's settings
    cfg = from_dict(flat)
    assert cfg.algo.name == flat["algo"] and type(cfg.algo) is get_algorithm(flat["algo"]).config
    now = cfg.flat()
    own = set(cfg.algo.field_names()) | (set(now) - {n for a in algorithm_names()
                                                    for n in get_algorithm(a).config.field_names()})
    for key, value in flat.items():
        if key in own and key != "target_update_interval":
            assert now[key] == (tuple(value) if key == "hidden" else value), key
    assert from_dict(cfg.to_dict()) == cfg  # the nested layout round-trips
    with pytest.raises(ValueError, match="not a setting"):
        from_dict({**flat, "no_such_setting": 1})


def test_an_old_flat_config_with_an_unset_target_interval_gets_the_number_it_meant(tmp_path):
    flat = load_checkpoint(FIXTURES / "dqn_cartpole" / "run" / "checkpoint.pt")["config"]
    for offline, want in ((False, 128), (True, 1000)):
        cfg = from_dict({**flat, "target_update_interval": None, "offline": offline})
        assert cfg.algo.target_update_interval == want


def test_every_registered_algorithm_has_one_module_with_its_config_and_entry():
    """An algorithm is one module of ``mmreplay/train/algos`` holding its config class and its
    ``ALGORITHM`` entry, registered by one line of the registry."""
    registry = (ALGOS / "__init__.py").read_text()
    for name in algorithm_names():
        algo = get_algorithm(name)
        module = algo.config.__module__
        assert module.startswith("mmreplay.train.algos."), module
        path = ALGOS / (module.rsplit(".", 1)[1] + ".py")
        text = path.read_text()
        assert f"class {algo.config.__name__}" in text and "ALGORITHM = Algorithm(" in text, path
        assert registry.count(f"register({module.rsplit('.', 1)[1]}.ALGORITHM)") == 1, name


@pytest.mark.parametrize("family,env_id,want", [
    ("atari", "ALE/Pong-v5", dict(learning_rate=1e-4, batch_size=32, optimizer="adam")),
    ("minatar", "MinAtar/Breakout-v1", dict(learning_rate=2.5e-4, batch_size=32, optimizer="rmsprop", max_grad_norm=0.0)),
])
def test_discrete_behaviour_cloning_takes_the_q_networks_family_presets(family, env_id, want):
    """BC's logits are a Q network's: the Atari and MinAtar presets of its optimizer step are DQN's."""
    bc = config_for(env_id, offline=True, store="s", algo="bc", **{family: True}).algo
    dqn = config_for(env_id, store="s", algo="dqn", **{family: True}).algo
    for name, value in want.items():
        assert getattr(bc, name) == getattr(dqn, name) == value, name


@pytest.mark.parametrize("setting,value", [("threads", 0), ("segment_records", -5), ("max_episode_steps", -1),
                                           ("gradient_steps", 0)])
def test_out_of_range_counts_are_refused_by_name(setting, value):
    from mmreplay.train import validate_config

    with pytest.raises(ValueError, match=f"`{setting}` must be >= "):
        validate_config(config_for("CartPole-v1", store="s", **{setting: value}))


def test_an_algorithm_whose_config_names_a_run_setting_is_refused():
    @dataclass(frozen=True, slots=True)
    class Clash(QLearningConfig):
        name: ClassVar[str] = "clash"
        seed: int = 0  # a run setting's name: `--seed` would reach only one of them

    with pytest.raises(ValueError, match="run settings: seed"):
        register_algorithm(Algorithm("clash", Clash, {"discrete": lambda setup: None}))
    assert "clash" not in algorithm_names()
