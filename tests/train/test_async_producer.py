"""The rollout producer cannot hang or lie (train/async_rollout.py; docs/architecture.md, 'Asynchronous rollouts'):
death is read from the results pipe's end, never from the process alone; a reader that fails says so with its
traceback; a silent producer ends the run after rollout.producer_timeout_s naming the update and the resume point;
its exit codes say why it ended; start/close cycles leave no thread, descriptor, socket or process behind; a
producer killed mid-update gives one clear line and `--resume auto` repeats the uninterrupted run."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from seedfast.runtime.checkpoint import list_checkpoints
from seedfast.train.async_rollout import (
    Inbox,
    ProducerExit,
    RolloutProducer,
    RolloutProducerError,
    RolloutProducerTimeout,
    describe_exit,
)
from tests.train.run_helpers import metrics_lines, one_thread_env, stable_rows

# ------------------------------------------------------------------ the inbox, against a toy process


def _send_and_exit(conn, messages: list, linger_s: float, code: int) -> None:
    for m in messages:
        conn.send_bytes(pickle.dumps(m))
    time.sleep(linger_s)
    conn.close()
    os._exit(code)


def _toy(messages: list, *, linger_s: float = 0.0, code: int = 0, timeout_s: float | None = 30.0, decode=None):
    ctx = mp.get_context("spawn")
    r, w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_send_and_exit, args=(w, messages, linger_s, code))
    proc.start()
    w.close()
    inbox = Inbox(proc, r, timeout_s, **({"decode": decode} if decode else {}))
    return proc, inbox


def _slow(data: bytes):
    time.sleep(0.5)  # the reader still unpickles while the process has long ended
    return pickle.loads(data)


def _raises(data: bytes):
    raise ValueError("cannot take this message in")


def test_a_slow_reader_is_not_a_dead_producer():
    proc, inbox = _toy(["update 0", "update 1"], decode=_slow)
    proc.join()  # the process ended before the reader delivered anything
    assert proc.exitcode == 0
    assert inbox.get("waited for the rollout of update 0") == "update 0"
    assert inbox.get("waited for the rollout of update 1") == "update 1"
    with pytest.raises(RolloutProducerError, match=r"ended \(exit code 0, done\) while the trainer waited for the "
                                                   r"rollout of update 2"):
        inbox.get("waited for the rollout of update 2")
    inbox.close()


def test_a_failing_reader_surfaces_with_its_traceback_instead_of_hanging():
    # the process stays alive and silent after its message: without the reader's report the trainer would wait
    proc, inbox = _toy(["update 0"], linger_s=60, decode=_raises, timeout_s=None)
    start = time.monotonic()
    with pytest.raises(RolloutProducerError) as caught:
        inbox.get("waited for the rollout of update 0")
    assert time.monotonic() - start < 20
    err = caught.value
    assert not isinstance(err, RolloutProducerTimeout)
    assert "reader of the rollout producer failed (ValueError('cannot take this message in'))" in str(err)
    assert "\n" not in str(err)  # one line; the traceback rides as the cause (errors.log) and as `trace`
    assert "Traceback" in err.trace and "_raises" in err.trace and "ValueError: cannot take" in err.trace
    assert str(err.__cause__) == err.trace
    proc.kill()
    proc.join()
    inbox.close()


def test_a_silent_producer_times_out_naming_the_update():
    proc, inbox = _toy([], linger_s=60, timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(RolloutProducerTimeout, match=r"sent nothing for 1 s \(rollout.producer_timeout_s\) while the "
                                                     r"trainer waited for the rollout of update 3"):
        inbox.get("waited for the rollout of update 3")
    assert 1.0 <= time.monotonic() - start < 10
    proc.kill()
    proc.join()
    inbox.close()


def test_the_exit_codes_in_words():
    assert [int(c) for c in ProducerExit] == [0, 3, 4]  # 1 stays Python's own (a failure before the handler)
    assert describe_exit(ProducerExit.DONE) == "exit code 0, done"
    assert describe_exit(ProducerExit.FAILED) == "exit code 3, failed"
    assert describe_exit(ProducerExit.TRAINER_GONE) == "exit code 4, trainer gone"
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-9) == "killed by signal 9"


def test_a_resume_point_is_added_to_the_line_and_the_cause_kept():
    err = RolloutProducerTimeout("the producer sent nothing", "trace text")
    again = err.resumable("--resume auto continues at update 2")
    assert isinstance(again, RolloutProducerTimeout)
    assert str(again) == "the producer sent nothing; --resume auto continues at update 2"
    assert again.trace == "trace text"


# ------------------------------------------------------------------ the real producer


def _cfg(overrides, games, out, *extra):
    from seedfast.config import load_config

    return load_config(None, [*overrides(games, out), "algorithm=grpo", "rollout.max_staleness=1", *extra])


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _fds() -> tuple[int, int]:
    """(open descriptors, sockets among them) of this process."""
    fds = sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        fds += 1
        sockets += target.startswith("socket:")
    return fds, sockets


def _children() -> set[int]:
    return {int(p.name) for p in Path("/proc").glob("[0-9]*")
            if _ppid(p) == os.getpid()}


def _ppid(proc: Path) -> int | None:
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]) if fields[0] != "Z" else None


def test_start_close_cycles_leave_nothing_behind(overrides, train_games, tiny_policy, tmp_path, one_torch_thread):
    from seedfast.runtime.setup import load_policy

    cfg = _cfg(overrides, train_games, tmp_path)
    cpu = torch.device("cpu")
    policy = load_policy(cfg, tiny_policy, cpu, trainable=False)

    def cycle() -> int | None:
        producer = RolloutProducer(cfg, tiny_policy, first_step=0, first_version=0, device=cpu)
        try:
            producer.push(policy, 0)
        finally:
            producer.close()
        return producer.exitcode

    assert cycle() == ProducerExit.TRAINER_GONE  # warm: multiprocessing's resource tracker, gloo's first use
    threads, (fds, sockets), children = _threads(), _fds(), _children()
    codes = [cycle() for _ in range(10)]
    assert codes == [ProducerExit.TRAINER_GONE] * 10  # closed while it waited for the next version
    assert _threads() == threads
    assert _fds() == (fds, sockets)
    assert _children() == children


def test_a_producer_that_fails_says_where_with_its_traceback(overrides, train_games, tiny_policy, tmp_path):
    cfg = _cfg(overrides, train_games, tmp_path)
    producer = RolloutProducer(cfg, tmp_path / "no_policy_here", first_step=0, first_version=0,
                               device=torch.device("cpu"))
    try:
        with pytest.raises(RolloutProducerError, match="the rollout producer failed at update 0: ") as caught:
            producer.next(0)
    finally:
        producer.close()
    assert "Traceback" in caught.value.trace and "no_policy_here" in caught.value.trace
    assert producer.exitcode == ProducerExit.FAILED


# ------------------------------------------------------------------ real runs


def _args(overrides, games, out, policy, *extra):
    return [sys.executable, "-m", "seedfast", "train", *overrides(games, out), "algorithm=grpo",
            f"trainer.init_from={policy}", "trainer.keep_checkpoints=10", "rollout.max_staleness=1", *extra]


def _start(cmd: list[str], ready, timeout: float = 300) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=one_thread_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read().decode()[-3000:]}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return proc


def _producer_pid(out: Path) -> int:
    return [r["pid"] for r in metrics_lines(out) if r.get("event") == "rollout_producer"][-1]


def _one_line(err: bytes) -> str:
    lines = [line for line in err.decode().splitlines() if line.startswith("seedfast train:")]
    assert len(lines) == 1, err.decode()[-3000:]
    return lines[0]


def test_a_producer_killed_mid_update_gives_one_line_and_an_exact_resume(overrides, train_games, tiny_policy,
                                                                        tmp_path):
    extra = ("trainer.steps=4", "trainer.checkpoint_every=1", "env.step_delay_s=0.05")
    straight = tmp_path / "straight"
    subprocess.run(_args(overrides, train_games, straight, tiny_policy, *extra), env=one_thread_env(), check=True,
                   capture_output=True)
    out = tmp_path / "killed"
    cmd = _args(overrides, train_games, out, tiny_policy, *extra)
    proc = _start(cmd, lambda: any(r.get("step") == 1 for r in metrics_lines(out)))
    os.kill(_producer_pid(out), signal.SIGKILL)  # rolling out update 3 (or 2), its environments sleeping
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 5, err.decode()[-3000:]
    line = _one_line(err)
    newest = list_checkpoints(out / "t" / "ckpt")[-1]
    assert "rollout producer" in line and "killed by signal 9" in line and "while the trainer" in line
    assert f"--resume auto continues at update {newest.name.removeprefix('step_')} from {newest}" in line
    subprocess.run([*cmd, "--resume", "auto"], env=one_thread_env(), check=True, capture_output=True)
    assert [r["step"] for r in stable_rows(out)] == [0, 1, 2, 3]
    assert stable_rows(out) == stable_rows(straight)


def _step_seconds(out: Path) -> float:
    """The slowest update so far of the run under `out`, as it logged it (`time/step`): the box's pace now."""
    return max(r["time/step"] for r in metrics_lines(out) if "time/step" in r)


