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
from gae import gae, group_advantage, length_adaptive_lambda, terminal_rewards  # noqa: E402
from losses import explained_variance, head_mask  # noqa: E402
from models import load_policy, load_tokenizer, load_value_model, value_model_from_policy  # noqa: E402
from rollout import HFEngine, score_rollout  # noqa: E402

FIFTHS = 5
ABSOLUTE = (0, 10, 50, 100, 200, 300, 450)  # bins of token positions


def folder_of(name: str) -> str:
    return task.shipped_model(name) if name in task.BUILTIN_MODELS else name


def sample_set(policy: str = "builtin-long", prompts: int = 100, samples: int = 2, seed: int = 0):
    """The responses every critic is judged on: `samples` per held-out long-chain problem from `policy` at
    temperature 1 (a fixed seed). Returns (rollout, rewards [B] of +1 / -1, decisive [B, T] bool: the tokens
    task.borrow_digits names)."""
    torch.manual_seed(seed)
    model, tokenizer = load_policy(folder_of(policy), dtype=torch.float32)
    problems = task.make_dataset(prompts, 0, task.LONG.min_steps, task.LONG.max_steps, split="eval")
    engine = HFEngine(model, tokenizer, max_new_tokens=task.LONG.max_response_tokens, batch_size=64)
    with torch.no_grad():
        rollout = engine.generate([p["prompt"] for p in problems], n=samples, seed=seed)
    golds = [problems[int(i)]["answer"] for i in rollout.prompt_index]
    rewards = torch.tensor([1.0 if task.is_correct(t, g) else -1.0 for t, g in zip(rollout.texts, golds)])
    decisive = torch.zeros_like(rollout.response_mask, dtype=torch.bool)
    for b in range(rollout.B):
        ends = _token_ends(tokenizer, rollout, b)
        for char in task.borrow_digits(rollout.texts[b]):  # the token whose text covers that character
            decisive[b, int((ends <= char).sum())] = True
    return model, rollout, rewards, decisive


def _token_ends(tokenizer, rollout, b: int) -> torch.Tensor:
    """[n] the character offset in response b's text where each of its tokens' text ends."""
    return torch.tensor([len(tokenizer.decode([i])) for i in rollout.response_ids[b, :rollout.lengths[b]]]).cumsum(0)


