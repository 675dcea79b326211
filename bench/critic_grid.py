"""The critic-only grid: which learning rate, critic mini-batch, epochs and target lambda make --preset long's critic
a value function, chosen on rollouts of the training distribution, never on the held-out problems the docs report.

    python bench/critic_grid.py buffer                     # the base policy's rollouts, once (about 10 min, 1 core)
    python bench/critic_grid.py fit --jobs 2               # every cell of the grid (GRID), two processes
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
from models import load_policy, load_value_model
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


def fit_cell(lr: float, mb: int, epochs: int, lam: float, out: str) -> dict:
    """One cell of the grid (module docstring): its figures after each checkpoint, written to out/cells/NAME.json."""
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
    for i, part in enumerate(buffer["train"]):
        rollout, mask = part["rollout"], part["rollout"].response_mask
        values = score_rollout(None, critic, rollout, cfg.micro_batch_size)["values"]  # [B, T]
        _, returns = gae(terminal_rewards(rewards_of(part), mask), values, mask, lam=lam)  # the critic's targets
        stats = vapo.update(policy, critic, optimizers, rollout, {"values": values, "returns": returns}, cfg,
                            train_policy=False)
        steps += epochs * rollout.B // mb
        if i + 1 in CHECKPOINTS:
            v = score_rollout(None, critic, v_rollout, 16)["values"]
            result["checkpoints"].append({
                "batches": i + 1, "optimizer_steps": steps, "ev_return": ev_against(v, v_returns, v_mask),
                "ev_exact": ev_against(v, refs["exact"], v_mask),
                "clipped_frac": stats.get("grad_clipped/critic"), "value_loss": stats.get("value_loss"),
                "seconds": time.time() - t0})
    os.makedirs(os.path.join(out, "cells"), exist_ok=True)
    common.write_json(os.path.join(out, "cells", result["cell"] + ".json"), result)
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
    ap.add_argument("what", choices=("buffer", "fit", "cell", "report"))
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--mb", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--lam", type=float)
    ap.add_argument("--doc", default=os.path.join(common.ROOT, "docs", "critic-grid.md"))
    args = ap.parse_args(argv)
    if args.what == "buffer":
        make_buffer(args.out)
    elif args.what == "fit":
        fit_all(args.out, args.jobs)
    elif args.what == "cell":
        fit_cell(args.lr, args.mb, args.epochs, args.lam, args.out)
    else:
        report(args.out, args.doc)


def report(out: str, doc: str) -> None:
    raise NotImplementedError


if __name__ == "__main__":
    main()
