"""Soak test: the demo for 500 RL steps in one process; no crash, memory that does not grow, every metric finite.

    python bench/soak.py                      # 500 steps, smaller batches than the demo (see below), ~10 min
    python bench/soak.py --steps 500 --full-batch   # the demo's own 16 x 8 batches (~45 min on 2 cores)

Runs `python vapo.py --preset demo` (value pretraining, evaluations every 100 steps, checkpoints every 100) as a
child process and samples its resident memory (VmRSS, from /proc) every half second, matching each sample to
the RL step logged at that moment. By default a step has 4 prompts x 4 samples instead of 16 x 8, so that 500
steps (500 rollouts, updates, checkpoints' worth of allocations: what a leak grows with) fit in minutes; the
code path is the demo's. Reports the RSS after warm-up (at step --warmup) and at the end, the growth between
them (target: < 5%), the peak, whether any logged number was not finite, and the exit code; writes soak.json
and soak.png (RSS against step) into --out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_seeds  # noqa: E402  (machine(), one_thread_env(), the repository root)


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
    from vapo import UNDEFINED_AS_NAN
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
    ap.add_argument("--warmup", type=int, default=50, help="the step whose RSS is the baseline")
    ap.add_argument("--full-batch", action="store_true", help="the demo's 16 prompts x 8 samples per step")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the run")
    ap.add_argument("--out", default=os.path.join(demo_seeds.ROOT, "runs", "soak"))
    args = ap.parse_args()
    run_dir = os.path.join(args.out, "run")
    cmd = [sys.executable, "vapo.py", "--preset", "demo", "--steps", str(args.steps), "--eval-every", "100",
           "--save-every", "100", "--output-dir", run_dir, "--overwrite"]
    if not args.full_batch:
        cmd += ["--prompts-per-step", "4", "--samples-per-prompt", "4", "--mini-batch-size", "16",
                "--micro-batch-size", "16", "--eval-prompts", "100", "--eval-samples", "2"]
    os.makedirs(args.out, exist_ok=True)
    env = {**demo_seeds.one_thread_env(), "OMP_NUM_THREADS": str(args.threads)}
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    print(f"machine: {demo_seeds.machine()}\ndate: {started}\n{' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    metrics = os.path.join(run_dir, "metrics.jsonl")
    samples = []  # (seconds, step, rss MiB)
    with open(os.path.join(args.out, "stdout.log"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=demo_seeds.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
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

    def rss_at(step):  # the median RSS while the run was at that step (after its record was logged)
        at = sorted(r for _, s, r in samples if s == step)
        return at[len(at) // 2] if at else None
    final_step = logged_step(metrics)
    base, end = rss_at(args.warmup), rss_at(final_step)
    result = {"machine": demo_seeds.machine(), "date": started, "command": " ".join(cmd), "exit_code": proc.returncode,
              "steps_logged": final_step, "wall_seconds": round(wall), "rss_warmup_mib": base, "rss_end_mib": end,
              "rss_peak_mib": max(r for _, _, r in samples),
              "growth_after_warmup": (end - base) / base if base and end else None,
              "non_finite": non_finite(metrics) if os.path.exists(metrics) else ["no metrics.jsonl"]}
    with open(os.path.join(args.out, "soak.json"), "w") as fh:
        json.dump({**result, "samples": samples}, fh)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([s for _, s, _ in samples], [r for _, _, r in samples], ".", ms=2)
    ax.set(xlabel="RL step", ylabel="RSS (MiB)", title=f"soak: {final_step} steps, {started}")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "soak.png"), dpi=90)
    growth = result["growth_after_warmup"]
    print(f"\nexit code {proc.returncode}; {final_step} of {args.steps} steps in {wall:.0f} s; RSS at step "
          f"{args.warmup} {base:.0f} MiB, at the end {end:.0f} MiB ({100 * growth:+.1f}%), peak "
          f"{result['rss_peak_mib']:.0f} MiB; non-finite numbers: {len(result['non_finite'])}")
    ok = proc.returncode == 0 and final_step == args.steps and growth is not None and growth < 0.05 \
        and not result["non_finite"]
    print("PASS" if ok else "FAIL", "(target: exit 0, every step, RSS growth < 5% after warm-up, all finite)")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
