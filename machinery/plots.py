"""Plots of a run's metrics.jsonl: the curves that tell whether VAPO is working.

    python -m machinery.plots runs/<run>/metrics.jsonl [out.png]      # writes the PNG, prints the run's summary
    python -m machinery.plots tokens runs/<run> [--step N]            # the per-token teaching views of a record

Panels: held-out and training accuracy; mean response length (a falling length with falling accuracy is the
length collapse the paper warns about); the critic's explained variance, value pretraining included; losses;
lambda_policy and entropy.

The teaching views (from the run's tokens.jsonl, written by views.TokenViews at step 0, after value pretraining and
at every evaluation; no service needed) go to runs/<run>/views/step-N/: for four probe responses (the shortest and
the longest, right and wrong), one figure each with, token by token, V(s_t) and the critic's return target; the
policy's advantage under the length-adaptive lambda, a fixed 0.95 and 1.0 side by side (how far the terminal
reward reaches back: Decoupled-GAE's point); the ratio pi_new / pi_old with the clip bounds and the tokens where
they bit; the entropy. Then the mean V(s_t) by position over the probe set against the Monte-Carlo return, and
index.html with each response's text coloured by advantage.
"""
from __future__ import annotations

import argparse
import html
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


def _fit(fig, left: float = 0.75, right: float = 0.2, top: float = 0.6, bottom: float = 0.55, hspace: float = 0.45,
         wspace: float = 0.25):
    """Fixed margins in inches (hspace, wspace: shares of an axes' height, width) instead of fig.tight_layout(),
    which measures every tick label and took a third of a figure's time: with a figure at each evaluation, a
    tiny run (the suite's) spent half its time drawing."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=left / w, right=1 - right / w, top=1 - top / h, bottom=bottom / h, hspace=hspace,
                        wspace=wspace)


def plot_metrics(path: str, out: str) -> str:
    """Write a PNG of the main curves of metrics.jsonl `path` to `out`; returns `out`."""
    import matplotlib  # here, not at the top: the file-only backend must be chosen before pyplot is imported
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pre, steps, evals = read_metrics(path)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    ax = axes[0, 0]
    keys = sorted({k for r in evals for k in r if k.startswith("eval/acc")})
    for key in [k for k in keys if "_steps_" not in k and not k.endswith("_se")]:  # with +- 1 standard error
        pts = [(r["step"], r[key], r.get(key + "_se", 0.0)) for r in evals
               if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], fmt="o-", capsize=3,
                    label=key.removeprefix("eval/"))
    for key in [k for k in keys if "_steps_" in k and "_greedy_" not in k]:  # the long chains' bands, sampled
        name, band = key.removeprefix("eval/acc_").split("_steps_")
        ax.plot(*_series(evals, "step", key), ".:", lw=1, label=f"{name}, {band} steps")
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

    _fit(fig, top=0.45, hspace=0.35, wspace=0.2)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def read_jsonl(path: str) -> list[dict]:
    """The complete JSON lines of a file, in order (a line cut by a kill is left out; no file: none)."""
    out = []
    if os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    return out


def read_tokens(run_dir: str) -> list[dict]:
    """The records of a run's tokens.jsonl (views.TokenViews), in order."""
    return read_jsonl(os.path.join(run_dir, "tokens.jsonl"))


def pick_probes(probes: list[dict]) -> list[int]:
    """The probes to draw: the shortest and the longest right one, the shortest and the longest wrong one (by
    their "reward" and "length"; ties to the first)."""
    chosen = []
    for right in (True, False):
        group = sorted((p["length"], i) for i, p in enumerate(probes) if (p["reward"] > 0) == right)
        chosen += [i for _, i in (group[:1] + group[-1:] if len(group) > 1 else group)]
    return list(dict.fromkeys(chosen))


ADVANTAGES = (("adv_adaptive", "length-adaptive lambda"), ("adv_0.95", "lambda 0.95"), ("adv_1.0", "lambda 1.0"),
              ("adv_group", "group advantage (no critic)"),
              ("adv_exact", "A*: V*'s own advantage (the credit a perfect critic gives)"))


