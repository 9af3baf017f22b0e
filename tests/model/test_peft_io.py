"""PEFT adapter folders in and out (model/peft_io.py), against the real `peft` on transformers' model: seedfast's folder
loaded by `peft.PeftModel.from_pretrained` computes seedfast's logits (fp32) and its merged HF folder is PEFT's
merge_and_unload; a folder `peft` saved gives seedfast PEFT's logits, directly and through model.lora.adapter, and
goes on training; a folder seedfast would run differently from PEFT is one error naming the key or tensor."""

from __future__ import annotations

import json

import peft
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from seedfast.config import ConfigError, load_config
from seedfast.model import Decoder, make_cu_seqlens, save_hf
from seedfast.model.lora import LORA_TARGETS, LoRASpec, adapter_state_dict, add_lora, lora_modules
from seedfast.model.peft_io import ADAPTER_CONFIG, ADAPTER_WEIGHTS, load_peft_adapter, read_peft_spec, save_peft_adapter
from seedfast.runtime.adapters import attach_adapters
from tests.model.model_helpers import hf_and_ours

LENGTHS = [9, 4, 13]  # a right-padded batch for transformers, packed for seedfast
ATOL = 1e-5  # fp32, the same weights: the two attention implementations' rounding (measured <= 5.2e-6)
QV = ("q_proj", "v_proj")


def _ids(vocab: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=gen) for n in LENGTHS]


@torch.no_grad()
def _ours(model: Decoder, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    """seedfast's logits per sequence: the packed forward's hidden states @ the LM head (the reference only)."""
    cu = make_cu_seqlens([len(s) for s in seqs])
    logits = model(torch.cat(seqs), cu, attn_backend="sdpa") @ model.lm_head_weight.T
    return [logits[cu[b]:cu[b + 1]] for b in range(len(seqs))]


@torch.no_grad()
def _theirs(model: torch.nn.Module, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    """transformers' (or peft's) logits per sequence, from one right-padded batch with its attention mask."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.int64)
    mask = torch.zeros(len(seqs), width, dtype=torch.int64)
    for b, s in enumerate(seqs):
        ids[b, :len(s)], mask[b, :len(s)] = s, 1
    logits = model(input_ids=ids, attention_mask=mask).logits
    return [logits[b, :len(s)] for b, s in enumerate(seqs)]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def _randomize_b(model: torch.nn.Module, seed: int = 1, scale: float = 0.3) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_modules(model).values():
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen) * scale)


def _from_pretrained(folder) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()


def _peft_folder(tmp_path, family: str = "qwen3-untied", seed: int = 0, **lora) -> tuple[Decoder, object]:
    """A folder the real peft saved (random nonzero A and B) and seedfast's Decoder of its base (no adapters)."""
    hf, ours = hf_and_ours(family, seed=seed)
    config = peft.LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": list(QV), "lora_dropout": 0.0,
                                "init_lora_weights": False, **lora})
    torch.manual_seed(seed)
    model = peft.get_peft_model(hf, config).eval()
    model.save_pretrained(tmp_path / "adapter")
    return ours, model


# ------------------------------------------------------------------------------------------ seedfast -> peft

@pytest.mark.parametrize(("family", "targets"), [
    ("llama-untied-llama3rope", LORA_TARGETS),
    ("llama-tied-bias", LORA_TARGETS),
    ("qwen2-tied", QV),
    ("qwen3-untied", LORA_TARGETS),
    ("qwen3-tied", QV),
])
def test_peft_loads_seedfasts_adapter_onto_transformers_model_with_seedfasts_logits(family, targets, tmp_path):
    hf, ours = hf_and_ours(family)
    seqs = _ids(ours.config.vocab_size)
    save_hf(ours, tmp_path / "base")  # before add_lora: an adapted model saves its merged weights
    add_lora(ours, LoRASpec(rank=4, alpha=8.0, targets=targets), seed=3)
    _randomize_b(ours)
    save_peft_adapter(ours, tmp_path / "adapter", base_model=str(tmp_path / "base"))
    adapters = adapter_state_dict(ours)
    on_disk = load_file(str(tmp_path / "adapter" / ADAPTER_WEIGHTS))
    assert set(on_disk) == {f"base_model.model.{name}.weight" for name in adapters}  # what peft 0.21 reads
    assert len(on_disk) == 2 * 2 * len(targets)  # 2 layers, A and B

    model = peft.PeftModel.from_pretrained(_from_pretrained(tmp_path / "base"), tmp_path / "adapter").eval()
    loaded = {n.replace(".default", "").removeprefix("base_model.model."): p
              for n, p in model.named_parameters() if "lora_" in n}
    assert loaded.keys() == {f"{name}.weight" for name in adapters}
    for name, tensor in adapters.items():
        assert torch.equal(loaded[f"{name}.weight"], tensor), name
    mine, peft_logits = _ours(ours, seqs), _theirs(model, seqs)
    base_logits = _theirs(_from_pretrained(tmp_path / "base"), seqs)
    assert _max_diff(peft_logits, base_logits) > 1e-2  # the adapters change the logits
    assert _max_diff(mine, peft_logits) < ATOL, _max_diff(mine, peft_logits)

    # the merged HF folder: transformers alone computes the same logits, and its weights are peft's merge_and_unload
    save_hf(ours, tmp_path / "merged")
    merged = _from_pretrained(tmp_path / "merged")
    assert _max_diff(mine, _theirs(merged, seqs)) < ATOL
    peft_merged = model.merge_and_unload().state_dict()
    for name, tensor in merged.state_dict().items():
        torch.testing.assert_close(tensor, peft_merged[name], rtol=0, atol=1e-6, msg=name)


