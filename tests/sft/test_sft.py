"""The SFT loop and `seedfast sft`: loss and update against materialized references, packing, schedule,
determinism, memorizing real walkthroughs, and the saved HF folder."""

import copy
import json
import math

import pytest
import torch
from transformers import AutoTokenizer

from seedfast.config import ConfigError, SFTConfig, load_config
from seedfast.envs.textworld_games import load_manifest
from seedfast.model import DecoderConfig, build_decoder, load_hf
from seedfast.model.tokenizer import load_tokenizer, train_tokenizer
from seedfast.rollout.actions import parse_action
from seedfast.rollout.agent_loop import Task, stop_token_ids
from seedfast.rollout.own_engine import Sampler
from seedfast.rollout.prompts import PromptStyle
from seedfast.runtime.optim import lr_at
from seedfast.runtime.precision import MasterWeights
from seedfast.sampling_params import SamplingParams
from seedfast.sft import run as sft
from seedfast.sft.examples import SFTExample, action_response_ids, bc_examples, make_example
from seedfast.sft.loop import evaluate_loss, pack, plan_batches, token_logprobs, train_sft
from seedfast.sft.replay import replay_games
from seedfast.sft.tiny_model import build_tiny
from seedfast.sft.tokenizer import FINGERPRINT_NAME, corpus_fingerprint, initial_tokenizer, tokenizer_corpus

STYLE = PromptStyle(history_k=1)


def sft_config(**kw) -> SFTConfig:
    """An SFTConfig with these tests' defaults: one epoch at lr 1e-3, 4096 tokens a batch."""
    return SFTConfig(**{"epochs": 1, "lr": 1e-3, "batch_tokens": 4096, **kw})


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def replays(train_games):
    tasks = [Task.from_record(r) for r in load_manifest(train_games, split="train")]
    return replay_games(tasks, failures=False)


@pytest.fixture(scope="module")
def tok(replays):
    return train_tokenizer(tokenizer_corpus(replays, [], STYLE), vocab_size=500)


@pytest.fixture(scope="module")
def bc(tok, replays):
    return bc_examples(tok, [g.success for g in replays], style=STYLE)


def tiny(tok, hidden=32, layers=1, seed=0):
    cfg = DecoderConfig(model_type="qwen3", vocab_size=len(tok), hidden_size=hidden,
                        intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                        num_key_value_heads=2, tie_word_embeddings=True)
    return build_decoder(cfg, dtype=torch.float32, attn_backend="sdpa", seed=seed)


def reference_loss(model, examples):
    """Mean NLL over all loss tokens: a separate forward per example, materialized fp64 log-softmax."""
    total, count = 0.0, 0
    for ex in examples:
        ids = torch.tensor(ex.input_ids)
        hidden = model(ids, torch.tensor([0, len(ids)], dtype=torch.int32))
        logp = torch.log_softmax(hidden.double() @ model.lm_head_weight.double().T, dim=-1)
        rows = [t - 1 for t in range(1, len(ids)) if ex.loss_mask[t]]
        total = total - logp[rows, ids[[r + 1 for r in rows]]].sum()
        count += len(rows)
    return total / count


def test_first_loss_gradient_and_update_equal_a_materialized_reference(tok, bc):
    model = tiny(tok)
    ref = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    logs = []
    train_sft(model, bc, sft_config(lr=1e-2), log_fn=logs.append)  # one batch holds every example: one step
    assert len(logs) == 1 and logs[0]["loss_tokens"] == sum(e.n_loss_tokens for e in bc)
    loss = reference_loss(ref, bc)
    assert logs[0]["loss"] == pytest.approx(loss.item(), rel=1e-5)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    assert norm > 1.0 and logs[0]["grad_norm"] == pytest.approx(float(norm), rel=1e-4)
    for (name, p), q, p0 in zip(model.named_parameters(), ref.parameters(), before):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-4, msg=name)  # the clipped gradient
        # AdamW's first step, by hand: lr * g / (|g| + eps), no weight decay
        adam = p0 - 1e-2 * p.grad / (p.grad.abs() + 1e-8)
        torch.testing.assert_close(p, adam, atol=1e-7, rtol=1e-6, msg=name)


