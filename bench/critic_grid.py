"""The critic-only grid: which learning rate, critic mini-batch, epochs and target lambda make --preset long's critic
a value function, chosen on rollouts of the training distribution, never on the held-out problems the docs report.

    python bench/critic_grid.py buffer                     # the base policy's rollouts, once (about 10 min, 1 core)
    python bench/critic_grid.py fit --jobs 2               # every cell of the grid (GRID), two processes
    python bench/critic_grid.py curve                      # the pick on 100 batches: is the critic short of data?
    python bench/critic_grid.py report                     # docs/critic-grid.md's table and figure

The buffer: the long chains' base model (--preset long's policy) samples, at the training rollouts' temperature 1
and top-p 1, the 20 batches of 8 prompts x 8 that value pretraining of seed 0 samples (its prompt stream), and a
validation set of 64 other training-split prompts x 8. Every cell starts from the shipped outcome reward model (the
preset's critic start), sees the 20 batches in order, each `epochs` times in shuffled mini-batches of `mb`
samples, one AdamW step a mini-batch (vapo.update with train_policy=False: the trainer's own critic step, its
warmup and its gradient clip), and is scored on the validation set after 5, 10 and 20 batches:

    ev_return   explained variance of the Monte-Carlo return (every token's return is the response's reward)
    ev_exact    1 - Var(V* - V) / Var(V*): how much of the task's exact values V* the critic explains
                (task.ExactValues: the base policy's measured success rate of each character of a step line,
                estimated on the 20 training batches; a constructed reference, not a technique of the paper)

beside the two references that need no critic: the step-count floor (task.ExactValues' lookup of the prompt's
number of steps, fitted on the same 20 batches) and V* itself, both scored against the return on the validation
set. A critic worth trusting beats the floor; none can beat V* in expectation.
"""
from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

import common  # (puts the repository on the path)
import config
import task
import vapo
from common import folder_of
from engines import HFEngine
from gae import gae, terminal_rewards
from losses import explained_variance
from models import load_policy, load_tokenizer, load_value_model
from rollout import Rollout, score_rollout

OUT = os.path.join(common.ROOT, "runs", "critic-grid")
BATCHES, PROMPTS, G, VALIDATION_PROMPTS = 20, 8, 8, 64
CHECKPOINTS = (5, 10, 20)
# The grid, fixed before its results were seen: learning rate x critic mini-batch x epochs a batch x target lambda.
# The preset's critic before this grid (lr 1e-3 on the actor's mini-batches of 4, lambda 1) is one of its cells.
GRID = dict(lr=(1e-4, 3e-4, 1e-3, 3e-3), mb=(4, 16, 64), epochs=(1,), lam=(1.0, 0.95))


def cell_name(lr: float, mb: int, epochs: int, lam: float) -> str:
    return f"lr{lr:g}-mb{mb}-ep{epochs}-lam{lam:g}"


def buffer_rows() -> tuple[list[list[dict]], list[dict]]:
    """The prompts: value pretraining's 20 batches of seed 0 (data.prompt_batch of its stream), and 64 validation
    prompts of the training split that none of those batches holds."""
    from data import prompt_batch
    rows = task.make_dataset(20000, config.stream(0, "builtin_rows"), task.LONG.min_steps, task.LONG.max_steps,
                             split="train")
    batches = [prompt_batch(rows, s, PROMPTS, config.stream(0, "pretrain_prompts")) for s in range(BATCHES)]
    seen = {r["expr"] for b in batches for r in b}
    validation = [r for r in reversed(rows) if r["expr"] not in seen][:VALIDATION_PROMPTS]
    return batches, validation


def make_buffer(out: str) -> None:
    """Samples and saves the buffer (the rollouts, their problems and rewards) to out/buffer.pt."""
    torch.manual_seed(0)
    policy, tokenizer = load_policy(folder_of("builtin-long"), dtype=torch.float32)
    engine = HFEngine(policy, tokenizer, max_new_tokens=task.LONG.max_response_tokens, batch_size=PROMPTS)
    batches, validation = buffer_rows()
    saved = {"train": [], "validation": None, "machine": common.machine(), "date": common.now()}
    t0 = time.time()
    for i, rows in enumerate(batches + [validation]):
        with torch.no_grad():
            rollout = engine.generate([r["prompt"] for r in rows], n=G, seed=1000 + i)
        part = {"rollout": rollout, "problems": [rows[int(j)] for j in rollout.prompt_index]}
        if i < len(batches):
            saved["train"].append(part)
        else:
            saved["validation"] = part
        print(f"batch {i + 1}/{len(batches) + 1}: {rollout.B} responses, mean length "
              f"{rollout.lengths.float().mean():.0f}, {time.time() - t0:.0f} s", flush=True)
    os.makedirs(out, exist_ok=True)
    torch.save(saved, os.path.join(out, "buffer.pt"))


