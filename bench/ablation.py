"""Benchmark: the paper's ablation table (VAPO, arXiv 2504.05118, section 4) re-run in miniature on the demo task.

    python bench/ablation.py                        # 11 rows x 3 seeds (a long sweep: see below)
    python bench/ablation.py --quick                # every row for 2 steps, 1 seed: proves each row still runs
    python bench/ablation.py --rows VAPO GRPO --seeds 0 1 2

Rows: the paper's baselines (`--algo ppo|grpo|dapo`), VAPO, and VAPO without each of its seven techniques (one
switch each). Every run is `python vapo.py --preset demo --seed S <the row's options> --steps STEPS
--max-samples STEPS x 128 ...` in its own process with one torch thread, --jobs at a time, so that every row has
the same budget of generated samples (DAPO's dynamic sampling generates more per step, so it takes fewer steps).
The rows that pretrain the critic share one pretrained critic per seed: VAPO's run pretrains it and the others
start from its critic_pretrained/ (`--value-model ... --no-value-pretraining`); "w/o Value-Pretraining" starts
from a critic that knows nothing.

Writes ablation.md (the table, and a second one of what the techniques act on: the critic's explained
variance, lambda_policy, clip fractions, KL, entropy), ablation.json and ablation.png (held-out accuracy against
generated samples, mean and range over seeds per row) into --out. A finished run is read back, not run again,
so an interrupted sweep resumes, and a finished sweep only rewrites its reports. `--base weak` runs the rows
from a base model that is still imprecise at the arithmetic (see bench/demo_seeds.py), where RL has more to
learn than one habit. The default sweep (11 rows x 3 seeds, 24 steps) took about 75 minutes on a 2-core
machine that was also running other jobs; docs/ablation.md has its table and what it shows.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_seeds  # noqa: E402  (same folder: runs, reads and summarises vapo.py runs)
from config import PRESETS  # noqa: E402  (demo_seeds put the repository on the path)

# (row, the paper's AIME 2024 avg@32 for it, vapo.py options)
ROWS = [
    ("PPO", 5, ["--algo", "ppo"]),
    ("GRPO", 47, ["--algo", "grpo"]),
    ("DAPO", 50, ["--algo", "dapo"]),
    ("VAPO", 60.4, []),
    ("w/o Value-Pretraining", 11, ["--no-value-pretraining"]),
    ("w/o Decoupled-GAE", 33, ["--no-decoupled-gae"]),
    ("w/o Length-adaptive GAE", 45, ["--no-length-adaptive"]),
    ("w/o Clip-Higher", 46, ["--no-clip-higher"]),
    ("w/o Token-level Loss", 53, ["--no-token-level-loss"]),
    ("w/o Positive Example LM Loss", 54, ["--no-positive-nll"]),
    ("w/o Group-Sampling", 55, ["--no-group-sampling"]),
]
SHARES_CRITIC = {"w/o Decoupled-GAE", "w/o Length-adaptive GAE", "w/o Clip-Higher", "w/o Token-level Loss",
                 "w/o Positive Example LM Loss", "w/o Group-Sampling"}
COLLAPSE_LENGTH = 0.8  # a final greedy length below this share of the base's counts as a length collapse


def slug(row: str) -> str:
    """A row's name as a folder name: "w/o Clip-Higher" -> "w-o-clip-higher"."""
    return "".join(c if c.isalnum() else "-" for c in row.lower()).strip("-")


def row_args(row: str, options: list[str], seed: int, out: str, common: list[str]) -> list[str]:
    """The vapo.py options of one run: the demo preset, the seed, its folder, the sweep's common options, the
    row's own switches, and for the rows that share it VAPO's pretrained critic of the same seed."""
    args = ["--preset", "demo", "--seed", str(seed), "--output-dir", os.path.join(out, f"{slug(row)}-s{seed}"),
            *common, *options]
    if row in SHARES_CRITIC:
        args += ["--value-model", os.path.join(out, f"vapo-s{seed}", "critic_pretrained"), "--no-value-pretraining"]
    return args


def run_row(job) -> float | None:
    """Run one (row, seed) unless it has finished (then None, else its wall seconds); a row that shares VAPO's
    critic waits for it first."""
    row, options, seed, out, common = job
    args = row_args(row, options, seed, out, common)
    run_dir = args[args.index("--output-dir") + 1]
    if row in SHARES_CRITIC:  # wait for VAPO's run of this seed to have pretrained the critic (or to have ended)
        vapo_dir = os.path.join(out, f"vapo-s{seed}")
        while not (os.path.exists(os.path.join(vapo_dir, "critic_pretrained", "config.json"))
                   or os.path.exists(os.path.join(vapo_dir, "wall_seconds"))):
            time.sleep(5)
    return demo_seeds.run_vapo(f"{row} seed {seed}", args, run_dir)


