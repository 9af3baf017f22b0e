"""GGUF -> HF folder (seedfast/model/gguf_import.py) on a tiny Llama GGUF written here with the `gguf` package:
the folder's logits, through transformers and through our loader, are those of the weights a GGUF reader gets;
its tokenizer splits as llama.cpp does; the folder appears whole or not at all."""

import json

import pytest
import torch
from safetensors import safe_open

from tests.model.gguf_helpers import SPECIALS, reference_encode, train_vocab, write_tiny_gguf

pytest.importorskip("gguf", reason="the `real` extra (pip install -e '.[real]') brings gguf")
pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate (the `real` extra)")

from seedfast.model import load_hf, make_cu_seqlens  # noqa: E402
from seedfast.model.gguf_import import gguf_to_hf, load_gguf_tokenizer  # noqa: E402
from seedfast.model.tokenizer import load_tokenizer  # noqa: E402
from seedfast.rollout.prompts import build_prompt  # noqa: E402

TEXTS = ["go north", "x  42 and 1234", "a\nb\n\nc  d ", "  leading, trailing  ", "7x7=49\n\n\n1 2  3",
         "<|im_start|>user\nopen the chest<|im_end|>\n", "naïve café — ok"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(gguf path, reference model with the file's weights, converted folder) for a Q4_1 file."""
    root = tmp_path_factory.mktemp("gguf")
    ref = write_tiny_gguf(root / "tiny.gguf", "Q4_1")
    return root / "tiny.gguf", ref, gguf_to_hf(root / "tiny.gguf", root / "hf")


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (19,), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_converted_folder_gives_the_logits_of_the_files_weights(tmp_path, qtype):
    ref = write_tiny_gguf(tmp_path / "m.gguf", qtype, seed=1)
    out = gguf_to_hf(tmp_path / "m.gguf", tmp_path / "hf")
    ids = _ids(ref.config.vocab_size)
    with torch.no_grad():
        expected = ref(ids[None]).logits[0]
        theirs = type(ref).from_pretrained(out, dtype=torch.float32).eval()(ids[None]).logits[0]
        ours = load_hf(out)
        mine = ours(ids, make_cu_seqlens([len(ids)]), attn_backend="sdpa") @ ours.lm_head_weight.T
    torch.testing.assert_close(theirs, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(mine, expected, rtol=0, atol=1e-4)


def test_the_folder_is_a_plain_tied_fp32_checkpoint(tiny):
    _, ref, out = tiny
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert config["dtype"] == "float32" and config["vocab_size"] == ref.config.vocab_size
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32


def test_tokenizer_splits_as_llama_cpp_does_for_smollm(tiny):
    path, _, out = tiny
    tokens, merges = train_vocab()
    tok = load_tokenizer(out)
    for text in TEXTS:
        assert tok(text, add_special_tokens=False)["input_ids"] == reference_encode(text, tokens, merges), text
        assert tok.decode(tok(text)["input_ids"]) == text


def test_without_the_fix_transformers_splits_digits_as_gpt2_does(tiny):
    from transformers import AutoTokenizer

    path, _, _ = tiny
    tokens, merges = train_vocab()
    raw = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    differ = [t for t in TEXTS if raw(t)["input_ids"] != reference_encode(t, tokens, merges)]
    assert differ, "the tiny vocabulary no longer shows the difference the pre-tokenizer fix makes"
    assert load_gguf_tokenizer(path)("x  42")["input_ids"] == reference_encode("x  42", tokens, merges)


def test_chat_template_and_special_tokens(tiny):
    _, _, out = tiny
    tok = load_tokenizer(out)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go north"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\ngo north<|im_end|>\n" \
                   "<|im_start|>assistant\n"
    assert (tok.eos_token, tok.bos_token, tok.pad_token) == ("<|im_end|>", "<|im_start|>", "<|im_end|>")
    assert [tok.convert_tokens_to_ids(s) for s in SPECIALS] == [0, 1, 2]
    prompt = build_prompt(tok, "find the key", [], "You are in a hall.", ["go east", "take key"], 0)
    assert prompt.ids == tok(prompt.text, add_special_tokens=False)["input_ids"]


def test_a_failed_conversion_leaves_the_old_folder_and_no_temporaries(tiny, tmp_path, monkeypatch):
    import seedfast.model.gguf_import as gi

    path, _, _ = tiny
    out = tmp_path / "hf"
    out.mkdir()
    (out / "marker").write_text("old")

    def broken(*_a, **_k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(gi, "save_tokenizer", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        gguf_to_hf(path, out)
    assert (out / "marker").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    monkeypatch.undo()
    gguf_to_hf(path, out)
    assert not (out / "marker").exists() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        gguf_to_hf(tmp_path / "absent.gguf", tmp_path / "hf")
