"""vLLM generation engine for GPU runs: the engine protocol over `vllm.LLM`, weights updated in place.

    engine = VLLMEngine("runs/x/hf", dtype="bf16", gpu_memory_utilization=0.5)
    gens = engine.generate_full(prompt_ids, max_new_tokens=512, temperature=1.0, top_p=1.0, stop_ids=[eos])
    engine.load_weights(model.state_dict())     # after each update: HF names, the trainer's tensors

vLLM is imported only when an engine is built (`pip install seedfast[gpu]`). Weights travel to vLLM's
worker through a worker extension (CUDA IPC handles for CUDA tensors, pickled copies otherwise) and go
through the model's own `load_weights`, which maps HF names onto vLLM's fused layers. After a sync the
prefix cache is reset (its KV was computed with the old weights) and a few tensors are read back and
compared, so a sync that silently did nothing raises instead of skewing training (docs/pitfalls.md, 'Weight sync
that silently does nothing').
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from seedfast.rollout.engine import Generation
from seedfast.rollout.sampling import check_sampling_args

EXTENSION = "seedfast.rollout.vllm_engine.WeightSyncExtension"
# tensors vLLM keeps under their HF names (not fused), read back to check a weight sync
_CHECK_NAMES = ("model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.o_proj.weight",
                "model.layers.0.mlp.down_proj.weight")
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _require_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError("the vLLM engine needs the vllm package: pip install 'seedfast[gpu]'") from err
    return vllm


class VLLMEngine:
    """Engine protocol (generate / generate_full) backed by vLLM, with `load_weights` for in-place sync."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "bf16",
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        **llm_kwargs: Any,
    ) -> None:
        vllm = _require_vllm()
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {dtype!r}")
        engine_fields = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
        if "logprobs_mode" in engine_fields:
            # log-probs after temperature, as the trainer recomputes them (equal to ours when top_p == 1)
            llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        if "worker_extension_cls" not in engine_fields:
            raise ImportError("this vllm is too old for in-place weight updates (no worker_extension_cls)")
        self.llm = vllm.LLM(
            model=str(model_path),
            dtype=_DTYPES[dtype],
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            skip_tokenizer_init=True,  # token ids in, token ids out: no detokenization drift
            worker_extension_cls=EXTENSION,
            **llm_kwargs,
        )
        self._vllm = vllm

    def generate(
        self,
        prompt_token_lists: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_ids: Sequence[int] = (),
    ) -> list[list[int]]:
        gens = self.generate_full(prompt_token_lists, max_new_tokens, temperature, top_p, stop_ids)
        return [g.token_ids for g in gens]

    def generate_full(
        self,
        prompt_token_lists: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_ids: Sequence[int] = (),
    ) -> list[Generation]:
        check_sampling_args(temperature, top_p)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        prompts = [{"prompt_token_ids": [int(t) for t in p]} for p in prompt_token_lists]
        for i, prompt in enumerate(prompts):
            if not prompt["prompt_token_ids"]:
                raise ValueError(f"prompt {i} is empty: generation needs at least one prompt token")
        # no per-request seed: copies of one prompt (a GRPO group) must draw different samples; the engine's
        # generator, seeded once, keeps runs reproducible
        params = self._vllm.SamplingParams(
            n=1, temperature=float(temperature), top_p=float(top_p), max_tokens=max_new_tokens,
            stop_token_ids=list(stop_ids), logprobs=0, detokenize=False,
        )
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [_generation(out.outputs[0]) for out in outputs]

    def load_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     chunk_bytes: int = 1 << 30, verify: bool = True) -> None:
        """Copy HF-named tensors into vLLM's model, in chunks of about `chunk_bytes`."""
        items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
        chunk: list[tuple[str, Any]] = []
        size = 0
        for name, tensor in items:
            chunk.append((name, _shareable(tensor)))
            size += tensor.numel() * tensor.element_size()
            if size >= chunk_bytes:
                self.llm.collective_rpc("seedfast_load_weights", args=(chunk,))
                chunk, size = [], 0
        if chunk:
            self.llm.collective_rpc("seedfast_load_weights", args=(chunk,))
        self.llm.reset_prefix_cache()
        if verify:
            self._verify(dict(items))

    def _verify(self, expected: dict[str, torch.Tensor]) -> None:
        names = [n for n in _CHECK_NAMES if n in expected]
        for sums in self.llm.collective_rpc("seedfast_weight_sums", args=(names,)):
            for name, value in sums.items():
                want = float(expected[name].detach().float().sum())
                if abs(value - want) > 1e-2 * (1.0 + abs(want)):
                    raise RuntimeError(
                        f"vLLM weight sync failed: {name} sums to {value:.6g} in vLLM, {want:.6g} in the trainer "
                        "(is the engine asleep, or the model's layout different?)"
                    )


def _shareable(tensor: torch.Tensor) -> Any:
    tensor = tensor.detach()
    if tensor.is_cuda:
        from torch.multiprocessing.reductions import reduce_tensor

        return ("ipc", reduce_tensor(tensor.contiguous()))
    return ("cpu", tensor.contiguous())


def _generation(completion: Any) -> Generation:
    ids = list(completion.token_ids)  # a stop id that ended the completion is included, as in Sampler
    logprobs = None
    if completion.logprobs is not None:
        logprobs = [float(step[token].logprob) for token, step in zip(ids, completion.logprobs)]
    return Generation(ids, logprobs, "stop" if completion.finish_reason == "stop" else "length")


class WeightSyncExtension:
    """Mixed into vLLM's GPU worker (worker_extension_cls): receives weights, reports checksums."""

    def seedfast_load_weights(self, chunk: list[tuple[str, tuple[str, Any]]]) -> None:
        weights = []
        for name, (kind, payload) in chunk:
            if kind == "ipc":
                rebuild, args = payload
                args = list(args)
                args[6] = self.device.index  # the sender's device index means nothing here
                weights.append((name, rebuild(*args)))
            else:
                weights.append((name, payload.to(self.device)))
        self.model_runner.model.load_weights(weights=weights)
        torch.cuda.synchronize()

    def seedfast_weight_sums(self, names: list[str]) -> dict[str, float]:
        params = dict(self.model_runner.model.named_parameters())
        return {name: float(params[name].float().sum()) for name in names if name in params}
