"""rollout.py and engines.py: sampling with group structure, masks and EOS, sampler vs recomputed
log-probs, value alignment, invariance to what sits under the masks, gradients, micro-batching."""
import contextlib
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from machinery.models import value_model_from_policy
from machinery import engines
from machinery.engines import HFEngine
import rollout
from rollout import Rollout, by_length, response_logprobs, response_values, score_rollout

PROMPTS = ["1+2=", "a much longer prompt, to pad the others:", "xyz"]  # different lengths -> left padding
ATOL = 1e-4  # float32: sampler (KV cache, one token at a time) vs one full forward pass; measured ~1e-6


def with_eos_bias(model, tokenizer, bias: float):
    """Add `bias` to the EOS logit (a biased copy of the tied lm_head): 3 gives ragged lengths, +-100 forces or
    forbids EOS."""
    weight = model.lm_head.weight
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=True)
    head.weight = weight
    with torch.no_grad():
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = bias
    model.lm_head = head
    return model


def check_layout(r: Rollout, tokenizer, n_prompts: int, n: int, max_new_tokens: int):
    B = n_prompts * n
    eos = tokenizer.eos_token_id
    assert r.response_ids.shape == r.response_mask.shape == r.sampler_logprobs.shape == (B, r.T)
    assert r.prompt_ids.shape == r.prompt_mask.shape == (B, r.P)
    assert r.lengths.dtype == torch.long and r.truncated.dtype == torch.bool
    assert r.sampler_logprobs.dtype == torch.float32
    assert len(r.texts) == B
    assert torch.equal(r.prompt_index, torch.arange(n_prompts).repeat_interleave(n))
    assert torch.equal(r.lengths, r.response_mask.sum(1))
    assert r.T == int(r.lengths.max())  # no all-pad trailing column
    t = torch.arange(r.T)
    assert torch.equal(r.response_mask, (t[None] < r.lengths[:, None]).long())  # contiguous, right-padded
    assert (r.response_ids[r.response_mask == 0] == tokenizer.pad_token_id).all()
    assert (r.sampler_logprobs[r.response_mask == 0] == 0).all()
    assert (r.sampler_logprobs[r.response_mask == 1] <= 0).all()
    # the prompt: left-padded, the same in every row of a group, last column real
    assert (r.prompt_ids[r.prompt_mask == 0] == tokenizer.pad_token_id).all()
    assert (r.prompt_mask[:, -1] == 1).all()
    for b in range(B):
        L = int(r.lengths[b])
        last = int(r.response_ids[b, L - 1])
        body = r.response_ids[b, :L - 1]
        assert not (body == eos).any()  # stops at the first EOS
        if r.truncated[b]:
            assert L == max_new_tokens and last != eos
        else:
            assert last == eos  # the EOS token is part of the response (mask 1)
        assert r.texts[b] == tokenizer.decode(r.response_ids[b, :L], skip_special_tokens=True)
        i = int(r.prompt_index[b])
        assert torch.equal(r.prompt_ids[b, r.prompt_mask[b] == 1], torch.tensor(tokenizer(PROMPTS[i])["input_ids"]))


def test_layout_with_ragged_lengths(tiny_policy, tokenizer):
    model = with_eos_bias(tiny_policy, tokenizer, 3.0)
    r = HFEngine(model, tokenizer, max_new_tokens=12).generate(PROMPTS, n=4, seed=0)
    check_layout(r, tokenizer, len(PROMPTS), 4, 12)
    assert len(set(r.lengths.tolist())) > 2 and r.truncated.any() and not r.truncated.all()  # really ragged


def test_eos_as_first_token(tiny_policy, tokenizer):
    model = with_eos_bias(tiny_policy, tokenizer, 100.0)
    r = HFEngine(model, tokenizer, max_new_tokens=8).generate(PROMPTS, n=2, seed=0)
    check_layout(r, tokenizer, len(PROMPTS), 2, 8)
    assert r.T == 1 and (r.lengths == 1).all() and not r.truncated.any()
    assert (r.response_ids[:, 0] == tokenizer.eos_token_id).all() and (r.response_mask == 1).all()
    assert r.texts == [""] * r.B


