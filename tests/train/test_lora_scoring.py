"""A LoRA policy's scoring pass under θ_old computes with the merged weights its rollout generated with
(train/rl.py _scores, model/lora.py adapters_merged): its ℓold equals, bit for bit, the scoring of a plain decoder
holding W + s·B·A (on any device: generation merges on GPU too); the unmerged path (x·Wᵀ plus the adapters' two
small GEMMs, a bf16 or GPU model's training forward) rounds differently."""

import torch

from seedfast.config import load_config
from seedfast.model import load_hf
from seedfast.model.lora import LoRALinear, lora_modules, merged_state_dict
from seedfast.runtime.profiling import PhaseTimer
from seedfast.scoring import score
from seedfast.train.draws import seed_everything


def test_a_lora_policy_scores_old_log_probs_with_its_merged_weights(overrides, tiny_policy, train_games, tmp_path,
                                                                   one_torch_thread, monkeypatch):
    from seedfast.train import rl

    cfg = load_config(None, [*overrides(train_games, tmp_path), "model.lora.rank=4", "model.lora.alpha=8",
                             "model.dtype=fp32", "algorithm=grpo", "trainer.mini_batches=2", "rollout.n=4",
                             "trainer.checkpoint_every=0"])
    trainer = rl.Trainer(cfg, policy_dir=tiny_policy)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # adapters that change the policy: at B = 0 both paths compute x·Wᵀ alone
        for m in lora_modules(trainer.policy).values():
            m.lora_B.normal_(0, 0.5, generator=gen)
    calls = []
    inner = rl.score

    def recording(model, samples, **kw):
        out = inner(model, samples, **kw)
        calls.append((samples, kw, out.logprob.clone()))
        return out

    rl.score = recording
    try:
        seed_everything(0)
        result = trainer.rollout(0, PhaseTimer())
        trainer._scores(trainer._step_samples(0, result.steps, None, PhaseTimer(), {}), PhaseTimer(), {})
    finally:
        rl.score = inner
    merged = merged_state_dict(trainer.policy)
    monkeypatch.setattr(LoRALinear, "_trains_merged", lambda self, x: False)  # what a GPU or bf16 forward computes
    unmerged = score(trainer.policy, calls[0][0], **calls[0][1]).logprob  # outside the pass: adapters unmerged
    trainer.close()
    plain = load_hf(tiny_policy, dtype=torch.float32).eval()
    plain.load_state_dict(merged)
    samples, kw, got = calls[0]
    assert len(calls) == 1 and got.numel() > 0
    torch.testing.assert_close(got, score(plain, samples, **kw).logprob, rtol=0, atol=0)
    torch.testing.assert_close(got, unmerged, rtol=1e-4, atol=1e-5)  # the same policy, rounded another way
    assert not torch.equal(got, unmerged)
