"""Parallelism applied to a built Decoder, in torchtitan's order: tensor parallel, then FSDP2 per decoder block and
on the root (docs/scaling.md). Only torch's own engines: DTensor's `parallelize_module` and `fully_shard`.

Tensor parallel (mesh dim "tp"), Megatron's layout without sequence parallel (the packed batch is [T, d]):
    q/k/v_proj, gate/up_proj  ColwiseParallel  (each rank computes its heads / its slice of the MLP)
    o_proj, down_proj         RowwiseParallel  (partial sums, all-reduced into replicated activations)
    embed_tokens              RowwiseParallel  (vocabulary-parallel embedding: rows of V per rank)
    lm_head (untied)          ColwiseParallel  (vocabulary-parallel: the fused log-prob runs on the local rows,
                                                ops/vocab_parallel.py; its forward is never called)
    q_norm, k_norm (Qwen3)    SequenceParallel over the head dimension (replicated weights, gradients summed)
The attention modules then hold n_heads / tp query heads and n_kv_heads / tp key-value heads, and the model carries
`head_ops` (distributed/vocab_head.py HEAD_OPS): the vocabulary-parallel log-prob and sampling that scoring and the own
sampler use in place of the whole-head ones.

FSDP2 (mesh dim "dp_shard") shards every parameter over the data-parallel ranks, one all-gather unit per decoder
block plus the root (embeddings, final norm, LM head). Gradients are SUMMED across data-parallel ranks (gradient
divide factor 1): each rank's loss is its share of the global token-mean (train/update.py, docs/scaling.md 'The
loss on N ranks'), so the sum over ranks is the one-process gradient and the learning rate does not depend on the
world size.

LoRA (model/lora.py): a LoRALinear's frozen base (model.dtype) and its trainable fp32 adapters share their block's
unit. FSDP2 asks one original dtype of the parameters a unit trains (and one reduce dtype), not of the frozen ones
(torch 2.13, _FSDPParamGroup._init_mp_dtypes; tests/distributed/test_lora_fsdp.py): the base is sharded and gathered
like any weight and never has a gradient, so each reduce-scatter carries the adapters' gradients alone, reduced in
dist.reduce_dtype into fp32 sharded gradients that AdamW steps in place (no master copy). A frozen parameter made
trainable by mistake would break that rule: apply_tp keeps every parameter's requires_grad. With model.dtype below
fp32 the mixed-precision policy gathers every parameter in model.dtype (runtime/setup.py fsdp_precision): a bf16
base is gathered as it is, and the adapters in the dtype the one-process forward casts them to anyway, while their
sharded copies stay fp32. Neither a unit of their own per adapter (hundreds of tiny collectives per block) nor a
base held as buffers (FSDP2 would not shard it) is needed. Under tensor parallel the adapters are placed by their
layer's style (ADAPTER_PLACEMENTS below).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

from seedfast.distributed.vocab_head import HEAD_OPS
from seedfast.model.decoder import Decoder
from seedfast.model.lora import ADAPTER_NAMES, LoRALinear, release_merged


def check_tp(model: Decoder, tp: int) -> None:
    """Tensor parallel splits heads, key-value heads and the MLP evenly: say which size does not divide."""
    c = model.config
    for name, value in (("num_attention_heads", c.num_attention_heads), ("num_key_value_heads", c.num_key_value_heads),
                        ("intermediate_size", c.intermediate_size)):
        if value % tp:
            raise ValueError(f"dist.tp={tp} does not divide the model's {name}={value}")
    if c.vocab_size < tp:
        raise ValueError(f"dist.tp={tp} is larger than the vocabulary ({c.vocab_size})")


def apply_tp(model: Decoder, tp_mesh: DeviceMesh) -> Decoder:
    """Megatron-style tensor parallel over `tp_mesh` (module docstring); the model is changed in place."""
    tp = tp_mesh.size()
    check_tp(model, tp)
    # SequenceParallel re-registers the norms' weights as new Parameters, trainable whatever they were: a frozen base
    # (LoRA) would train its q/k norms, and FSDP2 would find bf16 and fp32 parameters to train in one unit
    trainable = {name: p.requires_grad for name, p in model.named_parameters()}
    root_plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate())}
    if not model.config.tie_word_embeddings:
        root_plan["lm_head"] = ColwiseParallel()
    parallelize_module(model, tp_mesh, root_plan)
    for layer in model.model.layers:
        plan = {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel(),
        }
        adapters = _take_adapters(layer, plan)  # LoRA: placed by the layer's style, not by the plan's (below)
        parallelize_module(layer, tp_mesh, plan)
        _place_adapters(layer, tp_mesh, plan, adapters)
        if hasattr(layer.self_attn, "q_norm"):
            # Qwen3's per-head q/k norms see this rank's heads ([N, heads / tp, hd]): their weights are replicated
            # DTensors over inputs sharded on the head dimension, so their gradients are summed over the group
            heads = SequenceParallel(sequence_dim=1, use_local_output=True)
            parallelize_module(layer.self_attn, tp_mesh, {"q_norm": heads, "k_norm": heads})
        layer.self_attn.n_heads //= tp  # the views in Attention.qkv now see this rank's heads
        layer.self_attn.n_kv_heads //= tp
    for name, p in model.named_parameters():
        p.requires_grad_(trainable[name])
    model.tp_mesh = tp_mesh
    # scoring and the own sampler read their LM-head ops from here (they may not import dist)
    model.head_ops = HEAD_OPS
    return model


# LoRA under tensor parallel: the (lora_A, lora_B) placements over the tp mesh of an adapted layer of each style. A
# column-parallel layer's output rows are split: B [out, r] is split with them and A [r, in], which every output row
# uses, is whole on every rank (x Aᵀ is computed once per rank, no collective). A row-parallel layer's input columns
# are split: A [r, in] is split with them, so x Aᵀ is a partial sum like x Wᵀ, and B is whole; the layer's one
# all-reduce of its output sums both. ColwiseParallel alone would split every parameter of the nn.Linear on dim 0 (A
# over its r rows: an all-gather per forward), RowwiseParallel would leave the adapters plain tensors.
ADAPTER_PLACEMENTS = {ColwiseParallel: (Replicate(), Shard(0)), RowwiseParallel: (Shard(1), Replicate())}


def _take_adapters(layer: torch.nn.Module, plan: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Remove the adapters of the plan's LoRALinear modules (module path -> (lora_A, lora_B)), so that
    parallelize_module places only the base's weight and bias."""
    taken = {}
    for path in plan:
        module = layer.get_submodule(path)
        if isinstance(module, LoRALinear):
            taken[path] = (module._parameters.pop("lora_A"), module._parameters.pop("lora_B"))
    return taken


