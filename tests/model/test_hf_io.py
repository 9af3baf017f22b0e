"""load_hf / save_hf: bit-exact round trips (also sharded), interop with transformers both ways, errors."""

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from seedfast.model import Decoder, DecoderConfig, build_decoder, load_hf, parameter_count, save_hf
from tests.model.model_helpers import hf_and_ours, random_packed, randomize_, tiny_decoder


def assert_same_weights(a: Decoder, b: Decoder):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("family", ["qwen3-tied", "llama-untied-llama3rope"])
def test_round_trip_is_bit_exact(family, tmp_path):
    model = tiny_decoder(family)
    save_hf(model, tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_hf(tmp_path / "a")
    assert_same_weights(model, loaded)
    assert loaded.config == model.config
    save_hf(loaded, tmp_path / "b")
    assert_same_weights(loaded, load_hf(tmp_path / "b"))


@pytest.mark.parametrize("family", ["qwen3-tied", "llama-untied-llama3rope"])
def test_parameter_count_reads_the_headers(family, tmp_path):
    model = tiny_decoder(family)
    save_hf(model, tmp_path, max_shard_bytes=8 * 1024)  # sharded: every file counted
    assert parameter_count(tmp_path) == sum(p.numel() for p in load_hf(tmp_path).parameters())


def test_sharded_round_trip_and_index(tmp_path):
    model = tiny_decoder("qwen2-untied").to(torch.bfloat16)
    save_hf(model, tmp_path, max_shard_bytes=8 * 1024)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"]) == set(model.state_dict())
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in model.state_dict().values())
    for shard in shards:  # each tensor lives in the shard the index names
        assert all(index["weight_map"][name] == shard for name in load_file(tmp_path / shard))
    loaded = load_hf(tmp_path)
    assert_same_weights(model, loaded)
    assert loaded.config.dtype == "bfloat16"
    assert_same_weights(model.float(), load_hf(tmp_path, dtype=torch.float32))


def test_resave_into_existing_folder_replaces_weights_and_keeps_other_files(tmp_path):
    save_hf(tiny_decoder("qwen3-untied", seed=0), tmp_path, max_shard_bytes=8 * 1024)
    (tmp_path / "tokenizer.json").write_text("{}")
    model = tiny_decoder("qwen3-untied", seed=1)
    save_hf(model, tmp_path)  # unsharded now: the old shards and index must go
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json"]
    assert_same_weights(model, load_hf(tmp_path))
    assert not [p for p in tmp_path.parent.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("family", ["qwen2-tied", "llama-untied-llama3rope", "qwen3-untied"])
def test_transformers_checkpoint_loads_and_ours_loads_in_transformers(family, tmp_path):
    hf, ours = hf_and_ours(family)
    hf.save_pretrained(tmp_path / "hf")
    from_hf = load_hf(tmp_path / "hf")
    assert_same_weights(ours, from_hf)
    save_hf(ours, tmp_path / "ours")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    seqs, flat, cu = random_packed([11], hf.config.vocab_size)
    with torch.no_grad():
        ref = hf(seqs[0][None]).logits[0]
        torch.testing.assert_close(back(seqs[0][None]).logits[0], ref, rtol=0, atol=1e-5)
        mine = from_hf(flat, cu) @ from_hf.lm_head_weight.T
    torch.testing.assert_close(mine, ref, rtol=0, atol=1e-4)


def test_build_decoder_init_weights_is_seeded():
    config = DecoderConfig.from_hf({"model_type": "llama", "vocab_size": 50, "hidden_size": 16,
                                    "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 2,
                                    "attention_bias": True})
    a, b, c = build_decoder(config, seed=3), build_decoder(config, seed=3), build_decoder(config, seed=4)
    assert_same_weights(a, b)
    assert not torch.equal(a.lm_head_weight, c.lm_head_weight)
    w = a.model.layers[0].self_attn.q_proj.weight
    assert abs(w.std().item() - config.initializer_range) < 0.005 and abs(w.mean().item()) < 0.005
    assert torch.all(a.model.layers[0].self_attn.q_proj.bias == 0) and torch.all(a.model.norm.weight == 1)
    assert build_decoder(config, dtype=torch.bfloat16).lm_head_weight.dtype == torch.bfloat16


def test_missing_path_and_config_are_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_hf(tmp_path / "nope")
    with pytest.raises(ValueError, match="has no config.json"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_decoder().config.to_hf_dict()))
    with pytest.raises(ValueError, match="neither model.safetensors nor model.safetensors.index.json"):
        load_hf(tmp_path)


def test_missing_unexpected_and_misshaped_tensors_are_named(tmp_path):
    model = tiny_decoder("qwen3-untied")
    save_hf(model, tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.1.self_attn.k_norm.weight"]
    state["model.layers.0.mlp.extra.weight"] = torch.zeros(1)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing tensors \['model.layers.1.self_attn.k_norm.weight'\].*"
                                         r"unexpected tensors \['model.layers.0.mlp.extra.weight'\]"):
        load_hf(tmp_path)
    state = model.state_dict()
    state["model.norm.weight"] = torch.ones(3)
    save_file(dict(state), tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"'model.norm.weight'.*shape \(3,\).*\(32,\)"):
        load_hf(tmp_path)


def test_tied_lm_head_and_rotary_buffers_in_a_checkpoint_are_ignored(tmp_path):
    model = tiny_decoder("qwen2-tied")
    save_hf(model, tmp_path)
    state = dict(model.state_dict())
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert_same_weights(model, load_hf(tmp_path))


def test_save_rejects_bad_arguments(tmp_path):
    model = tiny_decoder()
    with pytest.raises(TypeError, match="model must be a seedfast Decoder"):
        save_hf(randomize_(torch.nn.Linear(2, 2)), tmp_path)
    with pytest.raises(ValueError, match="max_shard_bytes must be > 0"):
        save_hf(model, tmp_path, max_shard_bytes=0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        save_hf(model, tmp_path / "file")
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        save_hf(model, tmp_path / "x", state_dict={k: v for k, v in model.state_dict().items()
                                                   if k != "model.norm.weight"})


def test_an_unreadable_file_of_a_folder_is_named(tmp_path):
    """A truncated weight file, a shard of a sharded folder garbled, a config.json that is not JSON: each error names
    the file (WeightsFileError, the CLI's load error) instead of the reader's bare exception."""
    from seedfast.model.hf_io import WeightsFileError

    save_hf(tiny_decoder("qwen3-tied"), tmp_path / "one")
    weights = tmp_path / "one" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(WeightsFileError, match=rf"{weights}: not a readable safetensors file \(SafetensorError: "):
        load_hf(tmp_path / "one")
    save_hf(tiny_decoder("qwen3-tied"), tmp_path / "sharded", max_shard_bytes=8 * 1024)
    shard = sorted((tmp_path / "sharded").glob("model-*-of-*.safetensors"))[1]
    shard.write_bytes(b"\xca" * shard.stat().st_size)
    with pytest.raises(WeightsFileError, match=rf"{shard}: not a readable safetensors file"):
        load_hf(tmp_path / "sharded")
    (tmp_path / "sharded" / "config.json").write_text("{not json")
    with pytest.raises(WeightsFileError, match=r"config.json: not a readable JSON file \(JSONDecodeError"):
        load_hf(tmp_path / "sharded")