def test_truncation_at_max_new_tokens(tiny_policy, tokenizer):
    model = with_eos_bias(tiny_policy, tokenizer, -100.0)
    r = HFEngine(model, tokenizer, max_new_tokens=7).generate(PROMPTS, n=2, seed=0)
    check_layout(r, tokenizer, len(PROMPTS), 2, 7)
    assert r.T == 7 and (r.lengths == 7).all() and r.truncated.all()


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampler_logprobs_equal_recomputed(tiny_policy, tokenizer, temperature):
    model = with_eos_bias(tiny_policy, tokenizer, 3.0)
    r = HFEngine(model, tokenizer, max_new_tokens=12).generate(PROMPTS, n=3, seed=1, temperature=temperature)
    logprobs, entropy = response_logprobs(model, r, temperature=temperature)
    assert entropy is None
    assert torch.allclose(logprobs, r.sampler_logprobs, atol=ATOL, rtol=0)
    assert (logprobs[r.response_mask == 0] == 0).all()


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.6, 1.0), (1.0, 0.7)])
def test_sampler_entropy_equals_recomputed(tiny_policy, tokenizer, temperature, top_p):
    """The sampler's per-token entropy is the policy's at the sampling temperature, before top-p (what the
    trainer logs as "entropy" when it takes the old log-probs from the sampler), equal to the scoring pass's."""
    model = with_eos_bias(tiny_policy, tokenizer, 3.0)
    r = HFEngine(model, tokenizer, max_new_tokens=12).generate(PROMPTS, n=3, seed=1, temperature=temperature,
                                                               top_p=top_p)
    _, entropy = response_logprobs(model, r, temperature=temperature, with_entropy=True)
    assert r.entropy.shape == (r.B, r.T) and r.entropy.dtype == torch.float32
    assert (r.entropy[r.response_mask == 0] == 0).all() and (r.entropy[r.response_mask == 1] > 0).all()
    assert torch.allclose(entropy, r.entropy, atol=ATOL, rtol=0)


def test_greedy_matches_hf_generate(tiny_policy, tokenizer):
    """Equivalence: our sampling loop at temperature 0 against transformers' own greedy generate."""
    r = HFEngine(tiny_policy, tokenizer, max_new_tokens=10).generate(PROMPTS, n=1, temperature=0)
    encoded = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    out = tiny_policy.generate(**encoded, do_sample=False, max_new_tokens=10, pad_token_id=tokenizer.pad_token_id,
                               top_k=None, top_p=None, temperature=None)
    expected = out[:, encoded["input_ids"].shape[1]:]  # [B, 10]
    assert torch.equal(r.response_ids, expected[:, :r.T])
    logprobs, _ = response_logprobs(tiny_policy, r)  # greedy: sampler log-probs are at temperature 1
    assert torch.allclose(logprobs, r.sampler_logprobs, atol=ATOL, rtol=0)


def test_top_p(tiny_policy, tokenizer):
    engine = HFEngine(tiny_policy, tokenizer, max_new_tokens=8)
    r = engine.generate(PROMPTS, n=2, seed=0, top_p=0.9)
    logprobs, _ = response_logprobs(tiny_policy, r)
    # the nucleus renormalised: log p_nucleus = log p - log(nucleus mass) >= log p, with a difference somewhere
    assert (r.sampler_logprobs >= logprobs - ATOL).all()
    assert (r.sampler_logprobs - logprobs).max() > 1e-3
    # a nucleus this small holds only the most likely token: sampling is greedy and certain
    tiny = engine.generate(PROMPTS, n=2, seed=0, top_p=1e-6)
    greedy = engine.generate(PROMPTS, n=2, temperature=0)
    assert torch.equal(tiny.response_ids, greedy.response_ids)
    assert (tiny.sampler_logprobs == 0).all()


