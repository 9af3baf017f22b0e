"""Issue 33's table, case by case, through `seedfast train` (cli.main) on a tiny policy: each fault ends in one line
naming the file or key, the documented exit code (app/failures.py), the previous checkpoint intact, no partial folder
and nothing left running; a damaged newest checkpoint is passed over for the newest valid one."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from seedfast.app import failures
from seedfast.runtime import checkpoint_files
from seedfast.runtime.checkpoint import list_checkpoints
from tests.faults.fault_helpers import (
    assert_clean,
    children,
    copy_games,
    copy_run,
    metric_rows,
    remember_children,
    run_train,
    snapshot,
    train_args,
)


@pytest.fixture(autouse=True)
def _children_before():
    remember_children()


@pytest.fixture(scope="module")
def base_run(overrides, train_games, tiny_policy, tmp_path_factory):
    """A finished 3-step run with checkpoints step_1, step_2, step_3: every case starts from a copy."""
    out = tmp_path_factory.mktemp("base")
    from seedfast import cli

    assert cli.main(train_args(overrides, train_games, out, tiny_policy, "trainer.steps=3")) == 0
    return out


def _damage(kind: str, step: Path) -> Path:
    if kind == "truncated model.safetensors":
        path = step / "model.safetensors"
        os.truncate(path, 1000)
    elif kind == "garbage state.pt":  # same size: only the sha256 tells
        path = step / "state.pt"
        path.write_bytes(b"\xca" * path.stat().st_size)
    else:
        path = step / "trainer_state.json"
        path.write_text("{not json")
    return path


@pytest.mark.parametrize("kind", ["truncated model.safetensors", "garbage state.pt", "invalid trainer_state.json"])
def test_a_damaged_newest_checkpoint_is_named_and_the_newest_valid_one_resumed(
        kind, base_run, overrides, train_games, tiny_policy, tmp_path, capsys):
    ckpt = copy_run(base_run, tmp_path)
    damaged = _damage(kind, ckpt / "step_3")
    (ckpt / ".step_4.tmp").mkdir()  # a killed write's leftover: removed at start
    step_2 = snapshot(ckpt / "step_2")
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "trainer.steps=3", "--resume", "auto")
    assert code == 0, err
    warning = [line for line in err.splitlines() if "is damaged" in line]
    assert len(warning) == 1 and "step_3" in warning[0] and str(damaged) in warning[0], err
    assert [r["step"] for r in metric_rows(tmp_path / "t") if "step" in r] == [0, 1, 2]  # step 2 run again
    assert snapshot(ckpt / "step_2") == step_2
    assert_clean(ckpt, "step_3")  # written again, whole


def test_no_valid_checkpoint_names_each_one_tried(base_run, overrides, train_games, tiny_policy, tmp_path, capsys):
    ckpt = copy_run(base_run, tmp_path)
    for step, kind in zip((1, 2, 3), ("truncated model.safetensors", "garbage state.pt", "invalid trainer_state.json")):
        _damage(kind, ckpt / f"step_{step}")
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "trainer.steps=3", "--resume", "auto")
    assert code == failures.EXIT_LOAD == 3
    [line] = [x for x in err.splitlines() if "checkpoint error" in x]
    assert line.startswith("seedfast train: checkpoint error: no usable checkpoint in")
    assert all(f"step_{s}: " in line for s in (1, 2, 3)) and "errors.log" in line
    assert "Traceback" not in err and "Traceback" in (tmp_path / "t" / "errors.log").read_text()
    assert children() == []


def test_a_checkpoint_without_a_manifest_that_does_not_load_is_named_and_passed_over(
        base_run, overrides, train_games, tiny_policy, tmp_path, capsys):
    """Checkpoints written before manifests: the load itself is the check, and its error names the file."""
    ckpt = copy_run(base_run, tmp_path)
    for step in (2, 3):
        (ckpt / f"step_{step}" / "manifest.json").unlink()
    _damage("garbage state.pt", ckpt / "step_3")
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "trainer.steps=3", "--resume", "auto")
    assert code == 0, err
    assert f"{ckpt / 'step_3' / 'state.pt'}: not a readable torch.save file (UnpicklingError" in err
    assert [r["step"] for r in metric_rows(tmp_path / "t") if "step" in r] == [0, 1, 2]


def test_resume_from_a_named_damaged_checkpoint_names_the_file(base_run, overrides, train_games, tiny_policy,
                                                              tmp_path, capsys):
    ckpt = copy_run(base_run, tmp_path)
    damaged = _damage("truncated model.safetensors", ckpt / "step_2")
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "trainer.steps=3",
                          "--resume", str(ckpt / "step_2"))
    assert code == 3 and f"{damaged}: 1000 bytes, the manifest says" in err, err


def test_init_from_a_truncated_policy_names_the_file(overrides, train_games, tiny_policy, tmp_path, capsys):
    policy = tmp_path / "policy"
    shutil.copytree(tiny_policy, policy)
    os.truncate(policy / "model.safetensors", 500)
    code, err = run_train(capsys, overrides, train_games, tmp_path, policy)
    assert code == 3
    assert f"seedfast train: load error: {policy / 'model.safetensors'}: not a readable safetensors file" in err
    assert len(err.strip().splitlines()) == 1 and children() == []


def test_a_full_disk_mid_checkpoint_says_so_and_leaves_the_previous_one(
        base_run, overrides, train_games, tiny_policy, tmp_path, capsys, monkeypatch):
    """A writer that fails at byte 4096 of state.pt with ENOSPC, as a full disk does (what torch reported as
    'unexpected pos')."""
    ckpt = copy_run(base_run, tmp_path)
    shutil.rmtree(ckpt / "step_3")
    real = checkpoint_files.HashingWriter.write

    def full_disk(self, data):
        if self.size + len(data) > 4096 and ".step_3.tmp" in self.handle.name:
            self.error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            raise self.error
        return real(self, data)

    monkeypatch.setattr(checkpoint_files.HashingWriter, "write", full_disk)
    step_2 = snapshot(ckpt / "step_2")
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "trainer.steps=3", "--resume", "auto")
    assert code == failures.EXIT_DISK == 6
    assert (f"seedfast train: disk error: no space left on device: writing {ckpt / '.step_3.tmp' / 'state.pt'}"
            in err), err
    assert snapshot(ckpt / "step_2") == step_2
    assert_clean(ckpt, "step_2")


def test_the_free_space_is_checked_before_a_checkpoint_is_written(
        base_run, overrides, train_games, tiny_policy, tmp_path, capsys, monkeypatch):
    ckpt = copy_run(base_run, tmp_path)
    shutil.rmtree(ckpt / "step_3")
    monkeypatch.setattr(checkpoint_files.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 5000,
                                                                                                   5000))
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "trainer.steps=3", "--resume", "auto")
    assert code == 6
    line = err.strip().splitlines()[-1]
    assert f"no space left on device for a checkpoint in {ckpt}: it needs about " in line and "5,000 are free" in line
    needed = int(line.split("needs about ")[1].split(" bytes")[0].replace(",", ""))
    on_disk = sum(f.stat().st_size for f in (ckpt / "step_2").iterdir())
    assert on_disk * 0.9 < needed < on_disk + (2 << 20)  # the tensors' bytes and the slack: about what is written
    assert_clean(ckpt, "step_2")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_checkpoint_write_abandons_it_and_names_the_resume_point(
        sig, base_run, overrides, train_games, tiny_policy, tmp_path, capsys, monkeypatch):
    """The signal itself (os.kill), delivered while state.pt of step_3 is half written."""
    ckpt = copy_run(base_run, tmp_path)
    shutil.rmtree(ckpt / "step_3")
    real = checkpoint_files.HashingWriter.write

    def interrupted(self, data):
        if self.size > 0 and ".step_3.tmp" in self.handle.name:
            os.kill(os.getpid(), sig)
        return real(self, data)

    monkeypatch.setattr(checkpoint_files.HashingWriter, "write", interrupted)
    # SIGINT as a terminal delivers it (Python's KeyboardInterrupt), whatever disposition this worker process was
    # left with (CI once saw the run finish with 0: the signal ignored in an xdist worker)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "trainer.steps=3", "--resume",
                              "auto")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 128 + sig
    assert err.strip().splitlines()[-1] == (f"seedfast train: stopped by {signal.Signals(sig).name}; resume point: "
                                            f"{ckpt / 'step_2'} (step 2; --resume auto)")
    assert "Traceback" not in err
    assert_clean(ckpt, "step_2")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or sig == signal.SIGINT  # the handler is put back


def _session(sid: int) -> list[str]:
    return subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True).stdout.split()


def test_sigterm_stops_a_real_process_cleanly(base_run, overrides, train_games, tiny_policy, tmp_path):
    """A real `seedfast train` process, SIGTERM once a step is logged: exit 143, the resume point named (a complete
    checkpoint), no partial folder, nothing of its session left running."""
    ckpt = copy_run(base_run, tmp_path)
    cmd = [sys.executable, "-m", "seedfast", *train_args(overrides, train_games, tmp_path, tiny_policy,
                                                         "trainer.steps=50", "--resume", "auto")]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics = tmp_path / "t" / "metrics.jsonl"
    before = metrics.read_text()
    while metrics.read_text() == before and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"seedfast train: stopped by SIGTERM; resume point: {ckpt}/step_") and "Traceback" not in err
    resume_point = Path(last.split("resume point: ")[1].split(" (step")[0])
    assert resume_point == list_checkpoints(ckpt)[-1] and int(resume_point.name[5:]) >= 3
    assert not [p.name for p in ckpt.iterdir() if p.name.endswith(".tmp")]
    deadline = time.monotonic() + 10  # multiprocessing's helpers see their parent gone
    while (leftover := _session(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftover == []


def test_an_lr_given_on_resume_takes_effect_and_is_named(base_run, overrides, train_games, tiny_policy, tmp_path,
                                                        capsys):
    ckpt = copy_run(base_run, tmp_path)
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "trainer.steps=4", "optim.lr=0.05",
                          "--resume", "auto")
    assert code == 0, err
    [line] = [x for x in err.splitlines() if "changed setting" in x]
    assert "resuming" in line and "step_3" in line
    assert "optim.lr 0.001 -> 0.05" in line and "trainer.steps 3 -> 4" in line
    rows = metric_rows(tmp_path / "t")
    assert rows[-1]["step"] == 3 and rows[-1]["optim/lr"] == 0.05  # a constant schedule: the new lr itself
    event = [r for r in rows if r.get("event") == "resume"][-1]
    assert event["changed"]["optim.lr"] == [0.001, 0.05] and event["first_step"] == 3
    before, after = load_file(ckpt / "step_3" / "model.safetensors"), load_file(ckpt / "step_4" / "model.safetensors")
    assert any(not (before[k] == after[k]).all() for k in before)


def test_a_key_that_cannot_change_on_resume_is_refused(base_run, overrides, train_games, tiny_policy, tmp_path,
                                                      capsys):
    ckpt = copy_run(base_run, tmp_path)
    step_3 = snapshot(ckpt / "step_3")
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "trainer.steps=4", "algorithm=seed",
                          "--resume", "auto")
    assert code == 2
    assert "cannot change on resume: algorithm: 'grpo' -> 'seed'" in err
    assert snapshot(ckpt / "step_3") == step_3 and [p.name for p in list_checkpoints(ckpt)][-1] == "step_3"


def _game(games: Path, split: str) -> Path:
    manifest = json.loads((games / "manifest.json").read_text())
    return games / [e for e in manifest["games"] if e["split"] == split][0]["path"]


def test_a_deleted_game_is_named_or_with_skip_left_out_and_counted(overrides, train_games, tiny_policy, tmp_path,
                                                                  capsys):
    games = copy_games(train_games, tmp_path / "games")
    held_out = _game(games, "eval")
    held_out.unlink()
    code, err = run_train(capsys, overrides, games, tmp_path / "a", tiny_policy, "trainer.steps=1")
    assert code == 3
    assert (f"seedfast train: game file error: 1 of 1 games are missing or damaged: game {held_out.stem}: "
            f"{held_out}: missing") in err
    shutil.copy(train_games / held_out.relative_to(games), held_out)
    training = _game(games, "train")
    training.unlink()
    code, err = run_train(capsys, overrides, games, tmp_path / "b", tiny_policy, "trainer.steps=1",
                          "env.damaged_games=skip")
    assert code == 0, err
    assert f"seedfast train: warning: env.damaged_games=skip: train game {training.stem}: {training}: missing: " \
           "left out" in err
    [row] = metric_rows(tmp_path / "b" / "t")
    assert row["rollout/games_skipped"] == 1 and row["eval/games_skipped"] == 0


def test_truncated_games_are_named_before_they_are_played(overrides, train_games, tiny_policy, tmp_path, capsys):
    games = copy_games(train_games, tmp_path / "games")
    z8 = sorted(games.rglob("*.z8"))
    for path in z8:
        os.truncate(path, 100)
    code, err = run_train(capsys, overrides, games, tmp_path, tiny_policy, "trainer.steps=1")
    assert code == 3
    line = err.strip().splitlines()[-1]
    assert all(str(path) in line for path in z8 if "-1000000" not in path.name)  # the train games this run needs
    assert "100 bytes, the manifest says" in line and children() == []


def test_games_that_fail_at_run_time_are_named_and_counted_per_game(overrides, train_games, tiny_policy, tmp_path,
                                                                   capsys, monkeypatch, caplog):
    """Games that pass the manifest's check but cannot be played (as frotz's "Story file read error"): every episode
    fails, the warnings and the one line name each game with its count."""
    from seedfast.envs import textworld_env

    class Unplayable:
        def __init__(self, path):
            raise RuntimeError(f"Story file read error: {path}")

    monkeypatch.setattr(textworld_env, "TextWorldEnv", Unplayable)
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "trainer.steps=1")
    assert code == failures.EXIT_ENVIRONMENT == 5
    line = err.strip().splitlines()[-1]
    assert line.startswith("seedfast train: environment failure: step 0: the rollout produced no step samples "
                           "(failed_exception 4; failed episodes per game: ")
    games = sorted(str(p) for p in train_games.rglob("*.z8") if "-1000000" not in p.name)
    assert all(f"{game} x2" in line for game in games) and len(games) == 2
    assert f"environment failed (exception) playing {games[0]}: RuntimeError: Story file read error" in caplog.text
    assert children() == []


def test_a_non_finite_loss_stops_with_one_line(overrides, train_games, tiny_policy, tmp_path, capsys):
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "optim.lr=1e30",
                          "trainer.max_bad_steps=1")
    assert code == failures.EXIT_NUMERIC == 4
    assert err.strip().splitlines() == [
        "seedfast train: numeric error: 1 non-finite updates in a row (trainer.max_bad_steps=1) "
        f"(traceback: {tmp_path / 't' / 'errors.log'})"]
    assert "FloatingPointError" in (tmp_path / "t" / "errors.log").read_text()


def test_an_infinite_float_is_refused(overrides, train_games, tiny_policy, tmp_path, capsys):
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "optim.lr=1e400")
    assert code == 2 and "optim.lr: must be a finite number, got inf" in err
    assert not (tmp_path / "t").exists()


def test_a_log_file_gets_a_line_per_step_and_per_phase(overrides, train_games, tiny_policy, tmp_path, capsys):
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "log.progress=true",
                          "trainer.eval_every=2")
    assert code == 0, err
    lines = [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("[")]
    steps = [x for x in lines if x.startswith("grpo step ")]
    assert [s.split(" | ")[0] for s in steps] == ["grpo step 1/2", "grpo step 2/2"]
    assert all(" | success " in s and " | reward " in s and " | loss " in s and " | tokens/s " in s
               and " | elapsed " in s for s in steps)
    assert f"grpo: checkpoint {tmp_path / 't' / 'ckpt' / 'step_2'} written" in "\n".join(lines)
    assert any(x.startswith("grpo: evaluation after step 2: success ") for x in lines)


def test_resume_from_a_path_with_no_checkpoint_says_so(overrides, train_games, tiny_policy, tmp_path, capsys):
    code, err = run_train(capsys, overrides, train_games, tmp_path, tiny_policy, "--resume", str(tmp_path / "none"))
    assert code == 3 and err.strip().splitlines() == [
        f"seedfast train: checkpoint error: checkpoint {tmp_path / 'none'} is incomplete or missing (no COMPLETE "
        f"marker) (traceback: {tmp_path / 't' / 'errors.log'})"]
