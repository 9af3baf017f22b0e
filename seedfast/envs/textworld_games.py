"""Generate TextWorld games offline, in-process, with train and eval splits drawn from disjoint seeds.

Layout of `out_dir`:
    manifest.json                           every game made so far (and seeds that could not make one)
    <type>/<type>-L<level>-<seed>.z8        the compiled game (+ the .json TextWorld writes beside it)

Seeds (seedfast/seeds.py, first_game_seed): train game i of a level uses `seed + i`, eval game i uses
`seed + EVAL_SEED_OFFSET + i`, so the splits of one `seed` never share a seed (sets made with different `seed`s
may). A seed for which TextWorld cannot build a quest is recorded as skipped and replaced by the next seed of the
same split.
A game already in the manifest is never regenerated.

Each game's entry records the size and sha256 of its files (`files`); `check_games` verifies every game a split
needs against them, so a deleted or damaged game file is named before a run plays it, never silently dropped
(runtime/setup.py load_tasks applies env.damaged_games). Manifests written before `files` are checked for the
files' presence only.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shlex
import shutil
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seedfast.envs.failures import GameFileError
from seedfast.envs.lifeline import OwnedProcessPool
from seedfast.seeds import EVAL_GAME_SEED_OFFSET, first_game_seed

GAME_TYPES = ("coin_collector", "treasure_hunter", "cooking")
SPLITS = ("train", "eval")
EVAL_SEED_OFFSET = EVAL_GAME_SEED_OFFSET  # seeds.py owns it; the name stays for this module's readers
MANIFEST_NAME = "manifest.json"
_CHALLENGES = {"coin_collector": "tw-coin_collector", "treasure_hunter": "tw-treasure_hunter",
               "cooking": "tw-cooking"}
_LEVEL_RANGES = {"coin_collector": (1, 100), "treasure_hunter": (1, 30), "cooking": (1, 6)}
# seedfast's own difficulty ladder for the cooking challenge (TextWorld defines none).
COOKING_LEVELS: dict[int, dict[str, Any]] = {
    1: {"recipe": 1, "take": 1, "go": 1},
    2: {"recipe": 1, "take": 1, "go": 1, "open": True, "cut": True},
    3: {"recipe": 2, "take": 2, "go": 6, "open": True, "cut": True},
    4: {"recipe": 2, "take": 2, "go": 6, "open": True, "cut": True, "cook": True},
    5: {"recipe": 3, "take": 3, "go": 9, "open": True, "cut": True, "cook": True},
    6: {"recipe": 3, "take": 3, "go": 12, "open": True, "cut": True, "cook": True, "drop": True},
}


@dataclass
class GameRecord:
    id: str
    path: str  # absolute when returned; stored relative to the manifest's folder
    split: str
    type: str
    level: int
    seed: int
    objective: str
    walkthrough: list[str]
    max_score: float
    files: dict[str, dict[str, Any]] | None = None  # relative path -> {size, sha256}; None in older manifests


def challenge_settings(game_type: str, level: int, seed: int) -> tuple[str, dict[str, Any]]:
    """TextWorld challenge name and settings for one game."""
    if game_type not in GAME_TYPES:
        raise ValueError(f"game_type {game_type!r} is not one of {GAME_TYPES}")
    low, high = _LEVEL_RANGES[game_type]
    if not isinstance(level, int) or isinstance(level, bool) or not low <= level <= high:
        raise ValueError(f"level {level!r} for {game_type} must be an int in [{low}, {high}]")
    if game_type == "cooking":
        settings = {"recipe": 1, "take": 0, "go": 1, "open": False, "cook": False, "cut": False,
                    "drop": False, "split": None, "recipe_seed": seed}
        settings.update(COOKING_LEVELS[level])
        return _CHALLENGES[game_type], settings
    return _CHALLENGES[game_type], {"level": level}


def game_id(game_type: str, level: int, seed: int) -> str:
    return f"{game_type}-L{level}-{seed}"


def parse_levels(text: str) -> list[int]:
    """'1-5' -> [1, 2, 3, 4, 5]; '1,3,5' -> [1, 3, 5]; '2' -> [2]."""
    levels: list[int] = []
    try:
        for part in str(text).split(","):
            lo, dash, hi = part.strip().partition("-")
            if dash and not hi.strip():
                raise ValueError
            levels.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"levels {text!r}: expected N, A-B or a comma-separated list of those") from None
    if not levels:
        raise ValueError(f"levels {text!r} names no level")
    return sorted(set(levels))


def make_games(out_dir: str | os.PathLike, game_type: str, levels: Iterable[int] | str, n_train: int,
               n_eval: int, seed: int = 0, workers: int = 2) -> list[GameRecord]:
    """Make (or find in the cache) `n_train` train and `n_eval` eval games for each level.

    Returns the records of the requested games, train before eval, each split ordered by level then seed.
    Concurrent calls on the same `out_dir` are serialized by a lock file.
    """
    if isinstance(levels, str):
        levels = parse_levels(levels)
    elif isinstance(levels, int):
        levels = [levels]
    else:
        levels = sorted(set(levels))
    for level in levels:
        challenge_settings(game_type, level, 0)
    for name, n in (("n_train", n_train), ("n_eval", n_eval)):
        if not isinstance(n, int) or not 0 <= n <= EVAL_SEED_OFFSET // 2:
            raise ValueError(f"{name} must be an int in [0, {EVAL_SEED_OFFSET // 2}], got {n!r}")
    if not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ValueError(f"seed must be an int in [0, 2**31), got {seed!r}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with _locked(out / ".make_games.lock"):
        manifest = _read_manifest(out)
        older = [e for e in manifest["games"] if "files" not in e]
        for entry in older:  # a manifest from before `files`: its games' files as they are now
            entry["files"] = _game_files(out, entry["path"])
        if older:
            _write_manifest(out, manifest)
        wanted = {(split, level): (n_train if split == "train" else n_eval) for split in SPLITS
                  for level in levels}
        max_skips = 16 + sum(wanted.values())
        n_skipped = 0
        with _Generator(out, workers) as generator:
            while jobs := _missing_jobs(manifest, game_type, wanted, seed):
                for job, result in zip(jobs, generator.run(jobs)):
                    if isinstance(result, str):
                        manifest["skipped"].append({**job, "reason": result})
                        n_skipped += 1
                    else:  # with its files' sizes and sha256 (check_games)
                        manifest["games"].append({**result, "files": _game_files(out, result["path"])})
                _write_manifest(out, manifest)
                if n_skipped > max_skips:
                    raise RuntimeError(f"{game_type} levels {levels}: TextWorld could not build a quest for "
                                       f"{n_skipped} seeds; see 'skipped' in {out / MANIFEST_NAME}")
        chosen = [_select(manifest, game_type, split, level, seed, wanted[(split, level)])
                  for split in SPLITS for level in levels]
    return [_record(out, entry) for group in chosen for entry in group]


def load_manifest(path: str | os.PathLike, split: str | None = None, game_type: str | None = None,
                  levels: Sequence[int] | None = None) -> list[GameRecord]:
    """The records of a manifest (its folder or the file itself), optionally filtered."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    if not (folder / MANIFEST_NAME).is_file():
        raise FileNotFoundError(f"no {MANIFEST_NAME} in {str(folder)!r}; run make_games first")
    if split is not None and split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS}")
    records = [_record(folder.resolve(), e) for e in _read_manifest(folder, drop_missing=False)["games"]]
    return [r for r in records if (split is None or r.split == split)
            and (game_type is None or r.type == game_type) and (levels is None or r.level in levels)]


