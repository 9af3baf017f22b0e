import json
import random

import numpy as np
import pytest
import torch

from seedfast.runtime.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from seedfast.runtime.metrics import MetricsLogger, read_metrics, truncate_metrics


def _model_and_opt(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def _train_step(model, opt, sched, gen):
    x = torch.randn(3, 4, generator=gen) + torch.rand(1).item()  # global RNG and a private generator
    loss = model(x).pow(2).mean() + 0.01 * random.random() + 0.01 * float(np.random.rand())
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    model, opt, sched = _model_and_opt(0)
    gen = torch.Generator().manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    for _ in range(2):
        _train_step(model, opt, sched, gen)
    save_checkpoint(tmp_path, 2, model, opt, sched, {"sampler": [1, 2]}, generators={"g": gen})
    expected = [_train_step(model, opt, sched, gen) for _ in range(3)]

    model2, opt2, sched2 = _model_and_opt(99)  # different init: everything must come from the checkpoint
    gen2 = torch.Generator().manual_seed(123)
    state = load_checkpoint(latest_checkpoint(tmp_path), model2, opt2, sched2, generators={"g": gen2})
    assert state == {"step": 2, "sampler": [1, 2]}
    got = [_train_step(model2, opt2, sched2, gen2) for _ in range(3)]
    assert got == expected


def test_incomplete_checkpoints_are_ignored_and_keep_prunes(tmp_path):
    model, opt, sched = _model_and_opt(0)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, opt, sched, {}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_2", "step_3"]
    # a kill during a write leaves a temp folder (and maybe a folder without the marker): never chosen
    (tmp_path / ".step_4.tmp").mkdir()
    (tmp_path / "step_5").mkdir()
    assert latest_checkpoint(tmp_path).name == "step_3"
    with pytest.raises(ValueError, match="incomplete"):
        load_checkpoint(tmp_path / "step_5", model)


def test_checkpoint_that_does_not_fit_names_the_tensors(tmp_path):
    model, opt, sched = _model_and_opt(0)
    save_checkpoint(tmp_path, 1, model, opt, sched, {})
    other = torch.nn.Sequential(torch.nn.Linear(4, 8))
    with pytest.raises(ValueError, match="1.weight"):
        load_checkpoint(tmp_path / "step_1", other)


def test_metrics_truncate_drops_steps_after_the_checkpoint_and_torn_lines(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(5):
        log.log(step, {"loss": torch.tensor(step * 0.5), "nan": float("nan")})
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "los')  # killed mid-write
    truncate_metrics(tmp_path / "metrics.jsonl", last_step=2)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[2]["loss"] == 1.0 and rows[2]["nan"] == "nan"
    json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])


def test_tensorboard_asked_for_but_missing_is_said_not_silent(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("no tensorboard here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.warns(UserWarning, match="log.tensorboard=true"):
        log = MetricsLogger(tmp_path, tensorboard=True)
    log.log(0, {"loss": 1.0})
    log.close()
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["loss"] == 1.0
    assert not (tmp_path / "tb").exists()
