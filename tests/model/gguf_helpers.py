"""A tiny Llama GGUF written with the `gguf` package's own writer, and a plain-Python byte-level BPE to check
tokenizers against (GPT-2's published split regex, digits isolated first as llama.cpp does for 'smollm')."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import regex
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = ["go north. open the chest 12 times, then 345 more!\n", "You are in a kitchen.  There is a table here.\n",
          "Admissible actions: go east, take key, unlock door with key\n\n", "1 2 3 42 1000 and 7x7=49\n"] * 20
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
TINY = {"vocab_size": None, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def train_vocab() -> tuple[list[str], list[str]]:
    """Tokens (specials first, then GPT-2's byte alphabet and merges) and merges of a small byte-level BPE."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    model = __import__("json").loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py stores q and k with the rotary halves interleaved; loaders undo it
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, qtype: str = "Q4_1", seed: int = 0) -> transformers.LlamaForCausalLM:
    """A random tiny tied Llama written to `path` as llama.cpp would (q/k permuted, 2-D weights in `qtype`,
    norms in F32, byte-level 'smollm' tokenizer); returns the model holding exactly the weights a reader of the
    file gets, each 2-D weight quantized and dequantized by the gguf package's numpy reference."""
    import gguf
    from gguf import GGMLQuantizationType

    tokens, merges = train_vocab()
    cfg = transformers.LlamaConfig(**{**TINY, "vocab_size": len(tokens)}, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5 if "norm" in name
                    else torch.randn(p.shape, generator=gen) * 0.2)
    qt = GGMLQuantizationType[qtype]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(TINY["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for i in range(cfg.num_hidden_layers):
        names.update({f"model.layers.{i}.{k}.weight": f"blk.{i}.{v}.weight" for k, v in parts.items()})
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if name == "lm_head.weight":
                continue
            x = p.numpy().astype(np.float32)
            if x.ndim == 1:
                w.add_tensor(names[name], x)
                continue
            heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
            n_head = next((n for k, n in heads.items() if k in name), None)
            stored = _llama_cpp_permute(x, n_head) if n_head else x
            w.add_tensor(names[name], gguf.quants.quantize(stored, qt), raw_dtype=qt)
            # blocks run along a row and the permutation moves whole rows, so the rows come back unpermuted
            p.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(x, qt), qt).reshape(x.shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


@lru_cache(maxsize=1)
def _byte_chars() -> dict[int, str]:
    # GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others move to 256 + n
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _pieces(pattern: str, texts: list[str]) -> list[str]:
    out = []
    for text in texts:
        out += [m.group() for m in regex.finditer(pattern, text)]
    return out


def reference_encode(text: str, tokens: list[str], merges: list[str], specials=SPECIALS) -> list[int]:
    """Byte-level BPE of `text`: special tokens whole, digits alone, GPT-2's split, then the lowest-rank merge
    first until none applies."""
    ids = {t: i for i, t in enumerate(tokens)}
    rank = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
    chars = _byte_chars()
    out: list[int] = []
    for chunk in regex.split("(" + "|".join(regex.escape(s) for s in specials) + ")", text):
        if chunk in specials:
            out.append(ids[chunk])
            continue
        digits_alone = [p for p in regex.split(r"(\p{N})", chunk) if p]
        for piece in _pieces(GPT2_SPLIT, digits_alone):
            word = [chars[b] for b in piece.encode()]
            while len(word) > 1:
                pairs = [(rank.get((a, b), len(rank)), j) for j, (a, b) in enumerate(zip(word, word[1:]))]
                best, j = min(pairs)
                if best == len(rank):
                    break
                word[j:j + 2] = [word[j] + word[j + 1]]
            out += [ids[w] for w in word]
    return out
