"""experiments/study.py, the code of docs/study.md's protocol: its statistics by hand, the λ choice and collapse rules,
the report on synthetic run records, the arms' overrides, and the teacher gap end to end on the tiny model."""

import json
from pathlib import Path

import pytest
import torch

from experiments import study, teacher_probe
from seedfast.config import load_config

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ statistics


def test_the_t_quantiles_the_protocol_names():
    assert study.t_quantile(0.975, 5) == pytest.approx(2.5706, abs=5e-5)  # 'The criterion': df 5
    assert study.t_quantile(0.975, 63) == pytest.approx(1.998, abs=5e-4)  # the gap: 64 games
    assert study.t_quantile(0.975, 1) == pytest.approx(12.7062, abs=5e-4)
    assert study.t_cdf(study.t_quantile(0.9, 7), 7) == pytest.approx(0.9, abs=1e-9)


def test_the_interval_by_hand():
    d = [0.10, 0.05, 0.08, -0.01, 0.12, 0.06]
    m = sum(d) / 6
    sd = (sum((x - m) ** 2 for x in d) / 5) ** 0.5
    got = study.interval(d)
    assert got["mean"] == pytest.approx(m) and got["sd"] == pytest.approx(sd) and got["df"] == 5
    assert got["ci95"] == pytest.approx([m - 2.5706 * sd / 6 ** 0.5, m + 2.5706 * sd / 6 ** 0.5], abs=1e-4)
    assert study.interval([0.3])["ci95"] == [None, None]  # one value has no interval


def test_pool_success_windows_are_one_based():
    record = {"per_update": {"train/success_rate": [i / 16 for i in range(16)]}}
    assert study.pool_success(record) == pytest.approx(sum(i / 16 for i in range(3, 16)) / 13)  # updates 4-16
    assert study.pool_success(record, 1, 8) == pytest.approx(sum(i / 16 for i in range(8)) / 8)


def curve_record(rates, invalid=None, after=None):
    per = {"train/success_rate": list(rates)}
    if invalid is not None:
        per["rollout/invalid_rate"] = list(invalid)
    return {"per_update": per, "episodes_per_update": 64,
            "heldout_after": None if after is None else {"eval/success_rate": after}}


def test_collapse_rule_one_needs_four_updates_under_a_quarter_of_a_control_that_wins():
    control = curve_record([4 / 64] * 16)  # 16 wins over any 4 updates
    fine = curve_record([4 / 64] * 16)
    low = curve_record([4 / 64] * 6 + [0, 1 / 64, 1 / 64, 1 / 64] + [4 / 64] * 6)  # updates 7-10: 3 wins < 16 / 4
    edge = curve_record([4 / 64] * 6 + [1 / 64] * 4 + [4 / 64] * 6)  # 4 wins: not fewer than a quarter
    early = curve_record([0, 0, 0, 0] + [4 / 64] * 12)  # updates 1-4: only update 4 is in a window
    assert not study.collapse(fine, control, 0.2)["1"]
    assert study.collapse(low, control, 0.2)["1"]
    assert not study.collapse(edge, control, 0.2)["1"]
    assert not study.collapse(early, control, 0.2)["1"]
    quiet = curve_record([1 / 64] * 16)  # the control wins 4 of 256: below 8, the rule does not apply
    assert not study.collapse(curve_record([0] * 16), quiet, 0.2)["1"]
    assert study.collapse(curve_record([0] * 16), curve_record([2 / 64] * 16), 0.2)["1"]  # 8 wins: it does


def test_collapse_rules_two_and_three():
    control = curve_record([4 / 64] * 16)
    assert study.collapse(curve_record([4 / 64] * 16, after=0.07), control, 0.16)["2"]  # below half of 0.16
    assert not study.collapse(curve_record([4 / 64] * 16, after=0.08), control, 0.16)["2"]
    three = [0.1] * 5 + [0.6, 0.7, 0.9, 0.51] + [0.1] * 7
    assert study.collapse(curve_record([4 / 64] * 16, invalid=three), control, 0.2)["3"]
    broken = [0.6, 0.7, 0.9, 0.5] * 4  # 0.5 is not above 0.5
    assert not study.collapse(curve_record([4 / 64] * 16, invalid=broken), control, 0.2)["3"]