def curve(run_dir: str) -> list[tuple[int, float, float]]:
    """(generated samples, held-out avg@k, held-out greedy) at each evaluation of a run."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    points, generated = [], 0
    for r in records:
        generated += r.get("samples_generated", 0)
        if "eval/acc_greedy" in r:
            k = next(key for key in r if key.startswith("eval/acc_avg@"))
            points.append((generated, r[k], r["eval/acc_greedy"]))
    return points


def summarise(row: str, paper: float, run_dirs: list[str]) -> dict:
    runs = [(d, demo_seeds.summarise_run(d)) for d in run_dirs]
    done = [(d, s) for d, s in runs if s is not None]
    out = {"row": row, "paper_aime24": paper, "seeds": len(done)}
    if not done:
        return out

    def spread(key):
        vals = [s[key] for _, s in done]
        return statistics.mean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)

    def auc(d):  # mean greedy accuracy over the sample budget (trapezoids), 0..1
        pts = curve(d)
        area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, _, y0), (x1, _, y1) in zip(pts, pts[1:]))
        return area / max(pts[-1][0] - pts[0][0], 1)

    def rl_mean(key, first=None):  # a run's mean of a logged figure over its RL steps (or its first ones)
        vals = []
        for d, _ in done:
            with open(os.path.join(d, "metrics.jsonl")) as fh:
                steps = [json.loads(line) for line in fh if '"train_acc"' in line and '"step"' in line]
            xs = [r[key] for r in steps[:first] if isinstance(r.get(key), (int, float)) and r[key] == r[key]]
            if xs:
                vals.append(statistics.mean(xs))
        return statistics.mean(vals) if vals else None

    out["diagnostics"] = {"ev_first5": rl_mean("explained_variance", 5), "ev": rl_mean("explained_variance"),
                          "lam_policy": rl_mean("lam_policy"), "clip_frac": rl_mean("clip_frac"),
                          "clip_frac_high": rl_mean("clip_frac_high"), "approx_kl": rl_mean("approx_kl"),
                          "entropy": rl_mean("entropy"), "response_len": rl_mean("response_len"),
                          "train_acc_first5": rl_mean("train_acc", 5), "train_acc": rl_mean("train_acc")}
    out.update({"avg_final": spread("avg_final"), "greedy_final": spread("greedy_final"),
                "greedy_gain": spread("greedy_gain"), "len_ratio": spread("len_ratio"),
                "greedy_auc": statistics.mean(auc(d) for d, _ in done),
                "greedy_auc_std": statistics.stdev([auc(d) for d, _ in done]) if len(done) > 1 else 0.0,
                "samples": statistics.mean(curve(d)[-1][0] for d, _ in done),
                "collapsed": sum(s["len_ratio"] < COLLAPSE_LENGTH or s["avg_gain"] < 0 or s["greedy_gain"] < 0
                                 for _, s in done)})
    return out


def table(rows: list[dict]) -> str:
    """The markdown table of the summarised rows, the paper's figure beside each."""
    lines = ["| row | paper (AIME24 avg@32) | held-out avg@k, final | greedy, final | greedy, mean over the budget | "
             "length / base | samples | collapsed |", "|---|---|---|---|---|---|---|---|"]
    pm = lambda m: f"{100 * m[0]:.1f} +- {100 * m[1]:.1f}"  # noqa: E731
    for r in rows:
        if "avg_final" not in r:
            lines.append(f"| {r['row']} | {r['paper_aime24']} | not run | | | | | |")
            continue
        lines.append(f"| {r['row']} | {r['paper_aime24']} | {pm(r['avg_final'])} | {pm(r['greedy_final'])} | "
                     f"{100 * r['greedy_auc']:.1f} +- {100 * r['greedy_auc_std']:.1f} | {r['len_ratio'][0]:.2f} | "
                     f"{r['samples']:.0f} | "
                     f"{r['collapsed']} of {r['seeds']} |")
    return "\n".join(lines)


