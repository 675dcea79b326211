"""Benchmark: does `--preset long` end above its base model on every seed? Held-out greedy, avg@k and misreads.

    python bench/long_seeds.py                               # seeds 0-4, two one-thread runs at a time
    python bench/long_seeds.py --seeds 0 1 --out runs/ppo -- --algo ppo   # options after -- go to vapo.py

Each run is `python vapo.py --preset long --seed S` (as a user runs it), in its own process with one torch thread,
`--jobs` at a time; a finished run folder is read back, not run again. From each run's metrics.jsonl: held-out
greedy accuracy and avg@k at step 0 (the base model) and at the end, each with its standard error over prompts,
and over the RL steps the shares of tokens clipped at each bound and the approximate KL. The final policy and the
base model are judged once more on POLICY_PROBLEMS held-out problems (bench/common.judge_policy): misread terms
per step written and the share of responses whose first error is a misread (task.first_error_kind), greedy and
sampled. The verdict per seed: above the base on greedy and on avg@k, and greedy misreads within 2 points of the
base's. Writes results.json and results.md into --out.
"""
from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor

import common  # (puts the repository on the path)

MISREAD_MARGIN = 0.02  # the bar: final greedy misreads per step at most the base model's + 2 points


def run_figures(run_dir: str) -> dict:
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


def verdict(run: dict, policy: dict, base_policy: dict) -> dict:
    """Above the base on greedy and avg@k (final minus step 0), greedy misreads within MISREAD_MARGIN."""
    gains = {name: run[name]["final"]["accuracy"] - run[name]["base"]["accuracy"] for name in (run["k"], "greedy")}
    misread = policy["greedy"]["lookup_rate"] - base_policy["greedy"]["lookup_rate"]
    return {"gains": gains, "misread_change": misread,
            "above_base": all(g > 0 for g in gains.values()), "misreads_kept": misread <= MISREAD_MARGIN}


def table(results: list[dict], base_policy: dict) -> str:
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each (default 2)")
    ap.add_argument("--out", default=os.path.join(common.ROOT, "runs", "long-seeds"))
    ap.add_argument("extra", nargs="*", help="options passed on to vapo.py (after --)")
    args = ap.parse_args()
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
        run = run_figures(d)
        policy = judged_policy(d)
        results.append({"seed": s, "run": run, "policy": policy, "verdict": verdict(run, policy, base_policy)})
    report = (f"`python vapo.py --preset long --seed S {' '.join(args.extra)}`; {common.machine()}, "
              f"{common.now()}. Misreads and first errors: the final policies on "
              f"{common.POLICY_PROBLEMS} held-out problems (common.judge_policy).\n\n" + table(results, base_policy))
    common.write_json(os.path.join(args.out, "results.json"), {"base_policy": base_policy, "runs": results})
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(report)
    print(report)


if __name__ == "__main__":
    main()