def test_lambda_selection_ties_go_to_the_smallest_lambda():
    # the highest is 0.25 at 0.3; 0.03 (0.245) and 0.1 (0.2401) lie within 0.010 of it: the smallest, 0.03
    assert study.choose_lambda({0.01: 0.20, 0.03: 0.245, 0.1: 0.2401, 0.3: 0.25}, set()) == (0.03, False)
    assert study.choose_lambda({0.01: 0.20, 0.03: 0.21, 0.1: 0.22, 0.3: 0.25}, set()) == (0.3, False)
    # exactly 0.010 below (5/512 apart is less; 0.010 itself counts as within), float noise included
    assert study.choose_lambda({0.1: 0.25 - 0.010, 0.3: 0.25}, set()) == (0.1, False)
    # a collapsed candidate is not chosen, even the best
    assert study.choose_lambda({0.01: 0.20, 0.03: 0.19, 0.1: 0.22, 0.3: 0.40}, {0.3}) == (0.1, False)
    assert study.choose_lambda({0.1: 0.2, 0.3: 0.3}, {0.1, 0.3}) == (0.1, True)  # all collapsed: smallest, said


def test_the_primary_form_ties_go_in_the_protocol_order():
    assert study.choose_primary({"gate": 0.20, "advantage": 0.25, "reverse_kl": 0.21}) == "advantage"
    assert study.choose_primary({"gate": 0.245, "advantage": 0.25, "reverse_kl": 0.21}) == "gate"
    assert study.choose_primary({"gate": 0.20, "advantage": 0.245, "reverse_kl": 0.25}) == "advantage"


# ------------------------------------------------------------------ arms


SELECTION = {"chosen": {"gate": 0.1, "advantage": 1.0, "reverse_kl": 0.03}, "primary": "advantage",
             "statistic": {"gate/0.1": 0.2, "advantage/1": 0.25, "reverse_kl/0.03": 0.21}, "collapsed": []}


def test_the_arms_overrides_follow_the_protocol_and_load():
    assert study.arm_overrides("control", None) == ["algorithm=grpo", "loss.kl_coef=0.0"]
    assert study.arm_overrides("grpo", None) == ["algorithm=grpo"]
    adv = study.arm_overrides("advantage", SELECTION)
    assert adv == ["algorithm=seed", "skill.analyzer=oracle", "skill.teacher_params=old", "loss.opd_mode=advantage",
                   "loss.opd_coef=1"]
    assert study.arm_overrides("shuffled", SELECTION) == [*adv, "skill.shuffle=derange"]
    assert study.arm_overrides("self", SELECTION) == [o.replace("=oracle", "=self") for o in adv]
    assert "loss.opd_coef=0.03" in study.arm_overrides("reverse_kl", SELECTION)
    with pytest.raises(SystemExit, match="select"):
        study.arm_overrides("gate", None)
    for arm in study.ARMS:
        cfg = load_config(ROOT / study.CONFIG, [*study.recipe(7, "P1"), *study.arm_overrides(arm, SELECTION)])
        assert cfg.run.seed == 7 and cfg.trainer.steps == 16 and cfg.env.levels == [9, 10] and cfg.env.max_steps == 6
        assert cfg.rollout.task_pool == 64 and cfg.rollout.tasks_per_batch * cfg.rollout.n == 64
        assert cfg.rollout.temperature == 1.0 and cfg.skill.skill_mode == "episode_step"
    shuffled = load_config(ROOT / study.CONFIG, [*study.recipe(7, "P1"), *study.arm_overrides("shuffled", SELECTION)])
    assert shuffled.skill.shuffle == "derange" and shuffled.loss.opd_mode == "advantage"
    assert shuffled.loss.opd_beta == 5.0 and shuffled.loss.opd_adv_clip == 3.0
    assert load_config(ROOT / study.CONFIG, study.recipe(7, "P2")).env.max_steps == 8
    assert load_config(ROOT / study.CONFIG, study.recipe(7, "P3")).env.levels == [7, 8]


def test_selection_runs_are_named_as_the_protocol_names_them():
    keys = [k for k, _, _ in study.selection_keys()]
    assert keys[:2] == ["select/s11/control", "select/s11/grpo"] and "select/s11/gate_lam0.01" in keys
    assert len(keys) == 2 + 12 and "select/s11/advantage_lam3" in keys and "select/s11/reverse_kl_lam1" in keys


