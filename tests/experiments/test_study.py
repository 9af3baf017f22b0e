"""experiments/study.py, the code of docs/study.md's protocol: its statistics by hand, the λ choice and collapse rules,
the report on synthetic run records, the arms' overrides, the teacher gap end to end on the tiny model, and the demo
check (its rule on hand-made summaries, its runner with a fake `seedfast demo` in a fresh clone)."""

import json
import sys
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


def test_the_gap_of_some_conditions_is_those_conditions_of_the_whole_gap(overrides, tiny_policy, train_games,
                                                                         tmp_path, one_torch_thread):
    """The real model's gap measures plain and oracle only: the same plays as the whole check's (same sampling seeds
    per game), and a gap-table row with a dash for the conditions not measured."""
    from seedfast.runtime.setup import load_tasks

    cfg = load_config(None, [*overrides(train_games, tmp_path), "skill.skill_mode=episode_step",
                             "rollout.temperature=1.0", "skill.max_analysis_tokens=16"])
    tasks = load_tasks(cfg, "train")
    whole = study.gap_check(cfg, tiny_policy, tasks, 2, 0)
    some = study.gap_check(cfg, tiny_policy, tasks, 2, 0, conditions=("plain", "oracle"))
    assert set(some["conditions"]) == {"plain", "oracle"} and set(some["gaps"]) == {"oracle"}
    assert some["per_game"]["plain"] == whole["per_game"]["plain"]
    assert some["per_game"]["oracle"] == whole["per_game"]["oracle"]
    assert some["gaps"]["oracle"] == whole["gaps"]["oracle"] and "shuffled_from" not in some["per_game"]
    row = study.gap_row("smollm2/s1", some)
    assert row.split(" | ").count("–") == 2 and row.startswith("| smollm2/s1 |")
    with pytest.raises(ValueError, match="plain first"):
        study.gap_check(cfg, tiny_policy, tasks, 2, 0, conditions=("oracle", "plain"))


def test_the_real_models_gap_is_the_protocols():
    """docs/study.md, 'The real model: SmolLM2-135M', step 3: the gate run's start, 16 pool games x 4 plays at the
    recipe's temperature 0.7, plain and oracle."""
    from seedfast.config import load_config as load

    g = study.REAL_GAP
    cfg = load(ROOT / g["config"], [f"run.seed={g['seed']}", *g["overrides"], "algorithm=grpo"])
    assert cfg.rollout.task_pool == 16 and cfg.rollout.temperature == 0.7 and cfg.env.max_steps == 6
    assert g["plays"] == 4 and g["conditions"] == ("plain", "oracle")
    assert g["start"] == "runs/smollm2-135m_textworld_cpu_sparse_study_gate_seed1/sft"
    protocol = (ROOT / "docs" / "study.md").read_text()
    assert "smollm2-135m_textworld_cpu_sparse_study_gate_seed1" in protocol


# ------------------------------------------------------------------ the demo at seeds 40-44


P = 160 / 256  # an SFT held-out success the demo's 64 x 4 episodes can give


def demo_summary(p=P, after=None, leads=None, control=0.5, copy_warmup=70.0):
    """What the check reads of a demo_summary.json: held-out before and after, the evaluation's size, the pool's
    last-half means, the SFT phases."""
    after = {"grpo": p + 0.02, "seed": p + 0.01} if after is None else after
    leads = {"grpo": 0.05, "seed": 0.03} if leads is None else leads
    return {"before": {"eval/success_rate": p}, "after": {a: {"eval/success_rate": v} for a, v in after.items()},
            "held_out": {"games": 64, "plays": 4},
            "means": {"control": {"first_quarter": control, "last_half": control},
                      **{a: {"first_quarter": control, "last_half": control + v} for a, v in leads.items()}},
            "sft_phases": {"data": 10.0, "copy_warmup": copy_warmup, "copy_warmup_steps": 600, "steps": 90.0},
            "timings": {"games": 60.0, "sft": 170.0, "after_sft": 150.0}}


