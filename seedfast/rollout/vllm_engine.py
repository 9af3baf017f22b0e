"""vLLM generation engine for GPU runs: the engine protocol over `vllm.LLM`, weights updated in place.

    engine = VLLMEngine("runs/x/hf", dtype="bf16", gpu_memory_utilization=0.5)
    gens = engine.generate_full(prompt_ids, SamplingParams(max_new_tokens=512, temperature=1.0, stop_ids=[eos]))
    engine.load_weights(model.state_dict())     # after each update: HF names, the trainer's tensors
    engine.push_weights(buckets)                # or bucket by bucket ([(name, tensor)] lists: weight_push.py)

vLLM is imported only when an engine is built (`pip install seedfast[gpu]`). Weights travel to vLLM's
worker through a worker extension (CUDA IPC handles for CUDA tensors when the worker is another process, the
tensors themselves when it runs in this one, pickled copies for CPU tensors) and go through the model's own
`load_weights`, which maps HF names onto vLLM's fused layers. What crosses to another process is packed into bytes
here (pickle) and unpacked by the extension: vLLM's message serializer carries bytes as they are, but refuses a
function (an IPC handle's rebuild function) and turns a tensor into lists unless VLLM_ALLOW_INSECURE_SERIALIZATION
is set for all of its traffic, which seedfast does not need. On vLLM's CPU back end the linear layers compute with a
repacked copy made after loading (their parameters are emptied) and the LM head with a packed copy of its weight:
there the push goes through vLLM's layerwise reload (each layer loaded, then processed again), and the LM head's
packed copy is rebuilt. After a sync the prefix cache is reset (its KV was computed with the old weights), and
checksums of the tensors vLLM keeps under their HF names (embeddings, o_proj, down_proj, norms, LM head), taken as
each passed by, are compared with vLLM's copy, so a sync that silently did nothing raises instead of skewing
training (docs/pitfalls.md, 'Weight sync that silently does nothing'). On the CPU back end the check also reads what
vLLM computes with: each checked linear layer and the LM head run on unit vectors (a few columns of the identity:
exact in any dtype) give those columns of the weight their kernel uses, so a stale packed copy fails it too.

LoRA (docs/scaling.md, 'LoRA weight sync'): an engine built with `lora_rank` serves adapters with vLLM's LoRA
support (enable_lora, one adapter slot) over the base it loaded, which no push changes. `load_adapter(adapters, spec)`
writes the trainer's adapters as a PEFT folder (a new one per version, atomically, on tmpfs when there is one), adds it
under a new LoRA id (vLLM loads and activates it at once; the previous one is evicted and its folder removed), and
every later generate runs with it. Then the engine proves it runs what it was sent: the worker reads back the
adapter's slot in every LoRA layer (the buffers vLLM's LoRA kernels compute with) and its SHA-256 must equal the one of
the sent adapters as vLLM holds them (cast to the engine's dtype, B scaled by alpha / r: vLLM's own ops, bit for bit),
or the push raises.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import re
import shutil
import tempfile
import time
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from seedfast.rollout.engine import Generation
from seedfast.sampling_params import SamplingParams
from seedfast.seeds import request_seed

EXTENSION = "seedfast.rollout.vllm_engine.WeightSyncExtension"
# tensors vLLM keeps under their HF names (not fused into qkv_proj / gate_up_proj), summed as they are pushed and
# read back to check a weight sync
# float64 sums of the same values in another order agree far closer than this (relative to the sum of |x|), while
# an RL update that moves a few elements by a bf16 step moves the sum by more
_SUM_RTOL = 1e-9
_CHECKED = re.compile(r"(^|\.)(embed_tokens|o_proj|down_proj|[a-z_]*norm|lm_head)\.weight$")
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# how many weight columns (unit input vectors) the CPU back end's kernels are probed with per checked tensor
_PROBE_COLUMNS = 16
_PROBE = "#probe"  # suffix of the checksum key of a probe (what a layer's kernel computes with)
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's max_lora_rank choices (config/lora.py MaxLoRARanks)


def _require_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError("the vLLM engine needs the vllm package: pip install 'seedfast[gpu]'") from err
    return vllm


class VLLMEngine:
    """Engine protocol (generate / generate_full) backed by vLLM, with `load_weights` for in-place sync. The
    engine's options (memory share, tensor parallel, max_model_len, max_num_seqs, enforce_eager) come from
    rollout.* (runtime/setup.py `vllm_options`); anything else in `llm_kwargs` goes to vllm.LLM as it is."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "bf16",
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        enforce_eager: bool = False,
        enable_prefix_caching: bool = True,
        enable_sleep_mode: bool = False,
        lora_rank: int | None = None,
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
        # vLLM's CPU back end repacks the weights after loading: a push goes through its layerwise reload. It has no
        # sleep mode (refused): there the engine stays awake (`sleep_mode` False) and the rollout does not sleep it
        self.layerwise = _is_cpu_platform(vllm)
        self.sleep_mode = bool(enable_sleep_mode) and not self.layerwise
        if self.sleep_mode:  # LLM.sleep / LLM.wake_up(tags=...), for an engine colocated with training
            if "enable_sleep_mode" not in engine_fields:
                raise ImportError("this vllm is too old for sleep mode (no enable_sleep_mode)")
            llm_kwargs["enable_sleep_mode"] = True
        if max_num_seqs is not None:  # None: vLLM's own default (it depends on the platform)
            llm_kwargs["max_num_seqs"] = max_num_seqs
        if self.layerwise:
            llm_kwargs = {**whole_prefills(model_path, max_model_len), **llm_kwargs}
        self.lora_request: Any = None  # the adapter every generate runs with (load_adapter); None: the base
        self.lora_rank = lora_rank
        self._lora_root: Path | None = None
        if lora_rank is not None:  # LoRA serving: one adapter at a time, the trainer's latest
            llm_kwargs.update(enable_lora=True, max_loras=1, max_cpu_loras=1,
                              max_lora_rank=lora_slot_rank(lora_rank))
        self.llm = vllm.LLM(
            model=str(model_path),
            dtype=_DTYPES[dtype],
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            skip_tokenizer_init=True,  # token ids in, token ids out: no detokenization drift
            worker_extension_cls=EXTENSION,
            **llm_kwargs,
        )
        self._vllm = vllm
        self.torch_dtype = getattr(torch, _DTYPES[dtype])  # what vLLM's copy of a pushed tensor holds
        # an executor that runs the worker in this process gets the tensors themselves (a CUDA IPC handle cannot be
        # opened by the process that made it)
        self.in_process = (llm_kwargs.get("distributed_executor_backend") == "external_launcher"
                           or os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0")

    def close(self) -> None:
        """Shut vLLM's engine core down (its worker processes with it); a second call does nothing. Before the
        trainer's process group ends: vLLM's own exit-time cleanup would otherwise meet a destroyed group."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and not getattr(self, "_closed", False):
            self._closed = True
            core.shutdown()
        if self._lora_root is not None:
            shutil.rmtree(self._lora_root, ignore_errors=True)
            self._lora_root = None

    def generate(self, prompt_token_lists: Sequence[Sequence[int]], params: SamplingParams, *,
                 seeds: Sequence[int] | None = None) -> list[list[int]]:
        return [g.token_ids for g in self.generate_full(prompt_token_lists, params, seeds=seeds)]

    def generate_full(self, prompt_token_lists: Sequence[Sequence[int]], params: SamplingParams, *,
                      seeds: Sequence[int] | None = None) -> list[Generation]:
        """Completions of every prompt; `seeds` (one per prompt) seeds each request's own sampler; `params.seed` (the
        engine protocol's, rollout/engine.py) gives them seeds.request_seed(seed, 0, i), as the first generate call
        of a colocated step seeded with `seed` does."""
        prompts = [{"prompt_token_ids": [int(t) for t in p]} for p in prompt_token_lists]
        for i, prompt in enumerate(prompts):
            if not prompt["prompt_token_ids"]:
                raise ValueError(f"prompt {i} is empty: generation needs at least one prompt token")
        # without `seeds` no per-request seed: copies of one prompt (a GRPO group) must draw different samples; the
        # engine's generator, seeded once, keeps runs reproducible. With `seeds`, give copies different seeds.
        if params.seed is not None:
            if seeds is not None:
                raise ValueError("pass seeds (one per prompt) or seed, not both")
            seeds = [request_seed(int(params.seed), 0, i) for i in range(len(prompts))]
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds must have one entry per prompt ({len(prompts)}), got {len(seeds)}")

        def sampling(seed: int | None) -> Any:
            return self._vllm.SamplingParams(
                n=1, temperature=float(params.temperature), top_p=float(params.top_p), max_tokens=params.max_new_tokens,
                stop_token_ids=list(params.stop_ids), logprobs=0, detokenize=False, seed=seed,
            )

        per_request = sampling(None) if seeds is None else [sampling(int(s)) for s in seeds]
        lora = {} if self.lora_request is None else {"lora_request": self.lora_request}
        outputs = self.llm.generate(prompts, per_request, use_tqdm=False, **lora)
        return [_generation(out.outputs[0]) for out in outputs]

    def load_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     chunk_bytes: int = 1 << 30, verify: bool = True) -> dict[str, float]:
        """Copy HF-named tensors into vLLM's model, in chunks of about `chunk_bytes`."""
        items = weights.items() if isinstance(weights, Mapping) else weights
        return self.push_weights(_chunks(items, chunk_bytes), verify=verify)

    def push_weights(self, buckets: Iterable[Sequence[tuple[str, torch.Tensor]]], verify: bool = True
                     ) -> dict[str, float]:
        """Copy buckets of HF-named tensors into vLLM's model, one bucket (one RPC) at a time, then reset the prefix
        cache and (`verify`) compare checksums. Nothing of a bucket is kept after its RPC returned.

        Returns {"bytes", "buckets", "tensors", "seconds"} of the push."""
        start = time.perf_counter()
        expected: dict[str, tuple[tuple[float, ...], float, int]] = {}  # checked name -> _checksum
        n_bytes = n_buckets = n_tensors = 0
        if self.layerwise:
            self.llm.collective_rpc("seedfast_begin_reload")
        for bucket in buckets:
            size, count = self._push_bucket(bucket, expected if verify else None)
            n_bytes += size
            n_tensors += count
            n_buckets += count > 0
        if self.layerwise:
            self.llm.collective_rpc("seedfast_end_reload")
        self.llm.reset_prefix_cache()
        if verify:
            self._verify(expected)
        return {"bytes": float(n_bytes), "buckets": float(n_buckets), "tensors": float(n_tensors),
                "seconds": time.perf_counter() - start}

    def _push_bucket(self, bucket: Sequence[tuple[str, torch.Tensor]],
                     expected: dict[str, tuple[tuple[float, ...], float, int]] | None
                     ) -> tuple[int, int]:
        """One RPC with the bucket's tensors (their checksums into `expected`); returns (bytes, tensors)."""
        chunk = []
        keep = []  # what an IPC handle points to stays alive until the worker has copied it
        size = 0
        for name, tensor in bucket:
            if expected is not None and _CHECKED.search(name):
                expected[name] = _checksum(tensor, self.torch_dtype)
                if self.layerwise and tensor.dim() == 2:
                    expected[name + _PROBE] = _probe_checksum(tensor, self.torch_dtype)
            kind, payload, held = _shareable(tensor, self.in_process)
            chunk.append((name, (kind, payload)))
            keep.append(held)
            size += tensor.numel() * tensor.element_size()
        if not chunk:
            return 0, 0
        for received in self.llm.collective_rpc("seedfast_load_weights", args=(chunk,)):
            if received is not None and received != len(chunk):
                raise RuntimeError(f"vLLM weight sync failed: a worker loaded {received} of {len(chunk)} tensors "
                                   f"(the bucket starting at {chunk[0][0]})")
        return size, len(chunk)

    def _verify(self, expected: dict[str, tuple[tuple[float, ...], float, int]]) -> None:
        """Each checked tensor's sum in vLLM equals the trainer's (the tensor in the engine's dtype: the same values,
        summed in float64 in another order): on every worker for a replicated tensor, summed over the workers for
        one split by vLLM's tensor parallel (fewer elements on each)."""
        if not expected:
            return
        reports = self.llm.collective_rpc("seedfast_weight_sums", args=(sorted(expected),))
        found = 0
        for name, (want, magnitude, numel) in sorted(expected.items()):
            seen = [v for r in reports if name in r for v in (r[name] if name.endswith(_PROBE) else [r[name]])]
            if not seen:
                continue
            found += 1
            if all(n == numel for _, n in seen):
                values = [float(v) for v, _ in seen]
            else:
                values = [float(sum(v for v, _ in seen))]
            for value in values:
                if all(abs(value - w) > _SUM_RTOL * magnitude + 1e-30 for w in want):
                    raise RuntimeError(
                        f"vLLM weight sync failed: {name} sums to {value!r} in vLLM, {want[0]!r} in the trainer "
                        "(did the tensor reach the engine? is the engine asleep, or the model's layout different?)"
                    )
        if not found:
            raise RuntimeError(f"vLLM weight sync cannot be verified: none of {sorted(expected)[:4]}... is a parameter "
                               "of vLLM's model (a model whose names vLLM changes)")


    def load_adapter(self, adapters: Sequence[tuple[str, torch.Tensor]], spec: Any, verify: bool = True
                     ) -> dict[str, float]:
        """Serve LoRA adapters ('<module path>.lora_A' / '.lora_B' -> the trainer's tensor; `spec` their LoRASpec) from
        the next generate on: a PEFT folder of its own, added to vLLM under a new id, the previous adapter and its
        folder dropped, and (`verify`) what vLLM's LoRA layers hold read back and compared (the module docstring).
        Needs an engine built with `lora_rank`. Returns {"bytes", "buckets", "tensors", "seconds", "write_seconds",
        "verified_workers", "fingerprint"} (the SHA-256 of the adapters as vLLM holds them, as an int); under tensor
        parallel each worker holds slices of the adapters, which are not hashed (verified_workers 0)."""
        from vllm.lora.request import LoRARequest

        from seedfast.model.peft_io import save_peft_adapter

        if self.lora_rank is None:
            raise RuntimeError("load_adapter: this vLLM engine was built without LoRA (VLLMEngine(lora_rank=...))")
        if spec.rank > self.lora_rank:
            raise ValueError(f"load_adapter: rank {spec.rank} adapters, the engine was built for rank {self.lora_rank}")
        start = time.perf_counter()
        adapters = [(name, t.detach()) for name, t in adapters]
        if self._lora_root is None:
            self._lora_root = Path(tempfile.mkdtemp(prefix="seedfast-lora-", dir=_tmpfs()))
        lora_id = 1 if self.lora_request is None else self.lora_request.lora_int_id + 1
        folder = self._lora_root / f"adapter-{lora_id}"
        holder = types.SimpleNamespace(lora_spec=spec, state_dict=lambda: dict(adapters))
        save_peft_adapter(holder, folder, base_model=None)  # atomically: a temporary folder renamed into place
        written = time.perf_counter() - start
        request = LoRARequest(f"seedfast-{lora_id}", lora_id, str(folder))
        self.llm.llm_engine.add_lora(request)  # loaded and activated now (its errors here, not at a generate)
        old, self.lora_request = self.lora_request, request
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)  # already evicted from the one slot: a no-op then
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self.llm.reset_prefix_cache()
        expected = lora_slot_print(adapters, spec.scaling, self.torch_dtype)
        checked = 0
        if verify:
            reports = self.llm.collective_rpc("seedfast_lora_print", args=(lora_id,))
            if all(report is None for report in reports):
                raise RuntimeError("vLLM LoRA sync cannot be verified: no worker has a LoRA manager")
            for report in reports:
                if report is None or report["sha256"] is None:  # tensor parallel: each worker holds slices
                    continue
                checked += 1
                if report["sha256"] != expected:
                    raise RuntimeError(
                        f"vLLM LoRA sync failed: adapter {lora_id} as vLLM's LoRA layers hold it (slot "
                        f"{report['slot']}, {report['modules']} projections) has SHA-256 {report['sha256'][:16]}..., "
                        f"the trainer's adapters {expected[:16]}... ({len(adapters) // 2} projections): the engine "
                        "does not run the adapters it was sent")
        return {"bytes": float(sum(t.numel() * t.element_size() for _, t in adapters)), "buckets": 1.0,
                "tensors": float(len(adapters)), "seconds": time.perf_counter() - start, "write_seconds": written,
                "verified_workers": float(checked), "fingerprint": int(expected, 16)}


