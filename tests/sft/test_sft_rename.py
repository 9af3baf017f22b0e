import random

import pytest

from seedfast.envs.trajectory import Trajectory, TrajectoryStep
from seedfast.sft.rename import made_up_word, rename, renamed_copies, taken_objects


def _trajectory() -> Trajectory:
    task = "First, head south. Then pick-up the loaf of bread from the floor of the chamber. The bread box is empty."
    steps = [
        TrajectoryStep("-= Cellar =-\nAn exit to the south.", ["go south", "go west", "look"], "go south"),
        TrajectoryStep("-= Chamber =-\nThere is a loaf of bread on the floor.",
                       ["examine loaf of bread", "go north", "take loaf of bread"], "take loaf of bread"),
    ]
    return Trajectory(task=task, game_id="g-1", steps=steps, won=True,
                      walkthrough=["go south", "take loaf of bread"])


def test_taken_objects_reads_take_actions_once_each():
    assert taken_objects(["go east", "take key from table", "take pear", "take key"]) == ["key", "pear"]
    assert taken_objects(["go east", "open door"]) == []


def test_made_up_words_are_seeded_pronounceable_and_varied():
    a = [made_up_word(random.Random(s)) for s in range(200)]
    assert a == [made_up_word(random.Random(s)) for s in range(200)]
    assert all(w.isalpha() and w.islower() and 2 <= len(w) <= 15 for w in a)
    assert len(set(a)) > 150


def test_rename_replaces_whole_words_everywhere_and_keeps_the_walkthrough_consistent():
    t = _trajectory()
    r = rename(t, {"loaf of bread": "glomaris"})
    assert "glomaris from the floor" in r.task and "The bread box" in r.task  # whole phrase only
    assert r.actions == ["go south", "take glomaris"] and r.walkthrough == ["go south", "take glomaris"]
    assert "take glomaris" in r.steps[1].admissible_actions and "examine glomaris" in r.steps[1].admissible_actions
    assert "glomaris on the floor" in r.steps[1].observation
    assert r.won and r.game_id == "g-1~renamed" and r.meta["renamed"] == {"loaf of bread": "glomaris"}
    assert t.actions == ["go south", "take loaf of bread"]  # the original is untouched
    with pytest.raises(ValueError, match="g-1"):
        rename(t, {})


def test_renamed_copies_give_every_copy_a_new_name_and_skip_trajectories_without_an_object():
    plain = Trajectory(task="go east", game_id="g-2", steps=[TrajectoryStep("room", ["go east"], "go east")])
    copies = renamed_copies([_trajectory(), plain], copies=3, seed=0)
    assert len(copies) == 3
    names = [c.actions[1][len("take "):] for c in copies]
    assert len(set(names)) == 3 and "loaf of bread" not in names
    for c in copies:
        step = c.steps[1]
        assert step.action in step.admissible_actions and c.steps[1].action.split(" ", 1)[1] in c.task
    assert [c.actions for c in renamed_copies([_trajectory()], 3, seed=0)] == [c.actions for c in copies]


def test_compass_turns_are_the_eight_symmetries_and_keep_opposites_opposite():
    from seedfast.sft.rename import COMPASS, compass_turns

    turns = compass_turns()
    assert len({tuple(sorted(t.items())) for t in turns}) == 8 and turns[0] == {d: d for d in COMPASS}
    opposite = {"north": "south", "south": "north", "east": "west", "west": "east"}
    for t in turns:
        assert sorted(t.values()) == sorted(COMPASS)
        assert all(t[opposite[d]] == opposite[t[d]] for d in COMPASS)


def test_renamed_copies_turn_the_compass_in_the_task_and_the_actions_alike():
    copies = renamed_copies([_trajectory()] * 20, copies=1, seed=3)
    directions = {c.actions[0].split()[1] for c in copies}
    assert len(directions) >= 3  # the first move varies across copies
    for c in copies:
        first = c.actions[0].split()[1]
        assert f"head {first}" in c.task and f"exit to the {first}" in c.steps[0].observation
        assert c.actions[0] in c.steps[0].admissible_actions
    plain = renamed_copies([_trajectory()], copies=1, seed=3, turn_compass=False)[0]
    assert plain.actions[0] == "go south"


def test_textworld_object_names_are_the_portable_things_of_its_house_grammar():
    from seedfast.sft.rename import textworld_object_names

    names = textworld_object_names()
    assert {"passkey", "telephone", "stick of butter", "iron", "mop"} <= set(names)
    assert not {"kitchen", "chest", "table", "door"} & set(names)  # rooms, containers, supporters, doors
    assert list(names) == sorted(set(names)) and all("#" not in n for n in names)


def test_renamed_copies_from_a_pool_use_its_names_and_never_a_word_of_the_trajectory():
    pool = ["pear", "loaf of jam", "bread knife", "mop", "iron"]
    copies = renamed_copies([_trajectory()] * 30, copies=1, seed=1, turn_compass=False, pool=pool)
    names = {c.actions[1][len("take "):] for c in copies}
    assert names == {"pear", "mop", "iron"}  # "loaf of jam" and "bread knife" share a word with the game
    for c in copies:
        assert f"pick-up the {c.actions[1][5:]} from" in c.task and c.actions[1] in c.steps[1].admissible_actions
    with pytest.raises(ValueError, match="g-1"):
        renamed_copies([_trajectory()], copies=1, seed=0, pool=["bread roll"])
