"""The own generation engine (rollout.engine=own; vLLM is vllm_engine.py): batched generation for seedfast
decoders (CPU and GPU), with a KV cache.

    sampler = Sampler(model, seed=0)
    params = SamplingParams(max_new_tokens=64, temperature=1.0, top_p=1.0, stop_ids=[im_end])
    ids = sampler.generate(prompts, params)
    gens = sampler.generate_full(prompts, params)   # + sampling log-probs and finish reasons

All prompts are prefilled in one packed forward (identical prompts once); then every unfinished sequence
advances by one token per step. Greedy generation (temperature 0: the policy writing its skills) of a repeated prompt
runs once and is copied, since it draws nothing. Both are the decoder's own (`Decoder.prefill` / `Decoder.decode` over a
preallocated StaticKVCache from seedfast/model/kv.py), so the layer math exists once. Logits exist only for
the last position of each sequence ([B, V] per step: sampling, not training); a tensor-parallel model samples
from its vocabulary shards instead (Gumbel-max, docs/scaling.md 'Tensor-parallel LM head'). A sequence finishes
when it emits a stop id (kept in its output) or reaches max_new_tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from seedfast.model.kv import StaticKVCache
from seedfast.model.lora import adapters_merged
from seedfast.model.packing import distinct, make_cu_seqlens
from seedfast.rollout.engine import Generation
from seedfast.rollout.sampling import sample_next
from seedfast.sampling_params import SamplingParams


class Sampler:
    """Generation engine over a seedfast `Decoder` (its forward, prefill, decode and `lm_head_weight`).

    `use_cache=False` re-runs the whole sequence every step (the no-cache baseline of tests and benchmarks).
    `max_batch_sequences` splits very large requests into chunks generated one after the other.
    Sampling draws from a torch.Generator seeded with `seed`; a call with `SamplingParams(seed=s)` reseeds it.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        seed: int = 0,
        use_cache: bool = True,
        max_batch_sequences: int | None = None,
    ) -> None:
        if not hasattr(model, "lm_head_weight"):
            raise TypeError(f"model must be a seedfast Decoder (with lm_head_weight), got {type(model).__name__}")
        if max_batch_sequences is not None and max_batch_sequences < 1:
            raise ValueError(f"max_batch_sequences must be None or >= 1, got {max_batch_sequences!r}")
        self.model = model
        self.use_cache = use_cache
        self.max_batch_sequences = max_batch_sequences
        self.device = model.lm_head_weight.device
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def generate(self, prompt_token_lists: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
        """Generated ids per prompt (the engine protocol)."""
        return [g.token_ids for g in self.generate_full(prompt_token_lists, params)]

    def generate_full(self, prompt_token_lists: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Generated ids, their sampling log-probs (see sampling.sample_next) and finish reasons."""
        prompts = self._check_prompts(prompt_token_lists)
        max_new_tokens, temperature, top_p = params.max_new_tokens, params.temperature, params.top_p
        stops = torch.tensor(params.stop_ids, dtype=torch.long, device=self.device)
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        if temperature == 0:  # greedy draws nothing: a repeated prompt's generation is the same, so it runs once
            first, owner = distinct(tuple(p) for p in prompts)
            if len(first) < len(prompts):
                unique = self.generate_full([prompts[i] for i in first], replace(params, seed=None))
                return [replace(unique[o], token_ids=list(unique[o].token_ids),
                                logprobs=None if unique[o].logprobs is None else list(unique[o].logprobs))
                        for o in owner]
        chunk = self.max_batch_sequences or max(len(prompts), 1)
        out: list[Generation] = []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), adapters_merged(self.model):
                for start in range(0, len(prompts), chunk):
                    out += self._generate_batch(prompts[start : start + chunk], max_new_tokens, temperature,
                                                top_p, stops)
        finally:
            self.model.train(was_training)
        return out

    def _generate_batch(
        self, prompts: list[list[int]], max_new: int, temperature: float, top_p: float, stops: torch.Tensor
    ) -> list[Generation]:
        B, device = len(prompts), self.device
        tokens = torch.zeros(B, max_new, dtype=torch.long, device=device)
        logprobs = torch.zeros(B, max_new, dtype=torch.float32, device=device)
        lengths = torch.zeros(B, dtype=torch.long, device=device)
        stopped = torch.zeros(B, dtype=torch.bool, device=device)
        # row r of the running batch (and of the cache) holds sequence seq_of_row[r]
        seq_of_row = torch.arange(B, device=device)
        alive = torch.ones(B, dtype=torch.bool, device=device)

        hidden, cache = self._prefill(prompts, max_new)
        for step in range(max_new):
            live = alive.nonzero().squeeze(1)
            seqs = seq_of_row[live]
            next_tok, next_lp = self._sample(hidden[live], temperature, top_p)
            tokens[seqs, step] = next_tok
            logprobs[seqs, step] = next_lp
            lengths[seqs] += 1
            hit_stop = torch.isin(next_tok, stops)
            stopped[seqs] = hit_stop
            alive[live[hit_stop]] = False
            if step + 1 == max_new or not bool(alive.any()):
                break
            if cache is None:
                seq_of_row = seq_of_row[alive]
                alive = alive[alive]
                hidden = self._forward_whole(prompts, seq_of_row, tokens[:, : step + 1])
                continue
            feed = torch.zeros_like(seq_of_row)
            feed[live] = next_tok
            # finished rows ride along (their outputs are ignored) until they are a quarter of the batch
            if 4 * int((~alive).sum()) >= alive.numel():
                keep = alive.nonzero().squeeze(1)
                cache, seq_of_row, alive, feed = cache.select(keep), seq_of_row[keep], alive[keep], feed[keep]
            hidden = self.model.decode(feed, cache)

        lengths_list, stopped_list = lengths.tolist(), stopped.tolist()
        tokens_list, logprobs_list = tokens.tolist(), logprobs.tolist()
        return [
            Generation(tokens_list[b][: lengths_list[b]], logprobs_list[b][: lengths_list[b]],
                       "stop" if stopped_list[b] else "length")
            for b in range(B)
        ]

    def _prefill(self, prompts: list[list[int]], max_new: int) -> tuple[torch.Tensor, StaticKVCache | None]:
        """Last-position hidden states [B, d] of all prompts (one packed forward) and the filled cache.

        Identical prompts (the N trajectories of a task at their first step, or after the same actions) are
        run once and share their keys/values.
        """
        first, owner = distinct(tuple(p) for p in prompts)
        inverse = torch.tensor(owner, device=self.device)
        unique = [prompts[i] for i in first]
        ids = torch.tensor([t for p in unique for t in p], dtype=torch.long, device=self.device)
        cu = make_cu_seqlens([len(p) for p in unique], self.device)
        if not self.use_cache:
            return self.model(ids, cu, keep_last=[1] * len(unique))[inverse], None
        capacity = max(len(p) for p in prompts) + max_new
        rows = inverse if len(unique) < len(prompts) else None
        hidden, cache = self.model.prefill(ids, cu, capacity, rows=rows)
        return hidden[inverse], cache

    def _forward_whole(self, prompts: list[list[int]], seqs: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
        """No cache: last hidden state of each sequence in `seqs`, re-running prompt + generated tokens."""
        rows = seqs.tolist()
        prompt_ids = [torch.tensor(prompts[b], dtype=torch.long, device=self.device) for b in rows]
        ids = torch.cat([t for p, g in zip(prompt_ids, generated[seqs]) for t in (p, g)])
        cu = make_cu_seqlens([len(prompts[b]) + generated.shape[1] for b in rows], self.device)
        return self.model(ids, cu, keep_last=[1] * len(rows))

    def _logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        return (last_hidden @ self.model.lm_head_weight.T).float()

    def _sample(self, last_hidden: torch.Tensor, temperature: float, top_p: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Next tokens and their log-probs; a tensor-parallel model's vocabulary-parallel sampling when it carries
        one (`model.head_ops`, distributed/vocab_head.py: no rank forms the [B, V] logits)."""
        ops = getattr(self.model, "head_ops", None)
        if ops is not None:
            return ops.sample_next(last_hidden, self.model.lm_head_weight, temperature, top_p, self.generator)
        return sample_next(self._logits(last_hidden), temperature, top_p, self.generator)

    def _check_prompts(self, prompt_token_lists: Sequence[Sequence[int]]) -> list[list[int]]:
        if isinstance(prompt_token_lists, (str, bytes)) or not isinstance(prompt_token_lists, Sequence):
            raise TypeError("prompt_token_lists must be a list of token-id lists")
        vocab = self.model.lm_head_weight.shape[0]
        prompts = []
        for i, prompt in enumerate(prompt_token_lists):
            ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt
            if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
                raise TypeError(f"prompt {i} must be a sequence of token ids, got {type(prompt).__name__}")
            if len(ids) == 0:
                raise ValueError(f"prompt {i} is empty: generation needs at least one prompt token")
            if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                bad = next(t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab)
                raise ValueError(f"prompt {i} holds {bad!r}, not a token id in [0, vocab_size={vocab})")
            prompts.append(list(ids))
        return prompts
