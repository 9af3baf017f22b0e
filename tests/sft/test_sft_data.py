"""SFT data on real TextWorld games: agent-loop prompts, loss masks, skill copies (the RL teacher's prompt), skill
writing, JSONL."""

import json
import re

import pytest
import torch

from seedfast.context.segments import INSERTION_MODES
from seedfast.context.skill import render_skill, skill_segment
from seedfast.envs.slots import LocalEnvSlots
from seedfast.envs.textworld_env import TextWorldEnv
from seedfast.envs.textworld_games import load_manifest
from seedfast.model import DecoderConfig, build_decoder
from seedfast.model.tokenizer import train_tokenizer
from seedfast.rollout.agent_loop import AgentLoopConfig, Task, run_agent_loop, stop_token_ids
from seedfast.rollout.collect import write_jsonl_atomic
from seedfast.rollout.engine import Generation
from seedfast.rollout.own_engine import Sampler
from seedfast.rollout.prompts import PromptStyle, Turn, build_prompt
from seedfast.sft.examples import (
    action_response_ids,
    bc_examples,
    end_of_turn_id,
    jsonl_examples,
    make_example,
    read_pairs,
    skill_writing_examples,
)
from seedfast.sft.replay import replay_games
from seedfast.sft.run import reader_skills
from seedfast.sft.tokenizer import tokenizer_corpus
from seedfast.skills.analyzers import OracleAnalyzer, SelfAnalyzer, oracle_answer
from seedfast.skills.parse import parse_skill_response
from seedfast.skills.policy_text import chat_prompt_ids
from seedfast.skills.prompts import analyzer_sft_messages

STYLE = PromptStyle(history_k=1)


@pytest.fixture(scope="module")
def tasks(train_games):
    return [Task.from_record(r) for r in load_manifest(train_games, split="train")]


@pytest.fixture(scope="module")
def replays(tasks):
    return replay_games(tasks, seed=0)


@pytest.fixture(scope="module")
def tok(replays):
    return train_tokenizer(tokenizer_corpus(replays, [], STYLE), vocab_size=500)


@pytest.fixture(scope="module")
def successes(replays):
    return [g.success for g in replays]


def by_source(examples, kind):
    return {e.source: e for e in examples if e.kind == kind}


class WalkthroughEngine:
    """Engine double that answers each prompt with its game's walkthrough action, read off the prompt text."""

    def __init__(self, tokenizer, tasks):
        self.tok = tokenizer
        self.plans = {}
        for task in tasks:
            env = TextWorldEnv(task.spec)
            self.plans[env.reset().task] = task.walkthrough
            env.close()

    def generate(self, prompt_token_lists, params):
        out = []
        for ids in prompt_token_lists:
            text = self.tok.decode(ids)
            task = re.search(r"Your task: (.*)\n", text).group(1)
            step = int(re.findall(r"\[Step (\d+)\] Current observation", text)[0])
            action = self.plans[task][step - 1]
            out.append(self.tok.encode(f"<action>{action}</action><|im_end|>", add_special_tokens=False))
        return out

    def generate_full(self, prompt_token_lists, params):
        outputs = self.generate(prompt_token_lists, params)
        return [Generation(ids, None, "stop" if ids and ids[-1] in params.stop_ids else "length") for ids in outputs]


@pytest.mark.parametrize("limit", [None, "tight"])
def test_bc_examples_are_the_agent_loop_prompt_and_response(tok, tasks, successes, limit):
    if limit == "tight":  # every prompt fits without history, none of the step-2 prompts with it
        def length(t, i, history):
            step = t.steps[i]
            prompt = build_prompt(tok, t.task, history, step.observation, step.admissible_actions, i, STYLE)
            return len(prompt.ids)

        limit = max(length(t, i, []) for t in successes for i in range(len(t.steps)))
        with_history = [length(t, 1, [Turn(t.steps[0].observation, t.actions[0])]) for t in successes]
        assert limit < min(with_history)
    config = AgentLoopConfig(n=1, max_steps=4, style=STYLE, max_prompt_tokens=limit)
    with LocalEnvSlots(TextWorldEnv, len(tasks)) as envs:
        result = run_agent_loop(WalkthroughEngine(tok, tasks), tok, tasks, envs, config)
    assert result.stats.won == len(tasks)
    examples = by_source(bc_examples(tok, successes, style=STYLE, max_prompt_tokens=limit), "bc")
    assert len(examples) == len(result.steps) == sum(len(t.walkthrough) for t in tasks)
    for record in result.steps:
        game = result.trajectories[record.trajectory_index].game_id
        example = examples[f"{game} step {record.step_index}"]
        assert example.input_ids == record.prompt_ids + list(record.response_ids)
        assert example.truncated == (limit is not None and record.step_index > 0)
    assert result.stats.prompt_truncations == (0 if limit is None else len(tasks))


