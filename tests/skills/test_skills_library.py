"""SDAR's static skill library."""

import json

import pytest

from seedfast.skills import DEFAULT_LIBRARY, SkillLibrary, task_type_of
from tests.skills.skills_helpers import trajectory


def test_yaml_and_json_files(tmp_path):
    (tmp_path / "lib.yaml").write_text("treasure_hunter: >-\n  Follow the directions,\n  then take the object.\n")
    (tmp_path / "lib.json").write_text(json.dumps({"skills": {"cooking": "Read the   cookbook first."}}))
    assert SkillLibrary.from_file(tmp_path / "lib.yaml").get("treasure_hunter") == \
        "Follow the directions, then take the object."
    assert SkillLibrary.from_file(tmp_path / "lib.json").get("cooking") == "Read the cookbook first."


def test_missing_type_names_what_exists():
    library = SkillLibrary({"cooking": "Read the cookbook.", "coin_collector": "Follow the path."})
    with pytest.raises(ValueError, match=r"task type 'maze'.*\['coin_collector', 'cooking'\]"):
        library.get("maze")


def test_skill_for_a_trajectory():
    library = SkillLibrary.from_file()
    traj = trajectory(["go south"], won=False)  # game id treasure_hunter-L3-0
    assert task_type_of(traj) == "treasure_hunter"
    assert library.for_trajectory(traj) == library.get("treasure_hunter")
    traj.meta["task_type"] = "pick_two_obj_and_place"
    assert "second one" in library.for_trajectory(traj)


def test_default_library_covers_textworld_and_alfworld():
    from seedfast.envs.alfworld import TASK_TYPES
    from seedfast.envs.textworld_games import GAME_TYPES

    library = SkillLibrary.from_file(DEFAULT_LIBRARY)
    assert set(library.task_types) == set(GAME_TYPES) | set(TASK_TYPES)


@pytest.mark.parametrize("content, suffix, message", [
    ("[]", ".json", "mapping"), ("{}", ".json", "mapping"), ('{"a": ""}', ".json", "'a'"),
    ("a: [1, 2]", ".yaml", "'a'"), ("a: b", ".txt", "yaml"),
])
def test_bad_files(tmp_path, content, suffix, message):
    path = tmp_path / f"lib{suffix}"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        SkillLibrary.from_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="skill library"):
        SkillLibrary.from_file(tmp_path / "none.yaml")
