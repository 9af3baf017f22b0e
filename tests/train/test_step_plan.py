import pytest

from seedfast.config import load_config
from seedfast.train.step_plan import StepPlan, plan_step


def plan(*overrides: str) -> StepPlan:
    return plan_step(load_config(None, ["skill.analyzer=oracle", *overrides]))


# (overrides, privileged_text, teacher, score_pass, opd, reflection_update), written out by hand
CASES = [
    (["algorithm=grpo"], False, "none", False, False, False),
    (["algorithm=grpo", "trainer.ppo_epochs=2"], False, "none", True, False, False),
    (["algorithm=seed"], True, "update", False, True, False),  # on-policy: ℓskill from the update's prefix KV
    (["algorithm=seed", "trainer.mini_batches=2"], True, "scorer", True, True, False),
    (["algorithm=seed", "trainer.mini_batches=2", "skill.teacher_params=current"], True, "update", True, True, False),
    (["algorithm=seed", "loss.opd_coef=0"], True, "none", True, False, False),
    (["algorithm=sdar", "skill.library=lib.json"], True, "update", False, True, False),
    (["algorithm=grsd", "grsd.judge=oracle"], True, "scorer", True, False, True),  # δ is measured before the update
    # a rollout correction weights the policy term with ℓold against the engine's log-probs: ℓold before the loss
    (["algorithm=grpo", "rollout.correction.mode=token_tis"], False, "none", True, False, False),
    (["algorithm=seed", "rollout.correction.mode=seq_geo_mask"], True, "update", True, True, False),
]


@pytest.mark.filterwarnings("ignore::seedfast.config.ConfigWarning")
@pytest.mark.parametrize("overrides, privileged, teacher, score_pass, opd, reflection", CASES)
def test_the_plan_of_each_algorithm(overrides, privileged, teacher, score_pass, opd, reflection):
    p = plan(*overrides)
    assert (p.privileged_text, p.teacher, p.score_pass, p.opd, p.reflection_update) == (
        privileged, teacher, score_pass, opd, reflection)


def test_kl_follows_its_coefficient_and_on_policy_its_epochs():
    assert plan("loss.kl_coef=0").kl is False and plan("loss.kl_coef=0.01").kl is True
    assert plan().on_policy and not plan("trainer.ppo_epochs=2").on_policy



def test_rl_external_analyzer_caps_its_answer_at_max_analysis_tokens(monkeypatch):
    """RL's external analyzer asks for at most skill.max_analysis_tokens, as collect's does (#22 item 1, #24)."""
    from seedfast.train import privileged

    built = {}

    class Built(Exception):
        pass

    def capture(kind, **kwargs):
        built.update(kind=kind, **kwargs)
        raise Built

    monkeypatch.setattr(privileged, "make_analyzer", capture)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    cfg = load_config(None, ["skill.analyzer=external", "skill.external.endpoint=http://127.0.0.1:9/v1",
                             "skill.external.model=m", "skill.max_analysis_tokens=77"])
    with pytest.raises(Built):
        privileged.seed_skills(privileged.WriterContext(cfg, engine=None, tokenizer=None), [])
    assert built["kind"] == "external" and built["client"].max_tokens == 77
