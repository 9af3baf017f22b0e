"""One TextWorld game file as an `Environment`.

Only admissible actions reach the game. Anything else is answered with a fixed message and leaves the
game untouched: the Z-machine parser would otherwise run chains such as "go south. take coin" in one
step, or accept words the agent was never offered.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import textworld

from seedfast.envs.base import Observation, check_step, normalize_action

GAME_SUFFIXES = (".z8", ".z5", ".json")
INVALID_ACTION_TEXT = "Nothing happens: that is not one of the admissible actions."
_BANNER_CHARS = set(" _|\\/$<>-")
_STATUS_LINE = re.compile(r"\n>[^\n]*$")
_GAME_OVER_PROMPT = re.compile(r"Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command\?")
_MANY_NEWLINES = re.compile(r"\n{3,}")


def clean_feedback(text: str, objective: str = "") -> str:
    """The game text without the ASCII-art banner, the status line, the restart prompt or the objective."""
    lines = text.split("\n")
    while lines and set(lines[0]) <= _BANNER_CHARS:
        lines.pop(0)
    text = "\n".join(line.strip() for line in lines)
    text = _STATUS_LINE.sub("", text)
    text = _GAME_OVER_PROMPT.sub("", text)
    if objective:
        text = text.replace(objective.strip(), "")
    return _MANY_NEWLINES.sub("\n\n", text).strip()


def read_walkthrough(game_path: str | os.PathLike) -> list[str] | None:
    """The walkthrough TextWorld stores in the .json beside a compiled game, if there is one."""
    meta_path = Path(game_path).with_suffix(".json")
    if not meta_path.is_file():
        return None
    with open(meta_path) as f:
        walkthrough = json.load(f).get("metadata", {}).get("walkthrough")
    return list(walkthrough) if walkthrough is not None else None


class TextWorldEnv:
    """`reset()` / `step(action)` over one compiled TextWorld game (.z8)."""

    def __init__(self, game_path: str | os.PathLike):
        if not isinstance(game_path, (str, os.PathLike)):
            raise TypeError(f"game_path must be a path, got {type(game_path).__name__}")
        path = Path(game_path)
        if not path.is_file():
            raise FileNotFoundError(f"game_path {str(path)!r} does not exist")
        if path.suffix not in GAME_SUFFIXES:
            raise ValueError(f"game_path {str(path)!r}: expected a TextWorld game {GAME_SUFFIXES}")
        self.game_path = str(path)
        self.game_id = path.stem
        infos = textworld.EnvInfos(admissible_commands=True, objective=True, won=True, lost=True,
                                   score=True, max_score=True)
        with warnings.catch_warnings():
            # Jericho flags every TextWorld game as "not fully supported" (its own score/move detection).
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            self._env = textworld.start(self.game_path, request_infos=infos)
        self._objective = ""
        self._admissible: list[str] = []
        self._started = False
        self._done = False

    @property
    def walkthrough(self) -> list[str] | None:
        return read_walkthrough(self.game_path)

    def reset(self) -> Observation:
        state = self._env.reset()
        self._objective = (state.objective or "").strip()
        self._started, self._done = True, False
        return self._observe(state, clean_feedback(state.feedback, self._objective))

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        check_step(self.game_id, action, started=self._started, done=self._done)
        canonical = {normalize_action(a): a for a in self._admissible}.get(normalize_action(action))
        if canonical is None:
            obs = Observation(INVALID_ACTION_TEXT, self._objective, list(self._admissible))
            return obs, 0.0, False, {"won": False, "lost": False, "valid": False}
        state, score, _ = self._env.step(canonical)
        won, lost = bool(state.won), bool(state.lost)
        self._done = won or lost
        obs = self._observe(state, clean_feedback(state.feedback))
        info = {"won": won, "lost": lost, "valid": True, "score": score, "max_score": state.max_score}
        return obs, 1.0 if won else 0.0, self._done, info

    def close(self) -> None:
        self._env.close()

    def _observe(self, state: Any, text: str) -> Observation:
        self._admissible = list(state.admissible_commands or [])
        return Observation(text=text, task=self._objective, admissible_actions=list(self._admissible))