def check_games(records: Sequence[GameRecord]) -> list[tuple[GameRecord, str]]:
    """(record, what is wrong) for every game of `records` whose files are missing, or differ in size or sha256
    from its manifest entry; empty when every game is intact."""
    damaged = []
    for record in records:
        folder = Path(record.path).parent.parent  # <manifest folder>/<type>/<id>.z8
        files = record.files or {os.path.relpath(record.path, folder): None}
        for rel, want in files.items():
            path = folder / rel
            if not path.is_file():
                damaged.append((record, f"{path}: missing"))
                break
            if want is None:
                continue
            size = path.stat().st_size
            if size != want["size"]:
                damaged.append((record, f"{path}: {size} bytes, the manifest says {want['size']}"))
                break
            if _sha256(path) != want["sha256"]:
                damaged.append((record, f"{path}: sha256 differs from the manifest's (the file is damaged)"))
                break
    return damaged


def require_games(records: Sequence[GameRecord], skip: bool) -> tuple[list[GameRecord], list[str]]:
    """(the intact games of `records`, one line per damaged one). Without `skip` a damaged game is a
    GameFileError naming every damaged file (`seedfast envs make` makes a deleted one again)."""
    damaged = check_games(records)
    problems = [f"game {r.id}: {why}" for r, why in damaged]
    if damaged and not skip:
        raise GameFileError(f"{len(damaged)} of {len(records)} games are missing or damaged: " + "; ".join(problems)
                            + " (`seedfast envs make` makes deleted games again; env.damaged_games=skip plays "
                              "without them)")
    bad = {id(r) for r, _ in damaged}
    return [r for r in records if id(r) not in bad], problems


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _game_files(out_dir: Path, rel_z8: str) -> dict[str, dict[str, Any]]:
    """The size and sha256 of a compiled game and of the .json TextWorld reads beside it."""
    z8 = out_dir / rel_z8
    files = {}
    for path in sorted(z8.parent.glob(z8.stem + ".*")):
        if path.is_file() and path.suffix in (".z8", ".json"):  # what a game is played from
            files[os.path.relpath(path, out_dir)] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return files


