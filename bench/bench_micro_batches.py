"""Benchmark: micro-batches of rows sorted by length (rollout.by_length) against micro-batches in rollout order.

    python bench/bench_micro_batches.py [--repeats 5] [--micro 16]

One VAPO rollout of the built-in task (16 prompts x 8 samples from the base model, 1 to 10 steps, so responses
of 20 to about 110 tokens behind left-padded prompts of 15 to 50): the time of a policy forward and backward
pass over all 128 rows, as the update phase runs it, (a) in one pass, (b) in micro-batches in rollout order,
(c) in micro-batches sorted by length. Rollout.select trims each micro-batch to its own longest prompt and
response, so sorting removes most padding. All three run in the same process on the same rollout; the figures
are medians over the repeats and the ratios are what to compare across machines. It checks that the three give
the same gradient.
"""
from __future__ import annotations

import argparse
import statistics

import torch

import common  # (puts the repository on the path)
import builds
import task
from engines import HFEngine
from rollout import by_length, response_logprobs


def forward_backward(model, rollout, order, micro):
    """Sum of the response log-probs, backward per micro-batch; returns the flattened gradient."""
    model.zero_grad(set_to_none=True)
    for rows in order.split(micro):
        logprobs, _ = response_logprobs(model, rollout.select(rows))
        logprobs.sum().backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = builds.ensure_base_model()
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    problems = task.make_dataset(16, seed=args.seed, split="train")
    rollout = HFEngine(model, tokenizer, max_new_tokens=task.MAX_RESPONSE_TOKENS).generate(
        [p["prompt"] for p in problems], n=8, seed=args.seed)
    in_order = torch.arange(rollout.B)
    variants = {"one pass": (in_order, rollout.B), f"micro {args.micro}, rollout order": (in_order, args.micro),
                f"micro {args.micro}, sorted by length": (by_length(rollout, in_order), args.micro)}

    grads = {name: forward_backward(model, rollout, order, micro) for name, (order, micro) in variants.items()}
    ref = grads["one pass"]
    times = {name: [] for name in variants}
    for _ in range(args.repeats):  # interleaved, so that a burst of load on a shared machine hits all three
        for name, (order, micro) in variants.items():
            times[name].append(common.clocked(lambda: forward_backward(model, rollout, order, micro))[1])

    print(f"machine: {common.machine()}, {torch.get_num_threads()} threads")
    print(f"date: {common.now()}")
    print(f"rollout: B = {rollout.B}, prompt width {rollout.P}, response width {rollout.T}, "
          f"mean prompt {rollout.prompt_mask.sum(1).float().mean():.0f} and response "
          f"{rollout.lengths.float().mean():.0f} tokens")
    base = statistics.median(times["one pass"])
    for name in variants:
        diff = ((grads[name] - ref).norm() / ref.norm()).item()
        t = statistics.median(times[name])
        print(f"{name:32s}: {t * 1000:8.0f} ms (median of {args.repeats}), {base / t:4.2f}x, "
              f"relative gradient difference {diff:.1e}")


if __name__ == "__main__":
    main()
