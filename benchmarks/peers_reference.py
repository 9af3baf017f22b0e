"""The reference recipe for one RL update, written the way verl-based SEED / SDAR / GRSD code does it, and the same
recipe with Liger-Kernel's fused linear GRPO loss: the peers of benchmarks/peers.py.

Nothing here calls seedfast: the model is transformers' own *ForCausalLM, and the loss of docs/algorithms.md is
written out
again from the formulas (GRPO advantages, PPO clip + dual clip, k3 KL, entropy bonus, gated OPD, token-mean).

Reference recipe (verl's actor, padded path):
- ℓold, ℓref and ℓskill each from a separate forward of the HF model; the model returns logits for every position
  ([B, T, V], materialized), the response rows are taken, then log_softmax + gather;
- the teacher forward runs over the whole rebuilt skill-augmented prompt P[:k] ⊕ S ⊕ P[k:] ⊕ A (no KV reuse);
- the update forward does the same with gradient, entropy from the response logits; backward through the logits;
  global grad-norm clip and AdamW.
Liger: as above, but the update's clipped policy term and k3 KL come from LigerFusedLinearGRPOLoss on the response
rows' final hidden states (chunked, no logits). Liger has no entropy bonus and no OPD term, so those are added the
reference way, from logits of the response rows; Liger has no dual clip either (inactive on-policy: every ratio is 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

KL_CLAMP = 10.0


@dataclass
class PaddedBatch:
    """Right-padded token ids, their attention mask, and where the response tokens sit."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    rows: tuple[torch.Tensor, torch.Tensor]  # (batch index, position) of the rows predicting response tokens
    targets: torch.Tensor  # [N] the response tokens, sample order


def padded_batch(sequences: Sequence[Sequence[int]], response_lengths: Sequence[int], device: str) -> PaddedBatch:
    """Sequences ending with their response, right-padded with 0; row t predicts token t + 1."""
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    batch_idx, pos_idx, targets = [], [], []
    for b, (seq, r) in enumerate(zip(sequences, response_lengths)):
        ids[b, :len(seq)] = torch.tensor(seq)
        mask[b, :len(seq)] = 1
        pos = torch.arange(len(seq) - r - 1, len(seq) - 1)
        batch_idx.append(torch.full_like(pos, b))
        pos_idx.append(pos)
        targets.append(torch.tensor(seq[len(seq) - r:]))
    rows = (torch.cat(batch_idx).to(device), torch.cat(pos_idx).to(device))
    return PaddedBatch(ids.to(device), mask.to(device), rows, torch.cat(targets).to(device))


def response_logprobs(model: torch.nn.Module, batch: PaddedBatch, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ℓ [N], H [N] | None) of the response tokens: full logits [B, T, V], response rows, log_softmax, gather."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    logp = torch.log_softmax(logits[batch.rows].float(), dim=-1)
    picked = logp.gather(1, batch.targets.unsqueeze(1)).squeeze(1)
    entropy = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return picked, entropy


def grpo_advantages(rewards: Sequence[float], groups: Sequence[object], eps: float) -> torch.Tensor:
    """A_i = (R_i − mean_g) / (std_g + ε), unbiased std; 0 for a group of one or of zero variance."""
    r = torch.tensor(rewards, dtype=torch.float32)
    out = torch.zeros_like(r)
    for g in dict.fromkeys(groups):
        idx = torch.tensor([i for i, x in enumerate(groups) if x == g])
        if len(idx) < 2:
            continue
        std = r[idx].std()
        if float(std) > 0:
            out[idx] = (r[idx] - r[idx].mean()) / (std + eps)
    return out


def pg_term(lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, hp: dict) -> torch.Tensor:
    """max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high)); for A < 0 also min(·, −A·c)."""
    ratio = torch.exp(lp - old)
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - hp["clip_low"], 1 + hp["clip_high"]))
    if hp["dual_clip"] is None:
        return pg
    return torch.where(adv < 0, torch.minimum(pg, -adv * hp["dual_clip"]), pg)


