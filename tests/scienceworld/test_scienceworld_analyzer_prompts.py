"""The self and external analyzers' prompt for a ScienceWorld trajectory played by the agent loop against the real
simulator (a gold sequence of a short task under 'easy'): ScienceWorld's words (the task description, the score's
progress from the step infos, the action templates the agent's prompt names), not TextWorld's; TextWorld's own is
pinned byte for byte in tests/skills/test_skills_world_prompts.py."""

import json
import re

import pytest

from seedfast.envs.scienceworld_env import (
    ACTION_TEMPLATES,
    INSTRUCTIONS,
    SYSTEM_PROMPT,
    ScienceWorldFactory,
    gold_sequences,
)
from seedfast.envs.slots import LocalEnvSlots
from seedfast.rollout.agent_loop import AgentLoopConfig, Task, run_agent_loop
from seedfast.rollout.engine import Generation
from seedfast.rollout.prompts import PromptStyle
from seedfast.skills import ChatClient, ExternalAnalyzer, SelfAnalyzer, build_analyzer_messages
from seedfast.skills.prompts import SYSTEM_PROMPT as TEXTWORLD_SYSTEM
from seedfast.skills.prompts import score_line
from tests.scienceworld.helpers import SHORT
from tests.skills.skills_helpers import ChatServer, make_chat_tokenizer

ANSWER = json.dumps({"episode_summary": "Mixed the paints and focused on the result.",
                     "episode_skill": "Find the primary colours, mix them in one container, then focus on it."})


class GoldEngine:
    """Answers each step's prompt with the gold sequence's action of that step, and records what it is asked."""

    def __init__(self, tokenizer, gold):
        self.tokenizer, self.gold, self.prompts = tokenizer, gold, []

    def _answer(self, ids, stop):
        self.prompts.append(list(ids))
        text = self.tokenizer.decode(ids)
        steps = re.findall(r"\[Step (\d+)\] Current observation", text)
        reply = f"<action>{self.gold[int(steps[0]) - 1]}</action>" if steps else ANSWER
        return self.tokenizer.encode(reply, add_special_tokens=False) + [stop]

    def generate(self, prompt_token_lists, params):
        return [self._answer(ids, params.stop_ids[0]) for ids in prompt_token_lists]

    def generate_full(self, prompt_token_lists, params):
        return [Generation(ids, None, "stop") for ids in self.generate(prompt_token_lists, params)]


@pytest.fixture(scope="module")
def tokenizer():
    return make_chat_tokenizer()


@pytest.fixture(scope="module")
def played(tokenizer):
    (gold,) = gold_sequences([SHORT]).values()
    config = AgentLoopConfig(n=1, max_steps=len(gold), max_new_tokens=64, world="scienceworld",
                             style=PromptStyle(system=SYSTEM_PROMPT, instructions=INSTRUCTIONS, history_k=1,
                                               show_admissible=False))
    with LocalEnvSlots(ScienceWorldFactory(step_limit=len(gold)), 1) as envs:
        (trajectory,) = run_agent_loop(GoldEngine(tokenizer, gold), tokenizer, [Task(str(SHORT), SHORT)], envs,
                                       config).trajectories
    return trajectory


def check_scienceworlds_words(messages, trajectory):
    system, user = messages[0]["content"], messages[1]["content"]
    assert trajectory.task and f"Task: {trajectory.task}" in user  # the simulator's task description
    assert score_line(trajectory.meta["scores"]) in user and "final score 100" in user
    assert ACTION_TEMPLATES in user  # the agent prompt's own templates
    assert "ScienceWorld" in system and system != TEXTWORLD_SYSTEM
    assert "text-game" not in system and "fridge" not in user  # TextWorld's words
    assert '"episode_summary"' in user and '"step_skills"' in user  # the format the parser reads


def test_the_agent_loop_records_the_world_and_the_score(played):
    assert played.won and played.error is None and played.meta["world"] == "scienceworld"
    scores = played.meta["scores"]
    assert len(scores) == len(played.steps) and scores[-1] == 100 and scores == sorted(scores)
    assert len(set(scores)) > 2  # the score rose in stages on the way


def test_the_self_analyzer_asks_in_scienceworlds_words(played, tokenizer):
    engine = GoldEngine(tokenizer, [])
    [result] = SelfAnalyzer(engine, tokenizer, skill_mode="episode_step", max_prompt_tokens=100_000).analyze([played])
    assert result.valid and result.skill == json.loads(ANSWER)["episode_skill"]
    [prompt] = engine.prompts
    messages = build_analyzer_messages(played, "episode_step")
    assert tokenizer.decode(prompt) == tokenizer.apply_chat_template(messages, tokenize=False,
                                                                      add_generation_prompt=True)
    check_scienceworlds_words(messages, played)


def test_the_external_analyzer_sends_the_same(played):
    with ChatServer([("ok", ANSWER)]) as server:
        client = ChatClient(base_url=server.base_url, model="analyst-1", timeout_s=5.0, max_retries=0)
        [result] = ExternalAnalyzer(client, skill_mode="episode_step").analyze([played])
    assert result.valid
    [request] = server.requests
    assert request["json"]["messages"] == build_analyzer_messages(played, "episode_step")
    check_scienceworlds_words(request["json"]["messages"], played)
