"""Walkthrough replays: the trajectories behaviour cloning and skill-writing SFT are built from.

Each training game's walkthrough is played in its environment (TextWorldEnv, or ScienceWorld's with its gold
sequence as the walkthrough; in process), recording what the agent loop
records: the observation before each action, its admissible actions, the action and whether it was valid.
For skill writing, a few failures are made per game as well: the walkthrough up to a random step, then
one wrong admissible action, then stop; and the walkthrough stopped one action early.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from seedfast.envs.base import normalize_action
from seedfast.envs.trajectory import Trajectory, TrajectoryStep, record_score
from seedfast.seeds import replay_seed


@dataclass
class GameReplays:
    game_id: str
    success: Trajectory  # the walkthrough, played to its win
    failures: list[Trajectory] = field(default_factory=list)


def play(env: Any, actions: Sequence[str], game_id: str, walkthrough: Sequence[str] | None = None,
         invalid_penalty: float = 0.1) -> Trajectory:
    """Reset `env` and play `actions` until they run out or the episode ends.

    Like the agent loop: `final_observation` stays empty, and a step's reward is the outcome minus
    `invalid_penalty` when its action was not admissible.
    """
    obs = env.reset()
    trajectory = Trajectory(task=obs.task, game_id=game_id,
                            walkthrough=list(walkthrough) if walkthrough is not None else None)
    for action in actions:
        next_obs, _, done, info = env.step(action)
        valid = bool(info.get("valid", True))
        trajectory.steps.append(TrajectoryStep(obs.text, list(obs.admissible_actions), action, [], valid, 0.0,
                                               f"<action>{action}</action>"))
        record_score(trajectory, info)
        obs = next_obs
        if done:
            trajectory.won = bool(info.get("won", False))
            break
    outcome = 1.0 if trajectory.won else 0.0
    for step in trajectory.steps:
        step.reward = outcome - invalid_penalty * (not step.valid)
    trajectory.meta["outcome"] = outcome
    return trajectory


def _wrong_action_plan(success: Trajectory, rng: random.Random) -> list[str] | None:
    """Walkthrough prefix, then an admissible action that is not the walkthrough's (None if there is none)."""
    choices = []
    for index, step in enumerate(success.steps):
        others = [a for a in step.admissible_actions if normalize_action(a) != normalize_action(step.action)]
        if others:
            choices.append((index, sorted(others)))
    if not choices:
        return None
    index, others = rng.choice(choices)
    return [s.action for s in success.steps[:index]] + [rng.choice(others)]


def replay_game(game_path: Any, game_id: str, walkthrough: Sequence[str], *, failures: bool = True,
                seed: int = 0, make_env: Callable[[Any], Any] | None = None) -> GameReplays:
    """The walkthrough's trajectory (it must win) and, with `failures`, up to two failed variants. `make_env(spec)`
    opens the game (default: TextWorldEnv of the game path; ScienceWorld's factory for its variations)."""
    if make_env is None:
        from seedfast.envs.textworld_env import TextWorldEnv as make_env

    if not walkthrough:
        raise ValueError(f"game {game_id!r} has no walkthrough to replay")
    env = make_env(game_path)
    try:
        success = play(env, walkthrough, game_id, walkthrough)
        if not success.won:
            raise ValueError(f"game {game_id!r}: its walkthrough {list(walkthrough)} does not win")
        out = GameReplays(game_id, success)
        if failures:
            rng = random.Random(replay_seed(seed, game_id))
            plans = [_wrong_action_plan(success, rng)]
            if len(walkthrough) > 1:
                plans.append(list(walkthrough[:-1]))
            for plan in plans:
                if plan is not None:
                    trajectory = play(env, plan, game_id, walkthrough)
                    if not trajectory.won:  # a wrong action that still wins is no failure
                        out.failures.append(trajectory)
        return out
    finally:
        env.close()


def replay_games(tasks: Sequence[Any], *, failures: bool = True, seed: int = 0,
                 make_env: Callable[[Any], Any] | None = None) -> list[GameReplays]:
    """replay_game for each seedfast.rollout.agent_loop.Task (game_id, spec = game path, walkthrough)."""
    return [replay_game(t.spec, t.game_id, t.walkthrough or [], failures=failures, seed=seed, make_env=make_env)
            for t in tasks]
