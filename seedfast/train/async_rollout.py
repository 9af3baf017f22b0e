"""The rollout producer of asynchronous RL (docs/architecture.md, 'Asynchronous rollouts'): a process of its own
with its own copy of the policy, the own engine and its own environment slots, rolling out update s on policy
version `staleness.rollout_version(s)` while the trainer learns from earlier batches.

    producer = RolloutProducer(cfg, policy_dir, first_step=0, first_version=0, device=device)
    producer.push(policy, version=0)        # a version, in buckets over the weight group (distributed/weight_channel)
    for step in ...:
        produced = producer.next(step)      # blocks until update `step`'s batch is there (or the producer died)
        ... learn ...
        producer.push(policy, version=step + 1)
    producer.close()

Every episode finishes on the weights it started with: a batch is one version (no partial rollouts), so each token's
version is its trajectory's (`Trajectory.meta["policy_version"]`). The producer dies with the trainer whatever ends
it (envs/lifeline.py: PR_SET_PDEATHSIG and a lifeline pipe; its environment workers die with it in turn), and the
trainer gets one `RolloutProducerError` naming the producer's exit, or its traceback, when the producer fails.
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing import get_context, util
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from seedfast.config import Config
from seedfast.distributed.weight_channel import (
    STOP,
    WeightChannel,
    bucket_layout,
    load_buckets,
    loaded_fingerprint,
)
from seedfast.distributed.weight_push import hf_named_tensors
from seedfast.envs.lifeline import die_with_owner
from seedfast.runtime.precision import DTYPES
from seedfast.train.staleness import VERSION_KEY, Produced, check_weights, rollout_version

POLL_S = 0.2


class RolloutProducerError(RuntimeError):
    """The rollout producer died or failed: the run cannot go on (the traceback of its failure, when it had one)."""


@dataclass
class _Failure:
    step: int
    error: str
    trace: str


@dataclass
class _Ready:
    pid: int


class RolloutProducer:
    """The trainer's handle on the producer process (the module docstring)."""

    def __init__(self, cfg: Config, policy_dir: str | Path, *, first_step: int, first_version: int,
                 device: torch.device) -> None:
        self.cfg = cfg
        self.dtype = DTYPES[cfg.model.dtype]
        self.bucket_bytes = cfg.rollout.sync_bucket_mb << 20
        self.channel = WeightChannel.listen(device)
        ctx = get_context("spawn")  # the producer's parent is the trainer: PR_SET_PDEATHSIG reaches it
        lifeline_r, self._lifeline_w = ctx.Pipe(duplex=False)  # only the trainer holds the write end
        self._results_r, results_w = ctx.Pipe(duplex=False)
        # not a daemon (its environment workers are its children); ended before multiprocessing joins children
        # at exit by the finalizer below, and by the kernel or its lifeline if this process dies otherwise
        self.process = ctx.Process(
            target=produce, name="seedfast-rollout-producer",
            args=(cfg, str(policy_dir), self.channel.port, first_step, first_version, results_w, lifeline_r))
        self.process.start()
        results_w.close()
        lifeline_r.close()
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="rollout-producer-reader", daemon=True)
        self._reader.start()
        self._ready = False
        self.sent: dict[int, int] = {}  # version -> fingerprint of the weights sent as it
        self._finalizer = util.Finalize(self, _end, args=(self.process, self._lifeline_w), exitpriority=10)

    def _read(self) -> None:
        """Every message of the producer into the inbox as it comes (the producer never blocks on a full pipe)."""
        while True:
            try:
                msg = pickle.loads(self._results_r.recv_bytes())
            except (EOFError, OSError):
                self._inbox.put(None)
                return
            self._inbox.put(msg)

    def _died(self, doing: str) -> RolloutProducerError:
        self.process.join(timeout=5)
        code = self.process.exitcode
        how = f"exit code {code}" if code is None or code >= 0 else f"killed by signal {-code}"
        return RolloutProducerError(f"the rollout producer (pid {self.process.pid}) ended ({how}) while the trainer "
                                    f"{doing}")

    def _get(self, doing: str) -> Any:
        while True:
            try:
                msg = self._inbox.get(timeout=POLL_S)
            except queue.Empty:
                if not self.process.is_alive() and self._inbox.empty():
                    raise self._died(doing) from None
                continue
            if msg is None:
                raise self._died(doing)
            if isinstance(msg, _Failure):
                raise RolloutProducerError(f"the rollout producer failed at update {msg.step}: {msg.error}\n"
                                           f"{msg.trace}")
            return msg

    def push(self, policy: torch.nn.Module, version: int) -> dict[str, float]:
        """Send `policy`'s weights as `version` (a collective with the producer's receiver thread)."""
        start = time.perf_counter()
        if not self._ready:  # the producer's group side exists once it said so: never wait on a dead one
            self._get("waited for it to start")
            self._ready = True
        if not self.process.is_alive():
            raise self._died(f"sent it policy version {version}")
        try:
            stats = self.channel.send(version, hf_named_tensors(policy, dtype=self.dtype), self.bucket_bytes)
        except RuntimeError as err:  # the peer closed the group mid-broadcast
            raise self._died(f"sent it policy version {version} ({err})") from err
        self.sent[version] = int(stats["fingerprint"])
        return {"async/push_seconds": time.perf_counter() - start, "async/push_bytes": stats["bytes"]}

    def next(self, step: int) -> Produced:
        """Update `step`'s batch (the producer sends them in order)."""
        if not self._ready:
            self._get("waited for it to start")
            self._ready = True
        msg = self._get(f"waited for the rollout of update {step}")
        if not isinstance(msg, Produced):
            raise RolloutProducerError(f"the rollout producer sent {type(msg).__name__} where update {step}'s "
                                       "rollout was due")
        check_weights(msg, self.sent)
        return msg

    def close(self) -> None:
        """End the producer now, whatever it is doing (its lifeline closes; its environment workers follow)."""
        self._finalizer()
        self._results_r.close()