def lora_slot_rank(rank: int) -> int:
    """The smallest of vLLM's max_lora_rank choices that holds `rank`."""
    for choice in _LORA_RANKS:
        if choice >= rank:
            return choice
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({_LORA_RANKS[-1]})")


def _tmpfs() -> str | None:
    """/dev/shm when this machine has it (a PEFT folder per push never touches a disk), else the default temp dir."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _slot_sha256(entries: Iterable[tuple[str, torch.Tensor, torch.Tensor]]) -> str:
    """SHA-256 over (module path, A, B) in path order: each tensor's dtype, shape and bytes."""
    h = hashlib.sha256()
    for name, a, b in sorted(entries, key=lambda e: e[0]):
        h.update(f"{name}|".encode())
        for t in (a, b):
            t = t.detach().contiguous().cpu()
            h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def lora_slot_print(adapters: Sequence[tuple[str, torch.Tensor]], scaling: float, dtype: torch.dtype) -> str:
    """`_slot_sha256` of the trainer's adapters as vLLM's LoRA layers hold them: A and B cast to the engine's dtype
    (vLLM's lora_dtype "auto") and B scaled by alpha / r in place (vLLM's LoRALayerWeights.optimize)."""
    named = dict(adapters)
    entries = []
    for name in named:
        if not name.endswith(".lora_A"):
            continue
        path = name.removesuffix(".lora_A")
        a = named[name].to(dtype)
        b = named[f"{path}.lora_B"].to(dtype).clone()
        if scaling != 1:
            b *= scaling
        entries.append((path, a, b))
    return _slot_sha256(entries)