# ------------------------------------------------------------------------------------------ peft -> seedfast

@pytest.mark.parametrize(("family", "targets"), [
    ("qwen3-untied", list(QV)),
    ("llama-tied-bias", ["gate_proj", "down_proj", "o_proj"]),
    ("qwen2-untied", "all-linear"),  # peft saves it as every linear layer's path
    ("qwen3-tied", [f"layers.{i}.self_attn.{n}" for i in range(2) for n in ("k_proj", "o_proj")]),
])
def test_seedfast_loads_peft_s_adapter_with_peft_s_logits(family, targets, tmp_path):
    ours, model = _peft_folder(tmp_path, family, target_modules=targets)
    seqs = _ids(ours.config.vocab_size, seed=1)
    spec = read_peft_spec(tmp_path / "adapter")
    assert (spec.rank, spec.alpha) == (4, 8.0)
    add_lora(ours, spec)
    load_peft_adapter(ours, tmp_path / "adapter")
    theirs = {n.replace(".default", "").removeprefix("base_model.model.").removesuffix(".weight"): p
              for n, p in model.named_parameters() if "lora_" in n}
    assert adapter_state_dict(ours).keys() == theirs.keys()
    for name, tensor in adapter_state_dict(ours).items():
        assert torch.equal(tensor, theirs[name]), name
    peft_logits = _theirs(model, seqs)
    with model.disable_adapter():
        assert _max_diff(peft_logits, _theirs(model, seqs)) > 1e-2
    assert _max_diff(_ours(ours, seqs), peft_logits) < ATOL


def test_an_adapter_trained_with_dropout_loads_with_a_warning_that_training_goes_on_without_it(tmp_path):
    ours, model = _peft_folder(tmp_path, lora_dropout=0.1)
    add_lora(ours, read_peft_spec(tmp_path / "adapter"))
    with pytest.warns(UserWarning, match=r"lora_dropout=0\.1: seedfast trains adapters without dropout"):
        load_peft_adapter(ours, tmp_path / "adapter")
    seqs = _ids(ours.config.vocab_size, seed=2)
    assert _max_diff(_ours(ours, seqs), _theirs(model, seqs)) < ATOL  # eval: PEFT's dropout is off too


def _config(adapter, *more: str):
    return load_config(None, ["model.dtype=fp32", "trainer.device=cpu", f"model.lora.adapter={adapter}", *more])


def test_model_lora_adapter_imports_peft_s_adapter_and_training_goes_on(tmp_path):
    ours, model = _peft_folder(tmp_path, "llama-tied-bias", target_modules=["q_proj", "v_proj", "up_proj"])
    seqs = _ids(ours.config.vocab_size, seed=2)
    base = {n: p.detach().clone() for n, p in ours.named_parameters()}
    attach_adapters(_config(tmp_path / "adapter"), ours, base=None)
    assert ours.lora_spec == LoRASpec(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "up_proj"))
    assert _max_diff(_ours(ours, seqs), _theirs(model, seqs)) < ATOL

    # the imported adapters are the trainable parameters, fp32, with peft's values; the base is frozen
    trainable = {n: p for n, p in ours.named_parameters() if p.requires_grad}
    theirs = {n.replace(".default", "").removeprefix("base_model.model.").removesuffix(".weight"): p.detach()
              for n, p in model.named_parameters() if "lora_" in n}
    assert trainable.keys() == theirs.keys() and len(trainable) == 2 * 2 * 3
    for name, p in trainable.items():
        assert p.dtype == torch.float32 and torch.equal(p.detach(), theirs[name]), name
    before = {n: p.detach().clone() for n, p in trainable.items()}
    optim = torch.optim.AdamW(trainable.values(), lr=1e-2)
    ours.train()
    cu = make_cu_seqlens([len(s) for s in seqs])
    ids = torch.cat(seqs)
    logits = ours(ids, cu, attn_backend="sdpa") @ ours.lm_head_weight.T
    torch.nn.functional.cross_entropy(logits[:-1], ids[1:]).backward()
    optim.step()
    ours.eval()
    for name, p in trainable.items():
        assert not torch.equal(p.detach(), before[name]), name
    for name, p in ours.named_parameters():
        if name in base:
            assert p.grad is None and torch.equal(p.detach(), base[name]), name

    # and out again: peft loads the trained adapter with seedfast's logits
    save_peft_adapter(ours, tmp_path / "trained")
    fresh, _ = hf_and_ours("llama-tied-bias")
    trained = peft.PeftModel.from_pretrained(fresh, tmp_path / "trained").eval()
    mine = _ours(ours, seqs)
    assert _max_diff(mine, _theirs(model, seqs)) > 1e-4  # the step moved the logits
    assert _max_diff(mine, _theirs(trained, seqs)) < ATOL


