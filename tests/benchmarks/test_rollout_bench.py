"""benchmarks/rollout.py: the batches it builds, the numbers it derives (hand-computed here), and its section of
docs/performance.md before the benchmark has run (tests/test_docs_generated.py: the section is what the committed
JSON generates)."""

from pathlib import Path

import pytest

from benchmarks import rollout
from seedfast.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]

DOCS = ROOT / "docs" / "performance.md"


def test_a_batch_is_groups_of_copies_as_a_rollout_sends_them():
    distinct = [[1, 2], [3], [4, 5, 6]]
    assert rollout.batch_prompts(distinct, 2, 4) == [[1, 2], [1, 2], [3], [3]]
    assert rollout.batch_prompts(distinct, 4, 2) == [[1, 2], [1, 2]]  # below a group: copies of the first
    with pytest.raises(ValueError, match="not a multiple of the group size 2"):
        rollout.batch_prompts(distinct, 2, 5)
    with pytest.raises(ValueError, match="needs 4 distinct prompts, the recipe's pool has 3"):
        rollout.batch_prompts(distinct, 2, 8)


def test_a_row_derives_its_throughputs_from_its_times():
    row = rollout.row_of(batch=8, distinct=2, prompt_tokens=1600, ttft_s=2.0, seconds=4.0, tokens=128)
    assert row["tokens_per_s"] == 32.0  # 128 / 4
    assert row["decode_tok_s"] == 60.0  # (128 - 8) tokens after the first / (4 - 2) s
    assert rollout.row_of(8, 2, 1600, 2.0, 2.0, 8)["decode_tok_s"] is None  # one token each: no decode step


def test_the_recorder_returns_a_stop_and_keeps_every_prompt():
    recorder = rollout._Recorder(stop=7)
    gens = recorder.generate_full([[1, 2], [3]], SamplingParams(16))
    assert [g.token_ids for g in gens] == [[7], [7]] and recorder.prompts == [[1, 2], [3]]


def test_the_step_summary_leaves_the_first_update_out():
    updates = [{"time/step": 100.0, "time/rollout": 90.0, "time/sync": 0.0, "time/analyze": 0.0},
               {"time/step": 10.0, "time/rollout": 4.0, "time/sync": 1.0, "time/analyze": 2.0},
               {"time/step": 30.0, "time/rollout": 6.0, "time/sync": 1.0}]  # no analyze phase: 0
    s = rollout.step_summary(updates)
    assert s["step_s"] == 20.0 and s["rollout_s"] == 5.0 and s["analyze_s"] == 1.0 and s["updates_averaged"] == 2
    assert s["rollout_share"] == 0.25  # 5 / 20
    assert s["engine_share"] == 0.35  # (1 + 5 + 1) / 20
    assert rollout.step_summary(updates[:1])["rollout_share"] == 0.9  # one update: itself


def _data(vllm_seconds: float) -> dict:
    row = lambda b, ttft, s: rollout.row_of(b, b // 4, 200 * b, ttft, s, 16 * b)  # noqa: E731
    return {
        "benchmark": "rollout", "machine": {"cpu": "Test CPU", "cpu_count": 2}, "vllm_version": "0.0",
        "shapes": {"threads": 2, "prompt_tokens_min": 180, "prompt_tokens_max": 240, "group": 4, "new_tokens": 16,
                   "temperature": 0.7, "reps": 3, "recipe_batch": 8},
        "measurements": [
            {"engine": "own", "dtype": "fp32", "start_s": 1.0, "rows": [row(8, 1.0, 4.0)]},
            {"engine": "vllm_eager", "dtype": "fp32", "start_s": 30.0, "push_s": 2.5,
             "rows": [row(8, 0.5, vllm_seconds)]},
        ],
        "steps": {"own": {"step_s": 60.0, "sync_s": 0.0, "rollout_s": 15.0, "analyze_s": 9.0,
                          "rollout_share": 0.25, "engine_share": 0.4}},
    }


def test_the_table_compares_each_engine_with_own_at_the_same_dtype_and_batch():
    rows = rollout.compare(_data(2.0)["measurements"])
    vllm = next(r for r in rows if r["engine"] == "vllm_eager")
    assert vllm["vs_own"] == 2.0 and vllm["ttft_vs_own"] == 2.0  # 4.0 / 2.0 s, 1.0 / 0.5 s
    text = rollout.markdown(_data(2.0))
    assert "| vllm_eager | fp32 | 8 | 0.5 | 2 | 64 | 80 | 2x |" in text  # 128 tokens in 2 s; 120 in 1.5 s
    assert "| own | 60 | 0 | 15 | 9 | 25% | 40% |" in text
    assert "vllm_eager is the fastest, 2.00x the own engine's speed" in text
    assert "the own engine is the fastest, 1.25x ahead of the next" in rollout.markdown(_data(5.0))


def test_the_recipes_engine_is_the_one_whose_rl_update_is_shorter():
    steps = {"own": {"step_s": 53.2}, "vllm": {"step_s": 80.3}}
    assert rollout.step_verdict(steps).endswith("own took 53.2 s, vllm took 80.3 s: own is the recipe's engine.")
    assert rollout.step_verdict({"own": {"step_s": 1.0}}) == ""  # one engine: nothing to choose


def test_vllm_leads_only_beyond_the_margin():
    rows = [{"engine": "vllm_eager", "dtype": "fp32", "batch": 8, "vs_own": 1.05},
            {"engine": "vllm_compiled", "dtype": "bf16", "batch": 64, "vs_own": 1.4},
            {"engine": "own", "dtype": "bf16", "batch": 64, "vs_own": 1.0}]
    assert rollout.vllm_leads(rows).startswith("vLLM leads by more than 1.1x at bf16 batch 64:")
    assert rollout.vllm_leads(rows[:1]) == ""


def test_the_docs_section_says_when_there_is_no_measurement():
    assert rollout.docs_section(None).startswith("Not measured yet")


def _profile() -> dict:
    shares = {"matmul": 0.5, "attention": 0.25, "sampling": 0.1, "other": 0.15}
    return {"benchmark": "rollout", "profiles": [{"dtype": "fp32", "batch": 8,
                                                  "shares": {"prefill": shares, "decode": shares}}]}


def test_the_profile_is_a_key_of_the_results_file():
    """--profile writes results/rollout.json's "profile" (the measurement kept); the section shows both, or the
    profile alone before any measurement."""
    text = rollout.docs_section({**_data(2.0), "profile": _profile()})
    assert "| vllm_eager | fp32 | 8 |" in text
    assert "`profile` in `benchmarks/results/rollout.json`" in text
    assert "| fp32 | 8 | decode | 50% | 25% | 10% | 15% |" in text
    alone = rollout.docs_section({"benchmark": "rollout", "profile": _profile()})
    assert alone.startswith("Not measured yet") and "| fp32 | 8 | prefill | 50% |" in alone
    assert "Where the own engine's time goes" not in rollout.docs_section(_data(2.0))


def test_the_profile_sorts_self_time_into_categories():
    shares = rollout.categorize({"aten::mm": 60.0, "aten::addmm": 10.0, "aten::exponential_": 5.0,
                                 "aten::_scaled_dot_product_flash_attention_for_cpu": 15.0, "aten::mul": 10.0})
    assert shares == {"matmul": 0.7, "attention": 0.15, "sampling": 0.05, "other": 0.1}
