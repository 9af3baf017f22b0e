"""Hand arithmetic of the memory-plan tests (test_plan.py, test_lora_plan.py): parameters of the Qwen2 layout."""

from __future__ import annotations


def hand_parameters(shape: dict, tp: int) -> tuple[int, int]:
    """(all parameters, the parameters one rank of a tp-way tensor-parallel group holds), from the Qwen2 layout:
    q/k/v with bias, o and the SwiGLU MLP split tp ways, the two norms per layer and the final norm replicated,
    embedding and (untied) LM head split over the vocabulary."""
    d, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, kv, vocab = shape["num_attention_heads"], shape["num_key_value_heads"], shape["vocab_size"]
    hd = d // heads
    split = (d * heads * hd + heads * hd) + 2 * (d * kv * hd + kv * hd) + heads * hd * d + 3 * d * inter
    heads_total = vocab * d * (1 if shape["tie_word_embeddings"] else 2)
    total = layers * (split + 2 * d) + heads_total + d
    local = layers * (split // tp + 2 * d) + heads_total // tp + d
    return total, local
