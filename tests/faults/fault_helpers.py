"""Shared by the fault tests: a tiny RL run through the CLI (in this process, so each case costs its steps and not a
Python start), its run folder copied per case, and the checks every case makes (what is left on disk and running)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from seedfast import cli
from seedfast.runtime.checkpoint import list_checkpoints
from seedfast.runtime.checkpoint_files import verify_files

TRAIN = ["algorithm=grpo", "trainer.keep_checkpoints=3", "trainer.eval_every=0"]


def train_args(overrides, games: Path, out: Path, policy: Path, *extra: str) -> list[str]:
    return ["train", *overrides(games, out), *TRAIN, f"trainer.init_from={policy}", *extra]


def run_train(capsys, overrides, games: Path, out: Path, policy: Path, *extra: str) -> tuple[int, str]:
    """`seedfast train ...` in this process: (exit code, what it printed on stderr)."""
    capsys.readouterr()
    code = cli.main(train_args(overrides, games, out, policy, *extra))
    return code, capsys.readouterr().err


def copy_run(base: Path, out: Path) -> Path:
    """The base run's folder (its `t/` run) copied under `out`; returns the copy's ckpt folder."""
    shutil.copytree(base / "t", out / "t")
    return out / "t" / "ckpt"


def copy_games(games: Path, out: Path) -> Path:
    shutil.copytree(games, out, ignore=shutil.ignore_patterns(".make_games.lock"))
    return out


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _live_children() -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


_BEFORE: set[int] = set()


def remember_children() -> None:
    """Note the child processes alive before a test: an xdist worker keeps the ones earlier tests' libraries own for
    the process's life (multiprocessing's resource tracker, say), which are not this test's to end."""
    _BEFORE.clear()
    _BEFORE.update(_live_children())


def children() -> list[int]:
    """The live child processes of this process started since remember_children() (an environment worker left
    behind would show here)."""
    return [pid for pid in _live_children() if pid not in _BEFORE]


def assert_clean(ckpt: Path, newest: str) -> None:
    """No partial checkpoint folder; the newest complete one is `newest` and verifies against its manifest; no
    process left running."""
    assert not [p.name for p in ckpt.iterdir() if p.name.endswith(".tmp")]
    assert list_checkpoints(ckpt)[-1].name == newest
    assert verify_files(list_checkpoints(ckpt)[-1]) == []
    assert children() == []


def metric_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
