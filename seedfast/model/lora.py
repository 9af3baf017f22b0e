"""LoRA: low-rank adapters on the decoder's linear layers (docs/algorithms.md, 'LoRA').

    add_lora(model, LoRASpec(rank=16, alpha=32, targets=LORA_TARGETS), seed=0)   # in place; base frozen
    with adapters_disabled(model): ...          # the base policy (the KL reference: no second copy of the model)
    adapter_state_dict(model)                   # {"model.layers.0.self_attn.q_proj.lora_A": [r, in], ...}
    merged_state_dict(model, torch.bfloat16)    # HF names, W + (alpha/r)·B·A: what an engine or an HF folder gets

A targeted `nn.Linear` becomes a `LoRALinear`: the same module path, its frozen `weight` and `bias` under their own
names (so HF state dicts, tensor parallel's plans and FSDP2's units see the modules they always saw), plus `lora_A`
[r, in] and `lora_B` [out, r], trainable, in the dtype of the master weights (fp32). The forward computes in the
input's dtype (the base's, model.dtype): y = x Wᵀ + b + s·(x Aᵀ) Bᵀ with s = alpha / r (on CPU in fp32, as
x·(W + s·B·A)ᵀ + b with the merged weight kept until the adapters move, `_MergedLoRA`). B starts at zero, so an
added adapter changes nothing until it is trained; A starts as PEFT's (Kaiming-uniform, bound 1/sqrt(in)), so an
adapter folder of seedfast's and one of PEFT's hold the same kind of numbers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

# every linear layer of a decoder block (attention and MLP): "LoRA Without Regret" (Thinking Machines, 2025) finds
# that adapting all of them, the MLP above all, is what lets LoRA match full fine-tuning
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_NAMES = ("lora_A", "lora_B")


@dataclass(frozen=True)
class LoRASpec:
    """rank r, alpha (the update is scaled by alpha / r) and the module names adapted in every decoder block."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRASpec: rank must be >= 1, got {self.rank}")
        if not math.isfinite(self.alpha) or self.alpha <= 0:
            raise ValueError(f"LoRASpec: alpha must be finite and > 0, got {self.alpha}")
        unknown = sorted(set(self.targets) - set(LORA_TARGETS))
        if unknown or not self.targets:
            raise ValueError(f"LoRASpec: targets must be a non-empty subset of {LORA_TARGETS}, got {self.targets}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def merge_weight(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
    """W + s·B·A summed in fp32 (fp64 for an fp64 base), in `dtype` (default: W's): the one merge every export and
    push uses."""
    acc = torch.promote_types(weight.dtype, torch.float32)
    merged = weight.detach().to(acc) + (b.detach().to(acc) @ a.detach().to(acc)) * scaling
    return merged.to(dtype or weight.dtype)


class LoRALinear(nn.Linear):
    """An nn.Linear with a frozen weight and bias and a trainable low-rank update (module docstring)."""

    def __init__(self, base: nn.Linear, spec: LoRASpec, dtype: torch.dtype,
                 generator: torch.Generator | None = None) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        device = base.weight.device
        self.lora_A = nn.Parameter(torch.empty(spec.rank, self.in_features, dtype=dtype, device=device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, spec.rank, dtype=dtype, device=device))
        if device.type != "meta":
            bound = 1.0 / math.sqrt(self.in_features)  # kaiming_uniform_(a=sqrt(5)), PEFT's and nn.Linear's default
            with torch.no_grad():
                values = torch.rand(self.lora_A.shape, generator=generator, dtype=torch.float64)
                self.lora_A.copy_((values * 2 - 1) * bound)
        self.scaling = spec.scaling
        self.adapter_enabled = True
        self.use_merged = False  # set by `adapters_merged`: generation's one GEMM per layer
        self._merged: tuple[tuple, torch.Tensor] | None = None  # (what it was merged from, W + s·B·A)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.adapter_enabled:
            return F.linear(x, self.weight, self.bias)
        if self.use_merged or self._trains_merged(x):
            merged = self._merged_for(x.dtype)
            if torch.is_grad_enabled() and (self.lora_A.requires_grad or self.lora_B.requires_grad):
                return _MergedLoRA.apply(x, merged, self.bias, self.lora_A, self.lora_B, self.scaling)
            return F.linear(x, merged, self.bias)
        if torch.is_grad_enabled():
            self._merged = None  # training moves the adapters: a merged copy would be stale, and it costs memory
        out = F.linear(x, self.weight, self.bias)
        down = F.linear(x, self.lora_A.to(x.dtype))
        # out + s·down·Bᵀ as one addmm: no [tokens, out] temporaries for the product and its scaling, forward or back
        lifted = torch.addmm(out.reshape(-1, self.out_features), down.reshape(-1, down.shape[-1]),
                             self.lora_B.to(x.dtype).t(), alpha=self.scaling)
        return lifted.view(out.shape)

    def _trains_merged(self, x: torch.Tensor) -> bool:
        """Whether this forward computes with W + s·B·A (docs/algorithms.md, 'LoRA'): on CPU in fp32 or fp64, where
        merging rounds nothing away (in bf16 the small s·B·A would be lost in W's rounding) and the adapters'
        rank-r products, memory-bound there, cost a LoRA update more than the merge, once per optimizer step."""
        return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
                and self.weight.dtype == x.dtype and _mergeable(self))

    def _merged_for(self, dtype: torch.dtype) -> torch.Tensor:
        """W + s·B·A in `dtype`, merged again only when W, A or B changed since (their version counters move with every
        in-place update: an optimizer step, a load)."""
        source = tuple((t.data_ptr(), t._version) for t in (self.weight, self.lora_A, self.lora_B)) + (dtype,)
        if self._merged is None or self._merged[0] != source:
            self._merged = None  # the stale copy goes before the new one is allocated
            with torch.inference_mode(False):  # a copy made while generating is also the next update's, autograd's
                self._merged = (source, self.merged_weight(dtype))
        return self._merged[1]

    @torch.no_grad()
    def merged_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """W + s·B·A (`merge_weight`), in `dtype` (default: the base weight's)."""
        return merge_weight(self.weight, self.lora_A, self.lora_B, self.scaling, dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.lora_A.shape[0]}, scaling={self.scaling:g}"


