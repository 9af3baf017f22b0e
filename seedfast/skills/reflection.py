"""GRSD text side: reflection prompt and parser, judges (0-3), guidance prompt and validator (docs/algorithms.md,
'GRSD').

Stage A: the policy reflects on each trajectory (3-5 numbered key points); a judge scores each reflection.
Stage B: for a group with a success and a failure, a snapshot of the policy writes guidance with exactly
the sections `### Key points to DO` and `### Mistakes to AVOID`, 3-5 bullets each.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from seedfast.envs.base import normalize_action
from seedfast.envs.trajectory import Trajectory
from seedfast.skills.chat_client import ChatClient, ChatError
from seedfast.skills.render import outcome_label, render_turns

MIN_KEY_POINTS, MAX_KEY_POINTS = 3, 5  # the GRSD reference asks for 3-5
MAX_SCORE = 3
DO_HEADING = "### Key points to DO"
AVOID_HEADING = "### Mistakes to AVOID"
MIN_BULLETS, MAX_BULLETS = 3, 5
_NUMBERED = re.compile(r"^\s*(\d+)[.)]\s+(.*\S)\s*$")
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.*\S)\s*$")
_HEADING = re.compile(r"^\s*(#{1,6})\s*(.*?)\s*$")
_SCORE = re.compile(r"score[*_\s]*[:=]?[*_\s]*(-?[0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)


# ---- stage A: reflection --------------------------------------------------------------------------

def build_reflection_messages(trajectory: Trajectory, max_observation_chars: int = 300,
                              max_steps: int = 30) -> list[dict[str, str]]:
    """Task, outcome (SUCCEEDED/FAILED) and turns; asks for 3-5 numbered key points."""
    content = "\n\n".join([
        f"Task: {trajectory.task}",
        f"Outcome: {outcome_label(trajectory)}",
        "Turns:\n" + render_turns(trajectory, max_observation_chars, max_steps),
        (f"Reflect on this episode in {MIN_KEY_POINTS} to {MAX_KEY_POINTS} numbered key points (1., 2., ...): "
         "name the turns "
         "that decided the outcome, explain how they led to it, and state the concrete behaviour to "
         "repeat or to avoid next time. Write nothing else."),
    ])
    return [{"role": "user", "content": content}]


@dataclass
class Reflection:
    points: list[str] = field(default_factory=list)
    valid: bool = False
    reason: str = "ok"
    raw: str = ""

    @property
    def text(self) -> str:
        return "\n".join(f"{i}. {p}" for i, p in enumerate(self.points, 1))


def parse_reflection(raw: str) -> Reflection:
    """3-5 points numbered 1, 2, ... in order; other lines continue the point above them."""
    if not isinstance(raw, str):
        raise TypeError(f"raw must be a str, got {type(raw).__name__}")
    points: list[str] = []
    for line in raw.splitlines():
        match = _NUMBERED.match(line)
        if match and int(match.group(1)) == len(points) + 1:
            points.append(match.group(2))
        elif points and line.strip():
            points[-1] += " " + line.strip()
    if not MIN_KEY_POINTS <= len(points) <= MAX_KEY_POINTS:
        return Reflection(points, False, f"expected {MIN_KEY_POINTS}-{MAX_KEY_POINTS} numbered points, found "
                                         f"{len(points)}", raw)
    if any(len(p.split()) < 3 for p in points):
        return Reflection(points, False, "a key point has fewer than 3 words", raw)
    return Reflection(points, True, "ok", raw)


# ---- stage A: judges ----------------------------------------------------------------------------------

class Judge(Protocol):
    def score(self, trajectories: Sequence[Trajectory], reflections: Sequence[str]) -> list[int | None]: ...


def build_judge_messages(trajectory: Trajectory, reflection: str, max_observation_chars: int = 300,
                         max_steps: int = 30) -> list[dict[str, str]]:
    content = "\n\n".join([
        f"Task: {trajectory.task}",
        f"Outcome: {outcome_label(trajectory)}",
        "Turns:\n" + render_turns(trajectory, max_observation_chars, max_steps),
        "Reflection to grade:\n" + reflection.strip(),
        ("Grade the reflection from 0 to 3, one point each for: causal accuracy (it names the turns that "
         "really decided the outcome), outcome consistency (it agrees with the outcome above), and "
         'actionability (it gives behaviour one can act on). Answer with JSON only: {"score": <0-3>}'),
    ])
    return [{"role": "system", "content": "You are a strict grader of agent self-reflections."},
            {"role": "user", "content": content}]


def parse_judge_score(raw: str) -> int | None:
    """The integer 0-3 in {"score": n} or 'Score: n'; None if there is none or it is out of range."""
    if not isinstance(raw, str):
        raise TypeError(f"raw must be a str, got {type(raw).__name__}")
    from seedfast.skills.parse import extract_json_object

    obj = extract_json_object(raw)
    value: object = obj.get("score") if obj else None
    if value is None:
        match = _SCORE.search(raw)
        value = match.group(1) if match else None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() and 0 <= number <= MAX_SCORE else None


class ExternalJudge:
    """Scores reflections with an OpenAI-compatible model; None where the request or the answer failed."""

    def __init__(self, client: ChatClient):
        if not isinstance(client, ChatClient):
            raise TypeError(f"client must be a ChatClient, got {type(client).__name__}")
        self.client = client

    def score(self, trajectories: Sequence[Trajectory], reflections: Sequence[str]) -> list[int | None]:
        _check_pairs(trajectories, reflections)
        answers = self.client.complete_many([build_judge_messages(t, r) for t, r in zip(trajectories, reflections)])
        return [None if isinstance(a, ChatError) else parse_judge_score(a) for a in answers]


class OracleJudge:
    """Deterministic 0-3 from the trajectory and its walkthrough, one point each for:
    structure (3-5 numbered points), grounding (it quotes an action the agent took), and the
    decisive action (a failure: the walkthrough action where the agent first deviated, or the next one it
    never reached; a success: the winning action). An unparsable reflection scores 0."""

    def score(self, trajectories: Sequence[Trajectory], reflections: Sequence[str]) -> list[int | None]:
        _check_pairs(trajectories, reflections)
        return [self._score_one(t, r) for t, r in zip(trajectories, reflections)]

    @staticmethod
    def _score_one(trajectory: Trajectory, reflection: str) -> int:
        parsed = parse_reflection(reflection)
        if not parsed.valid:
            return 0
        text = normalize_action(parsed.text)
        taken = [normalize_action(s.action) for s in trajectory.steps if s.action.strip()]
        score = 1 + any(a in text for a in taken)
        decisive = decisive_action(trajectory)
        return score + int(decisive is not None and normalize_action(decisive) in text)


def decisive_action(trajectory: Trajectory) -> str | None:
    """The action that decided the outcome, by the walkthrough (None without one)."""
    if trajectory.won:
        valid = [s.action for s in trajectory.steps if s.valid]
        return valid[-1] if valid else None
    plan = trajectory.walkthrough or []
    taken = [normalize_action(s.action) for s in trajectory.steps]
    for index, action in enumerate(plan):
        if index >= len(taken) or taken[index] != normalize_action(action):
            return action
    return None


def _check_pairs(trajectories: Sequence[Trajectory], reflections: Sequence[str]) -> None:
    if len(trajectories) != len(reflections):
        raise ValueError(f"{len(trajectories)} trajectories but {len(reflections)} reflections")
    for index, reflection in enumerate(reflections):
        if not isinstance(reflection, str):
            raise TypeError(f"reflections[{index}] must be a str, got {type(reflection).__name__}")


# ---- stage B: guidance --------------------------------------------------------------------------------

def build_guidance_messages(task: str, success_reflections: Sequence[str],
                            failure_reflections: Sequence[str]) -> list[dict[str, str]]:
    """Contrast the reflections of successes and failures on one task into DO / AVOID guidance."""
    if not success_reflections or not failure_reflections:
        raise ValueError("guidance needs at least one success and one failure reflection "
                         f"(got {len(success_reflections)} and {len(failure_reflections)})")

    def block(title: str, items: Sequence[str]) -> str:
        return title + "\n" + "\n\n".join(f"({i}) {r.strip()}" for i, r in enumerate(items, 1))

    content = "\n\n".join([
        f"Task: {task}",
        block("Reflections on attempts that SUCCEEDED:", success_reflections),
        block("Reflections on attempts that FAILED:", failure_reflections),
        ("Contrast the two sets: keep what the successes did that the failures did not, and the mistakes "
         "only the failures made. Write guidance for this task with exactly these two sections and "
         f"{MIN_BULLETS}-{MAX_BULLETS} bullets ('- ...') in each, and nothing else:\n"
         f"{DO_HEADING}\n- ...\n{AVOID_HEADING}\n- ..."),
    ])
    return [{"role": "user", "content": content}]


@dataclass
class Guidance:
    do: list[str] = field(default_factory=list)
    avoid: list[str] = field(default_factory=list)
    valid: bool = False
    reason: str = "ok"
    raw: str = ""

    @property
    def text(self) -> str:
        """Canonical form, the privileged text that goes into the teacher context."""
        lines = [DO_HEADING, *(f"- {b}" for b in self.do), AVOID_HEADING, *(f"- {b}" for b in self.avoid)]
        return "\n".join(lines)


def validate_guidance(raw: str) -> Guidance:
    """Exactly the two headings (once each, DO first, no other heading), 3-5 non-empty bullets under each.
    Text before the first heading is ignored; any other non-bullet line inside a section is an error."""
    if not isinstance(raw, str):
        raise TypeError(f"raw must be a str, got {type(raw).__name__}")
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in raw.splitlines():
        heading = _HEADING.match(line)
        if heading:
            title = heading.group(2).rstrip(":").strip().lower()
            if len(heading.group(1)) == 3 and title == DO_HEADING[4:].lower():
                key = "do"
            elif len(heading.group(1)) == 3 and title == AVOID_HEADING[4:].lower():
                key = "avoid"
            else:
                return Guidance(raw=raw, reason=f"unexpected heading {line.strip()!r}")
            if key in sections:
                return Guidance(raw=raw, reason=f"section {line.strip()!r} appears twice")
            if key == "avoid" and "do" not in sections:
                return Guidance(raw=raw, reason=f"'{AVOID_HEADING}' comes before '{DO_HEADING}'")
            sections[key], current = [], key
        elif current is not None and line.strip():
            bullet = _BULLET.match(line)
            if not bullet:
                return Guidance(raw=raw, reason=f"not a bullet in a section: {line.strip()[:60]!r}")
            sections[current].append(" ".join(bullet.group(1).split()))
    for key, heading in (("do", DO_HEADING), ("avoid", AVOID_HEADING)):
        if key not in sections:
            return Guidance(raw=raw, reason=f"missing section '{heading}'")
        n = len(sections[key])
        if not MIN_BULLETS <= n <= MAX_BULLETS:
            return Guidance(raw=raw, reason=f"'{heading}' has {n} bullets, expected {MIN_BULLETS}-{MAX_BULLETS}")
    return Guidance(sections["do"], sections["avoid"], True, "ok", raw)

