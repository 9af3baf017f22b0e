"""Asynchronous RL with a vLLM engine in the rollout producer (train/async_rollout.py `VLLMProducerEngine`), against
the REAL vLLM on its CPU back end (`make test-vllm`): a one-step-off run (rollout.max_staleness=1) completes with a
version lag of 1, its first update (rolled out on the start weights, as the synchronous loop's is) writes the
synchronous vLLM run's metrics, two such runs with one seed are equal, each batch was rolled out with the version
the trainer sent (the fingerprint the trainer checks, and the log-probs vLLM sampled with scored by that version's
policy at fp32 rounding, by the other version's far from it), and a push that does not land in vLLM is caught by
its verify. The producer's vLLM runs inside its process: a producer killed with SIGKILL leaves no process behind.
TextWorld games and the SFT'd tiny policy with heads of 32, as tests/vllm_real/test_vllm_rl_loop.py. Skipped
without vllm or textworld."""

from __future__ import annotations

import copy
import os
import signal
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("textworld")

from seedfast.config import Config, load_config  # noqa: E402
from seedfast.distributed.weight_channel import fingerprint  # noqa: E402
from seedfast.distributed.weight_push import buckets, hf_named_tensors  # noqa: E402
from seedfast.ops.linear_logprob import linear_logprob  # noqa: E402
from seedfast.rollout.colocated import OwnRollout  # noqa: E402
from seedfast.runtime.setup import load_policy  # noqa: E402
from seedfast.train.async_rollout import (  # noqa: E402
    RolloutProducer,
    VLLMProducerEngine,
    channel_dtype,
)
from seedfast.train.rl import Trainer  # noqa: E402
from seedfast.train.staleness import Produced  # noqa: E402
from tests.vllm_real.vllm_helpers import GAP_FP32, PUSH_RPCS, SMALL_ENGINE, STEPS, update  # noqa: E402

pytestmark = pytest.mark.usefixtures("small_engine")

# keys that differ between two runs of one seed whatever the engine (clocks, memory) or that only one kind of run
# writes (the synchronous loop's push into vLLM, the producer's weight send)
VOLATILE = ("time/", "throughput/", "memory/", "async/", "sync/")
# the metrics of vLLM's own log-probs of the sampled tokens (the behaviour policy's)
BEHAVIOUR = ("rollout/logprob_gap", "rollout_corr/")


def _cfg(overrides, policy: Path, games: Path, out: Path, *extra: str) -> Config:
    return load_config(None, [*overrides(games, out), f"model.path={policy}", "rollout.engine=vllm",
                              "rollout.sync_bucket_mb=1", "algorithm=grpo", f"trainer.steps={STEPS}",
                              "trainer.checkpoint_every=0", "optim.lr=1e-2", *SMALL_ENGINE, *extra], command="train")


def _run(cfg: Config, policy: Path) -> tuple[Trainer, list[dict[str, Any]]]:
    trainer = Trainer(cfg, policy_dir=policy)
    try:
        return trainer, trainer.run()
    finally:
        trainer.close()  # one engine at a time on 2 cores


