"""A byte-level BPE tokenizer trained on game text, with ChatML special tokens and segment encoding.

    tok = train_tokenizer(texts, vocab_size=2048)      # a transformers PreTrainedTokenizerFast
    save_tokenizer(tok, "runs/demo/tokenizer")        # AutoTokenizer.from_pretrained loads it offline
    seg = encode_chat(tok, system, [("task", ...), ("history", ...), ("observation", ...)])
    seg.ids == tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    seg.span("history")                                 # token boundaries of a part, e.g. for k_ins

Why segments work: the pre-tokenizer isolates every newline before the byte-level split, so no BPE
merge crosses a newline, and special tokens are never merged with anything. Text pieces that meet
right after a newline (or at a special token) therefore tokenize the same alone as in the joined
text, and inserting a piece (a skill) leaves the ids of every other piece unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

ENDOFTEXT, IM_START, IM_END, PAD = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, PAD)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Names of the pieces encode_chat adds around the caller's user parts.
FRAME_NAMES = ("system", "user_open", "user_close", "assistant_open", "response", "response_close")


def _checked_texts(texts: Iterable[str], counter: list[int]) -> Iterator[str]:
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be an iterable of strings, not a single string")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
        counter[0] += 1
        yield text


def _byte_level_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` (any text encodes: all 256 bytes are in the vocabulary).

    The vocabulary is at most `vocab_size` (a small corpus stops earlier: no merge is left that is
    seen `min_frequency` times). `eos_token` is <|im_end|>, which ends every assistant turn.
    """
    floor = 256 + len(SPECIAL_TOKENS)
    if not isinstance(vocab_size, int) or vocab_size < floor:
        raise ValueError(f"vocab_size must be an int >= {floor} (256 bytes + special tokens), got {vocab_size!r}")
    if not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"min_frequency must be an int >= 1, got {min_frequency!r}")
    tok = _byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    count = [0]
    tok.train_from_iterator(_checked_texts(texts, count), trainer=trainer)
    if count[0] == 0:
        raise ValueError("texts is empty: a tokenizer needs some text to learn merges from")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        chat_template=CHATML_TEMPLATE,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """save_pretrained into `path`; the folder then loads with AutoTokenizer.from_pretrained."""
    path = Path(path)
    tokenizer.save_pretrained(path)
    config = path / "tokenizer_config.json"
    # transformers 5 writes its own class name; the generic one also loads under transformers 4.
    text = config.read_text().replace('"tokenizer_class": "TokenizersBackend"',
                                      '"tokenizer_class": "PreTrainedTokenizerFast"')
    config.write_text(text)
    return path


