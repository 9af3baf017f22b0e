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

The new names are either made-up words or, with `textworld_object_names()`, the names of portable things in
TextWorld's own house grammar (the engine's vocabulary, the words a pretrained model would already know): a
made-up name splits into word pieces no real name uses, so copying them did not carry over to held-out
objects (docs/demo.md, "Renamed copies").
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from functools import cache
from importlib import resources

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


@cache
def textworld_object_names() -> tuple[str, ...]:
    """The plain names of the portable things (objects, food, keys) in TextWorld's house grammar, sorted."""
    grammar = resources.files("textworld.generator.data").joinpath("text_grammars/house_obj.twg").read_text()
    names = set()
    for line in grammar.splitlines():
        key, sep, values = line.partition(":")
        if sep and not key.startswith("#") and re.search(r"\((o|f|k)\)_noun", key):
            names.update(v.strip() for v in values.split(";") if v.strip() and "#" not in v)
    if not names:
        raise RuntimeError("TextWorld's house grammar lists no object names: its format changed")
    return tuple(sorted(names))


def _unused_word(rng: random.Random, words: set[str]) -> str:
    """A made-up word that is not in `words`."""
    new = made_up_word(rng)
    while new in words:
        new = made_up_word(rng)
    return new


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
                   turn_compass: bool = True, pool: Sequence[str] | None = None) -> list[Trajectory]:
    """`copies` renamed copies of each trajectory that takes an object (others are skipped), new names
    drawn with `seed` from `pool` (None: made-up words) so that none shares a word with that trajectory's
    text, and, with `turn_compass`, a random non-identity symmetry of the compass."""
    rng = random.Random(seed)
    turns = compass_turns()[1:]
    out = []
    for trajectory in trajectories:
        objects = taken_objects(trajectory.actions)
        if not objects:
            continue
        text = " ".join([trajectory.task, *(s.observation for s in trajectory.steps),
                         *(a for s in trajectory.steps for a in s.admissible_actions)])
        words = set(re.findall(r"[a-z]+", text.lower()))
        free = [n for n in pool or () if not words & set(re.findall(r"[a-z]+", n.lower()))]
        if pool is not None and len(free) < len(objects):
            raise ValueError(f"renamed_copies: {trajectory.game_id!r} leaves {len(free)} unused names in the "
                             f"pool for {len(objects)} objects")
        for _ in range(copies):
            drawn = rng.sample(free, len(objects)) if pool is not None else [_unused_word(rng, words) for _ in objects]
            names = dict(zip(objects, drawn))
            if turn_compass:
                names.update({k: v for k, v in rng.choice(turns).items() if k != v})
            out.append(rename(trajectory, names))
    return out