def probe_figure(record: dict, probe: dict, out: str) -> dict:
    """One probe response's figure, written to out; returns {panel title: {label: y values}} (what was drawn)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n, xs = probe["length"], list(range(probe["length"]))
    drawn: dict = {}
    fig, axes = plt.subplots(4, 1, figsize=(max(8, min(30, n * 0.12)), 10), sharex=True)

    def line(ax, title, key, label, **kw):
        if key in probe:
            ax.plot(xs, probe[key], label=label, **kw)
            drawn.setdefault(title, {})[label] = probe[key]

    title = "critic: V(s_t) and its return target"
    line(axes[0], title, "value", "V(s_t)")
    line(axes[0], title, "return", f"return target (lambda_critic {record['lam_critic']:g})", ls="--")
    line(axes[0], title, "value_exact", "V*(s_t): the task's exact values (a constructed reference)", color="k", ls=":")
    axes[0].set_title(f"{title} (reward {probe['reward']:+g}, {n} tokens)")
    title = "policy advantage, raw (before whitening)"
    for key, label in ADVANTAGES:
        style = {"color": "k", "ls": ":"} if key == "adv_exact" else {}
        line(axes[1], title, key, label + (f" = {probe['lam_policy']:.3f}" if key == "adv_adaptive" else ""), **style)
    axes[1].axhline(0, color="grey", lw=0.5)
    axes[1].set_title(title)
    title = "ratio pi_new / pi_old of the step's update"
    line(axes[2], title, "ratio", "ratio")
    low, high = 1 - record["eps_low"], 1 + record["eps_high"]
    for bound in (low, high):
        axes[2].axhline(bound, color="red", lw=0.8, ls=":")
    adv = probe.get("adv_adaptive", probe.get("adv_group"))
    bit = [t for t in xs if (adv[t] > 0 and probe["ratio"][t] > high) or (adv[t] < 0 and probe["ratio"][t] < low)]
    axes[2].plot(bit, [probe["ratio"][t] for t in bit], "rx", label=f"clip bit ({len(bit)} tokens)")
    drawn[title]["clip bit"] = bit
    axes[2].set_title(f"{title}, clip bounds [{low:g}, {high:g}]")
    line(axes[3], "entropy", "entropy", "entropy (nats)")
    axes[3].set(title="entropy of the policy at each token", xlabel="response token t")
    if "first_error" in probe:  # where a wrong response first departs from the correct chain (the task knows it)
        for ax in axes:
            ax.axvline(probe["first_error"], color="purple", lw=1.2, ls="--",
                       label="first wrong token" if ax is axes[0] else None)
        drawn["first wrong token"] = probe["first_error"]
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:  # a critic-free run has no values to draw
            ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"step {record['step']} ({record['stage']}): {probe['prompt'][-80:]!r}", fontsize=9)
    _fit(fig, top=0.7, hspace=0.4)
    fig.savefig(out, dpi=70)
    plt.close(fig)
    return drawn


def compare_figure(columns: list[tuple[str, dict, dict, str]], out: str, marks: list[int] | None = None) -> dict:
    """One probe response under several runs, side by side: columns of (label, record, probe, advantage key: the
    run's own, e.g. "adv_adaptive" for VAPO, "adv_0.95" for PPO, "adv_group" for GRPO), each with the panels of
    probe_figure (the critic's V(s_t) and return target, the raw advantage, the update's ratio with its clip
    bounds, the entropy) on shared axes; marks: token positions to draw as vertical lines in every panel (e.g.
    the decisive tokens). Returns {label: {panel: y values}} (what was drawn)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(4, len(columns), figsize=(6.5 * len(columns), 10), sharex=True, sharey="row",
                             squeeze=False)
    drawn: dict = {}
    for j, (label, record, probe, adv_key) in enumerate(columns):
        xs, col, got = list(range(probe["length"])), axes[:, j], drawn.setdefault(label, {})
        if "value" in probe:
            col[0].plot(xs, probe["value"], label="V(s_t)")
            col[0].plot(xs, probe["return"], "--", label=f"return target (lambda_critic {record['lam_critic']:g})")
            got["value"] = probe["value"]
            col[0].legend(fontsize=7)
        else:
            col[0].text(0.5, 0.5, "no critic", ha="center", va="center", transform=col[0].transAxes)
        col[1].plot(xs, probe[adv_key], color="C2")
        col[1].axhline(0, color="grey", lw=0.5)
        col[2].plot(xs, probe["ratio"], color="C3")
        for bound in (1 - record["eps_low"], 1 + record["eps_high"]):
            col[2].axhline(bound, color="red", lw=0.8, ls=":")
        col[3].plot(xs, probe["entropy"], color="C4")
        got |= {"advantage": probe[adv_key], "ratio": probe["ratio"], "entropy": probe["entropy"]}
        for ax in col:
            for t in marks or []:
                ax.axvline(t, color="orange", lw=0.6, alpha=0.7)
        col[0].set_title(f"{label}: step {record['step']}, reward {probe['reward']:+g}, {probe['length']} tokens",
                         fontsize=9)
        col[1].set_title(f"raw advantage ({adv_key.removeprefix('adv_')})", fontsize=8)
        col[2].set_title(f"ratio pi_new / pi_old, clip [{1 - record['eps_low']:g}, {1 + record['eps_high']:g}]",
                         fontsize=8)
        col[3].set_title("entropy (nats)", fontsize=8)
        col[3].set_xlabel("response token t" + (" (orange: the decisive tokens)" if marks else ""))
    fig.tight_layout()
    fig.savefig(out, dpi=70)
    plt.close(fig)
    return drawn


def position_figure(record: dict, out: str):
    """Mean V(s_t) by token position over the probe set, against the Monte-Carlo return (gamma = 1)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    by = record["by_position"]
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = [t for t, c in enumerate(by["count"]) if c > 0]
    ax.plot(xs, [by["mean_value"][t] for t in xs], label="mean V(s_t)")
    ax.plot(xs, [by["mean_return"][t] for t in xs], "--", label="mean Monte-Carlo return")
    ax.set(title=f"value by position over {len(record['probes'])} probe responses, step {record['step']} "
                 f"({record['stage']})", xlabel="response token t")
    ax.legend(fontsize=8)
    _fit(fig, top=0.4)
    fig.savefig(out, dpi=70)
    plt.close(fig)


def tokens_html(record: dict, chosen: list[int]) -> str:
    """Each chosen probe's text, every token coloured by its advantage (green > 0, red < 0; the tooltip has the
    numbers)."""
    parts = [f"<html><head><meta charset='utf-8'><title>step {record['step']}</title></head><body style="
             f"'font-family:monospace'><h3>step {record['step']} ({html.escape(record['stage'])}): tokens coloured by "
             f"the policy's advantage (length-adaptive lambda; group advantage without a critic)</h3>"]
    for i in chosen:
        p = record["probes"][i]
        adv = p.get("adv_adaptive", p.get("adv_group"))
        scale = max((abs(a) for a in adv), default=1.0) or 1.0
        wrong = p.get("first_error")
        parts.append(f"<p><b>reward {p['reward']:+g}, {p['length']} tokens</b>"
                     + (f" (first wrong token: t={wrong}, boxed)" if wrong is not None else "")
                     + f" {html.escape(p['prompt'][-120:])}<br>")
        for t, (piece, a) in enumerate(zip(p["pieces"], adv)):
            alpha = min(1.0, abs(a) / scale)
            color = f"rgba(0,160,0,{alpha:.2f})" if a > 0 else f"rgba(220,0,0,{alpha:.2f})"
            tip = " ".join(f"{k}={p[k][t]:.3f}" for k in ("value", "adv_adaptive", "adv_0.95", "adv_1.0", "ratio",
                                                           "entropy", "adv_group") if k in p)
            box = ";outline:2px solid purple" if t == wrong else ""
            parts.append(f"<span style='background:{color}{box}' title='t={t} {tip}'>{html.escape(piece)}</span>")
        parts.append("</p>")
    return "".join(parts) + "</body></html>"


def views_folder(run_dir: str, record: dict) -> str:
    """run_dir/views/step-N/, and step-0-pretrained/ for the record after value pretraining."""
    pretrained = "-pretrained" if record["stage"] == "after value pretraining" else ""
    return os.path.join(run_dir, "views", f"step-{record['step']}{pretrained}")


def plot_tokens(run_dir: str, step: int | None = None, stage: str | None = None) -> str:
    """The teaching views of run_dir's record at `step` (the last record there, or the one of `stage`: "step 0",
    "after value pretraining", "evaluation"; default: the last record), written to views_folder (probe-K.png,
    value-by-position.png, index.html); returns that folder."""
    records = read_tokens(run_dir)
    at = [r for r in records if (step is None or r["step"] == step) and (stage is None or r["stage"] == stage)]
    if not at:
        raise SystemExit(f"{run_dir}/tokens.jsonl has no record at step {step}{f' ({stage})' if stage else ''} "
                         f"(records: {[(r['step'], r['stage']) for r in records]})")
    record = at[-1]
    folder = views_folder(run_dir, record)
    os.makedirs(folder, exist_ok=True)
    chosen = pick_probes(record["probes"])
    for k, i in enumerate(chosen):
        probe_figure(record, record["probes"][i], os.path.join(folder, f"probe-{k}.png"))
    if record.get("by_position"):
        position_figure(record, os.path.join(folder, "value-by-position.png"))
    with open(os.path.join(folder, "index.html"), "w") as fh:
        fh.write(tokens_html(record, chosen))
    return folder


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


def main(argv: list[str]):
    if argv and argv[0] == "tokens":
        parser = argparse.ArgumentParser(prog="python -m machinery.plots tokens", description="the per-token teaching views")
        parser.add_argument("run_dir")
        parser.add_argument("--step", type=int, default=None, help="the record's step (default: the last)")
        parser.add_argument("--stage", default=None, choices=("step 0", "after value pretraining", "evaluation"),
                            help="which record of that step (default: its last)")
        args = parser.parse_args(argv[1:])
        print(plot_tokens(args.run_dir, args.step, args.stage))
        return
    src = argv[0]
    out = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(src)), "curves.png")
    print(plot_metrics(src, out))
    for key, value in summarize(src).items():
        print(f"{key:45s} {value:.3f}" if isinstance(value, float) else f"{key:45s} {value}")


if __name__ == "__main__":
    main(sys.argv[1:])