def is_tokenizer_folder(path: str | Path) -> bool:
    """Whether `path` is a tokenizer folder: it holds tokenizer_config.json (what save_tokenizer writes)."""
    return Path(path, "tokenizer_config.json").is_file()


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer folder from disk only (never the network)."""
    if not is_tokenizer_folder(path):
        raise ValueError(f"path {str(path)!r} is not a tokenizer folder (no tokenizer_config.json)")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def render_chat(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False) -> str:
    """The text CHATML_TEMPLATE renders, without Jinja (tests hold the two equal)."""
    out = [f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages]
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)


@dataclass(frozen=True)
class Segments:
    """Token ids of consecutive named text pieces; `ids` is their concatenation."""

    names: tuple[str, ...]
    pieces: tuple[tuple[int, ...], ...]

    @property
    def ids(self) -> list[int]:
        return [t for piece in self.pieces for t in piece]

    @property
    def offsets(self) -> list[int]:
        """Start index of each piece in `ids`, plus the total length at the end."""
        out = [0]
        for piece in self.pieces:
            out.append(out[-1] + len(piece))
        return out

    def span(self, name: str) -> tuple[int, int]:
        """[start, end) of the named piece in `ids`."""
        if name not in self.names:
            raise KeyError(f"no segment named {name!r}; segments are {list(self.names)}")
        i = self.names.index(name)
        offsets = self.offsets
        return offsets[i], offsets[i + 1]

    def __len__(self) -> int:
        return sum(len(p) for p in self.pieces)


def _meets_safely(left: str, right: str) -> bool:
    if any(left.endswith(s) for s in SPECIAL_TOKENS) or any(right.startswith(s) for s in SPECIAL_TOKENS):
        return True
    # After a newline, a piece that starts with whitespace could still merge with it in tokenizers
    # whose pre-tokenizer groups whitespace runs (Qwen2's does); ours would not, but the rule is shared.
    return left.endswith("\n") and not right[:1].isspace()


def encode_segments(tokenizer: PreTrainedTokenizerBase, segments: Sequence[tuple[str, str]],
                    verify: bool = False) -> Segments:
    """Encode (name, text) pieces one by one so that concatenated ids == encoding of the joined text.

    Every boundary between non-empty pieces must be at a special token, or right after a newline
    with the next piece not starting with whitespace; otherwise ValueError names the piece.
    `verify=True` also encodes the joined text and checks the equality (for other tokenizers).
    """
    names = [name for name, _ in segments]
    if len(set(names)) != len(names):
        raise ValueError(f"segment names must be unique, got {names}")
    prev_name, prev_text = None, ""
    for name, text in segments:
        if not isinstance(text, str):
            raise TypeError(f"segment {name!r} must be a str, got {type(text).__name__}")
        if text and prev_text and not _meets_safely(prev_text, text):
            raise ValueError(
                f"segment {name!r} cannot start right after segment {prev_name!r}: the previous piece must end "
                f"with a newline (and this one must not start with whitespace) so that no BPE merge crosses "
                f"the boundary; got ...{prev_text[-20:]!r} + {text[:20]!r}...")
        if text:
            prev_name, prev_text = name, text
    pieces = tuple(tuple(tokenizer.encode(text, add_special_tokens=False)) if text else ()
                   for _, text in segments)
    out = Segments(tuple(names), pieces)
    if verify:
        joined = tokenizer.encode("".join(text for _, text in segments), add_special_tokens=False)
        if joined != out.ids:
            raise ValueError("segment ids differ from the ids of the joined text for this tokenizer")
    return out


def chat_segments(system: str | None, user_parts: Sequence[tuple[str, str]] | Mapping[str, str],
                  response: str | None = None, add_generation_prompt: bool = True) -> list[tuple[str, str]]:
    """ChatML text of one system + user (+ assistant) exchange, cut into named pieces.

    Joined, the pieces equal render_chat / apply_chat_template of the same messages: with
    `response`, the assistant message is included (`response` piece = its text + <|im_end|>, as
    generated); otherwise the generation prompt is appended if `add_generation_prompt`.
    """
    parts = list(user_parts.items()) if isinstance(user_parts, Mapping) else list(user_parts)
    for i, part in enumerate(parts):
        if not (isinstance(part, tuple) and len(part) == 2 and all(isinstance(x, str) for x in part)):
            raise TypeError(f"user_parts[{i}] must be a (name, text) pair of strings, got {part!r}")
        if part[0] in FRAME_NAMES:
            raise ValueError(f"user part name {part[0]!r} is reserved for the chat framing {FRAME_NAMES}")
    out = []
    if system is not None:
        out.append(("system", f"{IM_START}system\n{system}{IM_END}\n"))
    out += [("user_open", f"{IM_START}user\n"), *parts, ("user_close", f"{IM_END}\n")]
    if response is not None:
        out += [("assistant_open", f"{IM_START}assistant\n"), ("response", f"{response}{IM_END}"),
                ("response_close", "\n")]
    elif add_generation_prompt:
        out.append(("assistant_open", f"{IM_START}assistant\n"))
    return out


def encode_chat(tokenizer: PreTrainedTokenizerBase, system: str | None,
                user_parts: Sequence[tuple[str, str]] | Mapping[str, str], response: str | None = None,
                add_generation_prompt: bool = True, verify: bool = False) -> Segments:
    """encode_segments(chat_segments(...)): the templated prompt's ids with each part's boundaries."""
    return encode_segments(tokenizer, chat_segments(system, user_parts, response, add_generation_prompt), verify)
