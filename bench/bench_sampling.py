"""Benchmark: sampling with finished rows dropped from the batch (rollout.COMPACT_FRACTION) against sampling that
keeps every row until the longest response ends.

    python bench/bench_sampling.py [--repeats 3]

One rollout of the built-in demo (16 prompts x 8 samples from the base model, responses of 20 to 128 tokens) per
repeat, both ways, interleaved in the same process; medians over the repeats, and the ratio is what to compare
across machines. The samples differ between the two (fewer rows draw fewer random numbers), so it also reports
the mean response length of each, which should agree within noise.
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
    variants = {"keep every row": 2.0, f"drop finished rows ({rollout.COMPACT_FRACTION})": rollout.COMPACT_FRACTION}
    default = rollout.COMPACT_FRACTION
    times = {name: [] for name in variants}
    lengths = {name: [] for name in variants}
    for repeat in range(args.repeats):
        prompts = [p["prompt"] for p in task.make_dataset(16, seed=repeat, split="train")]
        for name, fraction in variants.items():
            rollout.COMPACT_FRACTION = fraction
            start = time.perf_counter()
            r = engine.generate(prompts, n=8, seed=repeat)
            times[name].append(time.perf_counter() - start)
            lengths[name].append(r.lengths.float().mean().item())
    rollout.COMPACT_FRACTION = default

    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"date: {datetime.date.today().isoformat()}")
    base = statistics.median(times["keep every row"])
    for name in variants:
        t = statistics.median(times[name])
        print(f"{name:32s}: {t * 1000:7.0f} ms per rollout of 128 (median of {args.repeats}), {base / t:4.2f}x, "
              f"mean response {statistics.mean(lengths[name]):.1f} tokens")


if __name__ == "__main__":
    main()
