"""The one set of builders (runtime/setup.py) that every command of seedfast/app/ uses: one ALFWorld game_id rule,
one policy fallback order, one tokenizer order, one LR schedule, env.isolation honoured."""

import math
from pathlib import Path

import pytest
import torch

from seedfast.app import collect as collect_command
from seedfast.config import ConfigError, load_config
from seedfast.envs.slots import LocalEnvSlots
from seedfast.envs.trajectory import Trajectory
from seedfast.model.tokenizer import save_tokenizer, train_tokenizer
from seedfast.runtime import setup
from seedfast.runtime.optim import lr_at
from seedfast.sft.tokenizer import initial_tokenizer
from seedfast.skills.library import task_type_of


def fake_alfworld(root: Path) -> None:
    """json_2.1.1/<split>/<task>/<trial>/game.tw-pddl, two trials of one task in train."""
    for split, games in (("train", [("pick_and_place_simple-Apple-None-Fridge-0", "trial_1"),
                                    ("pick_and_place_simple-Apple-None-Fridge-0", "trial_2"),
                                    ("look_at_obj_in_light-Book-None-DeskLamp-3", "trial_1")]),
                         ("valid_unseen", [("pick_two_obj_and_place-Pen-None-Drawer-1", "trial_9")])):
        for task, trial in games:
            folder = root / "json_2.1.1" / split / task / trial
            folder.mkdir(parents=True)
            (folder / "game.tw-pddl").write_text("{}")


def test_alfworld_game_id_is_one_rule_for_collect_and_train(tmp_path):
    fake_alfworld(tmp_path)
    cfg = load_config(None, ["env.kind=alfworld", "env.game_type=all", f"env.games_dir={tmp_path}",
                             "env.n_train=null", "env.n_eval=null", "collect.tasks=10"])
    assert collect_command.load_tasks is setup.load_tasks  # collect builds its tasks with train's builder
    train_tasks = setup.load_tasks(cfg, "train")
    collected = collect_command.collect_tasks(cfg)
    assert [t.game_id for t in collected] == [t.game_id for t in train_tasks]
    assert [t.game_id for t in train_tasks] == [setup.alfworld_game_id(t.spec) for t in train_tasks]
    assert sorted(t.game_id for t in train_tasks) == [
        "look_at_obj_in_light-Book-None-DeskLamp-3/trial_1",
        "pick_and_place_simple-Apple-None-Fridge-0/trial_1",
        "pick_and_place_simple-Apple-None-Fridge-0/trial_2",
    ]  # unique per game: two trials of one task are two games
    assert {t.game_id.split("-", 1)[0] for t in train_tasks} == {"look_at_obj_in_light", "pick_and_place_simple"}
    [held_out] = setup.load_tasks(cfg, "eval")
    assert held_out.game_id == "pick_two_obj_and_place-Pen-None-Drawer-1/trial_9"


def test_alfworld_game_type_picks_the_games_of_that_task_type(tmp_path):
    fake_alfworld(tmp_path)
    cfg = load_config(None, ["env.kind=alfworld", "env.game_type=pick_and_place_simple", f"env.games_dir={tmp_path}",
                             "env.n_train=null", "env.n_eval=null"])
    assert [t.game_id for t in setup.load_tasks(cfg, "train")] == [
        "pick_and_place_simple-Apple-None-Fridge-0/trial_1", "pick_and_place_simple-Apple-None-Fridge-0/trial_2"]
    with pytest.raises(ConfigError, match="env.games_dir: no pick_and_place_simple games under"):
        setup.load_tasks(cfg, "eval")  # the held-out split has only pick_two_obj_and_place


def test_alfworld_game_ids_give_the_skill_library_its_task_type():
    game = "/d/json_2.1.1/train/pick_clean_then_place_in_recep-X-0/trial_3/game.tw-pddl"
    trajectory = Trajectory(task="t", game_id=setup.alfworld_game_id(game))
    assert task_type_of(trajectory) == "pick_clean_then_place_in_recep"


