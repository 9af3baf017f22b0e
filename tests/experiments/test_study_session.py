"""experiments/study_session.py: the plan's order and dependencies, the scheduler's deadline and skips, a start's
fingerprint and what a lost start supersedes, and landing a record on a scratch main (no run is made)."""

import json
import subprocess

import pytest
import torch
from safetensors.torch import save_file

from experiments import study, study_session
from experiments.study_session import Job, next_job, plan


def names(jobs):
    return [j.name for j in jobs]


def test_a_seed_bundle_is_its_start_gap_and_seven_arms_after_the_whole_selection():
    jobs = plan(["select", "5"], "P1", selection_done=False)
    assert names(jobs)[:5] == ["games", "start s11", "gap s11", "select control", "select grpo"]
    assert len([j for j in jobs if j.name.startswith("select ")]) == 14  # control, GRPO, 4 lambdas x 3 forms
    run = next(j for j in jobs if j.name == "run s5 gate")
    assert run.argv == ["run", "--seeds", "5", "--arms", "gate"]
    assert "gap s5" in run.after and "select reverse_kl/1" in run.after and len(run.after) == 15
    assert next(j for j in jobs if j.name == "start s5").after == ("games",)
    assert [n for n in names(jobs) if n.startswith("run s5")] == [f"run s5 {a}" for a in study.ARMS]


def test_without_the_selection_bundle_runs_wait_for_a_recorded_selection_or_never_start():
    done = plan(["6"], "P1", selection_done=True)
    assert next(j for j in done if j.name == "run s6 grpo").after == ("gap s6",)
    missing = plan(["6"], "P1", selection_done=False)
    run = next(j for j in missing if j.name == "run s6 grpo")
    for j in missing:
        if j.name in ("games", "start s6", "gap s6"):
            j.state = "done"
    assert next_job(missing, now=0.0, until=1e9) is None and run.state == "skipped"


def test_bundles_other_than_the_selection_and_the_studys_seeds_are_refused():
    with pytest.raises(SystemExit, match="--bundles 11"):
        plan(["11"], "P1", selection_done=True)


def test_a_job_starts_only_when_its_dependencies_are_done_and_its_estimate_fits():
    a, b, c = Job("a", 1, [], 100.0), Job("b", 1, [], 100.0, ("a",)), Job("c", 1, [], 10.0)
    jobs = [a, b, c]
    assert next_job(jobs, now=0.0, until=1000.0) is a
    a.state = "running"
    assert next_job(jobs, now=0.0, until=1000.0) is c  # b waits for a; c is free
    c.state = "running"
    assert next_job(jobs, now=0.0, until=1000.0) == "wait"
    a.state = c.state = "done"
    assert next_job(jobs, now=900.0, until=1000.0) is None  # 1.5 x 100 s does not fit in 100 s
    assert next_job(jobs, now=850.0, until=1000.0) is b


def test_a_job_whose_waiting_dependency_cannot_fit_is_not_waited_for():
    a = Job("a", 1, [], 100.0, (), "running")
    b = Job("b", 1, [], 100.0)  # fits alone: 1.5 x 100 s before 1000 s
    c = Job("c", 1, [], 100.0, ("b",))  # c needs b first: 1.5 x 200 s does not fit
    assert next_job([a, b, c], now=800.0, until=1000.0) is b
    b.state = "running"
    assert next_job([a, b, c], now=800.0, until=1000.0) == "wait"  # b runs, c may still fit after it
    a.state, b.state = "done", "waiting"
    assert next_job([a, b, c], now=860.0, until=1000.0) is None  # b no longer fits, so neither does c


def test_an_hour_not_in_hh_mm_is_refused_naming_the_option(capsys):
    with pytest.raises(SystemExit):
        study_session.main(["--until", "4pm"])
    assert "--until '4pm': give the hour as HH:MM" in capsys.readouterr().err


def test_the_pools_games_are_the_starts_command_with_the_pools_overrides_last():
    starts = study_session.games_argv()
    pool = study_session.games_argv("env.levels=9-10", "env.max_steps=6")
    assert pool[:len(starts)] == starts and pool[len(starts):] == ["env.levels=9-10", "env.max_steps=6"]
    assert starts[-3:] == [study.CONFIG, "env.games_dir=runs/sparse/games", "env.n_eval=32"]


def test_jobs_behind_a_failed_one_are_skipped():
    jobs = [Job("a", 1, [], 1.0, (), "failed"), Job("b", 1, [], 1.0, ("a",)), Job("c", 1, [], 1.0, ("b",))]
    assert next_job(jobs, now=0.0, until=1e9) is None
    assert [j.state for j in jobs] == ["failed", "skipped", "skipped"]


def study_file(tmp_path, **parts):
    data = {**study._base(), "study_commit": "c" * 40, "pool": {"name": "P1"}, **parts}
    path = tmp_path / "study.json"
    path.write_text(json.dumps(data))
    return path


