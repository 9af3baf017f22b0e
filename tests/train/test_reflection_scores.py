"""GRSD stage A as the reference code does it (docs/algorithms.md, 'GRSD'): every reflection is judged whatever its
form, an empty one scores 0 and stays in its group's normalization (population std), and the reflection update
trains on the reflections that have tokens with those advantages."""

import math

import torch

from seedfast.algo.grsd import reflection_advantages
from seedfast.config import load_config
from seedfast.envs.trajectory import Trajectory
from seedfast.model import DecoderConfig, build_decoder
from seedfast.train import reflection
from seedfast.train.privileged import Reflections, judge_reflections

THREE = "1. went north to the kitchen\n2. opened the fridge first\n3. took the apple and won"
FOUR = THREE + "\n4. never looked in the cellar"
ONE_LINE = "I should have opened the chest earlier."


class RecordingJudge:
    def __init__(self, answers):
        self.answers = answers
        self.asked: list[str] = []

    def score(self, trajectories, reflections):
        assert len(trajectories) == len(reflections)
        self.asked += list(reflections)
        if isinstance(self.answers, Exception):
            raise self.answers
        return self.answers[: len(reflections)]


def _trajectories(n):
    return [Trajectory(task=f"task {i}", game_id=f"g{i}") for i in range(n)]


def test_every_non_empty_reflection_is_judged_as_written_and_an_empty_one_scores_0():
    texts = [THREE, FOUR, ONE_LINE, "", "  \n "]
    judge = RecordingJudge([2, 3, 1])
    scores = judge_reflections(judge, _trajectories(5), texts)
    assert judge.asked == [THREE, FOUR, ONE_LINE]  # not only the 3-point one; the empty ones are not asked
    assert scores == [2.0, 3.0, 1.0, 0.0, 0.0]


def test_no_score_from_the_judge_is_nan_and_an_empty_reflection_still_0():
    assert [str(s) for s in judge_reflections(RecordingJudge([2, None]), _trajectories(3), [THREE, FOUR, ""])] == \
        ["2.0", "nan", "0.0"]
    failed = judge_reflections(RecordingJudge(RuntimeError("judge down")), _trajectories(3), [THREE, "", FOUR])
    assert math.isnan(failed[0]) and failed[1] == 0.0 and math.isnan(failed[2])


def test_an_empty_reflection_counts_in_the_group_normalization():
    # one group: judged 2, 3, 1 and an empty reflection (0): mean 1.5, population variance
    # (0.25 + 2.25 + 0.25 + 2.25) / 4 = 1.25
    scores = judge_reflections(RecordingJudge([2, 3, 1]), _trajectories(4), [THREE, FOUR, ONE_LINE, ""])
    adv = reflection_advantages(torch.tensor(scores), [0, 0, 0, 0], eps=0.0)
    s = math.sqrt(1.25)
    torch.testing.assert_close(adv, torch.tensor([0.5 / s, 1.5 / s, -0.5 / s, -1.5 / s]))


def test_the_update_trains_on_reflections_with_tokens_normalized_over_all(monkeypatch):
    cfg = load_config(None, ["trainer.micro_batch_tokens=4096", "rollout.max_prompt_length=16",
                             "rollout.max_response_tokens=16", "skill.max_skill_tokens=16"])
    model = build_decoder(DecoderConfig(model_type="qwen2", vocab_size=50, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1),
                          dtype=torch.float32, attn_backend="sdpa", seed=0)
    seen = {}
    real = reflection.minibatch_loss_backward

    def recording(policy, batch, *args, **kwargs):
        seen["advantages"] = batch.advantages.clone()
        seen["responses"] = [[int(t) for t in s.response_ids] for s in batch.samples]
        return real(policy, batch, *args, **kwargs)

    monkeypatch.setattr(reflection, "minibatch_loss_backward", recording)
    # group 0: scores 3, 1, and 0 for a reflection that generated no token; group 1: 2, 2 (no variance)
    refl = Reflections(prompt_ids=[[1, 2, 3]] * 5, response_ids=[[4, 5], [6], [], [7, 8], [9]],
                       texts=["a", "b", "", "c", "d"], valid=[True] * 5, scores=[3.0, 1.0, 0.0, 2.0, 2.0])
    out = reflection.reflection_update(cfg, model, torch.optim.SGD(model.parameters(), lr=0.1), refl,
                                       [0, 0, 0, 1, 1])
    assert seen["responses"] == [[4, 5], [6], [7, 8], [9]]
    # group 0: mean 4/3, population std sqrt(((5/3)² + (1/3)² + (4/3)²) / 3) = sqrt(14/9) = 1.2472
    std = math.sqrt(14 / 9)
    a, b = (5 / 3) / std, (-1 / 3) / std
    torch.testing.assert_close(seen["advantages"], torch.tensor([a, a, b, 0.0, 0.0, 0.0]))  # per response token
    assert out["grsd/reflection_loss"] != 0.0