CURVE_BATCHES = 100  # the learning curve's batches: value pretraining's stream continued (the paper's 50 steps, and 2x)


def extend_buffer(out: str) -> None:
    """out/buffer-more.pt: value pretraining's prompt stream continued from batch 21 to CURVE_BATCHES, sampled as the
    buffer is, leaving out any validation prompt (so a batch may hold 7 prompts)."""
    from data import prompt_batch
    torch.manual_seed(1)
    policy, tokenizer = load_policy(folder_of("builtin-long"), dtype=torch.float32)
    engine = HFEngine(policy, tokenizer, max_new_tokens=task.LONG.max_response_tokens, batch_size=PROMPTS)
    rows = task.make_dataset(20000, config.stream(0, "builtin_rows"), task.LONG.min_steps, task.LONG.max_steps,
                             split="train")
    held = {p["expr"] for p in load_buffer(out)["validation"]["problems"]}
    more = []
    for s in range(BATCHES, CURVE_BATCHES):
        batch = [r for r in prompt_batch(rows, s, PROMPTS, config.stream(0, "pretrain_prompts")) if r["expr"] not in held]
        with torch.no_grad():
            rollout = engine.generate([r["prompt"] for r in batch], n=G, seed=1000 + s)
        more.append({"rollout": rollout, "problems": [batch[int(j)] for j in rollout.prompt_index]})
        print(f"batch {s + 1}/{CURVE_BATCHES}", flush=True)
    torch.save(more, os.path.join(out, "buffer-more.pt"))


def rewards_of(part: dict) -> torch.Tensor:
    """[B] +1 / -1: the built-in verifier's score of each response."""
    return torch.tensor([1.0 if task.is_correct(t, p["answer"]) else -1.0
                         for t, p in zip(part["rollout"].texts, part["problems"])])


def load_buffer(out: str) -> dict:
    return torch.load(os.path.join(out, "buffer.pt"), weights_only=False)


def references(buffer: dict, tokenizer) -> dict:
    """The critic-free references on the validation set, fitted on the training batches: the step-count floor and
    V*, each as values [B, T] and their explained variance of the return."""
    exact = task.ExactValues()
    for part in buffer["train"]:
        exact.observe(part["rollout"].texts, part["problems"], rewards_of(part))
    part = buffer["validation"]
    rollout, rewards = part["rollout"], rewards_of(part)
    mask = rollout.response_mask
    returns = terminal_returns(rewards, mask)
    floor = exact.floor_values(rollout, part["problems"])
    star = exact.values(rollout, part["problems"], tokenizer)
    return {"floor": floor, "exact": star, "ev_floor": explained_variance(floor, returns, mask),
            "ev_exact": explained_variance(star, returns, mask), "rates": exact.summary()}


