"""seedfast.cli: dispatch, flags -> config keys, --help, exit codes (in-process and as a real process)."""

import importlib
import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

from seedfast import cli
from seedfast.config import ConfigError, format_value, options, parse_yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "configs" / "demo_cpu.yaml")


@pytest.fixture
def fake_impl(monkeypatch):
    """Point every command at an in-memory module whose functions record what they were given."""
    calls = []
    module = types.ModuleType("seedfast_fake_impl")

    def record(name):
        def run(cfg, **flags):
            calls.append((name, cfg, flags))
            return 0
        return run

    for name, command in cli.COMMANDS.items():
        setattr(module, f"{name}_main", record(name))
        monkeypatch.setitem(cli.COMMANDS, name, cli.Command("seedfast_fake_impl", f"{name}_main", command.help))
    monkeypatch.setitem(sys.modules, "seedfast_fake_impl", module)
    return calls


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_train_gets_the_resolved_config_with_flags_as_keys(fake_impl, capsys):
    rc, _, err = run_cli(capsys, "train", DEMO, "algorithm=grpo", "--resume", "auto", "trainer.steps=3",
                         "--profile-steps", "2:3")
    assert rc == 0 and err == ""
    [(name, cfg, flags)] = fake_impl
    assert name == "train" and flags == {}
    assert (cfg.algorithm, cfg.trainer.steps, cfg.trainer.resume) == ("grpo", 3, "auto")
    assert cfg.trainer.profile_range() == range(2, 4)
    assert cfg.model.tiny.hidden == 128  # from the YAML file