# ------------------------------------------------------------------------------------------ bad input

def _edit_config(folder, **changes) -> None:
    file = folder / ADAPTER_CONFIG
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def _edit_tensors(folder, edit) -> None:
    file = folder / ADAPTER_WEIGHTS
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))


def _seedfast_folder(tmp_path, rank: int = 4) -> tuple[Decoder, object]:
    """A folder seedfast saved (q/v, r=`rank`) and a fresh Decoder of its base with the same adapters added."""
    _, ours = hf_and_ours("qwen3-untied")
    add_lora(ours, LoRASpec(rank=rank, alpha=8.0, targets=QV))
    _randomize_b(ours)
    save_peft_adapter(ours, tmp_path / "adapter")
    _, fresh = hf_and_ours("qwen3-untied")
    add_lora(fresh, LoRASpec(rank=rank, alpha=8.0, targets=QV))
    return fresh, tmp_path / "adapter"


@pytest.mark.parametrize(("lora", "message"), [
    ({"use_dora": True}, "use_dora=True is not supported"),
    ({"use_rslora": True}, "use_rslora=True is not supported"),
    ({"lora_bias": True}, "lora_bias=True is not supported"),
    ({"rank_pattern": {"q_proj": 8}}, "rank_pattern=.* is not supported"),
    ({"target_modules": r".*\.(q|v)_proj"}, r"target_modules='.*' is a regular expression"),
    ({"target_modules": ["q_proj", "lm_head"]}, "target_modules names 'lm_head', which seedfast does not adapt"),
    ({"init_lora_weights": "pissa"}, "init_lora_weights='pissa' is not supported: such an adapter is trained against"),
])
def test_a_peft_setting_seedfast_would_run_differently_is_one_error_naming_it(lora, message, tmp_path):
    _peft_folder(tmp_path, **lora)
    with pytest.raises(ValueError, match=f"{ADAPTER_CONFIG}: {message}"):
        read_peft_spec(tmp_path / "adapter")
    with pytest.raises(ConfigError, match=f"model.lora.adapter: .*{message}"):
        attach_adapters(_config(tmp_path / "adapter"), hf_and_ours("qwen3-untied")[1], base=None)


def test_a_hand_written_all_linear_is_every_linear_layer_but_the_lm_head(tmp_path):
    _, ours = hf_and_ours("llama-untied-llama3rope")
    add_lora(ours, LoRASpec(rank=2, alpha=4.0))
    _randomize_b(ours)
    save_peft_adapter(ours, tmp_path / "adapter")
    _edit_config(tmp_path / "adapter", target_modules="all-linear")
    spec = read_peft_spec(tmp_path / "adapter")
    assert spec.targets == LORA_TARGETS
    _, fresh = hf_and_ours("llama-untied-llama3rope")
    add_lora(fresh, spec)
    load_peft_adapter(fresh, tmp_path / "adapter")
    for name, tensor in adapter_state_dict(ours).items():
        assert torch.equal(adapter_state_dict(fresh)[name], tensor), name


def test_target_modules_that_adapt_some_layers_only_is_an_error_naming_the_layer(tmp_path):
    _, model = _peft_folder(tmp_path, target_modules=["model.layers.0.self_attn.q_proj", "v_proj"])
    spec = read_peft_spec(tmp_path / "adapter")
    assert spec.targets == QV
    _, ours = hf_and_ours("qwen3-untied")
    add_lora(ours, spec)
    with pytest.raises(ValueError, match=r"differ at \['model.layers.1.self_attn.q_proj'\]"):
        load_peft_adapter(ours, tmp_path / "adapter")


