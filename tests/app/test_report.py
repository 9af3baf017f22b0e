import json

import pytest

from seedfast.app.report import curve_means, held_out_points, write_json, write_report


def test_curve_means_by_hand():
    m = curve_means([0.0, 0.2, 0.2, 0.4, 0.6, 0.6, 0.8, 1.0])
    assert m["first_quarter"] == pytest.approx(0.1) and m["last_half"] == pytest.approx(0.75)
    assert m["all"] == pytest.approx(0.475)
    assert curve_means([0.5]) == {"first_quarter": 0.5, "last_half": 0.5, "all": 0.5}
    assert curve_means([]) == {}


def test_report_shows_the_control_beside_each_algorithm_with_the_means(tmp_path):
    def rows(values, **extra):
        return [{"step": i, "train/success_rate": v, **extra} for i, v in enumerate(values)]

    histories = {"grpo": rows([0.25, 0.5, 0.5, 0.75], **{"train/groups_with_signal": 0.5}),
                 "seed": rows([0.25, 0.5, 0.75, 1.0], **{"teacher/contrast": 0.25, "teacher/opd_share": 0.5})}
    histories["grpo"][-1]["eval/success_rate"] = 0.5
    control = rows([0.25, 0.0, 0.25, 0.25])
    ev = {"eval/success_rate": 0.4, "eval/invalid_rate": 0.1, "eval/episode_length": 3.0}
    path = write_report(tmp_path, histories, floor=0.1, before=ev, after={"grpo": ev, "seed": ev},
                        timings={"sft": 1.0}, setup={"seed": 0}, control=control)
    text = path.read_text()
    assert "| update | control (no learning) | grpo | seed |" in text
    assert "| 4 | 0.250 | 0.750 | 1.000 |" in text
    assert "| mean, first quarter | 0.250 | 0.250 | 0.250 |" in text
    assert "| mean, last half | 0.250 | 0.625 | 0.875 |" in text
    assert "seed means over updates: teacher/contrast 0.250, teacher/opd_share 0.500" in text
    assert not list(tmp_path.glob("*.tmp"))


def test_the_held_out_plot_draws_the_numbers_the_table_prints():
    """The trainer's own end-of-run evaluation (other seeds and batching) says 0.75; the demo's table says 0.852 for
    the same policy: the plot shows the table's number."""
    histories = {"grpo": [{"step": i, "train/success_rate": 0.5} for i in range(16)]}
    histories["grpo"][-1]["eval/success_rate"] = 0.75
    after = {"grpo": {"eval/success_rate": 0.852, "eval/invalid_rate": 0.0, "eval/episode_length": 2.0}}
    assert held_out_points(histories, 0.797, after) == {"grpo": [(0, 0.797), (16, 0.852)]}


def test_write_json_leaves_no_partial_file(tmp_path):
    path = write_json(tmp_path / "a.json", {"x": [1, 2]})
    assert json.loads(path.read_text()) == {"x": [1, 2]} and not list(tmp_path.glob("*.tmp"))
