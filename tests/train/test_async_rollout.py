"""Asynchronous RL with a staleness bound (train/async_rollout.py, train/staleness.py) on the tiny policy: the bound
and the versions in the metrics, max_staleness 0 equal to the synchronous loop, a slow environment overlapping the
update, the versions repeated after kill -9 and --resume auto, nothing left running when either side dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seedfast import cli
from seedfast.context.segments import Segment
from seedfast.envs.trajectory import Trajectory
from seedfast.rollout.records import RolloutResult, StepRecord
from seedfast.runtime.checkpoint import list_checkpoints
from seedfast.train.staleness import (
    Produced,
    StalenessError,
    ahead_state,
    behaviour_logprob,
    check_bound,
    check_weights,
    rollout_version,
    staleness_metrics,
    versions_needed,
)

VOLATILE = ("time/", "throughput/", "memory/", "async/")
ASYNC_KEYS = ("rollout/staleness_mean", "rollout/staleness_max", "rollout/policy_version")


def _args(overrides, games, out, policy, *extra):
    return ["train", *overrides(games, out), "algorithm=grpo", "trainer.keep_checkpoints=3",
            f"trainer.init_from={policy}", *extra]


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "t" / "metrics.jsonl").read_text().splitlines()]


def _rows(out: Path) -> list[dict]:
    """The updates' metrics (not the event lines)."""
    return [r for r in _lines(out) if "step" in r]


def _stable(rows: list[dict], drop: tuple[str, ...] = ()) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE) and k not in drop} for r in rows]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# ------------------------------------------------------------------ the rule, by hand


def _result(versions: list[int], lengths: list[int]) -> RolloutResult:
    trajectories = [Trajectory(game_id=f"g{i}", task="t", meta={"group_id": 0, "policy_version": v})
                    for i, v in enumerate(versions)]
    steps = [StepRecord(segments=(Segment("task", torch.tensor([1, 2])),), response_ids=tuple(range(n)),
                        response_logprobs=tuple(-0.5 for _ in range(n)), reward=0.0, group_id=0, trajectory_index=i,
                        step_index=0, valid=True, parsed=True, finish_reason="stop")
             for i, n in enumerate(lengths)]
    return RolloutResult(trajectories, steps)


def test_the_version_rule_and_the_versions_a_producer_needs():
    # max(v0, s - N): a fresh run with N = 2 rolls out updates 0, 1, 2, 3, 4 on versions 0, 0, 0, 1, 2
    assert [rollout_version(s, 2, 0) for s in range(5)] == [0, 0, 0, 1, 2]
    assert [rollout_version(s, 0, 0) for s in range(3)] == [0, 1, 2]
    # resumed at 3 with nothing kept ahead: version 3 until s - N passes it
    assert [rollout_version(s, 2, 3) for s in range(3, 7)] == [3, 3, 3, 4]
    assert versions_needed(0, 0, 2, 5) == [0, 1, 2]
    assert versions_needed(5, 3, 2, 8) == [3, 4, 5]  # resumed at 3 with updates 3, 4 kept ahead
    assert versions_needed(5, 5, 1, 5) == []


def test_the_bound_is_checked_on_every_batch():
    ok = Produced(step=3, version=2, result=_result([2, 2], [3, 1]))
    check_bound(ok, 3, 1)
    with pytest.raises(StalenessError, match=r"version 1, outside \[2, 3\]"):
        check_bound(Produced(3, 1, _result([1], [2])), 3, 1)
    with pytest.raises(StalenessError, match="version 4"):  # a policy the trainer has not made yet
        check_bound(Produced(3, 4, _result([4], [2])), 3, 1)
    with pytest.raises(StalenessError, match="expected the rollout of update 3"):
        check_bound(Produced(4, 3, _result([3], [2])), 3, 1)
    with pytest.raises(StalenessError, match="carries policy version 1"):
        check_bound(Produced(3, 2, _result([2, 1], [2, 2])), 3, 1)


