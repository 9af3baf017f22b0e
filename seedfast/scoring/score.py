"""Shared-prefix dual-context scoring: ℓold (+H) and ℓskill in one pass over the history (docs/performance.md,
'The teacher reuses the prefix KV').

Per micro-batch (packed varlen, no padding; packing.py says which tokens go where):
    1. prefix call   P[:L] of every sample, keeping its KV
    2. branch call   student branches of all samples and teacher branches of samples with a teacher,
                     each attending to its sample's prefix KV, held once (model/attention_shared_past.py)
    3. LM head       linear_logprob on the rows that predict A: student rows, with the teacher rows as
                     `teacher_hidden`, so both contexts share each W tile; never [tokens × vocab] logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from seedfast.context.sample import StepSample, check_samples
from seedfast.model.decoder import Decoder
from seedfast.ops import LinearLogprobOutput, linear_logprob
from seedfast.sampling_params import check_scoring_temperature
from seedfast.scoring.packing import (
    Packed,
    distinct_prefixes,
    pack_branches,
    pack_prefixes,
    prompt_order,
    shared_prefix_length,
    split_by_budget,
    student_branch,
    teacher_branch,
)
from seedfast.scoring.results import Scores
from seedfast.scoring.shared_prompts import forward_packed, response_rows

DEFAULT_TOKEN_BUDGET = 16384


def head_logprob_op(model) -> Callable[..., LinearLogprobOutput]:
    """The LM head's log-prob op: seedfast.ops.linear_logprob, or the vocabulary-parallel one a tensor-parallel
    model carries (`model.head_ops`, set by distributed/parallelize.py; docs/scaling.md, 'Tensor-parallel LM head')."""
    ops = getattr(model, "head_ops", None)
    return linear_logprob if ops is None else ops.linear_logprob


def _head(model, hidden: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor,
          teacher_rows: torch.Tensor | None, temperature: float, with_entropy: bool):
    device = hidden.device
    teacher_hidden = hidden[teacher_rows.to(device)] if teacher_rows is not None else None
    return head_logprob_op(model)(hidden[rows.to(device)], model.lm_head_weight, targets.to(device),
                                  teacher_hidden=teacher_hidden, temperature=temperature, with_entropy=with_entropy)


def _scatter_scores(samples: list[StepSample], parts, with_entropy: bool, with_teacher: bool,
                    teacher_hidden: torch.Tensor | None = None) -> Scores:
    """Assemble per-micro-batch results (indices, logprob, teacher, entropy[, teacher hidden]) into sample order;
    `teacher_hidden`, an empty [0, d] tensor, asks for the teacher's hidden rows (their width and dtype)."""
    lengths = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.long)
    offsets = torch.zeros(len(samples) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    order = torch.cat([torch.arange(int(offsets[i]), int(offsets[i + 1])) for idx, *_ in parts for i in idx]
                      ) if samples else torch.zeros(0, dtype=torch.long)
    total = int(offsets[-1])

    def place(pieces):
        flat = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        if bool((order == torch.arange(total)).all()):  # one micro-batch in sample order: nothing to move
            return flat
        out = torch.empty((total, *flat.shape[1:]), dtype=flat.dtype, device=flat.device)
        out[order.to(flat.device)] = flat
        return out

    if not parts:
        zeros = torch.zeros(0)
        return Scores(offsets, zeros, zeros if with_teacher else None,
                      torch.zeros(0, dtype=torch.bool) if with_teacher else None, zeros if with_entropy else None,
                      teacher_hidden)
    return Scores(
        offsets=offsets,
        logprob=place([p[1] for p in parts]),
        teacher_logprob=place([p[2] for p in parts]) if with_teacher else None,
        teacher_mask=place([p[3] for p in parts]) if with_teacher else None,
        entropy=place([p[4] for p in parts]) if with_entropy else None,
        teacher_hidden=place([p[5] for p in parts]) if teacher_hidden is not None else None,
    )


def _score_microbatch(model, samples: list[StepSample], temperature: float, with_entropy: bool,
                      attn_backend: str | None, keep_teacher_hidden: bool = False):
    lengths = [shared_prefix_length(s) for s in samples]
    has_teacher = [s.has_teacher for s in samples]
    branches = pack_branches(samples, lengths, has_teacher)
    if any(lengths):
        first, owner = distinct_prefixes(samples, lengths)  # a prefix repeated in the batch is run once
        prefixes = pack_prefixes([samples[i] for i in first], [lengths[i] for i in first])
        _, kv = forward_packed(model, prefixes, return_kv=True, attn_backend=attn_backend)
        # each branch, student and teacher, reads its prefix where it is held once (model/attention_shared_past.py)
        teacher_of = [owner[i] for i, t in enumerate(has_teacher) if t]
        hidden = forward_packed(model, branches, past=kv, past_owner=owner + teacher_of, attn_backend=attn_backend)
    else:
        hidden = forward_packed(model, branches, attn_backend=attn_backend)
    return _dual_head(model, samples, branches, hidden, has_teacher, temperature, with_entropy, keep_teacher_hidden)


def _dual_head(model, samples, branches: Packed, hidden, has_teacher, temperature, with_entropy,
               keep_teacher_hidden: bool = False):
    """Log-probs from branch rows: student rows first (all samples), then teacher rows (has_teacher); with
    `keep_teacher_hidden`, also the teacher rows in the student rows' places ([n, d], zeros without a teacher)."""
    n_resp = [len(s.response_ids) for s in samples]
    n_student = sum(n_resp)
    rows = torch.arange(hidden.shape[0], device=hidden.device)  # hidden holds the scored rows alone, in order
    student_rows, teacher_rows = rows[:n_student], rows[n_student:]
    targets = branches.targets[:n_student]
    # rows of samples with a teacher are paired with their teacher rows; the others go alone
    owner = torch.repeat_interleave(torch.arange(len(samples)), torch.tensor(n_resp))
    paired = torch.tensor(has_teacher, dtype=torch.bool)[owner]
    device = hidden.device
    logprob = torch.empty(n_student, dtype=torch.float32, device=device)
    teacher = torch.zeros(n_student, dtype=torch.float32, device=device)
    entropy = torch.empty(n_student, dtype=torch.float32, device=device) if with_entropy else None
    for mask, pair in ((paired, True), (~paired, False)):
        if not bool(mask.any()):
            continue
        out = _head(model, hidden, student_rows[mask], targets[mask], teacher_rows if pair else None,
                    temperature, with_entropy)
        where = mask.to(device)
        logprob[where] = out.logprob
        if pair:
            teacher[where] = out.teacher_logprob
        if with_entropy:
            entropy[where] = out.entropy
    if not keep_teacher_hidden:
        return logprob, teacher, paired.to(device), entropy
    if bool(paired.all()):  # every sample has a teacher: its rows are already in the student rows' order
        teacher_hidden = hidden[n_student:].clone()  # not a view: the student rows need not stay alive
    else:
        teacher_hidden = hidden.new_zeros(n_student, hidden.shape[1])
        teacher_hidden[paired.to(device)] = hidden[teacher_rows]
    return logprob, teacher, paired.to(device), entropy, teacher_hidden


@torch.no_grad()
def score(
    model: Decoder,
    samples: Sequence[StepSample],
    *,
    with_entropy: bool = False,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    temperature: float = 1.0,
    attn_backend: str | None = None,
    keep_teacher_hidden: bool = False,
) -> Scores:
    """ℓold (and H) on P ⊕ A and ℓskill on P[:k] ⊕ S ⊕ P[k:] ⊕ A for every sample, sharing P[:k].

    Micro-batches hold consecutive samples with at most `token_budget` new tokens per model call
    (prefix call: Σ L; branch call: Σ student + teacher branch tokens); a sample that alone exceeds
    it raises a ValueError naming it. Returns packed `Scores` in sample order; samples without a teacher
    have teacher_mask False (teacher_logprob 0 there, and None in their per-sample view). `keep_teacher_hidden`
    also returns the teacher's final hidden rows, `Scores.teacher_hidden` [N, d] (the rows its log-probs come from,
    zeros where teacher_mask is False), for full-vocabulary distillation against the teacher's distribution.
    """
    samples = check_samples(samples)
    check_scoring_temperature(temperature)
    costs = []
    for s in samples:
        n = shared_prefix_length(s)
        branch = len(student_branch(s, n)) + (len(teacher_branch(s, n)) if s.has_teacher else 0)
        costs.append((n, branch))
    groups = _micro_batches(samples, costs, token_budget)
    parts = []
    for idx in groups:
        batch = [samples[i] for i in idx]
        parts.append((idx, *_score_microbatch(model, batch, temperature, with_entropy, attn_backend,
                                              keep_teacher_hidden)))
    weight = model.lm_head_weight
    no_rows = weight.new_zeros(0, weight.shape[1]) if keep_teacher_hidden else None
    return _scatter_scores(samples, parts, with_entropy, with_teacher=True, teacher_hidden=no_rows)


@torch.no_grad()
def score_reference(
    ref_model: Decoder,
    samples: Sequence[StepSample],
    *,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    temperature: float = 1.0,
    attn_backend: str | None = None,
) -> Scores:
    """ℓref on P ⊕ A (single context, no teacher) with the same budget rule as `score`; a prompt repeated in a
    micro-batch runs once (shared_prompts.py)."""
    samples = check_samples(samples)
    check_scoring_temperature(temperature)
    costs = [(len(s.prompt_ids) + len(s.response_ids) - 1,) for s in samples]
    groups = _micro_batches(samples, costs, token_budget)
    parts = []
    for idx in groups:
        rows = response_rows(ref_model, [samples[i] for i in idx], share_prompts=True, attn_backend=attn_backend)
        out = head_logprob_op(ref_model)(rows.hidden, ref_model.lm_head_weight, rows.targets, temperature=temperature)
        parts.append((idx, out.logprob, None, None, None))
    return _scatter_scores(samples, parts, with_entropy=False, with_teacher=False)


def _micro_batches(samples: list[StepSample], costs: list[tuple[int, ...]], token_budget: int) -> list[list[int]]:
    """split_by_budget over the samples with the samples of one prompt next to each other, so that a micro-batch holds
    a repeated prompt's copies together and runs it once."""
    order = prompt_order(samples, range(len(samples)))
    groups = split_by_budget([costs[i] for i in order], token_budget, [samples[i].describe(i) for i in order])
    return [[order[k] for k in group] for group in groups]