def test_seed_micro_batching_and_model_mode(tiny_policy, tokenizer):
    model = with_eos_bias(tiny_policy, tokenizer, 3.0).train()
    engine = HFEngine(model, tokenizer, max_new_tokens=10)
    a = engine.generate(PROMPTS, n=2, seed=3)
    assert model.training  # mode restored
    b = engine.generate(PROMPTS, n=2, seed=3)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    # one prompt per forward pass, padded back to a common P and T: greedy gives the same tokens
    whole = engine.generate(PROMPTS, n=2, temperature=0)
    parts = HFEngine(model, tokenizer, max_new_tokens=10, batch_size=1).generate(PROMPTS, n=2, temperature=0)
    check_layout(parts, tokenizer, len(PROMPTS), 2, 10)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "lengths", "prompt_index"):
        assert torch.equal(getattr(whole, name), getattr(parts, name)), name
    assert torch.allclose(whole.sampler_logprobs, parts.sampler_logprobs, atol=ATOL, rtol=0)


class PositionProbe(nn.Module):
    """A fake value model: its output at each position is 1000 * position id + token id, so values show exactly
    which input position they were read from."""

    def forward(self, input_ids, attention_mask, position_ids, **kwargs):
        return SimpleNamespace(logits=(1000.0 * position_ids + input_ids)[..., None])


def test_value_alignment(tiny_policy, tokenizer):
    model = with_eos_bias(tiny_policy, tokenizer, 3.0)
    r = HFEngine(model, tokenizer, max_new_tokens=8).generate(PROMPTS, n=2, seed=0)
    values = response_values(PositionProbe(), r)  # [B, T]
    for b in range(r.B):
        prompt = r.prompt_ids[b, r.prompt_mask[b] == 1].tolist()
        # V(s_t) is read at the token before response token t: the last prompt token for t = 0
        before = [prompt[-1]] + r.response_ids[b, :-1].tolist()
        for t in range(r.T):
            expected = 1000.0 * (len(prompt) - 1 + t) + before[t] if r.response_mask[b, t] else 0.0
            assert values[b, t].item() == expected


def test_values_start_at_zero_and_padding_changes_nothing(tiny_policy, tokenizer):
    model = with_eos_bias(tiny_policy, tokenizer, 3.0)
    value_model = value_model_from_policy(model)
    r = HFEngine(model, tokenizer, max_new_tokens=8).generate(PROMPTS, n=2, seed=0)
    assert (response_values(value_model, r) == 0).all()  # zero head: V = 0 before training
    with torch.no_grad():
        value_model.score.weight.normal_()
        value_model.score.bias.fill_(0.5)
    values = response_values(value_model, r)
    assert (values[r.response_mask == 1] != 0).all()
    logprobs, _ = response_logprobs(model, r)
    for b in range(r.B):  # scored alone (no padding at all) = scored in the left- and right-padded batch
        alone = r.select([b])
        assert alone.P == int(r.prompt_mask[b].sum()) and alone.T == int(r.lengths[b])
        assert torch.allclose(response_values(value_model, alone)[0], values[b, :alone.T], atol=1e-5, rtol=0)
        assert torch.allclose(response_logprobs(model, alone)[0][0], logprobs[b, :alone.T], atol=1e-5, rtol=0)