def test_a_demo_seed_holds_held_out_to_two_standard_errors_at_its_start():
    se = (2 * P * (1 - P) / 256) ** 0.5  # 0.0428 at p = 0.625: the floor is -0.0856
    check = study.demo_seed_check(demo_summary(after={"grpo": 139 / 256, "seed": 139 / 256}))
    assert check["se"] == pytest.approx(se) and check["heldout_floor"] == pytest.approx(-2 * se)
    assert check["algorithms"]["grpo"]["heldout_change"] == pytest.approx(-21 / 256)  # -0.0820: inside
    assert check["algorithms"]["grpo"]["heldout_passes"] and check["passes"]
    lower = study.demo_seed_check(demo_summary(after={"grpo": 139 / 256, "seed": 138 / 256}))  # -0.0859: outside
    assert lower["algorithms"]["grpo"]["heldout_passes"] and not lower["algorithms"]["seed"]["heldout_passes"]
    assert not lower["passes"]  # both algorithms must pass both
    # at p = 1 the SE is 0: no change passes, no drop does not
    assert study.demo_seed_check(demo_summary(p=1.0, after={"grpo": 1.0}, leads={"grpo": 0.01}))["passes"]
    assert not study.demo_seed_check(demo_summary(p=1.0, after={"grpo": 255 / 256}, leads={"grpo": 0.01}))["passes"]


def test_a_demo_seed_needs_each_algorithm_above_the_control_on_its_pool():
    check = study.demo_seed_check(demo_summary(leads={"grpo": 1 / 64, "seed": 0.0}))  # 0 is not above
    assert check["algorithms"]["grpo"]["pool_passes"] and not check["algorithms"]["seed"]["pool_passes"]
    assert check["algorithms"]["seed"]["pool_lead"] == 0.0 and not check["passes"]
    assert check["control_last_half"] == 0.5 and check["algorithms"]["grpo"]["pool_last_half"] == 0.5 + 1 / 64
    assert not study.demo_seed_check(demo_summary(leads={"grpo": 0.1, "seed": -0.02}))["passes"]


def demo_set_record(name="check", failing=(), wall=400.0, missing=()):
    """A set of seeds as study.json keeps it: `failing` seeds drop SEED's held-out below the floor."""
    seeds = study.DEMO_SETS[name]
    runs = {}
    for s in seeds:
        if s in missing:
            continue
        summary = demo_summary(after={"grpo": P, "seed": 138 / 256 if s in failing else P})
        runs[str(s)] = {"seed": s, "check": study.demo_seed_check(summary), "summary": summary, "wall_s": 300.0,
                        "git_commit": "abc", "machine": {"cpu": "x"}}
    record = {"set": name, "seeds": list(seeds), "runs": runs, "verdict": None,
              "fresh_clone": study.fresh_clone_record(seeds[0], wall, demo_summary(), study.DEMO_BUDGET_S[name])}
    record["verdict"] = study.demo_verdict(record)
    return record


def test_the_demo_passes_at_four_of_five_seeds_within_ten_minutes():
    v = study.demo_verdict(demo_set_record(failing={43}))
    assert v["seeds_passed"] == [40, 41, 42, 44] and v["seed_rule"] and v["within_budget"]
    assert v["passes"] is True and v["status"] == "passes" and v["budget_s"] == 600
    v = study.demo_verdict(demo_set_record(failing={41, 43}))
    assert v["seed_rule"] is False and v["passes"] is False and v["status"] == "fails the pass rule"
    # the wall-time clause: seed 40's fresh-clone run over 10 minutes fails the check, the seeds passing
    assert study.demo_verdict(demo_set_record(wall=600.0))["passes"] is True
    over = study.demo_verdict(demo_set_record(wall=601.0))
    assert over["seed_rule"] and over["passes"] is False and over["status"] == "over budget"
    waiting = study.demo_verdict(demo_set_record(missing={44}))
    assert waiting["passes"] is None and waiting["status"] == "incomplete" and waiting["seeds_run"] == 4


