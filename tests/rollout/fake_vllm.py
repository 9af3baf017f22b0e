"""A stand-in for the `vllm` module on the CPU (tests/rollout/test_colocated.py, tests/train/test_vllm_in_loop.py):
its LLM loads the HF folder into its own model copy, runs the real worker extension (WeightSyncExtension) for the
weight push, generates with the own Sampler over its copy, and records sleep / wake_up / collective_rpc /
reset_prefix_cache. Also the prompts and the update those tests (and tests/distributed/test_weight_push.py) share."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from seedfast.model import load_hf
from seedfast.rollout import vllm_engine
from seedfast.rollout.own_engine import Sampler
from seedfast.sampling_params import SamplingParams


@dataclasses.dataclass
class FakeEngineArgs:
    worker_extension_cls: str = ""
    enable_sleep_mode: bool = False
    logprobs_mode: str = "raw_logprobs"


@dataclasses.dataclass
class FakeSamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop_token_ids: list = dataclasses.field(default_factory=list)
    logprobs: int | None = None
    detokenize: bool = True
    seed: int | None = None


class FakeModel:
    """vLLM's model as its worker sees it: HF-named parameters and `load_weights`, over a seedfast Decoder."""

    def __init__(self, decoder, drop: str | None = None):
        self.decoder = decoder
        self.drop = drop  # a tensor this model silently ignores (a broken name mapping)

    def named_parameters(self):
        return self.decoder.named_parameters()

    def load_weights(self, weights):
        params = dict(self.decoder.named_parameters())
        with torch.no_grad():
            for name, tensor in weights:
                if name != self.drop:
                    params[name].copy_(tensor)


class FakeLLM:
    def __init__(self, model, *, dtype="float32", seed=0, worker_extension_cls="", enable_sleep_mode=False, **kwargs):
        assert worker_extension_cls == vllm_engine.EXTENSION
        self.kwargs = kwargs
        self.sleep_mode = enable_sleep_mode
        self.decoder = load_hf(model, dtype=getattr(torch, dtype), attn_backend="sdpa")
        self.worker = vllm_engine.WeightSyncExtension()
        self.worker.device = torch.device("cpu")
        self.worker.model_runner = SimpleNamespace(model=FakeModel(self.decoder))
        self.asleep: set[str] = set()
        self.calls: list[tuple] = []
        # vLLM's LLM.llm_engine.engine_core, the handle VLLMEngine.close shuts down
        self.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(
            shutdown=lambda: self.calls.append(("shutdown",))))

    def sleep(self, level=1):
        assert self.sleep_mode, "sleep needs enable_sleep_mode=True"
        self.calls.append(("sleep", level))
        self.asleep = {"weights", "kv_cache"}
        if level == 2:  # weights discarded: whatever the memory holds after wake_up
            with torch.no_grad():
                for p in self.decoder.parameters():
                    p.fill_(float("nan"))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags or ("weights", "kv_cache"))))
        self.asleep -= set(tags or ("weights", "kv_cache"))

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(("rpc", method))
        assert "weights" not in self.asleep, "weights pushed into a sleeping engine"
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self, device=None):
        self.calls.append(("reset_prefix_cache",))
        return True

    def generate(self, prompts, params, use_tqdm=True):
        assert not self.asleep, f"generate while {sorted(self.asleep)} asleep"
        self.calls.append(("generate", len(prompts)))
        ids = [p["prompt_token_ids"] for p in prompts]
        per_request = params if isinstance(params, list) else [params] * len(prompts)
        gens = []
        for prompt, sp in zip(ids, per_request):
            sampler = Sampler(self.decoder, seed=sp.seed if sp.seed is not None else 0)
            params = SamplingParams(sp.max_tokens, sp.temperature, sp.top_p, sp.stop_token_ids)
            gens += sampler.generate_full([prompt], params)
        return [SimpleNamespace(outputs=[SimpleNamespace(
            token_ids=g.token_ids, finish_reason=g.finish_reason,
            logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(g.token_ids, g.logprobs)])]) for g in gens]


def fake_module() -> SimpleNamespace:
    """What `import vllm` gives vllm_engine, faked."""
    return SimpleNamespace(LLM=FakeLLM, SamplingParams=FakeSamplingParams, EngineArgs=FakeEngineArgs)


def install_fake_vllm(monkeypatch) -> SimpleNamespace:
    """vllm_engine builds its engines from the fake module for the rest of the test."""
    module = fake_module()
    monkeypatch.setattr(vllm_engine, "_require_vllm", lambda: module)
    return module


def prompts(vocab: int = 97) -> list[list[int]]:
    """Three fixed prompts of 5, 9 and 3 tokens below `vocab`."""
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (5, 9, 3)]


def update(policy: torch.nn.Module, seed: int) -> None:
    """An update that changes what greedy decoding picks."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