def diagnostics_table(rows: list[dict]) -> str:
    """What the techniques act on, per row (means over seeds of each run's mean over its RL steps): the critic's
    explained variance (first 5 steps and all), lambda_policy, the clipped share of tokens (all, and at the upper
    bound that clip-higher moves), approx KL, entropy, response length, training accuracy (first 5 steps, all)."""
    keys = ["ev_first5", "ev", "lam_policy", "clip_frac", "clip_frac_high", "approx_kl", "entropy", "response_len",
            "train_acc_first5", "train_acc"]
    lines = ["| row | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for r in rows:
        d = r.get("diagnostics")
        if d is None:
            continue
        cell = lambda v: "-" if v is None else (f"{v:.2e}" if abs(v) < 1e-2 and v != 0 else f"{v:.3f}")  # noqa: E731
        lines.append(f"| {r['row']} | " + " | ".join(cell(d[k]) for k in keys) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], out: str, seeds: list[int], folder: str) -> None:
    """ablation.png: held-out avg@k and greedy against generated samples, mean line and min-max band per row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    for i, r in enumerate(rows):
        dirs = [os.path.join(folder, f"{slug(r['row'])}-s{s}") for s in seeds]
        curves = [curve(d) for d in dirs if demo_seeds.finished(d)]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        xs = [statistics.mean(c[j][0] for c in curves) for j in range(n)]
        for ax, col in zip(axes, (1, 2)):
            ys = [[c[j][col] for c in curves] for j in range(n)]
            style = "-" if i < 4 else "--"
            ax.plot(xs, [statistics.mean(y) for y in ys], style, color=f"C{i % 10}", label=r["row"])
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=f"C{i % 10}", alpha=0.12)
    for ax, title in zip(axes, ("held-out avg@k", "held-out greedy")):
        ax.set(title=title, xlabel="generated samples", ylim=(0, 1.02))
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", default=[r for r, _, _ in ROWS], help="rows to run (default: all)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=24, help="RL steps of a row without dynamic sampling (the budget "
                    "is STEPS x the demo's 128 samples per step)")
    ap.add_argument("--base", default="shipped", help="base model: shipped, seedN or weak (built into the cache "
                    "first, minutes; see bench/demo_seeds.py) or a folder")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    ap.add_argument("--out", default=os.path.join(demo_seeds.ROOT, "runs", "ablation"))
    ap.add_argument("--quick", action="store_true", help="2 steps of every row, seed 0, tiny evaluations")
    args = ap.parse_args()
    unknown = set(args.rows) - {r for r, _, _ in ROWS}
    if unknown:
        raise SystemExit(f"--rows: unknown {sorted(unknown)}; the rows are {[r for r, _, _ in ROWS]}")
    if args.quick:
        args.seeds, args.steps = [0], 2
        common = ["--eval-every", "0", "--eval-prompts", "4", "--eval-samples", "1", "--value-pretrain-steps", "1",
                  "--prompts-per-step", "2", "--samples-per-prompt", "4", "--mini-batch-size", "8",
                  "--micro-batch-size", "8",
                  "--max-new-tokens", "32", "--dynamic-sampling-rounds", "1"]
        budget = args.steps * 2 * 4  # the quick runs' prompts x G
    else:
        common = ["--eval-every", str(max(args.steps // 4, 1)), "--eval-prompts", "100", "--eval-samples", "2"]
        budget = args.steps * PRESETS["demo"]["prompts_per_step"] * PRESETS["demo"]["samples_per_prompt"]
    common += ["--steps", str(args.steps * 3), "--max-samples", str(budget), "--save-every", "0"]
    base = demo_seeds.resolve_base(args.base)
    demo_seeds.build_missing({args.base: base}, 1)
    if args.base != "shipped":
        common += ["--model", base]
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    print(f"machine: {demo_seeds.machine()}\ndate: {started}\nbase model: {args.base} ({base})\n"
          f"budget: {budget} generated samples per run", flush=True)
    chosen = [(r, p, o) for r, p, o in ROWS if r in args.rows]
    if any(r in SHARES_CRITIC for r, _, _ in chosen) and "VAPO" not in args.rows:
        chosen = [ROWS[3]] + chosen  # the rows that share a critic need VAPO's runs
    jobs = [(r, o, s, args.out, common) for s in args.seeds for r, _, o in chosen]
    jobs.sort(key=lambda j: j[0] != "VAPO")  # VAPO first: the shared critics come from its runs
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        walls = list(pool.map(run_row, jobs))
    ran = [w for w in walls if w is not None]
    rows = [summarise(r, p, [os.path.join(args.out, f"{slug(r)}-s{s}") for s in args.seeds]) for r, p, _ in chosen]
    md = table(rows)
    os.makedirs(args.out, exist_ok=True)
    plot(rows, os.path.join(args.out, "ablation.png"), args.seeds, args.out)
    report = (f"machine: {demo_seeds.machine()}\ndate: {started}; {time.perf_counter() - t0:.0f} s; {len(ran)} runs "
              f"run now ({sum(ran):.0f} s of runs), {len(walls) - len(ran)} read back from earlier\n"
              f"base model: {args.base}\n"
              f"seeds {args.seeds}; {budget} generated samples per run; mean +- std over seeds\n\n{md}\n\n"
              f"diagnostics (means over seeds of each run's mean over its RL steps):\n\n{diagnostics_table(rows)}\n")
    print("\n" + report)
    with open(os.path.join(args.out, "ablation.md"), "w") as fh:
        fh.write(report)
    with open(os.path.join(args.out, "ablation.json"), "w") as fh:
        json.dump({"machine": demo_seeds.machine(), "date": started, "base": args.base, "seeds": args.seeds,
                   "budget": budget,
                   "rows": rows}, fh, indent=1)
    missing = [r["row"] for r in rows if r.get("seeds", 0) < len(args.seeds)]
    if missing:
        raise SystemExit(f"rows that did not finish every seed: {missing} (see their stdout.log)")


if __name__ == "__main__":
    main()