def _mergeable(layer: LoRALinear) -> bool:
    """A layer whose tensors are sharded (DTensor) or whose forward is hooked (FSDP2 gathers in its hooks) computes
    with its adapters as they are: a merged copy would be built from a shard."""
    return (not any(isinstance(t, DTensor) for t in (layer.weight, layer.lora_A, layer.lora_B))
            and not (layer._forward_hooks or layer._forward_pre_hooks))


class _MergedLoRA(torch.autograd.Function):
    """y = x·Mᵀ + b with M = W + s·B·A computed beforehand (and held fixed: W is frozen), and the adapters' gradients
    by the chain rule: with G = dL/dy, dL/dx = G·M, dL/dA = s·(G·B)ᵀ·x, dL/dB = s·Gᵀ·(x·Aᵀ). One GEMM each way for
    the frozen base and the adapter together, where the unmerged forward pays two more rank-r products and an add
    in each direction."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, merged: torch.Tensor, bias: torch.Tensor | None, a: torch.Tensor,
                b: torch.Tensor, scaling: float) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        down = torch.mm(rows, a.to(x.dtype).t())
        ctx.save_for_backward(rows, down, merged, b)
        ctx.scaling, ctx.x_shape, ctx.adapter_dtypes = scaling, x.shape, (a.dtype, b.dtype)
        return F.linear(rows, merged, bias).view(*x.shape[:-1], merged.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        rows, down, merged, b = ctx.saved_tensors
        need_x, _, need_bias, need_a, need_b, _ = ctx.needs_input_grad
        g = grad.reshape(-1, grad.shape[-1])
        dx = torch.mm(g, merged).view(ctx.x_shape) if need_x else None
        dbias = g.sum(0) if need_bias else None
        da = torch.mm(torch.mm(g, b.to(g.dtype)).t(), rows).mul_(ctx.scaling).to(ctx.adapter_dtypes[0]) \
            if need_a else None
        db = torch.mm(g.t(), down).mul_(ctx.scaling).to(ctx.adapter_dtypes[1]) if need_b else None
        return dx, None, dbias, da, db, None


def add_lora(model: nn.Module, spec: LoRASpec, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> list[str]:
    """Freeze every parameter of `model` and put a LoRALinear (adapters in `dtype`) in place of each targeted linear
    layer of its decoder blocks; returns the adapted module paths. The adapters' initial values depend on `seed`
    and the module path only."""
    if has_lora(model):
        raise ValueError("add_lora: the model already has LoRA adapters")
    for p in model.parameters():
        p.requires_grad_(False)
    adapted = []
    for path, module in list(model.named_modules()):
        leaf = path.rsplit(".", 1)[-1]
        if leaf not in spec.targets or not isinstance(module, nn.Linear):
            continue
        parent = model.get_submodule(path.rsplit(".", 1)[0]) if "." in path else model
        generator = torch.Generator().manual_seed(_module_seed(seed, path))
        setattr(parent, leaf, LoRALinear(module, spec, dtype, generator))
        adapted.append(path)
    if not adapted:
        raise ValueError(f"add_lora: no linear layer of the model is named one of {spec.targets}")
    model.lora_spec = spec
    return adapted


def _module_seed(seed: int, path: str) -> int:
    digest = hashlib.sha256(f"{seed}:{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def has_lora(model: nn.Module) -> bool:
    return getattr(model, "lora_spec", None) is not None


def lora_spec_of(model: nn.Module) -> LoRASpec | None:
    return getattr(model, "lora_spec", None)


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """module path -> LoRALinear, in the model's order."""
    return {path: m for path, m in model.named_modules() if isinstance(m, LoRALinear)}


