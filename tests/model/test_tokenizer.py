"""seedfast.model.tokenizer: BPE on game text, ChatML, offline save/load, segment == full-text ids."""

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from seedfast.model.tokenizer import (
    CHATML_TEMPLATE,
    IM_END,
    IM_START,
    PAD,
    SPECIAL_TOKENS,
    chat_segments,
    encode_chat,
    encode_segments,
    load_tokenizer,
    render_chat,
    save_tokenizer,
    train_tokenizer,
)

GAME_TEXT = [
    "You are now playing a exciting round of TextWorld! Here is your task for today. First off, if it's not "
    "too much trouble, I need you to try to go west. Then, recover the key from the floor of the attic.",
    "-= Attic =-\nYou've just sauntered into an attic. You see a closed chest. There is an unguarded exit to "
    "the east. You don't like doors? Why not try going west, that entranceway is unguarded.",
    "> open chest\nYou open the chest, revealing a shiny key.\n> take key from chest\nYou take the key.",
    "\n\n-= Kitchen =-\n\nYou are in a kitchen.  \n\n\nThere is a fridge.\n\n> inventory\n\n"
    "You are carrying nothing.\n\n",
    "Admissible actions: go east, go west, open chest, look, inventory, examine key, take key",
    "<action>go west</action>\n<action>take key</action>\n<action>open chest</action>",
    '{"episode_summary": "The agent went west and took the key.", "episode_skill": "Read the objective, '
    'go in the direction it names, then take the object it names."}',
] * 8
SYSTEM = "You are an agent playing a text game. Answer with <action>...</action>."


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(GAME_TEXT, vocab_size=600)


@pytest.fixture(scope="module")
def saved(tok, tmp_path_factory):
    return save_tokenizer(tok, tmp_path_factory.mktemp("tok"))


# Text with what trips byte-level BPE: spaces, runs of newlines, punctuation, non-ASCII, tag-like words.
chars = st.text(alphabet=st.sampled_from(list("abcdeknorstuwy ABCTW.,!?'\"-<>/:{}_0123\n\t") + ["é", "ü", "—",
                                                                                               "你", "😀"]),
                max_size=60)
WORDS = ["go", " west", "chest", "You", " the", ".", "\n", "\n\n", "\n\n\n", " ", "  ", "\t", "  \n", "é", "😀",
         "<action>", "</action>", "-=", " =-", "{\"", "\":"]
text = st.one_of(chars, st.lists(st.sampled_from(WORDS), max_size=14).map("".join))


def as_part(s: str, last: bool) -> str:
    """A piece that keeps the segment rule: no leading whitespace, a newline at the end (but the last)."""
    s = s.lstrip() or "x"
    return s if last or s.endswith("\n") else s + "\n"


def test_training_respects_vocab_and_special_tokens(tok):
    assert len(tok) <= 600
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert len(set(ids)) == 4 and all(i is not None and i < len(tok) for i in ids)
    assert tok.eos_token == IM_END and tok.pad_token == PAD
    # a special token is one id, never merged with its neighbours
    assert tok.encode(f"go{IM_START}user{IM_END}\n", add_special_tokens=False)[1] == tok.convert_tokens_to_ids(
        IM_START)
    # merges were learned: frequent words take fewer tokens than bytes
    assert len(tok.encode("You open the chest", add_special_tokens=False)) < len("You open the chest") / 2


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=text)
def test_round_trip_any_text(tok, s):
    assert tok.decode(tok.encode(s, add_special_tokens=False)) == s


def test_unseen_bytes_still_encode(tok):
    s = "Ωmega ∑ 𝔘nicode ☃\r\n\x00"
    ids = tok.encode(s, add_special_tokens=False)
    assert tok.decode(ids) == s and tok.unk_token_id not in ids


def test_bad_training_input_is_named():
    with pytest.raises(TypeError, match="not a single string"):
        train_tokenizer("just one string")
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
        train_tokenizer(["ok", 3])
    with pytest.raises(ValueError, match="texts is empty"):
        train_tokenizer([])
    with pytest.raises(ValueError, match="vocab_size must be an int >= 260"):
        train_tokenizer(GAME_TEXT, vocab_size=100)