def test_weights_other_than_the_version_sent_are_refused():
    produced = Produced(3, 2, _result([2], [1]), fingerprint=7)
    check_weights(produced, {2: 7})
    check_weights(produced, {})  # a rollout kept ahead in a checkpoint: checked before it was written
    with pytest.raises(StalenessError, match="fingerprint 7 is not that of policy version 2 as sent \\(8\\)"):
        check_weights(produced, {1: 7, 2: 8})


def test_staleness_metrics_are_per_token():
    # tokens 3 (age 2) and 1 (age 0): mean (3*2 + 1*0) / 4 = 1.5, max 2, oldest version 3
    m = staleness_metrics(5, _result([3, 5], [3, 1]))
    assert m == {"rollout/staleness_mean": 1.5, "rollout/staleness_max": 2.0, "rollout/policy_version": 3.0}


def test_behaviour_logprobs_are_packed_in_sample_order_and_required():
    result = _result([0, 0], [2, 3])
    samples = [r.to_sample()[0] for r in result.steps]
    assert behaviour_logprob(samples).tolist() == [-0.5] * 5
    bare = StepRecord(segments=(Segment("task", torch.tensor([1])),), response_ids=(4,), response_logprobs=None,
                      reward=0.0, group_id=0, trajectory_index=0, step_index=1, valid=True, parsed=True,
                      finish_reason="stop")
    with pytest.raises(StalenessError, match=r"sample \(0, 1\) has no behaviour log-probs"):
        behaviour_logprob([bare.to_sample()[0]])


def test_the_checkpoint_keeps_the_consecutive_rollouts_ahead():
    ahead = {4: Produced(4, 3, _result([3], [1])), 5: Produced(5, 4, _result([4], [1])),
             7: Produced(7, 6, _result([6], [1]))}
    state, files = ahead_state(4, 1, ahead)
    assert state == {"policy_version": 4, "max_staleness": 1, "rollouts_ahead": [[4, 3], [5, 4]]}
    assert list(files) == ["rollouts_ahead.pkl"]
    assert ahead_state(6, 1, ahead) == ({"policy_version": 6, "max_staleness": 1, "rollouts_ahead": []}, {})


# ------------------------------------------------------------------ real runs


def test_max_staleness_zero_is_the_synchronous_loop(overrides, train_games, tiny_policy, tmp_path):
    absent, zero = tmp_path / "absent", tmp_path / "zero"
    assert cli.main(_args(overrides, train_games, absent, tiny_policy)) == 0
    assert cli.main(_args(overrides, train_games, zero, tiny_policy, "rollout.max_staleness=0")) == 0
    assert _stable(_rows(zero)) == _stable(_rows(absent))
    assert not any(k in r for r in _rows(zero) for k in ASYNC_KEYS)


@pytest.mark.parametrize("n", [1, 2])
def test_the_bound_holds_and_the_versions_are_in_the_metrics(overrides, train_games, tiny_policy, tmp_path, n):
    out = tmp_path / f"n{n}"
    assert cli.main(_args(overrides, train_games, out, tiny_policy, "trainer.steps=4",
                          f"rollout.max_staleness={n}")) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["rollout/policy_version"] for r in rows] == [max(0, s - n) for s in range(4)]
    assert [r["rollout/staleness_max"] for r in rows] == [min(s, n) for s in range(4)]
    assert [r["rollout/staleness_mean"] for r in rows] == [min(s, n) for s in range(4)]
    assert all(r["optim/updates_applied"] == 1.0 for r in rows)
    # the mismatch diagnostics on every batch, mode none and no scoring pass included (the update's forward is θ_old's):
    # rounding on policy, an older policy's log-probs on a stale batch
    assert rows[0]["rollout/logprob_gap_max"] < 1e-4
    assert all(r["rollout/logprob_gap_max"] > 1e-3 and r["rollout_corr/k3_kl"] > 0 for r in rows[1:])
    # one epoch, one mini-batch: on-policy the ratio is exactly 1; a stale batch's ℓold is its behaviour log-probs,
    # an older policy's, so π_θ / π_behaviour moves away from 1
    assert rows[0]["loss/ratio_min"] == rows[0]["loss/ratio_max"] == 1.0
    assert all(r["loss/ratio_min"] < 1.0 < r["loss/ratio_max"] for r in rows[1:])
    if n == 1:  # update 0 is on policy version 0 either way: the same batch and update as the synchronous loop's
        sync = tmp_path / "sync"
        assert cli.main(_args(overrides, train_games, sync, tiny_policy, "trainer.steps=1")) == 0
        evaluated = tuple(k for k in _rows(sync)[0] if k.startswith("eval/"))  # its last step is evaluated
        assert _stable(rows[:1], ASYNC_KEYS) == _stable(_rows(sync), evaluated)