def test_a_recipe_confirmed_at_45_to_49_has_fifteen_minutes():
    v = study.demo_verdict(demo_set_record("confirmation", wall=700.0))
    assert v["passes"] and v["budget_s"] == 900 and v["budget_after_s"] == 900  # needed more than 10: becomes 15
    assert study.demo_verdict(demo_set_record("confirmation", wall=500.0))["budget_after_s"] == 600
    assert study.demo_verdict(demo_set_record("confirmation", wall=901.0))["status"] == "over budget"


def test_the_fresh_clone_speed_is_read_against_demo_fresh_clone_json():
    ref = json.loads(study.FRESH_REFERENCE.read_text())["runs"]["0"]["sft_phases"]
    fresh = study.fresh_clone_record(40, 400.0, demo_summary(copy_warmup=70.0), 600)
    assert fresh["reference"]["copy_warmup_s"] == ref["copy_warmup"]
    assert fresh["speed_vs_reference"] == pytest.approx((70.0 / 600) / (ref["copy_warmup"] / ref["copy_warmup_steps"]))
    assert fresh["reference"]["file"] == "experiments/results/demo_fresh_clone.json" and fresh["within_budget"]


def test_the_demo_seed_sets_are_the_protocols():
    assert study.demo_set([40, 41, 42, 43, 44]) == "check"
    assert study.demo_set([45, 46, 47, 48, 49]) == "confirmation"
    for wrong in ([40, 41], [41, 40, 42, 43, 44], [40, 41, 42, 43, 45], [0, 1, 2]):
        with pytest.raises(SystemExit, match="--seeds"):
            study.demo_set(wrong)


def test_the_docs_show_the_demo_check_per_seed_and_its_verdict():
    data = {**study._base(), "demo_check": demo_set_record(failing={43})}
    text = study.docs_section(data)
    assert not text.startswith("No result yet")
    row = next(line for line in text.splitlines() if line.startswith("| 43 |"))
    assert "✗" in row and row.endswith("| no | 5.0 min |") and "−0.0859 ✗" in row  # SEED's: 138/256 - 0.625
    assert "| −0.0856 |" in row  # its floor
    text = " ".join(text.split())  # the paragraphs' wrapping aside
    assert "4 of 5 seeds run pass" in text and "**The demo passes the check.**" in text
    assert "**The demo check at seeds 40–44**" in text and "6.7 min against the 10-minute budget" in text
    failing = study.docs_section({**study._base(), "demo_check": demo_set_record(failing={41, 43}, wall=700.0)})
    assert "3 of 5 seeds run pass" in failing and "**The demo fails the pass rule.**" in " ".join(failing.split())
    over = study.docs_section({**study._base(), "demo_check": demo_set_record(wall=700.0)})
    assert "**The demo passes at its seeds but is over budget**" in " ".join(over.split())
    assert "**The demo check:** not run yet." in study.docs_section({**synthetic(YES, [0.0] * 6), "demo_check": None})


# the runner, with `seedfast demo` replaced by a package of the clone's own: what a clone runs is its own code
FAKE_DEMO = '''import json, os, subprocess, sys
from pathlib import Path

args = sys.argv[1:]
assert args[:2] == ["demo", "configs/demo_cpu.yaml"], args
kv = dict(a.split("=", 1) for a in args[2:])
seed = int(kv["run.seed"])
# what a process the demo starts elsewhere imports (the demo's lanes and env workers)
child = subprocess.run([sys.executable, "-c", "import seedfast; print(seedfast.__file__)"], cwd="/",
                       capture_output=True, text=True).stdout.strip()
with open(os.environ["FAKE_DEMO_LOG"], "a") as f:
    f.write(json.dumps({"seed": seed, "name": kv["run.name"], "cwd": os.getcwd(),
                        "runs_before": Path("runs").exists(), "module": __file__, "python": sys.executable,
                        "omp": os.environ.get("OMP_NUM_THREADS"), "child_module": child}) + "\\n")
if os.environ.get("FAKE_DEMO_CRASH") == str(seed):
    sys.exit(3)
out = Path("runs") / kv["run.name"]
out.mkdir(parents=True)
(out / "demo_summary.json").write_text(os.environ[f"FAKE_DEMO_SUMMARY_{seed}"])
'''


