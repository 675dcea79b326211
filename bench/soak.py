"""Soak test: the demo for 500 RL steps in one process; no crash, memory that does not grow, every metric finite.

    python bench/soak.py                      # 500 steps, smaller batches than the demo (see below), ~10 min
    python bench/soak.py --steps 500 --full-batch   # the demo's own 16 x 8 batches (~45 min on 2 cores)

Runs `python vapo.py --preset demo` (value pretraining, evaluations every 100 steps, checkpoints every 100) as a
child process and samples its resident memory (VmRSS, from /proc) every half second, matching each sample to
the RL step logged at that moment. By default a step has 4 prompts x 4 samples instead of 16 x 8, so that 500
steps (500 rollouts, updates, checkpoints' worth of allocations: what a leak grows with) fit in minutes; the
code path is the demo's. Reports the median RSS over the 50 steps after warm-up (--warmup: step 100, after the
first evaluation, plot and checkpoint, whose one-time costs are part of warm-up: the first plot imports
matplotlib, about 40 MiB for good) and over the last 50 steps, the medians of every 50 steps, the growth between them (target: < 5%), the peak, whether any logged number was not finite, and the
exit code; writes soak.json (with every RSS sample) and soak.png (RSS against step) into --out.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import common  # (puts the repository on the path)
from vapo import UNDEFINED_AS_NAN

WINDOW = 50  # steps per window whose median RSS is compared


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process in MiB (Linux /proc), None once it has gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def logged_step(metrics_path: str) -> int:
    """The last RL step logged so far (0 before the first)."""
    if not os.path.exists(metrics_path):
        return 0
    step = 0
    with open(metrics_path) as fh:
        for line in fh:
            if '"train_acc"' in line and '"step"' in line:
                try:
                    step = json.loads(line)["step"]
                except ValueError:
                    pass  # a line being written
    return step


def non_finite(metrics_path: str) -> list[str]:
    """'line N: key' for every logged number that is nan or infinite, except vapo.UNDEFINED_AS_NAN (NaN when
    undefined, by design)."""
    bad = []
    with open(metrics_path) as fh:
        for number, line in enumerate(fh, 1):
            for k, v in json.loads(line).items():
                if isinstance(v, float) and not math.isfinite(v) and k not in UNDEFINED_AS_NAN:
                    bad.append(f"line {number}: {k}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=100,
                    help="the first step of the baseline window: by default after the first evaluation, plot and "
                         "checkpoint (every 100 steps), so that their one-time costs count as warm-up")
    ap.add_argument("--full-batch", action="store_true", help="the demo's 16 prompts x 8 samples per step")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the run (one: the tiny model runs fastest so on a shared machine)")
    ap.add_argument("--out", default=os.path.join(common.ROOT, "runs", "soak"))
    ap.add_argument("--report", metavar="SOAK_JSON", help="only print the verdict of an earlier run's soak.json")
    args = ap.parse_args()
    if args.report:
        report(args.report, args.warmup, args.steps)
    run_dir = os.path.join(args.out, "run")
    cmd = [sys.executable, "vapo.py", "--preset", "demo", "--steps", str(args.steps), "--eval-every", "100",
           "--save-every", "100", "--output-dir", run_dir, "--overwrite"]
    if not args.full_batch:
        cmd += ["--prompts-per-step", "4", "--samples-per-prompt", "4", "--mini-batch-size", "16",
                "--micro-batch-size", "16", "--eval-prompts", "100", "--eval-samples", "2"]
    os.makedirs(args.out, exist_ok=True)
    env = common.thread_env(args.threads)
    started, machine = common.now(), common.machine()
    print(f"machine: {machine}\ndate: {started}\n{' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    metrics = os.path.join(run_dir, "metrics.jsonl")
    samples = []  # (seconds, step, rss MiB)
    with open(os.path.join(args.out, "stdout.log"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=common.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        last_print = 0.0
        while proc.poll() is None:
            rss = rss_mb(proc.pid)
            if rss is not None:
                samples.append((time.perf_counter() - t0, logged_step(metrics), rss))
                if samples[-1][0] - last_print > 60:
                    last_print = samples[-1][0]
                    print(f"  {last_print:5.0f} s: step {samples[-1][1]}, RSS {rss:.0f} MiB", flush=True)
            time.sleep(0.5)
    wall = time.perf_counter() - t0

    result = {"machine": machine, "date": started, "command": " ".join(cmd), "exit_code": proc.returncode,
              "steps_logged": logged_step(metrics), "wall_seconds": round(wall),
              "non_finite": non_finite(metrics) if os.path.exists(metrics) else ["no metrics.jsonl"]}
    common.write_json(os.path.join(args.out, "soak.json"), {**result, "samples": samples}, indent=None)
    report(os.path.join(args.out, "soak.json"), args.warmup, args.steps)


def window_median(samples, first: int, last: int) -> float | None:
    """The median RSS (MiB) of the samples taken while the run was between RL steps first and last."""
    rss = sorted(r for _, s, r in samples if first <= s <= last)
    return rss[len(rss) // 2] if rss else None


def report(path: str, warmup: int, steps: int):
    """Print the verdict of a soak.json (also on its own: --report soak.json) and plot soak.png beside it.

    Memory is compared as the median RSS over a window of WINDOW steps after warm-up against the median over the
    last WINDOW steps: single readings swing by +-10% as the allocator reuses and returns memory of tensors of
    varying sizes, the medians of windows do not."""
    result = common.read_json(path)
    samples, final_step = result["samples"], result["steps_logged"]
    base = window_median(samples, warmup, warmup + WINDOW)
    end = window_median(samples, final_step - WINDOW, final_step)
    growth = (end - base) / base if base and end else None
    peak = max(r for _, _, r in samples)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([s for _, s, _ in samples], [r for _, _, r in samples], ".", ms=2, label="RSS, sampled every 0.5 s")
    for (a, b), m in (((warmup, warmup + WINDOW), base), ((final_step - WINDOW, final_step), end)):
        if m is not None:
            ax.plot([a, b], [m, m], "r-", lw=2)
    ax.set(xlabel="RL step", ylabel="RSS (MiB)", title=f"soak: {final_step} steps, {result['date']} (red: medians)")
    fig.tight_layout()
    fig.savefig(os.path.join(os.path.dirname(path), "soak.png"), dpi=90)
    medians = [window_median(samples, a, a + WINDOW) for a in range(0, final_step, WINDOW)]
    print(f"\n{result['machine']}, {result['date']}\nmedian RSS per {WINDOW} steps (MiB): "
          + ", ".join(f"{m:.0f}" for m in medians if m is not None))
    mib = lambda m: "none (no step there)" if m is None else f"{m:.0f} MiB"  # noqa: E731
    print(f"exit code {result['exit_code']}; {final_step} of {steps} steps "
          f"in {result['wall_seconds']} s; median RSS over steps {warmup}-{warmup + WINDOW}: {mib(base)}, over "
          f"the last {WINDOW} steps: {mib(end)} ({'n/a' if growth is None else f'{100 * growth:+.1f}%'}); peak "
          f"{peak:.0f} MiB; non-finite "
          f"numbers: {len(result['non_finite'])}")
    ok = result["exit_code"] == 0 and final_step == steps and growth is not None and growth < 0.05 \
        and not result["non_finite"]
    print("PASS" if ok else "FAIL", "(target: exit 0, every step, RSS growth < 5% after warm-up, all finite)")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