def test_loss_rows_anywhere_in_an_example_match_the_reference(tok):
    """The last layer runs each example's rows from its first loss row on (sft/loop.py pack, keep_last): loss masks
    with gaps, a loss on the whole example and one on its last token alone give the reference's log-probs."""
    model = tiny(tok, layers=2)
    gen = torch.Generator().manual_seed(0)
    masks = [[False, False, True, False, True, True, False, True], [False] + [True] * 8, [False] * 5 + [True]]
    examples = [SFTExample(torch.randint(0, len(tok), (len(m),), generator=gen).tolist(), m, "bc", f"e{i}",
                           answer_start=len(m) - 1) for i, m in enumerate(masks)]
    batch = pack(examples, "cpu")
    assert batch.keep_last == [7, 9, 2]
    expected = []
    with torch.no_grad():
        got = token_logprobs(model, batch)
        for ex in examples:  # each alone, the fp64 log-softmax of every row
            ids = torch.tensor(ex.input_ids)
            hidden = model(ids, torch.tensor([0, len(ids)], dtype=torch.int32))
            logp = torch.log_softmax(hidden.double() @ model.lm_head_weight.double().T, dim=-1)
            expected += [logp[t - 1, ids[t]] for t in range(1, len(ids)) if ex.loss_mask[t]]
    torch.testing.assert_close(got.double(), torch.stack(expected), rtol=0, atol=1e-5)


def test_per_kind_loss_and_evaluate_loss_match_the_reference(tok, bc):
    model = tiny(tok)
    skill = make_example(bc[0].input_ids[:30], bc[1].input_ids[-5:], kind="skill", source="s")
    got = evaluate_loss(model, [*bc, skill], batch_tokens=900)  # several batches
    with torch.no_grad():
        assert got["loss"] == pytest.approx(reference_loss(model, [*bc, skill]).item(), rel=1e-5)
        assert got["loss/bc"] == pytest.approx(reference_loss(model, bc).item(), rel=1e-5)
        assert got["loss/skill"] == pytest.approx(reference_loss(model, [skill]).item(), rel=1e-5)


def test_packing_plan_keeps_the_budget_and_every_example_once_per_epoch():
    lengths = [5, 9, 3, 7, 7, 2, 10, 1]
    plan = plan_batches(lengths, batch_tokens=12, epochs=3, seed=1)
    assert plan == plan_batches(lengths, batch_tokens=12, epochs=3, seed=1)
    assert plan != plan_batches(lengths, batch_tokens=12, epochs=3, seed=2)
    for epoch in range(3):
        batches = [b for e, b in plan if e == epoch]
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in b) <= 12 for b in batches)
        # greedy: the next example of the order would not have fit
        for b, nxt in zip(batches, batches[1:]):
            assert sum(lengths[i] for i in b) + lengths[nxt[0]] > 12


