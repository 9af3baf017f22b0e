"""Offline game generation: manifest, disjoint split seeds, cache, CLI, argument errors."""

import json
import os
import subprocess

import pytest

from seedfast.envs.textworld_games import (
    EVAL_SEED_OFFSET,
    MANIFEST_NAME,
    challenge_settings,
    envs_make_main,
    load_manifest,
    make_games,
    parse_levels,
)


def test_manifest_records_every_game_with_its_split_seed_and_walkthrough(games_dir, games):
    manifest = json.loads((games_dir / MANIFEST_NAME).read_text())
    stored = {entry["id"]: entry for entry in manifest["games"]}
    for record in (r for records in games.values() for r in records):
        entry = stored[record.id]
        assert entry["path"] == f"{record.type}/{record.id}.z8"  # relative: the folder can move
        assert (games_dir / entry["path"]).is_file() and (games_dir / entry["path"]).with_suffix(".json").is_file()
        assert {k: entry[k] for k in ("split", "type", "level", "seed", "objective", "walkthrough")} == {
            "split": record.split, "type": record.type, "level": record.level, "seed": record.seed,
            "objective": record.objective, "walkthrough": record.walkthrough}
        assert record.objective and record.walkthrough
    treasure = games["treasure_hunter"]
    assert [(r.split, r.seed) for r in treasure] == [("train", 0), ("train", 1), ("eval", EVAL_SEED_OFFSET)]
    assert all(len(r.walkthrough) == 2 and r.walkthrough[-1].startswith("take ") for r in treasure)
    assert games["coin_collector"][0].walkthrough[-1] == "take coin"
    assert games["cooking"][0].walkthrough[-1] == "eat meal"


def test_train_and_eval_seeds_are_disjoint(games_dir):
    records = load_manifest(games_dir)
    train = {(r.type, r.level, r.seed) for r in records if r.split == "train"}
    evals = {(r.type, r.level, r.seed) for r in records if r.split == "eval"}
    assert train and evals and not train & evals
    assert all(r.seed >= EVAL_SEED_OFFSET for r in records if r.split == "eval")


def test_second_call_reuses_the_cache(games_dir, games):
    paths = [games_dir / f"{r.type}/{r.id}.z8" for r in games["treasure_hunter"]]
    before = [p.stat().st_mtime_ns for p in paths]
    again = make_games(games_dir, "treasure_hunter", [3], 2, 1, seed=0)
    assert again == games["treasure_hunter"]
    assert [p.stat().st_mtime_ns for p in paths] == before


def test_fewer_games_is_a_prefix_of_more(games_dir, games):
    assert make_games(games_dir, "treasure_hunter", "3", 1, 0) == games["treasure_hunter"][:1]


def test_load_manifest_filters(games_dir, games):
    assert load_manifest(games_dir, split="eval", game_type="treasure_hunter") == games["treasure_hunter"][2:]
    assert load_manifest(games_dir / MANIFEST_NAME, game_type="cooking") == games["cooking"]
    assert load_manifest(games_dir, levels=[99]) == []
    with pytest.raises(ValueError, match="split"):
        load_manifest(games_dir, split="test")


def test_load_manifest_without_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        load_manifest(tmp_path)


def test_cli_prints_a_summary_and_uses_the_cache(games_dir, capsys):
    argv = ["textworld", "--type", "treasure_hunter", "--levels", "3", "--train", "2", "--eval", "1",
            "--out", str(games_dir)]
    assert envs_make_main(argv) == 0
    out = capsys.readouterr().out
    assert "3 treasure_hunter games (train 2, eval 1)" in out and MANIFEST_NAME in out