def policy(tmp_path, value: float):
    folder = tmp_path / f"policy{value}"
    folder.mkdir()
    save_file({"w": torch.full((4,), value)}, str(folder / "model.safetensors"))
    return folder


def test_a_start_without_a_recorded_fingerprint_supersedes_what_its_seed_made(tmp_path):
    lost = {"wall_s": 1.0, "machine": {"cpu": "AMD EPYC"}}
    path = study_file(tmp_path, starts={"sparse/s5": {"sft": {"wall_s": 2.0}, "pool": "P1",
                                                      "eval/success_rate": 0.5}},
                      teacher_gap={"P1/s5": {"g": 1}, "P2/s5": {"g": 2}, "P1/s6": {"g": 3}},
                      runs={"sparse/s5/grpo": {"r": 1}, "sparse/s6/grpo": {"r": 2}})
    said = study_session.fingerprint_start(path, policy(tmp_path, 1.0), 5, "P1", lost, "Intel Xeon")
    data = json.loads(path.read_text())
    assert "superseded" in said
    assert set(data["teacher_gap"]) == {"P2/s5", "P1/s6"}  # the other pools' gaps decided the pool: kept
    assert set(data["runs"]) == {"sparse/s6/grpo"}
    assert "eval/success_rate" not in data["starts"]["sparse/s5"]
    (moved,) = data["superseded"]
    assert moved["teacher_gap"] == {"g": 1} and moved["runs"] == {"sparse/s5/grpo": {"r": 1}}
    assert moved["heldout"] == {"pool": "P1", "eval/success_rate": 0.5} and moved["lost_start"] == lost
    assert len(data["starts"]["sparse/s5"]["sft"]["weights_sha256"]) == 64
    (dev,) = data["deviations"]
    assert "seed 5" in dev["what"] and "AMD EPYC" in dev["why"] and "Intel Xeon" in dev["why"]


def test_a_start_with_the_lost_starts_fingerprint_keeps_everything(tmp_path):
    folder = policy(tmp_path, 2.0)
    lost = {"weights_sha256": study_session.weights_sha256(folder)}
    path = study_file(tmp_path, teacher_gap={"P1/s11": {"g": 1}}, runs={"select/s11/grpo": {"r": 1}},
                      selection={"primary": "gate"})
    study_session.fingerprint_start(path, folder, 11, "P1", lost, "Intel Xeon")
    data = json.loads(path.read_text())
    assert data["runs"] == {"select/s11/grpo": {"r": 1}} and data["selection"] == {"primary": "gate"}
    assert "superseded" not in data and not data["deviations"]
    other = study_session.fingerprint_start(path, policy(tmp_path, 3.0), 11, "P1", lost, "Intel Xeon")
    data = json.loads(path.read_text())
    assert "superseded" in other and data["selection"] is None and data["superseded"][0]["selection"]


def test_a_seed_on_another_cpu_runs_with_a_deviation(tmp_path):
    session = study_session.Session(tmp_path, until=0.0, lanes=1, commit=False)
    session.cpu = "Intel Xeon"
    job = Job("gap s5", 5, ["gap", "--seeds", "5", "--pool", "P1"], 1.0)
    same = session.argv(job, {"machine": {"cpu": "Intel Xeon"}})
    assert same[-5:] == ["gap", "--seeds", "5", "--pool", "P1"]
    other = session.argv(job, {"machine": {"cpu": "AMD EPYC"}})
    assert other[-2] == "--deviation" and "seed 5" in other[-1] and "AMD EPYC" in other[-1]


def test_landing_copies_the_record_to_main_and_commits_it(tmp_path, monkeypatch):
    main = tmp_path / "main"
    (main / "docs").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=main, check=True)
    protocol = main / "docs" / "study.md"
    protocol.write_text("protocol\n")
    result = main / "study.json"
    result.write_text("{}")
    subprocess.run(["git", "add", "."], cwd=main, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "0"], cwd=main, check=True)
    tree = study_file(tmp_path, runs={"sparse/s5/grpo": {"r": 1}})
    monkeypatch.setattr(study, "RESULT", result)
    monkeypatch.setattr(study, "PROTOCOL", str(protocol))
    monkeypatch.setattr(study_session, "ROOT", main)
    monkeypatch.setenv("GIT_AUTHOR_NAME", "t")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "t@t")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "t")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "t@t")
    generated = []
    monkeypatch.setattr(study_session, "regenerate_docs", lambda: generated.append(1))
    said = []
    session = study_session.Session(tmp_path / "tree", until=0.0, lanes=1, log=said.append)
    session.result = tree
    session.land("run s5 grpo")
    assert json.loads(result.read_text())["runs"] == {"sparse/s5/grpo": {"r": 1}} and generated == [1]
    log = subprocess.run(["git", "log", "-1", "--format=%s"], cwd=main, capture_output=True, text=True).stdout
    assert log.startswith("#47 study at ccccccc") and log.strip().endswith(": run s5 grpo")
    assert said == ["landed: run s5 grpo"]