def _end(process: Any, lifeline_w: Connection) -> None:
    lifeline_w.close()
    process.join(timeout=10)
    if process.is_alive():
        process.kill()
        process.join()


class _Staged:
    """Versions the receiver thread got, waiting for the update they roll out."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.versions: dict[int, list[torch.Tensor]] = {}
        self.stopped = False
        self.error: BaseException | None = None

    def receive(self, channel: WeightChannel, layout: Any, dtype: torch.dtype) -> None:
        try:
            while True:
                version, flats = channel.receive(layout, dtype)
                with self.cond:
                    if version == STOP:
                        self.stopped = True
                    else:
                        self.versions[version] = flats
                    self.cond.notify_all()
                if version == STOP:
                    return
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which reports it
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def take(self, version: int) -> list[torch.Tensor]:
        with self.cond:
            self.cond.wait_for(lambda: version in self.versions or self.stopped or self.error is not None)
            if version not in self.versions:
                raise RuntimeError(f"policy version {version} never came"
                                   + (f": {self.error!r}" if self.error else " (the trainer stopped)"))
            for old in [v for v in self.versions if v < version]:
                del self.versions[old]
            return self.versions.pop(version)


def produce(cfg: Config, policy_dir: str, port: int, first_step: int, first_version: int, results: Connection,
            lifeline: Connection) -> None:
    """The producer process: rollouts of updates first_step.. in order, each on its version, sent to the trainer."""
    die_with_owner(lifeline)
    step = first_step
    try:
        for produced in _produce(cfg, Path(policy_dir), port, first_step, first_version, results):
            results.send_bytes(pickle.dumps(produced))
            step = produced.step + 1
    except BaseException as err:  # noqa: BLE001 - every failure reaches the trainer as one error
        results.send_bytes(pickle.dumps(_Failure(step, repr(err), traceback.format_exc())))
        results.close()
        os._exit(1)
    results.close()
    os._exit(0)  # the receiver thread may still sit in the group's broadcast: no interpreter teardown around it


def _produce(cfg: Config, policy_dir: Path, port: int, first_step: int, first_version: int, results: Connection
             ) -> Any:
    from seedfast.envs.slots import counter_delta, counters_of
    from seedfast.rollout.agent_loop import run_agent_loop
    from seedfast.rollout.colocated import OwnRollout
    from seedfast.runtime.setup import (
        agent_config,
        device_of,
        load_policy,
        load_run_tokenizer,
        load_tasks,
        make_env_slots,
    )
    from seedfast.seeds import sampling_seed, step_seed
    from seedfast.train.draws import choose_tasks, seed_everything, task_pool

    device = device_of(cfg)
    dtype = DTYPES[cfg.model.dtype]
    model = load_policy(cfg, policy_dir, device, trainable=False)
    layout = bucket_layout(model, cfg.rollout.sync_bucket_mb << 20, dtype=dtype)
    tokenizer = load_run_tokenizer(cfg, policy_dir)
    tasks = task_pool(load_tasks(cfg, "train", skipped=[]), cfg.rollout.task_pool, cfg.run.seed)
    envs = make_env_slots(cfg, cfg.env.slots or max(cfg.rollout.tasks_per_batch * cfg.rollout.n, 1))
    agent = agent_config(cfg, n=cfg.rollout.n, temperature=cfg.rollout.temperature)
    engine = OwnRollout(model, seed=cfg.run.seed)
    channel = WeightChannel.connect(port, device)
    staged = _Staged()
    results.send_bytes(pickle.dumps(_Ready(pid=os.getpid())))
    threading.Thread(target=staged.receive, args=(channel, layout, dtype), name="weights", daemon=True).start()
    loaded: int | None = None
    loaded_print: int | None = None
    try:
        for step in range(first_step, cfg.trainer.steps):
            version = rollout_version(step, cfg.rollout.max_staleness, first_version)
            if version != loaded:
                load_buckets(model, layout, staged.take(version))
                loaded, loaded_print = version, loaded_fingerprint(model, layout)
            seed_everything(step_seed(cfg.run.seed, step))
            chosen = choose_tasks(tasks, cfg.rollout.tasks_per_batch, cfg.run.seed, step)
            engine.begin_step(sampling_seed(cfg.run.seed, step, 0))
            before = counters_of(envs)
            started = time.time()
            with torch.no_grad():
                result = run_agent_loop(engine, tokenizer, chosen, envs, agent)
            for t in result.trajectories:
                t.meta[VERSION_KEY] = version
            yield Produced(step, version, result, counter_delta(before, counters_of(envs), "rollout/env_"),
                           started, time.time(), loaded_print)
    finally:
        close = getattr(envs, "close", None)
        if close is not None:
            close()