def test_a_correction_mode_keeps_the_old_scores_and_its_weight_carries_the_staleness(overrides, train_games,
                                                                                       tiny_policy, tmp_path):
    """Decoupled PPO (docs/architecture.md, 'Asynchronous rollouts'): with a correction mode a stale batch's ℓold is
    θ_old's scores, so one epoch of one mini-batch has ratio exactly 1, and the staleness shows in the correction's
    train/rollout gap instead (a clip too large to truncate: the weight is π_θold / π_behaviour itself)."""
    out = tmp_path / "decoupled"
    assert cli.main(_args(overrides, train_games, out, tiny_policy, "trainer.steps=3", "rollout.max_staleness=1",
                          "rollout.correction.mode=token_tis", "rollout.correction.token_clip=1e6")) == 0
    rows = _rows(out)
    assert [r["rollout/staleness_max"] for r in rows] == [0, 1, 1]
    # never corrected twice: ℓold is θ_old's scores (the scoring pass and the update's forward agree to ~1e-6), where
    # the behaviour log-probs would put the ratio ~0.1 away from 1 (test above)
    assert all(1 - 1e-5 < r["loss/ratio_min"] <= r["loss/ratio_max"] < 1 + 1e-5 for r in rows)
    assert rows[0]["rollout/logprob_gap_max"] < 1e-4  # version 0 rolled out and scored the same weights
    assert all(r["rollout/logprob_gap_max"] > 1e-3 for r in rows[1:])  # a stale batch: an older policy's log-probs
    assert all(r["rollout_corr/token_truncated_share"] == 0.0 for r in rows)


def test_a_slow_environment_overlaps_the_update_within_the_bound(overrides, train_games, tiny_policy, tmp_path):
    """Each environment step sleeps 0.2 s: the producer rolls out update s + 1 while the trainer learns update s
    (it starts before that update ends), and never starts update s + 2 before update s's weights exist."""
    out = tmp_path / "slow"
    assert cli.main(_args(overrides, train_games, out, tiny_policy, "trainer.steps=4", "rollout.max_staleness=1",
                          "env.step_delay_s=0.2", "trainer.checkpoint_every=0")) == 0
    rows = _rows(out)
    for s in range(3):
        assert rows[s + 1]["time/rollout_started_at"] < rows[s]["time/learned_at"]  # overlapped
    for s in range(2):
        assert rows[s + 2]["time/rollout_started_at"] >= rows[s]["time/learned_at"]  # waited for version s + 1
    for r in rows[1:]:  # the trainer waited at most what was left of one rollout
        assert r["time/rollout_wait"] <= r["time/rollout_finished_at"] - r["time/rollout_started_at"] + 0.5


def _run_until(cmd: list[str], done, timeout: float = 300) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while not done():
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read().decode()[-3000:]}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return proc


