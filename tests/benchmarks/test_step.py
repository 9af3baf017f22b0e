"""benchmarks/step.py runs every algorithm's step on one shared rollout and reports each phase and its ratio to
GRPO's (it once broke unnoticed: SEED's learn wrote its skills into a run folder only Trainer.run makes)."""

import sys

from benchmarks import step


def test_step_benchmark_reports_every_algorithm_against_grpo(tmp_path, monkeypatch):
    written = {}
    monkeypatch.setattr(step, "write_results", lambda name, result: written.update({name: result}))
    monkeypatch.setattr(sys, "argv", ["step.py", "--tasks", "1", "--n", "2", "--hidden", "32", "--layers", "1",
                                      "--max-steps", "1", "--analysis-tokens", "8", "--reps", "1",
                                      "--games-dir", str(tmp_path / "games")])
    step.main()
    rows = {r["algorithm"]: r for r in written["step"]["rows"]}
    assert set(rows) == {"grpo", "seed (self analyzer)", "seed (oracle skills)", "seed (oracle, current teacher)",
                         "sdar"}
    assert rows["grpo"]["step_vs_grpo"] == 1.0 and rows["seed (self analyzer)"]["analyze"] > 0
    for r in rows.values():
        assert r["update"] > 0 and abs(r["step_s"] - (r["learner_s"] + r["rollout"])) < 2e-3