def test_answer_ends_with_the_turn_end_that_stops_generation_and_closes_chat_turns(tok):
    eot = end_of_turn_id(tok)
    assert eot in stop_token_ids(tok)
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "X"}]
    rendered = tok.apply_chat_template(chat, tokenize=False)
    after_answer = rendered[rendered.rindex("X") + 1:]
    assert tok.encode(after_answer, add_special_tokens=False)[0] == eot
    assert tok.decode(action_response_ids(tok, "go south")) == "<action>go south</action><|im_end|>"


@pytest.mark.parametrize("prompt_loss", [False, True])
def test_loss_mask_covers_the_answer_and_with_prompt_loss_the_prompt(tok, successes, prompt_loss):
    examples = bc_examples(tok, successes, style=STYLE, prompt_loss=prompt_loss)
    for example, (t, i) in zip(examples, [(s, i) for s in successes for i in range(len(s.steps))]):
        answer = action_response_ids(tok, t.steps[i].action)
        n = len(example.input_ids)
        assert example.input_ids[n - len(answer):] == answer
        if prompt_loss:
            assert example.loss_mask == [False] + [True] * (n - 1)
        else:
            assert example.loss_mask == [False] * (n - len(answer)) + [True] * len(answer)
            targets = [tid for tid, m in zip(example.input_ids, example.loss_mask) if m]
            assert tok.decode(targets) == f"<action>{t.steps[i].action}</action><|im_end|>"


@pytest.mark.parametrize("mode", INSERTION_MODES)
def test_skill_copies_hold_the_skill_the_oracle_analyzer_writes_at_the_insertion_point(tok, successes, mode):
    examples = bc_examples(tok, successes, style=STYLE, skill_insertion=mode, skill_fraction=1.0)
    plain, skilled = by_source(examples, "bc"), by_source(examples, "bc_skill")
    assert plain.keys() == skilled.keys() and len(examples) == 2 * len(plain)
    for t in successes:
        skill = oracle_answer(t)["episode_skill"]  # what analyzer=oracle gives this winner in RL
        assert skill.startswith("Workflow") and " -> ".join(t.actions) in skill
        for i, step in enumerate(t.steps):
            history = [Turn(s.observation, s.action) for s in t.steps[:i]]
            prompt = build_prompt(tok, t.task, history, step.observation, step.admissible_actions, i, STYLE)
            k = prompt.insert_points()[mode]
            inserted = tok.encode(f"Skill: {skill}\n", add_special_tokens=False)
            answer = action_response_ids(tok, step.action)
            example = skilled[f"{t.game_id} step {i}"]
            assert example.input_ids == prompt.ids[:k] + inserted + prompt.ids[k:] + answer
            assert plain[f"{t.game_id} step {i}"].input_ids == prompt.ids + answer
            # the inserted ids are those of the text with the skill inserted: no merge across either boundary
            cut = len(tok.decode(prompt.ids[:k]))
            text = prompt.text[:cut] + f"Skill: {skill}\n" + prompt.text[cut:]
            assert tok.encode(text, add_special_tokens=False) == example.input_ids[: -len(answer)]