def test_eval_takes_a_run_folder_and_a_split(fake_impl, capsys, tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    cfg_path = cli.load_config(DEMO, ["run.name=r1", f"run.out_dir={tmp_path / 'runs'}"]).save()
    assert cfg_path.parent == run_dir
    rc, _, _ = run_cli(capsys, "eval", str(run_dir), "--split", "train")
    [(name, cfg, flags)] = fake_impl
    assert rc == 0 and name == "eval" and flags == {"split": "train"} and cfg.run.name == "r1"


def test_envs_make_maps_its_flags(fake_impl, capsys):
    rc, _, _ = run_cli(capsys, "envs", "make", "textworld", "--type", "coin_collector", "--levels", "1-3",
                       "--train", "4", "--eval", "2")
    [(name, cfg, _)] = fake_impl
    assert rc == 0 and name == "envs"
    assert (cfg.env.kind, cfg.env.game_type, cfg.env.levels, cfg.env.n_train, cfg.env.n_eval) == \
        ("textworld", "coin_collector", [1, 2, 3], 4, 2)


def test_envs_without_make_is_a_usage_error(fake_impl, capsys):
    rc, _, err = run_cli(capsys, "envs", DEMO)
    assert rc == 2 and "seedfast envs make" in err and not fake_impl


def test_collect_checks_its_own_requirements(fake_impl, capsys):
    rc, _, err = run_cli(capsys, "collect")
    assert rc == 2 and "skill.external.endpoint is required" in err and not fake_impl
    rc, _, _ = run_cli(capsys, "collect", "skill.collect_analyzer=oracle")
    assert rc == 0 and fake_impl[0][0] == "collect"


def test_config_command_prints_the_resolved_yaml(capsys):
    rc, out, _ = run_cli(capsys, "config", DEMO, "trainer.steps=4", "loss.dual_clip=null")
    data = parse_yaml(out)
    assert rc == 0 and data["trainer"]["steps"] == 4 and data["loss"]["dual_clip"] is None
    assert data["model"]["tiny"]["hidden"] == 128


@pytest.mark.parametrize("argv, message", [
    (["train", DEMO, "trainer.stepz=3"], "unknown config key 'trainer.stepz' (did you mean 'trainer.steps'?)"),
    (["sft", DEMO, "loss.gate=x"], "loss.gate: 'x' is not allowed; choose one of: gap, entropy, soft_or"),
    (["train", "--profile-steps", "x"], "trainer.profile_steps: expected A:B"),
    (["train", DEMO, DEMO], "expected one config path"),
    (["demo", "no/such.yaml"], "config file not found: no/such.yaml"),
])
def test_config_errors_exit_2_naming_the_key(fake_impl, capsys, argv, message):
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2 and message in err and not fake_impl


def test_warnings_are_printed_once_and_the_command_runs(fake_impl, capsys):
    rc, _, err = run_cli(capsys, "train", "rollout.n=1")
    assert rc == 0 and err.count("warning: rollout.n=1") == 1 and len(fake_impl) == 1


def test_config_error_raised_by_the_implementation_exits_2(monkeypatch, capsys):
    module = types.ModuleType("seedfast_fake_raises")

    def main(cfg):
        raise ConfigError("sft.data: no such file")

    module.main = main
    monkeypatch.setitem(sys.modules, "seedfast_fake_raises", module)
    monkeypatch.setitem(cli.COMMANDS, "sft", cli.Command("seedfast_fake_raises", "main", "x"))
    rc, _, err = run_cli(capsys, "sft")
    assert rc == 2 and "config error: sft.data: no such file" in err


def test_every_command_has_its_implementation():
    for name, command in cli.COMMANDS.items():
        run = getattr(importlib.import_module(command.module), command.attr)
        assert list(inspect.signature(run).parameters)[0] == "cfg", name


def test_a_missing_dependency_inside_an_implementation_is_not_hidden(monkeypatch, tmp_path, capsys):
    (tmp_path / "seedfast_fake_broken.py").write_text("import no_such_dependency_xyz\n\ndef main(cfg):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "later", cli.Command("seedfast_fake_broken", "main", "x"))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        cli.main(["later"])


@pytest.mark.parametrize("command", [*cli.COMMANDS, "config"])
def test_help_lists_every_option_with_its_default(capsys, command):
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for o in options():
        assert f"  {o.key} = {format_value(o.default)} " in out, o.key
    if command == "train":
        assert "--resume" in out and "--profile-steps" in out


def test_top_level_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and all(name in out for name in cli.COMMANDS)
    assert cli.main([]) == 2


def test_real_process_exit_code_2_without_traceback(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("trainer:\n  steps: 3\nloss:\n  gate: gapp\n")
    for argv, message in [
        (["train", DEMO, "trainer.stepz=3"], "did you mean 'trainer.steps'?"),
        (["train", str(bad)], f"loss.gate: 'gapp' is not allowed; choose one of: gap, entropy, soft_or"
                              f" (did you mean 'gap'?) (in {bad})"),
    ]:
        p = subprocess.run([sys.executable, "-m", "seedfast", *argv], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path)
        assert p.returncode == 2, p.stderr
        assert message in p.stderr and "Traceback" not in p.stderr and p.stdout == ""


def test_real_process_help_does_not_import_torch():
    code = ("import sys; from seedfast.cli import main\n"
            "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'cli imported torch'\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "trainer.steps = 150" in p.stdout


@pytest.mark.parametrize("command", ["train", "sft"])
def test_training_refuses_several_processes(monkeypatch, tmp_path, capsys, command):
    monkeypatch.setenv("WORLD_SIZE", "2")
    rc, _, err = run_cli(capsys, command, f"run.out_dir={tmp_path}")
    assert rc == 2 and f"seedfast {command} runs in one process" in err


def test_envs_make_alfworld_checks_the_data_and_generates_nothing(tmp_path, capsys):
    rc, _, err = run_cli(capsys, "envs", "make", "alfworld", "env.game_type=all", f"env.games_dir={tmp_path}")
    assert rc == 2 and "env.games_dir: ALFWorld data not found" in err
    for split, n in (("train", 3), ("valid_unseen", 2)):
        for task in [f"pick_and_place_simple-Apple-None-Fridge-{i}" for i in range(n)] + ["look_at_obj_in_light-X-1"]:
            game = tmp_path / "json_2.1.1" / split / task / "trial_1"
            game.mkdir(parents=True)
            (game / "game.tw-pddl").write_text("{}")
    for game_type, counts in (("all", "4 train, 3 eval"), ("pick_and_place_simple", "3 train, 2 eval"),
                              ("look_at_obj_in_light", "1 train, 1 eval")):
        rc, out, _ = run_cli(capsys, "envs", "make", "alfworld", f"env.game_type={game_type}",
                             f"env.games_dir={tmp_path}", "env.n_train=null", "env.n_eval=null")
        assert rc == 0 and counts in out and not list(tmp_path.glob("*.z8")), game_type
    rc, _, err = run_cli(capsys, "envs", "make", "alfworld", "env.game_type=pick_two_obj_and_place",
                         f"env.games_dir={tmp_path}")
    assert rc == 2 and "env.games_dir: no pick_two_obj_and_place games under" in err
