"""Oracle and self analyzers (the external one has its own file)."""

import json

import pytest

from seedfast.skills import (
    ExternalAnalyzer,
    OracleAnalyzer,
    SelfAnalyzer,
    build_analyzer_messages,
    make_analyzer,
    oracle_answer,
)
from seedfast.skills.analyzers import on_walkthrough_path
from seedfast.skills.policy_text import chat_prompt_ids, default_stop_ids, generate_completions
from tests.skills.skills_helpers import make_chat_tokenizer, trajectory

GOOD = json.dumps({"episode_summary": "Went south, took the passkey.",
                   "episode_skill": "Follow each direction of the objective in order, then take the object."})


# ---- oracle ---------------------------------------------------------------------------------------

def test_oracle_success_is_the_walkthrough_path_as_a_workflow_never_a_detour():
    traj = trajectory(["look", "go south", "look", "take passkey"], won=True)
    [result] = OracleAnalyzer(skill_mode="episode_step").analyze([traj])
    assert result.valid and "command each: go south -> take passkey." in result.skill
    assert result.summary == "The agent solved the task in 4 steps."
    # the detours ('look', twice) get no step skill: only the steps that advanced the walkthrough
    assert result.step_skills == {1: "Do 'go south' now.", 3: "Do 'take passkey' now."}


def test_oracle_success_by_another_route_keeps_its_valid_actions_as_the_workflow():
    traj = trajectory(["go north", "take passkey"], won=True, valid=[True, True])
    [result] = OracleAnalyzer(skill_mode="episode_step").analyze([traj])
    assert "command each: go north -> take passkey." in result.skill
    assert result.step_skills == {}  # neither step is the walkthrough's next action: none is endorsed


def test_on_walkthrough_path_follows_the_next_undone_action():
    walk = ["go south", "take passkey", "unlock chest"]
    assert on_walkthrough_path(["go south", "Go  South", "take passkey", "look", "unlock chest"], walk) == \
        [True, False, True, False, True]
    assert on_walkthrough_path(["take passkey", "go south"], walk) == [False, True]
    assert on_walkthrough_path([], walk) == []


def test_oracle_failure_credits_the_right_steps_and_never_quotes_the_wrong_command():
    traj = trajectory(["go south", "take key", "look"], won=False)
    [result] = OracleAnalyzer(skill_mode="episode_step").analyze([traj])
    assert result.valid
    assert result.skill == ("Workflow: carry out the objective's instructions in the order they are given, one "
                            "admissible command each: go south -> take passkey. At step 1 do 'take passkey': the "
                            "agent left the walkthrough there.")
    assert result.summary == ("The agent failed: at step 1 the right action was 'take passkey'; its command was "
                              "not in the objective.")
    # the right step before the deviation is credited, the deviation gets the walkthrough's action, nothing after
    assert result.step_skills == {0: "Do 'go south' now.", 1: "Do 'take passkey' now."}
    assert "take key" not in result.skill + result.summary + "".join(result.step_skills.values())


def test_oracle_failure_with_an_invalid_action_says_so():
    traj = trajectory(["Go South", "dance"], won=False, valid=[True, False])  # case does not count as deviation
    answer = oracle_answer(traj, with_step_skills=True)
    assert answer["episode_summary"].endswith("at step 1 the right action was 'take passkey'; its command was not "
                                              "admissible.")
    assert answer["step_skills"] == {"0": "Do 'go south' now.", "1": "Do 'take passkey' now."}
    assert "dance" not in json.dumps(answer)


def test_oracle_failure_without_deviation_is_stopping_early():
    traj = trajectory(["go south"], won=False)
    [result] = OracleAnalyzer().analyze([traj])
    assert result.valid and result.skill.endswith("After 1 correct steps do 'take passkey': the agent never did it.")
    assert result.step_skills == {}  # episode_only
    answer = oracle_answer(traj, with_step_skills=True)
    assert answer["step_skills"] == {"0": "Do 'go south' now."}


def test_oracle_needs_a_walkthrough():
    [result] = OracleAnalyzer().analyze([trajectory(["go south"], won=False, walkthrough=None)])
    assert (result.valid, result.reason) == (False, "no_walkthrough")
    with pytest.raises(ValueError, match="walkthrough"):
        oracle_answer(trajectory(["go south"], won=False, walkthrough=None))


def test_analyzers_check_their_input():
    with pytest.raises(TypeError, match=r"trajectories\[1\]"):
        OracleAnalyzer().analyze([trajectory([], won=False), {"task": "t"}])


# ---- self: a real chat tokenizer and an engine that answers from a script ------------------------------

class ScriptedEngine:
    """The generation-engine protocol, answering each prompt with the tokens of a fixed text + stop."""

    def __init__(self, tokenizer, texts, extra_after_stop="garbage"):
        self.tokenizer, self.texts, self.extra = tokenizer, list(texts), extra_after_stop
        self.calls = []

    def generate(self, prompt_token_lists, params):
        stop_ids = list(params.stop_ids)
        self.calls.append(dict(prompts=prompt_token_lists, max_new_tokens=params.max_new_tokens,
                               temperature=params.temperature, top_p=params.top_p, stop_ids=stop_ids))
        out = []
        for _ in prompt_token_lists:
            ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
            out.append(ids + [stop_ids[0]] + self.tokenizer.encode(self.extra, add_special_tokens=False))
        return out


@pytest.fixture(scope="module")
def tokenizer():
    return make_chat_tokenizer()


