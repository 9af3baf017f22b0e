"""The policy's weights for a colocated rollout engine (docs/scaling.md, 'vLLM in the RL loop'): gathered one tensor
at a time and grouped in buckets, so no GPU ever holds a second full copy of the model.

    for bucket in buckets(hf_named_tensors(policy, dtype=torch.bfloat16), 512 << 20):
        engine.push(bucket)          # [(HF name, full tensor), ...]; the tensors are dropped on the next bucket

A sharded parameter (FSDP2 and/or tensor parallel: a DTensor) is made whole with `full_tensor()`, a collective:
every rank must run the whole iteration, in the same order (each rank then pushes to its own engine). Names are
the HF export's (model/hf_io.py: the Decoder's state-dict names), which transformers and vLLM's `load_weights`
read; a tied LM head is the embedding and is sent once, as `model.embed_tokens.weight`.

A LoRA policy's weights go out merged (W + s·B·A per adapted layer); `adapter_named_tensors` gives its adapters alone,
what rollout.lora_sync=adapter sends to an engine that holds the base and serves adapters itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.distributed.tensor import DTensor

from seedfast.config import ConfigError
from seedfast.model.lora import ADAPTER_NAMES, is_adapter_name, lora_modules, merge_weight


class HFNamedTensors:
    """Iterator of (HF name, full tensor), gathered lazily: one parameter per `next()`.

    `peek_nbytes()` tells the size of the next tensor from its global shape, before gathering it, so `buckets` can
    close a bucket without holding the tensor that opens the next one.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
        seen: set[int] = set()
        self._params: list[tuple[str, torch.Tensor]] = []
        for name, tensor in model.state_dict(keep_vars=True).items():
            if is_adapter_name(name):  # an adapted model's weights go out merged (__next__)
                continue
            if id(tensor) in seen:  # a tied tensor under a second name
                continue
            seen.add(id(tensor))
            self._params.append((name, tensor))
        self._dtype = dtype
        self._next = 0
        self._adapted = {f"{path}.weight": m for path, m in lora_modules(model).items()}

    def __iter__(self) -> HFNamedTensors:
        return self

    def __len__(self) -> int:
        return len(self._params) - self._next

    def peek_nbytes(self) -> int | None:
        """Bytes of the next full tensor (None at the end), without gathering it."""
        if self._next >= len(self._params):
            return None
        tensor = self._params[self._next][1]
        dtype = self._dtype or tensor.dtype
        return tensor.numel() * torch.empty((), dtype=dtype).element_size()  # numel of a DTensor is global

    def __next__(self) -> tuple[str, torch.Tensor]:
        if self._next >= len(self._params):
            raise StopIteration
        name, tensor = self._params[self._next]
        self._next += 1
        with torch.no_grad():
            tensor = tensor.detach()
            if name in self._adapted:  # W + s·B·A, summed in fp32 (model/lora.py); a sharded base gathers first
                tensor = _merged(self._adapted[name])
            if self._dtype is not None:
                tensor = tensor.to(self._dtype)  # on the local shard: half the all-gather for fp32 -> bf16
            if isinstance(tensor, DTensor):
                tensor = tensor.full_tensor()  # all-gather over every mesh dimension it is sharded on
        return name, tensor


def hf_named_tensors(model: torch.nn.Module, dtype: torch.dtype | None = None) -> HFNamedTensors:
    """(HF name, full tensor) of a seedfast Decoder, one parameter at a time (module docstring).

    `dtype` casts each tensor (before the gather), e.g. fp32 master weights to the engine's bf16.
    """
    return HFNamedTensors(model, dtype)


def adapter_named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, full tensor) of a LoRA model's adapters alone ('<module path>.lora_A' / '.lora_B', in the model's
    order and their own dtype, optim.master_dtype: the engine gets the trainer's values bit for bit): what an adapter
    sync sends instead of the merged weights (docs/scaling.md, 'LoRA weight sync'). A sharded adapter is gathered
    whole (a collective: every rank runs it, in this order). Small beside the model (rank r of [out, in] is r·(out + in)
    numbers), so they are handed over as one list."""
    out = []
    with torch.no_grad():
        for path, module in lora_modules(model).items():
            for leaf in ADAPTER_NAMES:
                tensor = getattr(module, leaf).detach()
                if isinstance(tensor, DTensor):
                    tensor = tensor.full_tensor()
                out.append((f"{path}.{leaf}", tensor))
    if not out:
        raise ValueError("adapter_named_tensors: the model has no LoRA adapters")
    return out


def buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
            ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Groups of (name, tensor) of at most `bucket_bytes` each (a larger tensor alone in its bucket).

    One bucket alive at a time: when the consumer asks for the next bucket, the list it was handed is cleared, so
    its tensors are freed even while the consumer's loop variable still names the list (do not keep the tensors
    beyond your iteration). With an `HFNamedTensors` the next tensor's size is known before its gather; with
    another iterable the tensor that does not fit is held while the full bucket is consumed.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes!r}")
    it = iter(named_tensors)
    peek = getattr(it, "peek_nbytes", None)
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    pending: tuple[str, torch.Tensor] | None = None
    while True:
        if pending is not None:
            item, pending = pending, None
        else:
            if peek is not None and bucket:
                upcoming = peek()
                if upcoming is not None and size + upcoming > bucket_bytes:
                    yield bucket
                    bucket.clear()  # the consumer's reference to the list no longer keeps the tensors alive
                    bucket, size = [], 0
                    continue
            try:
                item = next(it)
            except StopIteration:
                break
        nbytes = item[1].numel() * item[1].element_size()
        if bucket and size + nbytes > bucket_bytes:
            pending = item
            yield bucket
            bucket.clear()
            bucket, size = [], 0
            continue
        bucket.append(item)
        size += nbytes
        del item
    if bucket:
        yield bucket
        bucket.clear()


def check_colocated(world: int, tensor_parallel: int) -> None:
    """A colocated engine per trainer rank, each on its rank's GPU: tensor-parallel rollout (an engine over several
    GPUs) works only with one trainer process."""
    if tensor_parallel > 1 and world > 1:
        raise ConfigError(
            f"rollout.tensor_parallel={tensor_parallel} with {world} trainer processes: with rollout.engine=vllm in "
            "the RL loop every rank runs its own vLLM engine on its own GPU; set rollout.tensor_parallel=1 (or train "
            "in one process)")


def _merged(module: torch.nn.Module) -> torch.Tensor:
    """The merged weight of one LoRALinear, its (possibly sharded) base and adapters gathered whole first."""
    if not any(isinstance(t, DTensor) for t in (module.weight, module.lora_A, module.lora_B)):
        return module.merged_weight()
    weight, a, b = (t.full_tensor() if isinstance(t, DTensor) else t for t in (module.weight, module.lora_A,
                                                                               module.lora_B))
    return merge_weight(weight, a, b, module.scaling)
