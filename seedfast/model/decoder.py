"""The decoder (Llama / Qwen2 / Qwen3) over packed variable-length sequences, returning final hidden states.

    hidden = model(input_ids [T] int64, cu_seqlens [B+1] int32)                       # [T, d], after final norm
    hidden = model(ids, cu, keep_last=[2, 1, ...])                 # [3 + ..., d]: each sequence's last rows only
    hidden, kv = model(ids, cu, position_ids=None, past=past_kv, return_kv=True)
    hidden, cache = model.prefill(ids, cu, capacity)              # [B, d] each prompt's last + a StaticKVCache
    hidden = model.decode(next_ids [B], cache)                                        # [B, d], one token per row
    logits would be hidden @ model.lm_head_weight.T -- never formed here (seedfast.ops streams it)

Both paths run the same layer modules (Attention.qkv / DecoderLayer.mlp_residual): only how attention reads
the cached keys differs (packed varlen for training and scoring, a padded static cache for generation).

Parameter names are transformers' own (model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight, ...,
model.norm.weight, lm_head.weight when untied), so HF state dicts load without a mapping table.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .attention import VarlenPlan, check_backend
from .attention_shared_past import SharedPastPlan
from .config import DecoderConfig
from .kv import DecodeStep, PackedKV, StaticKVCache, concat_gather_index
from .layers import RMSNorm, SwiGLU, apply_rope, rope_cos_sin, rope_inv_freq
from .packing import check_cu_seqlens, check_input_ids, lengths_of, make_cu_seqlens, positions_in_sequence


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(hd, config.rms_norm_eps)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        plan: VarlenPlan | SharedPastPlan,
        past_k: torch.Tensor | None,
        past_v: torch.Tensor | None,
        merge_index: torch.Tensor | None,
        keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Packed tokens x [T, d] -> (attention output [T, d], their keys and values [T, n_kv_heads, hd]). With `keep`
        (row indices), only those rows query: the output is [len(keep), d] and `plan` is the plan of their queries."""
        q, k, v = self.qkv(x, cos, sin, keep)
        if isinstance(plan, SharedPastPlan):  # the past is held once per owner (attention_shared_past.py)
            return self.project_out(plan(q, k, v, past_k, past_v, self.head_dim**-0.5)), k, v
        k_all, v_all = k, v
        if past_k is not None:
            k_all = torch.cat([past_k, k])[merge_index]
            v_all = torch.cat([past_v, v])[merge_index]
        out = plan(q, k_all, v_all, scale=self.head_dim**-0.5)
        return self.project_out(out), k, v

    def decode(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: StaticKVCache,
        layer: int,
        step: DecodeStep,
    ) -> torch.Tensor:
        """One token per cache row, x [B, d] -> [B, d]; writes its key/value into `cache` first.

        Plain SDPA over the step's span of cache columns with a per-row length mask: one query per row needs
        no varlen kernel, and the padded layout is what lets the cache grow in place.
        """
        q, k, v = self.qkv(x, cos, sin)
        keys, values = cache.write(layer, k, v, step)
        gqa = {"enable_gqa": True} if self.n_heads != self.n_kv_heads else {}
        out = F.scaled_dot_product_attention(
            q[:, :, None, :], keys, values, attn_mask=step.mask, scale=self.head_dim**-0.5, **gqa
        )
        return self.project_out(out)

    def qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_rows: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [N, heads, hd], k and v [N, kv_heads, hd] of tokens x [N, d]: projections, qk-norm, RoPE on q/k. With
        `q_rows`, q of those rows only."""
        N = x.shape[0]
        xq, cos_q, sin_q = (x, cos, sin) if q_rows is None else (x[q_rows], cos[q_rows], sin[q_rows])
        q = self.q_proj(xq).view(xq.shape[0], self.n_heads, self.head_dim)
        k = self.k_proj(x).view(N, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(N, self.n_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos_q, sin_q), apply_rope(k, cos, sin), v

    def project_out(self, attn: torch.Tensor) -> torch.Tensor:
        """o_proj of the per-head attention output of N tokens ([N, heads, hd] or [N, heads, 1, hd])."""
        return self.o_proj(attn.reshape(attn.shape[0], self.n_heads * self.head_dim))


class DecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        plan: VarlenPlan | SharedPastPlan,
        past_k: torch.Tensor | None,
        past_v: torch.Tensor | None,
        merge_index: torch.Tensor | None,
        keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer over packed tokens h [T, d]; with `keep` (row indices) every row's key and value but the
        output of those rows only ([len(keep), d]), `plan` being the plan of their queries."""
        attn, k, v = self.self_attn(self.input_layernorm(h), cos, sin, plan, past_k, past_v, merge_index, keep)
        return self.mlp_residual((h if keep is None else h[keep]) + attn), k, v

    def decode(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: StaticKVCache,
        layer: int,
        step: DecodeStep,
    ) -> torch.Tensor:
        """The layer for one token per cache row (see Attention.decode)."""
        attn = self.self_attn.decode(self.input_layernorm(h), cos, sin, cache, layer, step)
        return self.mlp_residual(h + attn)

    def mlp_residual(self, h: torch.Tensor) -> torch.Tensor:
        """The second half of the layer, shared by both paths: h + MLP(norm(h))."""
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderStack(nn.Module):
    """HF's `model.` submodule: embeddings, layers, final norm."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Decoder(nn.Module):
    def __init__(self, config: DecoderConfig, attn_backend: str = "auto") -> None:
        super().__init__()
        self.config = config
        self.attn_backend = check_backend(attn_backend)
        self.gradient_checkpointing = False  # recompute each layer in backward (saves activation memory)
        self.model = DecoderStack(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # a plain attribute, not a buffer: stays fp32 under model.to(bfloat16) and out of the state dict
        self.inv_freq = rope_inv_freq(config)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[V, d] LM head (the embedding matrix when tied)."""
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past: PackedKV | None = None,
        return_kv: bool = False,
        attn_backend: str | None = None,
        keep_last: Sequence[int] | None = None,
        past_owner: Sequence[int] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, PackedKV]:
        """Final hidden states [T, d] of a packed batch (after the final norm, never logits).

        position_ids default to 0, 1, ... per sequence, offset by that sequence's past length. With `past`,
        sequence b attends to past[b] and then causally to its own new tokens. `return_kv` also returns the new
        tokens' (post-RoPE) keys/values as a PackedKV laid out like input_ids.

        `keep_last[b]`: only the last keep_last[b] tokens of sequence b are wanted, and the hidden states are
        [sum(keep_last), d], those rows in packed order. The last layer then computes every token's key and value
        (the kept rows attend to them, and `return_kv` returns them) but queries, attention output and MLP for
        the kept rows alone: the same values, without the last layer's work for rows whose output nobody reads,
        e.g. a prompt's (docs/performance.md, 'The last layer runs only the rows that are read').

        `past_owner[b]`: sequence b attends to past[past_owner[b]] (past then holds the distinct pasts, any number),
        e.g. several responses to one teacher context, without a copy of that context's keys and values per response
        (model/attention_shared_past.py; its own attention, whatever the backend).
        """
        embed = self.model.embed_tokens.weight
        ids = self._check_ids(input_ids, embed.device)
        T = ids.shape[0]
        cu = check_cu_seqlens(cu_seqlens, T)
        if past_owner is not None and past is None:
            raise ValueError("past_owner needs a past (the distinct pasts it indexes)")
        past_cu = self._check_past(past, len(cu) - 1 if past_owner is None else None, embed) if past is not None \
            else None
        offsets = lengths_of(past_cu) if past_cu is not None else None
        merge_index = None
        keep, keep_plan = None, None
        if keep_last is not None:
            keep = _kept_rows(keep_last, cu, ids.device)
        if past_owner is not None:
            plan: VarlenPlan | SharedPastPlan = SharedPastPlan(cu, past_cu, past_owner, ids.device)
            offsets = [offsets[int(o)] for o in past_owner]
            if keep is not None:
                keep_plan = SharedPastPlan(cu, past_cu, past_owner, ids.device, keep_last)
        else:
            cu_k = cu_seqlens
            if past is not None:
                cu_k = past.cu_seqlens.to(cu_seqlens.device) + cu_seqlens
                merge_index, _ = concat_gather_index(past.cu_seqlens.to(ids.device), cu_seqlens.to(ids.device))
            plan = VarlenPlan(cu_seqlens, cu_k, attn_backend or self.attn_backend)
            if keep is not None:  # the kept rows' queries, bottom-right against each sequence's keys
                keep_plan = VarlenPlan(make_cu_seqlens([int(n) for n in keep_last], cu_k.device), cu_k,
                                       attn_backend or self.attn_backend)
        if position_ids is None:
            position_ids = positions_in_sequence(cu, ids.device, offsets)
        else:
            _check_position_ids(position_ids, ids)

        if self.inv_freq.device != ids.device:
            self.inv_freq = self.inv_freq.to(ids.device)
        h = self.model.embed_tokens(ids)
        cos, sin = rope_cos_sin(self.inv_freq, position_ids, h.dtype)
        keys, values = [], []
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            pk, pv = (past.keys[i], past.values[i]) if past is not None else (None, None)
            args = (h, cos, sin, plan, pk, pv, merge_index) if i < last or keep is None else (
                h, cos, sin, keep_plan, pk, pv, merge_index, keep)
            if self.gradient_checkpointing and torch.is_grad_enabled():
                h, k, v = checkpoint(layer, *args, use_reentrant=False)
            else:
                h, k, v = layer(*args)
            if return_kv:
                keys.append(k)
                values.append(v)
        h = self.model.norm(h)
        if return_kv:
            return h, PackedKV(keys, values, cu_seqlens)
        return h

    def prefill(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        capacity: int,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, StaticKVCache]:
        """The packed forward of prompts that will be decoded: the hidden state of each prompt's last token [B, d]
        (what the first sampled token reads) and a StaticKVCache with room for `capacity` tokens per row, row r
        holding sequence rows[r] (default: one row per sequence; repeats let identical prompts be run once and
        decoded many times)."""
        hidden, kv = self(input_ids, cu_seqlens, return_kv=True, keep_last=[1] * (cu_seqlens.numel() - 1))
        if rows is not None:
            kv = kv.select(rows)
        return hidden, StaticKVCache.from_packed(kv, capacity)

    def decode(self, input_ids: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """One token per cache row at position cache.lengths: final hidden states [B, d] (after the final norm,
        like forward). Writes the tokens' keys/values into `cache` and advances its lengths.

        Inference only (in-place cache writes): call under torch.inference_mode() or no_grad().
        """
        self._check_decode(input_ids, cache)
        step = cache.begin_step()
        h = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(self.inv_freq, cache.lengths, h.dtype)
        for i, layer in enumerate(self.model.layers):
            h = layer.decode(h, cos, sin, cache, i, step)
        cache.advance()
        return self.model.norm(h)

    def init_weights(self, seed: int = 0) -> Decoder:
        """From-scratch init (HF convention): normal(0, initializer_range) weights, zero biases, unit norms."""
        std = self.config.initializer_range
        device = self.model.embed_tokens.weight.device
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear | nn.Embedding):
                    module.weight.normal_(0.0, std, generator=gen)
                    if getattr(module, "bias", None) is not None:
                        module.bias.zero_()
                elif isinstance(module, RMSNorm):
                    module.weight.fill_(1.0)
        return self

    def _check_ids(self, input_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        ids = check_input_ids(input_ids)
        if ids.device != device:
            raise ValueError(f"input_ids is on {ids.device} but the model is on {device}")
        vocab = self.config.vocab_size
        if ids.numel() and bool(((ids < 0) | (ids >= vocab)).any()):
            bad = ids[(ids < 0) | (ids >= vocab)][:5].tolist()
            raise ValueError(f"input_ids must lie in [0, vocab_size={vocab}), got e.g. {bad}")
        return ids

    def _check_decode(self, input_ids: torch.Tensor, cache: StaticKVCache) -> None:
        """Shapes only: no host sync here (the step's one sync is the capacity check in cache.begin_step)."""
        if not isinstance(cache, StaticKVCache):
            raise TypeError(f"cache must be a StaticKVCache, got {type(cache).__name__}")
        if cache.num_layers != self.config.num_hidden_layers:
            raise ValueError(f"cache has {cache.num_layers} layers, the model has {self.config.num_hidden_layers}")
        if not isinstance(input_ids, torch.Tensor) or input_ids.shape != (cache.num_rows,):
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be [{cache.num_rows}] (one per cache row), got {shape}")

    def _check_past(self, past: PackedKV, batch: int | None, embed: torch.Tensor) -> list[int]:
        if not isinstance(past, PackedKV):
            raise TypeError(f"past must be a PackedKV, got {type(past).__name__}")
        past_cu = past.check()
        cfg = self.config
        if past.num_layers != cfg.num_hidden_layers:
            raise ValueError(f"past has {past.num_layers} layers, the model has {cfg.num_hidden_layers}")
        if batch is not None and len(past_cu) - 1 != batch:
            raise ValueError(f"past holds {len(past_cu) - 1} sequences but cu_seqlens describes {batch}")
        # the heads this process holds: all of them, or n_kv_heads / tp under tensor parallel (the attention modules
        # are narrowed by distributed/parallelize.py apply_tp; the config, which the HF export writes, stays global)
        expected = (self.model.layers[0].self_attn.n_kv_heads, cfg.head_dim)
        if tuple(past.keys[0].shape[1:]) != expected:
            raise ValueError(
                f"past keys must be [tokens, {expected[0]}, {expected[1]}], got {tuple(past.keys[0].shape)}"
            )
        if past.keys[0].dtype != embed.dtype or past.keys[0].device != embed.device:
            raise ValueError(
                f"past is {past.keys[0].dtype} on {past.keys[0].device}, the model {embed.dtype} on {embed.device}"
            )
        return past_cu


def _kept_rows(keep_last: Sequence[int], cu: list[int], device: torch.device) -> torch.Tensor:
    """The packed indices of each sequence's last keep_last[b] tokens (checked against the sequences)."""
    lengths = lengths_of(cu)
    keep_last = [int(n) for n in keep_last]
    if len(keep_last) != len(lengths):
        raise ValueError(f"keep_last has {len(keep_last)} entries for {len(lengths)} sequences")
    bad = [b for b, (n, length) in enumerate(zip(keep_last, lengths)) if not 0 <= n <= length]
    if bad:
        b = bad[0]
        raise ValueError(f"keep_last[{b}]={keep_last[b]} must lie in [0, {lengths[b]}] (sequence {b}'s tokens)")
    index = [t for b, n in enumerate(keep_last) for t in range(cu[b + 1] - n, cu[b + 1])]
    return torch.tensor(index, dtype=torch.long, device=device)


def _check_position_ids(position_ids: object, ids: torch.Tensor) -> None:
    if not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"position_ids must be a torch.Tensor or None, got {type(position_ids).__name__}")
    if position_ids.dtype != torch.int64 or position_ids.shape != ids.shape:
        raise ValueError(
            f"position_ids must be int64 of shape {tuple(ids.shape)}, got {position_ids.dtype} "
            f"{tuple(position_ids.shape)}"
        )
    if position_ids.device != ids.device:
        raise ValueError(f"position_ids is on {position_ids.device} but input_ids on {ids.device}")


def build_decoder(
    config: DecoderConfig,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    attn_backend: str = "auto",
    seed: int | None = 0,
) -> Decoder:
    """A from-scratch decoder; weights initialized with `seed` (None leaves torch's default init)."""
    model = Decoder(config, attn_backend=attn_backend)
    model = model.to(device=device, dtype=dtype)
    if seed is not None:
        model.init_weights(seed)
    return model
