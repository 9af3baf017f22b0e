"""Real TextWorld games, generated once per test session into a folder all xdist workers share.

make_games locks its output folder, so the first worker generates and the others find the cache.
"""

import os

import pytest

pytest.importorskip("textworld")

from seedfast.envs.textworld_games import make_games  # noqa: E402

# (game_type, levels, n_train, n_eval): 5 games, a few seconds with 2 generator processes.
GAME_SETS = {
    "treasure_hunter": ("treasure_hunter", [3], 2, 1),  # walkthrough: go <direction>, take <object>
    "coin_collector": ("coin_collector", [2], 1, 0),
    "cooking": ("cooking", [1], 1, 0),
}


@pytest.fixture(scope="session")
def games_dir(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the workers of this run
    out = base / "seedfast_textworld_games"
    for game_type, levels, n_train, n_eval in GAME_SETS.values():
        make_games(out, game_type, levels, n_train, n_eval, seed=0, workers=2)
    return out


@pytest.fixture(scope="session")
def games(games_dir):
    """{set name: [GameRecord, ...]} (from the cache filled by games_dir)."""
    return {name: make_games(games_dir, t, levels, n_train, n_eval, seed=0, workers=1)
            for name, (t, levels, n_train, n_eval) in GAME_SETS.items()}


@pytest.fixture(scope="session")
def all_games(games):
    return [record for records in games.values() for record in records]
