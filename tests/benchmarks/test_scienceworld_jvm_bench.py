"""benchmarks/scienceworld_jvm.py measures a real simulator: a start, and one slot's JVM playing a gold sequence to
its win and moving to another variation."""

import importlib.util
import shutil

import pytest

if not (importlib.util.find_spec("scienceworld") and shutil.which("java")):
    pytest.skip("needs the `scienceworld` package and a Java runtime (`make install`)", allow_module_level=True)

from benchmarks.scienceworld_jvm import play, starts  # noqa: E402


def test_one_start_and_one_task():
    (start,) = starts(1, 256)
    assert 0 < start["start_s"] < 60 and start["rss_mb"] > 20
    (row,), peak = play(["lifespan-longest-lived"], "easy", 256)
    assert row["won"] and row["gold_steps"] >= 3 and row["steps_per_s"] > 0 and row["valid_actions_max"] > 10
    assert peak["peak_rss_mb"] >= peak["rss_mb_end"] > 20
