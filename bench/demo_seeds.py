"""Benchmark: does the demo learn on every seed and every base model? The distribution, not one run.

    python bench/demo_seeds.py                                  # 5 seeds x 2 base models = 10 runs
    python bench/demo_seeds.py --seeds 0 1 --bases shipped      # fewer
    python bench/demo_seeds.py --bases shipped path/to/folder   # any base model folder
    python bench/demo_seeds.py --out runs/demo-seeds -- --actor-lr 2e-4   # options after -- go to vapo.py

Each run is `python vapo.py --preset demo --model BASE --seed S` (the demo exactly as `python vapo.py` runs it,
but for the base model and the seed), in its own process with one torch thread, `--jobs` at a time (on a
2-core machine two one-thread processes finish two runs in about the time one two-thread process takes one).

Base models (`--bases`):
- `shipped`: the repository's base model (base-model/, what `python vapo.py` starts from);
- `seedN`: the same recipe with warm-start seed N (`python builds.py build --seed N`), a stand-in for the base
  model another CPU would build (floating-point kernels differ between CPUs, so a rebuild elsewhere is a different
  model); built once into the cache ($VAPO_CACHE or .cache/) if missing, several builds in parallel;
- `weak`: the same recipe stopped after 700 warm-start steps instead of 2,000 (`python builds.py build --steps
  700`), a base still imprecise at the arithmetic itself, so RL has more to learn than one habit; built once
  into the cache;
- any folder holding a base model (e.g. one built on another machine).

Prints, per run and in summary, the held-out gains (avg@k and greedy, last evaluation minus the base model's),
the final response length against the base's, the critic's explained variance, clip fraction, approx KL and
entropy over the RL steps, and the wall time; with the machine and date. Writes results.json and results.md in
--out. A run whose folder already holds a finished metrics.jsonl is read, not run again (so an interrupted
benchmark resumes); --fresh runs everything again.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import common  # (puts the repository on the path)
import plots

GAIN_TARGET = 0.25  # held-out accuracy points (as a fraction) each of avg@k and greedy should gain


def run_one(job: tuple[str, str, int, str, list[str]]) -> float | None:
    """Run one demo (unless already finished); returns its wall time in seconds, None if it was read back."""
    base_name, base_path, seed, run_dir, extra = job
    cmd = ["--preset", "demo", "--model", base_path, "--seed", str(seed), "--output-dir", run_dir, *extra]
    return common.run_vapo(f"{base_name} seed {seed}", cmd, run_dir)


def table(rows: list[dict]) -> str:
    """The markdown table of the runs: gains, length ratio, the critic's EV, clip fraction, KL, entropy, time."""
    head = ("| base | seed | avg@k base -> final (gain) | greedy base -> final (gain) | length ratio | "
            "pretrain EV | RL EV | clip frac | approx KL | entropy | run s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        s = r["summary"]
        if s is None:
            lines.append(f"| {r['base']} | {r['seed']} | did not finish | | | | | | | | |")
            continue
        lines.append(
            f"| {r['base']} | {r['seed']} | {100 * s['avg_base']:.1f} -> {100 * s['avg_final']:.1f} "
            f"({100 * s['avg_gain']:+.1f}) | {100 * s['greedy_base']:.1f} -> {100 * s['greedy_final']:.1f} "
            f"({100 * s['greedy_gain']:+.1f}) | {s['len_ratio']:.2f} | {s['pretrain_ev_last3']:.2f} | "
            f"{s['ev']:.2f} | {s['clip_frac']:.4f} | {s['approx_kl']:.1e} | {s['entropy']:.3f} | "
            f"{s['run_seconds']:.0f} |")
    return "\n".join(lines)


def verdict(rows: list[dict]) -> dict:
    """How many runs gained GAIN_TARGET on both measures, how many ended below their base, and the spreads."""
    done = [r["summary"] for r in rows if r["summary"] is not None]
    learned = [s for s in done if s["avg_gain"] >= GAIN_TARGET and s["greedy_gain"] >= GAIN_TARGET]
    below = [s for s in done if s["avg_gain"] < 0 or s["greedy_gain"] < 0]
    q = lambda key: (min(s[key] for s in done), statistics.median(s[key] for s in done),  # noqa: E731
                     max(s[key] for s in done)) if done else None
    return {"runs": len(rows), "finished": len(done), "gained_both_25": len(learned), "ended_below_base": len(below),
            "avg_gain_min_median_max": q("avg_gain"), "greedy_gain_min_median_max": q("greedy_gain"),
            "len_ratio_min_median_max": q("len_ratio"), "run_seconds_min_median_max": q("run_seconds")}


def plot_runs(rows: list[dict], out: str) -> str:
    """One PNG of every run: training accuracy per RL step (smoothed), held-out avg@k and greedy accuracy at
    each evaluation; one colour per base model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colours = {}
    for r in rows:
        path = os.path.join(r["run_dir"], "metrics.jsonl")
        if r["summary"] is None:
            continue
        colour = colours.setdefault(r["base"], f"C{len(colours)}")
        label = r["base"] if sum(x["base"] == r["base"] for x in rows[:rows.index(r) + 1]) == 1 else None
        _, steps, evals = plots.read_metrics(path)
        xs, ys = plots._series(steps, "step", "train_acc")
        axes[0].plot(xs, plots._smooth(ys), color=colour, alpha=0.7, label=label)
        axes[1].plot(*plots._series(evals, "step", f"eval/acc_{r['summary']['k']}"), "o-", color=colour, alpha=0.7)
        axes[2].plot(*plots._series(evals, "step", "eval/acc_greedy"), "o-", color=colour, alpha=0.7)
    k = next((r["summary"]["k"] for r in rows if r["summary"]), "avg@k")
    for ax, title in zip(axes, ("training rollouts: accuracy (5-step mean)", f"held-out {k} (T 1.0, top-p 0.7)",
                                "held-out greedy")):
        ax.set(title=title, xlabel="RL step", ylim=(0, 1.02))
    axes[0].legend(title="base model", fontsize=8)
    fig.suptitle(f"python vapo.py (demo preset): {sum(r['summary'] is not None for r in rows)} runs")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="RL seeds (default 0-4)")
    ap.add_argument("--bases", nargs="+", default=["shipped", "seed1"],
                    help="base models: shipped, seedN (built once with warm-start seed N) or folders")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (default 2)")
    ap.add_argument("--out", default=os.path.join(common.ROOT, "runs", "demo-seeds"), help="folder of the runs")
    ap.add_argument("--fresh", action="store_true", help="run again even where a finished run is there")
    ap.add_argument("--plot", default=None, help="where to write the PNG of all runs (default: <out>/demo-seeds.png)")
    ap.add_argument("extra", nargs="*", help="options passed on to vapo.py (after --)")
    args = ap.parse_args()

    started, machine = common.now(), common.machine()
    print(f"machine: {machine}\ndate: {started}", flush=True)
    bases = {name: common.resolve_base(name) for name in args.bases}
    common.build_missing(bases, args.jobs)
    jobs = []
    for name, path in bases.items():
        for seed in args.seeds:
            label = name if name == "shipped" or name.startswith("seed") else os.path.basename(path.rstrip("/"))
            run_dir = os.path.join(args.out, f"{label}-s{seed}")
            if args.fresh and os.path.exists(run_dir):
                shutil.rmtree(run_dir)
            jobs.append((label, path, seed, run_dir, args.extra))
    print(f"{len(jobs)} runs, {args.jobs} at a time, one thread each, into {args.out}", flush=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(run_one, jobs))
    rows = [{"base": j[0], "seed": j[2], "run_dir": j[3], "summary": common.summarise_run(j[3])} for j in jobs]
    v = verdict(rows)
    md = table(rows)
    lines = [f"machine: {machine}", f"date: {started}; {time.perf_counter() - t0:.0f} s for this invocation",
             f"vapo.py options: --preset demo {' '.join(args.extra)}".rstrip(), "", md, ""]
    if v["finished"]:
        lines += [f"{v['gained_both_25']} of {v['finished']} runs gained >= {100 * GAIN_TARGET:.0f} points held-out "
                  f"on both avg@k and greedy; {v['ended_below_base']} ended below their base on either.",
                  "gain min / median / max (points): avg@k " + " / ".join(
                      f"{100 * x:+.1f}" for x in v["avg_gain_min_median_max"]) + ", greedy " + " / ".join(
                      f"{100 * x:+.1f}" for x in v["greedy_gain_min_median_max"]),
                  "final greedy length / base's: " + " / ".join(f"{x:.2f}" for x in v["len_ratio_min_median_max"]),
                  "seconds per run (one thread, two runs at a time): " + " / ".join(
                      f"{x:.0f}" for x in v["run_seconds_min_median_max"])]
    if v["finished"]:
        lines.append("curves: " + plot_runs(rows, args.plot or os.path.join(args.out, "demo-seeds.png")))
    report = "\n".join(lines)
    print("\n" + report)
    common.write_json(os.path.join(args.out, "results.json"), {"machine": machine, "date": started,
                                                                "extra": args.extra, "verdict": v, "runs": rows})
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(report + "\n")


if __name__ == "__main__":
    main()