def test_nothing_under_the_mask_matters(tiny_policy, tokenizer):
    """Invariance: other tokens in the response padding and the prompt padding change no log-prob, entropy or
    value of a real token, and everything under the mask is exactly 0."""
    model = with_eos_bias(tiny_policy, tokenizer, 3.0)
    value_model = value_model_from_policy(model)
    with torch.no_grad():
        value_model.score.weight.normal_()
    r = HFEngine(model, tokenizer, max_new_tokens=10).generate(PROMPTS, n=2, seed=0)
    assert (r.response_mask == 0).any() and (r.prompt_mask == 0).any()
    g = torch.Generator().manual_seed(0)
    noisy = r.select(range(r.B))
    noisy.response_ids = torch.where(r.response_mask == 1, r.response_ids,
                                     torch.randint(0, 256, r.response_ids.shape, generator=g))
    noisy.prompt_ids = torch.where(r.prompt_mask == 1, r.prompt_ids,
                                   torch.randint(0, 256, r.prompt_ids.shape, generator=g))
    with torch.no_grad():
        lp, ent = response_logprobs(model, r, with_entropy=True)
        lp2, ent2 = response_logprobs(model, noisy, with_entropy=True)
        v, v2 = response_values(value_model, r), response_values(value_model, noisy)
    for x, y in ((lp, lp2), (ent, ent2), (v, v2)):
        assert torch.allclose(x, y, atol=1e-6, rtol=0)
        assert (y[r.response_mask == 0] == 0).all()


def test_gradients_flow(tiny_policy, tokenizer):
    model = with_eos_bias(tiny_policy, tokenizer, 3.0).train()
    value_model = value_model_from_policy(model)
    r = HFEngine(model, tokenizer, max_new_tokens=8).generate(PROMPTS, n=2, seed=0)
    logprobs, entropy = response_logprobs(model, r, with_entropy=True)
    (logprobs.sum() + entropy.sum()).backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    response_values(value_model, r).sum().backward()
    assert value_model.score.weight.grad.abs().sum() > 0  # d V / d head = hidden state (the head itself is 0)


def test_score_rollout(tiny_policy, tokenizer):
    model = with_eos_bias(tiny_policy, tokenizer, 3.0).train()
    value_model = value_model_from_policy(model)
    with torch.no_grad():
        value_model.score.weight.normal_()
    r = HFEngine(model, tokenizer, max_new_tokens=10).generate(PROMPTS, n=3, seed=0)
    s = score_rollout(model, value_model, r, micro_batch_size=2)
    assert set(s) == {"old_logprobs", "values", "entropy"} and model.training and value_model.training
    for x in s.values():
        assert x.shape == (r.B, r.T) and x.dtype == torch.float32 and not x.requires_grad
        assert (x[r.response_mask == 0] == 0).all()
    assert torch.allclose(s["old_logprobs"], r.sampler_logprobs, atol=ATOL, rtol=0)
    assert (s["entropy"][r.response_mask == 1] > 0).all()
    whole = score_rollout(model, value_model, r, micro_batch_size=64)  # micro-batching changes nothing
    for k in s:
        assert torch.allclose(s[k], whole[k], atol=1e-5, rtol=0), k
    assert set(score_rollout(model, None, r)) == {"old_logprobs", "entropy"}


def test_select_to_and_cat(tiny_policy, tokenizer):
    model = with_eos_bias(tiny_policy, tokenizer, 3.0)
    r = HFEngine(model, tokenizer, max_new_tokens=12).generate(PROMPTS, n=3, seed=0)
    order = torch.argsort(r.lengths)
    short = [int(order[0]), int(order[1])]
    s = r.select(short)
    assert s.B == 2 and s.T == int(r.lengths[short].max()) and s.texts == [r.texts[i] for i in short]
    assert torch.equal(s.response_ids, r.response_ids[short, :s.T])
    assert torch.equal(s.prompt_index, r.prompt_index[short])
    assert s.P == int(r.prompt_mask[short].sum(1).max())  # left padding trimmed as well
    assert torch.equal(s.prompt_ids, r.prompt_ids[short, r.P - s.P:])
    assert r.select(torch.tensor(short)).texts == s.texts
    mask = torch.zeros(r.B, dtype=torch.bool)
    mask[short] = True
    assert torch.equal(r.select(mask).lengths, r.lengths[sorted(short)])
    assert r.select(slice(0, 3)).texts == r.texts[:3]
    moved = r.to("cpu")
    assert moved.B == r.B and moved.T == r.T and moved.pad_id == r.pad_id
    back = Rollout.cat([r.select(slice(0, 4)), r.select(slice(4, None))])
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "lengths", "truncated",
                 "sampler_logprobs", "prompt_index", "entropy"):
        assert torch.equal(getattr(back, name), getattr(r, name)), name
    assert back.texts == r.texts
    assert torch.equal(s.entropy, r.entropy[short, :s.T])
    no_entropy = Rollout.cat([dataclasses.replace(r.select(slice(0, 4)), entropy=None), r.select(slice(4, None))])
    assert no_entropy.entropy is None and no_entropy.select([0]).entropy is None  # vLLM gives none


