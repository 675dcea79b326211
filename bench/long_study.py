"""Benchmark: why RL breaks the lookups in `--preset long`, lever by lever, judged on a validation split.

    python bench/long_study.py --tier 1 --jobs 2          # the tier's runs, two one-thread processes at a time
    python bench/long_study.py --report                   # the table of every finished run, nothing run
    python bench/long_study.py --tier 2 --centre lr1.5e-5-mb4 --points lr1.5e-5-mb4+kl0.01   # exploratory
    python bench/long_study.py --tier 3 --seeds 0 1       # the critic's lambda, around the revised preset
    python bench/long_study.py --tier 4 --seeds 0 1       # greedy's two candidate levers, around the preset

The grid is fixed here before any of its results were seen, and every point is reported, the losers included.
Each run is `python vapo.py --preset long --seed S` with the point's options, trained as the preset trains but
with no held-out evaluation on the way (the docs' held-out set plays no part in choosing settings). Its final
policy, and the base model once, are judged on a **validation split drawn from the training distribution**:
problems of the train split (task.split_of) from a seed no run trains on, less any prompt the run itself drew.
Per run: greedy accuracy, avg@k (k samples at temperature 1, top-p 1, as the preset evaluates), per step written
the misread-term rate (lookups), the habit rate (per borrow step) and the other slips, greedy and sampled, and per
response the kind of its first error (task.first_error_kind: one kind a response, where the per-step rate counts
a skipped term again on every later line; judgements from before it have none);
the clipped shares of tokens at each bound and the approximate KL over the run, from its metrics.jsonl.

Tiers (run in order; a later tier's centre is the earlier tier's best point on validation greedy accuracy, among
the points whose validation misread rate is at most the base model's plus 2 points, else the best overall):
- tier 1, the actor's step size and the off-policy degree: actor_lr {1.5e-4 (the preset), 5e-5, 1.5e-5} x
  mini-batch {32 (2 optimizer steps per rollout, the preset), 4 (16, the paper's)};
- tier 2, around tier 1's best: mini-batch 8 (8 steps per rollout), 2 PPO epochs, critic_lr 3e-4, a KL term to the
  initial policy (kl_coef 0.01), one at a time; and alpha 0.1 (lambda_policy = 1 - 1 / (0.1 l): 0.9 at 100 tokens,
  where 0.5 gives 0.98), added before any tier-2 run because bench/critic_bias.py measured the preset's lambda
  spreading wrong responses' blame over their correct steps before the first error; and mu 1 (the positive-example
  NLL ten times the paper's 0.1: it imitates correct samples, whose lookups are all right), added while the first
  tier-2 runs were under way, before any of their results was seen;
- tier 3, a hypothesis about the critic rather than a search: the revised preset's point (PRESET_POINT, run again
  so that its checkpoints can be judged by bench/critic_bias.py) and the same with lambda_critic 0.95 (PPO's)
  in place of VAPO's 1.0. Fixed before its runs, from one seed of bench/critic_bias.py: PPO's critic (trained on
  lambda-0.95 targets) put 2.4x its share of the advantage on the first wrong token, VAPO's (Monte-Carlo
  targets) 1.1x.
- tier 4, the two levers left for greedy accuracy, around the revised preset, one at a time, fixed before its
  runs: mu 3 (the positive-example NLL three times the preset's: on the validation split, at mu 1 the
  share of greedy responses whose first error is a misread was about 36% against the base's 41%, and greedy only
  moves where lookups do), and 48 RL steps in place of 40 (a fifth more samples: the preset's held-out runs took 16-17 of
  their 20 minutes, and their training accuracy was still rising at step 40).
- tier 5, each algorithm's own actor learning rate (issue: the baselines had inherited VAPO's), fixed before its
  runs: PPO, GRPO, DAPO and VAPO (`--algo`, each in the form its ablation row runs, at the row's budget of 2,560
  samples) x actor_lr {5e-6, 1.5e-5 (the preset), 5e-5}, one seed (0) a setting. Each algorithm's pick is its
  setting with the best mean of validation greedy and avg@2 (the two figures the comparison reports; no misread
  constraint). Training does not depend on held-out evaluations (their sampling seed is their own), so a finished
  `bench/ablation.py` run of the same algorithm, seed and options (the preset's lr) may be copied into the study's
  folder as that point's run (`--reuse`): it is judged on the validation split like the others.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
from concurrent.futures import ThreadPoolExecutor

import torch

import common  # (puts the repository on the path)
import data
import task
from config import stream
from models import load_policy

SEEDS = (0, 1, 2)
VALIDATION_PROBLEMS = 256
VALIDATION_SEED = 777_001  # a train-split seed no run trains on (the trainer's rows use --seed, 0-4 here)
VALIDATION_SAMPLES = 2  # k of the validation avg@k
TRAIN_ARGS = ["--preset", "long", "--eval-every", "0", "--eval-prompts", "16", "--eval-samples", "1",
              "--no-token-views", "--save-every", "0"]
TIER1 = {f"lr{lr}-mb{mb}": ["--actor-lr", lr, "--mini-batch-size", str(mb),  # micro-batches: memory only
                              "--micro-batch-size", str(min(mb, 8))]
         for lr in ("1.5e-4", "5e-5", "1.5e-5") for mb in (32, 4)}
TIER2_LEVERS = {"mb8": ["--mini-batch-size", "8"], "epochs2": ["--ppo-epochs", "2"],
                "critic3e-4": ["--critic-lr", "3e-4"], "kl0.01": ["--kl-coef", "0.01"],
                "alpha0.1": ["--alpha", "0.1"],  # added before any tier-2 run, from bench/critic_bias.py's measure
                "mu1": ["--mu", "1.0"]}  # added before any tier-2 result was seen: the positive-example NLL imitates
#                                          correct samples, whose lookups are all right, ten times as strongly

PRESET_POINT = "lr1.5e-5-mb4+mu1"  # the revised --preset long of tiers 3 and 4, the tier-2 point the rule chose
TIER3 = {PRESET_POINT: [*TIER1["lr1.5e-5-mb4"], *TIER2_LEVERS["mu1"]],
         f"{PRESET_POINT}+lamc0.95": [*TIER1["lr1.5e-5-mb4"], *TIER2_LEVERS["mu1"], "--lam-critic", "0.95"]}
TIER4 = {f"{PRESET_POINT}+mu3": [*TIER1["lr1.5e-5-mb4"], "--mu", "3.0"],
         f"{PRESET_POINT}+steps48": [*TIER3[PRESET_POINT], "--steps", "48"]}
PRESET_NOW = f"{PRESET_POINT}+mu3"  # --preset long since tier 4: the point its rule chose
TIER5_LRS = ("5e-6", "1.5e-5", "5e-5")
TIER5 = {f"{algo}-lr{lr}": ["--algo", algo, "--actor-lr", lr, "--max-samples", "2560"]
         for algo in ("ppo", "grpo", "dapo", "vapo") for lr in TIER5_LRS}


def drawn_prompts(seed: int, cfg: dict) -> set[str]:
    """The expressions a run with this seed and config drew (its RL steps and its value pretraining)."""
    rows = task.make_dataset(20000, stream(seed, "builtin_rows"), task.LONG.min_steps, task.LONG.max_steps,
                             split="train")
    n, rl, pretrain = cfg["prompts_per_step"], stream(seed, "rl_prompts"), stream(seed, "pretrain_prompts")
    drawn = {p["expr"] for s in range(cfg["steps"]) for p in data.prompt_batch(rows, s, n, rl)}
    drawn |= {p["expr"] for s in range(cfg["value_pretrain_steps"]) for p in data.prompt_batch(rows, s, n, pretrain)}
    return drawn


def validation_rows(exclude: set[str]) -> list[dict]:
    """VALIDATION_PROBLEMS train-split problems (all step counts equally) whose expressions are not in exclude."""
    pool = task.make_dataset(4 * VALIDATION_PROBLEMS, VALIDATION_SEED, task.LONG.min_steps, task.LONG.max_steps,
                             split="train")
    rows = [p for p in pool if p["expr"] not in exclude][:VALIDATION_PROBLEMS]
    assert len(rows) == VALIDATION_PROBLEMS, "validation pool too small"
    return rows


def judge(folder: str, rows: list[dict]) -> dict:
    """Greedy and sampled accuracy and step-error rates of the policy in folder on rows."""
    model, tokenizer = load_policy(folder, dtype=torch.float32)
    torch.manual_seed(0)
    out = {}
    for name, temperature, k in (("greedy", 0.0, 1), ("sampled", 1.0, VALIDATION_SAMPLES)):
        acc = task.evaluate_accuracy(model, tokenizer, rows, temperature, samples=k,
                                     max_new_tokens=task.LONG.max_response_tokens, batch_size=128)
        out[name] = {"accuracy": acc["accuracy"], "lookup_rate": acc["steps"]["lookup_rate"],
                     "habit_rate": acc["steps"]["habit_rate"], "other_error_rate": acc["steps"]["other_error_rate"],
                     "shortcut_rate": acc["shortcut_rate"], "mean_tokens": acc["mean_tokens"],
                     "first_errors": acc["first_errors"]}
    return out


def run_figures(run_dir: str) -> dict:
    """Means over the RL steps of the clipped shares at each bound and the approximate KL (metrics.jsonl)."""
    steps = common.rl_steps(common.read_records(run_dir))
    return {k: common.mean_of(steps, k) for k in ("clip_frac_low", "clip_frac_high", "approx_kl",
                                                  "explained_variance")}


def judged(out: str, name: str, seed: int, args: list[str]) -> dict | None:
    """Train (unless finished) and judge one (point, seed); the judgement is cached in its folder."""
    run_dir = os.path.join(out, f"{name}-s{seed}")
    path = os.path.join(run_dir, "validation.json")
    if os.path.exists(path):
        return common.read_json(path)
    common.run_vapo(f"{name} seed {seed}", [*TRAIN_ARGS, "--seed", str(seed), *args, "--output-dir", run_dir],
                    run_dir)
    if not common.finished(run_dir):
        return None
    cfg = common.read_json(os.path.join(run_dir, "config.json"))
    result = {"point": name, "seed": seed, "args": args,
              "validation": judge(os.path.join(run_dir, "checkpoint", "policy"), validation_rows(drawn_prompts(seed, cfg))),
              "run": run_figures(run_dir)}
    common.write_json(path, result)
    return result


def base_judgement(out: str) -> dict:
    """The base model on the validation split (less seed 0's drawn prompts, as its runs'), cached."""
    path = os.path.join(out, "base.json")
    if not os.path.exists(path):
        cfg = {"prompts_per_step": 8, "steps": 40, "value_pretrain_steps": 20}
        common.write_json(path, judge(common.folder_of("builtin-long"), validation_rows(drawn_prompts(0, cfg))))
    return common.read_json(path)


def pick(results: list[dict], base: dict) -> str:
    """The tiers' rule: best mean validation greedy among points with misread <= base + 2 points, else best."""
    points = {}
    for r in results:
        points.setdefault(r["point"], []).append(r)
    mean = lambda rs, key, field: statistics.fmean(r["validation"][key][field] for r in rs)  # noqa: E731
    ok = [p for p, rs in points.items() if mean(rs, "greedy", "lookup_rate") <= base["greedy"]["lookup_rate"] + 0.02]
    return max(ok or points, key=lambda p: mean(points[p], "greedy", "accuracy"))


