"""The sampler's GPU fast path: what rollout.sample's textbook loop uses where it pays, on a GPU at long lengths.

    PreallocatedLayer, preallocated_cache   the KV cache allocated once and filled in place (transformers' own grows
                                            by torch.cat: O(T^2) copies over a response of T tokens)
    grouped_attention, use_grouped_attention  decode attention that reads the KV heads as they are cached, where
                                            transformers' SDPA path copies them to every query head at every step
                                            (releases before pack_gqa, the lent GPU image's 5.17 among them)
    on_fast_path(device)                    where each is used by default: CUDA

Both keep the numbers: the preallocated cache draws the same samples as transformers' cache bit for bit, the grouped
attention equals transformers' SDPA to rounding (about 1e-7 in float32: other kernels, not other arithmetic). On a
CPU the sampler keeps transformers' own: at the CPU presets' lengths neither pays enough to be worth changing the
demo's bits (the preallocated cache measured 0.97x at the demo's lengths, docs/results.md, "The sampler").
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.integrations import sdpa_attention as transformers_sdpa
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED = "sdpa_grouped"  # the attention's name; with "sdpa" in it transformers runs its SDPA checks for it
# Newer transformers releases (5.23 has it, 5.19 has not) do what grouped_attention does in their own SDPA path
# (pack_gqa: a one-token query's heads stacked by KV group, nothing copied): the sampler then keeps theirs.
TRANSFORMERS_DECODES_GROUPED = hasattr(transformers_sdpa, "pack_gqa")


def on_fast_path(device: torch.device) -> bool:
    """Whether the sampler takes the fast path on device by default: on a GPU (CUDA), not on a CPU."""
    return torch.device(device).type == "cuda"


# ---- the KV cache, allocated once ------------------------------------------------------------------------------

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
    (It subclasses transformers' DynamicLayer, whose interface is not a public one: tests/test_decoding.py checks
    it against the releases the project supports.)
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


# ---- decode attention without copying K and V to every query head ----------------------------------------------

def _grouped_mask(attention_mask: torch.Tensor, n_kv: int, groups: int):
    """The mask of a one-token query, [b or 1, 1 or Hq, 1, L], laid out for the grouped query [b, Hkv, G, L];
    None when it has another shape (the caller then takes transformers' own path)."""
    if attention_mask.dim() != 4 or attention_mask.shape[-2] != 1:
        return None
    if attention_mask.shape[1] == 1:  # [b, 1, 1, L] broadcasts over (Hkv, G) as it is: no copy
        return attention_mask
    if attention_mask.shape[1] == n_kv * groups:  # a per-head mask [b, Hq, 1, L]: h = k * G + g -> [b, Hkv, G, L]
        return attention_mask.reshape(attention_mask.shape[0], n_kv, groups, attention_mask.shape[-1])
    return None


def grouped_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention (integrations/sdpa_attention.py), but a one-token query reads the Hkv cached
    key/value heads as they are. query [b, Hq, q, d], key and value [b, Hkv, L, d], attention_mask (bool, True =
    attend, or additive float) [b, 1, q, L] or None -> ([b, q, Hq, d], None).

    transformers repeats K and V from Hkv to Hq heads (repeat_kv) whenever a mask is passed, and a left-padded decode
    batch always has one: every decode step copies the whole cache Hq / Hkv times (7x for Qwen2.5-0.5B's 14 / 2
    heads), the HF sampler's main cost late in a long rollout on a GPU. For one query token the G = Hq / Hkv query
    heads that share a KV head can be stacked as G query rows of that head instead:

        query [b, Hq, 1, d] -> [b, Hkv, G, d]   (h = k * G + g, repeat_kv's order); key, value as cached
        mask  [b, 1, 1, L]  broadcasts over (Hkv, G): the one query row's mask holds for every head of the group
        out   [b, Hkv, G, d] -> [b, Hq, 1, d] -> [b, 1, Hq, d]

    the same arithmetic, reading K and V once. is_causal is False there: the G rows are heads, not positions, and one
    query token sees every cached column. Every other call (q > 1: prefill, scoring, training; dropout; a paged
    cache; a position bias; no key/value groups) is transformers' own sdpa_attention_forward, unchanged."""
    b, n_q, q_len, d = query.shape
    n_kv = key.shape[1]
    groups = n_q // n_kv
    mask = None if attention_mask is None else _grouped_mask(attention_mask, n_kv, groups)
    if (q_len != 1 or groups == 1 or n_q != n_kv * groups or (attention_mask is not None and mask is None)
            or dropout != 0.0 or kwargs.get("position_bias") is not None or kwargs.get("output_attentions", False)
            or type(kwargs.get("cache")).__name__ == "PagedAttentionCache"):  # 5.19 writes a paged cache first
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query.reshape(b, n_kv, groups, d), key, value, attn_mask=mask,
                                         scale=scaling, is_causal=False)  # [b, Hkv, G, dv]
    return out.reshape(b, n_q, 1, value.shape[-1]).transpose(1, 2).contiguous(), None  # [b, 1, Hq, dv]


def use_grouped_attention(model) -> bool:
    """Switch model (a Hugging Face model on transformers' SDPA attention) to grouped_attention for its decode
    steps; True if it now uses it. The mask function is registered under the same name, for masking_utils builds
    no mask at all for a name it does not know (it assumes a backend that masks by itself), and left-padded rows
    would then attend to their padding. A model on another attention (eager, flash) is left as it is, and so is every
    model where transformers' own SDPA already decodes grouped (TRANSFORMERS_DECODES_GROUPED: False is returned). The
    name is not saved with the model's config (transformers leaves it out), so checkpoints do not depend on it."""
    if TRANSFORMERS_DECODES_GROUPED or getattr(model.config, "_attn_implementation", None) not in ("sdpa", GROUPED):
        return False
    register()
    model.set_attn_implementation(GROUPED)
    return True


def register() -> str:
    """grouped_attention and transformers' SDPA mask registered under GROUPED (library-wide; again is harmless)."""
    AttentionInterface.register(GROUPED, grouped_attention)
    AttentionMaskInterface.register(GROUPED, sdpa_mask)
    return GROUPED