def _import_seconds() -> float:
    """How long a fresh process takes now to import what the producer imports: the box's pace (a loaded box is
    slower at everything, the producer's start included)."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import seedfast.train.rl"], env=one_thread_env(), check=True)
    return time.monotonic() - start


def test_a_silent_producer_ends_the_run_with_one_line_naming_the_update(overrides, train_games, tiny_policy,
                                                                       tmp_path):
    # rollout.producer_timeout_s bounds the producer's start too (spawn, imports, the policy, the environments):
    # under load a 20 s timeout ended the run before any update (measured: 'sent nothing for 20 s ... while the
    # trainer waited for it to start' beside two busy loops), so the timeout follows the box's pace
    timeout_s = float(max(20, round(4 * _import_seconds())))
    out = tmp_path / "silent"
    cmd = _args(overrides, train_games, out, tiny_policy, "trainer.steps=50", f"rollout.producer_timeout_s={timeout_s}",
                "env.step_delay_s=0.05")
    proc = _start(cmd, lambda: any("step" in r for r in metrics_lines(out)))
    try:
        producer = _producer_pid(out)
        os.kill(producer, signal.SIGSTOP)  # alive, and silent
        start = time.monotonic()
        # The bound the run must keep, scaled by the pace this box shows now (a loaded CI box is slower at
        # everything): the update it was learning when the producer stopped, the producer's timeout, the death
        # grace of a failed push (5 s), closing the stopped producer (its lifeline's 10 s, then SIGKILL), and the
        # run's own teardown, counted as a few updates more. A trainer that does not bound its wait never ends.
        bound = timeout_s + 5 + 10 + 6 * _step_seconds(out) + 30
        try:
            _, err = proc.communicate(timeout=bound + 60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the run did not end {bound + 60:.0f} s after its producer stopped") from None
        waited = time.monotonic() - start
        assert waited < bound, f"the run ended {waited:.0f} s after its producer stopped (bound {bound:.0f} s)"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 5, err.decode()[-3000:]
    line = _one_line(err)
    # stopped while it rolled out (the trainer waits for a batch) or while it took weights (the send waits)
    named = (rf"(sent nothing|took no weights) for {timeout_s:g} s \(rollout.producer_timeout_s\) while the trainer "
             r"(waited for the rollout of update \d+|sent it policy version \d+ .*, after update \d+)")
    assert re.search(named, line), line
    assert "--resume auto continues at update" in line
    deadline = time.monotonic() + 15
    while Path(f"/proc/{producer}").exists() and _ppid(Path(f"/proc/{producer}")) is not None:
        assert time.monotonic() < deadline, "the stopped producer outlived its trainer"
        time.sleep(0.1)


def test_readers_do_not_pile_up_in_a_threaded_trainer():
    """The reader is a daemon thread that ends with the pipe: none is left once an inbox has seen its end."""
    before = threading.active_count()
    for _ in range(3):
        proc, inbox = _toy(["x"])
        assert inbox.get("waited") == "x"
        with pytest.raises(RolloutProducerError):
            inbox.get("waited")
        inbox.close()
        proc.join()
        proc.close()
    assert threading.active_count() == before


# ------------------------------------------------------------------ a failure found by whichever call comes next


def _produce_failing_in(update: int, *args) -> None:
    """The producer process (async_rollout.produce), its rollout of `update` raising (first_step 0): the batches
    before it are sent, then the failure's traceback, then it exits (ProducerExit.FAILED)."""
    import seedfast.rollout.agent_loop as agent_loop
    from seedfast.train import async_rollout

    real, calls = agent_loop.run_agent_loop, []

    def run_agent_loop(*a, **k):
        calls.append(1)
        if len(calls) == update + 1:
            raise RuntimeError(f"injected failure in the rollout of update {update}")
        return real(*a, **k)

    agent_loop.run_agent_loop = run_agent_loop
    async_rollout.produce(*args)


