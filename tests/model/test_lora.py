"""LoRA (model/lora.py) against independent references: the merged weight W + (alpha/r)·B·A in fp64, the chain rule
of full fine-tuning's weight gradient, and what must stay frozen."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seedfast.config.schema import LoRAConfig
from seedfast.model import make_cu_seqlens
from seedfast.model.lora import (
    LORA_TARGETS,
    LoRALinear,
    LoRASpec,
    adapter_fingerprint,
    adapter_state_dict,
    adapters_disabled,
    add_lora,
    load_adapter_state,
    lora_modules,
    merged_state_dict,
)
from seedfast.ops import fused_loss
from seedfast.rollout.own_engine import Sampler
from seedfast.runtime.optim import adamw
from seedfast.sampling_params import SamplingParams
from tests.model.model_helpers import tiny_decoder


def _randomize_adapters(model: torch.nn.Module, seed: int = 1, scale: float = 0.3) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_modules(model).values():
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen, dtype=torch.float64) * scale)


def _batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = [7, 5, 9]
    ids = torch.randint(0, vocab, (sum(lengths),), generator=gen)
    return ids, make_cu_seqlens(lengths)


def test_the_targets_the_config_allows_are_the_ones_lora_adapts():
    assert tuple(LoRAConfig().targets) == LORA_TARGETS


def test_an_adapted_model_computes_the_merged_weights_and_its_base_with_the_adapters_off():
    model = tiny_decoder("qwen3-untied").double()
    ids, cu = _batch(model.config.vocab_size)
    base_hidden = model(ids, cu)
    add_lora(model, LoRASpec(rank=4, alpha=8.0), dtype=torch.float64)
    assert torch.equal(model(ids, cu), base_hidden)  # B = 0: an added adapter changes nothing
    _randomize_adapters(model)
    adapted = model(ids, cu)
    assert (adapted - base_hidden).abs().max() > 1e-3
    # independent reference: a plain decoder holding W + 2·B·A, merged by hand here
    reference = tiny_decoder("qwen3-untied").double()
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    for path, m in lora_modules(model).items():
        state[f"{path}.weight"] = m.weight + 2.0 * m.lora_B @ m.lora_A
    reference.load_state_dict(state)
    torch.testing.assert_close(adapted, reference(ids, cu), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(merged_state_dict(model)["model.layers.1.mlp.down_proj.weight"],
                               state["model.layers.1.mlp.down_proj.weight"], rtol=0, atol=1e-15)
    with adapters_disabled(model):
        assert torch.equal(model(ids, cu), base_hidden)
    assert torch.equal(model(ids, cu), adapted)  # switched back on after the block


@pytest.fixture(params=["merged", "unmerged"])
def lora_path(request, monkeypatch):
    """Both ways an adapted layer trains: with W + s·B·A merged (CPU, fp32/fp64) and with the adapters' own products
    (every other device and dtype), forced here on an fp64 CPU model."""
    if request.param == "unmerged":
        monkeypatch.setattr(LoRALinear, "_trains_merged", lambda self, x: False)
    return request.param


def test_the_adapter_gradient_is_full_fine_tunings_weight_gradient_through_the_chain_rule(lora_path):
    """dL/dB = s·G·Aᵀ and dL/dA = s·Bᵀ·G, G = dL/dW of the merged model's full fine-tuning (fp64)."""
    spec = LoRASpec(rank=3, alpha=6.0)
    model = tiny_decoder("qwen2-untied").double()
    add_lora(model, spec, dtype=torch.float64)
    _randomize_adapters(model)
    ids, cu = _batch(model.config.vocab_size, seed=3)
    targets = torch.roll(ids, -1)
    hidden = model(ids, cu)
    loss = F.cross_entropy(hidden @ model.lm_head_weight.T, targets)  # fp64 materialized: the reference's loss
    loss.backward()

    full = tiny_decoder("qwen2-untied").double()
    full.load_state_dict(merged_state_dict(model))
    full_loss = F.cross_entropy(full(ids, cu) @ full.lm_head_weight.T, targets)
    full_loss.backward()
    torch.testing.assert_close(loss, full_loss, rtol=1e-12, atol=0)
    full_params = dict(full.named_parameters())
    for path, m in lora_modules(model).items():
        g = full_params[f"{path}.weight"].grad
        torch.testing.assert_close(m.lora_B.grad, spec.scaling * g @ m.lora_A.T, rtol=1e-9, atol=1e-13)
        torch.testing.assert_close(m.lora_A.grad, spec.scaling * m.lora_B.T @ g, rtol=1e-9, atol=1e-13)
        assert m.weight.grad is None and not m.weight.requires_grad
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)


