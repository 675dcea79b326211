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
- `seedN`: the same recipe with warm-start seed N (`python task.py build --seed N`), a stand-in for the base
  model another CPU would build (floating-point kernels differ between CPUs, so a rebuild elsewhere is a different
  model); built once into the cache ($VAPO_CACHE or .cache/) if missing, several builds in parallel;
- `weak`: the same recipe stopped after 700 warm-start steps instead of 2,000 (`python task.py build --steps
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
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import plots  # noqa: E402
import task  # noqa: E402

GAIN_TARGET = 0.25  # held-out accuracy points (as a fraction) each of avg@k and greedy should gain


def machine() -> str:
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} (CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}), Python {platform.python_version()}, {platform.system()}")


WEAK_STEPS = 700  # warm-start steps of the `weak` base model (the full recipe has task.SFT_STEPS)


def resolve_base(name: str) -> str:
    """A base model folder for `shipped`, `seedN` or a path (see the module docstring)."""
    if name == "shipped":
        return task.SHIPPED_BASE
    if name.startswith("seed") and name[4:].isdigit():
        return task.cache_path(f"{task.BASE_NAME}-{name}")
    if name == "weak":
        return task.cache_path(f"{task.BASE_NAME}-sft{WEAK_STEPS}")
    if os.path.isdir(name):
        return os.path.abspath(name)
    raise SystemExit(f"--bases: {name!r} is neither 'shipped', 'seedN', 'weak' nor a folder")


def build_missing(bases: dict[str, str], jobs: int) -> None:
    """Build the `seedN` and `weak` base models that are not in the cache yet, `jobs` builds at a time, one
    thread each."""
    todo = {n: p for n, p in bases.items() if (n.startswith("seed") or n == "weak") and not os.path.exists(
        os.path.join(p, task.BUILD_INFO))}
    if not todo:
        return
    print(f"building {len(todo)} base model(s) ({', '.join(todo)}), about 8 minutes each on one thread ...",
          flush=True)

    def build(item):
        name, path = item
        recipe = ["--steps", str(WEAK_STEPS)] if name == "weak" else ["--seed", name[4:]]
        cmd = [sys.executable, "task.py", "build", *recipe, "--out", path]
        proc = subprocess.run(cmd, cwd=ROOT, env=one_thread_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"building {name} failed:\n{proc.stderr[-3000:]}")
        print(f"built {name}: {proc.stdout.strip().splitlines()[0]}", flush=True)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(build, todo.items()))


def one_thread_env() -> dict:
    """This process's environment with one torch (OpenMP/MKL) thread for the child."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


def finished(run_dir: str) -> bool:
    """A run is finished when its metrics hold the evaluation vapo.py makes at the end: at --steps, or at the
    step where --max-samples was reached."""
    try:
        with open(os.path.join(run_dir, "config.json")) as fh:
            cfg = json.load(fh)
        with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
            records = [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError):
        return False
    if any(r.get("step") == cfg.get("steps") and "eval/acc_greedy" in r for r in records):
        return True
    budget, generated = cfg.get("max_samples"), sum(r.get("samples_generated", 0) for r in records)
    return budget is not None and generated >= budget and bool(records) and "eval/acc_greedy" in records[-1]


def run_one(job: tuple[str, str, int, str, list[str]]) -> float | None:
    """Run one demo (unless already finished); returns its wall time in seconds, None if it was read back."""
    base_name, base_path, seed, run_dir, extra = job
    cmd = ["--preset", "demo", "--model", base_path, "--seed", str(seed), "--output-dir", run_dir, *extra]
    return run_vapo(f"{base_name} seed {seed}", cmd, run_dir)


RUNNING = "running.pid"  # in a run folder while a process runs it: the vapo.py process's id


def running(run_dir: str) -> int | None:
    """The id of a live process that runs run_dir now (its RUNNING file), else None."""
    try:
        with open(os.path.join(run_dir, RUNNING)) as fh:
            pid = int(fh.read())
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
        return pid
    except (OSError, ValueError):
        return None


def run_vapo(label: str, args: list[str], run_dir: str) -> float | None:
    """`python vapo.py ARGS` with one torch thread, its output in run_dir/stdout.log, unless run_dir already
    holds a finished run, or a live process of another invocation runs it (then None); an interrupted run (its
    config.json there) is resumed instead. Returns the wall time in seconds, also written to run_dir/wall_seconds."""
    if finished(run_dir):
        return None
    owner = running(run_dir)
    if owner is not None:  # another sweep's process is running it now: left to that one
        print(f"  {label}: being run by process {owner} (another invocation), skipped here", flush=True)
        return None
    cmd = [sys.executable, "vapo.py", *args]
    if os.path.exists(os.path.join(run_dir, "config.json")):
        cmd = [sys.executable, "vapo.py", "--resume", run_dir]  # an interrupted run continues (or restarts)
    t0 = time.perf_counter()
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "stdout.log"), "a") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=one_thread_env(), stdout=log, stderr=subprocess.STDOUT)
        with open(os.path.join(run_dir, RUNNING), "w") as fh:
            fh.write(f"{proc.pid}\n")
        proc.wait()
    os.remove(os.path.join(run_dir, RUNNING))
    wall = time.perf_counter() - t0
    status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}, see {run_dir}/stdout.log)"
    print(f"  {label}: {status} in {wall:.0f} s", flush=True)
    with open(os.path.join(run_dir, "wall_seconds"), "w") as fh:
        fh.write(f"{wall:.1f}\n")
    return wall


def summarise_run(run_dir: str) -> dict | None:
    """The figures of one finished run folder (None if it did not finish)."""
    if not finished(run_dir):
        return None
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        records = [json.loads(line) for line in fh]
    evals = [r for r in records if "eval/acc_greedy" in r]
    rl = [r for r in records if "step" in r and "train_acc" in r]
    pre = [r for r in records if "value_pretrain_step" in r]
    first, last = evals[0], evals[-1]
    sampled = next(k for k in first if k.startswith("eval/acc_avg@") and not k.endswith("_se"))

    def mean(key, rows):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and r[key] == r[key]]
        return statistics.mean(vals) if vals else float("nan")

    wall = None
    if os.path.exists(os.path.join(run_dir, "wall_seconds")):
        with open(os.path.join(run_dir, "wall_seconds")) as fh:
            wall = float(fh.read())
    return {
        "k": sampled.removeprefix("eval/acc_"),
        "avg_base": first[sampled], "avg_final": last[sampled], "avg_gain": last[sampled] - first[sampled],
        "greedy_base": first["eval/acc_greedy"], "greedy_final": last["eval/acc_greedy"],
        "greedy_gain": last["eval/acc_greedy"] - first["eval/acc_greedy"],
        "len_ratio": last["eval/response_len_greedy"] / first["eval/response_len_greedy"],
        "pretrain_ev_last3": statistics.mean(r["explained_variance"] for r in pre[-3:]) if pre else float("nan"),
        "pretrain_steps": len(pre),
        "ev": mean("explained_variance", rl), "clip_frac": mean("clip_frac", rl),
        "approx_kl": mean("approx_kl", rl), "entropy": mean("entropy", rl),
        "run_seconds": last["time/elapsed"], "wall_seconds": wall,
    }


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
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "demo-seeds"), help="folder of the runs")
    ap.add_argument("--fresh", action="store_true", help="run again even where a finished run is there")
    ap.add_argument("--plot", default=None, help="where to write the PNG of all runs (default: <out>/demo-seeds.png)")
    ap.add_argument("extra", nargs="*", help="options passed on to vapo.py (after --)")
    args = ap.parse_args()

    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    print(f"machine: {machine()}\ndate: {started}", flush=True)
    bases = {name: resolve_base(name) for name in args.bases}
    build_missing(bases, args.jobs)
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
    rows = [{"base": j[0], "seed": j[2], "run_dir": j[3], "summary": summarise_run(j[3])} for j in jobs]
    v = verdict(rows)
    md = table(rows)
    lines = [f"machine: {machine()}", f"date: {started}; {time.perf_counter() - t0:.0f} s for this invocation",
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
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(report + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump({"machine": machine(), "date": started, "extra": args.extra, "verdict": v, "runs": rows}, fh,
                  indent=1)


if __name__ == "__main__":
    main()
