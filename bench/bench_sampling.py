"""Benchmark: what makes sampling fast. One prompt prefill per group (the G samples of a prompt share its KV
cache) against one prefill per row; finished rows dropped from the batch (rollout.COMPACT_FRACTION) against every
row kept until the longest response ends.

    python bench/bench_sampling.py [--repeats 3]

One rollout of the built-in demo (16 prompts x 8 samples from the base model, responses of 20 to 128 tokens) per
repeat, each way, interleaved in the same process; medians over the repeats, and the ratios are what to compare
across machines. "One prefill per row" calls rollout.sample with every prompt repeated G times (n = 1), what
HFEngine did before the prefill was shared; it draws the same samples as the shared prefill (same random
stream, same cache contents), which the script checks. Keeping every row changes the samples (fewer rows draw
fewer random numbers), so the mean response length of each variant is reported; they should agree within noise.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rollout  # noqa: E402
import task  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = task.ensure_base_model()
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    engine = rollout.HFEngine(model, tokenizer, max_new_tokens=task.MAX_RESPONSE_TOKENS)
    shared_sample = rollout.sample

    def per_row_sample(model, prompt_ids, prompt_mask, *args, n=1, **kw):  # the prompts repeated: G prefills each
        return shared_sample(model, prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0), *args,
                             n=1, **kw)

    fraction = rollout.COMPACT_FRACTION
    variants = {"keep every row, prefill per row": (2.0, per_row_sample),
                f"drop finished rows ({fraction}), prefill per row": (fraction, per_row_sample),
                f"drop finished rows ({fraction}), prefill per prompt": (fraction, shared_sample)}
    times = {name: [] for name in variants}
    lengths = {name: [] for name in variants}
    same = True
    for repeat in range(args.repeats):
        prompts = [p["prompt"] for p in task.make_dataset(16, seed=repeat, split="train")]
        out = {}
        for name, (compact, sample) in variants.items():
            rollout.COMPACT_FRACTION, rollout.sample = compact, sample
            start = time.perf_counter()
            out[name] = r = engine.generate(prompts, n=8, seed=repeat)
            times[name].append(time.perf_counter() - start)
            lengths[name].append(r.lengths.float().mean().item())
        a, b = (out[name] for name in list(variants)[1:])
        same &= torch.equal(a.response_ids, b.response_ids)
    rollout.COMPACT_FRACTION, rollout.sample = fraction, shared_sample

    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"date: {datetime.date.today().isoformat()}")
    base = statistics.median(times[list(variants)[0]])
    for name in variants:
        t = statistics.median(times[name])
        print(f"{name:50s}: {t * 1000:7.0f} ms per rollout of 128 (median of {args.repeats}), {base / t:4.2f}x, "
              f"mean response {statistics.mean(lengths[name]):.1f} tokens")
    print(f"prefill per prompt and per row drew the same samples: {same}")


if __name__ == "__main__":
    main()