def _fails_in_update_1(*args) -> None:
    _produce_failing_in(1, *args)


def _fails_in_update_2(*args) -> None:
    _produce_failing_in(2, *args)


def test_a_producer_that_failed_mid_rollout_shows_its_traceback_to_the_next_push(
        overrides, train_games, tiny_policy, tmp_path, monkeypatch, one_torch_thread):
    """The producer sent update 0's batch, failed in update 1's rollout and exited before the trainer read either:
    the push that finds it gone raises its failure with its traceback, not 'exit code 3, failed'."""
    from seedfast.runtime.setup import load_policy
    from seedfast.train import async_rollout

    monkeypatch.setattr(async_rollout, "produce", _fails_in_update_1)  # spawn pickles it by name: this module's
    cfg = _cfg(overrides, train_games, tmp_path)
    cpu = torch.device("cpu")
    policy = load_policy(cfg, tiny_policy, cpu, trainable=False)
    producer = RolloutProducer(cfg, tiny_policy, first_step=0, first_version=0, device=cpu)
    try:
        producer.push(policy, 0)
        producer.process.join(timeout=120)
        assert producer.process.exitcode == ProducerExit.FAILED
        with pytest.raises(RolloutProducerError) as caught:
            producer.push(policy, 1)
    finally:
        producer.close()
    line = str(caught.value)
    assert "\n" not in line
    assert ("the rollout producer failed at update 1: RuntimeError('injected failure in the rollout of update 1') "
            "(found when the trainer sent it policy version 1)") == line
    assert caught.value.trace.startswith("Traceback")
    assert "RuntimeError: injected failure in the rollout of update 1" in caught.value.trace
    assert str(caught.value.__cause__) == caught.value.trace


