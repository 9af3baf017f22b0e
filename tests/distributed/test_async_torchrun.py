"""Asynchronous RL under torchrun (docs/architecture.md, 'Asynchronous rollouts', its paragraph Under torchrun), on
2 gloo CPU ranks: rank 0 owns the rollout producer, each batch is split into whole groups as the synchronous loop
splits its tasks, 2 ranks learn what one process learns from the same batches, and a rank killed with SIGKILL mid-run
(two updates ahead at most) takes the producer with it while `--resume auto` (the DCP checkpoint with the rollouts
kept ahead) repeats the uninterrupted run's metrics and trained weights."""

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
from safetensors.torch import load_file

from seedfast.context.segments import Segment
from seedfast.envs.trajectory import Trajectory
from seedfast.rollout.records import RolloutResult, RolloutStats, StepRecord
from seedfast.runtime.checkpoint import list_checkpoints
from seedfast.train.async_ranks import rank_share
from tests.train.run_helpers import metrics_lines, one_thread_env, stable_rows

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
STEPS = 5
# wall times and what is computed from them, the memory probe, and the weight sends (their seconds; and a resumed
# run sends its start version before any update, where the uninterrupted run logged that send in an update's row)
# the batch as the producer rolled it out, counted once whatever the ranks: equal bit for bit, not to a tolerance
EXACT = tuple(f"rollout/{k}" for k in RolloutStats().as_dict()) + (
    "rollout/staleness_mean", "rollout/staleness_max", "rollout/policy_version", "train/samples",
    "train/success_rate", "train/episode_length", "train/groups_with_signal")


# ------------------------------------------------------------------ the split, by hand