def error_masks(rollout, tokenizer, prompts: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """For sample_set's rollout (its first `prompts` held-out problems): (before, at) [B, T] bool. `at` marks each
    wrong response's first wrong token (task.first_error: where it leaves the correct chain), `before` the tokens
    before it, all of them correct steps. An ideal critic gives those zero advantage in expectation (the
    state before the error is as good as the policy makes it); a group-normalised reward gives every one of them
    the response's negative advantage, pushing down the correct lookups and borrows that wrong responses share
    with right ones."""
    problems = task.make_dataset(prompts, 0, task.LONG.min_steps, task.LONG.max_steps, split="eval")
    before = torch.zeros_like(rollout.response_mask, dtype=torch.bool)
    at = torch.zeros_like(before)
    for b in range(rollout.B):
        char = task.first_error(rollout.texts[b], problems[int(rollout.prompt_index[b])])
        if char is None:
            continue
        t = min(int((_token_ends(tokenizer, rollout, b) <= char).sum()), int(rollout.lengths[b]) - 1)
        at[b, t], before[b, :t] = True, True
    return before, at


def error_kinds(rollout, prompts: int = 100) -> list[str | None]:
    """For sample_set's rollout: task.first_error_kind of each response (None when right): whether the first
    error a critic should see is a misread term (a lookup in the prompt) or the habit (a forgotten borrow)."""
    problems = task.make_dataset(prompts, 0, task.LONG.min_steps, task.LONG.max_steps, split="eval")
    return [task.first_error_kind(rollout.texts[b], problems[int(rollout.prompt_index[b])]) for b in range(rollout.B)]


def credit(advantages: torch.Tensor, mask: torch.Tensor, decisive: torch.Tensor) -> float:
    """(share of sum |A_t| on the decisive tokens) / (their share of the tokens): 1 = spread evenly."""
    weight = advantages.abs() * mask
    return float((weight[decisive].sum() / weight.sum().clamp(min=1e-12)) / (decisive.sum() / mask.sum()))


def group_credit(rewards: torch.Tensor, mask: torch.Tensor, decisive: torch.Tensor, group_size: int) -> float:
    """credit() of GRPO's group advantage on the same responses (consecutive groups of group_size)."""
    return credit(group_advantage(rewards, mask, group_size), mask, decisive)


def bias_table(values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, alpha: float,
               decisive: torch.Tensor | None = None, lam_fixed: float = 0.95, errors=None, kinds=None) -> dict:
    """values, mask [B, T], rewards [B] (decisive [B, T] bool, for the credit figures) -> the figures the module
    docstring lists; lam_fixed is the fixed lambda compared with the length-adaptive one (PPO's 0.95). errors:
    error_masks' (before, at), for the mean advantage on wrong responses' correct steps before their first error
    and the credit at that error; kinds (error_kinds' list, with errors): that credit again for the responses
    whose first error is a misread, and for those whose first error is the habit."""
    B, T = mask.shape
    lengths = mask.sum(-1)  # [B]
    returns = rewards[:, None].expand(B, T) * mask  # [B, T], gamma = 1: every token's return is the reward
    pos = torch.arange(T)[None, :].expand(B, T)
    rel = pos / lengths.clamp(min=1)[:, None]  # [B, T] relative position in [0, 1)
    real = mask.bool()
    out = {"by_fifth": [], "by_position": []}
    for k in range(FIFTHS):
        pick = real & (rel >= k / FIFTHS) & (rel < (k + 1) / FIFTHS)
        out["by_fifth"].append(_cell(f"{20 * k}-{20 * (k + 1)}%", values, returns, pick)
                               | {"explained_variance": explained_variance(values, returns, pick)})
    for lo, hi in zip(ABSOLUTE, ABSOLUTE[1:]):
        pick = real & (pos >= lo) & (pos < hi)
        if pick.any():
            out["by_position"].append(_cell(f"{lo}-{hi - 1}", values, returns, pick))
    out["explained_variance"] = explained_variance(values, returns, mask)
    terminal = terminal_rewards(rewards, mask)
    first = head_mask(mask).bool()
    for name, lam in ((f"{lam_fixed}", torch.full((B,), lam_fixed)), ("adaptive", length_adaptive_lambda(lengths,
                                                                                                         alpha)),
                      ("0 (TD error)", torch.zeros(B))):
        adv = gae(terminal, values, mask, lam=lam)[0]  # [B, T]
        if not name.startswith("0 "):
            out[f"advantage_first_tenth_lambda_{name}"] = float(adv[first].mean())
            out[f"advantage_rest_lambda_{name}"] = float(adv[real & ~first].mean())
        if decisive is not None and decisive.any():
            out[f"credit_lambda_{name}"] = credit(adv, mask, decisive)
        if errors is not None and errors[1].any():
            out[f"advantage_before_error_lambda_{name}"] = float(adv[errors[0]].mean())
            out[f"credit_at_error_lambda_{name}"] = credit(adv, mask, errors[1])
            for kind in ("misread", "habit") if kinds is not None else ():
                of_kind = errors[1] & torch.tensor([k == kind for k in kinds])[:, None]  # [B, T]
                if of_kind.any():
                    out[f"credit_at_{kind}_lambda_{name}"] = credit(adv, mask, of_kind)
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
    policy, rollout, rewards, decisive = sample_set(args.policy, args.prompts, args.samples, args.seed)
    mask = rollout.response_mask
    errors = error_masks(rollout, load_tokenizer(folder_of(args.policy)), args.prompts)  # the tokenizer only
    kinds = error_kinds(rollout, args.prompts)
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
        table = bias_table(values, rewards, mask, args.alpha, decisive, errors=errors, kinds=kinds)
        parts = name.rstrip("/").split("/")  # a folder by its last parts: RUN/critic_pretrained, RUN/checkpoint/critic
        name = name if name in ("zero", *task.BUILTIN_MODELS) else "/".join(parts[-3 if parts[-2:-1] == ["checkpoint"]
                                                                                   else -2:])
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