@pytest.mark.parametrize("insertion, skill_mode, teacher_mode", [
    ("before_response", "episode_only", "step_priority"), ("after_task", "episode_only", "step_priority"),
    ("after_task", "episode_step", "additive"), ("prepend", "episode_step", "step_priority"),
])
def test_a_skill_copy_is_the_teacher_prompt_rl_scores(tok, tasks, successes, insertion, skill_mode, teacher_mode):
    """The RL path (agent-loop records -> train/batch.build_samples) and SFT's bc_skill copy, on the same steps
    with the same analyzer output: the same teacher prompt, token for token (docs/demo.md)."""
    from seedfast.config import load_config
    from seedfast.train.batch import build_samples
    from seedfast.train.privileged import Privileged

    limit = 1024
    cfg = load_config(None, [f"skill.insertion={insertion}", f"skill.skill_mode={skill_mode}",
                             f"skill.teacher_mode={teacher_mode}", "skill.max_skill_tokens=40",
                             f"rollout.max_prompt_length={limit}"])
    with LocalEnvSlots(TextWorldEnv, len(tasks)) as envs:
        result = run_agent_loop(WalkthroughEngine(tok, tasks), tok, tasks, envs,
                                AgentLoopConfig(n=1, max_steps=4, style=STYLE))
    oracle = OracleAnalyzer(skill_mode).analyze(result.trajectories)
    privileged = Privileged([r.skill if skill_mode != "step_only" else None for r in oracle],
                            [dict(r.step_skills) for r in oracle] if skill_mode != "episode_only" else [])
    samples, _ = build_samples(cfg, result.steps, privileged, tok)
    by_game = {t.game_id: r for t, r in zip(result.trajectories, oracle)}
    copies = {}
    for t in successes:
        copies.update(by_source(bc_examples(tok, [t], style=STYLE, max_prompt_tokens=limit, skill_insertion=insertion,
                                            skill_fraction=1.0, max_skill_tokens=40, skills=[[by_game[t.game_id]]],
                                            skill_mode=skill_mode, teacher_mode=teacher_mode), "bc_skill"))
    assert len(samples) == len(copies) == sum(len(t.steps) for t in successes)
    cut = 0
    for record, sample in zip(result.steps, samples):
        game = result.trajectories[record.trajectory_index].game_id
        copy = copies[f"{game} step {record.step_index}"]
        assert sample.has_teacher
        assert copy.input_ids == sample.teacher_prompt_ids().tolist() + list(record.response_ids)
        cut += len(tok.encode(render_skill(by_game[game].skill), add_special_tokens=False)) > 40
    assert cut, "no skill was long enough to test the max_skill_tokens cut"


def test_skill_copies_read_what_the_analyzer_writes_for_winners_and_losers(tok, replays):
    skills = reader_skills(replays)
    assert [len(s) for s in skills] == [1 + len(g.failures) for g in replays]
    written = {g.game_id: {r.skill for r in s} for g, s in zip(replays, skills)}
    examples = bc_examples(tok, [g.success for g in replays], style=STYLE, skill_insertion="before_response",
                           skill_fraction=1.0, skills=skills, seed=1)
    read = {"winner": 0, "loser": 0}  # a loser's workflow also says where it left the walkthrough (or stopped)
    for example in by_source(examples, "bc_skill").values():
        game, index = example.source.split(" step ")
        step = next(g.success for g in replays if g.game_id == game).steps[int(index)]
        text = tok.decode(example.input_ids)
        inside = [s for s in written[game] if f"Skill: {s}\n" in text]
        assert len(inside) == 1, example.source
        read["loser" if "left the walkthrough" in inside[0] or "never did it" in inside[0] else "winner"] += 1
        assert text.endswith(f"<action>{step.action}</action><|im_end|>")  # the walkthrough's action, always
    assert read["winner"] and read["loser"], read


def test_skill_fraction_picks_that_share_of_steps_reproducibly(tok, successes):
    n = sum(len(t.steps) for t in successes)
    half = bc_examples(tok, successes, style=STYLE, skill_insertion="after_task", skill_fraction=0.5, seed=3)
    assert sum(e.kind == "bc_skill" for e in half) == round(0.5 * n)
    again = bc_examples(tok, successes, style=STYLE, skill_insertion="after_task", skill_fraction=0.5, seed=3)
    assert [e.input_ids for e in half] == [e.input_ids for e in again]
    none = bc_examples(tok, successes, style=STYLE, skill_insertion="after_task", skill_fraction=0.0)
    assert all(e.kind == "bc" for e in none) and len(none) == n
    with pytest.raises(ValueError, match="skill_insertion"):
        bc_examples(tok, successes, style=STYLE, skill_insertion="middle", skill_fraction=0.5)