def _batch(n_tasks: int, n: int) -> RolloutResult:
    """n_tasks groups of n trajectories (group id = task index, as the agent loop numbers them), trajectory i with
    i % 3 + 1 step records."""
    trajectories, steps = [], []
    for i in range(n_tasks * n):
        trajectories.append(Trajectory(task=f"task{i // n}", game_id=f"g{i}", won=i % 2 == 0,
                                       meta={"group_id": i // n, "trajectory_index": i, "policy_version": 0}))
        for j in range(i % 3 + 1):
            steps.append(StepRecord(segments=(Segment("task", torch.tensor([1, i])),), response_ids=(i, j),
                                    response_logprobs=(-0.1, -0.2), reward=float(i), group_id=i // n,
                                    trajectory_index=i, step_index=j, valid=True, parsed=True,
                                    finish_reason="stop"))
    return RolloutResult(trajectories, steps, RolloutStats(trajectories=n_tasks * n, won=7, generate_calls=5))


@pytest.mark.parametrize(("n_tasks", "size"), [(5, 2), (4, 2), (6, 3), (3, 4)])
def test_a_batch_splits_into_whole_groups_as_the_synchronous_loop_splits_its_tasks(n_tasks, size):
    n = 3
    whole = _batch(n_tasks, n)
    env = {"rollout/env_restarts": 2.0}
    seen = []
    for rank in range(size):
        share, share_env = rank_share(whole, env, rank, size)
        tasks = [f"task{k}" for k in range(n_tasks)][rank::size]  # the synchronous loop's tasks[rank::size]
        assert [t.task for t in share.trajectories] == [task for task in tasks for _ in range(n)]
        for i, t in enumerate(share.trajectories):
            assert t.meta["trajectory_index"] == i
        # every step record follows its trajectory, re-indexed into the share, in its original order
        original = {t.game_id: [s for s in whole.steps if s.trajectory_index == int(t.game_id[1:])]
                    for t in share.trajectories}
        for i, t in enumerate(share.trajectories):
            assert [(s.response_ids, s.step_index) for s in share.steps_of(i)] == [
                (s.response_ids, s.step_index) for s in original[t.game_id]]
        assert len(share.steps) == sum(len(v) for v in original.values())
        # the batch's counters once, on rank 0 (added over the ranks they are the batch's)
        assert share.stats == (whole.stats if rank == 0 else RolloutStats())
        assert share_env == (env if rank == 0 else {"rollout/env_restarts": 0.0})
        seen += [t.game_id for t in share.trajectories]
    assert sorted(seen) == sorted(t.game_id for t in whole.trajectories)  # a partition
    assert whole.trajectories[1].meta["trajectory_index"] == 1  # the batch itself is left as it was


# ------------------------------------------------------------------ real runs


def _overrides(overrides, games, out, policy, *extra) -> list[str]:
    return [*overrides(games, out), "algorithm=grpo", f"trainer.init_from={policy}", "rollout.max_staleness=1",
            f"trainer.steps={STEPS}", "trainer.keep_checkpoints=10", "env.step_delay_s=0.05", *extra]


def _torchrun(overrides, games, out, policy, *extra) -> list[str]:
    return [*TORCHRUN, "-m", "seedfast", "train",
            *_overrides(overrides, games, out, policy, "dist.strategy=fsdp", *extra)]


def _producers(out: Path) -> list[dict]:
    return [{k: r[k] for k in ("first_step", "first_version", "rollouts_kept")}
            for r in metrics_lines(out) if r.get("event") == "rollout_producer"]


def _straight(overrides, games, policy, out: Path, *extra: str) -> Path:
    p = subprocess.run(_torchrun(overrides, games, out, policy, *extra), env=one_thread_env(), capture_output=True,
                       text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def straight(overrides, train_games, tiny_policy, tmp_path_factory) -> Path:
    """An uninterrupted asynchronous run on 2 ranks."""
    return _straight(overrides, train_games, tiny_policy, tmp_path_factory.mktemp("straight"))


# two updates ahead, and long enough that the producer is still at work at the step_2 checkpoint (with 5 updates it has
# produced them all by then and exited)
STEPS_2 = 7
STALE_2 = ("rollout.max_staleness=2", f"trainer.steps={STEPS_2}")


@pytest.fixture(scope="module")
def straight_2(overrides, train_games, tiny_policy, tmp_path_factory) -> Path:
    """An uninterrupted asynchronous run on 2 ranks, two updates ahead at most."""
    return _straight(overrides, train_games, tiny_policy, tmp_path_factory.mktemp("straight_2"), *STALE_2)


def _one_process(overrides, games, out, policy, *extra) -> None:
    p = subprocess.run([sys.executable, "-m", "seedfast", "train", *_overrides(overrides, games, out, policy, *extra)],
                       env=one_thread_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]


def _same_learning(two: Path, one: Path, policy: Path, steps: int) -> None:
    """The 2-rank run `two` wrote the metrics and trained the weights of the one-process run `one`: the batches' counts
    bit for bit, the update's numbers and the weights to float rounding."""
    two_rows, one_rows = stable_rows(two), stable_rows(one)
    assert [r["step"] for r in two_rows] == [r["step"] for r in one_rows] == list(range(steps))
    assert [r["rollout/policy_version"] for r in two_rows] == [0, *range(steps - 1)]
    for row, ref in zip(two_rows, one_rows):
        assert row.keys() == ref.keys()
        assert row["rollout/trajectories"] == 2 * 2  # the whole batch, counted once over the ranks
        for key in EXACT:
            if key in ref:
                assert row[key] == ref[key], (row["step"], key)
        # the update's loss, KL, grad norm, ratios, diagnostics; abs: a log-prob's fp32 rounding (~1e-7), the size of
        # the sampler-vs-scorer gaps of an on-policy batch, which are that rounding itself
        for key, value in ref.items():
            assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (row["step"], key)
        assert row["optim/updates_applied"] > 0
    assert _producers(two) == _producers(one) == [{"first_step": 0, "first_version": 0, "rollouts_kept": []}]
    # the trained weights (the 2-rank export is gathered from both ranks' shards)
    a, b = load_file(two / "t" / "hf" / "model.safetensors"), load_file(one / "t" / "hf" / "model.safetensors")
    assert a.keys() == b.keys()
    start = load_file(Path(policy) / "model.safetensors")
    assert any(not torch.equal(a[k], start[k]) for k in a)  # it learned
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6, msg=k)


def test_two_ranks_learn_what_one_process_learns_from_the_same_batches(overrides, train_games, tiny_policy,
                                                                       straight, tmp_path):
    """The producer's batches do not depend on the trainer's ranks (its seeds are the run's), so with max_staleness=1
    the batches of updates 0 and 1 (version 0) are the same bits on 1 and 2 ranks, and the later ones agree as long
    as the two trainers' weights do: the 2-rank update is one process's to float rounding (as
    tests/distributed/test_fsdp_update.py pins for one synchronous update), so every batch must be the same."""
    _one_process(overrides, train_games, tmp_path / "one", tiny_policy)
    _same_learning(straight, tmp_path / "one", tiny_policy, STEPS)


@pytest.fixture(scope="module")
def tp_policy(overrides, train_games, tmp_path_factory) -> Path:
    """A tiny SFT'd policy with 2 key-value heads, so tensor parallel over 2 ranks splits them."""
    from seedfast.config import load_config
    from seedfast.sft import run as sft

    cfg = load_config(None, [*overrides(train_games, tmp_path_factory.mktemp("tp_policy")), "model.tiny.kv_heads=2"])
    sft.main(cfg)
    return cfg.run_dir / "sft"


def test_tensor_parallel_ranks_learn_what_one_process_learns(overrides, train_games, tp_policy, tmp_path):
    """dist.tp=2 (one tensor-parallel group, data-parallel size 1): both ranks take the whole batch, the weights sent
    are gathered over the tensor-parallel dimension (a wrong gather shows as a refused fingerprint or other batches),
    and the run is one process's (tests/distributed/test_tp_head.py pins the synchronous update)."""
    steps = ("trainer.steps=3",)
    p = subprocess.run([*_torchrun(overrides, train_games, tmp_path / "tp", tp_policy), "dist.tp=2", *steps],
                       env=one_thread_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    _one_process(overrides, train_games, tmp_path / "one", tp_policy, *steps)
    _same_learning(tmp_path / "tp", tmp_path / "one", tp_policy, 3)


def _ppid(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]) if fields[0] != "Z" else None


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            child = int(stat.parent.name)
            if child not in found and _ppid(child) == parent:
                found.add(child)
                todo.append(child)
    return found


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if _ppid(pid) is not None}


def test_rank_0_killed_mid_run_takes_its_producer_and_resume_repeats_the_run(overrides, train_games, tiny_policy,
                                                                             straight_2, tmp_path):
    """max_staleness 2: kill -9 of rank 0, the producer's owner, once the step_2 checkpoint is written (it keeps the
    rollouts of updates 2 and 3, produced on versions before 2): torchrun ends the job, no process of it is left (the
    producer dies with its rank), and `--resume auto` on 2 ranks trains on the kept rollouts, starts a producer after
    them, and writes the uninterrupted run's metrics and trained weights, bit for bit."""
    out = tmp_path / "killed"
    cmd = _torchrun(overrides, train_games, out, tiny_policy, *STALE_2)
    proc = subprocess.Popen(cmd, env=one_thread_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    ckpt = out / "t" / "ckpt"
    deadline = time.monotonic() + 300
    while not any(c.name == "step_2" for c in list_checkpoints(ckpt)):
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before its step_2 checkpoint: {proc.stderr.read().decode()[-3000:]}")
        assert time.monotonic() < deadline, "no step_2 checkpoint within 300 s"
        time.sleep(0.05)
    producer = [r["pid"] for r in metrics_lines(out) if r.get("event") == "rollout_producer"][-1]
    rank0 = _ppid(producer)
    tree = _descendants(proc.pid)
    assert rank0 is not None and {rank0, producer} <= tree
    assert proc.poll() is None, "the run ended before it was killed"
    os.kill(rank0, signal.SIGKILL)
    killed_at = time.monotonic()
    _, err = proc.communicate(timeout=120)  # torchrun stops the other rank: no hang
    assert proc.returncode != 0 and time.monotonic() - killed_at < 120, err.decode()[-3000:]
    deadline = time.monotonic() + 30
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(tree) == set(), "a process of the killed job outlived it"

    resume_at = int(list_checkpoints(ckpt)[-1].name.removeprefix("step_"))
    assert 2 <= resume_at < STEPS_2
    state = json.loads((ckpt / f"step_{resume_at}" / "trainer_state.json").read_text())
    assert state["policy_version"] == resume_at
    kept = [step for step, _ in state["rollouts_ahead"]]
    assert kept == [s for s in (resume_at, resume_at + 1) if s < STEPS_2]  # the next two updates' rollouts
    straight_versions = {r["step"]: r["rollout/policy_version"] for r in stable_rows(straight_2)}
    for step, version in state["rollouts_ahead"]:  # produced before the kill, on the versions the straight run used
        assert step - 2 <= version <= resume_at and version == straight_versions[step], state["rollouts_ahead"]
    p = subprocess.run([*cmd, "--resume", "auto"], env=one_thread_env(), capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _producers(out) == [{"first_step": 0, "first_version": 0, "rollouts_kept": []},
                               {"first_step": resume_at + len(kept), "first_version": resume_at,
                                "rollouts_kept": kept}]
    got = stable_rows(out)
    assert [r["step"] for r in got] == list(range(STEPS_2))  # none lost, none repeated
    assert got == stable_rows(straight_2)
    # and the weights it trained: the exports, gathered from both ranks' shards, equal bit for bit
    a, b = load_file(out / "t" / "hf" / "model.safetensors"), load_file(straight_2 / "t" / "hf" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(Path(tiny_policy) / "model.safetensors")
    assert any(not torch.equal(a[k], start[k]) for k in a)  # it learned
