"""Renamed walkthroughs: copies of a replay whose target object has a made-up name and whose compass is turned.

A tiny model trained from scratch on a few hundred games sees a few dozen object names, each of which its
BPE learns as one token; it then memorizes "take passkey" per game instead of reading the name from the
task, and on a held-out game whose object it never saw (split into word pieces) it writes a name it knows.
Copies of the walkthroughs with the taken object renamed to a pronounceable made-up word (several word
pieces, never the same twice) make the only way to the right action reading the name from the task and
copying it (docs/demo.md, "Renamed copies"). The same holds for directions: a model can
memorize that the cellar's game goes south; in a copy the compass is turned (a rotation or reflection, so
opposite directions stay opposite, in the task, the observations and the actions alike) and only the task
says which way to go. Nothing here knows the held-out games' names.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from seedfast.envs.trajectory import Trajectory, TrajectoryStep

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "gl", "st", "tr", "pl")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "k")
COMPASS = ("north", "east", "south", "west")  # clockwise


def compass_turns() -> list[dict[str, str]]:
    """The 8 symmetries of the compass (4 rotations, 4 reflections) as word maps; opposites stay opposite."""
    turns = []
    for flip in (False, True):
        order = COMPASS if not flip else (COMPASS[0], COMPASS[3], COMPASS[2], COMPASS[1])
        for shift in range(4):
            turns.append({COMPASS[i]: order[(i + shift) % 4] for i in range(4)})
    return turns


def made_up_word(rng: random.Random, syllables: tuple[int, int] = (2, 3)) -> str:
    """A pronounceable lowercase word of 2-3 syllables, e.g. 'glomaris'."""
    count = rng.randint(*syllables)
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(count))


def taken_objects(actions: Sequence[str]) -> list[str]:
    """Names of the objects a walkthrough takes ('take X' / 'take X from Y')."""
    names = []
    for action in actions:
        if action.startswith("take "):
            names.append(action[5:].split(" from ")[0].strip())
    return [n for n in dict.fromkeys(names) if n]


def rename(trajectory: Trajectory, names: dict[str, str]) -> Trajectory:
    """A copy of `trajectory` with every whole-word occurrence of each key of `names` replaced by its value
    (task, observations, admissible actions, actions, walkthrough)."""
    if not names:
        raise ValueError(f"rename {trajectory.game_id!r}: no names to replace")
    pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(names, key=len, reverse=True)) + r")\b")

    def sub(text: str) -> str:
        return pattern.sub(lambda m: names[m.group(1)], text)

    steps = [TrajectoryStep(sub(s.observation), [sub(a) for a in s.admissible_actions], sub(s.action), [],
                            s.valid, s.reward, sub(s.response_text)) for s in trajectory.steps]
    return Trajectory(task=sub(trajectory.task), game_id=f"{trajectory.game_id}~renamed", steps=steps,
                      won=trajectory.won, final_observation=sub(trajectory.final_observation),
                      error=trajectory.error,
                      walkthrough=[sub(a) for a in trajectory.walkthrough] if trajectory.walkthrough else None,
                      meta=dict(trajectory.meta, renamed=dict(names)))


def renamed_copies(trajectories: Sequence[Trajectory], copies: int, seed: int,
                   turn_compass: bool = True) -> list[Trajectory]:
    """`copies` renamed copies of each trajectory that takes an object (others are skipped), made-up names
    drawn with `seed` (a name is never one of the words already in that trajectory) and, with
    `turn_compass`, a random non-identity symmetry of the compass."""
    rng = random.Random(seed)
    turns = compass_turns()[1:]
    out = []
    for trajectory in trajectories:
        objects = taken_objects(trajectory.actions)
        if not objects:
            continue
        words = set(re.findall(r"[a-z]+", trajectory.task.lower()))
        for _ in range(copies):
            names = {}
            for name in objects:
                new = made_up_word(rng)
                while new in words:
                    new = made_up_word(rng)
                names[name] = new
            if turn_compass:
                names.update({k: v for k, v in rng.choice(turns).items() if k != v})
            out.append(rename(trajectory, names))
    return out
