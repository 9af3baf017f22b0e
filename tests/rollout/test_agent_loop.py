"""The agent loop on real TextWorld games: scripted engines for exact outcomes, the tiny decoder for tokens."""

import re

import pytest
import torch

from seedfast.context.segments import INSERTION_MODES
from seedfast.envs.slots import LocalEnvSlots, PoolEnvSlots
from seedfast.envs.textworld_env import TextWorldEnv
from seedfast.envs.workers import EnvPool
from seedfast.rollout.agent_loop import AgentLoopConfig, Task, run_agent_loop, stop_token_ids
from seedfast.rollout.engine import Generation
from seedfast.rollout.own_engine import Sampler
from seedfast.rollout.prompts import DEFAULT_SYSTEM, UNPARSABLE_FEEDBACK, PromptStyle


class ScriptedEngine:
    """Engine protocol double: answers from the prompt text (the game's task and the step number)."""

    def __init__(self, tokenizer, answer):
        self.tokenizer, self.answer, self.calls, self.outputs = tokenizer, answer, 0, []

    def generate(self, prompt_token_lists, params):
        self.calls += 1
        out = []
        for ids in prompt_token_lists:
            text = self.tokenizer.decode(ids)
            task = re.search(r"Your task: (.*)\n", text).group(1)
            step = int(re.findall(r"\[Step (\d+)\] Current observation", text)[0])
            out.append(self.tokenizer.encode(self.answer(task, step), add_special_tokens=False) + [params.stop_ids[0]])
        self.outputs += out
        return out

    def generate_full(self, prompt_token_lists, params):
        outputs = self.generate(prompt_token_lists, params)
        return [Generation(ids, None, "stop" if ids and ids[-1] in params.stop_ids else "length") for ids in outputs]


def walkthrough_answer(games, n_invalid=0):
    plans = {g.objective.strip(): g.walkthrough for g in games}

    def answer(task, step):
        if step <= n_invalid:
            return "<think>try something</think><action>dance wildly</action>"
        return f"<think>follow the plan</think><action>{plans[task][step - 1 - n_invalid]}</action>"

    return answer


@pytest.fixture()
def tasks(games):
    return [Task.from_record(g) for g in games]


def run_local(engine, tokenizer, tasks, config, n_slots=None):
    with LocalEnvSlots(TextWorldEnv, n_slots or len(tasks) * config.n) as envs:
        return run_agent_loop(engine, tokenizer, tasks, envs, config)