def _checksum(tensor: torch.Tensor, dtype: torch.dtype) -> tuple[tuple[float, ...], float, int]:
    """(sums, sum of |x|, numel) of the tensor accumulated in float64: the sums of its values cast to the engine's
    dtype (what vLLM's copy of it holds) and, when that differs, as sent (a parameter vLLM keeps in another dtype)."""
    t = tensor.detach()
    cast = t.to(dtype)
    sums = (float(torch.sum(cast, dtype=torch.float64)),)
    if t.dtype != dtype:
        sums += (float(torch.sum(t, dtype=torch.float64)),)
    return sums, float(torch.sum(cast.abs(), dtype=torch.float64)), t.numel()


def _probe_columns(n_columns: int) -> list[int]:
    """The weight columns a probe reads: `_PROBE_COLUMNS` spread over [0, n_columns) (all of them when fewer)."""
    step = max(1, n_columns // _PROBE_COLUMNS)
    return list(range(0, n_columns, step))[:_PROBE_COLUMNS]


def _probe_checksum(tensor: torch.Tensor, dtype: torch.dtype) -> tuple[tuple[float, ...], float, int]:
    """`_checksum` of the probe's columns of a 2-D weight [out, in], as the engine holds them."""
    cols = _probe_columns(tensor.shape[1])
    part = tensor.detach()[:, cols].to(dtype)
    return ((float(torch.sum(part, dtype=torch.float64)),), float(torch.sum(part.abs(), dtype=torch.float64)),
            len(cols))


def whole_prefills(model_path: str, max_model_len: int | None) -> dict[str, Any]:
    """vLLM's CPU back end with every prompt prefilled in one step (chunked prefill off, a step's token budget of at
    least one whole sequence). A prompt split across steps discards the partial step's sampled token, and for a seeded
    request vLLM then rewinds the request's generator with `set_offset`, which a CPU torch.Generator refuses ("CPU
    Generator does not use offset"): every seeded rollout whose batch outgrew the budget (4,096 tokens on the CPU;
    the SmolLM2 recipe's 8 prompts of up to 768) died (docs/scaling.md, 'vLLM in the RL loop')."""
    length = max_model_len
    if length is None:  # vLLM's own default: the model's context
        length = json.loads((Path(model_path) / "config.json").read_text())["max_position_embeddings"]
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(int(length), CPU_STEP_TOKENS)}


