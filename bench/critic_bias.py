"""The critic's bias by token position, before any RL: mean V(s_t) against the Monte-Carlo return.

    python bench/critic_bias.py [--critics builtin-long-rm zero RUN_DIR/critic_pretrained] [--prompts 100]

The policy (default the long chains' base model, --preset long's) samples --samples responses to each of
--prompts held-out long-chain problems at temperature 1 (a fixed seed), the verifier scores them, and each critic
given scores every response token. With gamma = 1 and one reward at the end, the Monte-Carlo return of every
token of a response is its reward, so the unbiased V(s_t) of the sampling policy averages to the mean reward of
the responses that reach t. Printed per critic, by fifth of each response (relative position) and by absolute
position: the mean V(s_t), the mean return, their difference (the bias), and the explained variance of the
returns (over all tokens, and within each fifth); then the mean raw advantage over a response's first tenth
against the rest under lambda 0.95 (PPO's) and the length-adaptive lambda of --alpha: where a biased critic
pushes the policy before any reward is seen. Last, credit assignment: the share of the advantage's magnitude
(sum of |A_t|) that sits on the decisive tokens (task.borrow_digits: the tens digit of every borrow step, where a
sample keeps or forgets the borrow), divided by those tokens' share of all tokens: 1 is no concentration (GRPO's
group advantage, the same on every token of a response, is printed as the reference), above 1 is a critic that
puts the credit where the outcome was decided; also for the one-step TD errors (lambda 0), the critic's own
localisation; and the credit at the first error split by its kind (task.first_error_kind: a misread term, or
the habit), since a critic that shares the policy's backbone may see one kind of error and not the other.

Critics: "builtin-long-rm" (the shipped outcome reward model), "zero" (the policy's backbone, a zero head: what
a critic starts as without --value-model), "exact" (the task's exact values V* of the policy, task.ExactValues,
its rates measured on another sample set of the same policy: a constructed reference, what a perfect critic
gives), "floor" (the step-count floor, fitted on that other set: what a lookup of the prompt gives), or a folder (a run's critic_pretrained/, after value pretraining, or RUN/checkpoint/critic).
--json writes the figures, --plot the curves of mean V(s_t) and the return by relative position. The responses
and the measures (common.sample_set, common.bias_table, common.credit) are shared with bench/ablation.py, which
judges every run's final critic with them.
"""
from __future__ import annotations

import argparse

import torch

import common  # (puts the repository on the path)
import builds
import task
from common import (FIFTHS, bias_table, credit, fitted_exact, folder_of, group_credit, held_out, sample_set,
                    token_ends)
from gae import group_advantage
from models import load_tokenizer, load_value_model, value_model_from_policy
from rollout import score_rollout