def test_the_sft_command_is_the_protocols():
    cmd = study.sft_command(9)
    assert cmd[3:] == ["sft", "configs/demo_cpu.yaml", "run.name=sparse_sft_s9", "run.seed=9",
                       "env.games_dir=runs/sparse/games", "sft.copy_warmup_steps=800", "env.n_eval=32",
                       "sft.max_seconds=null"]


# ------------------------------------------------------------------ the report on synthetic records


def run_record(seed, arm, pool, after, commit="abc", invalid=0.05):
    rates = [pool] * 16
    return {"seed": seed, "arm": arm, "per_update": {"train/success_rate": rates,
                                                     "rollout/invalid_rate": [invalid] * 16,
                                                     "teacher/contrast": [0.1] * 16},
            "episodes_per_update": 64, "heldout_after": None if arm == "control" else {"eval/success_rate": after},
            "git_commit": commit}


def synthetic(primary_d, shuffled_d, held=0.0, commit="abc"):
    """Seeds 5-10: GRPO at 0.20 (held-out 0.30), the primary arm at 0.20 + d_s, the shuffled arm at 0.20 + its d_s,
    the others at GRPO's, the control at 0.15."""
    runs = {}
    for i, s in enumerate(study.SEEDS):
        runs[f"sparse/s{s}/control"] = run_record(s, "control", 0.15, None)
        runs[f"sparse/s{s}/grpo"] = run_record(s, "grpo", 0.20, 0.30)
        for arm in ("gate", "reverse_kl", "self"):
            runs[f"sparse/s{s}/{arm}"] = run_record(s, arm, 0.20, 0.30)
        runs[f"sparse/s{s}/advantage"] = run_record(s, "advantage", 0.20 + primary_d[i], 0.30 + held,
                                                    commit if i == 0 else "abc")
        runs[f"sparse/s{s}/shuffled"] = run_record(s, "shuffled", 0.20 + shuffled_d[i], 0.30)
    return {"runs": runs, "starts": {f"sparse/s{s}": {"eval/success_rate": 0.3} for s in study.SEEDS},
            "selection": SELECTION, "teacher_gap": {}, "deviations": []}


YES = [0.10, 0.05, 0.08, 0.02, 0.12, 0.06]


def test_the_report_reads_yes_when_every_clause_holds():
    a = study.analysis(synthetic(YES, [0.0] * 6))
    p = a["advantage"]
    m = sum(YES) / 6
    assert p["mean"] == pytest.approx(m) and p["positive"] == 6 and p["seeds"] == 6
    assert p["d"]["5"] == pytest.approx(0.10)
    assert p["ci95"][0] == pytest.approx(m - 2.5706 * study.interval(YES)["sd"] / 6 ** 0.5, abs=1e-4)
    assert p["clauses"] == {"1": True, "2": True, "3": True, "4": True, "5": True}
    assert a["answer"] == "yes" and a["complete"]
    assert a["gate"]["clauses"]["1"] is False and "3" not in a["gate"]["clauses"]  # no shuffled control of its own
    assert a["primary_minus_shuffled"]["mean"] == pytest.approx(m)


def test_five_of_six_seeds_is_enough_and_four_is_not():
    five = study.analysis(synthetic([0.10, 0.09, 0.08, 0.0, 0.12, 0.11], [0.0] * 6))  # 0 is not positive
    assert five["advantage"]["positive"] == 5 and five["advantage"]["clauses"]["2"] and five["answer"] == "yes"
    four = study.analysis(synthetic([0.10, 0.09, 0.08, 0.0, 0.12, -0.01], [0.0] * 6))
    assert four["advantage"]["positive"] == 4 and not four["advantage"]["clauses"]["2"] and four["answer"] == "no"


def test_the_other_clauses_each_can_say_no():
    small = study.analysis(synthetic([0.04] * 5 + [0.05], [0.0] * 6))  # d̄ < 0.05
    assert not small["advantage"]["clauses"]["1"] and small["answer"] == "no"
    content = study.analysis(synthetic(YES, YES))  # the shuffled arm does as well: not the skill's content
    assert not content["advantage"]["clauses"]["3"] and content["answer"] == "no"
    held = study.analysis(synthetic(YES, [0.0] * 6, held=-0.04))
    assert not held["advantage"]["clauses"]["4"] and held["answer"] == "no"
    data = synthetic(YES, [0.0] * 6)
    data["runs"]["sparse/s8/advantage"]["per_update"]["rollout/invalid_rate"] = [0.9] * 16
    collapsed = study.analysis(data)
    assert collapsed["advantage"]["collapsed"] == [8] and collapsed["answer"] == "no"