def test_by_length_orders_rows_by_total_length(tiny_policy, tokenizer):
    r = HFEngine(with_eos_bias(tiny_policy, tokenizer, 3.0), tokenizer, max_new_tokens=12).generate(
        PROMPTS, n=3, seed=0)
    idx = torch.tensor([5, 0, 3, 1])
    order = by_length(r, idx)
    assert sorted(order.tolist()) == sorted(idx.tolist())  # a permutation of the given rows, no others
    total = r.prompt_mask.sum(1) + r.lengths  # [B]
    assert (total[order][1:] >= total[order][:-1]).all()
    assert len(set(total.tolist())) > 1  # the rows really differ in length, so the order means something


def test_by_length_returns_indices_on_the_rollouts_device(tiny_policy, tokenizer):
    """The trainer draws its mini-batch order on the CPU and indexes the rollout's tensors (on the GPU, in a GPU
    run) with what by_length returns; PyTorch refuses CPU tensors indexed by CUDA indices, so the result must live
    on the rollout's device whatever idx's device. Checked here with the meta device, which this CPU has: a
    rollout on "meta", indices on the CPU."""
    r = HFEngine(tiny_policy, tokenizer, max_new_tokens=6).generate(PROMPTS, n=2, seed=0)
    fields = {name: getattr(r, name) for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask",
                                                  "lengths", "truncated", "sampler_logprobs", "prompt_index")}
    on_meta = Rollout(**{k: v.to("meta") for k, v in fields.items()}, texts=r.texts, pad_id=r.pad_id)
    assert by_length(on_meta, torch.randperm(on_meta.B)).device.type == "meta"
    assert by_length(r, torch.randperm(r.B)).device == r.lengths.device


def test_finished_rows_leave_the_batch_and_the_rest_stay_exact(tiny_policy, tokenizer, monkeypatch):
    """Rows that finished are dropped from the batch and the KV cache mid-generation; the log-probs recomputed in
    one full forward pass still match the sampler's on every remaining token, so no row read another's cache."""
    from transformers.cache_utils import Cache
    selected = []
    original = Cache.batch_select_indices
    monkeypatch.setattr(Cache, "batch_select_indices",
                        lambda self, idx: (selected.append(len(idx)), original(self, idx))[1])
    model = with_eos_bias(tiny_policy, tokenizer, 3.0)
    r = HFEngine(model, tokenizer, max_new_tokens=24).generate(PROMPTS, n=4, seed=0)
    assert selected and r.B > selected[0] > 0  # the batch did shrink
    assert len(set(r.lengths.tolist())) > 2 and int(r.lengths.max()) > 2
    logprobs, _ = response_logprobs(model, r)
    assert torch.allclose(logprobs, r.sampler_logprobs, atol=ATOL, rtol=0)
    assert (r.response_ids[r.response_mask == 0] == r.pad_id).all()


