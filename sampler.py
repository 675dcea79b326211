"""The HF sampler: our own KV-cached sampling loop over a Hugging Face causal LM, which engines.HFEngine runs and
makes Rollouts of.

    sample_next                  one step: temperature, top-p, greedy at temperature 0 -> the token, its log-prob
                                 under the distribution sampled from, the policy's entropy
    sample                       the loop: the G samples of a prompt share one prefill, finished rows leave the
                                 batch (COMPACT_FRACTION) -> tokens, log-probs, entropy [B, T0]
    PreallocatedLayer,           the KV cache, one buffer per layer allocated for prompt + max_new_tokens and
    preallocated_cache           filled in place
    kv_cache_bytes_per_token     what that cache holds per token of one sequence, measured
"""
from __future__ import annotations

import contextlib
import inspect

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from rollout import entropy_of, position_ids


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
    therefore NOT the policy's log-prob at that temperature (rollout.response_logprobs computes that one); with
    top_p = 1 the two agree. temperature 0 is greedy: the token is the argmax and its log-prob is taken at
    temperature 1 (the sampling distribution itself would be a point mass, log-prob 0, which tells nothing).
    The entropy is the policy's at that temperature, before top-p, H = logsumexp(z) - sum_v softmax(z)_v z_v with
    z = logits / temperature (temperature 1 when greedy): what rollout.response_logprobs(with_entropy=True)
    computes.
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
    repeated n times (on the demo the prefill of 128 rows was a quarter of a rollout; see docs/results.md).
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
