"""log.progress: who draws a progress bar (runtime/progress.py), and the bar itself."""

import io
import sys

import pytest

from seedfast.config import load_config
from seedfast.runtime import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("setting, is_main, terminal, shown", [
    ("true", True, True, True),
    ("false", True, True, False),  # the option
    ("true", False, True, False),  # another rank of a sharded run
    ("true", True, False, False),  # stderr a file or a pipe
])
def test_a_bar_is_drawn_by_rank_0_on_a_terminal_when_log_progress_asks(monkeypatch, setting, is_main, terminal,
                                                                         shown):
    monkeypatch.setattr(sys, "stderr", Terminal() if terminal else io.StringIO())
    assert progress.shows_progress(load_config(None, [f"log.progress={setting}"]), is_main) is shown


def test_the_bar_counts_from_where_a_resumed_run_starts(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress.ProgressBar(5, "grpo", completed=2)
    bar.advance("grpo success 0.50")
    bar.close()
    first, *_, last = sys.stderr.getvalue().split("\r")  # the frames drawn
    assert "2/5" in first and "grpo success 0.50" in last and "3/5" in last
