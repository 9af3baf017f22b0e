"""Trajectory: plain JSON round trip, derived counts, clear errors on malformed data."""

import json

import pytest

from seedfast.envs import Trajectory, TrajectoryStep


def sample():
    return Trajectory(
        task="Take the coin.", game_id="coin_collector-L2-0",
        steps=[TrajectoryStep("-= Vault =-", ["go east", "look"], "fly", [5, 6], valid=False),
               TrajectoryStep("-= Vault =-", ["go east", "look"], "go east", [7], reward=0.0),
               TrajectoryStep("-= Office =-", ["take coin"], "take coin", [8, 9, 2], reward=1.0)],
        won=True, final_observation="You pick up the coin.", walkthrough=["go east", "take coin"],
        meta={"group": 3})


def test_json_round_trip_keeps_everything():
    trajectory = sample()
    data = json.loads(json.dumps(trajectory.to_dict()))
    assert data["n_invalid"] == 1 and data["steps"][2]["response_ids"] == [8, 9, 2]
    assert Trajectory.from_dict(data) == trajectory


def test_derived_fields():
    trajectory = sample()
    assert trajectory.n_invalid == 1
    assert trajectory.actions == ["fly", "go east", "take coin"]
    assert Trajectory(task="t", game_id="g").n_invalid == 0


def test_from_dict_errors_name_the_problem():
    with pytest.raises(TypeError, match="dict"):
        Trajectory.from_dict(["task"])
    with pytest.raises(ValueError, match="game_id"):
        Trajectory.from_dict({"task": "t"})
    with pytest.raises(TypeError, match="step 1"):
        Trajectory.from_dict({"task": "t", "game_id": "g", "steps": [sample().steps[0].__dict__, "look"]})
