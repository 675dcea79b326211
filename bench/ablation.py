"""Benchmark: the paper's ablation table (VAPO, arXiv 2504.05118, section 4) re-run in miniature, with controls.

    python bench/ablation.py                        # the demo: 11 rows x 3 seeds
    python bench/ablation.py --preset long          # the long chains: 3 seeds a row, 5 for the four algorithms
    python bench/ablation.py --quick [--preset long]   # every row for 2 steps, 1 seed: proves each row still runs
    python bench/ablation.py --rows VAPO GRPO --seeds 0 1 2 [--report]

Rows (ROWS): the paper's baselines (`--algo ppo|grpo|dapo`), VAPO, VAPO without each of its seven techniques, and
controls that tell VAPO from self-imitation of its correct samples (CONTROLS). Every run is `python vapo.py --preset
P --seed S <the row's options>` at the same budget of generated samples (SWEEPS), evaluated at equal sample counts,
in its own process on one thread, --jobs at a time, the paper's main claims first (FIRST_TIER). The rows that
switch one technique off start from VAPO's pretrained critic of the same seed. A finished run is read back and an
interrupted one resumed, so a sweep continues where it stopped. --preset long then judges each run's final critic
and policy once (diagnostics.json in its folder: common.bias_table, common.judge_policy). Writes ablation.md (the
tables), ablation.json (every row and seed), ablation.png and (long) views.png into --out. docs/results.md ("The
paper's comparison, and self-imitation") has the long sweep's command, its table and what it shows.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

import common  # (puts the repository on the path)
from machinery import plots
from machinery import task
from common import POLICY_PROBLEMS, SWEEPS, judge_policy
from config import PRESETS
from machinery.models import load_value_model
from rollout import score_rollout

ALGORITHMS = ("PPO", "GRPO", "DAPO", "VAPO")
FIRST_TIER = ALGORITHMS + ("w/o Value-Pretraining", "w/o Decoupled-GAE")  # the paper's main claims, run first
# SWEEPS (common.py): per preset, the RL steps of a row without dynamic sampling, the evaluations along the
# budget, the held-out sampling and the algorithms' extra seeds
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
    # The controls that tell VAPO from self-imitation (not in the paper): each modifies the row it names, at that
    # row's settings. "VAPO mu 0" is "w/o Positive Example LM Loss" (the same options); the NLL's mu is the preset's.
    ("GRPO token-level", "-", ["--algo", "grpo", "--token-level-loss"]),
    ("DAPO equal updates", "-", ["--algo", "dapo"]),  # as many updates as the others: more samples (EQUAL_UPDATES)
    ("GRPO + NLL", "-", ["--algo", "grpo", "--positive-nll"]),
    ("PPO + NLL", "-", ["--algo", "ppo", "--positive-nll"]),
    ("VAPO mu 0.1", "-", ["--mu", "0.1"]),
    ("NLL only (online RAFT)", "-", ["--algo", "grpo", "--positive-nll", "--no-policy-gradient"]),
]
SHARES_CRITIC = {"w/o Decoupled-GAE", "w/o Length-adaptive GAE", "w/o Clip-Higher", "w/o Token-level Loss",
                 "w/o Positive Example LM Loss", "w/o Group-Sampling", "VAPO mu 0.1"}
EQUAL_UPDATES = {"DAPO equal updates"}  # the budget in steps, not in samples: --max-samples left off
CONTROLS = [r for r, paper, _ in ROWS if paper == "-"]
# Each algorithm's own actor learning rate, where its sweep on the validation split (bench/long_study.py --tier 5
# at commit 758a9d0: 5e-6, 1.5e-5 and 5e-5, one seed each, the best mean of validation greedy and avg@2) picked
# another than the preset's; every row that modifies an algorithm (FAMILY) runs at that algorithm's rate, and its
# run folders say so.
ACTOR_LR = {"demo": {}, "long": {"PPO": "5e-6"}}
FAMILY = {"PPO + NLL": "PPO", "GRPO token-level": "GRPO", "GRPO + NLL": "GRPO", "DAPO equal updates": "DAPO"}
COLLAPSE_LENGTH = 0.8  # a final greedy length below this share of the base's counts as a length collapse
GAINS = (0.05, 0.10, 0.20)  # held-out avg@k gains (fractions) whose wall time to reach is reported


def slug(row: str) -> str:
    """A row's name as a folder name: "w/o Clip-Higher" -> "w-o-clip-higher", "GRPO + NLL" -> "grpo-nll"."""
    return "-".join("".join(c if c.isalnum() else " " for c in row.lower()).split())


def actor_lr(row: str, preset: str) -> str | None:
    """The actor lr of row's algorithm family when its own sweep picked another than the preset's (ACTOR_LR)."""
    return ACTOR_LR[preset].get(FAMILY.get(row, row))


def run_folder(out: str, row: str, seed: int, preset: str) -> str:
    """One run's folder: the row's slug, its actor lr when that is not the preset's ("ppo-lr5e-6-s0"), the seed."""
    lr = actor_lr(row, preset)
    return os.path.join(out, f"{slug(row)}{f'-lr{lr}' if lr else ''}-s{seed}")


