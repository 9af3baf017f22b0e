"""Every game a split needs is checked against its manifest entry (sizes and sha256 of its .z8 and .json): a deleted,
truncated or garbled file is named, never silently dropped; a manifest from before checksums gets them from
`seedfast envs make` (make_games)."""

import json
import os
import shutil

import pytest

from seedfast.envs.failures import GameFileError
from seedfast.envs.textworld_games import check_games, load_manifest, make_games, require_games


@pytest.fixture
def games(train_games, tmp_path):
    out = tmp_path / "games"
    shutil.copytree(train_games, out, ignore=shutil.ignore_patterns(".make_games.lock"))
    return out


def test_intact_games_pass_and_each_kind_of_damage_is_named(games):
    records = load_manifest(games)
    assert len(records) == 3 and check_games(records) == []
    assert all(set(r.files) == {f"treasure_hunter/{r.id}.z8", f"treasure_hunter/{r.id}.json"} for r in records)
    first, second, third = records
    size = os.path.getsize(second.path)
    os.unlink(first.path)
    os.truncate(second.path, 100)
    data = bytearray(open(third.path, "rb").read())
    data[-1] ^= 0xFF
    open(third.path, "wb").write(bytes(data))
    assert len(load_manifest(games)) == 3  # a deleted game stays listed, to be named
    assert [(r.id, why) for r, why in check_games(load_manifest(games))] == [
        (first.id, f"{first.path}: missing"),
        (second.id, f"{second.path}: 100 bytes, the manifest says {size}"),
        (third.id, f"{third.path}: sha256 differs from the manifest's (the file is damaged)")]
    with pytest.raises(GameFileError, match=r"3 of 3 games are missing or damaged: game .*env.damaged_games=skip"):
        require_games(load_manifest(games), skip=False)
    kept, problems = require_games(load_manifest(games), skip=True)
    assert kept == [] and len(problems) == 3


def test_make_games_gives_an_old_manifest_its_checksums(games):
    manifest = json.loads((games / "manifest.json").read_text())
    for entry in manifest["games"]:
        del entry["files"]
    (games / "manifest.json").write_text(json.dumps(manifest))
    assert all(r.files is None for r in load_manifest(games))
    make_games(games, "treasure_hunter", [3], 2, 1, seed=0, workers=1)  # all cached: nothing is generated
    records = load_manifest(games)
    assert all(r.files for r in records) and check_games(records) == []
