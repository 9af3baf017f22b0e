import math

import pytest
import torch
from transformers.generation.logits_process import TopPLogitsWarper

from seedfast.rollout.sampling import sample_next, top_p_keep_mask


def test_greedy_is_argmax_and_reports_temperature_one_logprob():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    tokens, logprobs = sample_next(logits, temperature=0.0)
    assert tokens.tolist() == [1, 0]
    expected = torch.log_softmax(logits.double(), -1)[[0, 1], [1, 0]]
    torch.testing.assert_close(logprobs.double(), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("top_p", [0.3, 0.5, 0.7, 0.9, 0.99])
def test_top_p_nucleus_matches_transformers_warper(top_p):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=gen) * 3
    ours = top_p_keep_mask(torch.softmax(logits, -1), top_p)
    hf = torch.isfinite(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1)(None, logits.clone()))
    assert torch.equal(ours, hf)


def test_sampled_frequencies_follow_temperature_scaled_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    n = 40_000
    for temperature in (0.5, 1.0, 2.0):
        gen = torch.Generator().manual_seed(1)
        tokens, logprobs = sample_next(logits.expand(n, 4), temperature, generator=gen)
        freq = torch.bincount(tokens, minlength=4).double() / n
        expected = torch.softmax(logits.double() / temperature, -1)
        assert torch.allclose(freq, expected, atol=0.012), (temperature, freq, expected)
        torch.testing.assert_close(logprobs.double(), expected.log()[tokens], atol=1e-5, rtol=0)


def test_top_p_samples_only_the_nucleus_renormalized():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 20_000
    gen = torch.Generator().manual_seed(2)
    tokens, logprobs = sample_next(probs.log().expand(n, 4), 1.0, top_p=0.7, generator=gen)
    counts = torch.bincount(tokens, minlength=4)
    assert counts[2] == 0 and counts[3] == 0
    assert abs(counts[0].item() / n - 0.5 / 0.8) < 0.015
    # the reported log-prob is the untruncated one (what the trainer recomputes)
    assert math.isclose(logprobs[tokens == 1][0].item(), math.log(0.3), abs_tol=1e-6)


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(3))
    draw = lambda seed: sample_next(logits, 1.0, 0.95, torch.Generator().manual_seed(seed))[0]
    assert torch.equal(draw(7), draw(7))
    assert not torch.equal(draw(7), draw(8))


@pytest.mark.parametrize(
    "kwargs, name",
    [({"temperature": -0.1}, "temperature"), ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
     ({"temperature": 1.0, "top_p": 1.5}, "top_p")],
)
def test_bad_sampling_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        sample_next(torch.zeros(1, 3), **kwargs)


def test_logits_must_be_two_dimensional():
    with pytest.raises(ValueError, match="logits"):
        sample_next(torch.zeros(3), 1.0)