def test_a_missing_misshapen_unexpected_or_non_finite_tensor_is_one_error_naming_it(tmp_path):
    model, folder = _seedfast_folder(tmp_path)
    good = load_file(str(folder / ADAPTER_WEIGHTS))
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"

    def check(edit, message):
        save_file(good, str(folder / ADAPTER_WEIGHTS))
        _edit_tensors(folder, edit)
        before = {n: t.clone() for n, t in adapter_state_dict(model).items()}
        with pytest.raises(ValueError, match=message):
            load_peft_adapter(model, folder)
        for name, tensor in adapter_state_dict(model).items():  # nothing was loaded
            assert torch.equal(tensor, before[name]), name

    check(lambda t: t.pop(key), f"{ADAPTER_WEIGHTS}: no tensor {key}")
    check(lambda t: t.update({key: t[key][:-1]}), rf"tensor '{key}' has shape \(31, 4\), the model's adapter \(32, 4\)")
    check(lambda t: t.update({key.replace("lora_B", "lora_magnitude_vector"): t[key][:, 0].clone()}),
          "lora_magnitude_vector.weight' is not a LoRA weight of a linear layer")
    check(lambda t: t.update({key.replace("layers.1", "layers.7"): t[key].clone()}),
          "layers.7.self_attn.v_proj.lora_B.weight' is not one of the model's adapters")
    check(lambda t: t.update({key.replace(".weight", ".default.weight"): t[key].clone()}), "are the same adapter's")
    check(lambda t: t[key].view(-1)[3].fill_(float("nan")), f"tensor '{key}' is not finite")
    save_file(good, str(folder / ADAPTER_WEIGHTS))
    load_peft_adapter(model, folder)  # the good folder loads


def test_the_adapter_name_in_a_tensor_name_is_read_too(tmp_path):
    model, folder = _seedfast_folder(tmp_path)
    _edit_tensors(folder, lambda t: t.update({k.replace(".weight", ".default.weight"): t.pop(k) for k in list(t)}))
    load_peft_adapter(model, folder)
    assert torch.equal(adapter_state_dict(model)["model.layers.1.self_attn.v_proj.lora_B"],
                       load_file(str(folder / ADAPTER_WEIGHTS))[
                           "base_model.model.model.layers.1.self_attn.v_proj.lora_B.default.weight"])


def test_an_adapter_of_another_rank_than_the_model_s_is_an_error(tmp_path):
    _, folder = _seedfast_folder(tmp_path, rank=4)
    _, ours = hf_and_ours("qwen3-untied")
    add_lora(ours, LoRASpec(rank=8, alpha=8.0, targets=QV))
    with pytest.raises(ValueError, match="the adapter is r=4, .* the model's LoRA is r=8"):
        load_peft_adapter(ours, folder)
    with pytest.raises(ConfigError, match="model.lora.rank=8 but model.lora.adapter=.* has r=4"):
        attach_adapters(_config(folder, "model.lora.rank=8"), hf_and_ours("qwen3-untied")[1], base=None)
    # alpha and targets set beside the folder must agree with it too (the folder's r=4, alpha 8, q and v)
    with pytest.raises(ConfigError, match="model.lora.alpha=16 but model.lora.adapter=.* has lora_alpha=8"):
        attach_adapters(_config(folder, "model.lora.alpha=16"), hf_and_ours("qwen3-untied")[1], base=None)
    with pytest.raises(ConfigError, match=r"model.lora.targets=\['q_proj'\] but model.lora.adapter=.* adapts"):
        attach_adapters(_config(folder, "model.lora.targets=[q_proj]"), hf_and_ours("qwen3-untied")[1], base=None)
    attach_adapters(_config(folder, "model.lora.alpha=8", "model.lora.targets=[v_proj, q_proj]"),
                    hf_and_ours("qwen3-untied")[1], base=None)
    # the config says r=2, the tensors are r=4: the first tensor of another shape is named
    _edit_config(folder, r=2)
    _, two = hf_and_ours("qwen3-untied")
    add_lora(two, LoRASpec(rank=2, alpha=8.0, targets=QV))
    with pytest.raises(ValueError, match=r"lora_A.weight' has shape \(4, 32\), the model's adapter \(2, 32\) \(r=2\)"):
        load_peft_adapter(two, folder)


def test_other_folders_are_one_error_naming_the_file(tmp_path):
    model, folder = _seedfast_folder(tmp_path)
    (folder / ADAPTER_WEIGHTS).unlink()
    with pytest.raises(ValueError, match=f"{ADAPTER_WEIGHTS}: no such file"):
        load_peft_adapter(model, folder)
    _edit_config(folder, peft_type="IA3")
    with pytest.raises(ValueError, match="peft_type is 'IA3'"):
        read_peft_spec(folder)
    (folder / ADAPTER_CONFIG).write_text("{")
    with pytest.raises(ValueError, match=f"{ADAPTER_CONFIG}: not a readable adapter config"):
        read_peft_spec(folder)
    _seedfast_folder(tmp_path / "x")
    with pytest.raises(ValueError, match="the model has no LoRA adapters"):
        load_peft_adapter(hf_and_ours("qwen3-untied")[1], tmp_path / "x" / "adapter")
