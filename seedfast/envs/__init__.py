"""Environments: the protocol, TextWorld (games generated offline), ALFWorld, ScienceWorld, and a worker pool.

The worlds' names are imported on first use, so `seedfast.envs` loads without `textworld` or `scienceworld`.
"""

from seedfast.envs.base import Environment, Observation, normalize_action
from seedfast.envs.trajectory import Trajectory, TrajectoryStep
from seedfast.envs.workers import EnvPool, Transition

_LAZY = {
    "TextWorldEnv": "seedfast.envs.textworld_env",
    "GameRecord": "seedfast.envs.textworld_games",
    "make_games": "seedfast.envs.textworld_games",
    "load_manifest": "seedfast.envs.textworld_games",
    "envs_make_main": "seedfast.envs.textworld_games",
    "AlfWorldEnv": "seedfast.envs.alfworld",
    "list_alfworld_games": "seedfast.envs.alfworld",
    "ScienceWorldEnv": "seedfast.envs.scienceworld_env",
    "ScienceWorldFactory": "seedfast.envs.scienceworld_env",
    "Variation": "seedfast.envs.scienceworld_env",
}

__all__ = ["Environment", "Observation", "normalize_action", "Trajectory", "TrajectoryStep", "EnvPool",
           "Transition", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'seedfast.envs' has no attribute {name!r}")