def test_walkthrough_policy_wins_every_episode_with_outcome_reward(games, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, walkthrough_answer(games))
    config = AgentLoopConfig(n=3, max_steps=5)
    result = run_local(engine, tokenizer, tasks, config)
    assert len(result.trajectories) == 6 and result.stats.won == 6 and result.stats.invalid_actions == 0
    longest = max(len(g.walkthrough) for g in games)
    assert engine.calls == longest  # one batched generate per lockstep step
    for index, trajectory in enumerate(result.trajectories):
        game = games[index // 3]
        assert trajectory.won and trajectory.error is None and trajectory.game_id == game.id
        assert trajectory.actions == game.walkthrough
        assert trajectory.task == game.objective.strip()
        steps = result.steps_of(index)
        assert [s.step_index for s in steps] == list(range(len(game.walkthrough)))
        assert all(s.reward == 1.0 and s.group_id == index // 3 and s.valid and s.parsed for s in steps)
        assert [s.reward for s in trajectory.steps] == [1.0] * len(steps)
    assert sorted(list(s.response_ids) for s in result.steps) == sorted(engine.outputs)
    assert all(s.response_logprobs is None and s.finish_reason == "stop" for s in result.steps)


def test_invalid_actions_are_penalized_per_step(games, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, walkthrough_answer(games, n_invalid=1))
    config = AgentLoopConfig(n=2, max_steps=5, invalid_penalty=0.5)
    result = run_local(engine, tokenizer, tasks, config)
    assert result.stats.won == 4 and result.stats.invalid_actions == 4 and result.stats.unparsable == 0
    for index, trajectory in enumerate(result.trajectories):
        rewards = [s.reward for s in result.steps_of(index)]
        assert rewards == [0.5] + [1.0] * len(games[index // 2].walkthrough)
        assert [s.penalty for s in result.steps_of(index)] == [0.5] + [0.0] * len(games[index // 2].walkthrough)
        assert trajectory.n_invalid == 1 and trajectory.steps[0].action == "dance wildly"


def test_nonsense_actions_truncate_at_max_steps(tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, lambda task, step: "<action>dance wildly</action>")
    result = run_local(engine, tokenizer, tasks, AgentLoopConfig(n=2, max_steps=3))
    stats = result.stats
    assert (stats.won, stats.truncated, stats.steps, stats.invalid_actions) == (0, 4, 12, 12)
    assert all(s.reward == pytest.approx(-0.1) for s in result.steps)
    assert all(t.meta.get("truncated") for t in result.trajectories)


def test_unparsable_response_does_not_step_the_env(tasks, tokenizer):
    seen = []

    def answer(task, step):
        seen.append(step)
        return "I will go south" if step == 1 else "<action>look</action>"

    engine = ScriptedEngine(tokenizer, answer)
    result = run_local(engine, tokenizer, tasks[:1], AgentLoopConfig(n=1, max_steps=2))
    assert result.stats.unparsable == 1 and result.stats.invalid_actions == 1
    first, second = result.steps
    assert not first.parsed and not first.valid and second.parsed and second.valid
    text = tokenizer.decode(second.prompt_ids)
    assert f"Current observation: {UNPARSABLE_FEEDBACK}" in text and "Action: (no action)" in text


class _BrokenEnv:
    """Crashes on its second step: the loop must end that trajectory as an error and go on."""

    def __init__(self, path):
        self.env, self.steps = TextWorldEnv(path), 0

    def reset(self):
        return self.env.reset()

    def step(self, action):
        self.steps += 1
        if self.steps == 2:
            raise RuntimeError("the game engine fell over")
        return self.env.step(action)

    def close(self):
        self.env.close()


def test_more_episodes_than_slots_run_in_waves(games, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, walkthrough_answer(games))
    config = AgentLoopConfig(n=3, max_steps=5)
    result = run_local(engine, tokenizer, tasks, config, n_slots=4)  # 6 episodes: waves of 4 and 2
    assert result.stats.won == 6 and [t.game_id for t in result.trajectories] == [g.id for g in games for _ in "abc"]
    assert [t.meta["trajectory_index"] for t in result.trajectories] == list(range(6))
    assert sorted({s.trajectory_index for s in result.steps}) == list(range(6))
    assert engine.calls == 2 * max(len(g.walkthrough) for g in games)  # each wave steps in lockstep


def test_environment_errors_end_the_trajectory_and_are_counted(tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, lambda task, step: "<action>look</action>")
    with LocalEnvSlots(_BrokenEnv, 2) as envs:
        result = run_agent_loop(engine, tokenizer, tasks, envs, AgentLoopConfig(n=1, max_steps=4))
    assert result.stats.env_errors == 2
    for trajectory in result.trajectories:
        assert not trajectory.won and "fell over" in trajectory.error and len(trajectory.steps) == 2


def test_prompt_truncation_drops_history_then_raises(tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, lambda task, step: "<action>look</action>")
    full = run_local(engine, tokenizer, tasks[:1], AgentLoopConfig(n=1, max_steps=4))
    lengths = [len(s.prompt_ids) for s in full.steps]
    limit = lengths[1]  # step 1 has one turn of history; later steps must drop some to fit
    cut = run_local(engine, tokenizer, tasks[:1], AgentLoopConfig(n=1, max_steps=4, max_prompt_tokens=limit))
    assert cut.stats.prompt_truncations >= 1
    assert all(len(s.prompt_ids) <= limit for s in cut.steps)
    with pytest.raises(ValueError, match="treasure_hunter-L1-0.*max_prompt_tokens=10"):
        run_local(engine, tokenizer, tasks[:1], AgentLoopConfig(n=1, max_steps=2, max_prompt_tokens=10))


def _user_content(text):
    return text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


def test_tiny_decoder_rollout_through_the_worker_pool_gives_scorer_ready_samples(tasks, tokenizer, policy):
    config = AgentLoopConfig(n=2, max_steps=3, max_new_tokens=6, temperature=1.0, style=PromptStyle(history_k=1))
    sampler = Sampler(policy, seed=0)
    with EnvPool(4, step_timeout=60) as pool:
        result = run_agent_loop(sampler, tokenizer, tasks, PoolEnvSlots(pool), config)
    assert len(result.trajectories) == 4 and result.stats.steps == len(result.steps) > 0
    assert [t.meta["group_id"] for t in result.trajectories] == [0, 0, 1, 1]
    stops = set(stop_token_ids(tokenizer))
    skill = tokenizer.encode("Skill: go south, then take the passkey.\n", add_special_tokens=False)
    for record in result.steps:
        trajectory = result.trajectories[record.trajectory_index]
        step = trajectory.steps[record.step_index]
        prompt = record.prompt_ids
        text = tokenizer.decode(prompt)
        # the prompt is exactly the chat template applied to the whole text
        messages = [{"role": "system", "content": DEFAULT_SYSTEM}, {"role": "user", "content": _user_content(text)}]
        assert prompt == tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        assert f"Your task: {trajectory.task}\n" in text and step.observation.strip() in text
        # the response is kept exactly as generated, with its sampling log-probs
        assert list(record.response_ids) == step.response_ids
        assert len(record.response_logprobs) == len(step.response_ids)
        assert all(lp <= 0 for lp in record.response_logprobs)
        assert record.finish_reason == ("stop" if record.response_ids[-1] in stops else "length")
        # insertion points sit on the documented boundaries
        points = record.insert_points()
        assert points["prepend"] == 0
        assert tokenizer.decode(prompt[: points["after_task"]]).endswith(f"Your task: {trajectory.task}\n")
        assert tokenizer.decode(prompt[points["before_response"] :]).startswith("Now it's your turn.")
        for mode in INSERTION_MODES:
            sample, dropped = record.to_sample([(mode, skill)])
            k = points[mode]
            assert dropped == 0 and sample.insert_at == k
            assert sample.teacher_prompt_ids().tolist() == prompt[:k] + skill + prompt[k:]
            assert sample.prompt_ids.tolist() == prompt and sample.response_ids.tolist() == list(record.response_ids)
            assert sample.reward == record.reward and sample.group_id == record.group_id
            assert sample.penalty == record.penalty
            torch.testing.assert_close(sample.meta["rollout_logprobs"], torch.tensor(record.response_logprobs))