def test_alfworld_without_data_is_a_config_error(tmp_path):
    cfg = load_config(None, ["env.kind=alfworld", "env.game_type=all", f"env.games_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="env.games_dir"):
        setup.load_tasks(cfg, "train")


def hf_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_policy_path_one_order_init_from_then_sft_then_model_path(tmp_path):
    base = hf_folder(tmp_path / "base")
    keys = [f"run.out_dir={tmp_path}", "run.name=r", f"model.path={base}"]
    assert setup.policy_path(load_config(None, keys)) == base
    sft = hf_folder(tmp_path / "r" / "sft")
    assert setup.policy_path(load_config(None, keys)) == sft
    chosen = hf_folder(tmp_path / "chosen")
    assert setup.policy_path(load_config(None, [*keys, f"trainer.init_from={chosen}"])) == chosen
    with pytest.raises(ConfigError, match="trainer.init_from"):  # set but wrong: said, never skipped
        setup.policy_path(load_config(None, [*keys, f"trainer.init_from={tmp_path / 'nothing'}"]))


def test_eval_reads_the_trained_export_then_the_start_order(tmp_path):
    """`seedfast eval` measures a base model.path too (the start of a real model), and the trained hf/ once there."""
    base = hf_folder(tmp_path / "base")
    keys = [f"run.out_dir={tmp_path}", "run.name=r", f"model.path={base}"]
    assert setup.trained_policy_path(load_config(None, keys)) == base
    sft = hf_folder(tmp_path / "r" / "sft")
    assert setup.trained_policy_path(load_config(None, keys)) == sft
    trained = hf_folder(tmp_path / "r" / "hf")
    assert setup.trained_policy_path(load_config(None, keys)) == trained


def test_policy_path_names_a_wrong_model_path(tmp_path):
    with pytest.raises(ConfigError, match="model.path"):
        setup.policy_path(load_config(None, [f"run.out_dir={tmp_path}", f"model.path={tmp_path / 'none'}"]))
    with pytest.raises(ConfigError, match="model.path"):
        setup.policy_path(load_config(None, [f"run.out_dir={tmp_path}"]))


def test_one_tokenizer_order_for_every_command_sft_included(tmp_path):
    """model.tokenizer, else the policy folder's, else <run_dir>/tokenizer (setup.tokenizer_folder): `seedfast sft`
    on a model.path reads the tokenizer that `collect` and `train` read for that policy."""
    tokenizer = train_tokenizer(["go north, take the key, open the door"] * 10, vocab_size=300)
    base = hf_folder(tmp_path / "base")
    keys = [f"run.out_dir={tmp_path}", "run.name=r", f"model.path={base}"]
    cfg = load_config(None, keys)
    with pytest.raises(ConfigError, match="no tokenizer folder found"):
        initial_tokenizer(cfg, [])
    for folder in (tmp_path / "r" / "tokenizer", base):  # the policy's own tokenizer, once there, comes first
        save_tokenizer(tokenizer, folder)
        assert setup.tokenizer_folder(cfg, base) == folder
        assert initial_tokenizer(cfg, []).name_or_path == setup.load_run_tokenizer(cfg, base).name_or_path
        assert Path(setup.load_run_tokenizer(cfg, base).name_or_path) == folder
    chosen = save_tokenizer(tokenizer, tmp_path / "chosen")
    assert setup.tokenizer_folder(load_config(None, [*keys, f"model.tokenizer={chosen}"]), base) == chosen
    wrong = load_config(None, [*keys, f"model.tokenizer={tmp_path / 'nothing'}"])
    for read in (lambda: setup.load_run_tokenizer(wrong, base), lambda: initial_tokenizer(wrong, [])):
        with pytest.raises(ConfigError, match="model.tokenizer=.*is not a tokenizer folder"):  # set but wrong: said
            read()


@pytest.mark.parametrize("schedule, warmup, floor", [("constant", 0, 0.0), ("constant", 3, 0.0),
                                                      ("cosine", 2, 0.1), ("cosine", 0, 0.0)])
def test_rl_schedule_is_sft_loops_lr_at(schedule, warmup, floor):
    cfg = load_config(None, ["optim.lr=0.5", f"optim.schedule={schedule}", f"optim.warmup_steps={warmup}",
                             f"optim.min_lr_ratio={floor}", "trainer.steps=10"])
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = setup.rl_optimizer(cfg, model)
    seen = []
    for _ in range(12):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == [0.5 * lr_at(s, 10, 1.0, warmup, schedule, floor) for s in range(12)]
    if schedule == "cosine":  # the formula the RL schedule had before it shared lr_at
        p = (5 - warmup) / (10 - warmup)
        assert seen[5] == pytest.approx(0.5 * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))))


def test_env_slots_honour_isolation():
    cfg = load_config(None, ["env.isolation=inline"])
    slots = setup.make_env_slots(cfg, 2)
    try:
        assert isinstance(slots, LocalEnvSlots)
    finally:
        slots.close()
