"""The rows that predict each sample's response, with a prompt that several samples share run once.

The trajectories of a GRPO group start from one prompt and repeat each other's history until they act differently,
so a batch holds many copies of a few prompts. Where the batch repeats a prompt, P[:-1] of each distinct prompt goes
through the model once (prefix call, its KV kept) and every sample runs only P[-1:] ⊕ A[:-1] against its prompt's KV
(branch call): the same log-probs and, through the gathered KV, the same gradients as one call over every P ⊕ A[:-1],
at the cost of the distinct prompts (docs/performance.md, 'A prompt shared by a group is computed once').
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from seedfast.context.sample import StepSample
from seedfast.model.attention_shared_past import fused as shared_past_fused
from seedfast.model.kv import PackedKV
from seedfast.scoring.packing import Packed, distinct_prefixes, pack, pack_prefixes, pack_single, student_branch


class ResponseRows(NamedTuple):
    hidden: torch.Tensor  # [ΣA, d] the final hidden state of each row that predicts a response token, sample order
    targets: torch.Tensor  # [ΣA] the response tokens
    context_kv: PackedKV | None  # with return_kv: one sequence per sample from position 0, at least P[:-1]


def forward_packed(model, packed: Packed, past: PackedKV | None = None, return_kv: bool = False,
                   attn_backend: str | None = None, past_owner: Sequence[int] | None = None):
    """The model over a packed batch on the model's device (its positions, and `past` when given, read through
    `past_owner` when several sequences share one): the hidden states of its scored rows alone, [R, d] in
    `packed.rows` order (the last layer runs no other row: model/decoder.py keep_last)."""
    packed = packed.to(model.lm_head_weight.device)
    if past_owner is not None and not sharing_pays(packed, past, past_owner):
        past, past_owner = past.select(torch.tensor(past_owner, dtype=torch.long)), None
    return model(packed.input_ids, packed.cu_seqlens, position_ids=packed.position_ids, past=past,
                 return_kv=return_kv, attn_backend=attn_backend, keep_last=packed.scored, past_owner=past_owner)


def sharing_pays(packed: Packed, past: PackedKV, past_owner: Sequence[int]) -> bool:
    """Whether sequences that share a past should read it where it is held once (model/attention_shared_past.py)
    rather than from a copy per sequence through the backend's varlen kernel. Where the shared form runs fused (CPU)
    it always does: both forms pad the sequences alike, and the copies' kernel masks the past and the sequence
    together (no causal block skipping) where the shared form's own part is plainly causal. Elsewhere it computes each
    sequence's attention to its own tokens unfused (their [L, L] scores in memory), so it pays where those are the
    smaller part: sequences no longer than their past on the whole, e.g. a response after a long prompt, not a long
    prompt tail after a short prefix (docs/performance.md, 'Responses that share a teacher context')."""
    if shared_past_fused(past.keys[0].device, past.keys[0].dtype):
        return True
    own = packed.cu_seqlens.diff().long()
    shared = past.lengths.to(own.device)[torch.as_tensor(past_owner, dtype=torch.long, device=own.device)]
    return bool((own * own).sum() <= (own * shared).sum())


def response_rows(model, samples: Sequence[StepSample], *, share_prompts: bool, return_kv: bool = False,
                  attn_backend: str | None = None) -> ResponseRows:
    """The policy's rows for `samples` (gradients flow when enabled). With `share_prompts` and a prompt repeated in
    `samples`, each distinct prompt is run once; otherwise one call over every P ⊕ A[:-1]. `share_prompts` must be
    False where every rank has to make the same model calls (a sharded model's update: FSDP2 collectives)."""
    lengths = [len(s.prompt_ids) - 1 for s in samples]
    first, owner = distinct_prefixes(samples, lengths) if share_prompts and any(lengths) else ([], [])
    if len(first) == len(samples) or not first:  # nothing repeated: the single call
        packed = pack_single(samples)
        out = forward_packed(model, packed, return_kv=return_kv, attn_backend=attn_backend)
        hidden, kv = out if return_kv else (out, None)
        return ResponseRows(hidden, packed.targets.to(hidden.device), kv)
    prefixes = pack_prefixes([samples[i] for i in first], [lengths[i] for i in first])
    _, kv = forward_packed(model, prefixes, return_kv=True, attn_backend=attn_backend)
    past = kv.select(torch.tensor(owner, dtype=torch.long))
    branches = pack([student_branch(s, n) for s, n in zip(samples, lengths)], lengths,
                    [s.response_ids for s in samples])
    hidden = forward_packed(model, branches, past=past, attn_backend=attn_backend)
    return ResponseRows(hidden, branches.targets.to(hidden.device), past if return_kv else None)
