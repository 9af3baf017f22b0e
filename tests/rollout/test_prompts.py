"""Step prompts: segments concatenate to the chat template's ids, for any tokenizer; insertion points."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from seedfast.model.tokenizer import encode_chat, train_tokenizer
from seedfast.rollout.prompts import DEFAULT_SYSTEM, PromptStyle, Turn, build_prompt, user_parts

CORPUS = [
    "-= Attic =-\nYou are in an attic. There is a closed chest here.\n\nYou see an exit to the east.",
    "Your task: First, go east. Then take the key from the chest.\nAdmissible actions: go east, open chest, look",
    "[Step 1] Observation: You open the chest.\nAction: open chest\n<action>take key</action>",
] * 20
HISTORY = [Turn(f"Room {i}: a dusty place.\n\nThere is a door.", f"go {d}") for i, d in enumerate("nsewn")]
LLAMA_STYLE_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n'"
    " + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def chatml():
    return train_tokenizer(CORPUS, vocab_size=500)


@pytest.fixture(scope="module")
def other_tokenizer():
    """GPT-2-style byte-level BPE (merges may cross newlines) with a Llama-3-like template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eot_id|>", chat_template=LLAMA_STYLE_TEMPLATE)


def prompt_args(history=HISTORY, step=5):
    return ("First, go east. Then take the key.", history, "-= Attic =-\nYou are in an attic.",
            ["go east", "open chest", "look"], step)


def user_content(prompt):
    return "".join(prompt.text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[:1])


@pytest.mark.parametrize("fixture", ["chatml", "other_tokenizer"])
@pytest.mark.parametrize("history_k", [0, 2, 5])
def test_segments_concatenate_to_the_chat_template_ids(request, fixture, history_k):
    tok = request.getfixturevalue(fixture)
    style = PromptStyle(history_k=history_k)
    prompt = build_prompt(tok, *prompt_args(), style=style)
    content = "".join(text for _, text in user_parts(*prompt_args(), style))
    messages = [{"role": "system", "content": DEFAULT_SYSTEM}, {"role": "user", "content": content}]
    assert prompt.ids == tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert prompt.text == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    kinds = [kind for kind, _ in prompt.segments]
    assert kinds == ["system", "task"] + ["history"] * history_k + ["observation", "instructions"]


def test_segments_equal_the_tokenizer_helpers_pieces(chatml):
    prompt = build_prompt(chatml, *prompt_args(), style=PromptStyle(history_k=2))
    parts = user_parts(*prompt_args(), PromptStyle(history_k=2))
    named = [(f"{kind}{i}", text) for i, (kind, text) in enumerate(parts)]
    helper = encode_chat(chatml, DEFAULT_SYSTEM, named)
    pieces = [list(p) for p in helper.pieces]
    # system = system message + user opening; instructions = instructions + user close + assistant opening
    expected = [pieces[0] + pieces[1], *pieces[2:-3], pieces[-3] + pieces[-2] + pieces[-1]]
    assert [ids.tolist() for _, ids in prompt.segments] == expected


def test_history_window_keeps_the_last_k_turns_numbered(chatml):
    prompt = build_prompt(chatml, *prompt_args(), style=PromptStyle(history_k=2))
    history = [chatml.decode(ids) for kind, ids in prompt.segments if kind == "history"]
    assert history == [
        "[Step 4] Observation: Room 3: a dusty place.\n\nThere is a door.\nAction: go w\n",
        "[Step 5] Observation: Room 4: a dusty place.\n\nThere is a door.\nAction: go n\n",
    ]
    observation = chatml.decode(dict(prompt.segments)["observation"])
    assert observation == ("[Step 6] Current observation: -= Attic =-\nYou are in an attic.\n"
                           "Admissible actions: go east, open chest, look\n")
    first = build_prompt(chatml, *prompt_args(history=[], step=0))
    assert "[Step 1] Current observation" in first.text and "history" not in dict(first.segments)


def test_insert_points_fall_on_segment_boundaries(chatml):
    prompt = build_prompt(chatml, *prompt_args(), style=PromptStyle(history_k=2))
    points, ids = prompt.insert_points(), prompt.ids
    assert points["prepend"] == 0
    assert chatml.decode(ids[: points["after_task"]]).endswith("<|im_start|>user\nYour task: First, go east. Then "
                                                               "take the key.\n")
    tail = chatml.decode(ids[points["before_response"] :])
    assert tail.startswith("Now it's your turn.") and tail.endswith("<|im_end|>\n<|im_start|>assistant\n")
    # a skill inserted at a boundary leaves every other token as it was: the text-level insertion tokenizes the same
    skill = "Skill: go east first, then open the chest.\n"
    k = points["before_response"]
    text_k = len(chatml.decode(ids[:k]))
    inserted = prompt.text[:text_k] + skill + prompt.text[text_k:]
    assert chatml.encode(inserted, add_special_tokens=False) == ids[:k] + chatml.encode(skill) + ids[k:]


def test_hide_admissible_actions(chatml):
    prompt = build_prompt(chatml, *prompt_args(), style=PromptStyle(show_admissible=False))
    assert "Admissible actions" not in prompt.text


def test_bad_arguments_are_named(chatml):
    with pytest.raises(ValueError, match="history_k"):
        PromptStyle(history_k=-1)
    with pytest.raises(TypeError, match="task"):
        build_prompt(chatml, None, [], "obs", [], 0)
    with pytest.raises(TypeError, match="observation"):
        build_prompt(chatml, "task", [], 3, [], 0)


def test_a_template_that_rewrites_the_message_is_refused(chatml):
    shouting = PreTrainedTokenizerFast(tokenizer_object=chatml.backend_tokenizer, eos_token="<|im_end|>",
                                       chat_template="{% for m in messages %}{{ m['content'] | upper }}{% endfor %}")
    with pytest.raises(ValueError, match="chat template changed the user message"):
        build_prompt(shouting, *prompt_args())
