"""The tokenizer SFT starts with: the base model's, model.tokenizer, or, for a tiny model, a byte-level BPE trained on
the text SFT and RL show it (tokenizer_corpus) and kept in <run_dir>/tokenizer beside the fingerprint of that corpus."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seedfast.config import Config, ConfigError
from seedfast.context.skill import render_skill
from seedfast.model.tokenizer import is_tokenizer_folder, load_tokenizer, render_chat, save_tokenizer, train_tokenizer
from seedfast.rollout.prompts import UNPARSABLE_FEEDBACK, PromptStyle, Turn, user_parts
from seedfast.runtime.setup import base_policy_path, load_run_tokenizer, tokenizer_folder
from seedfast.sft.folder import write_folder
from seedfast.sft.replay import GameReplays
from seedfast.skills.analyzers import oracle_answer
from seedfast.skills.prompts import build_analyzer_messages

FINGERPRINT_NAME = "seedfast_corpus.sha256"  # beside a tokenizer trained here: what it was trained on


def ordinary_ids(tokenizer: Any) -> list[int]:
    """Every id of the tokenizer but its special tokens: what the copy task draws from."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def tokenizer_corpus(replays: Sequence[GameReplays], pairs: Sequence[tuple[list[dict], str, str]],
                     style: PromptStyle, skill_mode: str = "episode_only") -> list[str]:
    """ChatML text of what SFT and RL show the tiny model: step prompts with their answers, skills,
    analyzer prompts with their answers, pairs from a file, and the fixed feedback texts."""
    from seedfast.envs.textworld_env import INVALID_ACTION_TEXT

    texts = [UNPARSABLE_FEEDBACK, INVALID_ACTION_TEXT]
    for game in replays:
        trajectory = game.success
        for index, step in enumerate(trajectory.steps):
            history = [Turn(s.observation, s.action) for s in trajectory.steps[:index]]
            parts = user_parts(trajectory.task, history, step.observation, step.admissible_actions, index,
                               style)
            user = "".join(text for _, text in parts)
            messages = [{"role": "system", "content": style.system}, {"role": "user", "content": user}]
            texts.append(render_chat(messages, add_generation_prompt=True) + f"<action>{step.action}</action>")
        for t in (trajectory, *game.failures):
            answer = oracle_answer(t, with_step_skills=skill_mode != "episode_only")
            texts.append(render_chat([*build_analyzer_messages(t, skill_mode),
                                      {"role": "assistant", "content": json.dumps(answer)}]))
            texts += [render_skill(text) for text in (answer["episode_skill"], *answer.get("step_skills", {}).values())]
    texts += [render_chat([*prompt, {"role": "assistant", "content": answer}]) for prompt, answer, _ in pairs]
    return texts


def initial_tokenizer(cfg: Config, corpus: Sequence[str]) -> Any:
    """The tokenizer of `initial_policy`, in the run's one order (runtime/setup.py tokenizer_folder); a tiny
    model's is trained on `corpus` and saved there when there is none."""
    base = base_policy_path(cfg)
    if base is not None:
        return load_run_tokenizer(cfg, base)
    tok_dir = tokenizer_folder(cfg, None)  # model.tokenizer, else <run_dir>/tokenizer
    if cfg.model.tokenizer and is_tokenizer_folder(tok_dir):
        return load_tokenizer(tok_dir)  # model.tokenizer: the user's choice, used as it is
    tiny = cfg.model.tiny
    fingerprint = corpus_fingerprint(corpus, tiny.bpe_vocab_size, tiny.bpe_min_frequency)
    stamp = tok_dir / FINGERPRINT_NAME
    if is_tokenizer_folder(tok_dir):
        # this run's earlier tokenizer, kept only when trained on this very corpus with these settings: a run
        # folder reused after the games, the prompts or the code changed would otherwise train on a stale one
        if stamp.is_file() and stamp.read_text().strip() == fingerprint:
            return load_tokenizer(tok_dir)
        print(f"sft: {tok_dir} was trained on another corpus or with other settings: training a new tokenizer",
              file=sys.stderr)
    if not corpus:
        raise ConfigError("a tiny model needs text to train its tokenizer on: set sft.behaviour_cloning=true "
                          "or give sft.data")
    tokenizer = train_tokenizer(list(corpus), vocab_size=tiny.bpe_vocab_size, min_frequency=tiny.bpe_min_frequency)

    def write(tmp: Path) -> None:
        save_tokenizer(tokenizer, tmp)
        (tmp / FINGERPRINT_NAME).write_text(fingerprint + "\n")

    write_folder(tok_dir, write)
    return tokenizer


def corpus_fingerprint(corpus: Sequence[str], vocab_size: int, min_frequency: int) -> str:
    """sha256 of the tokenizer's training input: the settings and every text, length-prefixed."""
    h = hashlib.sha256(f"bpe {vocab_size} {min_frequency}\n".encode())
    for text in corpus:
        data = text.encode()
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()