def error_masks(rollout, tokenizer, prompts: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """For common.sample_set's rollout (its first `prompts` held-out problems): (before, at) [B, T] bool. `at`
    marks each wrong response's first wrong token (task.first_error: where it leaves the correct chain), `before`
    the tokens before it, all of them correct steps. An ideal critic gives those zero advantage in expectation (the
    state before the error is as good as the policy makes it); a group-normalised reward gives every one of them
    the response's negative advantage, pushing down the correct lookups and borrows that wrong responses share
    with right ones."""
    problems = held_out(prompts)
    before = torch.zeros_like(rollout.response_mask, dtype=torch.bool)
    at = torch.zeros_like(before)
    for b in range(rollout.B):
        char = task.first_error(rollout.texts[b], problems[int(rollout.prompt_index[b])])
        if char is None:
            continue
        t = min(int((token_ends(tokenizer, rollout, b) <= char).sum()), int(rollout.lengths[b]) - 1)
        at[b, t], before[b, :t] = True, True
    return before, at


def error_kinds(rollout, prompts: int = 100) -> list[str | None]:
    """For common.sample_set's rollout: task.first_error_kind of each response (None when right): whether the
    first error a critic should see is a misread term (a lookup in the prompt) or the habit (a forgotten borrow)."""
    problems = held_out(prompts)
    return [task.first_error_kind(rollout.texts[b], problems[int(rollout.prompt_index[b])]) for b in range(rollout.B)]


def exact_values(policy: str, rollout, prompts: int, samples: int, seed: int, floor: bool = False) -> torch.Tensor:
    """[B, T] V* of rollout's states (task.ExactValues), its rates counted on another sample set of the same policy
    (seed + 1, common.fitted_exact), so that no response is judged by rates it helped measure; floor: the step-count
    floor instead, fitted on that set."""
    exact = fitted_exact(policy, prompts, samples, seed)
    mine = [held_out(prompts)[int(i)] for i in rollout.prompt_index]
    return exact.floor_values(rollout, mine) if floor else exact.values(rollout, mine, load_tokenizer(folder_of(policy)))


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
    policy, rollout, rewards, decisive = sample_set(args.policy, args.prompts, args.samples, args.seed)
    mask = rollout.response_mask
    errors = error_masks(rollout, load_tokenizer(folder_of(args.policy)), args.prompts)  # the tokenizer only
    kinds = error_kinds(rollout, args.prompts)
    result = {"machine": common.machine(), "date": common.now(), "policy": args.policy, "responses": rollout.B,
              "mean_length": float(rollout.lengths.float().mean()), "right": float((rewards > 0).float().mean()),
              "critics": {}}
    print(f"{result['date']}, {result['machine']}: {rollout.B} responses of {args.policy} (mean "
          f"{result['mean_length']:.0f} tokens, {100 * result['right']:.1f}% right)")
    for name in args.critics:
        if name in ("exact", "floor"):
            values = exact_values(args.policy, rollout, args.prompts, args.samples, args.seed, floor=name == "floor")
        else:
            critic = value_model_from_policy(policy) if name == "zero" else load_value_model(folder_of(name),
                                                                                             dtype=torch.float32)
            values = score_rollout(None, critic, rollout, micro_batch_size=16)["values"]
        table = bias_table(values, rewards, mask, args.alpha, decisive, errors=errors, kinds=kinds)
        parts = name.rstrip("/").split("/")  # a folder by its last parts: RUN/critic_pretrained, RUN/checkpoint/critic
        named = name in ("zero", "exact", "floor", *builds.BUILTIN_MODELS)
        name = name if named else "/".join(parts[-3 if parts[-2:-1] == ["checkpoint"] else -2:])
        result["critics"][name] = table
        print(f"\n{name}: explained variance {table['explained_variance']:+.3f}")
        print(f"  {'where':<12}{'tokens':>8}{'mean V':>9}{'return':>9}{'bias':>9}")
        for cell in table["by_fifth"] + table["by_position"]:
            print(f"  {cell['where']:<12}{cell['tokens']:>8}{cell['mean_value']:>+9.3f}{cell['mean_return']:>+9.3f}"
                  f"{cell['bias']:>+9.3f}")
        for key in [k for k in table if k.startswith(("advantage_", "credit_"))]:
            print(f"  {key}: {table[key]:+.4f}")
    if args.samples >= 2:
        result["credit_group_advantage"] = group_credit(rewards, mask, decisive, args.samples)
        print(f"\nGRPO's group advantage (groups of {args.samples}): credit {result['credit_group_advantage']:.4f}")
        if errors[1].any():
            group = group_advantage(rewards, mask, args.samples)
            result["group_advantage_before_error"] = float(group[errors[0]].mean())
            result["group_credit_at_error"] = credit(group, mask, errors[1])
            print(f"  on wrong responses' steps before their first error: mean advantage "
                  f"{result['group_advantage_before_error']:+.4f}; credit at the error "
                  f"{result['group_credit_at_error']:.4f}")
    result["decisive_token_share"] = float(decisive.sum() / mask.sum())
    result["first_error_kinds"] = {k: kinds.count(k) for k in sorted(set(kinds) - {None})}
    if args.json:
        common.write_json(args.json, result)
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