def test_self_analyzer_sends_the_chat_prompt_greedy_and_parses(tokenizer):
    trajs = [trajectory(["go south", "take passkey"], won=True), trajectory(["go north"], won=False)]
    engine = ScriptedEngine(tokenizer, [GOOD, "I cannot tell."])
    results = SelfAnalyzer(engine, tokenizer, max_new_tokens=64).analyze(trajs)
    [call] = engine.calls
    assert call["prompts"] == [chat_prompt_ids(tokenizer, build_analyzer_messages(t)) for t in trajs]
    assert (call["temperature"], call["top_p"], call["max_new_tokens"]) == (0.0, 1.0, 64)
    stops = default_stop_ids(tokenizer)
    assert call["stop_ids"] == stops and tokenizer.convert_tokens_to_ids("<|im_end|>") in stops
    assert results[0].valid and results[0].raw == GOOD  # text after the stop token is cut
    assert results[0].skill == json.loads(GOOD)["episode_skill"]
    assert (results[1].valid, results[1].reason) == (False, "no_json")


def test_completions_keep_the_generated_ids_up_to_the_stop(tokenizer):
    engine = ScriptedEngine(tokenizer, ["1. Go south first."], extra_after_stop="never seen")
    prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": "Reflect."}])
    [completion] = generate_completions(engine, tokenizer, [prompt], 32, temperature=1.0, top_p=0.9)
    stop = default_stop_ids(tokenizer)[0]
    assert completion.prompt_ids == prompt
    assert completion.completion_ids == tokenizer.encode("1. Go south first.", add_special_tokens=False) + [stop]
    assert completion.text == "1. Go south first."
    assert (engine.calls[0]["temperature"], engine.calls[0]["top_p"]) == (1.0, 0.9)


def test_chat_prompt_ids_are_the_template_rendered_then_encoded(tokenizer):
    messages = build_analyzer_messages(trajectory(["go south"], won=False))
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    assert chat_prompt_ids(tokenizer, messages) == tokenizer.encode(text, add_special_tokens=False)


def test_self_analyzer_shortens_long_prompts_and_reports_what_cannot_fit(tokenizer):
    long_traj = trajectory([f"go {i}" for i in range(40)], won=False, valid=[True] * 40)
    full = len(chat_prompt_ids(tokenizer, build_analyzer_messages(long_traj)))
    short_budget = len(chat_prompt_ids(tokenizer, build_analyzer_messages(long_traj, max_steps=8,
                                                                             max_observation_chars=120)))
    engine = ScriptedEngine(tokenizer, [GOOD, GOOD])
    analyzer = SelfAnalyzer(engine, tokenizer, max_prompt_tokens=short_budget)
    assert short_budget < full
    results = analyzer.analyze([long_traj, trajectory(["go south"] * 3, won=False)])
    assert len(engine.calls[0]["prompts"]) == 2 and len(engine.calls[0]["prompts"][0]) == short_budget
    tiny = SelfAnalyzer(ScriptedEngine(tokenizer, []), tokenizer, max_prompt_tokens=20)
    assert [r.reason for r in tiny.analyze([long_traj])] == ["prompt_too_long"]
    assert results[0].valid


def test_self_analyzer_checks_its_collaborators(tokenizer):
    with pytest.raises(TypeError, match="engine"):
        SelfAnalyzer(object(), tokenizer)
    with pytest.raises(TypeError, match="tokenizer"):
        SelfAnalyzer(ScriptedEngine(tokenizer, []), object())


def test_make_analyzer(tokenizer):
    assert isinstance(make_analyzer("oracle"), OracleAnalyzer)
    assert isinstance(make_analyzer("self", engine=ScriptedEngine(tokenizer, []), tokenizer=tokenizer), SelfAnalyzer)
    external = make_analyzer("external", base_url="http://127.0.0.1:9/v1", model="m", skill_mode="episode_step")
    assert isinstance(external, ExternalAnalyzer) and external.skill_mode == "episode_step"
    with pytest.raises(ValueError, match="analyzer kind"):
        make_analyzer("teacher")


def test_self_analyzer_samples_at_the_temperature_it_is_given(tokenizer):
    engine = ScriptedEngine(tokenizer, [GOOD])
    SelfAnalyzer(engine, tokenizer, max_new_tokens=64, temperature=0.7).analyze([trajectory(["go south"], won=True)])
    assert engine.calls[0]["temperature"] == 0.7
    with pytest.raises(ValueError, match="temperature"):
        SelfAnalyzer(engine, tokenizer, temperature=-1.0)


def test_the_seed_skills_of_a_run_use_skill_analysis_temperature(tokenizer):
    from seedfast.config import load_config
    from seedfast.train.privileged import WriterContext, seed_skills

    cfg = load_config(None, ["skill.analyzer=self", "skill.analysis_temperature=0.6"])
    engine = ScriptedEngine(tokenizer, [GOOD])
    privileged = seed_skills(WriterContext(cfg, engine, tokenizer), [trajectory(["go south"], won=True)])
    assert engine.calls[0]["temperature"] == 0.6 and privileged.metrics["skill/parse_rate"] == 1.0


def test_self_analyzer_tokenizes_a_repeated_trajectory_once(tokenizer, monkeypatch):
    same = [trajectory(["go south", "take passkey"], won=True) for _ in range(3)]  # a group acting alike
    trajs = [*same, trajectory(["go north"], won=False)]
    rendered = []
    template = tokenizer.apply_chat_template

    def counting_template(messages, **kwargs):
        rendered.append(messages)
        return template(messages, **kwargs)

    monkeypatch.setattr(tokenizer, "apply_chat_template", counting_template)
    engine = ScriptedEngine(tokenizer, [GOOD, GOOD, GOOD, "I cannot tell."])
    results = SelfAnalyzer(engine, tokenizer, max_new_tokens=64).analyze(trajs)
    assert len(rendered) == 2  # the distinct prompts
    assert engine.calls[0]["prompts"][:3] == [engine.calls[0]["prompts"][0]] * 3
    assert [r.valid for r in results] == [True, True, True, False]