def test_saved_folder_loads_offline_with_auto_tokenizer(tok, saved, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    auto = AutoTokenizer.from_pretrained(str(saved))
    assert load_tokenizer(saved).get_vocab() == tok.get_vocab() == auto.get_vocab()
    s = "> open chest\nYou open the chest. 😀"
    assert auto.encode(s, add_special_tokens=False) == tok.encode(s, add_special_tokens=False)
    assert (auto.eos_token, auto.pad_token, auto.chat_template) == (IM_END, PAD, CHATML_TEMPLATE)
    with pytest.raises(ValueError, match="not a tokenizer folder"):
        load_tokenizer(saved / "nowhere")


def test_apply_chat_template_is_chatml(saved):
    tok = load_tokenizer(saved)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "go west"},
                {"role": "assistant", "content": "<action>go west</action>"}]
    expected = (f"{IM_START}system\n{SYSTEM}{IM_END}\n{IM_START}user\ngo west{IM_END}\n"
                f"{IM_START}assistant\n<action>go west</action>{IM_END}\n")
    assert tok.apply_chat_template(messages, tokenize=False) == expected == render_chat(messages)
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt == render_chat(messages[:2], add_generation_prompt=True)
    assert prompt.endswith(f"{IM_END}\n{IM_START}assistant\n")
    ids = tok.apply_chat_template(messages, return_dict=False)
    assert ids == tok.encode(expected, add_special_tokens=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(system=st.one_of(st.none(), text), raw_parts=st.lists(text, min_size=1, max_size=5),
       response=st.one_of(st.none(), text), gen=st.booleans())
@example(system="sys\n\n", raw_parts=["Task.\n\n", "> go west\n\n\n", "-= Attic =-\n\n"], response="go\n\n",
         gen=True)
def test_segments_concatenate_to_the_templated_ids(tok, system, raw_parts, response, gen):
    parts = [(f"p{i}", as_part(s, i == len(raw_parts) - 1)) for i, s in enumerate(raw_parts)]
    response = None if response is None else response.lstrip()  # the rule holds for the response too
    seg = encode_chat(tok, system, parts, response=response, add_generation_prompt=gen)
    messages = ([] if system is None else [{"role": "system", "content": system}]) + \
               [{"role": "user", "content": "".join(p for _, p in parts)}] + \
               ([] if response is None else [{"role": "assistant", "content": response}])
    full = tok.apply_chat_template(messages, add_generation_prompt=gen and response is None, return_dict=False)
    assert seg.ids == full
    assert seg.ids == tok.encode(render_chat(messages, gen and response is None), add_special_tokens=False)
    for name, piece in parts:  # each span holds exactly that part's text
        start, end = seg.span(name)
        assert tok.decode(seg.ids[start:end]) == piece


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=text, history=text, obs=text, skill=text)
def test_inserting_a_skill_keeps_every_other_piece(tok, task, history, obs, skill):
    """Teacher ids = student[:k] + S + student[k:], the contract the prefix-reuse scorer builds on."""
    student_parts = [("task", as_part(task, False)), ("history", as_part(history, False)),
                     ("observation", as_part(obs, True))]
    student = encode_chat(tok, SYSTEM, student_parts)
    for at in range(3):  # after_task, before the observation, and first (prepend inside the user turn)
        at = [1, 2, 0][at]
        teacher_parts = student_parts[:at] + [("skill", as_part(skill, False))] + student_parts[at:]
        teacher = encode_chat(tok, SYSTEM, teacher_parts)
        k = student.span(student_parts[at][0])[0]
        s_start, s_end = teacher.span("skill")
        assert s_start == k
        assert teacher.ids == student.ids[:k] + teacher.ids[s_start:s_end] + student.ids[k:]


def test_response_piece_is_what_the_policy_generates(tok):
    seg = encode_chat(tok, None, [("task", "go west")], response="<action>go west</action>")
    start, end = seg.span("response")
    assert seg.ids[end - 1] == tok.eos_token_id  # generation stops at <|im_end|>
    assert tok.decode(seg.ids[start:end]) == f"<action>go west</action>{IM_END}"
    assert seg.names[-1] == "response_close" and seg.offsets[-1] == len(seg) == len(seg.ids)


@pytest.mark.parametrize("parts, culprit", [
    ([("task", "go west"), ("history", "> look\n")], "'history' cannot start right after segment 'task'"),
    ([("task", "go west\n"), ("history", " > look\n")], "'history' cannot start right after segment 'task'"),
    ([("task", " go west\n")], "'task' cannot start right after segment 'user_open'"),
])
def test_unsafe_boundaries_are_refused_naming_the_piece(tok, parts, culprit):
    with pytest.raises(ValueError, match=culprit):
        encode_chat(tok, SYSTEM, parts)


def test_empty_pieces_and_special_token_boundaries(tok):
    # an empty piece has no tokens and no boundary; a piece may end anywhere before a special token
    seg = encode_segments(tok, [("a", "go west\n"), ("empty", ""), ("b", "open"), ("c", f"{IM_END}x")],
                          verify=True)
    assert seg.span("empty")[0] == seg.span("empty")[1] == seg.span("b")[0]


def test_bad_segment_arguments(tok):
    with pytest.raises(ValueError, match="segment names must be unique"):
        encode_segments(tok, [("a", "x\n"), ("a", "y")])
    with pytest.raises(ValueError, match="reserved for the chat framing"):
        chat_segments(None, [("system", "x")])
    with pytest.raises(TypeError, match=r"user_parts\[0\] must be a \(name, text\) pair"):
        chat_segments(None, ["just text"])
    with pytest.raises(KeyError, match="no segment named 'nope'"):
        encode_chat(tok, None, {"task": "x"}).span("nope")