def is_adapter_name(name: str) -> bool:
    """Whether a parameter or state-dict name is one of an adapter's tensors."""
    return name.rsplit(".", 1)[-1] in ADAPTER_NAMES


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block the model computes its base policy (the adapters switched off), e.g. the KL reference."""
    modules = list(lora_modules(model).values())
    before = [m.adapter_enabled for m in modules]
    for m in modules:
        m.adapter_enabled = False
    try:
        yield model
    finally:
        for m, enabled in zip(modules, before):
            m.adapter_enabled = enabled


@contextmanager
def adapters_merged(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block each adapted layer computes x·(W + s·B·A)ᵀ: one GEMM, where the adapters cost two small ones
    and an add per layer and token, which a decode step of a few rows pays in full (docs/algorithms.md, 'LoRA').
    For inference (generation): the merged copy is kept while the adapters stay as they are, and dropped by the next
    forward with gradients unless the model trains with it too (CPU, fp32/fp64: `LoRALinear._trains_merged`).
    Layers whose tensors are sharded (DTensor) or hooked compute as they always do."""
    modules = [m for m in lora_modules(model).values() if _mergeable(m)]
    for m in modules:
        m.use_merged = True
    try:
        yield model
    finally:
        for m in modules:
            m.use_merged = False


def release_merged(model: nn.Module) -> None:
    """Drop every merged copy `adapters_merged` keeps: a sharded model's gathered weights are freed when it reshards,
    and a copy of them kept past that would hold a whole layer on every rank (and be keyed by freed storage)."""
    for m in lora_modules(model).values():
        m._merged = None


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors by name ('<module path>.lora_A' / '.lora_B'), detached, as the model holds them."""
    return {name: t.detach() for name, t in model.state_dict().items() if is_adapter_name(name)}


def base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict less the adapters: the frozen base, under HF names."""
    return {name: t for name, t in model.state_dict().items() if not is_adapter_name(name)}


@torch.no_grad()
def merged_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """HF name -> tensor of the adapted model with each adapter merged into its weight (W + s·B·A, summed in fp32),
    in `dtype` (default: each tensor's own); a model without adapters gives its state dict (cast)."""
    merged = {f"{path}.weight": m.merged_weight(dtype) for path, m in lora_modules(model).items()}
    out = {}
    for name, tensor in base_state_dict(model).items():
        value = merged.get(name, tensor.detach())
        out[name] = value if dtype is None else value.to(dtype)
    return out


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor], source: str = "adapter state") -> None:
    """Copy `state` ('<path>.lora_A' / '.lora_B' -> tensor) into the model's adapters: every adapter must be there,
    with its shape; a missing, unexpected or misshapen tensor is one error naming it."""
    own = dict(model.named_parameters())
    wanted = {name for name in own if is_adapter_name(name)}
    missing, unexpected = sorted(wanted - set(state)), sorted(set(state) - wanted)
    if missing or unexpected:
        raise ValueError(f"{source}: the adapters differ from the model's: missing {missing[:4]}"
                         f"{' ...' if len(missing) > 4 else ''}, unexpected {unexpected[:4]}"
                         f"{' ...' if len(unexpected) > 4 else ''}")
    with torch.no_grad():
        for name in wanted:
            if tuple(state[name].shape) != tuple(own[name].shape):
                raise ValueError(f"{source}: {name} has shape {tuple(state[name].shape)}, the model's adapter "
                                 f"{tuple(own[name].shape)}")
            own[name].copy_(state[name])


def adapter_fingerprint(tensors: Sequence[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over (name, dtype, shape, bytes) of the tensors in the given order: equal for equal adapters on any
    process that holds them (the engine's check that it runs what the trainer sent)."""
    h = hashlib.sha256()
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@torch.no_grad()
def merge_state(state: dict[str, torch.Tensor], spec: LoRASpec,
                dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """A full state dict of an adapted model (HF names and each adapter's '<path>.lora_A' / '.lora_B', e.g. gathered
    from a sharded model) merged as `merged_state_dict` merges a model: '<path>.weight' becomes W + s·B·A summed in
    fp32 (fp64 for an fp64 base), the adapters' tensors are dropped, and every tensor is in `dtype` (default: its
    own; a merged weight in its base's). A weight with one of its two adapters and not the other is an error."""
    adapted = sorted({name.rsplit(".", 1)[0] for name in state if is_adapter_name(name)})
    out = {name: t for name, t in state.items() if not is_adapter_name(name)}
    for path in adapted:
        names = (f"{path}.lora_A", f"{path}.lora_B", f"{path}.weight")
        missing = [n for n in names if n not in state]
        if missing:
            raise ValueError(f"merge_state: {path} has no {missing}")
        a, b, w = (state[n] for n in names)
        out[names[2]] = merge_weight(w, a, b, spec.scaling, dtype)
    if dtype is not None:
        out = {name: t.to(dtype) for name, t in out.items()}
    return out