def row_args(row: str, options: list[str], seed: int, out: str, sweep_args: list[str]) -> list[str]:
    """The vapo.py options of one run: the sweep's, the row's (its family's actor lr), and for the rows
    that share it VAPO's pretrained critic of the same seed."""
    if row in EQUAL_UPDATES:  # the preset's number of updates, whatever the samples they take
        i = sweep_args.index("--max-samples")
        sweep_args = sweep_args[:i] + sweep_args[i + 2:]
    preset = sweep_args[sweep_args.index("--preset") + 1]
    lr = actor_lr(row, preset)
    args = ["--seed", str(seed), "--output-dir", run_folder(out, row, seed, preset), *sweep_args, *options,
            *(["--actor-lr", lr] if lr else [])]
    if row in SHARES_CRITIC:
        args += ["--value-model", os.path.join(run_folder(out, "VAPO", seed, preset), "critic_pretrained"),
                 "--no-value-pretraining"]
    return args


def run_row(job) -> float | None:
    """Run one (row, seed) unless it has finished (then None, else its wall seconds)."""
    row, options, seed, out, sweep_args = job
    args = row_args(row, options, seed, out, sweep_args)
    run_dir = args[args.index("--output-dir") + 1]
    if row in SHARES_CRITIC:  # wait for VAPO's run of this seed to have pretrained the critic (or to have ended)
        vapo_dir = run_folder(out, "VAPO", seed, sweep_args[sweep_args.index("--preset") + 1])
        while not (os.path.exists(os.path.join(vapo_dir, "critic_pretrained", "config.json"))
                   or os.path.exists(os.path.join(vapo_dir, "wall_seconds"))):
            time.sleep(5)
    wall = common.run_vapo(f"{row} seed {seed}", args, run_dir)
    if common.finished(run_dir):  # the previous checkpoint is only for a resume: 24 MB a run at --preset long
        shutil.rmtree(os.path.join(run_dir, "checkpoint.prev"), ignore_errors=True)
    return wall


def jobs_in_order(chosen: list[str], seeds: list[int], algorithm_seeds: list[int]) -> list[tuple[str, int]]:
    """(row, seed) in the order they run: FIRST_TIER, the other rows, the algorithms' extra seeds; VAPO
    first within each seed's group (the shared critics come from its runs)."""
    tiers = [([r for r in chosen if r in FIRST_TIER], seeds), ([r for r in chosen if r not in FIRST_TIER], seeds),
             ([r for r in chosen if r in ALGORITHMS], [s for s in algorithm_seeds if s not in seeds])]
    out = []
    for rows, tier_seeds in tiers:
        for s in tier_seeds:
            out += [(r, s) for r in sorted(rows, key=lambda r: r != "VAPO")]
    return out


def curve(run_dir: str) -> list[tuple[int, float, float]]:
    """(generated samples, held-out avg@k, held-out greedy) at each evaluation of a run."""
    points, generated = [], 0
    for r in common.read_records(run_dir):
        generated += r.get("samples_generated", 0)
        if "eval/acc_greedy" in r:
            points.append((generated, r[f"eval/acc_{common.sampled_measure(r)}"], r["eval/acc_greedy"]))
    return points


def long_band(record: dict, measure: str) -> float | None:
    """The mean held-out accuracy (measure: "avg@4", "greedy") over the bands of 21 steps and more; None
    without bands (the demo)."""
    vals = [v for k, v in record.items() if k.startswith(f"eval/acc_{measure}_steps_") and
            int(k.rsplit("_", 1)[1].split("-")[0]) > 20]
    return statistics.mean(vals) if vals else None


def run_figures(run_dir: str) -> dict:
    """What one finished run shows beyond common.summarise_run: means over its RL steps (all, first and
    last five) of what the techniques act on, held-out accuracy by band, its curves against generated samples."""
    records = common.read_records(run_dir)
    steps, evals = common.rl_steps(records), common.evaluations(records)
    mean = common.mean_of

    out = {k: mean(steps, k) for k in ("explained_variance", "ev_first_tenth", "ev_rest", "advantage_first_tenth",
                                       "advantage_rest", "lam_policy", "clip_frac", "clip_frac_low",
                                       "clip_frac_high", "approx_kl", "entropy", "response_len", "train_acc",
                                       "groups_all_same")}
    for k in ("entropy", "response_len", "train_acc", "explained_variance"):
        out[f"{k}_first5"], out[f"{k}_last5"] = mean(steps[:5], k), mean(steps[-5:], k)
    k = common.sampled_measure(evals[0])
    bands = sorted({key.rsplit("_", 1)[1] for key in evals[0] if key.startswith(f"eval/acc_{k}_steps_")},
                   key=lambda b: int(b.split("-")[0]))
    out["bands"] = {b: {m: (evals[0][f"eval/acc_{m}_steps_{b}"], evals[-1][f"eval/acc_{m}_steps_{b}"])
                        for m in (k, "greedy")} for b in bands}
    out["long_chains"] = {m: (long_band(evals[0], m), long_band(evals[-1], m)) for m in (k, "greedy")}
    generated, length_curve, eval_curve, step_ids = 0, [], [], {id(r) for r in steps}
    for r in records:
        generated += r.get("samples_generated", 0)
        if id(r) in step_ids:
            length_curve.append((generated, r["response_len"]))
        if "eval/acc_greedy" in r:
            eval_curve.append({"samples": generated, "seconds": r["time/elapsed"], k: r[f"eval/acc_{k}"],
                               "greedy": r["eval/acc_greedy"], "long_" + k: long_band(r, k),
                               "length_greedy": r.get("eval/response_len_greedy"),
                               "length_" + k: r.get(f"eval/response_len_{k}")})
    out["length_curve"], out["eval_curve"] = length_curve, eval_curve
    return out