def envs_make_main(argv: Sequence[str] | None = None) -> int:
    """`seedfast envs make [textworld] --type T --levels 1-5 --train 64 --eval 32 --out DIR`."""
    import argparse

    parser = argparse.ArgumentParser(prog="seedfast envs make",
                                     description="Generate TextWorld games offline with train/eval splits.")
    parser.add_argument("env", nargs="?", default="textworld", choices=["textworld"])
    parser.add_argument("--type", dest="game_type", required=True, choices=GAME_TYPES)
    parser.add_argument("--levels", default="1", help="N, A-B or a comma-separated list (default: %(default)s)")
    parser.add_argument("--train", type=int, default=64, help="train games per level (default: %(default)s)")
    parser.add_argument("--eval", type=int, default=32, help="eval games per level (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="first train seed (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="generator processes (default: %(default)s)")
    parser.add_argument("--out", required=True, help="output folder (holds manifest.json)")
    args = parser.parse_args(argv)
    try:
        levels = parse_levels(args.levels)
        records = make_games(args.out, args.game_type, levels, args.train, args.eval, args.seed, args.workers)
    except ValueError as err:
        parser.error(str(err))
    n_train = sum(r.split == "train" for r in records)
    print(f"{len(records)} {args.game_type} games (train {n_train}, eval {len(records) - n_train}), "
          f"levels {levels[0]}-{levels[-1]}: {Path(args.out) / MANIFEST_NAME}")
    return 0


def _missing_jobs(manifest: dict, game_type: str, wanted: dict, seed: int) -> list[dict[str, Any]]:
    """The seeds still to try so that every (split, level) can have its count of games."""
    jobs = []
    for (split, level), n in wanted.items():
        have = {e["seed"] for e in manifest["games"] if _same(e, game_type, split, level)}
        tried = have | {e["seed"] for e in manifest["skipped"] if _same(e, game_type, split, level)}
        start = first_game_seed(seed, split)
        n_have = sum(start <= s < start + EVAL_SEED_OFFSET for s in have)
        candidate = start
        while n_have < n:
            if candidate not in tried:
                jobs.append({"type": game_type, "level": level, "split": split, "seed": candidate})
                n_have += 1
            candidate += 1
    return jobs


def _select(manifest: dict, game_type: str, split: str, level: int, seed: int, n: int) -> list[dict]:
    start = first_game_seed(seed, split)
    entries = [e for e in manifest["games"] if _same(e, game_type, split, level)
               and start <= e["seed"] < start + EVAL_SEED_OFFSET]
    return sorted(entries, key=lambda e: e["seed"])[:n]


def _same(entry: dict, game_type: str, split: str, level: int) -> bool:
    return entry["type"] == game_type and entry["split"] == split and entry["level"] == level


def _record(folder: Path, entry: dict) -> GameRecord:
    return GameRecord(**{**entry, "path": str(folder / entry["path"])})


class _Generator:
    """Runs `_generate_one` in `workers` processes (in this process when workers == 1)."""

    def __init__(self, out: Path, workers: int):
        self.out, self.workers, self._pool = out, workers, None

    def __enter__(self) -> _Generator:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._pool is not None:  # on an error the workers end at once (they die with this process anyway)
            self._pool.shutdown(wait=exc_type is None, cancel_futures=True)

    def run(self, jobs: list[dict]) -> list[dict | str]:
        if self.workers == 1 or len(jobs) == 1:
            return [_generate_one(str(self.out), job) for job in jobs]
        if self._pool is None:
            self._pool = OwnedProcessPool(self.workers)
        return list(self._pool.map(_generate_one, [str(self.out)] * len(jobs), jobs))


def _parse_knowledge_bases_once() -> None:
    """Each TextWorld challenge's `make` parses its logic and grammar files again for every game
    (`KnowledgeBase.load(KB_PATH)`): a quarter of a game's generation time here (0.24 of 1.0 s). Parsed once
    per process instead. TextWorld itself shares one knowledge base between games (`KnowledgeBase.default()`):
    a game only reads it, and the games are byte-identical either way (tests/envs/test_envs_textworld_games.py)."""
    from textworld.generator.data import KnowledgeBase

    load = KnowledgeBase.load
    if not getattr(load, "parsed_once", False):
        cached = functools.cache(load.__func__)
        cached.parsed_once = True
        KnowledgeBase.load = classmethod(cached)


INFORM_FOLDER = ".inform7"  # in the games folder: Inform 7 with its index off (_inform_home_without_index)


def _real_inform_home() -> Path:
    """Where TextWorld finds Inform 7: $INFORM_HOME, else the copy it ships."""
    from textworld.generator.inform7.world2inform7 import I7_DEFAULT_PATH

    return Path(os.environ.get("INFORM_HOME", I7_DEFAULT_PATH))


def _inform_home_without_index(out: Path) -> Path:
    """An INFORM_HOME under `out` whose `ni` is the real one run with -noindex, for TextWorld's compile_game.

    Inform 7 writes an index of every story it compiles (an IDE's help pages, never read here): about a fifth of a
    compile, which is most of making a game (docs/demo.md, "Where the time goes"). Without it the game files are the
    same bytes (tests/envs/test_envs_textworld_games.py). TextWorld runs `$INFORM_HOME/share/inform7/Compilers/ni`
    with fixed options, so this folder holds a two-line `ni` that adds the option, and links to the real inform6
    and Internal folder. Made once per real Inform (its path's hash names it), atomically: a folder of a name is
    whole."""
    real = _real_inform_home() / "share" / "inform7"
    home = out / INFORM_FOLDER / hashlib.sha256(str(real).encode()).hexdigest()[:12]
    if home.is_dir():
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    tmp = home.parent / f".{home.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    compilers = tmp / "share" / "inform7" / "Compilers"
    compilers.mkdir(parents=True)
    (tmp / "share" / "inform7" / "Internal").symlink_to(real / "Internal", target_is_directory=True)
    (compilers / "inform6").symlink_to(real / "Compilers" / "inform6")
    ni = compilers / "ni"
    ni.write_text(f'#!/bin/sh\nexec {shlex.quote(str(real / "Compilers" / "ni"))} "$@" -noindex\n')
    ni.chmod(0o755)
    try:
        tmp.rename(home)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return home


@contextlib.contextmanager
def _inform_home(home: Path):
    """INFORM_HOME=home for what runs inside (TextWorld reads it when it compiles), restored after."""
    before = os.environ.get("INFORM_HOME")
    os.environ["INFORM_HOME"] = str(home)
    try:
        yield
    finally:
        if before is None:
            del os.environ["INFORM_HOME"]
        else:
            os.environ["INFORM_HOME"] = before


def _generate_one(out_dir: str, job: dict) -> dict | str:
    """Make, compile and verify one game; returns its manifest entry, or why the seed was skipped."""
    import textworld
    import textworld.challenges
    from textworld.generator import QuestGenerationError, compile_game

    from seedfast.envs.textworld_env import TextWorldEnv

    _parse_knowledge_bases_once()
    name, settings = challenge_settings(job["type"], job["level"], job["seed"])
    gid = game_id(job["type"], job["level"], job["seed"])
    rel_path = f"{job['type']}/{gid}.z8"
    options = textworld.GameOptions()
    options.seeds = job["seed"]
    options.path = str(Path(out_dir) / rel_path)
    options.file_ext = ".z8"
    options.force_recompile = True
    _, make, _ = textworld.challenges.CHALLENGES[name]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is not fully supported.*")  # Jericho, on every TextWorld game
        try:
            game = make(settings=settings, options=options)
        except QuestGenerationError as err:
            return f"QuestGenerationError: {err}"
        with _inform_home(_inform_home_without_index(Path(out_dir))):
            path = compile_game(game, options)
    walkthrough = list(game.metadata.get("walkthrough") or [])
    env = TextWorldEnv(path)
    try:
        obs = env.reset()
        won = False
        for action in walkthrough:
            _, _, done, info = env.step(action)
            won = info["won"]
            if done:
                break
    finally:
        env.close()
    if not won:
        raise RuntimeError(f"game {gid}: its own walkthrough {walkthrough} does not win")
    return {"id": gid, "path": rel_path, "split": job["split"], "type": job["type"], "level": job["level"],
            "seed": job["seed"], "objective": obs.task, "walkthrough": walkthrough,
            "max_score": float(game.max_score)}


def _read_manifest(folder: Path, drop_missing: bool = True) -> dict:
    """The manifest of `folder`; `drop_missing`: without the games whose file is deleted (make_games makes them
    again). Readers of the games keep them, to name them (check_games)."""
    path = folder / MANIFEST_NAME
    if not path.is_file():
        return {"version": 1, "games": [], "skipped": []}
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GameFileError(f"{path}: not a readable manifest ({type(err).__name__}: {err})") from None
    if drop_missing:
        manifest["games"] = [e for e in manifest["games"] if (folder / e["path"]).is_file()]
    return manifest


def _write_manifest(folder: Path, manifest: dict) -> None:
    manifest["games"].sort(key=lambda e: (e["type"], e["split"], e["level"], e["seed"]))
    tmp = folder / f".{MANIFEST_NAME}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, folder / MANIFEST_NAME)


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
