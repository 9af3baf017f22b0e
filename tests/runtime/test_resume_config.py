"""What a resume changes (config/diff.py) and how the restored optimizer takes it (runtime/resume.py): a new lr is the
schedule's new base at the restored step, computed here by hand; nothing changed restores every value bitwise."""

import math

import pytest
import torch

from seedfast.config import ConfigError, load_config
from seedfast.config.diff import config_changes, refuse_fixed_changes
from seedfast.runtime.resume import apply_optim_config
from seedfast.runtime.setup import rl_optimizer


def _restored(cfg, steps_done):
    model = torch.nn.Linear(3, 2)
    opt, sched = rl_optimizer(cfg, model)
    for _ in range(steps_done):
        opt.step()
        sched.step()
    saved = opt.state_dict(), sched.state_dict()
    return model, saved


def test_an_lr_on_resume_is_the_schedules_base_from_the_restored_step():
    old = load_config(None, ["optim.lr=0.01", "optim.schedule=cosine", "optim.warmup_steps=2", "trainer.steps=10"])
    model, (opt_state, sched_state) = _restored(old, 6)
    new = load_config(None, ["optim.lr=0.2", "optim.schedule=cosine", "optim.warmup_steps=2", "trainer.steps=10",
                             "optim.weight_decay=0.5"])
    opt, sched = rl_optimizer(new, model)
    opt.load_state_dict(opt_state)
    sched.load_state_dict(sched_state)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5 * (1 + math.cos(math.pi * 4 / 8)))  # the old lr
    apply_optim_config(new, opt, sched)
    # step 6 of 10, after 2 warm-up steps: cosine progress (6 - 2) / (10 - 2)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2 * 0.5 * (1 + math.cos(math.pi * 4 / 8)))
    assert opt.param_groups[0]["weight_decay"] == 0.5
    sched.step()  # and on: step 7
    assert sched.get_last_lr()[0] == pytest.approx(0.2 * 0.5 * (1 + math.cos(math.pi * 5 / 8)))


def test_nothing_changed_restores_the_optimizer_bitwise():
    cfg = load_config(None, ["optim.lr=0.0123", "optim.schedule=cosine", "optim.warmup_steps=3", "trainer.steps=7"])
    model, (opt_state, sched_state) = _restored(cfg, 4)
    opt, sched = rl_optimizer(cfg, model)
    opt.load_state_dict(opt_state)
    sched.load_state_dict(sched_state)
    before = [dict(g, params=None) for g in opt.param_groups], sched.get_last_lr()
    apply_optim_config(cfg, opt, sched)
    assert [dict(g, params=None) for g in opt.param_groups] == before[0] and sched.get_last_lr() == before[1]


def test_changed_keys_are_listed_and_fixed_ones_refused():
    old = load_config(None, ["algorithm=grpo", "optim.lr=0.001", "trainer.steps=3"])
    new = load_config(None, ["algorithm=seed", "optim.lr=0.05", "trainer.steps=3", "model.tiny.hidden=64",
                             "trainer.resume=auto"])
    changes = config_changes(old.to_yaml(), new)
    assert changes == {"algorithm": ("grpo", "seed"), "optim.lr": (0.001, 0.05), "model.tiny.hidden": (128, 64)}
    with pytest.raises(ConfigError, match=r"cannot change on resume: algorithm: 'grpo' -> 'seed' .*; "
                                          r"model.tiny.hidden: 128 -> 64"):
        refuse_fixed_changes(changes, "ckpt/step_3")
    refuse_fixed_changes({"optim.lr": (0.001, 0.05), "trainer.steps": (3, 9)}, "ckpt/step_3")  # may change
