"""Plots of a run's metrics.jsonl: the curves that tell whether VAPO is working.

    python plots.py runs/<run>/metrics.jsonl [out.png]      # writes the PNG, prints the run's summary

Panels: held-out and training accuracy; mean response length (a falling length with falling accuracy is the
length collapse the paper warns about); the critic's explained variance, value pretraining included; losses;
lambda_policy and entropy.
"""
from __future__ import annotations

import json
import math
import os
import sys


def read_metrics(path: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(value-pretraining records, RL step records, evaluation records) of a metrics.jsonl."""
    pre, steps, evals = [], [], []
    with open(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            rec = json.loads(line)
            if "value_pretrain_step" in rec:
                pre.append(rec)
            elif any(k.startswith("eval/") for k in rec):
                evals.append(rec)
            else:
                steps.append(rec)
    return pre, steps, evals


def _series(records: list[dict], x: str, y: str):
    pts = [(r[x], r[y]) for r in records if isinstance(r.get(y), (int, float)) and math.isfinite(r[y])]
    return [p[0] for p in pts], [p[1] for p in pts]


def _smooth(ys: list[float], window: int = 5) -> list[float]:
    return [sum(ys[max(0, i - window + 1):i + 1]) / len(ys[max(0, i - window + 1):i + 1]) for i in range(len(ys))]


def plot_metrics(path: str, out: str) -> str:
    """Write a PNG of the main curves of metrics.jsonl `path` to `out`; returns `out`."""
    import matplotlib  # here, not at the top: the file-only backend must be chosen before pyplot is imported
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pre, steps, evals = read_metrics(path)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    ax = axes[0, 0]
    for key in sorted({k for r in evals for k in r if k.startswith("eval/acc")}):
        ax.plot(*_series(evals, "step", key), "o-", label=key.removeprefix("eval/"))
    xs, ys = _series(steps, "step", "train_acc")
    ax.plot(xs, _smooth(ys), alpha=0.6, label="train (rollouts, smoothed)")
    ax.set(title="accuracy", xlabel="step", ylim=(0, 1))
    ax.legend(fontsize=8)

    ax = axes[0, 1]
    xs, ys = _series(steps, "step", "response_len")
    ax.plot(xs, _smooth(ys), label="train rollouts")
    ax.plot(*_series(evals, "step", next((k for r in evals for k in r if k.startswith("eval/response_len_avg")),
                                         "none")), "o-", label="held-out (sampled)")
    ax.set(title="mean response length (tokens)", xlabel="step")
    ax.legend(fontsize=8)

    ax = axes[0, 2]
    xs, ys = _series(pre, "value_pretrain_step", "explained_variance")
    if xs:
        ax.plot([x - len(pre) - 1 for x in xs], ys, label="value pretraining (steps before 0)")
    ax.plot(*_series(steps, "step", "explained_variance"), label="RL")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set(title="critic explained variance", xlabel="step", ylim=(-1, 1))
    ax.legend(fontsize=8)

    ax = axes[1, 0]
    ax.plot(*_series(steps, "step", "policy_loss"), label="policy (clipped surrogate)")
    ax.plot(*_series(steps, "step", "nll_loss"), label="positive NLL")
    ax.set(title="policy losses", xlabel="step")
    ax.legend(fontsize=8)

    ax = axes[1, 1]
    if pre:
        ax.plot([x - len(pre) - 1 for x in _series(pre, "value_pretrain_step", "value_loss")[0]],
                _series(pre, "value_pretrain_step", "value_loss")[1], label="value pretraining")
    ax.plot(*_series(steps, "step", "value_loss"), label="RL")
    ax.set(title="value loss", xlabel="step", yscale="log")
    ax.legend(fontsize=8)

    ax = axes[1, 2]
    ax.plot(*_series(steps, "step", "lam_policy"), label="mean lambda_policy")
    ax.plot(*_series(steps, "step", "entropy"), label="entropy (nats/token)")
    ax.plot(*_series(steps, "step", "clip_frac"), label="clip fraction")
    ax.set(title="lambda, entropy, clipping", xlabel="step")
    ax.legend(fontsize=8)

    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def summarize(path: str) -> dict:
    """The figures of a run: held-out accuracy at the start and the end (each eval/acc key), mean response
    length at both ends, wall time, and the share of the RL steps' time spent in each phase."""
    pre, steps, evals = read_metrics(path)
    out: dict = {"rl_steps": len(steps), "value_pretrain_steps": len(pre)}
    if evals:
        for key in sorted(k for k in evals[0] if k.startswith("eval/")):
            out[f"{key} (step {evals[0]['step']})"] = evals[0][key]
            out[f"{key} (step {evals[-1]['step']})"] = evals[-1].get(key)
    every = pre + steps + evals
    out["wall_seconds"] = max((r.get("time/elapsed", 0.0) for r in every), default=0.0)
    out["value_pretrain_seconds"] = sum(r.get("time/step", 0.0) for r in pre)
    phases = ("rollout", "reward", "score", "advantages", "update")
    totals = {p: sum(r.get(f"time/{p}", 0.0) for r in steps) for p in phases}
    step_total = sum(r.get("time/step", 0.0) for r in steps)
    out["rl_seconds"] = step_total
    out["seconds_per_rl_step"] = step_total / max(len(steps), 1)
    for p in phases:
        out[f"share_{p}"] = totals[p] / step_total if step_total else float("nan")
    return out


if __name__ == "__main__":
    src = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(src)), "curves.png")
    print(plot_metrics(src, out))
    for key, value in summarize(src).items():
        print(f"{key:45s} {value:.3f}" if isinstance(value, float) else f"{key:45s} {value}")
