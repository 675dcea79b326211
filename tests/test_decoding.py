"""machinery/decoding.py, the sampler's GPU fast path: the grouped decode attention against transformers' own SDPA
path (the same samples, log-probs to rounding, no K/V copied to every query head), on a tiny Qwen2 with
Qwen2.5-0.5B's head layout (14 query heads, 2 KV heads); what is left alone (prefill, scoring, training: bit for bit;
a CPU by default; the saved config). The preallocated cache's own tests are in test_rollout.py."""
import json
import os

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa_module
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.cache_utils import DynamicLayer

from machinery import decoding
from machinery.decoding import GROUPED, grouped_attention
from machinery.engines import HFEngine
from rollout import Rollout, position_ids, response_logprobs

HQ, HKV, D = 14, 2, 16
PROMPTS = ["1+2=", "a much longer prompt, to pad the others:", "xyz", "9-4+7="]  # left padding
ATOL = 1e-5  # float32: the same arithmetic through other kernels (about 1e-7 measured)


@pytest.fixture
def model(tokenizer):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=HQ * D, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=D, max_position_embeddings=256,
                         initializer_range=0.1, tie_word_embeddings=True, attn_implementation="sdpa",
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return Qwen2ForCausalLM(config).float().eval()


@pytest.fixture
def calls(monkeypatch):
    """Counts repeat_kv (transformers' SDPA path copying K and V to every query head) and the grouped decode steps
    (the one call of torch's SDPA in decoding.py), during whatever runs after the fixture."""
    counts = {"repeat_kv": 0, "grouped": 0}
    repeat, sdpa = sdpa_module.repeat_kv, decoding.F.scaled_dot_product_attention

    def counting_repeat(*a, **kw):
        counts["repeat_kv"] += 1
        return repeat(*a, **kw)

    def counting_sdpa(*a, **kw):
        counts["grouped"] += 1
        return sdpa(*a, **kw)
    monkeypatch.setattr(sdpa_module, "repeat_kv", counting_repeat)
    monkeypatch.setattr(decoding, "F", type("F", (), {"scaled_dot_product_attention": staticmethod(counting_sdpa)}))
    return counts


def grouped(model):
    """model switched to grouped_attention whatever the release (use_grouped_attention declines where transformers'
    own SDPA already decodes grouped; the function is still the one the lent image's release needs)."""
    decoding.register()
    model.set_attn_implementation(GROUPED)
    return model


def test_the_hf_engines_grouped_decode_samples_what_sdpa_samples_without_copying_kv(model, tokenizer, calls):
    """The HF engine on grouped_attention against transformers' SDPA on the same weights, prompts of four lengths
    (left padding: a mask at every decode step) and seed, 4 samples each, ragged lengths: the same tokens, log-probs
    and entropies to rounding; every decode step of both layers took the grouped path, and repeat_kv (which copies
    the cache 7x at this head layout) ran only in the prefill. transformers' own SDPA copies at every decode step in
    releases without pack_gqa (5.17, 5.19: the engine then switches to grouped_attention on a GPU) and only in the
    prefill in releases with it (5.23: the engine leaves it alone)."""
    generate, widths = dict(n=4, seed=5), []
    model.register_forward_pre_hook(lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                    with_kwargs=True)
    plain = HFEngine(model, tokenizer, max_new_tokens=20, grouped_decode=False)
    assert not plain.grouped_decode and model.config._attn_implementation == "sdpa"
    ref = plain.generate(PROMPTS, **generate)
    decode_steps = widths.count(1)  # forward passes of one new token a row
    assert decode_steps >= ref.T - 1 and calls["grouped"] == 0
    copying = len(widths) - decode_steps if decoding.TRANSFORMERS_DECODES_GROUPED else len(widths)
    assert calls["repeat_kv"] == 2 * 2 * copying  # K and V of 2 layers, in every pass that copies
    assert HFEngine(model, tokenizer, grouped_decode=True).grouped_decode != decoding.TRANSFORMERS_DECODES_GROUPED
    calls.update(repeat_kv=0)
    engine = HFEngine(grouped(model), tokenizer, max_new_tokens=20, grouped_decode=False)
    got = engine.generate(PROMPTS, **generate)
    assert calls["grouped"] == 2 * decode_steps and calls["repeat_kv"] == 2 * 2  # the prefill only
    assert len(set(got.lengths.tolist())) > 1  # rows left the batch on the way (compaction, with its mask)
    assert torch.equal(got.response_ids, ref.response_ids)
    torch.testing.assert_close(got.sampler_logprobs, ref.sampler_logprobs, atol=ATOL, rtol=0)
    torch.testing.assert_close(got.entropy, ref.entropy, atol=ATOL, rtol=0)