def final_figures(run_dir: str, responses, problems: int | None = None) -> dict:
    """{"critic": judge_critic or None, "policy": judge_policy, "pass_again"} of a run's final models,
    cached in run_dir/diagnostics.json."""
    cache = os.path.join(run_dir, "diagnostics.json")
    if os.path.exists(cache):
        return common.read_json(cache)
    cfg = common.read_json(os.path.join(run_dir, "config.json"))
    critic = os.path.join(run_dir, "checkpoint", "critic")
    has_critic = os.path.exists(os.path.join(critic, "config.json"))
    figures = {"critic": judge_critic(critic, responses, cfg) if has_critic else None,
               "policy": judge_policy(os.path.join(run_dir, "checkpoint", "policy"), problems or POLICY_PROBLEMS),
               "pass_again": pass_again(run_dir)}
    common.write_json(cache, figures)
    return figures


def pass_again(run_dir: str) -> dict | None:
    """A run made before pass@k was logged: its final evaluation made again (common.evaluate_again),
    kept only if the logged avg@k and greedy come out the same; else (or if it logged pass@k) None."""
    last = [r for r in common.read_records(run_dir) if "eval/acc_greedy" in r][-1]
    k = common.sampled_measure(last)
    if f"eval/pass@{k[4:]}" in last or not os.path.exists(os.path.join(run_dir, "checkpoint", "policy")):
        return None
    again = common.evaluate_again(run_dir)
    same = all(abs(again[key] - last[key]) < 1e-9 for key in (f"eval/acc_{k}", "eval/acc_greedy"))
    return {"pass_final": again.get(f"eval/pass@{k[4:]}"), "same_responses": same} if same else None


def judge_critic(folder: str, responses, cfg: dict) -> dict:
    """common.bias_table of the critic in folder on common.sample_set's responses, under the run's lambda."""
    _, rollout, rewards, decisive = responses
    critic = load_value_model(folder, dtype=torch.float32)
    values = score_rollout(None, critic, rollout, micro_batch_size=16)["values"]
    lam = "adaptive" if cfg.get("length_adaptive", True) else str(cfg.get("lam_policy_fixed", 0.95))
    table = common.bias_table(values, rewards, rollout.response_mask, cfg.get("alpha", 0.5), decisive,
                              lam_fixed=cfg.get("lam_policy_fixed", 0.95))
    return {"lambda": lam, "explained_variance": table["explained_variance"],
            "ev_by_fifth": [c["explained_variance"] for c in table["by_fifth"]],
            "bias_by_fifth": [c["bias"] for c in table["by_fifth"]],
            "advantage_first_tenth": table[f"advantage_first_tenth_lambda_{lam}"],
            "advantage_rest": table[f"advantage_rest_lambda_{lam}"],
            "credit": table[f"credit_lambda_{lam}"], "credit_td": table["credit_lambda_0 (TD error)"]}


def summarise(row: str, paper: float, run_dirs: list[str], responses=None, problems: int | None = None) -> dict:
    """A row over its seeds: the means and spreads of the table, the diagnostics, and every seed's figures."""
    runs = [(d, common.summarise_run(d)) for d in run_dirs]
    done = [(d, s) for d, s in runs if s is not None]
    out = {"row": row, "paper_aime24": paper, "seeds": len(done), "dir": os.path.dirname(run_dirs[0]) if run_dirs
           else None}
    if not done:
        return out
    spread = common.mean_sd  # (mean, SD) over seeds

    def auc(d, column=2):  # mean held-out accuracy over the sample budget (trapezoids), 0..1: greedy, or avg@k (1)
        pts = [(p[0], p[column]) for p in curve(d)]
        area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(pts, pts[1:]))
        return area / max(pts[-1][0] - pts[0][0], 1)

    figures = {d: run_figures(d) for d, _ in done}
    final = {d: final_figures(d, responses, problems) for d, _ in done} if responses is not None else {}
    critics = {d: f["critic"] for d, f in final.items()}
    for d, s in done:  # a run from before pass@k was logged: its final evaluation made again (pass_again)
        again = final.get(d, {}).get("pass_again")
        if s["pass_final"] != s["pass_final"] and again:
            s["pass_final"] = again["pass_final"]
    out["per_seed"] = [{"run": os.path.basename(d), **s, "greedy_auc": auc(d), "avg_auc": auc(d, 1), **figures[d],
                        "critic_after_rl": critics.get(d), "policy_after_rl": final.get(d, {}).get("policy")}
                       for d, s in done]
    if final:
        out["policy_after_rl"] = {m: {key: spread([f["policy"][m].get(key) for f in final.values()]) for key in (
            "accuracy", "habit_rate", "lookup_rate", "other_error_rate", "shortcut_rate", "first_misread",
            "first_habit")} for m in ("greedy", "sampled")}
    keys = ["explained_variance_first5", "explained_variance", "ev_first_tenth", "ev_rest", "advantage_first_tenth",
            "advantage_rest", "lam_policy", "clip_frac_low", "clip_frac_high", "approx_kl", "entropy_first5",
            "entropy_last5", "response_len_first5", "response_len_last5", "train_acc_first5", "train_acc_last5",
            "groups_all_same"]
    out["diagnostics"] = {key: spread([figures[d][key] for d, _ in done]) for key in keys}
    k = done[0][1]["k"]
    long_gain = [None if f["long_chains"][k][0] is None else f["long_chains"][k][1] - f["long_chains"][k][0]
                 for f in figures.values()]
    short = [f["bands"]["1-10"][k] for f in figures.values() if "1-10" in f["bands"]]
    out["diagnostics"] |= {"short_gain": spread([b - a for a, b in short]), "long_gain": spread(long_gain)}
    judged = [c for c in critics.values() if c is not None]
    if judged:
        out["critic_after_rl"] = {key: spread([c[key] for c in judged]) for key in (
            "explained_variance", "advantage_first_tenth", "advantage_rest", "credit", "credit_td")}
        out["critic_after_rl"]["ev_by_fifth"] = [statistics.mean(c["ev_by_fifth"][i] for c in judged)
                                                 for i in range(5)]
    out.update({"avg_final": spread([s["avg_final"] for _, s in done]),
                "avg_gain": spread([s["avg_gain"] for _, s in done]),
                "greedy_final": spread([s["greedy_final"] for _, s in done]),
                "greedy_gain": spread([s["greedy_gain"] for _, s in done]),
                "len_ratio": spread([s["len_ratio"] for _, s in done]),
                "greedy_auc": spread([auc(d) for d, _ in done]),
                "avg_auc": spread([auc(d, 1) for d, _ in done]),
                "samples": statistics.mean(curve(d)[-1][0] for d, _ in done),
                "sampled_len_ratio": spread([f["eval_curve"][-1]["length_" + k] / f["eval_curve"][0]["length_" + k]
                                             for f in figures.values()]),
                "collapsed": sum(s["len_ratio"] < COLLAPSE_LENGTH for _, s in done),
                "below_base": sum(s["avg_gain"] < 0 for _, s in done)})
    return out


