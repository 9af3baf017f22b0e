"""Teaching data from ScienceWorld's gold sequences: SFT's walkthrough replays (each won, with failed variants), the
oracle analyzer's skills from them, and SmolLM2's behaviour-cloning and skill-writing examples in ScienceWorld's
prompt (the action templates, not a thousand admissible actions)."""

from pathlib import Path

import pytest

from seedfast.config import load_config
from seedfast.envs.scienceworld_env import ACTION_TEMPLATES, INSTRUCTIONS, split_table
from seedfast.sft.run import sft_examples, walkthrough_replays
from seedfast.skills.analyzers import OracleAnalyzer
from seedfast.skills.prompts import build_analyzer_messages, score_line

SMOLLM2 = Path(__file__).resolve().parents[2] / ".cache" / "models" / "smollm2-135m-instruct"
TASKS = ("lifespan-longest-lived", "find-non-living-thing")


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return load_config(None, ["env.kind=scienceworld", f"env.scienceworld.tasks=[{', '.join(TASKS)}]",
                              f"env.games_dir={tmp_path_factory.mktemp('sw')}", "env.n_train=2", "env.max_steps=30",
                              "env.history_k=1",
                              "rollout.max_prompt_length=1024", "skill.skill_mode=episode_step",
                              "sft.behaviour_cloning=true", "sft.skill_augment=true", "sft.skill_writing_fraction=1.0",
                              f"model.path={SMOLLM2}"])


@pytest.fixture(scope="module")
def replays(cfg):
    return walkthrough_replays(cfg)


def test_gold_sequences_replay_to_wins_with_failed_variants(replays):
    assert len(replays) == 4
    for game in replays:
        task, rest = game.game_id.split("/")
        assert int(rest.split("[")[0]) in split_table()[task]["train"]
        success = game.success
        assert success.won and success.walkthrough and all(s.valid for s in success.steps)
        assert [s.action for s in success.steps] == success.walkthrough[: len(success.steps)]
        assert game.failures and not any(f.won for f in game.failures)


def test_the_oracle_writes_skills_from_the_gold_sequence(replays):
    game = replays[0]
    won, *lost = OracleAnalyzer("episode_step").analyze([game.success, *game.failures])
    assert won.valid and all(r.valid for r in lost)
    focus = next(a for a in game.success.walkthrough if a.startswith("focus on"))
    assert focus in won.skill  # the workflow names the gold sequence's decisive action
    assert any(focus in r.skill or "left the walkthrough" in r.skill for r in lost)


def test_skill_writing_asks_in_scienceworlds_words(replays):
    for trajectory in (replays[0].success, *replays[0].failures):
        assert trajectory.meta["world"] == "scienceworld" and len(trajectory.meta["scores"]) == len(trajectory.steps)
        user = build_analyzer_messages(trajectory, "episode_step")[1]["content"]
        assert score_line(trajectory.meta["scores"]) in user and ACTION_TEMPLATES in user
    assert replays[0].success.meta["scores"][-1] == 100


@pytest.mark.skipif(not SMOLLM2.is_dir(), reason=f"{SMOLLM2} is absent: `seedfast models fetch smollm2-135m`")
def test_smollm2_examples_use_scienceworlds_prompt(cfg, replays):
    from seedfast.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(SMOLLM2)
    examples, counts = sft_examples(cfg, tokenizer, replays, None)
    bc = [e for e in examples if e.kind != "skill"]
    assert bc and counts["examples/skill"] > 0
    assert len(bc) >= sum(len(g.success.steps) for g in replays)
    prompt = tokenizer.decode(bc[0].input_ids[: bc[0].answer_start])
    assert "ScienceWorld" in prompt and INSTRUCTIONS.split(".")[0] in prompt and "Admissible actions:" not in prompt
    assert not any(e.truncated for e in bc), "a behaviour-cloning prompt did not fit rollout.max_prompt_length"
    answer = tokenizer.decode(bc[0].input_ids[bc[0].answer_start:])
    assert f"<action>{replays[0].success.steps[0].action}</action>" in answer


def test_a_gold_sequence_longer_than_an_episode_is_replayed_whole(tmp_path):
    cfg = load_config(None, ["env.kind=scienceworld", "env.scienceworld.tasks=[lifespan-longest-lived]",
                             f"env.games_dir={tmp_path}", "env.n_train=1", "env.max_steps=2"])
    (game,) = walkthrough_replays(cfg)
    assert game.success.won and len(game.success.steps) > cfg.env.max_steps
