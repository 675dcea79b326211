"""Benchmark: does a preset learn on every seed? The distribution over seeds, not one run.

    python bench/seeds.py demo                                 # 5 seeds x 2 base models (shipped, seed1)
    python bench/seeds.py demo --seeds 0 1 --bases shipped path/to/folder
    python bench/seeds.py long --seeds 0 1 2 --jobs 3 --out runs/long-critic
    python bench/seeds.py long --out runs/ppo -- --algo ppo    # options after -- go to vapo.py

Each run is `python vapo.py --preset demo|long --seed S` (demo: `--model BASE` too), in its own process with one
torch thread, --jobs at a time; a finished run folder is read back, an interrupted one resumed. Writes results.json
and results.md into --out. demo: the held-out gains, length ratio, the critic's EV, clip fraction, KL, entropy and
wall time per run, and how many gained GAIN_TARGET on both avg@k and greedy. long: held-out greedy and avg@k at
the start and the end with their standard errors, the clipped shares and KL, and the final policy and the base
judged on POLICY_PROBLEMS held-out problems (common.judge_policy); the verdict per seed: above the base on both,
greedy misreads within MISREAD_MARGIN of the base's. docs/results.md has both tables.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import common  # (puts the repository on the path)
from machinery import plots

GAIN_TARGET = 0.25  # demo: held-out accuracy points (as a fraction) each of avg@k and greedy should gain
MISREAD_MARGIN = 0.02  # long: final greedy misreads per step at most the base model's + 2 points


# --- demo ---------------------------------------------------------------------------------------------------
def demo_table(rows: list[dict]) -> str:
    """The markdown table of the demo's runs (common.summarise_run of each)."""
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


def demo_verdict(rows: list[dict]) -> dict:
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
    """One PNG of every run: training accuracy per RL step (smoothed), held-out avg@k and greedy at each
    evaluation; one colour per base model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colours = {}
    for r in rows:
        if r["summary"] is None:
            continue
        colour = colours.setdefault(r["base"], f"C{len(colours)}")
        label = r["base"] if sum(x["base"] == r["base"] for x in rows[:rows.index(r) + 1]) == 1 else None
        _, steps, evals = plots.read_metrics(os.path.join(r["run_dir"], "metrics.jsonl"))
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
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def demo(args, machine: str, started: str) -> None:
    bases = {name: common.resolve_base(name) for name in args.bases}
    common.build_missing(bases, args.jobs)
    jobs = []
    for name, path in bases.items():
        for seed in args.seeds:
            label = name if name == "shipped" or name.startswith("seed") else os.path.basename(path.rstrip("/"))
            jobs.append((label, path, seed, os.path.join(args.out, f"{label}-s{seed}")))
    print(f"{len(jobs)} runs, {args.jobs} at a time, one thread each, into {args.out}", flush=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda j: common.run_vapo(f"{j[0]} seed {j[2]}", [
            "--preset", "demo", "--model", j[1], "--seed", str(j[2]), "--output-dir", j[3], *args.extra], j[3]), jobs))
    rows = [{"base": j[0], "seed": j[2], "run_dir": j[3], "summary": common.summarise_run(j[3])} for j in jobs]
    v = demo_verdict(rows)
    lines = [f"machine: {machine}", f"date: {started}; {time.perf_counter() - t0:.0f} s for this invocation",
             f"vapo.py options: --preset demo {' '.join(args.extra)}".rstrip(), "", demo_table(rows), ""]
    if v["finished"]:
        lines += [f"{v['gained_both_25']} of {v['finished']} runs gained >= {100 * GAIN_TARGET:.0f} points held-out "
                  f"on both avg@k and greedy; {v['ended_below_base']} ended below their base on either.",
                  "gain min / median / max (points): avg@k " + " / ".join(
                      f"{100 * x:+.1f}" for x in v["avg_gain_min_median_max"]) + ", greedy " + " / ".join(
                      f"{100 * x:+.1f}" for x in v["greedy_gain_min_median_max"]),
                  "final greedy length / base's: " + " / ".join(f"{x:.2f}" for x in v["len_ratio_min_median_max"]),
                  "seconds per run (one thread, two runs at a time): " + " / ".join(
                      f"{x:.0f}" for x in v["run_seconds_min_median_max"]),
                  "curves: " + plot_runs(rows, os.path.join(args.out, "demo-seeds.png"))]
    report = "\n".join(lines)
    print("\n" + report)
    common.write_json(os.path.join(args.out, "results.json"), {"machine": machine, "date": started,
                                                                "extra": args.extra, "verdict": v, "runs": rows})
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(report + "\n")


# --- long ---------------------------------------------------------------------------------------------------
def long_figures(run_dir: str) -> dict:
    """First and last held-out evaluation (accuracy and standard error of greedy and avg@k), means over the RL
    steps of the clipped shares and approx KL, and the wall time, from run_dir's metrics.jsonl."""
    records = common.read_records(run_dir)
    evals, steps = common.evaluations(records), common.rl_steps(records)
    k = common.sampled_measure(evals[0])
    out = {"k": k, "seconds": evals[-1]["time/elapsed"]}
    for name in (k, "greedy"):
        out[name] = {when: {"accuracy": e[f"eval/acc_{name}"], "se": e.get(f"eval/acc_{name}_se")}
                     for when, e in (("base", evals[0]), ("final", evals[-1]))}
    return out | {key: common.mean_of(steps, key) for key in ("clip_frac_low", "clip_frac_high", "approx_kl")}