def _stable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def test_one_step_off_with_vllm_lags_one_version_and_starts_as_the_synchronous_run(overrides, policy32, train_games,
                                                                                   tmp_path):
    t0 = time.perf_counter()
    _, sync = _run(_cfg(overrides, policy32, train_games, tmp_path / "sync"), policy32)
    t1 = time.perf_counter()
    trainer, lagged = _run(_cfg(overrides, policy32, train_games, tmp_path / "async", "rollout.max_staleness=1"),
                           policy32)
    t2 = time.perf_counter()
    print(f"synchronous run {t1 - t0:.1f} s, one-step-off run {t2 - t1:.1f} s")
    assert isinstance(trainer.engine, OwnRollout)  # the trainer holds no second vLLM engine: the producer rolls out
    assert [r["step"] for r in lagged] == list(range(STEPS))
    # update s rolled out by version max(0, s - 1): every token one update old after the first
    assert [r["rollout/policy_version"] for r in lagged] == [0, 0, 1]
    assert [r["rollout/staleness_max"] for r in lagged] == [0, 1, 1]
    assert [r["rollout/staleness_mean"] for r in lagged] == [0, 1, 1]
    # version 0 before the run, version 1 after update 0; version 2 would roll out update 3, which the run has not
    assert [r.get("async/push_bytes", 0) > 0 for r in lagged] == [True, False, False]
    # update 0 rolls out on the start weights in both runs, with the same seeds: the same samples, the same update
    first = _stable(lagged[0])
    staleness = {"rollout/staleness_mean", "rollout/staleness_max", "rollout/policy_version"}
    assert set(first) - staleness == set(_stable(sync[0]))
    # vLLM's log-probs of the same tokens: its CPU kernels reduce in another order with the producer's thread count
    # than with the synchronous loop's (~1e-8 relative, seen on an Intel Xeon); the tokens, and all the trainer
    # computes from them, are the same
    behaviour = {k for k in first if k.startswith(BEHAVIOUR)}
    assert {k: first[k] for k in _stable(sync[0]) if k not in behaviour} == {
        k: v for k, v in _stable(sync[0]).items() if k not in behaviour}
    assert {k: first[k] for k in behaviour} == pytest.approx({k: sync[0][k] for k in behaviour}, rel=1e-6, abs=1e-6)
    assert sync[0]["rollout/logprob_gap_max"] < GAP_FP32  # and that batch was vLLM's on the policy's weights
    # the runs part after it: the synchronous update 1 rolls out on version 1, the one-step-off one on version 0
    assert _stable(sync[1])["rollout/logprob_gap_max"] < GAP_FP32 < lagged[1]["rollout/logprob_gap_max"]


def test_two_one_step_off_vllm_runs_with_one_seed_are_identical(overrides, policy32, train_games, tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the two-core machine's default: one thread for the trainer, one for the producer
    try:
        runs = [[_stable(r) for r in _run(_cfg(overrides, policy32, train_games, tmp_path / name,
                                               "rollout.max_staleness=1"), policy32)[1]] for name in ("a", "b")]
    finally:
        torch.set_num_threads(before)
    assert [r["step"] for r in runs[0]] == list(range(STEPS))
    assert runs[0] == runs[1]


def _logprob_gap(policy: torch.nn.Module, produced: Produced, temperature: float) -> float:
    """The largest |log-prob vLLM sampled a response token with - `policy`'s log-prob of it| over the batch."""
    worst = 0.0
    for record in produced.result.steps:
        prompt, response = record.prompt_ids, list(record.response_ids)
        ids = torch.tensor(prompt + response)
        with torch.no_grad():
            hidden = policy(ids, torch.tensor([0, len(ids)], dtype=torch.int32))
            ours = linear_logprob(hidden[len(prompt) - 1:-1], policy.lm_head_weight, torch.tensor(response),
                                  temperature=temperature).logprob
        worst = max(worst, float((ours - torch.tensor(record.response_logprobs)).abs().max()))
    return worst


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def test_the_producer_rolls_out_with_each_version_it_was_sent(overrides, policy32, train_games, tmp_path):
    cfg = _cfg(overrides, policy32, train_games, tmp_path, "rollout.max_staleness=1")
    cpu = torch.device("cpu")
    policy = load_policy(cfg, policy32, cpu, trainable=False)
    start = copy.deepcopy(policy)
    producer = RolloutProducer(cfg, policy32, first_step=0, first_version=0, device=cpu)
    try:
        producer.push(policy, 0)
        # the trainer's check (staleness.check_weights) runs in next(): it raises on a fingerprint not sent
        produced = [producer.next(0), producer.next(1)]
        update(policy, seed=1)  # version 1 changes what vLLM samples
        producer.push(policy, 1)
        produced.append(producer.next(2))
        helpers = _descendants(producer.process.pid)
    finally:
        producer.close()
    assert [p.version for p in produced] == [0, 0, 1]
    assert producer.sent[0] != producer.sent[1]
    assert [p.fingerprint for p in produced] == [producer.sent[0], producer.sent[0], producer.sent[1]]
    # an independent reading of which weights vLLM sampled with: each version's policy scores the tokens
    temperature = cfg.rollout.temperature
    gaps = {(p.step, name): _logprob_gap(model, p, temperature)
            for p in produced for name, model in (("v0", start), ("v1", policy))}
    print("log-prob gaps:", gaps)
    assert gaps[0, "v0"] < GAP_FP32 and gaps[1, "v0"] < GAP_FP32 and gaps[2, "v1"] < GAP_FP32, gaps
    assert min(gaps[0, "v1"], gaps[1, "v1"], gaps[2, "v0"]) > 10 * GAP_FP32, gaps
    assert helpers == set()  # vLLM's engine core runs in the producer's process (inline environments too)


def test_a_producer_killed_leaves_no_vllm_process_behind(overrides, policy32, train_games, tmp_path):
    cfg = _cfg(overrides, policy32, train_games, tmp_path, "rollout.max_staleness=1")
    producer = RolloutProducer(cfg, policy32, first_step=0, first_version=0, device=torch.device("cpu"))
    try:
        producer.push(load_policy(cfg, policy32, torch.device("cpu"), trainable=False), 0)
        producer.next(0)  # its vLLM engine is up and has rolled out
        pid = producer.process.pid
        before = _descendants(pid) | {pid}
        os.kill(pid, signal.SIGKILL)
        producer.process.join(timeout=30)
        assert producer.process.exitcode == -signal.SIGKILL
    finally:
        producer.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in before):
        time.sleep(0.2)
    assert not [p for p in before if Path(f"/proc/{p}").exists()]