def test_a_run_whose_producer_failed_names_the_update_its_traceback_and_the_resume_point(
        overrides, train_games, tiny_policy, tmp_path, monkeypatch, capsys):
    from seedfast import cli
    from seedfast.train import async_rollout

    # update 1's batch is read at the step_1 checkpoint, so the failure is found by the push of version 2 or the
    # wait for update 2's batch, whichever comes first: the same line either way
    monkeypatch.setattr(async_rollout, "produce", _fails_in_update_2)
    out = tmp_path / "failed"
    args = _args(overrides, train_games, out, tiny_policy, "trainer.steps=4", "trainer.checkpoint_every=1")[3:]
    assert cli.main(args) == 5
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("seedfast train:")]
    assert len(lines) == 1, err[-3000:]
    newest = list_checkpoints(out / "t" / "ckpt")[-1]
    assert newest.name == "step_1"
    assert "the rollout producer failed at update 2: RuntimeError('injected failure in the rollout of update 2')" \
        in lines[0]
    assert "exit code 3" not in lines[0]
    assert f"; --resume auto continues at update 1 from {newest}" in lines[0]
    log = (out / "t" / "errors.log").read_text()  # the producer's traceback, as the cause
    assert "in run_agent_loop\n" in log and "RuntimeError: injected failure in the rollout of update 2\n" in log
