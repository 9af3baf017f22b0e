"""ALFWorld (text) as an `Environment`, when the `alfworld` package and its data are installed.

    pip install alfworld && alfworld-download          # data goes to $ALFWORLD_DATA (~/.cache/alfworld)

Games are the `game.tw-pddl` files of the ALFWorld data (json_2.1.1/<split>/<task>/<trial>/), played
through TextWorld's PDDL backend with ALFWorld's own name demangler.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from seedfast.envs.base import Observation, normalize_action

ALFWORLD_SPLITS = {"train": "train", "eval_in_distribution": "valid_seen", "eval_out_of_distribution": "valid_unseen"}
TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")
_INSTALL_HINT = ("the ALFWorld adapter needs the `alfworld` package and its data: "
                 "`pip install alfworld` then `alfworld-download`")
_TASK_MARKER = "Your task is to:"


def _require_alfworld() -> Any:
    try:
        import alfworld.agents.environment.alfred_tw_env as alfred_tw_env
    except ImportError as err:
        raise ImportError(f"{_INSTALL_HINT} ({err})") from err
    return alfred_tw_env


def alfworld_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The ALFWorld data folder: `data_dir`, else $ALFWORLD_DATA, else alfworld's default."""
    if data_dir is None:
        _require_alfworld()
        from alfworld.info import ALFWORLD_DATA

        data_dir = os.environ.get("ALFWORLD_DATA", ALFWORLD_DATA)
    path = Path(data_dir).expanduser()
    if not (path / "json_2.1.1").is_dir():
        raise FileNotFoundError(f"ALFWorld data not found in {str(path)!r} (no json_2.1.1/): {_INSTALL_HINT}")
    return path


def task_type_of(game_file: str | os.PathLike) -> str:
    """'.../pick_and_place_simple-Lettuce-None-CounterTop-25/trial_.../game.tw-pddl' -> 'pick_and_place_simple'."""
    for part in reversed(Path(game_file).parts):
        prefix = part.split("-")[0]
        if prefix in TASK_TYPES:
            return prefix
    raise ValueError(f"game_file {str(game_file)!r} is not under an ALFWorld task folder ({TASK_TYPES})")


def list_alfworld_games(split: str = "train", data_dir: str | os.PathLike | None = None,
                        task_type: str = "all") -> list[str]:
    """Sorted `game.tw-pddl` paths of one split, without the movable/sliced tasks ALFWorld excludes; only those of
    `task_type` (one of TASK_TYPES: the game folder's name up to its first '-') unless it is 'all'."""
    if split not in ALFWORLD_SPLITS:
        raise ValueError(f"split {split!r} is not one of {tuple(ALFWORLD_SPLITS)}")
    if task_type != "all" and task_type not in TASK_TYPES:
        raise ValueError(f"task_type {task_type!r} is not 'all' or one of {TASK_TYPES}")
    root = alfworld_data_dir(data_dir) / "json_2.1.1" / ALFWORLD_SPLITS[split]
    games = [str(p) for p in sorted(root.glob("*/*/game.tw-pddl"))
             if "movable" not in str(p) and "Sliced" not in str(p)]
    if not games:
        raise FileNotFoundError(f"no game.tw-pddl files under {str(root)!r}: {_INSTALL_HINT}")
    if task_type != "all":
        games = [g for g in games if Path(g).parent.parent.name.split("-")[0] == task_type]
        if not games:
            raise FileNotFoundError(f"no {task_type} games under {str(root)!r}")
    return games


class AlfWorldEnv:
    """`reset()` / `step(action)` over one ALFWorld game; the task is the 'Your task is to: ...' line."""

    def __init__(self, game_file: str | os.PathLike, expert_plan: bool = False):
        alfred_tw_env = _require_alfworld()
        import textworld

        path = Path(game_file)
        if path.is_dir():
            path = path / "game.tw-pddl"
        if not path.is_file():
            raise FileNotFoundError(f"game_file {str(path)!r} does not exist")
        self.game_path = str(path)
        self.game_id = path.parent.parent.name + "/" + path.parent.name
        self.task_type = task_type_of(path)
        extras = ["gamefile"] + (["expert_plan"] if expert_plan else [])
        wrappers: list[Any] = [alfred_tw_env.AlfredDemangler(), alfred_tw_env.AlfredInfos]
        if expert_plan:
            wrappers.append(alfred_tw_env.AlfredExpert(expert_type=alfred_tw_env.AlfredExpertType.HANDCODED))
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=extras)
        self._env = textworld.start(self.game_path, request_infos=infos, wrappers=wrappers)
        self._task = ""
        self._admissible: list[str] = []
        self._done = True
        self.expert_plan: list[str] | None = None

    def reset(self) -> Observation:
        state = self._env.reset()
        text = state.feedback.strip()
        head, _, task = text.partition(_TASK_MARKER)
        self._task = task.strip()
        self._done = False
        return self._observe(state, head.replace("-= Welcome to TextWorld, ALFRED! =-", "").strip())

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        if self._done:
            raise RuntimeError(f"{self.game_id}: no running episode; call reset()")
        valid = normalize_action(action) in {normalize_action(a) for a in self._admissible}
        # ALFWorld answers anything it cannot do with "Nothing happens.", as its reference agents expect.
        state, _, _ = self._env.step(" ".join(action.split()))
        won = bool(state.get("won"))
        self._done = won
        return self._observe(state, state.feedback.strip()), 1.0 if won else 0.0, won, {"won": won, "valid": valid}

    def close(self) -> None:
        self._env.close()

    def _observe(self, state: Any, text: str) -> Observation:
        self._admissible = list(state.get("admissible_commands") or [])
        plan = state.get("extra.expert_plan")
        self.expert_plan = list(plan) if plan is not None else None
        return Observation(text=text, task=self._task, admissible_actions=list(self._admissible))