def test_at_full_rank_one_sgd_step_of_the_adapter_moves_the_weight_exactly_as_the_product_rule_says(lora_path):
    """With r = min(in, out) one SGD step of lr on (A, B), whose gradients are gA = s·Bᵀ·G and gB = s·G·Aᵀ (G: full
    fine-tuning's dL/dW, by hand), moves W_eff = W + s·B·A by s·((B − lr·gB)(A − lr·gA) − B·A)
    = −lr·s²·(G·AᵀA + B·Bᵀ·G) + lr²·s³·G·Aᵀ·Bᵀ·G: full fine-tuning's step, preconditioned by AᵀA and BBᵀ."""
    torch.manual_seed(0)
    base = torch.nn.Linear(6, 4, bias=False).double()
    spec = LoRASpec(rank=4, alpha=4.0)
    layer = LoRALinear(base, spec, torch.float64, torch.Generator().manual_seed(0))
    with torch.no_grad():
        layer.lora_B.normal_(0, 0.5)
    x = torch.randn(10, 6, dtype=torch.float64)
    y = torch.randn(10, 4, dtype=torch.float64)
    loss = ((layer(x) - y) ** 2).sum()
    loss.backward()
    g = 2 * (x @ layer.merged_weight().T - y).T @ x  # dL/dW of the merged weight, by hand
    a, b, s, lr = layer.lora_A.detach().clone(), layer.lora_B.detach().clone(), spec.scaling, 1e-3
    before = layer.merged_weight()
    with torch.no_grad():
        for p in (layer.lora_A, layer.lora_B):
            p -= lr * p.grad
    predicted = -lr * s * s * (g @ a.T @ a + b @ b.T @ g) + lr * lr * s ** 3 * g @ a.T @ b.T @ g
    torch.testing.assert_close(layer.merged_weight() - before, predicted, rtol=1e-9, atol=1e-13)


def test_a_merged_layer_gives_autograds_gradients_of_the_unmerged_formula_and_merges_again_after_each_step():
    """_MergedLoRA against autograd through x·Wᵀ + b + s·(x·Aᵀ)·Bᵀ in fp64 (x 3-D, a bias that trains), and the
    merged copy follows the adapters: reused while they stay, merged again once an optimizer step moves them."""
    torch.manual_seed(0)
    base = torch.nn.Linear(6, 5).double()
    layer = LoRALinear(base, LoRASpec(rank=2, alpha=6.0), torch.float64, torch.Generator().manual_seed(0))
    layer.bias.requires_grad_(True)
    with torch.no_grad():
        layer.lora_B.normal_(0, 0.5)
    x = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(3, 4, 5, dtype=torch.float64)
    assert layer._trains_merged(x)
    (layer(x) * weights).sum().backward()
    leaves = (x, layer.bias, layer.lora_A, layer.lora_B)
    got = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    reference = F.linear(x, layer.weight, layer.bias) + 3.0 * (x @ layer.lora_A.T) @ layer.lora_B.T
    (reference * weights).sum().backward()
    for name, t, g in zip(("x", "bias", "A", "B"), leaves, got):
        torch.testing.assert_close(g, t.grad, rtol=1e-12, atol=1e-13, msg=name)
    copy = layer._merged[1]
    layer(x)
    assert layer._merged[1] is copy  # the adapters did not move: the same merged weight
    # the trainers' AdamW (fused: it writes in place without moving version counters unless told, runtime/optim.py)
    before = layer.merged_weight()
    adamw([layer.lora_A, layer.lora_B], lr=0.1).step()
    assert (layer.merged_weight() - before).abs().max() > 1e-2
    torch.testing.assert_close(layer(x), F.linear(x, layer.merged_weight(), layer.bias), rtol=1e-12, atol=1e-13)
    assert layer._merged[1] is not copy


def test_only_the_adapters_train_and_they_are_fp32_over_a_bf16_base():
    model = tiny_decoder("llama-tied-bias").to(torch.bfloat16)
    adapted = add_lora(model, LoRASpec(rank=2, alpha=4.0, targets=("q_proj", "down_proj")))
    assert adapted == ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj",
                       "model.layers.1.self_attn.q_proj", "model.layers.1.mlp.down_proj"]
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert sorted(trainable) == sorted(f"{p}.{w}" for p in adapted for w in ("lora_A", "lora_B"))
    assert all(p.dtype == torch.float32 for p in trainable.values())
    assert all(p.dtype == torch.bfloat16 for n, p in model.named_parameters() if n not in trainable)
    # the base keeps its HF names (and a bias stays a frozen bias)
    assert "model.layers.0.self_attn.q_proj.bias" in dict(model.named_parameters())
    ids, cu = _batch(model.config.vocab_size)
    hidden = model(ids, cu)
    assert hidden.dtype == torch.bfloat16
    hidden.float().square().mean().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trainable.values())


def test_adapters_move_at_the_recipes_learning_rate():
    """fp32 adapters under a bf16 base: one AdamW step at lr 1e-6 changes every adapter element with a gradient."""
    model = tiny_decoder("qwen3-untied").to(torch.bfloat16)
    add_lora(model, LoRASpec(rank=4, alpha=32.0))
    _randomize_adapters(model, scale=0.02)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0)
    ids, cu = _batch(model.config.vocab_size)
    model(ids, cu).float().square().mean().backward()
    before = [p.detach().clone() for p in params]
    opt.step()
    for old, p in zip(before, params):
        with_grad = p.grad != 0
        assert with_grad.any()
        assert torch.equal((p.detach() != old)[with_grad], torch.ones_like(with_grad)[with_grad])