def test_skill_prompt_fits_the_limit_by_dropping_history_first(tok, successes):
    t = successes[0]
    full = bc_examples(tok, [t], style=STYLE, skill_insertion="before_response", skill_fraction=1.0)
    step2 = by_source(full, "bc_skill")[f"{t.game_id} step 1"]
    answer = len(action_response_ids(tok, t.steps[1].action))
    limit = len(step2.input_ids) - answer - 1  # one token short: the history turn must go, the skill stays
    fitted = bc_examples(tok, [t], style=STYLE, max_prompt_tokens=limit, skill_insertion="before_response",
                         skill_fraction=1.0)
    fitted = by_source(fitted, "bc_skill")[f"{t.game_id} step 1"]
    assert fitted.truncated and len(fitted.input_ids) - answer <= limit
    text = tok.decode(fitted.input_ids)
    assert "[Step 1] Observation" not in text and render_skill(oracle_answer(t)["episode_skill"]) in text


def test_render_and_segment_of_a_skill(tok):
    assert render_skill("  Plan: take key > open chest \n") == "Skill: Plan: take key > open chest\n"
    assert render_skill("go", kind="step") == "Hint for this step: go\n"
    ids = skill_segment(tok, "Plan: go south > take passkey")
    assert ids == tok.encode("Skill: Plan: go south > take passkey\n", add_special_tokens=False)
    cut = skill_segment(tok, "Plan: go south > take passkey", max_tokens=4)
    assert len(cut) == 4 and tok.decode(cut).endswith("\n") and cut[:3] == ids[:3]
    for bad, err in (("  ", ValueError), (3, TypeError)):
        with pytest.raises(err):
            render_skill(bad)


def test_replays_hold_the_walkthrough_win_and_failed_variants(replays, tasks):
    for game, task in zip(replays, tasks):
        assert game.success.won and game.success.actions == task.walkthrough
        assert all(s.valid for s in game.success.steps)
        assert game.failures and not any(f.won for f in game.failures)
        wrong = game.failures[0]
        assert wrong.actions[:-1] == task.walkthrough[: len(wrong.actions) - 1]
        assert wrong.actions[-1] != task.walkthrough[len(wrong.actions) - 1]
        assert wrong.actions[-1] in wrong.steps[-1].admissible_actions
        assert game.failures[-1].actions == task.walkthrough[:-1]  # stopped one action early
    assert [f.actions for g in replay_games(tasks, seed=0) for f in g.failures] == \
           [f.actions for g in replays for f in g.failures]


