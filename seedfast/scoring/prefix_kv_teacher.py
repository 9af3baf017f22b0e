"""The prefix-KV teacher (docs/algorithms.md, 'Token log-probabilities'): ℓskill scored from a prefix KV the caller
already has, so only the teacher branches run (under no_grad). The update uses it with the KV of its own forward:
for `teacher_params: current` (ℓskill under the current θ), and for `teacher_params: old` when the update is
on-policy (θ equals θold there, so the same forward serves)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from seedfast.context.sample import StepSample, check_samples, spliced_suffix
from seedfast.model.decoder import Decoder
from seedfast.model.kv import PackedKV
from seedfast.model.packing import distinct, make_cu_seqlens
from seedfast.scoring.packing import pack, shared_prefix_length
from seedfast.scoring.score import head_logprob_op
from seedfast.scoring.shared_prompts import forward_packed


def _leading_tokens(kv: PackedKV, index: list[int], lengths: list[int]) -> PackedKV:
    """Sequences `index` of kv, each cut to its first lengths[i] tokens."""
    device = kv.cu_seqlens.device
    lengths_t = torch.tensor(lengths, dtype=torch.int64, device=device)
    cu = make_cu_seqlens(lengths_t)
    total = int(cu[-1])
    starts = kv.cu_seqlens[:-1].long()[torch.tensor(index, dtype=torch.int64, device=device)]
    gather = torch.repeat_interleave(starts - cu[:-1].long(), lengths_t, output_size=total)
    gather = gather + torch.arange(total, device=device)
    return PackedKV([k[gather].detach() for k in kv.keys], [v[gather].detach() for v in kv.values], cu)


@torch.no_grad()
def teacher_logprob_with_prefix(
    model: Decoder,
    prefix_kv: PackedKV,
    samples: Sequence[StepSample],
    *,
    temperature: float = 1.0,
    attn_backend: str | None = None,
    return_hidden: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ℓskill under the model's current parameters, from a prefix KV the caller already has.

    prefix_kv holds one sequence per sample, in order, starting at position 0 and at least
    `shared_prefix_length(sample)` tokens long, e.g. the (detached) KV of the update's forward over
    P ⊕ A[:-1] with `return_kv=True`; only its leading shared-prefix tokens are used.
    Returns (teacher_logprob [ΣA] fp32, teacher_mask [ΣA] bool), packed in sample order like
    `Scores.logprob`; rows of samples without a teacher are 0 and masked out. A teacher context that several samples
    hold (the same P[:n] and splice(P)[n:]) runs once, each sample's response against its keys and values
    (docs/performance.md, 'The teacher reuses the prefix KV'). `return_hidden` adds the teacher's final hidden rows
    (after the final norm, what the LM head reads for each log-prob) as a third result, teacher_hidden [ΣA, d] in the
    model's dtype, packed alike, zeros for samples without a teacher.
    """
    if not isinstance(prefix_kv, PackedKV):
        raise TypeError(f"prefix_kv must be a PackedKV, got {type(prefix_kv).__name__}")
    samples = check_samples(samples)
    if prefix_kv.num_sequences != len(samples):
        raise ValueError(f"prefix_kv holds {prefix_kv.num_sequences} sequences for {len(samples)} samples")
    have = prefix_kv.lengths.tolist()
    device = model.lm_head_weight.device
    n_resp = [len(s.response_ids) for s in samples]
    teacher_logprob = torch.zeros(sum(n_resp), dtype=torch.float32, device=device)
    mask = torch.zeros(sum(n_resp), dtype=torch.bool, device=device)
    chosen = [i for i, s in enumerate(samples) if s.has_teacher]
    if not chosen:
        if return_hidden:
            weight = model.lm_head_weight
            return teacher_logprob, mask, weight.new_zeros(sum(n_resp), weight.shape[1])
        return teacher_logprob, mask
    lengths = [shared_prefix_length(samples[i]) for i in chosen]
    for i, need in zip(chosen, lengths):
        if have[i] < need:
            name = samples[i].describe(i)
            raise ValueError(f"{name}: prefix_kv sequence {i} has {have[i]} tokens, the shared prefix needs {need}")
    contexts = [spliced_suffix(samples[i].prompt_ids, samples[i].splices(), n) for i, n in zip(chosen, lengths)]
    # the same P[:n] and splice(P)[n:]: an oracle writes one skill per game and outcome, so a group's samples at a
    # shared prompt hold one teacher context and differ only in their response
    first, owner = distinct((tuple(samples[i].prompt_ids[:n].tolist()), tuple(c.tolist()))
                            for i, n, c in zip(chosen, lengths, contexts))
    responses = [samples[i].response_ids for i in chosen]
    if len(first) < len(chosen):
        # a teacher context repeated: its tokens run once, and each response reads that context's keys and values
        # where they are held once (model/attention_shared_past.py: no copy per response)
        past = _leading_tokens(prefix_kv, [chosen[g] for g in first], [lengths[g] for g in first])
        heads = pack([contexts[g][:-1] for g in first], [lengths[g] for g in first], [contexts[g][:0] for g in first])
        _, kv = forward_packed(model, heads, past=past, return_kv=True, attn_backend=attn_backend)
        branches = pack([torch.cat([c[-1:], a[:-1]]) for c, a in zip(contexts, responses)],
                        [n + len(c) - 1 for n, c in zip(lengths, contexts)], responses)
        hidden = forward_packed(model, branches, past=past.concat(kv), past_owner=owner, attn_backend=attn_backend)
    else:
        past = _leading_tokens(prefix_kv, chosen, lengths)
        branches = pack([torch.cat([c, a[:-1]]) for c, a in zip(contexts, responses)], lengths, responses)
        # each branch reads its own prefix where it lies, not through a merged copy, where that pays (sharing_pays)
        hidden = forward_packed(model, branches, past=past, past_owner=list(range(len(chosen))),
                                attn_backend=attn_backend)  # the scored rows alone
    out = head_logprob_op(model)(hidden, model.lm_head_weight, branches.targets.to(device), temperature=temperature)
    offsets = torch.tensor([0, *n_resp]).cumsum(0).tolist()
    where = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in chosen]).to(device)
    teacher_logprob[where] = out.logprob
    mask[where] = True
    if not return_hidden:
        return teacher_logprob, mask
    if len(chosen) == len(samples):  # the rows are already in sample order
        return teacher_logprob, mask, hidden
    teacher_hidden = hidden.new_zeros(sum(n_resp), hidden.shape[1])
    teacher_hidden[where] = hidden
    return teacher_logprob, mask, teacher_hidden