def pm(m, scale: float = 100, fmt: str = ".1f") -> str:
    """A (mean, std) pair as "mean +- std" (times scale); "-" for none."""
    return "-" if m is None else f"{scale * m[0]:{fmt}} +- {scale * m[1]:{fmt}}"


def verdict(row: dict, vapo: dict | None, key: str = "avg_final") -> str:
    """The paper's ordering "VAPO above this row" on `key`: "reproduced" when VAPO's mean is above by
    more than twice the standard error of the difference, "reversed" when below by as much, else "not separated";
    "-" for VAPO itself or rows without two seeds."""
    if vapo is None or row is vapo or row.get(key) is None or vapo.get(key) is None or min(row["seeds"],
                                                                                         vapo["seeds"]) < 2:
        return "-"
    diff = vapo[key][0] - row[key][0]
    se = (vapo[key][1] ** 2 / vapo["seeds"] + row[key][1] ** 2 / row["seeds"]) ** 0.5
    word = "reproduced" if diff > 2 * se else "reversed" if diff < -2 * se else "not separated"
    return f"{word} ({100 * diff:+.1f} +- {100 * se:.1f})"


def table(rows: list[dict]) -> str:
    """The results table: each row beside the paper's figure, and the verdict on VAPO above it."""
    vapo = next((r for r in rows if r["row"] == "VAPO" and "avg_final" in r), None)
    lines = ["| row | paper (AIME24 avg@32) | seeds | held-out avg@k, final | gain | avg@k, mean over the budget | "
             "greedy, final | gain | greedy, mean over the budget | length / base: greedy, sampled | samples | "
             "length collapsed | avg@k below base | VAPO above it? avg@k final | avg@k over the budget | "
             "greedy over the budget |", "|---|" + "---|" * 15]
    for r in rows:
        if "avg_final" not in r:
            lines.append(f"| {r['row']} | {r['paper_aime24']} | 0 | not run |" + " |" * 12)
            continue
        lines.append(f"| {r['row']} | {r['paper_aime24']} | {r['seeds']} | {pm(r['avg_final'])} | "
                     f"{pm(r['avg_gain'])} | {pm(r['avg_auc'])} | {pm(r['greedy_final'])} | {pm(r['greedy_gain'])} | "
                     f"{pm(r['greedy_auc'])} | {pm(r['len_ratio'], 1, '.2f')}, "
                     f"{pm(r['sampled_len_ratio'], 1, '.2f')} | "
                     f"{r['samples']:.0f} | {r['collapsed']} of {r['seeds']} | {r['below_base']} of {r['seeds']} | "
                     f"{verdict(r, vapo)} | {verdict(r, vapo, 'avg_auc')} | {verdict(r, vapo, 'greedy_auc')} |")
    return "\n".join(lines)