def test_skill_writing_examples_are_the_self_analyzer_prompt_and_the_oracle_json(tok, replays):
    trajectories = [t for g in replays for t in (g.success, *g.failures)]
    config = DecoderConfig(model_type="qwen3", vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    model = build_decoder(config, dtype=torch.float32, attn_backend="sdpa")
    full = SelfAnalyzer(Sampler(model), tok, max_prompt_tokens=100_000)
    examples, skipped = skill_writing_examples(tok, trajectories)
    assert len(examples) == len(trajectories) and not skipped
    oracle = OracleAnalyzer().analyze(trajectories)
    for example, t, result in zip(examples, trajectories, oracle):
        prompt = full.prompt_ids(t)
        assert example.input_ids[: len(prompt)] == prompt
        answer = example.input_ids[len(prompt):]
        assert example.loss_mask == [False] * len(prompt) + [True] * len(answer)
        assert answer[-1] == end_of_turn_id(tok)
        parsed = parse_skill_response(tok.decode(answer[:-1]), task=t.task, n_steps=len(t.steps))
        assert parsed.valid and parsed.skill == result.skill
        assert parsed.skill.startswith("Workflow")  # winners' and losers' alike
    # a budget that only the shortest prompt shape meets: the same shape the self analyzer falls back to
    t = trajectories[0]
    budget = len(full.prompt_ids(t)) - 1
    short = SelfAnalyzer(Sampler(model), tok, max_prompt_tokens=budget)
    fitted, _ = skill_writing_examples(tok, [t], max_prompt_tokens=budget)
    if short.prompt_ids(t) is None:
        assert not fitted
    else:
        assert fitted[0].input_ids[: len(short.prompt_ids(t))] == short.prompt_ids(t)
    none, skipped = skill_writing_examples(tok, [t], max_prompt_tokens=10)
    assert not none and skipped == {"prompt_too_long": 1}


def test_jsonl_pairs_in_collect_format_and_answer_format(tok, replays, tmp_path):
    t = replays[0].success
    result = OracleAnalyzer().analyze([t])[0]
    messages = analyzer_sft_messages(t, result)
    path = tmp_path / "skill_sft.jsonl"
    write_jsonl_atomic(path, [{"messages": messages, "game_id": t.game_id, "won": True},
                              {"messages": messages[:-1], "answer": "A short answer."}])
    path.write_text(path.read_text() + "\n")  # a blank line is skipped
    first, second = jsonl_examples(tok, path)
    prompt = chat_prompt_ids(tok, messages[:-1])
    for example, answer in ((first, messages[-1]["content"]), (second, "A short answer.")):
        assert example.kind == "jsonl" and example.input_ids[: len(prompt)] == prompt
        assert tok.decode(example.input_ids[len(prompt):]) == answer + "<|im_end|>"
        assert example.loss_mask == [False] * len(prompt) + [True] * (len(example.input_ids) - len(prompt))
    assert first.source == "skill_sft.jsonl:1" and second.source == "skill_sft.jsonl:2"

    cut = jsonl_examples(tok, path, max_prompt_tokens=20)[1]
    answer = tok.encode("A short answer.", add_special_tokens=False) + [end_of_turn_id(tok)]
    assert cut.truncated and cut.input_ids == prompt[-20:] + answer


@pytest.mark.parametrize("line, message", [
    ("{not json", r"bad\.jsonl:2: not valid JSON"),
    ('{"messages": "hi"}', r"bad\.jsonl:2: expected an object with a 'messages' list"),
    ('{"messages": [{"role": "user", "content": "q"}]}', r"bad\.jsonl:2: without an 'answer' key"),
    ('{"messages": [{"role": "user", "content": "q"}], "answer": " "}', r"bad\.jsonl:2: the answer is empty"),
    ('{"messages": [{"role": "user"}], "answer": "a"}', r"bad\.jsonl:2: messages\[0\]"),
    ('{"messages": [{"role": "assistant", "content": "a"}]}', r"bad\.jsonl:2: the prompt messages must end"),
])
def test_bad_jsonl_lines_are_named(tmp_path, line, message):
    good = json.dumps({"messages": [{"role": "user", "content": "q"}], "answer": "a"})
    path = tmp_path / "bad.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(ValueError, match=message):
        read_pairs(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_pairs(tmp_path / "missing.jsonl")


def test_make_example_truncates_the_prompt_from_the_left_never_the_answer():
    example = make_example(list(range(10)), [50, 51], kind="jsonl", source="x", max_prompt_tokens=4)
    assert example.input_ids == [6, 7, 8, 9, 50, 51] and example.truncated
    assert example.loss_mask == [False, False, False, False, True, True]
    whole = make_example([1, 2], [3], kind="bc", source="y", prompt_loss=True, max_prompt_tokens=4)
    assert whole.loss_mask == [False, True, True] and not whole.truncated
    with pytest.raises(ValueError, match="'z': the answer is empty"):
        make_example([1], [], kind="bc", source="z")
    with pytest.raises(ValueError, match="kind"):
        make_example([1], [2], kind="other", source="w")


def test_prompt_tokens_weigh_prompt_loss_weight_in_the_sft_loss():
    from seedfast.sft.loop import batch_loss, pack

    ex = make_example([1, 2, 3], [4, 5], kind="bc", source="s", prompt_loss=True)
    assert ex.answer_start == 3 and ex.loss_mask == [False, True, True, True, True]
    batch = pack([ex], "cpu")
    assert batch.row_is_answer.tolist() == [False, False, True, True]
    logprob = torch.tensor([-1.0, -2.0, -3.0, -5.0])
    assert float(batch_loss(logprob, batch)) == pytest.approx(11 / 4)
    assert float(batch_loss(logprob, batch, 0.5)) == pytest.approx((0.5 * 3 + 8) / 3)