CPU_STEP_TOKENS = 4096  # vLLM's own CPU default budget (engine/arg_utils.py), kept where a sequence is shorter


def _is_cpu_platform(vllm: Any) -> bool:
    """Whether this vLLM runs on its CPU back end (False for anything that is not the real package)."""
    if isinstance(vllm, types.ModuleType) and vllm.__name__ == "vllm":
        import vllm.platforms as platforms
    else:
        platforms = getattr(vllm, "platforms", None)
    platform = getattr(platforms, "current_platform", None)
    is_cpu = getattr(platform, "is_cpu", None)
    return bool(is_cpu()) if callable(is_cpu) else False


def _pack(obj: Any) -> bytes:
    """Bytes for what crosses to vLLM's worker process: its message serializer passes bytes through untouched."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _unpack(data: bytes) -> Any:
    """What `_pack` packed (the worker extension's side: bytes made by this engine for its own worker)."""
    return pickle.loads(data)


def _chunks(items: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    chunk: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in items:
        chunk.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _shareable(tensor: torch.Tensor, in_process: bool = False) -> tuple[str, Any, torch.Tensor]:
    """(kind, payload, the tensor to keep alive until the worker copied it).

    "tensor": the tensor itself (a worker in this process); "ipc": the packed (rebuild function, arguments) of a CUDA
    IPC handle; "cpu": the packed tensor (a copy of its data)."""
    tensor = tensor.detach().contiguous()
    if in_process:
        return "tensor", tensor, tensor
    if tensor.is_cuda:
        return "ipc", ipc_payload(tensor), tensor
    return "cpu", _pack(tensor), tensor


def ipc_payload(tensor: torch.Tensor) -> bytes:
    """The packed CUDA IPC handle of a CUDA tensor, as `WeightSyncExtension.seedfast_load_weights` opens it."""
    from torch.multiprocessing.reductions import reduce_tensor

    return _pack(reduce_tensor(tensor))


def _generation(completion: Any) -> Generation:
    ids = list(completion.token_ids)  # a stop id that ended the completion is included, as in Sampler
    logprobs = None
    if completion.logprobs is not None:
        logprobs = [float(step[token].logprob) for token, step in zip(ids, completion.logprobs)]
    return Generation(ids, logprobs, "stop" if completion.finish_reason == "stop" else "length")


class WeightSyncExtension:
    """Mixed into vLLM's GPU worker (worker_extension_cls): receives weights, reports checksums."""

    def seedfast_load_weights(self, chunk: list[tuple[str, tuple[str, Any]]]) -> int:
        """Load one bucket; returns how many tensors it handed to the model's `load_weights`."""
        weights = []
        for name, (kind, payload) in chunk:
            if kind == "ipc":
                rebuild, args = _unpack(payload)
                args = list(args)
                args[6] = torch.device(self.device).index  # the sender's device index means nothing here
                weights.append((name, rebuild(*args)))
            elif kind == "cpu":
                weights.append((name, _unpack(payload).to(self.device)))
            else:
                weights.append((name, payload.to(self.device)))
        self.model_runner.model.load_weights(weights=weights)
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize()
        return len(weights)

    def seedfast_begin_reload(self) -> None:
        """Before a push on the CPU back end: vLLM's layerwise reload puts every layer back in its checkpoint
        layout, so `load_weights` of the buckets fills it and each layer is processed (repacked) once loaded."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.model)

    def seedfast_end_reload(self, repack: bool = True) -> None:
        """After the last bucket: vLLM finishes the layerwise reload (layers not yet processed), then (`repack`; False
        only in a test of the verify) the packed copy the LM head computes with is made again from its new weight:
        vLLM processes a tied head only as the embedding, whose packed copy it keeps from before."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self.model_runner.model
        finalize_layerwise_reload(model, self.model_runner.model_config)
        if repack:
            _repack_vocab_layers(model)

    def seedfast_lora_print(self, lora_id: int) -> dict[str, Any] | None:
        """`_lora_report` of this worker: the SHA-256 of adapter `lora_id` as its LoRA layers hold it."""
        return _lora_report(self.model_runner, lora_id)

    def seedfast_weight_sums(self, names: list[str]) -> dict[str, Any]:
        """(sum, numel) of this worker's copy of each named parameter it has (its shard under tensor parallel); on the
        CPU back end also, under `name + "#probe"`, a list of (sum, columns) of the probe's columns of the weight as
        each layer holding that parameter computes with it (`_probe`: a tied LM head and the embedding both)."""
        model = self.model_runner.model
        params = dict(model.named_parameters())
        sums: dict[str, Any] = {
            name: (float(torch.sum(params[name].detach(), dtype=torch.float64)), params[name].numel())
            for name in names if name in params and params[name].numel() > 0}
        if torch.device(self.device).type == "cpu" and isinstance(model, torch.nn.Module):
            dtype = self.model_runner.model_config.dtype
            for key in names:
                param = params.get(key[: -len(_PROBE)]) if key.endswith(_PROBE) else None
                if param is None:
                    continue
                layers = [m for m in model.modules() if m._parameters.get("weight") is param]
                probes = [value for value in (_probe(m, dtype) for m in layers) if value is not None]
                if probes:
                    sums[key] = probes
        return sums


def _lora_report(runner: Any, lora_id: int) -> dict[str, Any] | None:
    """What the worker's LoRA layers hold of adapter `lora_id` in its slot, as `_slot_sha256` over every projection
    the adapter has (A [:rank] and B [:, :rank] of each slice: what vLLM's LoRA kernels multiply with); None without
    a LoRA manager. A projection of the adapter that no layer took is missing from the hash, so it differs."""
    manager = getattr(getattr(runner, "lora_manager", None), "_adapter_manager", None)
    if manager is None:
        return None
    model = manager.get_adapter(lora_id)
    if model is None or lora_id not in manager.lora_index_to_id:
        return {"slot": None, "modules": 0, "sha256": f"adapter {lora_id} is not active"}
    slot = manager.lora_index_to_id.index(lora_id)
    if any(getattr(m, "tp_size", 1) > 1 for m in manager.modules.values()):
        return {"slot": slot, "modules": 0, "sha256": None}  # each worker holds slices: not the whole adapters
    entries = []
    for module_name, module in manager.modules.items():
        weights = model.get_lora(module_name)
        stacked_a = getattr(module, "lora_a_stacked", None)
        if weights is None or stacked_a is None:
            continue
        subs = manager.packed_modules.get(module_name, [module_name])
        parts = weights.lora_a if isinstance(weights.lora_a, list) else [weights.lora_a]
        for i, (sub, part) in enumerate(zip(subs, parts)):
            if part is None:  # a projection the adapter does not adapt
                continue
            rank = part.shape[0]
            a = stacked_a[i][slot, 0, :rank, :]
            b = module.lora_b_stacked[i][slot, 0, :, :rank]
            entries.append((sub, a, b))
    return {"slot": slot, "modules": len(entries), "sha256": _slot_sha256(entries)}


def _probe(layer: torch.nn.Module, dtype: torch.dtype) -> tuple[float, int] | None:
    """(sum, columns) of the `_probe_columns` of `layer`'s weight as its kernel computes with it: the layer's own
    matmul (its quant_method's apply, which the forward and the LM head's logits call) on unit vectors; each output
    is one weight element times one (exact), so the sum is that of the columns the kernel holds. None when the layer
    has no such matmul (or is split by tensor parallel)."""
    method = getattr(layer, "quant_method", None)
    if method is None or not callable(getattr(method, "apply", None)) or getattr(layer, "tp_size", 1) != 1:
        return None
    n_in = getattr(layer, "input_size_per_partition", None) or getattr(layer, "embedding_dim", None)
    if not n_in:
        return None
    cols = _probe_columns(int(n_in))
    unit = torch.zeros(len(cols), int(n_in), dtype=dtype)  # the CPU back end's inputs: the model's dtype
    unit[torch.arange(len(cols)), torch.tensor(cols)] = 1
    with torch.no_grad():
        out = method.apply(layer, unit)
    return float(torch.sum(out, dtype=torch.float64)), len(cols)


def _repack_vocab_layers(model: torch.nn.Module) -> None:
    """The CPU back end's packed copy of every vocabulary layer (embedding, LM head) made again from its weight."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for layer in model.modules():
        if isinstance(layer, VocabParallelEmbedding) and layer.weight.numel() > 0:
            layer.quant_method.process_weights_after_loading(layer)
