"""log.progress: a progress bar of SFT's optimizer steps and of RL's updates, drawn on stderr by rank 0 when stderr
is a terminal (a log file or a pipe gets none: the metrics JSON lines say the same)."""

from __future__ import annotations

import sys

from seedfast.config import Config


def shows_progress(cfg: Config, is_main: bool = True) -> bool:
    """Whether this process draws a progress bar: log.progress, rank 0, stderr a terminal."""
    return bool(is_main and cfg.log.progress and sys.stderr.isatty())


class ProgressBar:
    """One bar of `total` units (SFT steps, RL updates), `completed` of them done already (a resumed run)."""

    def __init__(self, total: int, description: str, completed: int = 0) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeRemainingColumn(), console=Console(stderr=True))
        self._task = self._bar.add_task(description, total=total, completed=completed)
        self._bar.start()

    def advance(self, description: str) -> None:
        self._bar.update(self._task, advance=1, description=description)

    def close(self) -> None:
        self._bar.stop()