def imitation_table(rows: list[dict]) -> str:
    """What tells a policy-gradient learner from self-imitation: pass@k beside avg@k, updates, samples,
    the NLL's weight, entropy, the critic's EV against the step-count floor's."""
    def seeds(r, key, scale=1.0):
        vals = [scale * p[key] for p in r.get("per_seed", []) if isinstance(p.get(key), (int, float))
                and p[key] == p[key]]
        return common.mean_sd(vals)

    def updates(r):
        return common.mean_sd([sum(1 for x in common.read_records(os.path.join(r["dir"], p["run"]))
                                   if "reward_mean" in x and "value_pretrain_step" not in x)
                               for p in r.get("per_seed", [])]) if r.get("dir") else None

    def setup(r):  # what the row trains with, from its first run's config.json
        c = common.read_json(os.path.join(r["dir"], r["per_seed"][0]["run"], "config.json"))
        if not c.get("policy_gradient", True):
            return f"NLL mu {c['mu']:g} alone: no policy gradient, no critic, actor lr {c['actor_lr']:g}"
        return ", ".join([("GRPO's group advantage" if c["group_advantage"] else "a critic"),
                          ("token-level" if c["token_level_loss"] else "per-sample") + " loss",
                          f"NLL mu {c['mu']:g}" if c["positive_nll"] else "no NLL", f"actor lr {c['actor_lr']:g}"]
                         + ([] if c.get("policy_gradient", True) else ["no policy gradient"]))

    def bootstrapped(r):  # a critic whose targets are GAE returns with lambda < 1: they hold its own values
        c = common.read_json(os.path.join(r["dir"], r["per_seed"][0]["run"], "config.json"))
        return not c["group_advantage"] and (c["lam_critic"] if c["decoupled_gae"] else 0.0) < 1

    lines = ["| row | trains with | seeds | pass@k final | avg@k final | greedy final | updates | samples | "
             "NLL weight | entropy, last 5 | critic EV of its target during RL | step-count floor | critic's EV of "
             "V\\* |", "|---|" + "---|" * 12]
    for r in rows:
        if "avg_final" not in r:
            continue
        mark = " (b)" if bootstrapped(r) else ""
        lines.append(f"| {r['row']} | {setup(r)} | {r['seeds']} | {pm(seeds(r, 'pass_final'))} | {pm(r['avg_final'])} | "
                     f"{pm(r['greedy_final'])} | {pm(updates(r), 1, '.0f')} | {r['samples']:.0f} | "
                     f"{pm(seeds(r, 'nll_weight'), 1, '.1f')} | {pm(r['diagnostics']['entropy_last5'], 1, '.3f')} | "
                     f"{pm(seeds(r, 'ev'), 1, '.2f')}{mark} | {pm(seeds(r, 'ev_floor'), 1, '.2f')}{mark} | "
                     f"{pm(seeds(r, 'ev_critic_exact'), 1, '.2f')} |")
    if not any(bootstrapped(r) for r in rows if "avg_final" in r):
        return "\n".join(lines)
    return "\n".join(lines) + ("\n\n(b): the critic's targets are GAE returns at lambda < 1 (PPO's 0.95), which hold "
                               "its own values: its EV and the floor's are against those targets, not the return; "
                               "the share of V\\*'s variance it explains compares every critic alike.")


DIAGNOSTICS = [  # (key, header, scale, format)
    ("explained_variance_first5", "EV, first 5 steps", 1, ".2f"), ("explained_variance", "EV", 1, ".2f"),
    ("ev_first_tenth", "EV, first tenth", 1, ".2f"), ("ev_rest", "EV, rest", 1, ".2f"),
    ("advantage_first_tenth", "raw A, first tenth", 1, ".3f"), ("advantage_rest", "raw A, rest", 1, ".3f"),
    ("lam_policy", "lambda_policy", 1, ".3f"), ("clip_frac_low", "clipped low (%)", 100, ".2f"),
    ("clip_frac_high", "clipped high (%)", 100, ".2f"), ("groups_all_same", "groups all alike (%)", 100, ".0f"),
    ("entropy_first5", "entropy, first 5", 1, ".3f"),
    ("entropy_last5", "entropy, last 5", 1, ".3f"), ("response_len_first5", "length, first 5", 1, ".0f"),
    ("response_len_last5", "length, last 5", 1, ".0f"), ("short_gain", "held-out 1-10 steps, gain", 100, ".1f"),
    ("long_gain", "held-out 21-40 steps, gain", 100, ".1f")]


def diagnostics_table(rows: list[dict]) -> str:
    """What the techniques act on, per row (DIAGNOSTICS; mean +- std over seeds)."""
    lines = ["| row | " + " | ".join(h for _, h, _, _ in DIAGNOSTICS) + " |", "|---|" + "---|" * len(DIAGNOSTICS)]
    for r in rows:
        d = r.get("diagnostics")
        if d is not None:
            lines.append(f"| {r['row']} | " + " | ".join(pm(d[k], sc, f) for k, _, sc, f in DIAGNOSTICS) + " |")
    return "\n".join(lines)


def critic_table(rows: list[dict], start: dict | None) -> str:
    """Each row's final critic (and the critics at the start) on the fixed responses."""
    lines = ["| critic | EV | EV by fifth | raw A, first tenth | raw A, rest | credit at decisive tokens | "
             "credit, TD errors |", "|---|---|---|---|---|---|---|"]
    for name, c in (start or {}).items():
        lines.append(f"| {name} | {c['explained_variance']:.2f} | " + " / ".join(f"{x:.2f}" for x in c["ev_by_fifth"])
                     + f" | {c['advantage_first_tenth']:.3f} | {c['advantage_rest']:.3f} | {c['credit']:.2f} | "
                     f"{c['credit_td']:.2f} |")
    for r in rows:
        c = r.get("critic_after_rl")
        if c is not None:
            lines.append(f"| {r['row']}, after RL | {pm(c['explained_variance'], 1, '.2f')} | "
                         + " / ".join(f"{x:.2f}" for x in c["ev_by_fifth"]) +
                         f" | {pm(c['advantage_first_tenth'], 1, '.3f')} | {pm(c['advantage_rest'], 1, '.3f')} | "
                         f"{pm(c['credit'], 1, '.2f')} | {pm(c['credit_td'], 1, '.2f')} |")
    return "\n".join(lines)


def policy_table(rows: list[dict], base: dict | None) -> str:
    """Each row's final policy (and the base model) on POLICY_PROBLEMS held-out problems (judge_policy)."""
    keys = ("accuracy", "habit_rate", "lookup_rate", "other_error_rate", "shortcut_rate", "first_misread",
            "first_habit")
    lines = ["| policy | " + " | ".join(f"{m}: {k.replace('_', ' ')} (%)" for m in ("greedy", "sampled") for k in keys)
             + " |", "|---|" + "---|" * 2 * len(keys)]
    if base is not None:
        lines.append("| base model | " + " | ".join(f"{100 * base[m][k]:.1f}" if k in base[m] else "-"
                                                   for m in ("greedy", "sampled") for k in keys) + " |")
    for r in rows:
        p = r.get("policy_after_rl")
        if p is not None:
            lines.append(f"| {r['row']}, after RL | " + " | ".join(pm(p[m].get(k)) for m in ("greedy", "sampled")
                                                                 for k in keys) + " |")
    return "\n".join(lines)


