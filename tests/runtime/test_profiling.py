import pytest
import torch

from seedfast.config import ConfigError, TrainerConfig
from seedfast.runtime import profiling
from seedfast.runtime.profiling import PhaseTimer, ProfileWindow


def _window(spec: str | None) -> range | None:
    return TrainerConfig(profile_steps=spec).profile_range()


def test_profile_steps_parse_both_ends_included_and_errors():
    assert list(_window("5:7")) == [5, 6, 7]
    assert list(_window("5:5")) == [5]
    assert _window(None) is None
    for bad in ("7:5", "a:b", "5", "-1:2"):
        with pytest.raises(ConfigError, match="trainer.profile_steps"):
            _window(bad)


class _FakeCudart:
    def __init__(self, log: list[str]):
        self.log = log

    def cudaProfilerStart(self) -> None:  # noqa: N802 (CUDA's name)
        self.log.append("start")

    def cudaProfilerStop(self) -> None:  # noqa: N802
        self.log.append("stop")


def _captured(monkeypatch, spec: str, steps: range) -> list[int]:
    """The steps that run between cudaProfilerStart and cudaProfilerStop, with a fake CUDA runtime."""
    log: list[str] = []
    monkeypatch.setattr(profiling, "_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart(log))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    window = ProfileWindow(_window(spec))
    captured = []
    for step in steps:
        window.before_step(step)
        if log and log[-1] == "start":
            captured.append(step)
        window.after_step(step)
    assert log == ["start", "stop"]  # one capture, closed
    return captured


@pytest.mark.parametrize(("spec", "expected"), [("5:5", [5]), ("5:7", [5, 6, 7]), ("0:1", [0, 1])])
def test_profile_window_captures_a_through_b(monkeypatch, spec, expected):
    assert _captured(monkeypatch, spec, range(10)) == expected


def test_profile_window_resumed_inside_the_window_captures_the_rest(monkeypatch):
    assert _captured(monkeypatch, "5:7", range(6, 10)) == [6, 7]


def test_phase_timer_accumulates_per_phase():
    t = PhaseTimer()
    for _ in range(2):
        with t.phase("rollout"):
            sum(range(1000))
    with t.phase("update"):
        pass
    m = t.metrics()
    assert set(m) == {"time/rollout", "time/update"} and m["time/rollout"] > 0


def test_profile_window_is_a_no_op_without_cuda(monkeypatch):
    monkeypatch.setattr(profiling, "_cuda", lambda: False)
    w = ProfileWindow(range(0, 2))
    w.before_step(0)
    w.after_step(0)
    assert not w.active
