"""The rollout engine of the RL loop (docs/scaling.md, 'vLLM in the RL loop'): the own sampler over the training
model, or a vLLM engine colocated on this rank's GPU that gets the policy's weights pushed before each rollout.

    rollout = build_rollout("vllm", policy, hf_dir, dtype="bf16", seed=cfg.run.seed, sleep=True)
    # each step, with the weights as buckets of (HF name, full tensor) (distributed/weight_push.py; lazy: unread by own)
    rollout.begin_step(step_seed)
    metrics |= rollout.before_rollout(buckets(hf_named_tensors(policy), 512 << 20))
    result = run_agent_loop(rollout, ...)       # generate / generate_full: the engine protocol (rollout/engine.py)
    metrics |= rollout.after_rollout()          # vLLM: sleeps (weights and KV cache freed) for the update

With a LoRA policy and lora_sync="adapter" the vLLM engine keeps the base it loaded and serves the policy's adapters
(vllm_engine.py `load_adapter`: a PEFT folder per push, vLLM's LoRA layers read back and hashed); `before_rollout`
then sends the adapters alone and never iterates the merged-weight buckets it is handed (docs/scaling.md, 'LoRA
weight sync').

`reads_policy` says whether generation reads the training model itself (own: the caller all-gathers a sharded
policy around it, distributed/parallelize.py `unsharded`) or a copy (vLLM: nothing to gather but the pushed buckets).
Both seed their sampling from the step alone (`begin_step`), so a resumed run draws the same samples.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from seedfast.model.lora import ADAPTER_NAMES, lora_modules, lora_spec_of
from seedfast.rollout.engine import Generation, GenerationEngine
from seedfast.rollout.own_engine import Sampler
from seedfast.sampling_params import SamplingParams
from seedfast.seeds import request_seed

Bucket = Sequence[tuple[str, torch.Tensor]]


@runtime_checkable
class RolloutEngine(GenerationEngine, Protocol):
    """What the RL loop drives: the engine protocol (generate, generate_full) plus the per-step hooks."""

    reads_policy: bool

    def begin_step(self, seed: int) -> None: ...

    def before_rollout(self, weights: Iterable[Bucket]) -> dict[str, float]: ...

    def after_rollout(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class OwnRollout:
    """The own KV-cache `Sampler` over the training model: it reads the live weights, so there is nothing to sync;
    each step draws from a generator seeded with the step's seed (a new Sampler, as the trainer always did)."""

    reads_policy = True

    def __init__(self, policy: torch.nn.Module, *, seed: int = 0, max_batch_sequences: int | None = None) -> None:
        self.policy = policy
        self.max_batch_sequences = max_batch_sequences
        self.sampler = Sampler(policy, seed=seed, max_batch_sequences=max_batch_sequences)

    def begin_step(self, seed: int) -> None:
        self.sampler = Sampler(self.policy, seed=seed, max_batch_sequences=self.max_batch_sequences)

    def before_rollout(self, weights: Iterable[Bucket] | None = None) -> dict[str, float]:
        """Nothing: `weights` is never iterated (a lazy bucket generator then gathers nothing)."""
        return {}

    def after_rollout(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Nothing to release: the sampler is the policy's."""

    def generate(self, prompt_token_lists: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
        return self.sampler.generate(prompt_token_lists, params)

    def generate_full(self, prompt_token_lists: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """`params.seed`: the sampler restarts from it (as after begin_step(seed))."""
        return self.sampler.generate_full(prompt_token_lists, params)


class VLLMRollout:
    """A `VLLMEngine` colocated on this rank's GPU (vllm_engine.py), synced before every rollout.

    before_rollout(buckets): wake the weights (if asleep) -> push every bucket (one RPC each; checksums compared
    at the end, prefix cache reset) -> wake the KV cache. after_rollout(): sleep (when `sleep`), freeing the KV
    cache and the weights for the update. With `sleep_level` 1 vLLM keeps a CPU copy of the weights while asleep
    (copied back on wake, then overwritten by the push); level 2 keeps none (less CPU memory and copying, but every
    weight must then come from the push). With `seed_requests` every request carries a seed from (step seed,
    generate call, index), seeds.request_seed: copies of one prompt differ and a resumed run draws the same (up to
    vLLM's batch-dependent numerics); vLLM draws seeded requests' noise one request at a time (a small kernel per
    request and token), so `seed_requests=False` leaves sampling to the engine's generator, seeded once.
    """

    reads_policy = False

    def __init__(self, engine: Any, *, sleep: bool = True, sleep_level: int = 1, verify: bool = True,
                 seed_requests: bool = True, clock: Callable[[], float] = time.perf_counter,
                 adapters_of: torch.nn.Module | None = None) -> None:
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 or 2, got {sleep_level!r}")
        if adapters_of is not None and sleep and sleep_level == 2:
            raise ValueError("LoRA adapter sync keeps the base in the engine: sleep level 2 discards it (use 1)")
        self.engine = engine
        # a LoRA policy whose adapters alone are pushed (lora_sync="adapter"); None: the weights are
        self.adapters_of = adapters_of
        self.sleep = sleep
        self.sleep_level = sleep_level
        self.verify = verify
        self.seed_requests = seed_requests
        self.clock = clock
        self.asleep = False
        self.step_seed: int | None = None
        self.calls = 0

    @property
    def llm(self) -> Any:
        return self.engine.llm

    def begin_step(self, seed: int) -> None:
        self.step_seed = int(seed)
        self.calls = 0

    def before_rollout(self, weights: Iterable[Bucket]) -> dict[str, float]:
        """Wake, push the policy's weights (buckets of (HF name, full tensor)), wake the KV cache; `sync/` metrics."""
        start = self.clock()
        wake = 0.0
        if self.asleep:  # weights first, so the push does not compete with the KV cache for memory
            t = self.clock()
            self.llm.wake_up(tags=["weights"])
            wake += self.clock() - t
        if self.adapters_of is not None:  # the adapters alone; the merged buckets are never gathered
            stats = self.load_adapters(full_adapters(self.adapters_of))
        else:
            stats = self.engine.push_weights(weights, verify=self.verify)
        if self.asleep:
            t = self.clock()
            self.llm.wake_up(tags=["kv_cache"])
            wake += self.clock() - t
            self.asleep = False
        return {"sync/seconds": self.clock() - start, "sync/push_seconds": float(stats["seconds"]),
                "sync/wake_seconds": wake, "sync/bytes": float(stats["bytes"]),
                "sync/buckets": float(stats["buckets"]), "sync/tensors": float(stats["tensors"])}

    def load_adapters(self, adapters: Sequence[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """Serve these LoRA adapters from now on (vllm_engine.py `load_adapter`, verified): the push of
        lora_sync="adapter", also the rollout producer's with a version received as adapters."""
        if self.adapters_of is None:
            raise RuntimeError("load_adapters: this vLLM rollout pushes merged weights (lora_sync='merged')")
        return self.engine.load_adapter(adapters, lora_spec_of(self.adapters_of), verify=self.verify)

    def after_rollout(self) -> dict[str, float]:
        """Sleep until the next push (when `sleep`): the update gets the engine's memory."""
        if not self.sleep or self.asleep:
            return {}
        t = self.clock()
        self.llm.sleep(level=self.sleep_level)
        self.asleep = True
        return {"sync/sleep_seconds": self.clock() - t}

    def close(self) -> None:
        """Shut the engine down (VLLMEngine.close); the trainer calls it before its process group ends."""
        self.engine.close()

    def _seeds(self, n: int, seed: int | None = None) -> list[int] | None:
        """Per-request seeds: from `seed` as for the first call after begin_step(seed), else from the step."""
        if seed is not None:
            return [request_seed(int(seed), 0, i) for i in range(n)]
        if self.step_seed is None or not self.seed_requests:
            return None
        seeds = [request_seed(self.step_seed, self.calls, i) for i in range(n)]
        self.calls += 1
        return seeds

    def _check_awake(self) -> None:
        if self.asleep:
            raise RuntimeError("the vLLM rollout engine is asleep: generate between before_rollout and after_rollout")

    def generate(self, prompt_token_lists: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
        return [g.token_ids for g in self.generate_full(prompt_token_lists, params)]

    def generate_full(self, prompt_token_lists: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        self._check_awake()
        # the engine gets the seeds per request, `params.seed` among them
        seeds = self._seeds(len(prompt_token_lists), params.seed)
        return self.engine.generate_full(prompt_token_lists, replace(params, seed=None), seeds=seeds)


def resolve_lora_sync(lora_sync: str, engine: str) -> str:
    """rollout.lora_sync for `engine` ("own" or "vllm"): "auto" is "adapter" for the own engine and "merged" for
    vLLM, the faster of the two on each as measured (docs/scaling.md, 'LoRA weight sync'; benchmarks/lora_sync.py:
    on vLLM's CPU build its LoRA serving made the rollout 5.6x slower, more than the adapters' push saved)."""
    if lora_sync not in ("auto", "adapter", "merged"):
        raise ValueError(f"lora_sync must be 'auto', 'adapter' or 'merged', got {lora_sync!r}")
    if lora_sync == "auto":
        return "merged" if engine == "vllm" else "adapter"
    return lora_sync


def full_adapters(policy: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, whole tensor) of a LoRA policy's adapters, in its order and their own dtype; a sharded one gathered (a
    collective: every rank pushes to its own engine at the same point). distributed/weight_push.py
    adapter_named_tensors, which this package may not import (docs/architecture.md, 'Import direction')."""
    from torch.distributed.tensor import DTensor

    out = []
    with torch.no_grad():
        for path, module in lora_modules(policy).items():
            for leaf in ADAPTER_NAMES:
                tensor = getattr(module, leaf).detach()
                out.append((f"{path}.{leaf}", tensor.full_tensor() if isinstance(tensor, DTensor) else tensor))
    return out


def build_rollout(engine: str, policy: torch.nn.Module, model_path: str | Path | None = None, *, seed: int = 0,
                  dtype: str = "bf16", gpu_memory_utilization: float = 0.5, tensor_parallel_size: int = 1,
                  sleep: bool = True, sleep_level: int = 1, seed_requests: bool = True, lora_sync: str = "auto",
                  **llm_kwargs: Any) -> OwnRollout | VLLMRollout:
    """The RL loop's rollout engine: "own" over `policy`, or "vllm" loaded from the HF folder `model_path` (the
    policy's weights: they are pushed before every rollout anyway) with sleep mode when `sleep`. With a LoRA policy
    `lora_sync` (rollout.lora_sync) says what each push sends: "adapter", the adapters alone, served by vLLM's LoRA
    support over the base `model_path` holds (which must be the policy's base); "merged" (and "auto", for vLLM:
    `resolve_lora_sync`), the merged weights.

    Under torchrun (WORLD_SIZE > 1) vLLM runs inside each rank's process on the rank's GPU, over the launcher's
    process group (distributed_executor_backend="external_launcher", as TRL's and verl's colocated modes do)."""
    if engine == "own":
        return OwnRollout(policy, seed=seed)
    if engine != "vllm":
        raise ValueError(f"engine must be 'own' or 'vllm', got {engine!r}")
    if model_path is None:
        raise ValueError("a vLLM rollout engine needs the policy's HF folder (model_path)")
    from seedfast.rollout.vllm_engine import VLLMEngine

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # one engine per trainer rank: vLLM's data-parallel replicas over torchrun's ranks
        llm_kwargs.setdefault("distributed_executor_backend", "external_launcher")
        llm_kwargs.setdefault("data_parallel_size", world // tensor_parallel_size)
    spec = lora_spec_of(policy)
    adapters_of = policy if spec is not None and resolve_lora_sync(lora_sync, engine) == "adapter" else None
    if adapters_of is not None:
        llm_kwargs["lora_rank"] = spec.rank
    vllm_engine = VLLMEngine(str(model_path), dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                             tensor_parallel_size=tensor_parallel_size, enable_sleep_mode=sleep, **llm_kwargs)
    # vLLM's CPU back end has no sleep mode: its engine stays awake (vllm_engine.py `sleep_mode`)
    return VLLMRollout(vllm_engine, sleep=sleep and getattr(vllm_engine, "sleep_mode", sleep), sleep_level=sleep_level,
                       seed_requests=seed_requests, adapters_of=adapters_of)