def seed_table(rows: list[dict], others: dict[str, list[tuple[str, dict]]] | None = None) -> str:
    """Every run on a line: its held-out curves, its final policy's errors, clipped shares and final
    critic; `others` (name -> [(folder, run_figures)], e.g. TRL's runs) get their curves only."""
    lines = ["| run | greedy % at each evaluation | avg@k % | greedy misreads (% of steps) | first error a misread "
             "(% of greedy responses) | sampled habit (% of borrow steps) | clipped low / high (%) | "
             "critic EV / credit |", "|---|" + "---|" * 7]

    def curves(f):
        k = next(key for key in f["eval_curve"][0] if key.startswith("avg@"))
        return (" -> ".join(f"{100 * e['greedy']:.1f}" for e in f["eval_curve"]),
                " -> ".join(f"{100 * e[k]:.1f}" for e in f["eval_curve"]))

    def pct(x):  # None: a run without a policy update (e.g. DAPO with no group of varied rewards)
        return "-" if x is None else f"{100 * x:.2f}"

    for r in rows:
        for p in r.get("per_seed", []):
            pol, c = p.get("policy_after_rl"), p.get("critic_after_rl")
            judged = (f"{100 * pol['greedy']['lookup_rate']:.1f} | {100 * pol['greedy']['first_misread']:.1f} | "
                      f"{100 * pol['sampled']['habit_rate']:.1f}") if pol else "| |"
            critic = f"{c['explained_variance']:.2f} / {c['credit']:.2f}" if c else "no critic"
            lines.append(f"| {r['row']} ({p['run'].rsplit('-s', 1)[1]}) | {' | '.join(curves(p))} | {judged} | "
                         f"{pct(p['clip_frac_low'])} / {pct(p['clip_frac_high'])} | {critic} |")
    for name, figs in (others or {}).items():
        for folder, f in figs:
            run = os.path.basename(os.path.normpath(folder))
            lines.append(f"| {name} ({run}) | {' | '.join(curves(f))} | | | | | |")
    return "\n".join(lines)


