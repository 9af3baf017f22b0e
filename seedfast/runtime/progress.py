"""log.progress: the progress of SFT's optimizer steps and of RL's updates on stderr, by rank 0. A terminal gets a
progress bar (rich); any other stderr (a batch job's log file, a pipe) gets one plain line per step and per phase
(runtime/progress_lines.py), so a log says what the run is doing while it runs."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from seedfast.config import Config
from seedfast.runtime.progress_lines import ProgressLines


def shows_progress(cfg: Config, is_main: bool = True) -> bool:
    """Whether this process reports progress: log.progress and rank 0 (a bar on a terminal, else lines)."""
    return bool(is_main and cfg.log.progress)


class ProgressBar:
    """One bar of `total` units (SFT steps, RL updates), `completed` of them done already (a resumed run); plain
    lines instead when stderr is not a terminal."""

    def __init__(self, total: int, description: str, completed: int = 0) -> None:
        self._lines = None if sys.stderr.isatty() else ProgressLines(total, description, completed)
        if self._lines is not None:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeRemainingColumn(), console=Console(stderr=True))
        self._task = self._bar.add_task(description, total=total, completed=completed)
        self._bar.start()

    def advance(self, description: str, fields: Mapping[str, float] | None = None) -> None:
        """One unit done; `fields` (name -> value) are what its plain line reports."""
        if self._lines is not None:
            self._lines.step(description if fields is None else "", fields or {})
            return
        self._bar.update(self._task, advance=1, description=description)

    def phase(self, text: str) -> None:
        """A phase of the run (evaluation, checkpoint, resume): one line, above the bar on a terminal."""
        if self._lines is not None:
            self._lines.phase(text)
        else:
            self._bar.console.print(text)

    def close(self) -> None:
        if self._lines is None:
            self._bar.stop()