def _flats(policy: torch.nn.Module, cfg: Config) -> list[torch.Tensor]:
    """The flat buckets WeightChannel.send makes of `policy` (one tensor per bucket)."""
    named = hf_named_tensors(policy, dtype=channel_dtype(cfg))
    size = cfg.rollout.sync_bucket_mb << 20
    return [torch.cat([t.reshape(-1) for _, t in bucket]) for bucket in buckets(named, size)]


def _push_then_lose(cfg: Config, policy_dir: str, conn: Any) -> None:
    """In a process of its own (a producer's vLLM runs in its process: its engine core and its default process
    group must not be pytest's): a version that lands, then one whose push is lost on its way to vLLM."""
    try:
        engine = VLLMProducerEngine(cfg, Path(policy_dir))
        try:
            policy = load_policy(cfg, Path(policy_dir), torch.device("cpu"), trainable=False)
            update(policy, seed=1)
            flats = _flats(policy, cfg)
            landed = engine.load(flats) == fingerprint(flats)
            send = engine.rollout.llm.collective_rpc
            engine.rollout.llm.collective_rpc = (
                lambda method, *args, **kwargs: [None] if method in PUSH_RPCS else send(method, *args, **kwargs))
            update(policy, seed=2)
            try:
                engine.load(_flats(policy, cfg))
                conn.send((landed, None))
            except RuntimeError as err:
                conn.send((landed, str(err)))
        finally:
            engine.close()
    except BaseException as err:  # noqa: BLE001 - the test reports it
        conn.send((False, f"failed: {err!r}"))


def test_a_push_that_does_not_land_in_vllm_is_caught(overrides, policy32, train_games, tmp_path):
    cfg = _cfg(overrides, policy32, train_games, tmp_path, "rollout.max_staleness=1")
    ctx = get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_push_then_lose, args=(cfg, str(policy32), send))
    child.start()
    send.close()
    try:
        assert receive.poll(600), "the engine process sent nothing"
        landed, error = receive.recv()
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    assert landed  # a push that lands passes vLLM's verify; its fingerprint is the flat buckets'
    assert error is not None and error.startswith("vLLM weight sync failed: "), error