def test_cli_rejects_bad_arguments(tmp_path, capsys):
    for argv in (["--type", "maze", "--out", str(tmp_path)],
                 ["--type", "treasure_hunter", "--levels", "a-b", "--out", str(tmp_path)],
                 ["--type", "treasure_hunter", "--levels", "31", "--out", str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_info:
            envs_make_main(argv)
        assert exit_info.value.code == 2
    assert not (tmp_path / MANIFEST_NAME).exists()


@pytest.mark.parametrize("text, levels", [("1-5", [1, 2, 3, 4, 5]), ("1,3,5", [1, 3, 5]), ("2", [2]),
                                          ("4-5,1", [1, 4, 5]), ("3,3", [3])])
def test_parse_levels(text, levels):
    assert parse_levels(text) == levels


@pytest.mark.parametrize("text", ["", "a", "1-", "x-3", "1,,"])
def test_parse_levels_rejects(text):
    with pytest.raises(ValueError, match="levels"):
        parse_levels(text)


def test_make_games_validates_before_generating(tmp_path):
    cases = [(("maze", [1], 1, 1), "game_type"), (("treasure_hunter", [0], 1, 1), "level"),
             (("coin_collector", [101], 1, 1), "level"), (("cooking", [7], 1, 1), "level"),
             (("treasure_hunter", [1], -1, 1), "n_train"), (("treasure_hunter", [1], 1, 2.5), "n_eval")]
    for args, name in cases:
        with pytest.raises(ValueError, match=name):
            make_games(tmp_path, *args)
    with pytest.raises(ValueError, match="seed"):
        make_games(tmp_path, "treasure_hunter", [1], 1, 1, seed=-1)
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_challenge_settings():
    assert challenge_settings("treasure_hunter", 7, 5) == ("tw-treasure_hunter", {"level": 7})
    name, settings = challenge_settings("cooking", 4, 12)
    assert name == "tw-cooking"
    assert settings["recipe_seed"] == 12 and settings["go"] == 6 and settings["cook"] and not settings["drop"]


def test_seeds_without_a_quest_are_skipped_replaced_and_remembered(tmp_path, monkeypatch):
    """Bookkeeping only: the generator is replaced by one that writes an empty file and fails on seed 1."""
    from seedfast.envs import textworld_games

    calls = []

    def fake_generate(out_dir, job):
        calls.append(job["seed"])
        if job["seed"] in (1, EVAL_SEED_OFFSET + 1):
            return "QuestGenerationError: no quest"
        rel = f"{job['type']}/{job['type']}-L{job['level']}-{job['seed']}.z8"
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
        return {"id": rel.split("/")[1][:-3], "path": rel, **job, "objective": "o", "walkthrough": ["w"],
                "max_score": 1.0}

    monkeypatch.setattr(textworld_games, "_generate_one", fake_generate)
    records = make_games(tmp_path, "treasure_hunter", [1], 3, 2, workers=1)
    assert [(r.split, r.seed) for r in records] == [("train", 0), ("train", 2), ("train", 3),
                                                    ("eval", EVAL_SEED_OFFSET), ("eval", EVAL_SEED_OFFSET + 2)]
    manifest = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert {(s["seed"], s["reason"]) for s in manifest["skipped"]} == {
        (1, "QuestGenerationError: no quest"), (EVAL_SEED_OFFSET + 1, "QuestGenerationError: no quest")}
    calls.clear()
    assert make_games(tmp_path, "treasure_hunter", [1], 3, 2, workers=1) == records
    assert calls == []  # neither the games nor the failed seeds are tried again

    monkeypatch.setattr(textworld_games, "_generate_one", lambda out_dir, job: "QuestGenerationError: never")
    with pytest.raises(RuntimeError, match="could not build a quest"):
        make_games(tmp_path, "coin_collector", [1], 2, 0, workers=1)


def test_knowledge_bases_parsed_once_make_the_same_games(tmp_path, monkeypatch):
    """The knowledge base a challenge parses once per process (textworld_games._parse_knowledge_bases_once) makes
    the games TextWorld makes when it parses it for every game: one process makes two games of each of two types in
    a row with the shared one, then again with TextWorld's own load, and every game file and manifest entry is
    equal."""
    from textworld.generator.data import KnowledgeBase

    from seedfast.envs import textworld_games

    jobs = [{"type": t, "level": level, "split": "train", "seed": seed}
            for t, level in (("treasure_hunter", 3), ("cooking", 2)) for seed in (7, 8)]
    textworld_games._parse_knowledge_bases_once()
    shared = [textworld_games._generate_one(str(tmp_path / "shared"), job) for job in jobs]
    assert KnowledgeBase.load.__func__.cache_info().hits >= 2  # each type's second game reused the first's
    monkeypatch.setattr(KnowledgeBase, "load", classmethod(KnowledgeBase.load.__func__.__wrapped__))
    monkeypatch.setattr(textworld_games, "_parse_knowledge_bases_once", lambda: None)
    own = [textworld_games._generate_one(str(tmp_path / "own"), job) for job in jobs]
    assert KnowledgeBase.load.__func__.__name__ == "load" and not hasattr(KnowledgeBase.load, "cache_info")
    assert shared == own and all(isinstance(entry, dict) for entry in own)
    for entry in own:
        game_json = entry["path"][: -len(".z8")] + ".json"
        assert (tmp_path / "shared" / game_json).read_bytes() == (tmp_path / "own" / game_json).read_bytes()


def _z8_without_serial(path):
    """A .z8's bytes less its header's serial number (bytes 0x12-0x17: Inform writes the compile date there)."""
    data = bytearray(path.read_bytes())
    data[0x12:0x18] = b"000000"
    return bytes(data)


def test_inform7_without_its_index_makes_the_same_games(tmp_path, monkeypatch):
    """Games compile through the INFORM_HOME whose ni runs with -noindex (textworld_games._inform_home_without_index):
    TextWorld runs that ni, and the game files are the bytes TextWorld's own Inform 7 makes; INFORM_HOME is as it
    was after."""
    from seedfast.envs import textworld_games

    ran: list[str] = []
    check_output = subprocess.check_output

    def recorded(cmd, *args, **kwargs):
        ran.append(cmd[0])
        return check_output(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "check_output", recorded)
    monkeypatch.delenv("INFORM_HOME", raising=False)
    job = {"type": "treasure_hunter", "level": 4, "split": "train", "seed": 11}
    fast = textworld_games._generate_one(str(tmp_path / "fast"), job)
    (home,) = (tmp_path / "fast" / textworld_games.INFORM_FOLDER).iterdir()
    assert ran[0] == str(home / "share" / "inform7" / "Compilers" / "ni") and "-noindex" in (
        home / "share" / "inform7" / "Compilers" / "ni").read_text()
    assert "INFORM_HOME" not in os.environ
    monkeypatch.setattr(textworld_games, "_inform_home_without_index", lambda out: textworld_games._real_inform_home())
    ran.clear()
    own = textworld_games._generate_one(str(tmp_path / "own"), job)
    assert ran[0] == str(textworld_games._real_inform_home() / "share" / "inform7" / "Compilers" / "ni")
    assert fast == own and isinstance(own, dict)
    game = own["path"]
    assert _z8_without_serial(tmp_path / "fast" / game) == _z8_without_serial(tmp_path / "own" / game)
    json_file = game[: -len(".z8")] + ".json"
    assert (tmp_path / "fast" / json_file).read_bytes() == (tmp_path / "own" / json_file).read_bytes()