def test_the_report_refuses_runs_of_several_commits_and_waits_for_missing_seeds():
    a = study.analysis(synthetic(YES, [0.0] * 6, commit="other"))
    assert a["answer"] is None and "2 commits" in a["refused"]
    data = synthetic(YES, [0.0] * 6)
    del data["runs"]["sparse/s10/shuffled"]
    assert study.analysis(data)["answer"] is None


def test_report_writes_the_analysis_the_plot_and_the_docs(tmp_path, monkeypatch):
    monkeypatch.setattr(study, "RESULT", tmp_path / "study.json")
    monkeypatch.setattr(study, "PLOT", tmp_path / "study.png")
    (tmp_path / "study.json").write_text(json.dumps({**study._base(), **synthetic(YES, [0.0] * 6)}))
    result = study.report()
    assert result["answer"] == "yes"
    written = json.loads((tmp_path / "study.json").read_text())
    assert written["analysis"]["answer"] == "yes" and (tmp_path / "study.png").stat().st_size > 10_000
    text = study.docs_section(written)
    assert "**The answer: yes.**" in text and "`advantage` (primary)" in text and "Deviations** (none)" in text
    assert "+0.072" in text and "`advantage` 1 (0.250)" in text  # d̄ of the primary arm; its λ
    assert study.docs_section({}).startswith("No result yet")


def test_selection_from_seed_11_runs():
    runs = {"select/s11/control": run_record(11, "control", 0.15, None),
            "select/s11/grpo": run_record(11, "grpo", 0.2, 0.3)}
    stats = {"gate": (0.20, 0.24, 0.245, 0.10), "advantage": (0.22, 0.30, 0.31, 0.0),
             "reverse_kl": (0.20, 0.20, 0.20, 0.20)}
    for form, values in stats.items():
        for lam, v in zip(study.GRID[form], values):
            runs[f"select/s11/{form}_lam{lam:g}"] = run_record(11, form, v, 0.3)
    assert study.selection(dict(list(runs.items())[:-1]), None) is None  # a candidate missing
    chosen = study.selection(runs, {"eval/success_rate": 0.3})
    assert chosen["chosen"] == {"gate": 0.03, "advantage": 0.3, "reverse_kl": 0.03}
    assert chosen["collapsed"] == ["advantage/3"]  # 0 wins against the control's 0.15: rule 1
    assert chosen["primary"] == "advantage"


def test_the_pool_rule():
    def gap_record(lo, plain, mixed):
        return {"gaps": {"oracle": {"ci95": [lo, lo + 0.2]}},
                "conditions": {"plain": {"success": plain, "mixed_groups": mixed}}}

    gaps = {f"P1/s{s}": gap_record(0.01 if s != 10 else -0.01, 0.2, 0.5) for s in study.SEEDS}
    assert study.pool_verdict(gaps, "P1")["passes"] is True  # 5 of 6 above 0
    gaps["P1/s9"] = gap_record(-0.02, 0.2, 0.5)
    assert study.pool_verdict(gaps, "P1")["passes"] is False
    assert study.pool_verdict({f"P2/s{s}": gap_record(0.1, 0.3, 0.5) for s in study.SEEDS}, "P2")["passes"] is False
    assert study.pool_verdict({}, "P3")["complete"] is False


# ------------------------------------------------------------------ teacher_probe --config


def test_teacher_probe_reads_the_config_it_is_given():
    demo = teacher_probe.probe_config(teacher_probe.DEFAULT_CONFIG, "r", [])
    smol = teacher_probe.probe_config("configs/smollm2-135m_textworld_cpu.yaml", "r",
                                      ["rollout.task_pool=16", "env.levels=7-8", "run.seed=1"])
    assert demo.rollout.temperature == 1.0 and demo.rollout.task_pool == 64
    assert smol.rollout.temperature == 0.7 and smol.rollout.task_pool == 16 and smol.env.levels == [7, 8]
    assert "smollm2" in smol.model.path and smol.run.name == "r" and smol.env.isolation == "inline"
    assert teacher_probe.probe_config(ROOT / "configs" / "demo_cpu.yaml", "r", []).model == demo.model