def test_a_group_shares_one_prefill_of_its_prompt(tiny_policy, tokenizer, monkeypatch):
    """The prompts go through the model once (N rows, not N * G) and their KV cache is repeated G times: the
    samples are those of G separate prefills (a cache class that cannot repeat takes that path), and the
    log-probs recomputed in one full pass match the sampler's."""
    import transformers
    model = with_eos_bias(tiny_policy, tokenizer, 3.0)
    widths = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **kw: (widths.append(kw["input_ids"].shape), forward(*a, **kw))[1])
    shared = HFEngine(model, tokenizer, max_new_tokens=16).generate(PROMPTS, n=4, seed=3)
    assert widths[0][0] == len(PROMPTS) and widths[1] == (len(PROMPTS) * 4, 1)  # prefill of N rows, decode of B
    logprobs, _ = response_logprobs(model, shared)
    assert torch.allclose(logprobs, shared.sampler_logprobs, atol=ATOL, rtol=0)
    owner = next(c for c in transformers.DynamicCache.__mro__ if "batch_repeat_interleave" in vars(c))
    monkeypatch.delattr(owner, "batch_repeat_interleave")
    widths.clear()
    separate = HFEngine(model, tokenizer, max_new_tokens=16).generate(PROMPTS, n=4, seed=3)
    assert any(w[0] == len(PROMPTS) * 4 and w[1] > 1 for w in widths)  # a prefill of every row
    assert torch.equal(shared.response_ids, separate.response_ids)
    assert torch.allclose(shared.sampler_logprobs, separate.sampler_logprobs, atol=ATOL, rtol=0)


@torch.no_grad()
def kv_cache_bytes_per_token(model, autocast=None, preallocate: bool = True) -> int:
    """Bytes the sampler's KV cache holds per token of one sequence, measured (docs/scaling.md's KV-cache row): a
    prefill of 2 tokens under
    `autocast` (the trainer's, e.g. models.autocast(cfg, device)) into the cache rollout.sample uses
    (preallocate=False: transformers' own), the filled part of its tensors summed, divided by 2.

    Under bf16 autocast with float32 weights (--bf16), transformers' cache holds K in float32 (rotary embeddings
    return it so) and V in float32 (5.17, 5.19) or bf16 (5.24): 24 or 18 KB per token at Qwen2.5-0.5B's shape.
    The sampler's PreallocatedLayer stores the autocast dtype, bf16: 12 KB."""
    device = next(model.parameters()).device
    ids = torch.zeros((1, 2), dtype=torch.long, device=device)
    with autocast if autocast is not None else contextlib.nullcontext():
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
        cache = rollout.preallocated_cache(model, 2, dtype) if preallocate else None
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True,
                    **({rollout._cache_kwarg(model): cache} if cache is not None else {}))
    cache = rollout._output_cache(out)
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return sum(t.numel() * t.element_size() for t in tensors) // 2



