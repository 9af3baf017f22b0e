"""The memory plan: per-GPU memory of a run before anyone books a cluster (`seedfast plan CONFIG --world N`).

The real model is built on the meta device (no memory), the real sharding of distributed/parallelize.py is applied over
torch's fake process group of N ranks (no GPU, no communication), and each rank's share is read off the sharded
parameters themselves. What cannot be read off a parameter is counted from the model code (docs/scaling.md,
'The memory plan'):

    parameters, gradients     local elements of every sharded parameter x optim.master_dtype bytes: the master
                              weights and their reduced gradients (fp32 unless asked; runtime/precision.py; rank 0
                              holds the largest shard: FSDP2 pads dim 0 to a multiple of dp_shard)
    optimizer states          AdamW's exp_avg and exp_avg_sq, in the masters' dtype: 2 x parameters
    compute dtype             model.dtype: gathered units, activations, the KV cache and the rollout's weights
    activations               tensors autograd keeps per decoder block and token, at trainer.micro_batch_tokens,
                              with this rank's tensor-parallel shapes (flash attention: no T x T scores):
                                4·d + (2·n_heads + 2·n_kv_heads)·head_dim/tp + 3·intermediate/tp  elements
                              without activation checkpointing: x layers; with it: one block's input per layer
                              plus one block recomputed
    rollout KV cache          this rank's rollouts (whole groups: tasks_per_batch / dp_shard tasks x rollout.n),
                              each with room for max_prompt_length + max_response_tokens tokens:
                                2 x layers x n_kv_heads/tp x head_dim per token
    logits avoided            [micro_batch_tokens x V/tp] fp32 logits and their gradient, which the fused
                              log-prob ops never form
    gathered units            a decoder block (two with prefetch) and the root (embeddings, final norm, LM head:
                              gathered from its forward to the end of backward, with its unsharded gradient), in
                              model.dtype; with a different dist.reduce_dtype, the root's unsharded gradient is cast
                              to it for the reduce-scatter (the largest unit's copy counted)
    rollout                   generation runs on gathered weights (every unit, TP-local) beside the sharded
                              parameters and optimizer states, plus the KV cache
    train peak                parameters + gradients + optimizer states + activations (checkpointing) + the
                              gathered units + the reduce-scatter copy; an estimate before allocator fragmentation
                              and temporaries

With LoRA (model.lora: the base frozen in model.dtype, trainable adapters in optim.master_dtype, one module and no
master copy; docs/algorithms.md, 'LoRA') the same sharding is applied to the adapted model and:

    parameters                the frozen base's local elements x model.dtype bytes (sharded like any weight), plus
                              the adapters' local elements x optim.master_dtype bytes
    gradients                 the adapters' alone (the base has none), in optim.master_dtype
    optimizer states          AdamW's two moments of the adapters alone: 2 x their bytes
    activations               + rank x (adapted layers per block) elements per token: each adapter's x·Aᵀ
    gathered units            the root is frozen: gathered, with no gradient; the reduce-scatter's copy is of the
                              largest unit's adapter gradients
    train peak, rollout       the base + 4 x (train) or 3 x (rollout: no gradients) the adapters' bytes, in place of
                              4 x / 3 x the parameters

With GPUs of the rollout's own (`rollout.devices`, asynchronous RL: runtime/placement.py), the trainer's GPUs hold no
rollout, and the plan adds the producer's side, per rollout GPU (rollout tp = len(rollout.devices)), in the engine's
dtype (rollout.vllm_dtype, else model.dtype):

    rollout weights           the whole model / rollout tp (vLLM shards it over its GPUs; the own engine holds it)
    staged versions           on the producer's first GPU: up to rollout.max_staleness whole versions received over
                              the weight group and not rolled out yet (train/async_rollout.py, _Staged)
    rollout KV cache          the whole batch (tasks_per_batch x rollout.n rows, not split over the trainer's ranks),
                              each with room for max_prompt_length + max_response_tokens tokens, / rollout tp
    rollout peak              the three summed, on the first GPU (vLLM books rollout.gpu_memory_utilization of each
                              GPU whatever this says: it must be at least the weights and the KV cache)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from seedfast.config import Config, ConfigError
from seedfast.model.config import DecoderConfig
from seedfast.model.decoder import Decoder
from seedfast.model.hf_io import hf_config, is_hf_folder
from seedfast.model.lora import LoRASpec, add_lora

from .mesh import MESH_DIMS, mesh_shape
from .parallelize import check_tp, parallelize_decoder

GIB = 2**30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# The published shapes of Qwen2.5 (the config.json of each Qwen/Qwen2.5-*-Instruct repository), so that a plan
# needs no download: a model.path whose folder name starts with one of these keys and holds no config.json.
QWEN25 = {
    "Qwen2.5-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "Qwen2.5-3B": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "Qwen2.5-7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "Qwen2.5-32B": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                        num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False),
    "Qwen2.5-72B": dict(hidden_size=8192, intermediate_size=29568, num_hidden_layers=80, num_attention_heads=64,
                        num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False),
}


def qwen25_config(name: str) -> DecoderConfig:
    """A published Qwen2.5 shape, through transformers' own Qwen2Config (its defaults fill the rest)."""
    from transformers import Qwen2Config

    if name not in QWEN25:
        raise ValueError(f"unknown Qwen2.5 shape {name!r}; known: {', '.join(QWEN25)}")
    hf = Qwen2Config(**QWEN25[name], max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
    return DecoderConfig.from_hf(hf)


def model_config(cfg: Config) -> tuple[str, DecoderConfig]:
    """(name, architecture) of the run's policy: model.path/config.json when it exists, else a published Qwen2.5
    shape named by model.path's folder, else the tiny decoder of model.tiny (with its BPE vocabulary)."""
    path = cfg.model.path
    if path and is_hf_folder(path):
        return Path(path).name, hf_config(path)
    if path:
        folder = Path(path).name
        for name in sorted(QWEN25, key=len, reverse=True):
            if folder.startswith(name):
                return name, qwen25_config(name)
        raise ConfigError(f"model.path={path!r}: no config.json there, and its folder name starts with no known "
                          f"shape ({', '.join(QWEN25)})")
    t = cfg.model.tiny
    return "tiny", DecoderConfig(
        model_type="qwen3", vocab_size=t.vocab_size or t.bpe_vocab_size, hidden_size=t.hidden,
        intermediate_size=t.intermediate, num_hidden_layers=t.layers, num_attention_heads=t.heads,
        num_key_value_heads=t.kv_heads, max_position_embeddings=t.max_seq_len, rope_theta=t.rope_theta,
        tie_word_embeddings=t.tie_embeddings)


@contextlib.contextmanager
def fake_process_group(world: int) -> Iterator[None]:
    """torch's fake backend over `world` ranks, this process being rank 0: collectives return at once."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    if dist.is_initialized():
        raise RuntimeError("a process group is already started; the plan needs its own fake one")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _local_numel(p: torch.Tensor) -> int:
    return (p.to_local() if hasattr(p, "to_local") else p).numel()


def activation_elements_per_token(c: DecoderConfig, tp: int) -> int:
    """Elements autograd keeps per token in one decoder block (module docstring), with tp-way sharded shapes."""
    d, hd = c.hidden_size, c.head_dim
    return 4 * d + (2 * c.num_attention_heads + 2 * c.num_key_value_heads) * hd // tp + 3 * c.intermediate_size // tp


@dataclass
class MemoryPlan:
    model: str
    params_total: int
    world: int
    dp_shard: int
    tp: int
    compute_dtype: str  # model.dtype
    master_dtype: str  # optim.master_dtype
    reduce_dtype: str  # dist.reduce_dtype
    micro_batch_tokens: int
    rollout_rows_per_rank: int
    rollout_tokens_per_row: int
    gib: dict[str, float]  # per GPU
    rollout_side: dict[str, Any] | None = None  # per rollout GPU, with rollout.devices (module docstring)
    lora: dict[str, Any] | None = None  # model.lora: rank, alpha, targets, adapter parameters (module docstring)

    def to_json(self) -> dict[str, Any]:
        """The plan, with how it was made (no GPU: the meta device and torch's fake process group)."""
        return {**asdict(self), "method": "meta device + fake process group (seedfast/distributed/plan.py)",
                "torch": torch.__version__}

    def table(self) -> str:
        lines = [f"{self.model}: {self.params_total / 1e9:.2f}B parameters on {self.world} GPUs "
                 f"(dp_shard={self.dp_shard} x tp={self.tp}), {self.compute_dtype} compute over "
                 + (f"{self.master_dtype} master weights and AdamW states" if self.lora is None else
                    f"a frozen base and LoRA adapters (rank {self.lora['rank']}, "
                    f"{self.lora['adapter_params_total'] / 1e6:.1f}M parameters) with their AdamW states in "
                    f"{self.master_dtype}")
                 + f", gradients reduced in {self.reduce_dtype}; per GPU:"]
        lines += [f"  {k:<34}{v:>10.2f} GiB" for k, v in self.gib.items()]
        if self.rollout_side is not None:
            r = self.rollout_side
            lines.append(f"rollout on GPUs {r['devices']} of their own ({r['engine']} engine, tp={r['tp']}, "
                         f"{r['dtype']}, {r['rows']} rows x {r['tokens_per_row']} tokens, up to "
                         f"{r['staged_versions']} staged versions); per rollout GPU:")
            lines += [f"  {k:<34}{v:>10.2f} GiB" for k, v in r["gib"].items()]
        return "\n".join(lines)


def lora_spec_of_config(cfg: Config) -> LoRASpec | None:
    """model.lora's LoRASpec (the PEFT folder's for model.lora.adapter), or None for full fine-tuning."""
    lora = cfg.model.lora
    if lora.adapter is not None:
        from seedfast.model.peft_io import read_peft_spec

        try:
            return read_peft_spec(lora.adapter)
        except ValueError as err:
            raise ConfigError(f"model.lora.adapter: {err}") from None
    if lora.rank > 0:
        return LoRASpec(rank=lora.rank, alpha=lora.alpha, targets=tuple(lora.targets))
    return None


def memory_plan(cfg: Config, world: int) -> MemoryPlan:
    """The per-GPU memory of `cfg` on `world` ranks (module docstring); builds nothing on a real device."""
    if world < 1:
        raise ConfigError(f"--world must be >= 1, got {world}")
    shape = mesh_shape(dataclasses.replace(cfg.dist, strategy="fsdp"), world)
    name, arch = model_config(cfg)
    with torch.device("meta"):
        model = Decoder(arch)
    try:
        check_tp(model, shape.tp)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    params_total = sum(p.numel() for p in model.parameters())
    spec = lora_spec_of_config(cfg)
    if spec is not None:  # on the meta device too: the adapters' shapes, no values
        add_lora(model, spec, dtype=torch.float32)
    with fake_process_group(world):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (shape.dp_shard, shape.tp), mesh_dim_names=MESH_DIMS)
        parallelize_decoder(model, mesh)
        local = sum(_local_numel(p) for p in model.parameters() if not p.requires_grad or spec is None)
        local_adapters = sum(_local_numel(p) for p in model.parameters() if p.requires_grad and spec is not None)
        # FSDP2 units all-gathered (TP-local): a decoder block at a time (two with prefetch), and the root
        # (embeddings, final norm, LM head), which stays gathered from its forward to the end of backward
        block = sum(_local_numel(p) for p in model.model.layers[0].parameters()) * shape.dp_shard
        block_adapters = sum(_local_numel(p) for p in model.model.layers[0].parameters()
                             if p.requires_grad) * shape.dp_shard
        in_layers = {id(p) for p in model.model.layers.parameters()}
        root = sum(_local_numel(p) for p in model.parameters() if id(p) not in in_layers) * shape.dp_shard
    adapters_total = sum(p.numel() for p in model.parameters() if p.requires_grad) if spec is not None else 0
    bytes_ = DTYPE_BYTES[cfg.model.dtype]  # what computes
    master_bytes = DTYPE_BYTES[cfg.optim.master_dtype]
    reduce_bytes = DTYPE_BYTES[cfg.dist.reduce_dtype] if cfg.dist.reduce_dtype != cfg.model.dtype else 0
    tokens = cfg.trainer.micro_batch_tokens
    per_token = activation_elements_per_token(arch, shape.tp)
    if spec is not None:  # each adapted layer keeps its [tokens, rank] x·Aᵀ for B's gradient
        per_token += spec.rank * len(spec.targets)
    per_block = per_token * tokens * bytes_
    layers = arch.num_hidden_layers
    act_full = per_block * layers
    act_ckpt = tokens * arch.hidden_size * bytes_ * layers + per_block
    tasks = math.ceil(cfg.rollout.tasks_per_batch / shape.dp_shard)
    rows = tasks * cfg.rollout.n
    row_tokens = cfg.rollout.max_prompt_length + cfg.rollout.max_response_tokens
    kv = rows * row_tokens * 2 * layers * (arch.num_key_value_heads // shape.tp) * arch.head_dim * bytes_
    vocab_local = math.ceil(arch.vocab_size / shape.tp)
    logits = tokens * vocab_local * 4
    gathered = (root + block * layers) * bytes_  # generation runs on every unit gathered (TP-local)
    if spec is None:  # every weight trained: master weights, their gradients and AdamW's moments
        frozen, trained = 0, local * master_bytes
        root_grad = root * bytes_  # the root's unsharded gradient, gathered with it until the end of backward
        reduce_copy = max(root, block) * reduce_bytes
    else:  # LoRA: the base frozen in model.dtype, the adapters trained (module docstring)
        frozen, trained = local * bytes_, local_adapters * master_bytes
        root_grad = 0  # the root (embeddings, final norm, LM head) is frozen
        reduce_copy = block_adapters * reduce_bytes
    params = frozen + trained
    gib = {
        "parameters": params / GIB,
        "gradients": trained / GIB,
        "optimizer_states": 2 * trained / GIB,
        "activations_no_checkpointing": act_full / GIB,
        "activations_checkpointing": act_ckpt / GIB,
        "gathered_block": block * bytes_ / GIB,
        "gathered_root_and_its_grad": (root * bytes_ + root_grad) / GIB,
        "reduce_scatter_copy": reduce_copy / GIB,
        "train_peak_checkpointing": (frozen + 4 * trained + act_ckpt + 2 * block * bytes_ + root * bytes_
                                     + root_grad + reduce_copy) / GIB,
        "rollout_weights_gathered": gathered / GIB,
        "rollout_kv_cache": kv / GIB,
        "rollout_peak": (frozen + 3 * trained + gathered + kv) / GIB,
        "logits_avoided_fp32": logits / GIB,
        "logits_and_grad_avoided_fp32": 2 * logits / GIB,
    }
    if spec is not None:  # the parameters' two parts
        gib = {"frozen_base": frozen / GIB, "adapters": trained / GIB, **gib}
    if cfg.rollout.devices is not None:  # the trainer's GPUs roll nothing out (module docstring)
        for key in ("rollout_weights_gathered", "rollout_kv_cache", "rollout_peak"):
            del gib[key]
    return MemoryPlan(model=name, params_total=params_total, world=world, dp_shard=shape.dp_shard, tp=shape.tp,
                      compute_dtype=cfg.model.dtype, master_dtype=cfg.optim.master_dtype,
                      reduce_dtype=cfg.dist.reduce_dtype, micro_batch_tokens=tokens, rollout_rows_per_rank=rows,
                      rollout_tokens_per_row=row_tokens, gib={k: round(v, 4) for k, v in gib.items()},
                      rollout_side=rollout_side(cfg, arch, params_total),
                      lora=None if spec is None else {"rank": spec.rank, "alpha": spec.alpha,
                                                      "targets": list(spec.targets),
                                                      "adapter_params_total": adapters_total})


def rollout_side(cfg: Config, arch: DecoderConfig, params_total: int) -> dict[str, Any] | None:
    """The producer's memory per rollout GPU (module docstring), or None when rollouts run on the trainer's."""
    r = cfg.rollout
    if r.devices is None:
        return None
    tp = len(r.devices)
    dtype = (r.vllm_dtype if r.engine == "vllm" else None) or cfg.model.dtype
    bytes_ = DTYPE_BYTES[dtype]
    rows = r.tasks_per_batch * r.n
    tokens = r.max_prompt_length + r.max_response_tokens
    whole = params_total * bytes_
    kv = rows * tokens * 2 * arch.num_hidden_layers * arch.num_key_value_heads * arch.head_dim * bytes_
    gib = {"rollout_weights": whole / tp / GIB, "staged_versions": r.max_staleness * whole / GIB,
           "rollout_kv_cache": kv / tp / GIB}
    gib["rollout_peak"] = sum(gib.values())
    return {"devices": list(r.devices), "engine": r.engine, "tp": tp, "dtype": dtype, "rows": rows,
            "tokens_per_row": tokens, "staged_versions": r.max_staleness,
            "gib": {k: round(v, 4) for k, v in gib.items()}}