# ------------------------------------------------------------------ the gap, end to end on the tiny model


def test_the_gap_on_the_tiny_model(overrides, tiny_policy, train_games, tmp_path, one_torch_thread):
    """Two games x 2 plays per condition: the record's shape, the plain condition is RL's agent loop itself (the
    same trajectories as run_agent_loop at the same seed), the oracle's acting prompts are the teacher's prompts of
    build_samples token for token, and the shuffled condition reads the other game's skill."""
    from seedfast.rollout.agent_loop import run_agent_loop
    from seedfast.rollout.colocated import build_rollout
    from seedfast.runtime.setup import agent_config, load_policy, load_run_tokenizer, load_tasks, make_env_slots
    from seedfast.seeds import sampling_seed
    from seedfast.train.batch import build_samples
    from seedfast.train.privileged import Privileged

    cfg = load_config(None, [*overrides(train_games, tmp_path), "skill.skill_mode=episode_step",
                             "rollout.temperature=1.0", "skill.max_analysis_tokens=16"])
    tasks = load_tasks(cfg, "train")
    acting: dict = {}
    record = study.gap_check(cfg, tiny_policy, tasks, 2, 0, acting)
    assert record["games"] == 2 and record["plays"] == 2 and record["temperature"] == 1.0
    assert set(record["conditions"]) == {"plain", "oracle", "own", "shuffled"}
    for c in ("plain", "oracle", "shuffled"):
        summary = record["conditions"][c]
        assert summary["episodes"] == 4 and summary["games"] == 2
        assert set(summary) >= {"success", "invalid_rate", "episode_length", "mixed_groups"}
        assert record["gaps"].get(c, {"games": 2})["games"] == 2
    assert 0 <= record["conditions"]["own"]["parse_share"] <= 1
    assert record["gaps"]["own"]["games"] == round(2 * record["conditions"]["own"]["parse_share"])
    assert record["per_game"]["shuffled_from"] == [tasks[1].game_id, tasks[0].game_id]
    json.dumps(record)  # what study.json stores

    # plain: RL's agent loop, same sampling seed -> the same plays
    policy = load_policy(cfg, tiny_policy, torch.device("cpu"), trainable=False)
    tokenizer = load_run_tokenizer(cfg, tiny_policy)
    engine = build_rollout("own", policy, seed=0)
    envs = make_env_slots(cfg, 2)
    try:
        engine.begin_step(sampling_seed(0, 1))
        ref = run_agent_loop(engine, tokenizer, [tasks[1]], envs, agent_config(cfg, n=2, temperature=1.0))
    finally:
        envs.close()
    ours = acting["plain"][1][0]
    assert [t.actions for t in ours.trajectories] == [t.actions for t in ref.trajectories]
    assert [r.response_ids for r in ours.steps] == [r.response_ids for r in ref.steps]

    # oracle: the acting prompt is the teacher's prompt of build_samples for the same step, token for token
    _, oracle = study.walkthrough_skills(cfg, tasks, 0)
    checked = 0
    for game, (result, shown) in enumerate(acting["oracle"]):
        episode, steps = oracle[game]
        n = len(result.trajectories)
        samples, _ = build_samples(cfg, result.steps, Privileged([episode] * n, [dict(steps)] * n), tokenizer)
        for sample, prompt_ids in zip(samples, shown):
            assert sample.has_teacher and sample.teacher_prompt_ids().tolist() == prompt_ids
            assert len(prompt_ids) > len(sample.prompt_ids)  # the skill is in it
            checked += 1
    assert checked == sum(len(r.steps) for r, _ in acting["oracle"]) > 0
    # shuffled: game 0 acts with game 1's skill
    result, shown = acting["shuffled"][0]
    episode, steps = oracle[1]
    n = len(result.trajectories)
    samples, _ = build_samples(cfg, result.steps, Privileged([episode] * n, [dict(steps)] * n), tokenizer)
    assert [s.teacher_prompt_ids().tolist() for s in samples] == shown
