"""A trajectory as prompt text: the turns an analyzer, a reflector or a judge reads."""

from __future__ import annotations

from seedfast.envs.trajectory import Trajectory


def outcome_label(trajectory: Trajectory) -> str:
    return "SUCCEEDED" if trajectory.won else "FAILED"


def clip(text: str, max_chars: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[: max(0, max_chars - 3)].rstrip() + "..."


def render_turns(trajectory: Trajectory, max_observation_chars: int = 400, max_steps: int = 30) -> str:
    """'[Step i] Observation: ... / Action: ...' for each step (0-based, as step skills are keyed).

    Over `max_steps`, the first and last halves are kept and the middle is replaced by one line, so that
    step numbers stay those of the trajectory.
    """
    if max_steps < 2:
        raise ValueError(f"max_steps must be at least 2, got {max_steps}")
    n = len(trajectory.steps)
    if n <= max_steps:
        shown = list(range(n))
    else:
        head = max_steps // 2
        shown = list(range(head)) + list(range(n - (max_steps - head), n))
    lines = []
    for k, index in enumerate(shown):
        if k > 0 and index != shown[k - 1] + 1:
            lines.append(f"[... steps {shown[k - 1] + 1}-{index - 1} omitted ...]")
        step = trajectory.steps[index]
        lines.append(f"[Step {index}] Observation: {clip(step.observation, max_observation_chars)}")
        marker = "" if step.valid else "  (invalid: not an admissible action)"
        lines.append(f"Action: {clip(step.action, 200)}{marker}")
    if trajectory.final_observation:
        lines.append(f"[After step {n - 1}] Observation: {clip(trajectory.final_observation, max_observation_chars)}")
    if trajectory.error:
        lines.append(f"[The episode was cut short by an environment error: {clip(trajectory.error, 120)}]")
    return "\n".join(lines) if lines else "(no steps)"


def outcome_line(trajectory: Trajectory) -> str:
    details = [f"{len(trajectory.steps)} steps"]
    if trajectory.n_invalid:
        details.append(f"{trajectory.n_invalid} invalid actions")
    return f"{outcome_label(trajectory)} ({', '.join(details)})"
