"""`seedfast collect` end to end on real games: rollout, analyzer labels, JSONL pairs and parse statistics."""

import json
from pathlib import Path

import pytest

from seedfast.app.collect import main
from seedfast.config import load_config
from seedfast.envs.slots import LocalEnvSlots
from seedfast.envs.textworld_env import TextWorldEnv
from seedfast.envs.trajectory import Trajectory
from seedfast.model import save_hf
from seedfast.model.tokenizer import save_tokenizer
from seedfast.rollout.agent_loop import AgentLoopConfig, Task
from seedfast.rollout.collect import collect_skill_data
from seedfast.rollout.engine import Generation
from seedfast.rollout.own_engine import Sampler
from seedfast.skills.analyzers import OracleAnalyzer, SelfAnalyzer
from seedfast.skills.prompts import analyzer_sft_messages
from seedfast.skills.result import SkillResult


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture()
def policy_dir(tmp_path, policy, tokenizer):
    folder = tmp_path / "policy"
    save_hf(policy, folder)
    save_tokenizer(tokenizer, folder)
    return folder


def test_collect_main_writes_pairs_trajectories_and_stats(tmp_path, games, policy_dir):
    games_dir = Path(games[0].path).parents[1]
    overrides = [
        f"run.out_dir={tmp_path}", "run.name=stage1", f"model.path={policy_dir}", "model.dtype=fp32",
        "model.attn_backend=sdpa", f"env.games_dir={games_dir}", "env.levels=[1,3]", "env.n_train=1",
        "env.max_steps=2", "env.history_k=1", "env.workers=1", "rollout.max_response_tokens=6",
        "rollout.tasks_per_batch=2", "collect.tasks=2", "collect.rollouts_per_task=2",
        "skill.collect_analyzer=oracle", "trainer.device=cpu",
    ]
    assert main(load_config(None, overrides)) == 0
    out = tmp_path / "stage1" / "collect"
    assert sorted(p.name for p in out.iterdir()) == ["skill_sft.jsonl", "stats.json", "trajectories.jsonl"]
    rows = read_jsonl(out / "trajectories.jsonl")
    stats = json.loads((out / "stats.json").read_text())
    assert len(rows) == 4 and stats["trajectories"] == 4 and stats["rollout"]["trajectories"] == 4
    assert [r["game_id"] for r in rows] == [games[0].id] * 2 + [games[1].id] * 2
    assert [r["meta"]["trajectory_index"] for r in rows] == [0, 1, 2, 3]
    assert [r["meta"]["group_id"] for r in rows] == [0, 0, 1, 1]
    assert sum(stats["reasons"].values()) == 4
    pairs = read_jsonl(out / "skill_sft.jsonl")
    valid = [r for r in rows if r["skill"]["valid"]]
    assert len(pairs) == len(valid) == stats["kept_pairs"] == stats["reasons"].get("ok", 0) > 0
    for pair in pairs:
        row = rows[pair["trajectory_index"]]
        trajectory = Trajectory.from_dict(row)
        step_skills = {int(k): v for k, v in row["skill"]["step_skills"].items()}
        label = SkillResult(**{**row["skill"], "step_skills": step_skills})
        assert pair["messages"] == analyzer_sft_messages(trajectory, label)
        answer = json.loads(pair["messages"][-1]["content"])
        assert answer["episode_skill"] == label.skill and len(answer["episode_skill"].split()) >= 4


def test_collect_with_the_policy_as_analyzer_counts_parse_failures(tmp_path, games, tokenizer, policy):
    tasks = [Task.from_record(g) for g in games]
    engine = Sampler(policy, seed=0)
    analyzer = SelfAnalyzer(engine, tokenizer, max_new_tokens=8)
    config = AgentLoopConfig(n=1, max_steps=1, max_new_tokens=4)
    summary = collect_skill_data(engine, tokenizer, tasks, LocalEnvSlots(TextWorldEnv, 1), analyzer,
                                 tmp_path / "out", config, tasks_per_batch=1)
    # an untrained policy writes no JSON: every label is a counted parse failure and no pair is kept
    assert summary.trajectories == 2 and summary.kept_pairs == 0
    assert summary.reasons == {"no_json": 2}
    assert read_jsonl(tmp_path / "out" / "skill_sft.jsonl") == []
    rows = read_jsonl(tmp_path / "out" / "trajectories.jsonl")
    assert [r["skill"]["reason"] for r in rows] == ["no_json"] * 2
    # one task per batch: group and trajectory indices stay global across batches
    assert [(r["meta"]["group_id"], r["meta"]["trajectory_index"]) for r in rows] == [(0, 0), (1, 1)]


def test_collect_rejects_an_analyzer_that_loses_trajectories(tmp_path, games, tokenizer):
    class Lossy(OracleAnalyzer):
        def analyze(self, trajectories):
            return super().analyze(trajectories)[:-1]

    class Look:
        def generate(self, prompts, params):
            return [tokenizer.encode("<action>look</action>", add_special_tokens=False) for _ in prompts]

        def generate_full(self, prompts, params):
            outputs = self.generate(prompts, params)
            return [Generation(ids, None, "stop" if ids and ids[-1] in params.stop_ids else "length")
                    for ids in outputs]

    tasks = [Task.from_record(g) for g in games]
    with pytest.raises(RuntimeError, match="1 results for 2 trajectories"):
        collect_skill_data(Look(), tokenizer, tasks, LocalEnvSlots(TextWorldEnv, 2), Lossy(), tmp_path,
                           AgentLoopConfig(n=1, max_steps=1))
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_collect_without_a_policy_names_model_path(tmp_path):
    with pytest.raises(ValueError, match="model.path"):
        main(load_config(None, [f"run.out_dir={tmp_path}", "collect.tasks=1", f"env.games_dir={tmp_path}/g"]))