def test_kill_9_and_resume_repeat_the_versions(overrides, train_games, tiny_policy, tmp_path):
    """AReaL #1388: after a resume the staleness accounting must go on as before. A run killed after its step_2
    checkpoint and resumed (update 2 from the checkpoint, update 3 from a new producer) writes the uninterrupted
    run's metrics, versions included."""
    assert cli.main(_args(overrides, train_games, tmp_path / "straight", tiny_policy, "trainer.steps=4",
                          "rollout.max_staleness=1")) == 0
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "seedfast", *_args(overrides, train_games, killed, tiny_policy, "trainer.steps=4",
                                                     "rollout.max_staleness=1")]
    ckpt = killed / "t" / "ckpt"
    proc = _run_until(cmd, lambda: any(p.name == "step_2" for p in list_checkpoints(ckpt)))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = json.loads((ckpt / "step_2" / "trainer_state.json").read_text())
    assert state["policy_version"] == 2 and state["max_staleness"] == 1
    assert state["rollouts_ahead"] == [[2, 1]]  # update 2, already produced on version 1
    subprocess.run([*cmd, "--resume", "auto"], env=_env(), check=True, capture_output=True)
    got, expected = _stable(_rows(killed)), _stable(_rows(tmp_path / "straight"))
    assert [r["step"] for r in got] == [0, 1, 2, 3]
    assert [r["rollout/policy_version"] for r in got] == [0, 0, 1, 2]
    started = [{k: r[k] for k in ("first_step", "first_version", "rollouts_kept")}
               for r in _lines(killed) if r.get("event") == "rollout_producer"]
    assert started == [{"first_step": 0, "first_version": 0, "rollouts_kept": []},
                       {"first_step": 3, "first_version": 2, "rollouts_kept": [2]}]
    assert got == expected


def _logged(out: Path) -> bool:
    """A first update is in the metrics: the producer and its environments are up."""
    path = out / "t" / "metrics.jsonl"
    return path.exists() and any("step" in json.loads(line) for line in path.read_text().splitlines())


def _producer_of(out: Path) -> int:
    """The producer's pid, from the run's `rollout_producer` event."""
    return next(r["pid"] for r in _lines(out) if r.get("event") == "rollout_producer")


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent and fields[0] != "Z":
                child = int(stat.parent.name)
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def test_the_producer_and_its_environment_workers_die_with_a_killed_trainer(overrides, train_games, tiny_policy,
                                                                            tmp_path):
    cmd = [sys.executable, "-m", "seedfast", *_args(overrides, train_games, tmp_path / "k", tiny_policy,
                                                     "trainer.steps=50", "rollout.max_staleness=1",
                                                     "env.isolation=process", "env.step_delay_s=0.05")]
    proc = _run_until(cmd, lambda: _logged(tmp_path / "k"))
    tree = _descendants(proc.pid)
    producer = _producer_of(tmp_path / "k")
    assert producer in tree and _descendants(producer), "the producer and its environment workers run"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(tree) == set()


def test_a_killed_producer_ends_the_run_with_one_clear_error(overrides, train_games, tiny_policy, tmp_path):
    cmd = [sys.executable, "-m", "seedfast", *_args(overrides, train_games, tmp_path / "p", tiny_policy,
                                                     "trainer.steps=50", "rollout.max_staleness=1",
                                                     "env.step_delay_s=0.05")]
    proc = _run_until(cmd, lambda: _logged(tmp_path / "p"))
    producer = _producer_of(tmp_path / "p")
    assert producer in _descendants(proc.pid)
    os.kill(producer, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    lines = [line for line in err.decode().splitlines() if line.startswith("seedfast train:")]
    assert proc.returncode == 5, err.decode()[-3000:]
    assert len(lines) == 1 and "rollout producer" in lines[0] and "killed by signal 9" in lines[0], lines
    assert _alive(_descendants(proc.pid)) == set()


def test_the_engines_of_an_async_run():
    from seedfast.config import load_config
    from seedfast.train.async_rollout import channel_dtype, trainer_engine

    vllm = ["rollout.engine=vllm", "model.path=/some/hf", "model.dtype=fp32"]
    assert trainer_engine(load_config(None, vllm)) == "vllm"  # synchronous: the trainer's engine rolls out
    # with a producer the trainer generates (analysis) with its live policy; the rollouts are the producer's
    assert trainer_engine(load_config(None, [*vllm, "rollout.max_staleness=1"])) == "own"
    # a version travels in the dtype the producer's engine computes in, as the synchronous loop pushes it
    assert channel_dtype(load_config(None, [*vllm, "rollout.vllm_dtype=bf16"])) == torch.bfloat16
    assert channel_dtype(load_config(None, ["model.dtype=fp32"])) == torch.float32
