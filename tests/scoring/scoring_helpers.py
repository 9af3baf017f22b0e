"""Shared by the scoring tests: tiny decoders of each family, their transformers twins, fp64 references."""

import torch
import transformers

from seedfast.model.config import DecoderConfig
from seedfast.scoring import StepSample

VOCAB = 101  # not a multiple of any tile


def make_config(family: str, **overrides) -> DecoderConfig:
    base = dict(model_type=family, vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,  # GQA
                tie_word_embeddings=family == "qwen2")
    base.update(overrides)
    return DecoderConfig(**base)


def hf_twin(model) -> torch.nn.Module:
    """transformers' own model of the same family with the same weights (the independent reference)."""
    config = transformers.AutoConfig.for_model(**model.config.to_hf_dict())
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    hf = hf.to(dtype=torch.float32).eval()
    result = hf.load_state_dict(model.state_dict(), strict=False)
    tied = ["lm_head.weight"] if model.config.tie_word_embeddings else []
    assert result.missing_keys == tied and not result.unexpected_keys
    assert torch.equal(hf.get_output_embeddings().weight, model.lm_head_weight)
    return hf


@torch.no_grad()
def reference_scores(hf, context: torch.Tensor, response: torch.Tensor, temperature: float = 1.0):
    """log p(response | context) and entropy, from materialized fp64 log_softmax over a full forward."""
    ids = torch.cat([context, response])[None]
    logits = hf(ids).logits[0].double() / temperature
    logp = torch.log_softmax(logits, -1)
    rows = torch.arange(len(context) - 1, ids.shape[1] - 1)
    entropy = -(logp[rows].exp() * logp[rows]).sum(-1)
    return logp[rows, response], entropy


def random_samples(generator: torch.Generator, n: int = 10) -> list[StepSample]:
    def ids(length):
        return torch.randint(0, VOCAB, (length,), generator=generator)

    def rand(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=generator))

    samples = []
    for i in range(n):
        prompt, response = ids(rand(1, 30)), ids(rand(1, 6))
        kind = i % 6
        k = {0: 0, 1: len(prompt)}.get(kind, rand(0, len(prompt)))
        extra = {}
        if kind == 3:  # additive: two insertion points
            k2 = rand(k, len(prompt))
            extra = dict(insertions=[(k, ids(rand(1, 4))), (k2, ids(rand(1, 4)))])
        elif kind == 4:  # teacher truncated: a span before the insertion is left out
            start = rand(0, k)
            extra = dict(insert_at=k, privileged_ids=ids(rand(1, 5)), teacher_drops=[(start, rand(start, k))])
        elif kind == 5:  # a failed skill: no teacher
            extra = dict(insert_at=k, privileged_ids=ids(3), teacher_valid=False)
        else:
            extra = dict(insert_at=k, privileged_ids=ids(rand(1, 5)))
        samples.append(StepSample(prompt_ids=prompt, response_ids=response, sample_id=i, **extra))
    return samples


def _copy(base: StepSample, response: torch.Tensor, sample_id: int) -> StepSample:
    """base's prompt and teacher context, another response (a second trajectory of the same group)."""
    return StepSample(prompt_ids=base.prompt_ids, response_ids=response, insertions=base.insertions,
                      teacher_drops=base.teacher_drops, teacher_valid=base.teacher_valid, sample_id=sample_id)


def repeated_prompts(seed: int = 5) -> list[StepSample]:
    """In rollout order (trajectory-major): prompts a, b, c, d repeated 4, 3, 1 and 2 times and interleaved; d has a
    one-token prompt (nothing to share before its last token)."""
    gen = torch.Generator().manual_seed(seed)
    base = random_samples(gen, n=6)
    a, b, c = base[2], base[3], base[4]  # an insertion inside the prompt, two insertions, a truncated teacher
    d = StepSample(prompt_ids=[7], response_ids=[1, 2], sample_id=99)
    plan = [a, b, a, c, b, a, d, b, a, d]
    samples = []
    for i, s in enumerate(plan):
        response = torch.randint(0, 101, (1 + i % 4,), generator=gen)
        samples.append(_copy(s, response, i) if s is not d else StepSample(prompt_ids=[7], response_ids=response,
                                                                          sample_id=i))
    return samples