def plot(rows: list[dict], out: str, others: dict[str, list[dict]] | None = None) -> None:
    """ablation.png: held-out accuracy (and, with bands, on the long chains) and response length against
    generated samples, mean and min-max over seeds per row; `others` in black, dotted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    seeds_of = [r.get("per_seed", []) for r in rows]
    k = k_of(rows)
    banded = any(e.get(f"long_{k}") is not None for ps in seeds_of for p in ps for e in p["eval_curve"])
    panels = [(k, f"held-out {k}"), ("greedy", "held-out greedy")] + (
        [(f"long_{k}", f"held-out {k}, chains of 21-40 steps")] if banded else []) + [
        (f"length_{k}", f"held-out {k}: mean response length (tokens)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.6))
    drawn = list(zip([r["row"] for r in rows], seeds_of, [f"C{i % 10}" for i in range(len(rows))]))
    drawn += [(name, figs, "black") for name, figs in (others or {}).items() if figs]
    for name, per_seed, colour in drawn:
        if not per_seed:
            continue
        style = "-" if name in ALGORITHMS else ":" if colour == "black" else "--"
        for ax, (key, _) in zip(axes, panels):
            n = min(len(p["eval_curve"]) for p in per_seed)
            xs = [statistics.mean(p["eval_curve"][j]["samples"] for p in per_seed) for j in range(n)]
            ys = [[p["eval_curve"][j][key] for p in per_seed] for j in range(n)]
            ax.plot(xs, [statistics.mean(y) for y in ys], style, color=colour, marker="o", ms=3,
                    label=f"{name} ({len(per_seed)})")
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=colour, alpha=0.1)
    for ax, (key, title) in zip(axes, panels):
        ax.set(title=title, xlabel="generated samples")
        if not key.startswith("length"):
            ax.set_ylim(0, 1.02)
    axes[-1].legend(fontsize=7, title="row (seeds)", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


VIEWS = (("VAPO", "adv_adaptive"), ("PPO", "adv_0.95"), ("GRPO", "adv_group"))  # the rows drawn side by side


def views_side_by_side(folder: str, seed: int, out: str, preset: str) -> str | None:
    """One probe response (the longest wrong one) at the last evaluation of VAPO, PPO and GRPO of one
    seed, side by side, the decisive tokens marked; None unless all three runs have their views."""
    columns = []
    for row, adv in VIEWS:
        records = plots.read_tokens(run_folder(folder, row, seed, preset))
        if not records:
            return None
        columns.append((row, records[-1], adv))
    recorded = [i for i, p in enumerate(columns[0][1]["probes"]) if "tokens" in p]
    wrong = [i for i in recorded if columns[0][1]["probes"][i]["reward"] < 0] or recorded
    pick = max(wrong, key=lambda i: columns[0][1]["probes"][i]["length"])
    probe = columns[0][1]["probes"][pick]
    if any(rec["probes"][pick].get("tokens") != probe["tokens"] for _, rec, _ in columns):
        print(f"views: the runs of seed {seed} do not share their probes (other base models or lengths): not drawn")
        return None
    ends = [len("".join(probe["pieces"][:t + 1])) for t in range(probe["length"])]
    marks = [sum(e <= c for e in ends) for c in task.borrow_digits("".join(probe["pieces"]))]
    plots.compare_figure([(f"{row} seed {seed}", rec, rec["probes"][pick], adv) for row, rec, adv in columns], out,
                         marks)
    return out


def k_of(rows: list[dict]) -> str:
    """The name of the held-out sampled measure of the summarised rows ("avg@4")."""
    return next((p["k"] for r in rows for p in r.get("per_seed", [])), "avg@k")


def time_to_learn(rows: list[dict], others: dict[str, list[dict]] | None = None) -> str:
    """Per row (and `others`), for each gain of GAINS on held-out avg@k: the runs that reached it, and
    the median time/elapsed at that evaluation."""
    runs = {r["row"]: r["per_seed"] for r in rows if r.get("per_seed")}
    runs |= {name: figs for name, figs in (others or {}).items() if figs}
    if not runs:
        return ""
    first = next(iter(runs.values()))[0]["eval_curve"][0]
    k = next(key for key in first if key.startswith("avg@"))
    lines = ["| row | runs | " + " | ".join(f"+{100 * g:.0f} points: runs, median s" for g in GAINS) + " |",
             "|---|---|" + "---|" * len(GAINS)]
    for name, figs in runs.items():
        cells = []
        for g in GAINS:
            times = [next((e["seconds"] for e in p["eval_curve"] if e[k] - p["eval_curve"][0][k] >= g - 1e-9), None)
                     for p in figs]
            got = [t for t in times if t is not None]
            cells.append(f"{len(got)}" + (f", {statistics.median(got):.0f}" if got else ""))
        lines.append(f"| {name} | {len(figs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="demo", choices=sorted(SWEEPS), help="the regime (vapo.py's preset)")
    ap.add_argument("--rows", nargs="+", default=[r for r, _, _ in ROWS], help="rows to run (default: all)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of every row")
    ap.add_argument("--algorithm-seeds", type=int, nargs="*", default=None, help="more seeds of the four "
                    "algorithms, run last (default: long 3 4, demo none)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps of a row without dynamic sampling (the budget "
                    "is STEPS x the preset's samples per step; default: demo 24, long 40)")
    ap.add_argument("--evaluations", type=int, default=None, help="held-out evaluations along the budget, after "
                    "the one at the start (default: demo 4, long 2; 1: at the start and the end only)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    ap.add_argument("--out", default=None, help="folder of the runs and reports (default: runs/ablation, or "
                    "runs/ablation-long)")
    ap.add_argument("--quick", action="store_true", help="2 steps of every row, seed 0, tiny evaluations")
    ap.add_argument("--report", action="store_true", help="run nothing: write the reports of the runs finished in "
                    "--out (a sweep still under way, or one that stopped before its end)")
    ap.add_argument("--trl", nargs="*", default=[], help="folders of bench/vs_trl.py runs (TRL's "
                    "GRPOTrainer on the same budget), compared in the time to learn")
    args = ap.parse_args()
    unknown = set(args.rows) - {r for r, _, _ in ROWS}
    if unknown:
        raise SystemExit(f"--rows: unknown {sorted(unknown)}; the rows are {[r for r, _, _ in ROWS]}")
    sweep = SWEEPS[args.preset]
    args.out = args.out or os.path.join(common.ROOT, "runs", "ablation" if args.preset == "demo" else
                                        f"ablation-{args.preset}")
    steps = args.steps or sweep["steps"]
    algorithm_seeds = sweep["algorithm_seeds"] if args.algorithm_seeds is None else args.algorithm_seeds
    per_step = PRESETS[args.preset]["prompts_per_step"] * PRESETS[args.preset]["samples_per_prompt"]
    sweep_args = ["--preset", args.preset]
    if args.quick:
        args.seeds, algorithm_seeds, steps, per_step = [0], [], 2, 2 * 4
        held_out = "4" if args.preset == "demo" else "40"  # long: one prompt of each step count, every band
        sweep_args += ["--eval-every-samples", "8", "--eval-prompts", held_out, "--eval-samples", "1",
                       "--value-pretrain-steps", "1", "--prompts-per-step", "2", "--samples-per-prompt", "4",
                       "--mini-batch-size", "8", "--micro-batch-size", "8", "--dynamic-sampling-rounds", "1",
                       "--max-new-tokens", "32" if args.preset == "demo" else "48", "--eval-batch-size", held_out]
        if PRESETS[args.preset].get("critic_mini_batch_size"):  # the preset's critic mini-batch: the whole tiny batch
            sweep_args += ["--critic-mini-batch-size", "8"]
        if args.preset == "demo":  # the demo's sweep never reads the views (only the long one draws them side by
            sweep_args += ["--no-token-views"]  # side), and drawing them is most of a 2-step row's time
    else:
        sweep_args += ["--eval-every-samples", str(steps * per_step // (args.evaluations or sweep["evaluations"]))]
        sweep_args += ["--eval-prompts", str(sweep["eval_prompts"])] if sweep["eval_prompts"] else []
        sweep_args += ["--eval-samples", str(sweep["eval_samples"])] if sweep["eval_samples"] else []
    budget = steps * per_step
    sweep_args += ["--steps", str(steps), "--max-samples", str(budget)]
    sweep_args += ["--save-every", "0"] if args.preset == "demo" else []  # long: the preset's, so a kill loses little
    started, machine = common.now(), common.machine()
    print(f"machine: {machine}\ndate: {started}\npreset: {args.preset}\n"
          f"budget: {budget} generated samples per run", flush=True)
    chosen = [(r, p, o) for r, p, o in ROWS if r in args.rows]
    if any(r in SHARES_CRITIC for r, _, _ in chosen) and "VAPO" not in args.rows:
        chosen = [ROWS[3]] + chosen  # the rows that share a critic need VAPO's runs
    options = {r: o for r, _, o in chosen}
    order = jobs_in_order([r for r, _, _ in chosen], args.seeds, algorithm_seeds)
    print(f"{len(order)} runs, {args.jobs} at a time, one thread each, into {args.out}", flush=True)
    t0 = time.perf_counter()
    walls = []
    if not args.report:
        with ThreadPoolExecutor(args.jobs) as pool:
            walls = list(pool.map(run_row, [(r, options[r], s, args.out, sweep_args) for r, s in order]))
    ran = [w for w in walls if w is not None]
    responses, start, base_policy = None, None, None
    if args.preset == "long":  # every critic judged on the same responses of the base model
        responses = common.sample_set("builtin-long", prompts=4 if args.quick else 32, samples=8)
        base_policy = judge_policy(common.folder_of("builtin-long"), 8 if args.quick else POLICY_PROBLEMS)
        start = {"reward model (PPO's and w/o Value-Pretraining's start)": judge_critic(
            common.folder_of("builtin-long-rm"), responses, {})}
        for s in args.seeds:
            folder = os.path.join(run_folder(args.out, "VAPO", s, args.preset), "critic_pretrained")
            if os.path.exists(os.path.join(folder, "config.json")):
                start[f"after value pretraining (VAPO seed {s})"] = judge_critic(folder, responses, {})
        mask = responses[1].response_mask
        start_note = (f"{responses[1].B} responses of the base model (8 per held-out problem), "
                      f"{100 * float(responses[3].sum() / mask.sum()):.1f}% of their tokens decisive; GRPO's group "
                      f"advantage puts a credit of {common.group_credit(responses[2], mask, responses[3], 8):.2f} "
                      f"on them")
    seeds_of = {r: sorted({s for rr, s in order if rr == r}) for r, _, _ in chosen}
    if args.report:
        done = {r: sum(common.finished(run_folder(args.out, r, s, args.preset)) for s in ss)
                for r, ss in seeds_of.items()}
        print("finished runs: " + ", ".join(f"{r} {done[r]} of {len(seeds_of[r])}" for r in done), flush=True)
    rows = [summarise(r, p, [run_folder(args.out, r, s, args.preset) for s in seeds_of[r]], responses,
                      8 if args.quick else POLICY_PROBLEMS) for r, p, _ in chosen]
    os.makedirs(args.out, exist_ok=True)
    trl_dirs = [d for d in args.trl if common.finished(d)]
    trl = [run_figures(d) for d in trl_dirs]
    plot(rows, os.path.join(args.out, "ablation.png"), {"TRL GRPOTrainer": trl})
    views = views_side_by_side(args.out, args.seeds[0], os.path.join(args.out, "views.png"), args.preset) if (
        args.preset == "long") else None
    report = (f"machine: {machine}\ndate: {started}; {time.perf_counter() - t0:.0f} s; {len(ran)} runs "
              f"run now ({sum(ran):.0f} s of runs), {len(walls) - len(ran)} read back from earlier"
              f"{' (--report: the runs finished in the folder, nothing run)' if args.report else ''}\n"
              f"preset: {args.preset}\n"
              f"{budget} generated samples per run; mean +- std over seeds\n\n{table(rows)}\n\n"
              f"diagnostics (mean +- std over seeds of each run's mean over its RL steps):\n\n"
              f"{diagnostics_table(rows)}\n\n"
              f"VAPO or self-imitation? (the controls; mean +- std over seeds):\n\n{imitation_table(rows)}\n")
    if responses is not None:
        report += (f"\nthe critics on one fixed set of responses ({start_note}):\n\n{critic_table(rows, start)}\n"
                   f"\nthe policies on {8 if args.quick else POLICY_PROBLEMS} held-out problems, what they get "
                   f"wrong:\n\n"
                   f"{policy_table(rows, base_policy)}\n")
    report += f"\nevery run:\n\n{seed_table(rows, {'TRL GRPOTrainer': list(zip(trl_dirs, trl))})}\n"
    if any(len(p["eval_curve"]) > 2 for r in rows for p in r.get("per_seed", [])):  # not with --evaluations 1
        report += (f"\ntime to learn (wall seconds to the first evaluation that gained as much held-out {k_of(rows)} "
                   f"over the base):\n\n{time_to_learn(rows, {'TRL GRPOTrainer': trl})}\n")
    else:
        report += "\n(no time to learn: one evaluation after the start, at the end of each run)\n"
    if views:
        report += f"\none probe response under VAPO, PPO and GRPO, side by side: {views}\n"
    print("\n" + report)
    with open(os.path.join(args.out, "ablation.md"), "w") as fh:
        fh.write(report)
    common.write_json(os.path.join(args.out, "ablation.json"), {
        "machine": machine, "date": started, "preset": args.preset, "seeds": seeds_of,
        "budget": budget, "vapo_options": sweep_args, "critics_at_start": start, "base_policy": base_policy,
        "trl": trl, "rows": rows})
    missing = [r["row"] for r in rows if r.get("seeds", 0) < len(seeds_of[r["row"]])]
    if missing and not args.report:
        raise SystemExit(f"rows that did not finish every seed: {missing} (see their stdout.log)")


if __name__ == "__main__":
    main()