def test_learning_rate_schedule_by_hand():
    # warm-up N: the first N optimizer steps run below lr, at lr * (s + 1) / (N + 1); then the schedule from step N
    assert [lr_at(s, 10, 1.0, warmup=1, schedule="constant") for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert [lr_at(s, 10, 3.0, warmup=2, schedule="constant") for s in (0, 1, 2, 9)] == [1.0, 2.0, 3.0, 3.0]
    assert lr_at(0, 10, 1.0, warmup=1) == 0.5 and lr_at(1, 10, 1.0, warmup=1) == 1.0  # cosine progress 0 at step 1
    assert [lr_at(s, 10, 3.0, warmup=2) for s in (0, 1, 2)] == [1.0, 2.0, 3.0]
    assert lr_at(6, 10, 1.0, warmup=2) == pytest.approx(0.5)  # halfway through the 8 cosine steps
    assert lr_at(9, 10, 1.0, warmup=2) == pytest.approx(0.5 * (1 + math.cos(math.pi * 7 / 8)))
    assert lr_at(6, 10, 1.0, warmup=2, min_ratio=0.2) == pytest.approx(0.6)
    assert lr_at(0, 10, 1.0) == 1.0 and lr_at(5, 10, 1.0) == pytest.approx(0.5)  # no warm-up: cosine from step 0
    assert lr_at(7, 10, 2.0, schedule="constant") == 2.0
    with pytest.raises(ValueError, match="schedule"):
        lr_at(0, 10, 1.0, schedule="linear")


def test_same_seed_same_run_and_the_time_budget_stops_between_steps(tok, bc):
    def run(seed, **kw):
        model, logs = tiny(tok), []
        stats = train_sft(model, bc, sft_config(epochs=2, batch_tokens=900, warmup_steps=1, **kw), seed=seed,
                          log_fn=logs.append)
        return model, logs, stats

    a, logs_a, stats = run(0)
    b, logs_b, _ = run(0)
    c, logs_c, _ = run(1)
    assert stats.steps == len(logs_a) > 2 and stats.epochs == 2.0 and not stats.stopped_by_time
    assert [r["loss"] for r in logs_a] == [r["loss"] for r in logs_b]
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert [r["loss"] for r in logs_a] != [r["loss"] for r in logs_c]
    assert all(r["tokens"] <= 900 for r in logs_a)
    # one warm-up step at lr / 2, then cosine from lr
    assert [r["lr"] for r in logs_a[:2]] == pytest.approx([5e-4, 1e-3]) and logs_a[-1]["lr"] < 1e-3
    _, logs, stopped = run(0, max_seconds=1e-9)
    assert stopped.stopped_by_time and stopped.steps == 0 and not logs


def test_examples_that_cannot_train_are_named(tok, bc):
    model = tiny(tok)
    with pytest.raises(ValueError, match=r"'treasure_hunter.* tokens, more than sft.batch_tokens=50"):
        train_sft(model, bc, sft_config(batch_tokens=50))
    silent = SFTExample([1, 2, 3], [False, False, False], "bc", "no-loss")
    with pytest.raises(ValueError, match="'no-loss' has no loss token"):
        train_sft(model, [silent], sft_config())
    outside = make_example([1, 2], [len(tok) + 5], kind="bc", source="big-id")
    with pytest.raises(ValueError, match="'big-id' holds token id"):
        train_sft(model, [outside], sft_config())
    with pytest.raises(ValueError, match="empty"):
        train_sft(model, [], sft_config())


def answer_token_nll(model, examples):
    """Per example, the NLL of each loss token given the true tokens before it (teacher forcing)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return [-token_logprobs(model, pack([ex], model.lm_head_weight.device)) for ex in examples]
    finally:
        model.train(was_training)


def train_until_memorized(model, examples, *, seed=0, epochs=80, max_rounds=2, max_nll=0.1):
    """Annealed rounds (4 warm-up steps at lr/5 .. 4lr/5, then cosine to 0 over `epochs` epochs) until every loss
    token of every example has NLL < max_nll, i.e. p > 0.9: then each is the argmax, and greedy decoding must
    reproduce every answer token by token. Returns the first round's stats and each example's worst NLL.

    The mean loss is no such criterion: 40 constant-lr epochs brought it to 0.07 (from 6.3) while the one
    token that tells `go south` from `go north` still had NLL 0.85 (p = 0.43): greedy said `go north`.
    """
    first = None
    for _ in range(max_rounds):  # one round measured enough (worst NLL 0.01-0.05 over 6 init seeds)
        stats = train_sft(model, examples, sft_config(epochs=epochs, lr=1e-2, warmup_steps=4), seed=seed)
        first = first or stats
        worst = [float(nll.max()) for nll in answer_token_nll(model, examples)]
        if max(worst) < max_nll:
            break
    return first, worst


def test_short_sft_memorizes_the_walkthroughs(tok, bc, replays):
    steps = [g.success.steps[i] for g in replays for i in range(len(g.success.steps))]
    prompts = [ex.input_ids[: -len(action_response_ids(tok, s.action))] for ex, s in zip(bc, steps)]
    assert len(bc) == len(steps)
    action_of = {}
    for ex, prompt, step in zip(bc, prompts, steps):  # else no model could reproduce both actions
        assert action_of.setdefault(tuple(prompt), step.action) == step.action, f"{ex.source}: prompt seen before"

    model = tiny(tok, hidden=64, layers=2)
    stats, worst = train_until_memorized(model, bc)
    assert stats.last_loss < 0.01 * stats.first_loss
    assert max(worst) < 0.1, {ex.source: round(w, 3) for ex, w in zip(bc, worst)}
    sampler = Sampler(model)
    stops = stop_token_ids(tok)
    for ex, prompt, step in zip(bc, prompts, steps):
        out = sampler.generate([prompt], SamplingParams(max_new_tokens=16, temperature=0.0, stop_ids=stops))[0]
        assert parse_action(tok.decode(out, skip_special_tokens=True)) == step.action, ex.source
        assert out == action_response_ids(tok, step.action), ex.source  # the whole answer, end of turn included


def test_bf16_compute_over_fp32_master_weights_lowers_the_loss(tok, bc):
    """model.dtype=bf16 (runtime/precision.py): the module computes in bf16, the optimizer steps fp32 masters."""
    master = tiny(tok, hidden=64, layers=2)
    masters = MasterWeights(master, torch.bfloat16)
    stats = train_sft(masters.compute, bc, sft_config(epochs=30, lr=1e-2), schedule="constant", masters=masters)
    assert master.lm_head_weight.dtype == torch.float32 and masters.compute.lm_head_weight.dtype == torch.bfloat16
    assert torch.equal(masters.compute.lm_head_weight, master.lm_head_weight.to(torch.bfloat16))
    assert stats.last_loss < 0.3 * stats.first_loss


# ------------------------------------------------------------------------------------------- seedfast sft


def test_main_trains_with_the_optim_sections_clip_betas_and_eps(overrides, train_games, tmp_path, monkeypatch):
    """optim.grad_clip / betas / eps are RL's and SFT's (one AdamW setting for both; the lr stays sft.lr)."""
    from seedfast.sft import loop

    seen: dict = {}
    real_adamw, real_clip = loop.decoupled_adamw, loop.grad_norm_and_clip

    def adamw_spy(*args, **kwargs):
        optimizer = real_adamw(*args, **kwargs)
        seen["group"] = {k: optimizer.param_groups[0][k] for k in ("lr", "betas", "eps")}
        return optimizer

    def clip_spy(optimizer, max_norm):
        seen.setdefault("clip", set()).add(max_norm)
        return real_clip(optimizer, max_norm)

    monkeypatch.setattr(loop, "decoupled_adamw", adamw_spy)
    monkeypatch.setattr(loop, "grad_norm_and_clip", clip_spy)
    cfg = load_config(None, [*overrides(train_games, tmp_path), "sft.epochs=1", "sft.lr=0.003",
                             "optim.grad_clip=0.25", "optim.betas=[0.8,0.95]", "optim.eps=0.001"])
    assert sft.main(cfg) == 0
    assert seen["group"] == {"lr": 0.003, "betas": (0.8, 0.95), "eps": 0.001} and seen["clip"] == {0.25}


def test_main_trains_saves_a_loadable_hf_folder_and_logs(overrides, train_games, tmp_path, capsys):
    cfg = load_config(None, [*overrides(train_games, tmp_path), "sft.skill_augment=true", "sft.epochs=2",
                             "sft.skill_augment_fraction=1.0", "skill.insertion=after_task"])
    assert sft.main(cfg) == 0
    out = cfg.run_dir / "sft"
    rows = [json.loads(line) for line in (cfg.run_dir / "sft_metrics.jsonl").read_text().splitlines()]
    data, steps, done = rows[0], rows[1:-1], rows[-1]
    assert data["event"] == "data" and data["games"] == 2
    assert data["wall_s"] > 0  # the preparation's own wall time (replays, tokenizer, examples), logged with its data
    assert data["examples/bc"] == data["examples/bc_skill"] == 4 and data["examples/skill"] > 2
    assert len(steps) == done["steps"] > 0 and done["epochs"] == 2.0 and done["out"] == str(out)
    assert "sft:" in capsys.readouterr().out

    model = load_hf(out)
    run_tok = load_tokenizer(cfg.run_dir / "tokenizer")
    hf_tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    text = "<|im_start|>user\nYour task: go south<|im_end|>\n"
    assert hf_tok.encode(text, add_special_tokens=False) == run_tok.encode(text, add_special_tokens=False)
    assert model.config.vocab_size == len(hf_tok) and hf_tok.eos_token == "<|im_end|>"
    init, _ = build_tiny(cfg, [], run_tok)  # the same seed's untrained weights
    trained = dict(model.named_parameters())
    assert all(p.dtype == torch.float32 for p in trained.values())
    assert any(not torch.equal(p, trained[n]) for n, p in init.named_parameters())
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left

    # a second run with model.path = that folder, on pairs from a JSONL file only (no behaviour cloning)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"messages": [{"role": "user", "content": "Your task: go south"}],
                                 "answer": "<action>go south</action>"}) + "\n")
    again = load_config(None, [*overrides(train_games, tmp_path / "b"), f"model.path={out}",
                               f"sft.data={pairs}", "sft.behaviour_cloning=false", "model.dtype=bf16"])
    assert sft.main(again) == 0
    reloaded = load_hf(again.run_dir / "sft")
    assert {p.dtype for p in reloaded.parameters()} == {torch.bfloat16}
    data = json.loads((again.run_dir / "sft_metrics.jsonl").read_text().splitlines()[0])
    assert data["examples/jsonl"] == 1 and data["examples"] == 1


def test_main_logs_each_steps_scalars_to_tensorboard_and_its_events_to_the_jsonl_only(overrides, train_games,
                                                                                         tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(None, [*overrides(train_games, tmp_path), "log.tensorboard=true"])
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "sft_metrics.jsonl").write_text('{"step": 99, "loss": 0.0}\n')  # a stale run's
    assert sft.main(cfg) == 0
    rows = [json.loads(line) for line in (cfg.run_dir / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in rows if "event" in r] == ["data", "done"]
    steps = [r for r in rows if "event" not in r]
    assert [r["step"] for r in steps] == list(range(1, rows[-1]["steps"] + 1))
    tb = EventAccumulator(str(cfg.run_dir / "tb" / "sft")).Reload()
    assert [(e.step, e.value) for e in tb.Scalars("loss")] == [(r["step"], pytest.approx(r["loss"])) for r in steps]
    assert {"lr", "grad_norm", "tokens"} <= set(tb.Tags()["scalars"])
    assert not {"games", "examples", "steps", "step"} & set(tb.Tags()["scalars"])  # events and the step itself
    assert not list((cfg.run_dir / "tb").glob("events.*"))  # <run_dir>/tb itself is RL's

    other_rank = sft.metrics_logger(cfg, is_main=False)
    other_rank.event({"event": "data"})
    other_rank.log(1, {"loss": 0.0})
    other_rank.close()
    assert [json.loads(line) for line in (cfg.run_dir / "sft_metrics.jsonl").read_text().splitlines()] == rows


@pytest.mark.parametrize("override, message", [
    ("model.path={tmp}/nowhere", r"model\.path=.*is not an HF model folder"),
    ("env.games_dir={tmp}/no_games", r"env\.games_dir"),
    ("sft.data={tmp}/missing.jsonl", r"sft\.data=.*is not a file"),
    ("sft.behaviour_cloning=false", r"no SFT data"),
])
def test_main_names_what_is_missing(overrides, train_games, tmp_path, override, message):
    cfg = load_config(None, [*overrides(train_games, tmp_path), override.format(tmp=tmp_path)])
    with pytest.raises(ConfigError, match=message):
        sft.main(cfg)


def test_a_run_folders_tokenizer_is_reused_only_for_the_same_corpus(tmp_path, capsys):
    """A tokenizer left in <run_dir>/tokenizer by an earlier run is kept only when it was trained on the same
    text with the same settings; otherwise (other games, prompts or code; a folder from before the fingerprint)
    a new one is trained, so a reused run folder never trains on a stale vocabulary."""
    cfg = load_config(None, [f"run.out_dir={tmp_path}", "run.name=t", "model.tiny.bpe_vocab_size=300"])
    corpus = ["go north, go south, take the red key", "open the wooden door, go east"] * 20
    first = initial_tokenizer(cfg, corpus)
    folder = cfg.run_dir / "tokenizer"
    stamp = folder / FINGERPRINT_NAME
    written = stamp.stat().st_mtime_ns
    again = initial_tokenizer(cfg, corpus)
    assert stamp.stat().st_mtime_ns == written and again.get_vocab() == first.get_vocab()  # reused
    assert "training a new tokenizer" not in capsys.readouterr().err

    other = ["insert the golden coin into the chest, take the lantern"] * 20
    changed = initial_tokenizer(cfg, other)
    assert "another corpus" in capsys.readouterr().err
    assert changed.get_vocab() != first.get_vocab()
    assert stamp.read_text().strip() == corpus_fingerprint(other, 300, cfg.model.tiny.bpe_min_frequency)

    stamp.unlink()  # a tokenizer folder written before the fingerprint existed: not trusted
    initial_tokenizer(cfg, other)
    assert stamp.is_file() and "another corpus" in capsys.readouterr().err
