"""SDAR's static skill provider: a YAML or JSON file mapping task type -> skill text.

    treasure_hunter: "Read the objective ..."
    pick_and_place_simple: "..."

A top-level `skills:` key holding that mapping is accepted too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from seedfast.envs.trajectory import Trajectory

DEFAULT_LIBRARY = Path(__file__).parent / "data" / "default_skills.yaml"


class SkillLibrary:
    def __init__(self, skills: Mapping[str, str], source: str = "<dict>"):
        if not isinstance(skills, Mapping) or not skills:
            raise ValueError(f"skill library {source}: expected a non-empty mapping task type -> skill text")
        for task_type, text in skills.items():
            if not isinstance(task_type, str) or not isinstance(text, str) or not text.strip():
                raise ValueError(f"skill library {source}: entry {task_type!r} must map a str to non-empty text")
        self.skills = {k: " ".join(v.split()) for k, v in skills.items()}
        self.source = source

    @classmethod
    def from_file(cls, path: str | os.PathLike = DEFAULT_LIBRARY) -> SkillLibrary:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"skill library {str(path)!r} does not exist")
        with open(path) as f:
            if path.suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(f)
            elif path.suffix == ".json":
                data = json.load(f)
            else:
                raise ValueError(f"skill library {str(path)!r}: expected a .yaml, .yml or .json file")
        if isinstance(data, Mapping) and isinstance(data.get("skills"), Mapping):
            data = data["skills"]
        return cls(data, source=str(path))

    @property
    def task_types(self) -> list[str]:
        return sorted(self.skills)

    def get(self, task_type: str) -> str:
        if task_type not in self.skills:
            raise ValueError(f"skill library {self.source} has no skill for task type {task_type!r}; "
                             f"it has {self.task_types}")
        return self.skills[task_type]

    def for_trajectory(self, trajectory: Trajectory) -> str:
        """The skill of the trajectory's task type: `meta['task_type']`, else the game id's prefix."""
        return self.get(task_type_of(trajectory))


def task_type_of(trajectory: Trajectory) -> str:
    """`meta['task_type']` if set; else the game id up to its first '-' ('treasure_hunter-L3-7')."""
    task_type = trajectory.meta.get("task_type")
    if task_type:
        return str(task_type)
    return trajectory.game_id.split("-", 1)[0].split("/", 1)[0]