def test_a_decode_step_expands_no_kv_tensor(model, calls):
    """One decode step of a left-padded batch under the grouped attention: no aten op makes a tensor of K or V
    expanded to the 14 query heads ([B, 14, L, D] or [B, 2, 7, L, D]); under transformers' SDPA two layers make
    them in releases without pack_gqa (the expansion issue 61 measured at 184 KB per row-token of context at
    Qwen2.5-0.5B), none in releases with it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Shapes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.seen += [tuple(t.shape) for t in (out if isinstance(out, (tuple, list)) else (out,))
                          if isinstance(t, torch.Tensor)]
            return out
    lengths = [7, 3, 5, 1]
    ids = torch.randint(1, 50, (4, 7), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(7)[None, :] >= 7 - torch.tensor(lengths)[:, None]).long()  # [4, 7] left-padded
    expanded = {}
    for name in ("sdpa", GROUPED):
        if name == GROUPED:
            grouped(model)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True)
            shapes = Shapes()
            with shapes:
                model(input_ids=out.logits[:, -1].argmax(-1)[:, None], attention_mask=torch.cat(
                      [mask, torch.ones(4, 1, dtype=torch.long)], 1), position_ids=position_ids(mask)[:, -1:] + 1,
                      past_key_values=out.past_key_values, use_cache=True)
        expanded[name] = [s for s in shapes.seen if s in ((4, HQ, 8, D), (4, HKV, HQ // HKV, 8, D))]
    assert expanded[GROUPED] == []
    if decoding.TRANSFORMERS_DECODES_GROUPED:
        assert expanded["sdpa"] == []
    else:
        assert len(expanded["sdpa"]) >= 2 * 2


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "bool_per_head", "float_batch1"])
def test_grouped_attention_equals_transformers_sdpa_for_every_mask_form(mask_kind):
    """The function itself against sdpa_attention_forward for one query token, with every mask form transformers
    may pass (a per-head mask checks the head -> group order) and any is_causal."""
    g = torch.Generator().manual_seed(3)
    b, L = 3, 11
    q = torch.randn(b, HQ, 1, D, generator=g)
    k, v = torch.randn(b, HKV, L, D, generator=g), torch.randn(b, HKV, L, D, generator=g)
    keep = torch.rand(b, 1, 1, L, generator=g) > 0.3
    keep[..., -1] = True
    per_head = torch.rand(b, HQ, 1, L, generator=g) > 0.5
    per_head[..., -1] = True
    low = torch.finfo(torch.float32).min
    mask = {"none": None, "bool": keep, "float": torch.zeros(b, 1, 1, L).masked_fill(~keep, low),
            "bool_per_head": per_head, "float_batch1": torch.zeros(1, 1, 1, L).masked_fill(~keep[:1], low)}[mask_kind]
    module = type("Attention", (torch.nn.Module,), {"num_key_value_groups": HQ // HKV, "is_causal": True})()
    for is_causal in (None, True, False):
        ref, _ = sdpa_module.sdpa_attention_forward(module, q, k, v, mask, scaling=0.3, is_causal=is_causal)
        got, weights = grouped_attention(module, q, k, v, mask, scaling=0.3, is_causal=is_causal)
        assert weights is None and got.shape == (b, 1, HQ, D) and got.is_contiguous()
        torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_prefill_scoring_and_training_stay_transformers_own_bit_for_bit(model, tokenizer, calls):
    """Passes of more than one query token (the prefill, the scoring pass, the update's forward and backward) take
    transformers' own SDPA path under the grouped attention: the same log-probs and gradients bit for bit."""
    ids = torch.randint(1, 50, (3, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6, [0, 0, 0, 0, 1, 1]])
    lengths = torch.tensor([4, 1, 3])
    response_mask = (torch.arange(4)[None, :] < lengths[:, None]).long()
    r = Rollout(prompt_ids=ids, prompt_mask=mask, response_ids=torch.randint(1, 50, (3, 4)) * response_mask,
                response_mask=response_mask, lengths=lengths, truncated=torch.zeros(3, dtype=torch.bool),
                sampler_logprobs=torch.zeros(3, 4), prompt_index=torch.arange(3), texts=[""] * 3,
                pad_id=tokenizer.pad_token_id)
    out = []
    for switched in (False, True):
        if switched:
            grouped(model)
        model.zero_grad()
        logprobs, entropy = response_logprobs(model.train(), r, with_entropy=True)
        (logprobs * response_mask).sum().backward()
        out.append((logprobs.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]))
    assert calls["grouped"] == 0
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert all(torch.equal(a, b) for a, b in zip(out[0][2], out[1][2]))


def test_without_the_mask_function_left_padded_rows_would_attend_to_padding(model):
    """Why use_grouped_attention registers transformers' SDPA mask under the same name: masking_utils builds no mask
    at all for an attention name it does not know, so rows with left padding attend to it (silently wrong)."""
    from transformers import AttentionInterface
    AttentionInterface.register("grouped_without_mask_function", grouped_attention)
    ids = torch.randint(1, 50, (2, 5), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
        model.set_attn_implementation("grouped_without_mask_function")
        bad = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
        grouped(model.set_attn_implementation("sdpa") or model)
        good = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    assert torch.equal(good, ref)
    assert not torch.allclose(bad[0], ref[0], atol=1e-3) and torch.allclose(bad[1], ref[1], atol=ATOL)


def test_on_a_cpu_the_sampler_keeps_transformers_attention_and_cache(model, tokenizer, monkeypatch, tmp_path):
    """By default the fast path is a GPU's: on a CPU the engine leaves the attention as it is and the sampler uses
    transformers' own cache (the demo's bits unchanged). The switched attention is not saved with the config."""
    assert not decoding.on_fast_path(torch.device("cpu")) and decoding.on_fast_path(torch.device("cuda", 0))
    layers = []
    original = DynamicLayer.update

    def update(self, *a, **kw):
        layers.append(type(self).__name__)
        return original(self, *a, **kw)
    monkeypatch.setattr(DynamicLayer, "update", update)
    engine = HFEngine(model, tokenizer, max_new_tokens=3)
    engine.generate(PROMPTS[:2], n=2, seed=0)
    assert not engine.grouped_decode and model.config._attn_implementation == "sdpa"
    assert set(layers) == {"DynamicLayer"}
    grouped(model)
    model.save_pretrained(tmp_path)
    with open(os.path.join(tmp_path, "config.json")) as fh:
        assert GROUPED not in json.dumps(json.load(fh))