def k3_kl(lp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    r = ref - lp
    return (torch.exp(r) - r - 1).clamp(-KL_CLAMP, KL_CLAMP)


def opd_term(lp: torch.Tensor, skill: torch.Tensor, valid: torch.Tensor, beta: float) -> torch.Tensor:
    """m·σ(β·sg[ℓskill − ℓθ])·(sg[ℓskill] − ℓθ), gap gate."""
    gap = skill.detach() - lp
    gate = torch.sigmoid(beta * gap.detach())
    return torch.where(valid, gate * gap, torch.zeros_like(gap))


def spec_loss(lp: torch.Tensor, entropy: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, adv: torch.Tensor,
              hp: dict, skill: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> torch.Tensor:
    """token-mean(pg + β_KL·kl − c_H·H) + λ_opd·token-mean(opd) over the N response tokens."""
    per_token = pg_term(lp, old, adv, hp) + hp["kl_coef"] * k3_kl(lp, ref) - hp["entropy_coef"] * entropy
    loss = per_token.mean()
    if skill is not None:
        loss = loss + hp["opd_coef"] * opd_term(lp, skill, valid, hp["opd_beta"]).mean()
    return loss


@dataclass
class UpdateInputs:
    """The step samples in the form the peers use: student and teacher batches, advantages, teacher mask."""

    student: PaddedBatch
    teacher: PaddedBatch | None  # only the samples with a valid skill
    teacher_rows: torch.Tensor | None  # [N] bool: response tokens of samples with a valid skill
    advantages: torch.Tensor  # [N] per token
    responses: int  # tokens per response (the same for every sample here)


def build_inputs(samples: Sequence[dict], hp: dict, use_opd: bool, device: str) -> UpdateInputs:
    """Student sequences P ⊕ A, teacher sequences P[:k] ⊕ S ⊕ P[k:] ⊕ A rebuilt in full, token advantages."""
    lengths = [len(s["response"]) for s in samples]
    student = padded_batch([s["prompt"] + s["response"] for s in samples], lengths, device)
    adv = grpo_advantages([s["reward"] for s in samples], [s["group"] for s in samples], hp["adv_eps"])
    adv_tokens = torch.repeat_interleave(adv, torch.tensor(lengths)).to(device)
    teacher = teacher_rows = None
    if use_opd:
        keep = [s for s in samples if s["skill_valid"]]
        teacher = padded_batch([s["prompt"][:s["k"]] + s["skill"] + s["prompt"][s["k"]:] + s["response"]
                                for s in keep], [len(s["response"]) for s in keep], device)
        teacher_rows = torch.repeat_interleave(torch.tensor([s["skill_valid"] for s in samples]),
                                               torch.tensor(lengths)).to(device)
    return UpdateInputs(student, teacher, teacher_rows, adv_tokens, lengths[0])


def scatter_teacher(skill_valid_rows: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(skill_valid_rows.shape, dtype=values.dtype, device=values.device)
    out[skill_valid_rows] = values
    return out


def score_pass(model: torch.nn.Module, x: UpdateInputs, ref: torch.nn.Module, use_opd: bool, phase: Callable
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(ℓold, ℓref, ℓskill | None): three separate no-grad forwards with materialized logits."""
    with torch.no_grad():
        with phase("old"):
            old, _ = response_logprobs(model, x.student)
        with phase("ref"):
            ref_lp, _ = response_logprobs(ref, x.student)
        skill = None
        if use_opd:
            with phase("teacher"):
                skill = scatter_teacher(x.teacher_rows, response_logprobs(model, x.teacher)[0])
    return old, ref_lp, skill


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, hp: dict) -> float:
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], hp["grad_clip"])
    optimizer.step()
    return float(norm)


def reference_update(model: torch.nn.Module, ref: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     x: UpdateInputs, hp: dict, use_opd: bool, phase: Callable) -> float:
    """One update of the reference recipe; returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    old, ref_lp, skill = score_pass(model, x, ref, use_opd, phase)
    with phase("forward"):
        lp, entropy = response_logprobs(model, x.student, with_entropy=True)
        loss = spec_loss(lp, entropy, old, ref_lp, x.advantages, hp, skill, x.teacher_rows)
    with phase("backward"):
        loss.backward()
    with phase("optimizer"):
        optimizer_step(model, optimizer, hp)
    return float(loss.detach())


def liger_loss_fn(hp: dict) -> torch.nn.Module:
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    return LigerFusedLinearGRPOLoss(beta=hp["kl_coef"], compiled=False, use_ref_model=True, loss_type="dapo",
                                    epsilon_low=hp["clip_low"], epsilon_high=hp["clip_high"])


def liger_update(model: torch.nn.Module, ref: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 x: UpdateInputs, hp: dict, use_opd: bool, phase: Callable, loss_fn: torch.nn.Module) -> float:
    """The reference recipe with the update's policy term + KL from Liger's fused linear GRPO loss."""
    optimizer.zero_grad(set_to_none=True)
    old, ref_lp, skill = score_pass(model, x, ref, use_opd, phase)
    s, r = x.student, x.responses
    with phase("forward"):
        hidden = model.model(input_ids=s.input_ids, attention_mask=s.attention_mask, use_cache=False)
        rows = hidden.last_hidden_state[s.rows]  # [N, d]
        weight = model.get_output_embeddings().weight
        b = rows.shape[0] // r
        shaped = lambda t: t.view(b, r)  # noqa: E731
        pg_kl, _ = loss_fn(rows.view(b, r, -1), weight, shaped(s.targets), torch.ones(b, r, device=rows.device),
                           x.advantages.view(b, r)[:, 0], ref_per_token_logps=shaped(ref_lp),
                           old_per_token_logps=shaped(old))
        # not covered by Liger: the entropy bonus and the OPD term, from the response rows' logits
        logp = torch.log_softmax((rows @ weight.t()).float(), dim=-1)
        lp = logp.gather(1, s.targets.unsqueeze(1)).squeeze(1)
        entropy = -(logp.exp() * logp).sum(-1)
        loss = pg_kl - hp["entropy_coef"] * entropy.mean()
        if skill is not None:
            loss = loss + hp["opd_coef"] * opd_term(lp, skill, x.teacher_rows, hp["opd_beta"]).mean()
    with phase("backward"):
        loss.backward()
    with phase("optimizer"):
        optimizer_step(model, optimizer, hp)
    return float(loss.detach())
