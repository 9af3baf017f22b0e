"""What the ScienceWorld tests share: the variation they play (its gold sequence is short under 'easy'), and a
look at a process by its id."""

from pathlib import Path

from seedfast.envs.scienceworld_env import Variation

# chemistry-mix-paint-secondary-color, train variation 0, easy: a gold sequence of about a dozen actions
SHORT = Variation("chemistry-mix-paint-secondary-color", 0, "easy")


def process_state(pid: int) -> str | None:
    """The process's state letter (R, S, T, Z, ...), or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[0]


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie (dead, waiting to be reaped by its new parent)."""
    return process_state(pid) in (None, "Z", "X")