def _place_adapters(layer: torch.nn.Module, tp_mesh: DeviceMesh, plan: dict[str, Any],
                    adapters: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Put the adapters `_take_adapters` took back, as DTensors over `tp_mesh` placed per ADAPTER_PLACEMENTS."""
    for path, tensors in adapters.items():
        module = layer.get_submodule(path)
        for name, tensor, placement in zip(ADAPTER_NAMES, tensors, ADAPTER_PLACEMENTS[type(plan[path])]):
            module.register_parameter(name, torch.nn.Parameter(distribute_tensor(tensor, tp_mesh, [placement]),
                                                               requires_grad=tensor.requires_grad))


def apply_fsdp(model: Decoder, dp_mesh: DeviceMesh, *, param_dtype: torch.dtype | None = None,
               reduce_dtype: torch.dtype | None = None) -> Decoder:
    """FSDP2 over `dp_mesh`: one unit per decoder block, then the root; gradients summed (divide factor 1)."""
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    # a decoder block returns its values as a view of v_proj's output (the past KV of the SEED teacher); nothing
    # writes into them in place, which is what FSDP2's warning is about, and the equality tests of
    # tests/distributed/test_fsdp_update.py would see a lost gradient
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPDecoderLayer\) returned a view tensor",
                            category=UserWarning)
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp)
    for unit in fsdp_modules(model):  # each unit has its own setting (the root's does not recurse)
        unit.set_gradient_divide_factor(1.0)
        # plain SUM collectives (gloo has no PREMUL_SUM; a divide factor of 1 needs no pre-scaling anyway)
        unit.set_force_sum_reduction_for_comms(True)
    return model


def parallelize_decoder(model: Decoder, mesh: DeviceMesh, *, activation_checkpointing: bool = False,
                        param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None) -> Decoder:
    """TP (when mesh["tp"] has more than one rank), activation checkpointing, then FSDP2 over mesh["dp_shard"]."""
    if mesh["tp"].size() > 1:
        apply_tp(model, mesh["tp"])
    model.gradient_checkpointing = activation_checkpointing  # per decoder block (model/decoder.py)
    apply_fsdp(model, mesh["dp_shard"], param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    return model


def fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def unsharded(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Every FSDP2 unit all-gathered for the duration (generation, the teacher branch): forwards issue no
    collectives inside, so ranks may call the model different numbers of times. Resharded on exit."""
    mods = fsdp_modules(model)
    if not mods:
        yield model
        return
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
    try:
        model.unshard()
        for m in mods:
            if m is not model:
                m.unshard()
        yield model
    finally:
        release_merged(model)  # merged LoRA weights of the gathered layers go with them
        for m in mods:
            m.reshard()
            if m is not model:  # FSDP2's root never reshards after forward: it stays that way
                m.set_reshard_after_forward(True, recurse=False)


def clip_sharded_grads(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """clip_grad_norm_ for sharded parameters; returns the global 2-norm (before clipping). FSDP2 x TP leaves
    parameters on two meshes (the 2-D one where TP placed them, the data-parallel one for the rest) and DTensor
    computes within one mesh: each mesh's norm is made whole by DTensor (`full_tensor`), the squares are added,
    and each mesh's gradients are scaled by the same factor."""
    by_mesh: dict[Any, list[torch.nn.Parameter]] = {}
    for p in params:
        by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    squares = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], norm_type=2.0)
        squares.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float() ** 2)
    total = torch.stack(squares).sum().sqrt()
    for group in by_mesh.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total