def pick_lr(results: list[dict]) -> dict[str, str]:
    """Tier 5's rule: per algorithm, the point with the best mean of validation greedy and avg@2 (seed mean)."""
    score = {}
    for r in results:
        if r["point"] in TIER5:
            v = r["validation"]
            score.setdefault(r["point"], []).append((v["greedy"]["accuracy"] + v["sampled"]["accuracy"]) / 2)
    best = {}
    for point, vals in sorted(score.items()):
        algo = point.split("-lr")[0]
        if algo not in best or statistics.fmean(vals) > statistics.fmean(score[best[algo]]):
            best[algo] = point
    return best


def table(results: list[dict], base: dict) -> str:
    """Markdown: one row per point, mean +- std over seeds of each figure, the base model first."""
    def cell(vals, pct=True, digits=1):  # mean +- std over seeds; one seed: its figure alone
        vals = [v for v in vals if v is not None]
        if not vals:
            return "-"
        m, s = (x * (100 if pct else 1) for x in common.mean_sd(vals))
        s = s if len(vals) > 1 else None
        text = f"{m:.{digits}f}" if pct else f"{m:.2g}"
        return text if s is None else text + (f" +- {s:.{digits}f}" if pct else f" +- {s:.1g}")
    head = ("| point | seeds | greedy % | avg@2 % | misread % (greedy) | misread % (sampled) | habit % (sampled) "
            "| first error a misread, % of responses (greedy) | first error the habit, % (sampled) "
            "| clip low % | clip high % | approx KL |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    def first(judgement, decoding, kind):  # task.first_error_kind's share (judgements from before it: None)
        figures = judgement.get("validation", judgement)[decoding]
        return figures["first_errors"][kind] if "first_errors" in figures else None
    b = base
    lines = [f"| base model | - | {100 * b['greedy']['accuracy']:.1f} | {100 * b['sampled']['accuracy']:.1f} | "
             f"{100 * b['greedy']['lookup_rate']:.1f} | {100 * b['sampled']['lookup_rate']:.1f} | "
             f"{100 * b['sampled']['habit_rate']:.1f} | {cell([first(b, 'greedy', 'misread')])} | "
             f"{cell([first(b, 'sampled', 'habit')])} | - | - | - |"]
    points = {}
    for r in results:
        points.setdefault(r["point"], []).append(r)
    order = list(TIER1) + list(TIER5)  # tier 1 in the grid's order, then each centre's tier-2 points, the centre's order
    for p, rs in sorted(points.items(), key=lambda item: (order.index(item[0].split("+")[0])
                                                         if item[0].split("+")[0] in order else len(order),
                                                         "+" in item[0], item[0])):
        v = lambda key, field: [r["validation"][key][field] for r in rs]  # noqa: E731
        f = lambda key: [r["run"][key] for r in rs]  # noqa: E731
        lines.append(f"| {p} | {len(rs)} | {cell(v('greedy', 'accuracy'))} | {cell(v('sampled', 'accuracy'))} | "
                     f"{cell(v('greedy', 'lookup_rate'))} | {cell(v('sampled', 'lookup_rate'))} | "
                     f"{cell(v('sampled', 'habit_rate'))} | {cell([first(r, 'greedy', 'misread') for r in rs])} | "
                     f"{cell([first(r, 'sampled', 'habit') for r in rs])} | {cell(f('clip_frac_low'), digits=3)} | "
                     f"{cell(f('clip_frac_high'), digits=3)} | {cell(f('approx_kl'), pct=False)} |")
    return head + "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/long-study")
    parser.add_argument("--tier", type=int, choices=(1, 2, 3, 4, 5), default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--points", nargs="+", help="only these points of the tier (default all), e.g. to run the "
                        "leading points' further seeds first")
    parser.add_argument("--centre", help="tier 2 around this tier-1 point instead of the rule's pick: beyond the "
                        "fixed grid, so its runs are exploratory and reported as such")
    parser.add_argument("--report", action="store_true", help="only the table of the finished runs")
    parser.add_argument("--reuse", nargs=2, action="append", default=[], metavar=("POINT", "RUN_DIR"),
                        help="tier 5: take a finished run of the same options (bench/ablation.py's, at the preset's "
                        "lr) as POINT's run of its seed, copied into --out (training does not depend on held-out "
                        "evaluations); e.g. --reuse vapo-lr1.5e-5 runs/compare-long/vapo-s0")
    args = parser.parse_args()
    base = base_judgement(args.out)
    done = lambda: [common.read_json(os.path.join(args.out, d, "validation.json"))  # noqa: E731
                    for d in sorted(os.listdir(args.out)) if os.path.exists(os.path.join(args.out, d, "validation.json"))]
    if not args.report:
        if args.tier == 1:
            grid = TIER1
        elif args.tier in (3, 4, 5):
            grid = {3: TIER3, 4: TIER4, 5: TIER5}[args.tier]
        else:
            centre = args.centre or pick([r for r in done() if r["point"] in TIER1], base)
            if centre not in TIER1:
                parser.error(f"--centre: not a tier-1 point: {centre} (they are {', '.join(TIER1)})")
            grid = {f"{centre}+{lever}": [*TIER1[centre], *extra] for lever, extra in TIER2_LEVERS.items()}
        unknown = set(args.points or ()) - set(grid)
        if unknown:
            parser.error(f"--points: not in tier {args.tier}: {', '.join(sorted(unknown))} (it has {', '.join(grid)})")
        for point, run_dir in args.reuse:
            if point not in TIER5 or not common.finished(run_dir):
                parser.error(f"--reuse: {point} is not a tier-5 point, or {run_dir} holds no finished run")
            cfg = common.read_json(os.path.join(run_dir, "config.json"))
            if cfg["algo"] != point.split("-lr")[0] or cfg["actor_lr"] != float(point.split("-lr")[1]):
                parser.error(f"--reuse: {run_dir} ran --algo {cfg['algo']} at lr {cfg['actor_lr']}, not {point}")
            target = os.path.join(args.out, f"{point}-s{cfg['seed']}")
            if not os.path.exists(target):
                shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns("checkpoint.prev", "views"))
        jobs = [(name, seed, a) for seed in args.seeds for name, a in grid.items() if name in (args.points or grid)]
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda j: judged(args.out, *j), jobs))
    report = (f"Validation split: {VALIDATION_PROBLEMS} train-split problems (seed {VALIDATION_SEED}), "
              f"greedy and avg@{VALIDATION_SAMPLES}; {common.machine()}\n\n" + table(done(), base))
    picks = pick_lr(done())
    if picks:
        report += "\nTier 5's picks (best mean of validation greedy and avg@2): " + ", ".join(
            f"{algo} {point.split('-lr')[1]}" for algo, point in picks.items()) + "\n"
    open(os.path.join(args.out, "study.md"), "w").write(report)
    print(report)


if __name__ == "__main__":
    main()
