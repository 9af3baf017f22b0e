"""ALFWorld adapter: a clear error without the package; a real episode with it (skipped here otherwise)."""

import importlib.util
from pathlib import Path

import pytest

from seedfast.config import ALFWORLD_TASK_TYPES
from seedfast.envs.alfworld import TASK_TYPES, AlfWorldEnv, list_alfworld_games, task_type_of

HAS_ALFWORLD = importlib.util.find_spec("alfworld") is not None


@pytest.mark.skipif(HAS_ALFWORLD, reason="alfworld is installed")
def test_without_alfworld_the_error_says_what_to_install(tmp_path):
    with pytest.raises(ImportError, match="pip install alfworld"):
        AlfWorldEnv(tmp_path / "game.tw-pddl")
    with pytest.raises(ImportError, match="alfworld-download"):
        list_alfworld_games("train")


def test_task_type_comes_from_the_task_folder():
    path = "/data/json_2.1.1/train/pick_heat_then_place_in_recep-Potato-None-SinkBasin-14/trial_T2019/game.tw-pddl"
    assert task_type_of(path) == "pick_heat_then_place_in_recep"
    with pytest.raises(ValueError, match="game_file"):
        task_type_of("/data/somewhere/game.tw-pddl")


def test_task_type_filters_by_the_game_folder_prefix(tmp_path):
    tasks = ["look_at_obj_in_light-Book-None-DeskLamp-3", "pick_and_place_simple-Apple-None-Fridge-0",
             "pick_two_obj_and_place-Pen-None-Drawer-1"]
    for task in tasks:
        for trial in ("trial_1", "trial_2"):
            (tmp_path / "json_2.1.1" / "train" / task / trial).mkdir(parents=True)
            (tmp_path / "json_2.1.1" / "train" / task / trial / "game.tw-pddl").write_text("{}")

    def listed(task_type):
        return [str(Path(g).relative_to(tmp_path / "json_2.1.1" / "train").parent)
                for g in list_alfworld_games("train", tmp_path, task_type)]

    assert listed("all") == [f"{t}/{trial}" for t in tasks for trial in ("trial_1", "trial_2")]
    assert listed("pick_and_place_simple") == [f"{tasks[1]}/trial_1", f"{tasks[1]}/trial_2"]
    assert listed("look_at_obj_in_light") == [f"{tasks[0]}/trial_1", f"{tasks[0]}/trial_2"]
    with pytest.raises(FileNotFoundError, match="no pick_cool_then_place_in_recep games"):
        list_alfworld_games("train", tmp_path, "pick_cool_then_place_in_recep")
    with pytest.raises(ValueError, match="task_type 'pick_two_obj'"):  # the config's old short names
        list_alfworld_games("train", tmp_path, "pick_two_obj")


def test_the_config_offers_the_adapters_task_types():
    assert sorted(ALFWORLD_TASK_TYPES) == sorted(["all", *TASK_TYPES])


def test_split_names_are_checked(tmp_path):
    with pytest.raises(ValueError, match="split"):
        list_alfworld_games("test", data_dir=tmp_path)


def test_real_alfworld_episode():
    pytest.importorskip("alfworld")
    try:
        games = list_alfworld_games("eval_in_distribution")
    except FileNotFoundError as err:
        pytest.skip(f"ALFWorld data not downloaded: {err}")
    env = AlfWorldEnv(games[0], expert_plan=True)
    obs = env.reset()
    assert obs.task and obs.admissible_actions
    _, _, _, info = env.step("fly to the moon")
    assert not info["valid"]
    won = False
    for _ in range(60):
        _, reward, done, info = env.step(env.expert_plan[0])
        assert info["valid"]
        if done:
            won = info["won"] and reward == 1.0
            break
    env.close()
    assert won
