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
    ("true", True, False, True),  # stderr a file or a pipe: plain lines (progress_lines.py)
])
def test_progress_is_reported_by_rank_0_when_log_progress_asks(monkeypatch, setting, is_main, terminal,
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


def test_a_log_file_gets_one_plain_line_per_step_and_per_phase(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: a batch job's log
    bar = progress.ProgressBar(10, "grpo", completed=2)
    bar.advance("grpo success 0.50", {"success": 0.5, "reward": 0.4125, "loss": 0.03214, "tokens/s": 1843.4,
                                      "nan": float("nan")})
    bar.phase("checkpoint runs/t/ckpt/step_3 written (0.1 s)")
    bar.advance("sft loss 5.989")
    bar.close()
    lines = sys.stderr.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in sys.stderr.getvalue()
    assert lines[0].split("] ", 1)[1].startswith(
        "grpo step 3/10 | success 0.500 | reward 0.412 | loss 0.03214 | tokens/s 1,843 | elapsed ")
    assert "nan" not in lines[0]
    assert lines[1].endswith("] grpo: checkpoint runs/t/ckpt/step_3 written (0.1 s)")
    assert " grpo step 4/10 | sft loss 5.989 | elapsed " in lines[2]