def terminal_returns(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] the Monte-Carlo return of every token (gamma = 1: the response's reward)."""
    return rewards[:, None] * mask


def ev_against(values: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(target - values) / Var(target) over the mask: the share of target's variance that values explain."""
    return explained_variance(values, target, mask)


def fit_cell(lr: float, mb: int, epochs: int, lam: float, out: str, curve: bool = False) -> dict:
    """One cell of the grid (module docstring): its figures after each checkpoint, written to out/cells/NAME.json.
    curve: the learning curve instead, on CURVE_BATCHES batches (buffer-more.pt after the buffer's), checkpoints every
    10, written to out/curve/NAME.json."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    buffer = load_buffer(out)
    policy, tokenizer = load_policy(folder_of("builtin-long"), dtype=torch.float32)
    critic = load_value_model(folder_of("builtin-long-rm"), dtype=torch.float32)
    refs = references(buffer, tokenizer)
    cfg = vapo.Config(**{**config.PRESETS["long"], "value_model": None, "critic_lr": lr,
                         "critic_mini_batch_size": mb, "critic_epochs": epochs, "lam_critic": lam}).validate()
    optimizers = {"critic": vapo.make_optimizer(critic, lr, cfg)}
    val = buffer["validation"]
    v_rollout, v_mask = val["rollout"], val["rollout"].response_mask
    v_returns = terminal_returns(rewards_of(val), v_mask)
    result = {"cell": cell_name(lr, mb, epochs, lam), "lr": lr, "mb": mb, "epochs": epochs, "lam": lam,
              "ev_floor": refs["ev_floor"], "ev_exact_reference": refs["ev_exact"], "checkpoints": []}
    t0 = time.time()
    steps = 0
    train, checkpoints, folder = buffer["train"], CHECKPOINTS, "cells"
    if curve:
        train = train + torch.load(os.path.join(out, "buffer-more.pt"), weights_only=False)
        checkpoints, folder = tuple(range(10, CURVE_BATCHES + 1, 10)), "curve"
    for i, part in enumerate(train):
        rollout, mask = part["rollout"], part["rollout"].response_mask
        values = score_rollout(None, critic, rollout, cfg.micro_batch_size)["values"]  # [B, T]
        _, returns = gae(terminal_rewards(rewards_of(part), mask), values, mask, lam=lam)  # the critic's targets
        stats = vapo.update(policy, critic, optimizers, rollout, {"values": values, "returns": returns}, cfg,
                            train_policy=False)
        steps += epochs * rollout.B // mb
        if i + 1 in checkpoints:
            v = score_rollout(None, critic, v_rollout, 16)["values"]
            result["checkpoints"].append({
                "batches": i + 1, "optimizer_steps": steps, "ev_return": ev_against(v, v_returns, v_mask),
                "ev_exact": ev_against(v, refs["exact"], v_mask),
                "clipped_frac": stats.get("grad_clipped/critic"), "value_loss": stats.get("value_loss"),
                "seconds": time.time() - t0})
    os.makedirs(os.path.join(out, folder), exist_ok=True)
    torch.save(v.half(), os.path.join(out, folder, result["cell"] + ".values.pt"))  # the final V(s_t) on validation
    common.write_json(os.path.join(out, folder, result["cell"] + ".json"), result)
    last = result["checkpoints"][-1]
    print(f"{result['cell']}: EV return {last['ev_return']:+.3f} (floor {refs['ev_floor']:+.3f}, V* "
          f"{refs['ev_exact']:+.3f}), EV of V* {last['ev_exact']:+.3f}, {last['seconds']:.0f} s", flush=True)
    return result


def fit_all(out: str, jobs: int) -> None:
    """Every cell of GRID not yet in out/cells, `jobs` one-thread processes at a time."""
    cells = [c for c in itertools.product(*GRID.values())
             if not os.path.exists(os.path.join(out, "cells", cell_name(*c) + ".json"))]

    def one(c):
        lr, mb, epochs, lam = c
        cmd = [sys.executable, __file__, "cell", "--lr", str(lr), "--mb", str(mb), "--epochs", str(epochs),
               "--lam", str(lam), "--out", out]
        return subprocess.run(cmd, env=common.thread_env(1)).returncode

    with ThreadPoolExecutor(jobs) as pool:
        codes = list(pool.map(one, cells))
    if any(codes):
        raise SystemExit(f"{sum(1 for c in codes if c)} cells failed")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("buffer", "fit", "cell", "curve", "report"))
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--mb", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--lam", type=float)
    ap.add_argument("--doc", default=os.path.join(common.ROOT, "docs", "critic-grid.md"))
    ap.add_argument("--runs", nargs="*", default=[], help="report: run folders of --preset long whose critics to "
                    "show beside the grid (their RL steps' EV against the floor and V*)")
    args = ap.parse_args(argv)
    if args.what == "buffer":
        make_buffer(args.out)
    elif args.what == "fit":
        fit_all(args.out, args.jobs)
    elif args.what == "cell":
        fit_cell(args.lr, args.mb, args.epochs, args.lam, args.out)
    elif args.what == "curve":  # the pick of the grid, trained on CURVE_BATCHES batches: is it short of data?
        if not os.path.exists(os.path.join(args.out, "buffer-more.pt")):
            extend_buffer(args.out)
        fit_cell(args.lr or 3e-4, args.mb or 16, args.epochs or 1, args.lam or 1.0, args.out, curve=True)
    else:
        report(args.out, args.doc, args.runs)


def report(out: str, doc: str, runs: list[str] = ()) -> None:
    """docs/critic-grid.md and its figure from out/cells: every cell of GRID, the references beside them."""
    buffer = load_buffer(out)
    refs = references(buffer, load_tokenizer(folder_of("builtin-long")))
    cells = []
    for c in itertools.product(*GRID.values()):
        path = os.path.join(out, "cells", cell_name(*c) + ".json")
        cells.append(common.read_json(path) if os.path.exists(path) else None)
    done = [c for c in cells if c is not None]
    best = max(done, key=lambda c: c["checkpoints"][-1]["ev_return"])
    lines = [
        "# The critic-only grid (`python bench/critic_grid.py`)", "",
        f"Buffer sampled {buffer['date']} on {buffer['machine']}; cells fitted on the same machine, one thread each.",
        "", "Validation: 64 training-split prompts x 8 samples of the base policy (not the held-out problems the docs "
        "report). References on it, fitted on the 20 training batches: the step-count floor explains "
        f"**{refs['ev_floor']:.3f}** of the return's variance, the exact values V* **{refs['ev_exact']:.3f}** "
        f"(measured rates: guess {refs['rates']['guess']:.3f}, a borrow line right {refs['rates']['borrow_line']:.3f}, "
        f"another line {refs['rates']['other_line']:.3f}).", "",
        "Each cell starts from the shipped outcome reward model and sees the 20 batches of 64 once, in shuffled "
        "critic mini-batches (`vapo.update(..., train_policy=False)`: warmup 5 steps, gradient clip 1.0). EV = "
        "explained variance on the validation set after 5 / 10 / 20 batches; EV of V* = 1 - Var(V* - V) / Var(V*); "
        "clipped = share of the last batch's critic steps whose gradient norm was clipped; seconds: the cell's wall time, "
        "with other jobs beside it (a load that varied).", "",
        "| lr | critic mini-batch | lambda | steps | EV 5 | EV 10 | EV 20 | EV of V* (20) | clipped | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for c in done:
        cp = c["checkpoints"]
        lines.append(f"| {c['lr']:g} | {c['mb']} | {c['lam']:g} | {cp[-1]['optimizer_steps']} | "
                     + " | ".join(f"{p['ev_return']:+.3f}" for p in cp)
                     + f" | {cp[-1]['ev_exact']:+.3f} | {cp[-1]['clipped_frac']:.2f} | {cp[-1]['seconds']:.0f} |")
    lines += ["", "Credit where a response first goes wrong, on the validation set's wrong responses: the share of the "
              "advantage's magnitude on each one's first wrong token (task.first_error) over that token's share of "
              "the tokens (1 = spread evenly; GRPO's group advantage, the same on every token of a response, gives "
              "about 1); TD errors are lambda 0, the policy's advantages lambda = 1 - 1 / (0.5 l) (--preset long's "
              "alpha). A value function puts the TD error where the outcome was decided.", "",
              "| values | EV of the return | credit at the first error: TD error | advantage (adaptive lambda) |",
              "|---|---|---|---|"]
    tokenizer = load_tokenizer(folder_of("builtin-long"))
    shown = {"V* (exact values)": refs["exact"], "step-count floor": refs["floor"]}
    for c in (best, next((c for c in done if (c["lr"], c["mb"], c["lam"]) == (1e-3, 4, 1.0)), None)):
        path = os.path.join(out, "cells", f"{c['cell']}.values.pt") if c else ""
        if c and os.path.exists(path):
            shown[f"critic {c['cell']}"] = torch.load(path).float()
    for name, values in shown.items():
        f = credit_figures(values, buffer["validation"], tokenizer)
        lines.append(f"| {name} | {f['ev']:+.3f} | {f['credit_td']:.2f} | {f['credit_adaptive']:.2f} |")
    missing = [cell_name(*c) for c, r in zip(itertools.product(*GRID.values()), cells) if r is None]
    lines += ["", f"Best on validation: **{best['cell']}**, EV {best['checkpoints'][-1]['ev_return']:+.3f} against the "
              f"floor's {refs['ev_floor']:+.3f}." + (f" Not run: {', '.join(missing)}." if missing else "")]
    lines += curve_table(out, refs)
    lines += run_table(runs)
    figure = os.path.splitext(doc)[0] + ".png"
    draw(done, refs, figure)
    lines += ["", f"![EV by learning rate]({os.path.basename(figure)})", ""]
    with open(doc, "w") as fh:
        fh.write("\n".join(lines))
    print("\n".join(lines))


def curve_table(out: str, refs: dict) -> list[str]:
    """Lines of the learning curve's table (out/curve/*.json, `curve`), if it was run."""
    lines = []
    for path in sorted(glob.glob(os.path.join(out, "curve", "*.json"))):
        c = common.read_json(path)
        lines += ["", f"Learning curve of {c['cell']} on {CURVE_BATCHES} batches (value pretraining's stream continued; "
                  f"the validation set and references as above: floor {refs['ev_floor']:+.3f}, V* {refs['ev_exact']:+.3f}):",
                  "", "| batches | critic steps | EV of the return | EV of V* |", "|---|---|---|---|"]
        lines += [f"| {p['batches']} | {p['optimizer_steps']} | {p['ev_return']:+.3f} | {p['ev_exact']:+.3f} |"
                  for p in c["checkpoints"]]
    return lines


def run_table(runs: list[str]) -> list[str]:
    """Lines of a table of RL runs' critics (common.summarise_run): per run, value pretraining's last EV and whether
    it reached its gate, and over the RL steps the mean EV of the critic, the step-count floor and V*, the share of
    steps where the critic beat the floor, the critic's fit to V* and its share of clipped steps."""
    if not runs:
        return []
    lines = ["", "RL runs (each RL step's batch of 64: the floor and V* fitted on the 8 batches before it, "
             "`vapo.critic_judge`):", "",
             "| run | pretraining EV (last 3) | gate reached | EV critic | EV floor | EV V* | steps critic > floor | "
             "critic's EV of V* | clipped critic steps | held-out greedy / avg@k, base -> final |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        s = common.summarise_run(run)
        if s is None:
            lines.append(f"| {run} | not finished |||||||||")
            continue
        steps = [r for r in common.rl_steps(common.read_records(run)) if "ev_floor" in r]
        wins = sum(r["explained_variance"] > r["ev_floor"] for r in steps)
        lines.append(f"| {os.path.relpath(run, common.ROOT)} | {s['pretrain_ev_last3']:.3f} | {s['pretrain_reached']} | "
                     f"{s['ev']:.3f} | {s['ev_floor']:.3f} | {s['ev_exact']:.3f} | {wins} of {len(steps)} | "
                     f"{s['ev_critic_exact']:.3f} | {s['clipped_critic']:.2f} | {100 * s['greedy_base']:.1f} -> "
                     f"{100 * s['greedy_final']:.1f} / {100 * s['avg_base']:.1f} -> {100 * s['avg_final']:.1f} |")
    return lines


def credit_figures(values: torch.Tensor, part: dict, tokenizer) -> dict:
    """values [B, T] on a buffer part: their explained variance of the return, and the credit (common.credit) at
    each wrong response's first wrong token of the TD errors (lambda 0) and of the length-adaptive advantages."""
    from gae import length_adaptive_lambda
    rollout, rewards = part["rollout"], rewards_of(part)
    mask = rollout.response_mask
    at = torch.zeros_like(mask, dtype=torch.bool)
    for b in range(rollout.B):
        char = task.first_error(rollout.texts[b], part["problems"][b])
        if char is not None:
            at[b, min(int((common.token_ends(tokenizer, rollout, b) <= char).sum()), int(rollout.lengths[b]) - 1)] = True
    terminal = terminal_rewards(rewards, mask)
    td = gae(terminal, values, mask, lam=0.0)[0]
    adaptive = gae(terminal, values, mask, lam=length_adaptive_lambda(rollout.lengths, 0.5))[0]
    return {"ev": explained_variance(values, terminal_returns(rewards, mask), mask),
            "credit_td": common.credit(td, mask, at), "credit_adaptive": common.credit(adaptive, mask, at)}


def draw(cells: list[dict], refs: dict, path: str) -> None:
    """EV of the return after 20 batches against the learning rate, a line per critic mini-batch, a panel per
    lambda, with the floor and V* as horizontal lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lams = GRID["lam"]
    fig, axes = plt.subplots(1, len(lams), figsize=(5 * len(lams), 3.6), sharey=True)
    for ax, lam in zip(axes, lams):
        for mb in GRID["mb"]:
            pts = sorted((c["lr"], c["checkpoints"][-1]["ev_return"]) for c in cells if c["mb"] == mb and c["lam"] == lam)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"critic mini-batch {mb}")
        ax.axhline(refs["ev_floor"], color="gray", ls="--", label="step-count floor")
        ax.axhline(refs["ev_exact"], color="k", ls=":", label="V* (exact values)")
        ax.set_xscale("log")
        ax.set_xlabel("critic learning rate")
        ax.set_title(f"target lambda {lam:g}")
    axes[0].set_ylabel("EV of the return (validation)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