def test_the_fused_loss_computes_no_weight_gradient_for_a_frozen_head(monkeypatch):
    from seedfast.ops import chunked

    asked = []
    original = chunked.fused_forward_backward

    def spy(*args, **kwargs):
        asked.append(kwargs.get("need_weight_grad"))
        return original(*args, **kwargs)

    monkeypatch.setattr(chunked, "fused_forward_backward", spy)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, 8, generator=gen, requires_grad=True)
    weight = torch.randn(50, 8, generator=gen)  # frozen, as a LoRA run's LM head
    targets = torch.randint(0, 50, (6,), generator=gen)
    loss, _ = fused_loss(hidden, weight, targets, advantages=torch.ones(6), token_weights=torch.full((6,), 1 / 6),
                         old_logprob=None)
    loss.backward()
    assert weight.grad is None and hidden.grad is not None
    assert asked and not any(asked)


def test_adapter_state_round_trips_and_a_misfit_is_named():
    model = tiny_decoder("qwen3-untied")
    add_lora(model, LoRASpec(rank=2, alpha=2.0))
    _randomize_adapters(model)
    state = {k: v.clone() for k, v in adapter_state_dict(model).items()}
    other = tiny_decoder("qwen3-untied")
    add_lora(other, LoRASpec(rank=2, alpha=2.0), seed=5)
    assert adapter_fingerprint(sorted(adapter_state_dict(other).items())) != adapter_fingerprint(sorted(state.items()))
    load_adapter_state(other, state)
    assert adapter_fingerprint(sorted(adapter_state_dict(other).items())) == adapter_fingerprint(sorted(state.items()))
    bad = dict(state)
    bad["model.layers.0.self_attn.q_proj.lora_A"] = torch.zeros(3, 32)
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.q_proj.lora_A has shape \(3, 32\)"):
        load_adapter_state(other, bad)
    del bad["model.layers.0.self_attn.q_proj.lora_A"]
    with pytest.raises(ValueError, match="missing .*q_proj.lora_A"):
        load_adapter_state(other, bad)


def test_a_bad_spec_is_one_error_naming_it():
    with pytest.raises(ValueError, match="rank must be >= 1"):
        LoRASpec(rank=0, alpha=1.0)
    with pytest.raises(ValueError, match="targets must be"):
        LoRASpec(rank=1, alpha=1.0, targets=("lm_head",))
    model = tiny_decoder("qwen3-untied")
    add_lora(model, LoRASpec(rank=1, alpha=1.0))
    with pytest.raises(ValueError, match="already has LoRA"):
        add_lora(model, LoRASpec(rank=1, alpha=1.0))


def test_generation_under_merged_adapters_equals_a_plain_decoder_holding_the_merged_weights(lora_path):
    """The own engine generates with W + s·B·A in one GEMM (adapters_merged); the reference is a plain decoder that
    holds those weights, merged by hand in fp64; after an optimizer step the engine must run the new adapters."""
    model = tiny_decoder("qwen3-untied").double()
    add_lora(model, LoRASpec(rank=4, alpha=8.0), dtype=torch.float64)
    _randomize_adapters(model)
    prompts = [[3, 17, 5, 9], [4, 4, 21], [3, 17, 5, 9]]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=7)

    def reference() -> list:
        plain = tiny_decoder("qwen3-untied").double()
        state = {k: v.clone() for k, v in plain.state_dict().items()}
        for path, m in lora_modules(model).items():
            state[f"{path}.weight"] = m.weight + 2.0 * m.lora_B @ m.lora_A
        plain.load_state_dict(state)
        return Sampler(plain).generate_full(prompts, params)

    def check(got: list, want: list) -> None:
        assert [g.token_ids for g in got] == [w.token_ids for w in want]
        for g, w in zip(got, want):
            torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-6)

    engine = Sampler(model)
    check(engine.generate_full(prompts, params), reference())
    merged = [m._merged for m in lora_modules(model).values()]
    assert all(m is not None for m in merged)  # kept for the next call while the adapters stay as they are
    assert not any(m.use_merged for m in lora_modules(model).values())  # outside generation: the adapter path
    # a training step moves the adapters in place: the next generation merges them again
    optimizer = adamw([p for p in model.parameters() if p.requires_grad], lr=0.5)
    ids, cu = _batch(model.config.vocab_size)
    model(ids, cu).pow(2).mean().backward()
    after = [m._merged for m in lora_modules(model).values()]
    if lora_path == "merged":  # the update computed with the copy generation made (the adapters had not moved)
        assert all(a is m for a, m in zip(after, merged))
    else:
        assert all(a is None for a in after)  # the forward with gradients dropped them
    optimizer.step()
    check(engine.generate_full(prompts, params), reference())
    with torch.no_grad():  # a load into the adapters (no forward with gradients between) is seen too
        for m in lora_modules(model).values():
            m.lora_A.mul_(-1.0)
    check(engine.generate_full(prompts, params), reference())