def judged_policy(run_dir: str, folder: str | None = None, name: str = "policy.json") -> dict:
    """common.judge_policy of folder (default: the run's final policy), cached in run_dir/name."""
    path = os.path.join(run_dir, name)
    if not os.path.exists(path):
        common.write_json(path, common.judge_policy(folder or os.path.join(run_dir, "checkpoint", "policy")))
    return common.read_json(path)


def long_verdict(run: dict, policy: dict, base_policy: dict) -> dict:
    """Above the base on greedy and avg@k (final minus step 0), greedy misreads within MISREAD_MARGIN."""
    gains = {name: run[name]["final"]["accuracy"] - run[name]["base"]["accuracy"] for name in (run["k"], "greedy")}
    misread = policy["greedy"]["lookup_rate"] - base_policy["greedy"]["lookup_rate"]
    return {"gains": gains, "misread_change": misread,
            "above_base": all(g > 0 for g in gains.values()), "misreads_kept": misread <= MISREAD_MARGIN}


def long_table(results: list[dict], base_policy: dict) -> str:
    """Markdown, a row per seed and the base model's row first."""
    k = results[0]["run"]["k"]
    head = (f"| seed | greedy % base -> final (+- SE) | {k} % base -> final (+- SE) | misread % of greedy steps | "
            "first error a misread, % of greedy responses | habit % of sampled borrow steps | clip low % | "
            "clip high % | approx KL | minutes | above base on both | misreads within 2 points |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    b = base_policy
    lines = [f"| base model | | | {100 * b['greedy']['lookup_rate']:.1f} | {100 * b['greedy']['first_misread']:.1f} | "
             f"{100 * b['sampled']['habit_rate']:.1f} | | | | | | |"]
    for r in results:
        run, p, v = r["run"], r["policy"], r["verdict"]
        cell = lambda name: (f"{100 * run[name]['base']['accuracy']:.1f} -> {100 * run[name]['final']['accuracy']:.1f} "  # noqa: E731
                             f"(+- {100 * (run[name]['final']['se'] or 0):.1f})")
        lines.append(f"| {r['seed']} | {cell('greedy')} | {cell(k)} | {100 * p['greedy']['lookup_rate']:.1f} | "
                     f"{100 * p['greedy']['first_misread']:.1f} | {100 * p['sampled']['habit_rate']:.1f} | "
                     f"{100 * run['clip_frac_low']:.3f} | {100 * run['clip_frac_high']:.3f} | {run['approx_kl']:.1e} | "
                     f"{run['seconds'] / 60:.1f} | {'yes' if v['above_base'] else 'no'} | "
                     f"{'yes' if v['misreads_kept'] else 'no'} |")
    return head + "\n".join(lines) + "\n"


def long(args, machine: str, started: str) -> None:
    dirs = {s: os.path.join(args.out, f"seed{s}") for s in args.seeds}
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda s: common.run_vapo(f"seed {s}", ["--preset", "long", "--seed", str(s),
                                                              "--output-dir", dirs[s], *args.extra], dirs[s]),
                      args.seeds))
    base_policy = judged_policy(args.out, common.folder_of("builtin-long"), "base_policy.json")
    results = []
    for s, d in dirs.items():
        if not common.finished(d):
            print(f"seed {s}: not finished, left out ({d}/stdout.log)")
            continue
        run, policy = long_figures(d), judged_policy(d)
        results.append({"seed": s, "run": run, "policy": policy, "verdict": long_verdict(run, policy, base_policy)})
    report = (f"`python vapo.py --preset long --seed S {' '.join(args.extra)}`; {machine}, {started}. Misreads and "
              f"first errors: the final policies on {common.POLICY_PROBLEMS} held-out problems "
              f"(common.judge_policy).\n\n" + long_table(results, base_policy))
    common.write_json(os.path.join(args.out, "results.json"), {"base_policy": base_policy, "runs": results})
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(report)
    print(report)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset", choices=("demo", "long"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="RL seeds (default 0-4)")
    ap.add_argument("--bases", nargs="+", default=["shipped", "seed1"], help="demo: base models: shipped, seedN "
                    "(warm-start seed N), weak (700 warm-start steps), built once into the cache, or folders")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (default 2)")
    ap.add_argument("--out", default=None, help="folder of the runs (default runs/demo-seeds, runs/long-seeds)")
    ap.add_argument("extra", nargs="*", help="options passed on to vapo.py (after --)")
    args = ap.parse_args(argv)
    args.out = args.out or os.path.join(common.ROOT, "runs", f"{args.preset}-seeds")
    started, machine = common.now(), common.machine()
    print(f"machine: {machine}\ndate: {started}", flush=True)
    (demo if args.preset == "demo" else long)(args, machine, started)


if __name__ == "__main__":
    main()