def git(cwd, *args):
    import subprocess

    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def demo_repo(tmp_path, monkeypatch):
    """A repository whose seedfast is the fake demo, with a runs/ of its own (ignored: a clone has none); study.json
    and the speed reference in tmp_path; the log of the fake's calls."""
    src = tmp_path / "src"
    (src / "seedfast").mkdir(parents=True)
    (src / "seedfast" / "__init__.py").write_text("")
    (src / "seedfast" / "__main__.py").write_text(FAKE_DEMO)
    (src / "configs").mkdir()
    (src / "configs" / "demo_cpu.yaml").write_text("# the recipe\n")
    (src / ".gitignore").write_text("runs/\n")
    git(src, "init", "-q")
    git(src, "add", ".")
    git(src, "commit", "-q", "-m", "fake")
    (src / "runs" / "demo_cpu" / "games").mkdir(parents=True)  # this tree's games: not the clone's
    ref = {"git_commit": "r", "seeds": [0], "runs": {"0": {"wall_s": 390.0, "sft_phases": {
        "copy_warmup": 50.0, "copy_warmup_steps": 600}}}}
    (tmp_path / "ref.json").write_text(json.dumps(ref))
    monkeypatch.setattr(study, "ROOT", src)
    monkeypatch.setattr(study, "RESULT", tmp_path / "study.json")
    monkeypatch.setattr(study, "FRESH_REFERENCE", tmp_path / "ref.json")
    monkeypatch.setenv("FAKE_DEMO_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the study's setting: not the demo's
    for s in (*study.DEMO_SETS["check"], *study.DEMO_SETS["confirmation"]):
        summary = demo_summary(after={"grpo": P, "seed": 138 / 256 if s == 43 else P}, copy_warmup=60.0)
        monkeypatch.setenv(f"FAKE_DEMO_SUMMARY_{s}", json.dumps(summary))
    (tmp_path / "clones").mkdir()
    return src


def calls(tmp_path):
    return [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]


def test_the_demo_runs_each_seed_in_a_fresh_clone_and_resumes(demo_repo, tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("FAKE_DEMO_CRASH", "42")
    with pytest.raises(subprocess.CalledProcessError):
        study.demo(under=tmp_path / "clones")
    first = calls(tmp_path)
    assert [c["seed"] for c in first] == [40, 41, 42]
    assert [c["name"] for c in first] == ["demo_cpu_seed40", "demo_cpu_seed41", "demo_cpu_seed42"]
    clone = Path(first[0]["cwd"])
    assert clone.parent == tmp_path / "clones" and {c["cwd"] for c in first} == {str(clone)}
    assert first[0]["runs_before"] is False and first[1]["runs_before"] is True  # seed 40 made the games
    assert all(Path(c["module"]).parent == clone / "seedfast" for c in first)  # the clone's code, this Python
    assert all(Path(c["child_module"]).parent == clone / "seedfast" for c in first)  # in its processes too
    assert all(c["python"] == sys.executable and c["omp"] is None for c in first)
    data = json.loads((tmp_path / "study.json").read_text())
    check = data["demo_check"]
    assert sorted(check["runs"]) == ["40", "41"] and check["begun"] == [42]
    assert check["verdict"]["status"] == "incomplete" and check["verdict"]["passes"] is None
    head = git(demo_repo, "rev-parse", "HEAD")
    assert {r["git_commit"] for r in check["runs"].values()} == {head}
    assert all(r["machine"]["cpu"] for r in check["runs"].values())
    fresh = check["fresh_clone"]
    assert fresh["seed"] == 40 and fresh["wall_s"] == check["runs"]["40"]["wall_s"] < 60
    assert fresh["copy_warmup_s"] == 60.0 and fresh["speed_vs_reference"] == pytest.approx(60.0 / 50.0)
    assert clone.exists()  # a failed set keeps its clone to look at

    monkeypatch.delenv("FAKE_DEMO_CRASH")
    result = study.demo(under=tmp_path / "clones")
    second = calls(tmp_path)[len(first):]
    assert [c["seed"] for c in second] == [42, 43, 44]  # 40 and 41 recorded: skipped
    assert second[0]["cwd"] != str(clone) and second[0]["runs_before"] is False  # a fresh clone again
    assert not Path(second[0]["cwd"]).exists()  # removed once the set is in
    data = json.loads((tmp_path / "study.json").read_text())
    assert result == data["demo_check"] and sorted(result["runs"]) == [str(s) for s in study.DEMO_SETS["check"]]
    assert result["fresh_clone"]["seed"] == 40 and result["fresh_clone"]["wall_s"] == fresh["wall_s"]
    assert result["runs"]["43"]["check"]["passes"] is False
    assert result["verdict"]["seeds_passed"] == [40, 41, 42, 44] and result["verdict"]["status"] == "passes"
    assert [d["what"] for d in data["deviations"]] == ["demo seed 42 made again from its start"]
    assert data["runs"] == {} and data["study_commit"] is None  # only demo_check is written

    study.demo(under=tmp_path / "clones")  # everything recorded: nothing runs
    assert len(calls(tmp_path)) == 6


def test_seeds_45_to_49_confirm_only_a_changed_recipe_that_failed(demo_repo, tmp_path):
    with pytest.raises(SystemExit, match="not all in"):
        study.demo(study.DEMO_SETS["confirmation"], under=tmp_path / "clones")
    head = git(demo_repo, "rev-parse", "HEAD")
    passed = demo_set_record(failing={43})
    for r in passed["runs"].values():
        r["git_commit"] = head
    (tmp_path / "study.json").write_text(json.dumps({**study._base(), "demo_check": passed}))
    with pytest.raises(SystemExit, match="passed at 40-44"):
        study.demo(study.DEMO_SETS["confirmation"], under=tmp_path / "clones")
    failed = demo_set_record(failing={41, 43})
    for r in failed["runs"].values():
        r["git_commit"] = head
    (tmp_path / "study.json").write_text(json.dumps({**study._base(), "demo_check": failed}))
    with pytest.raises(SystemExit, match="no changed recipe"):
        study.demo(study.DEMO_SETS["confirmation"], under=tmp_path / "clones")
    (demo_repo / "configs" / "demo_cpu.yaml").write_text("# the recipe, changed\n")
    git(demo_repo, "commit", "-q", "-am", "a changed recipe")
    with pytest.raises(SystemExit, match="one recipe per set"):  # 40-44 again at another commit: refused
        study.demo(under=tmp_path / "clones")
    result = study.demo(study.DEMO_SETS["confirmation"], under=tmp_path / "clones")
    assert [c["seed"] for c in calls(tmp_path)] == [45, 46, 47, 48, 49]
    data = json.loads((tmp_path / "study.json").read_text())
    assert data["demo_check"]["confirmation"] == result and data["demo_check"]["verdict"] == failed["verdict"]
    assert result["set"] == "confirmation" and result["fresh_clone"]["seed"] == 45
    assert result["verdict"]["passes"] and result["verdict"]["budget_s"] == 900
    assert "seeds 45–49** (the confirmation of a changed recipe)" in " ".join(study.docs_section(data).split())


def test_deviations_with_one_reason_are_one_line():
    devs = [{"what": "run a", "why": "moved", "date": "2026-12-06T10:00:00+00:00", "commit": "a" * 40},
            {"what": "run b", "why": "moved", "date": "2026-12-07T10:00:00+00:00", "commit": "a" * 40},
            {"what": "page edited", "why": "sessions", "date": "2026-12-06T09:00:00+00:00", "commit": "b" * 40}]
    assert study.deviation_lines(devs) == [
        "- moved (2: run a; run b; 2026-12-06 to 2026-12-07, aaaaaaaaa)",
        "- page edited: sessions (2026-12-06, bbbbbbbbb)"]
    same = [{"what": f"run {x}: the CPU is 'B', the study's 'A'", "why": "bundle", "date": "2026-12-06T10:00:00+00:00",
             "commit": "c" * 40} for x in "ab"]
    assert study.deviation_lines(same) == [
        "- bundle (2: run a, run b, each: the CPU is 'B', the study's 'A'; 2026-12-06, ccccccccc)"]


def oracle_gap(mean: float, low: float, invalid: float = 0.1) -> dict:
    return {"gaps": {"oracle": {"mean": mean, "ci95": [low, mean + 0.05]}},
            "conditions": {"plain": {"success": 0.2, "mixed_groups": 0.4, "invalid_rate": invalid}}}


def test_a_collapse_the_control_shares_is_named_the_starts():
    """Rule 3 flags every arm at seed 8 and the control too (no update, the start's invalid share): the read-out says
    so beside the start's own invalid share; at seed 9 only the arm trips it."""
    data = synthetic(YES, [0.0] * 6)
    for arm in ("control", "grpo", *study.FORMS, "shuffled", "self"):
        data["runs"][f"sparse/s8/{arm}"]["per_update"]["rollout/invalid_rate"] = [0.6] * 16
    data["runs"]["sparse/s9/gate"]["per_update"]["rollout/invalid_rate"] = [0.7] * 16
    data["pool"] = {"name": "P1"}
    data["teacher_gap"] = {"P1/s8": oracle_gap(0.1, 0.02, invalid=0.587)}
    a = study.analysis(data)
    assert a["collapse_baselines"]["8"]["control"]["3"] and a["collapse_baselines"]["8"]["grpo"]["3"]
    assert not any(a["collapse_baselines"]["9"]["grpo"].values())
    text = " ".join(study.collapse_lines(a, data["teacher_gap"], "P1"))
    assert ("**Collapse at seed 8** (rule 3; `gate`, `advantage`, `reverse_kl`, `shuffled`, `self`): at this seed "
            "the same rules fire for GRPO (rule 3) and the control (rule 3); the control makes no update; the start's "
            "own invalid-action share on the pool (the gap's plain plays) is 0.587.") in text
    assert "**Collapse at seed 9** (rule 3; `gate`): neither GRPO nor the control trips them at this seed." in text


def test_the_primary_read_by_the_teacher_gap_by_hand():
    data = synthetic(YES, [0.0] * 6)  # the primary, advantage: d_s = YES at seeds 5-10
    data["teacher_gap"] = {"P1/s5": oracle_gap(0.2, 0.1), "P1/s6": oracle_gap(0.05, -0.01),
                           "P1/s7": oracle_gap(0.1, 0.01), "P1/s8": oracle_gap(-0.1, -0.2)}
    text = study.gap_reading(study.analysis(data), data["teacher_gap"], "P1")[1]
    # above 0: seeds 5 and 7, d 0.10 and 0.08; not: 6 and 8, d 0.05 and 0.02; seeds 9, 10 have no gap
    assert "`advantage` minus GRPO is seeds 5, 7: d̄ +0.090 (2 of 2 positive)" in text
    assert "where it does not, seeds 6, 8: d̄ +0.035 (2 of 2 positive)" in text
    assert text.startswith("Not pre-registered")


def test_the_result_shows_a_superseded_gap_beside_the_new_one_with_each_cpu():
    def gap(oracle: float, cpu: str) -> dict:
        stat = {"mean": oracle, "ci95": [oracle - 0.05, oracle + 0.05], "games": 64}
        return {"conditions": {"plain": {"success": 0.2, "mixed_groups": 0.4}, "own": {"parse_share": 0.9}},
                "gaps": {"oracle": stat, "own": stat, "shuffled": stat}, "machine": {"cpu": cpu}}

    data = {**study._base(), "pool": {"name": "P1", "overrides": ["env.levels=9-10"]},
            "teacher_gap": {"P1/s5": gap(-0.092, "Intel(R) Xeon(R) Processor")},
            "superseded": [{"seed": 5, "teacher_gap": gap(0.105, "AMD EPYC")}]}
    text = study.docs_section(data)
    assert "| P1/s5 | 0.200 | 0.400 | −0.092 " in text and "| Intel Xeon Processor |" in text
    assert "| P1/s5 (lost) | 0.200 | 0.400 | +0.105 " in text and "| AMD EPYC |" in text


def test_the_pool_line_reads_the_rule_on_the_gaps_in_the_result():
    """The pool was decided on the first starts; the Result reads the rule again on the starts it holds."""
    gaps = {f"P1/s{s}": oracle_gap(0.1, 0.02 if s < 9 else -0.01) for s in study.SEEDS}  # above 0 at 5, 6, 7, 8
    data = {**study._base(), "pool": {"name": "P1", "overrides": study.POOLS["P1"], "note": "no pool passed"},
            "teacher_gap": gaps}
    text = study.docs_section(data)
    assert ("the oracle gap's interval lies above 0 at 4 of seeds 5–10 (the rule asks 5), plain success 0.200, "
            "mixed groups 0.400: the pool would still not pass the rule.") in " ".join(text.split())


def test_the_real_model_is_read_from_where_its_experiments_keep_it():
    probe = {"splits": {"train_pool": {"steps": 40, "candidates": {
        "oracle_win": {"delta_mean": 0.4139, "share_raised": 0.694}, "self_win": {"delta_mean": -1.2}}}}}
    run = {"means": {"grpo": {"last_half": 0.25}, "seed": {"last_half": 0.375}, "control": {"last_half": 0.5}},
           "before": {"eval/success_rate": 0.25}, "after": {"grpo": {"eval/success_rate": 1 / 12},
                                                            "seed": {"eval/success_rate": 2 / 12}}}
    record = {"overrides": ["env.levels=7-8", "loss.opd_mode=reverse_kl", "loss.opd_coef=0.03"], "runs": {"1": run}}
    gap = {"games": 16, "plays": 4, "temperature": 0.7, "conditions": {"plain": {"success": 0.3}},
           "gaps": {"oracle": {"mean": 0.1, "ci95": [-0.02, 0.22]}}}
    real = {"probe": probe, "runs": {"reverse_kl": record}}
    lines = study.real_model_lines({"teacher_gap": {"smollm2/s1": gap}}, real)
    text = lines[0]
    assert "the teacher probe on its SFT start (Δ log-prob of the walkthrough's actions, 40 pool steps): oracle " \
           "skill +0.414 nats (69% of steps raised), its own skill −1.200" in text
    assert "the teacher gap (16 pool games × 4 plays, T 0.7): plain success 0.300, oracle gap +0.100 " \
           "[−0.020, +0.220]" in text
    assert "`reverse_kl` (λ 0.03): pool success over the last half SEED 0.375, GRPO 0.250, control 0.500; " \
           "held-out 0.250 → SEED 0.167, GRPO 0.083" in text
    assert text.endswith("Not run yet: `gate`, `advantage`.")
    assert study.real_model_lines({}, {})[0] == "**The real model** (SmolLM2-135M, seed 1): not run yet."


def test_the_real_model_records_are_the_ones_the_protocol_names():
    real = study.real_model_records()
    assert set(real) == {"probe", "runs"} and set(real["runs"]) <= set(study.FORMS)
