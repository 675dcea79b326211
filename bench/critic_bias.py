"""The critic's bias by token position, before any RL: mean V(s_t) against the Monte-Carlo return.

    python bench/critic_bias.py [--critics builtin-long-rm zero RUN_DIR/critic_pretrained] [--prompts 100]

The policy (default the long chains' base model, --preset long's) samples --samples responses to each of
--prompts held-out long-chain problems at temperature 1 (a fixed seed), the verifier scores them, and each critic
given scores every response token. With gamma = 1 and one reward at the end, the Monte-Carlo return of every
token of a response is its reward, so the unbiased V(s_t) of the sampling policy averages to the mean reward of
the responses that reach t. Printed per critic, by fifth of each response (relative position) and by absolute
position: the mean V(s_t), the mean return, their difference (the bias), and the explained variance of the
returns; then the mean raw advantage over a response's first tenth against the rest under lambda 0.95 (PPO's)
and the length-adaptive lambda of --alpha: where a biased critic pushes the policy before any reward is seen.

Critics: "builtin-long-rm" (the shipped outcome reward model), "zero" (the policy's backbone, a zero head: what
a critic starts as without --value-model), or a folder (a run's critic_pretrained/, after value pretraining).
--json writes the figures, --plot the curves of mean V(s_t) and the return by relative position.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import task  # noqa: E402
from gae import gae, length_adaptive_lambda, terminal_rewards  # noqa: E402
from losses import explained_variance  # noqa: E402
from models import load_policy, load_value_model, value_model_from_policy  # noqa: E402
from rollout import HFEngine, score_rollout  # noqa: E402

FIFTHS = 5
ABSOLUTE = (0, 10, 50, 100, 200, 300, 450)  # bins of token positions


def folder_of(name: str) -> str:
    return task.shipped_model(name) if name in task.BUILTIN_MODELS else name


def bias_table(values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, alpha: float) -> dict:
    """values, mask [B, T], rewards [B] -> the figures the module docstring lists."""
    B, T = mask.shape
    lengths = mask.sum(-1)  # [B]
    returns = rewards[:, None].expand(B, T) * mask  # [B, T], gamma = 1: every token's return is the reward
    pos = torch.arange(T)[None, :].expand(B, T)
    rel = pos / lengths.clamp(min=1)[:, None]  # [B, T] relative position in [0, 1)
    real = mask.bool()
    out = {"by_fifth": [], "by_position": []}
    for k in range(FIFTHS):
        pick = real & (rel >= k / FIFTHS) & (rel < (k + 1) / FIFTHS)
        out["by_fifth"].append(_cell(f"{20 * k}-{20 * (k + 1)}%", values, returns, pick))
    for lo, hi in zip(ABSOLUTE, ABSOLUTE[1:]):
        pick = real & (pos >= lo) & (pos < hi)
        if pick.any():
            out["by_position"].append(_cell(f"{lo}-{hi - 1}", values, returns, pick))
    out["explained_variance"] = explained_variance(values, returns, mask)
    terminal = terminal_rewards(rewards, mask)
    first = real & (rel < 0.1)
    for name, lam in (("0.95", torch.full((B,), 0.95)), (f"adaptive (alpha {alpha})",
                                                           length_adaptive_lambda(lengths, alpha))):
        adv = gae(terminal, values, mask, lam=lam)[0]  # [B, T]
        out[f"advantage_first_tenth_lambda_{name}"] = float(adv[first].mean())
        out[f"advantage_rest_lambda_{name}"] = float(adv[real & ~first].mean())
    return out


def _cell(label, values, returns, pick) -> dict:
    v, r = float(values[pick].mean()), float(returns[pick].mean())
    return {"where": label, "tokens": int(pick.sum()), "mean_value": v, "mean_return": r, "bias": v - r}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="builtin-long")
    ap.add_argument("--critics", nargs="+", default=["builtin-long-rm", "zero"])
    ap.add_argument("--prompts", type=int, default=100, help="held-out long-chain problems")
    ap.add_argument("--samples", type=int, default=2, help="samples per problem")
    ap.add_argument("--alpha", type=float, default=0.5, help="alpha of the length-adaptive lambda (--preset long's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    policy, tokenizer = load_policy(folder_of(args.policy), dtype=torch.float32)
    problems = task.make_dataset(args.prompts, 0, task.LONG.min_steps, task.LONG.max_steps, split="eval")
    engine = HFEngine(policy, tokenizer, max_new_tokens=task.LONG.max_response_tokens, batch_size=64)
    with torch.no_grad():
        rollout = engine.generate([p["prompt"] for p in problems], n=args.samples, seed=args.seed)
    golds = [problems[int(i)]["answer"] for i in rollout.prompt_index]
    rewards = torch.tensor([1.0 if task.is_correct(t, g) else -1.0 for t, g in zip(rollout.texts, golds)])
    mask = rollout.response_mask
    result = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}",
              "date": datetime.date.today().isoformat(), "policy": args.policy, "responses": rollout.B,
              "mean_length": float(rollout.lengths.float().mean()), "right": float((rewards > 0).float().mean()),
              "critics": {}}
    print(f"{result['date']}, {result['machine']}: {rollout.B} responses of {args.policy} (mean "
          f"{result['mean_length']:.0f} tokens, {100 * result['right']:.1f}% right)")
    for name in args.critics:
        critic = value_model_from_policy(policy) if name == "zero" else load_value_model(folder_of(name),
                                                                                         dtype=torch.float32)
        values = score_rollout(None, critic, rollout, micro_batch_size=16)["values"]
        table = bias_table(values, rewards, mask, args.alpha)
        name = name if name in ("zero", *task.BUILTIN_MODELS) else "/".join(name.rstrip("/").split("/")[-2:])
        result["critics"][name] = table  # a folder by its last two parts: RUN/critic_pretrained
        print(f"\n{name}: explained variance {table['explained_variance']:+.3f}")
        print(f"  {'where':<12}{'tokens':>8}{'mean V':>9}{'return':>9}{'bias':>9}")
        for cell in table["by_fifth"] + table["by_position"]:
            print(f"  {cell['where']:<12}{cell['tokens']:>8}{cell['mean_value']:>+9.3f}{cell['mean_return']:>+9.3f}"
                  f"{cell['bias']:>+9.3f}")
        for key in [k for k in table if k.startswith("advantage_")]:
            print(f"  {key}: {table[key]:+.4f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        x = [20 * k + 10 for k in range(FIFTHS)]
        for name, table in result["critics"].items():
            ax.plot(x, [c["mean_value"] for c in table["by_fifth"]], marker="o", label=f"V(s_t): {name}")
        first = next(iter(result["critics"].values()))
        ax.plot(x, [c["mean_return"] for c in first["by_fifth"]], "k--", label="Monte-Carlo return")
        ax.set_xlabel("position in the response (%)")
        ax.set_ylabel("mean over tokens")
        ax.set_title(f"critic bias before RL: {rollout.B} sampled responses of {args.policy}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    return result


if __name__ == "__main__":
    main()
