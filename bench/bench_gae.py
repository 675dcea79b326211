"""Benchmark: the shipped GAE (blocked scan) against the plain per-token reverse loop most frameworks use.

    python bench/bench_gae.py [--batch 512] [--max-len 16384] [--repeats 5]

Realistic shapes for VAPO: B = 512 samples with ragged response lengths up to T = 16k tokens and a per-sample
(length-adaptive) lambda. Both run in the same process on the same tensors; the figures are medians over the
repeats, and the ratio is what to compare across machines. It also checks that both give the same numbers.
"""
from __future__ import annotations

import argparse
import statistics

import torch

import common  # (puts the repository on the path)
from gae import gae, length_adaptive_lambda


def loop_gae(rewards, values, mask, gamma, lam):
    """The per-token reverse loop (vectorised over the batch, one Python iteration per token), as in verl's
    compute_gae_advantage_return and most PPO code; lam is [B]."""
    B, T = rewards.shape
    last = torch.zeros(B)
    advantages = torch.zeros(B, T)
    for t in reversed(range(T)):
        next_v = values[:, t + 1] * mask[:, t + 1] if t + 1 < T else torch.zeros(B)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = (delta + gamma * lam * last) * mask[:, t]
        advantages[:, t] = last
    return advantages, (advantages + values) * mask


def median_seconds(fn, repeats):
    return statistics.median(common.clocked(fn)[1] for _ in range(repeats))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--max-len", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    g = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(1, args.max_len + 1, (args.batch,), generator=g)
    lengths[0] = args.max_len  # the batch is as wide as its longest response
    T = int(lengths.max())
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # [B, T]
    values = torch.randn(args.batch, T, generator=g) * mask  # [B, T]
    rewards = torch.zeros(args.batch, T)
    rewards[torch.arange(args.batch), lengths - 1] = torch.where(torch.rand(args.batch, generator=g) < 0.5, 1.0, -1.0)
    lam = length_adaptive_lambda(lengths, alpha=0.05)  # [B]

    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=lam)
    adv_ref, ret_ref = loop_gae(rewards, values, mask, 1.0, lam)
    max_diff = (adv - adv_ref).abs().max().item()

    t_ours = median_seconds(lambda: gae(rewards, values, mask, gamma=1.0, lam=lam), args.repeats)
    t_loop = median_seconds(lambda: loop_gae(rewards, values, mask, 1.0, lam), args.repeats)

    print(f"machine: {common.machine()}, {torch.get_num_threads()} threads")
    print(f"date: {common.now()}")
    print(f"shape: B = {args.batch}, T = {T}, mean length {lengths.float().mean():.0f}, "
          f"{int(mask.sum()):,} real tokens, per-sample lambda in [{lam.min():.3f}, {lam.max():.3f}]")
    print(f"max |advantage difference| between the two: {max_diff:.2e}")
    print(f"per-token loop : {t_loop * 1000:9.1f} ms (median of {args.repeats})")
    print(f"gae.gae        : {t_ours * 1000:9.1f} ms (median of {args.repeats})")
    print(f"speed-up       : {t_loop / t_ours:9.1f}x")


if __name__ == "__main__":
    main()