def test_kv_cache_bytes_per_token_at_qwen25_05b_attention_shape():
    """The measurement behind docs/scaling.md's KV-cache row: at Qwen2.5-0.5B's attention shape (hidden 896,
    14 heads, 2 KV heads of 64), per layer and token. With float32 weights under bf16 autocast (--bf16), the
    sampler's preallocated cache stores bf16 (2 bytes an element: what the product relies on); transformers' own
    growing cache held K in float32 (rotary embeddings promote it) and V in float32 in 5.17 and 5.19, V in bf16 in
    5.24: measured here as 2 to 4 bytes, never asserted as one release's dtypes. Without autocast, float32
    weights cache 4 bytes and bfloat16 weights 2, with either cache."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(hidden_size=896, num_hidden_layers=2, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=64, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    per_layer = 2 * 2 * 64  # K and V, 2 heads of 64
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    assert kv_cache_bytes_per_token(model) == 2 * per_layer * 4
    assert kv_cache_bytes_per_token(model, preallocate=False) == 2 * per_layer * 4
    assert kv_cache_bytes_per_token(model, bf16) == 2 * per_layer * 2  # the sampler's: half of float32
    growing = kv_cache_bytes_per_token(model, bf16, preallocate=False)  # transformers': K float32, V either
    assert 2 * per_layer * 2 <= growing <= 2 * per_layer * 4
    assert kv_cache_bytes_per_token(model.to(torch.bfloat16)) == 2 * per_layer * 2
    assert kv_cache_bytes_per_token(model, preallocate=False) == 2 * per_layer * 2


def sample_both_caches(model, tokenizer, monkeypatch, autocast=None, **generate):
    """The same generation with the sampler's preallocated cache and with transformers' growing one."""
    out = {}
    original = engines.sample
    for preallocate in (True, False):
        monkeypatch.setattr(engines, "sample", lambda *a, **kw: original(*a, **kw, preallocate=preallocate))
        with autocast if autocast is not None else torch.autocast("cpu", enabled=False):
            out[preallocate] = HFEngine(model, tokenizer, max_new_tokens=24).generate(PROMPTS, **generate)
    monkeypatch.setattr(engines, "sample", original)
    return out[True], out[False]


@pytest.mark.parametrize("bf16", [False, True])
def test_the_preallocated_cache_draws_what_the_growing_cache_draws(tiny_policy, tokenizer, monkeypatch, bf16):
    """The sampler's PreallocatedLayer (one buffer per layer, filled in place, rows dropped and groups repeated)
    gives the very samples and log-probs of transformers' cache that grows by concatenation, in float32 and under
    bf16 autocast (where it stores bf16 and the growing cache float32: attention casts to bf16 either way)."""
    model = with_eos_bias(tiny_policy, tokenizer, 3.0)  # ragged lengths: rows leave the batch on the way
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else None
    pre, grown = sample_both_caches(model, tokenizer, monkeypatch, autocast, n=4, seed=5)
    assert len(set(pre.lengths.tolist())) > 2
    assert torch.equal(pre.response_ids, grown.response_ids)
    assert torch.equal(pre.sampler_logprobs, grown.sampler_logprobs)
    assert torch.equal(pre.entropy, grown.entropy)


def test_the_preallocated_cache_is_one_buffer_filled_in_place(tiny_policy):
    """Every update writes into the buffer allocated at the prefill (the keys handed to attention are a view of
    it, of the filled length), rows leaving copy only what is filled, and a write past the capacity is an error,
    not a silent reallocation."""
    cache = rollout.preallocated_cache(tiny_policy, capacity=6, dtype=torch.bfloat16)
    layer = cache.layers[0]
    kv = lambda rows, tokens: torch.randn(rows, 2, tokens, 32)  # noqa: E731  [B, H, t, D]
    first = kv(3, 4)
    cache.update(first, first + 1, 0)
    buffer = layer.key_buffer
    assert buffer.shape == (3, 2, 6, 32) and buffer.dtype == torch.bfloat16
    step = kv(3, 1)
    keys, values = cache.update(step, step, 0)
    assert layer.key_buffer is buffer and keys.data_ptr() == buffer.data_ptr() and cache.get_seq_length(0) == 5
    assert torch.equal(keys, torch.cat([first, step], 2).bfloat16())
    assert torch.equal(values, torch.cat([first + 1, step], 2).bfloat16())
    cache.batch_select_indices(torch.tensor([2, 0]))
    assert layer.key_buffer.shape == (2, 2, 6, 32) and torch.equal(layer.keys, keys[[2, 0]])
    cache.update(kv(2, 1), kv(2, 1), 0)
    with pytest.raises(RuntimeError, match="do not fit a cache of 6"):
        cache.update(kv(2, 1), kv(2, 1), 0)


def test_a_model_the_preallocated_cache_does_not_fit_samples_with_its_own(tokenizer):
    """Sliding-window attention (or any layer that is not plain full attention) gets no preallocated cache: the
    sampler lets the model make its own, and the samples still score as they were drawn."""
    from machinery import task
    from transformers import Qwen2ForCausalLM
    model = Qwen2ForCausalLM(task.tiny_config(tokenizer, use_sliding_window=True, sliding_window=8,
                                              max_window_layers=0)).eval()
    assert rollout.preallocated_cache(model, 10) is None
    r = HFEngine(model, tokenizer, max_new_tokens=12).generate(PROMPTS, n=2, seed=0)
    logprobs, _ = response_logprobs(model, r)
    assert torch.allclose(logprobs, r.sampler_logprobs, atol=ATOL, rtol=0)
