"""Benchmark: what makes sampling fast, at the demo's lengths and at long responses, beside transformers' generate.

    python bench/bench_sampling.py [--repeats 3] [--settings demo long] [--long-tokens 1024]

Settings (each variant interleaved with the others in the same process, medians over the repeats; the ratios
are what to compare across machines):
- demo: one rollout of the built-in demo (16 prompts x 8 samples from the base model, responses of 20 to 128
  tokens, ending at EOS);
- long: the demo's model shape with random weights and room for long responses, 8 prompts x 4 samples of
  --long-tokens tokens each (EOS never ends a row: every row runs the whole length, where a KV cache that grows
  by concatenation pays most).

Variants:
- "transformers generate": `model.generate(do_sample=True, top_k=0, num_return_sequences=G)`, the loop a user
  would otherwise call (a prefill per row, every row kept until the longest ends; with min_new_tokens in the long
  setting so that it runs the same length);
- "keep every row, prefill per row": rollout.sample with every prompt repeated G times, no compaction and
  transformers' own cache;
- "drop finished rows, prefill per row": compaction on (rollout.COMPACT_FRACTION);
- "prefill per prompt, growing cache": the G samples of a prompt share its prefill, transformers' own cache (grows
  by torch.cat every token): the sampler before the preallocated cache;
- "prefill per prompt, preallocated cache": what rollout.sample does now (PreallocatedLayer).
The script checks that the growing and the preallocated cache draw the same samples, bit for bit, and that a
prefill per prompt draws the same as a prefill per row. Keeping every row changes the samples (fewer rows draw
fewer random numbers), so the mean response length of each variant is printed; they should agree within noise.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import common  # (puts the repository on the path)
import builds
import engines
import rollout
import task


def per_row(sample):
    def per_row_sample(model, prompt_ids, prompt_mask, *args, n=1, **kw):  # the prompts repeated: G prefills each
        return sample(model, prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0), *args,
                      n=1, **kw)
    return per_row_sample


def with_cache(sample, preallocate):
    return lambda *args, **kw: sample(*args, **kw, preallocate=preallocate)


def hf_generate(model, tokenizer, prompts, n, max_new_tokens, seed, eos_ends):
    """transformers' generate on the same prompts, as a user would call it; returns the mean response length."""
    torch.manual_seed(seed)
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, num_return_sequences=n,
                         max_new_tokens=max_new_tokens, min_new_tokens=0 if eos_ends else max_new_tokens,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    response = out[:, enc["input_ids"].shape[1]:]  # [B, T]
    is_eos = response == tokenizer.eos_token_id
    lengths = torch.where(is_eos.any(1), is_eos.long().argmax(1) + 1, response.shape[1])
    return lengths.float().mean().item()


def run_setting(name, model, tokenizer, prompts_of, n, max_new_tokens, eos_ends, repeats):
    engine = engines.HFEngine(model, tokenizer, max_new_tokens=max_new_tokens)
    if not eos_ends:
        engine.eos_ids = []  # no token ends a row: every row samples max_new_tokens
    shared = rollout.sample
    fraction = rollout.COMPACT_FRACTION
    variants = {"transformers generate": None,
                "keep every row, prefill per row": (2.0, per_row(with_cache(shared, False))),
                "drop finished rows, prefill per row": (fraction, per_row(with_cache(shared, False))),
                "prefill per prompt, growing cache": (fraction, with_cache(shared, False)),
                "prefill per prompt, preallocated cache": (fraction, with_cache(shared, True))}
    times = {v: [] for v in variants}
    lengths = {v: [] for v in variants}
    same_cache = same_prefill = True
    try:
        for repeat in range(repeats):
            prompts = prompts_of(repeat)
            out = {}
            for v, how in variants.items():
                start = time.perf_counter()
                if how is None:
                    lengths[v].append(hf_generate(model, tokenizer, prompts, n, max_new_tokens, repeat, eos_ends))
                else:
                    rollout.COMPACT_FRACTION, engines.sample = how  # engines.HFEngine calls engines.sample
                    out[v] = r = engine.generate(prompts, n=n, seed=repeat)
                    lengths[v].append(r.lengths.float().mean().item())
                times[v].append(time.perf_counter() - start)
            grown, pre, row = (out[v] for v in ("prefill per prompt, growing cache",
                                                "prefill per prompt, preallocated cache",
                                                "drop finished rows, prefill per row"))
            same_cache &= torch.equal(grown.response_ids, pre.response_ids) and torch.equal(
                grown.sampler_logprobs, pre.sampler_logprobs)
            same_prefill &= torch.equal(row.response_ids, grown.response_ids)
    finally:
        rollout.COMPACT_FRACTION, engines.sample = fraction, shared
    rows = len(prompts_of(0)) * n
    print(f"\n{name}: {len(prompts_of(0))} prompts x {n} samples, up to {max_new_tokens} tokens "
          f"({'EOS ends a row' if eos_ends else 'no EOS: every row runs the whole length'})")
    base = statistics.median(times["transformers generate"])
    for v in variants:
        t = statistics.median(times[v])
        print(f"  {v:42s}: {t * 1000:8.0f} ms per rollout of {rows} (median of {repeats}), {base / t:5.2f}x "
              f"generate's speed, mean response {statistics.mean(lengths[v]):6.1f} tokens")
    grown, pre = (statistics.median(times[v]) for v in ("prefill per prompt, growing cache",
                                                        "prefill per prompt, preallocated cache"))
    print(f"  preallocated against growing cache: {grown / pre:.2f}x; same samples bit for bit: {same_cache}; "
          f"prefill per prompt = per row: {same_prefill}")
    return same_cache and same_prefill


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settings", nargs="+", choices=["demo", "long"], default=["demo", "long"])
    parser.add_argument("--long-tokens", type=int, default=1024)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging
    logging.set_verbosity_error()
    print(f"machine: {common.machine()}, {torch.get_num_threads()} threads")
    print(f"date: {common.now()}")
    path = builds.ensure_base_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    ok = True
    if "demo" in args.settings:
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        ok &= run_setting("demo", model, tokenizer,
                          lambda r: [p["prompt"] for p in task.make_dataset(16, seed=r, split="train")],
                          8, task.MAX_RESPONSE_TOKENS, True, args.repeats)
    if "long" in args.settings:
        model = task.build_tiny_policy(tokenizer, max_position_embeddings=args.long_tokens + 64).eval()
        ok &= run_setting("long", model, tokenizer,
                          lambda r: [p["prompt"] for p in task.make_dataset(8, seed=r, split="train")],
                          4, args.long_tokens, False, args.repeats)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
