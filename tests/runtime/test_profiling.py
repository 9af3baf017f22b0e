import pytest

from seedfast.runtime.profiling import PhaseTimer, ProfileWindow, parse_profile_steps


def test_profile_steps_parse_and_errors():
    assert parse_profile_steps("5:7") == (5, 7)
    assert parse_profile_steps(None) is None
    for bad in ("7:5", "a:b", "5", "-1:2"):
        with pytest.raises(ValueError, match="--profile-steps"):
            parse_profile_steps(bad)


def test_phase_timer_accumulates_per_phase():
    t = PhaseTimer()
    for _ in range(2):
        with t.phase("rollout"):
            sum(range(1000))
    with t.phase("update"):
        pass
    m = t.metrics()
    assert set(m) == {"time/rollout", "time/update"} and m["time/rollout"] > 0


def test_profile_window_is_a_no_op_without_cuda():
    w = ProfileWindow((0, 1))
    w.before_step(0)
    w.after_step(0)
    assert not w.active
