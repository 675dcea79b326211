"""The lab's experiment 8 (docs/lab.md, "When a critic pays"): how good a critic must be before its credit pays, on the
long chains. The oracle critics (vapo.py's --critic-oracle: V* of the current policy, degraded a known way) give
credit of known quality; the credit meter (machinery/exact_values.py, credit_figures) measures every run's credit
against V*'s exact advantages, critic or not; each arm's gain is plotted against its measured credit, beside GRPO's
and self-imitation's (NLL only).

    python bench/lab.py credit-calibration [--seeds 0 1 2] [--report]   # the meter of each critic, no RL
    python bench/lab.py credit-pilot | credit | credit-hard [--seeds 0 1 2] [--run [--jobs 2] | --report]
        # the oracle arm's learning rate on the validation split; the curve's runs; the runs on hard problems only

Every run is `python vapo.py --preset long` with its arm's options (the comparison's budget: 40 steps of 8 prompts x
8 samples), evaluated at the start and the end; its folder's metrics.jsonl holds the meter's figures of every step.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
from concurrent.futures import ThreadPoolExecutor

import torch

import common  # (puts the repository on the path)
import config
import vapo
from common import evaluate_policy, fitted_exact, folder_of, held_out, sample_set
from gae import gae, group_advantage, length_adaptive_lambda, terminal_rewards
from lab import LENGTH_BAND_NAMES, STEP_BANDS, draw, publish, publish_seeds
from losses import explained_variance, masked_whiten
from machinery import exact_values, task
from machinery.engines import HFEngine
from machinery.exact_values import credit_figures, first_error_tokens
from machinery.models import SingleProcess, load_policy, load_tokenizer, load_value_model
from reward import Verifier, arith_reward
from rollout import score_rollout

ALPHA = config.PRESETS["long"]["alpha"]
ORACLE_LRS = ("5e-6", "1.5e-5", "5e-5")  # the pilot's actor learning rates for the oracle arm (the lr sweep's)
ORACLE_LR = "1.5e-5"  # the pilot's pick (docs/lab.md, 8: written here after the pilot, before the curve's runs)
VALIDATION_SEED, VALIDATION_PROBLEMS = 1000, 256  # training-distribution problems no run trains on (seeds 0-4 do)
LAMBDA0 = ["--no-length-adaptive", "--lam-policy-fixed", "0"]
# held-out evaluation at the start and the end: 400 problems greedy, 200 of them x 2 sampled (the preset's 1,100 and
# 550 would be 40% of a run's time; the start is the same base for every arm of a seed)
EVAL = ["--eval-prompts", "400", "--eval-sampled-prompts", "200"]
NO_NLL = ["--no-positive-nll"]


def oracle(spec: str, *options: str) -> list[str]:
    return ["--critic-oracle", spec, "--actor-lr", ORACLE_LR, *options]


# --- the arms: (label, vapo.py options on top of --preset long) -------------------------------------------------------
CURVE_ARMS = [
    ("V* lambda 0", oracle("exact", *NO_NLL, *LAMBDA0)),
    ("V* preset lambda", oracle("exact", *NO_NLL)),
    ("V* lambda 1", oracle("exact", *NO_NLL, "--no-length-adaptive", "--lam-policy-fixed", "1")),
    ("MC 4 lambda 0", oracle("mc:4", *NO_NLL, *LAMBDA0)),
    ("MC 16 lambda 0", oracle("mc:16", *NO_NLL, *LAMBDA0)),
    ("V* + noise 0.3 lambda 0", oracle("exact+noise:0.3", *NO_NLL, *LAMBDA0)),
    ("V* lambda 0 + NLL", oracle("exact", *LAMBDA0)),
    ("GRPO token-level", ["--algo", "grpo", "--token-level-loss"]),
    ("NLL only", ["--algo", "grpo", "--positive-nll", "--no-policy-gradient"]),
    ("VAPO mu 0 (learned critic)", NO_NLL),
    ("VAPO", []),
]
HARD = ["--train-steps", "21-40"]
HARD_ARMS = [(label, options + HARD) for label, options in CURVE_ARMS
             if label in ("V* lambda 0", "GRPO token-level", "NLL only", "VAPO mu 0 (learned critic)")]
PILOT_ARMS = [(f"V* lambda 0, lr {lr}", ["--critic-oracle", "exact", *NO_NLL, *LAMBDA0, "--actor-lr", lr])
              for lr in ORACLE_LRS]
RL = {"credit-pilot": PILOT_ARMS, "credit": CURVE_ARMS, "credit-hard": HARD_ARMS}
ORACLES = [label for label, options in CURVE_ARMS if "--critic-oracle" in options and "--no-positive-nll" in options]
BASELINES = ("GRPO token-level", "NLL only")


def slug(label: str) -> str:
    return "-".join("".join(c if c.isalnum() or c == "." else " " for c in label.lower()).split())


def runs(name: str, seeds: list[int], out: str) -> list[tuple[str, str, list[str]]]:
    """(arm, run folder, vapo.py options) of each run of an experiment."""
    return [(label, os.path.join(out, f"{slug(label)}-s{seed}"),
             ["--preset", "long", *options, *([] if name == "credit-pilot" else EVAL), "--seed", str(seed),
              "--output-dir", os.path.join(out, f"{slug(label)}-s{seed}")])
            for seed in seeds for label, options in RL[name]]


def from_pilot(seed: int, out: str) -> bool:
    """The curve's "V* lambda 0" run of `seed`, made from the pilot's run at the picked lr where the pilot ran that
    seed (in out's sibling folder credit-pilot): True if made. Their options differ only in the evaluation's size
    (EVAL), and an evaluation never draws from the training's random streams (vapo.evaluate's fixed seed), so the
    curve's run would train exactly as the pilot did (checked on seed 0: its first 8 steps' records equal the
    pilot's to the last digit); its records are the pilot's RL steps with the curve's two evaluations: the start's
    taken from another finished arm of the seed (the same base, seed and settings: every arm's first evaluation is
    the same), or made from the base, and the end's made from the pilot's final policy with the curve's config.
    provenance.json in the folder says so; `lab.py credit --run` without the pilot's folder trains it instead."""
    label, folder, options = next(r for r in runs("credit", [seed], out) if r[0] == "V* lambda 0")
    pilot = os.path.join(os.path.dirname(out), "credit-pilot", f"{slug(f'V* lambda 0, lr {ORACLE_LR}')}-s{seed}")
    if common.finished(folder) or not common.finished(pilot) or common.running(folder) is not None:
        return False
    cfg, _, _ = vapo.config_from_args(options)
    pilot_cfg = common.read_json(os.path.join(pilot, "config.json"))
    differ = {k for k, v in dataclasses.asdict(cfg).items() if pilot_cfg.get(k) != v}
    if differ - {"output_dir", "eval_prompts", "eval_sampled_prompts"}:
        print(f"  {label}: the pilot's options differ in {sorted(differ)}: trained instead", flush=True)
        return False
    siblings = [f for arm, f, _ in runs("credit", [seed], out) if arm != label and common.finished(f)]
    start = next(({k: v for k, v in common.read_records(f)[0].items() if k.startswith("eval/")} for f in siblings),
                 None) or evaluate_policy(cfg, folder_of(cfg.model))
    end = evaluate_policy(cfg, os.path.join(pilot, "checkpoint", "policy"))
    records = common.read_records(pilot)
    steps = [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in records
             if not any(k.startswith("eval/") for k in r)]
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    os.symlink(os.path.abspath(os.path.join(pilot, "checkpoint")), os.path.join(folder, "checkpoint"))
    common.write_json(os.path.join(folder, "config.json"), dataclasses.asdict(cfg))
    with open(os.path.join(folder, "metrics.jsonl"), "w") as fh:
        for r in [{"step": 0, **start}, *steps, {"step": cfg.steps, **end}]:
            fh.write(json.dumps(r) + "\n")
    common.write_json(os.path.join(folder, "provenance.json"), {
        "made_from": pilot, "date": common.now(), "machine": common.machine(),
        "why": "the same options and seed but the evaluation's size: the same training (bench/lab_credit.py, "
               "from_pilot); the RL steps' records are the pilot's, both evaluations made with this config"})
    print(f"  {label}, {folder}: made from the pilot's run {pilot}", flush=True)
    return True


def arm_labels(name: str, arms: list[str] | None) -> list[str]:
    """The experiment's arms that `arms` names (--arms: exact labels), all of them if None; an unknown label is an
    error that lists the experiment's labels."""
    labels = [label for label, _ in RL[name]]
    unknown = [a for a in arms or [] if a not in labels]
    if unknown:
        raise ValueError(f"{name} has no arm {', '.join(map(repr, unknown))}; its arms: "
                         f"{', '.join(map(repr, labels))}")
    return [label for label in labels if arms is None or label in arms]


def run(name: str, seeds: list[int], out: str, jobs: int, kept: str | None = None,
        arms: list[str] | None = None) -> None:
    """The experiment's vapo.py runs (only those of `arms` if given: arm_labels), `jobs` at a time with one thread
    each (common.run_vapo: resumable), but those whose arm a kept record of its seed already measured (kept_record);
    the curve's V* lambda 0 made from the pilot's run where it has the seed (from_pilot)."""
    wanted = set(arm_labels(name, arms))
    done = set()
    for seed in seeds:
        record, path = kept_record(name, seed, out, kept)
        arms = set(record["curves"]) - set(record.get("unfinished", [])) if record else set()
        if arms:
            print(f"  seed {seed}: {len(arms)} arms measured in {path}, not run again", flush=True)
        done |= {(seed, a) for a in arms}
    if name == "credit":
        for seed in seeds:
            if (seed, "V* lambda 0") not in done and "V* lambda 0" in wanted:
                from_pilot(seed, out)
    todo = [r for seed in seeds for r in runs(name, [seed], out) if (seed, r[0]) not in done and r[0] in wanted]
    print(f"{common.now()}, {common.machine()}: lab {name}, {len(todo)} runs, {jobs} at a time, into {out}",
          flush=True)
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda r: common.run_vapo(f"{r[0]}, {r[1]}", r[2], r[1]), todo))


def print_runs(name: str, seeds: list[int], out: str, arms: list[str] | None = None) -> None:
    wanted = set(arm_labels(name, arms))
    for label, folder, options in (r for r in runs(name, seeds, out) if r[0] in wanted):
        print(f"{label}:\n  python vapo.py {' '.join(options)}")
    print("(printed only: --run runs them, --report judges the finished ones; this claims no result)")


# --- one run's measures ------------------------------------------------------------------------------------------
def run_measures(folder: str, prefix: str) -> dict:
    """A finished run's gains (final - first evaluation) and its credit (the meter's mean over the RL steps)."""
    records = common.read_records(folder)
    evals, steps = common.evaluations(records), common.rl_steps(records)
    m = {}
    for key in ("acc_avg@2", "acc_greedy", "pass@2", *[f"acc_greedy_steps_{b}" for b in STEP_BANDS]):
        start, end = (evals[i].get(f"eval/{key}", math.nan) for i in (0, -1))
        m[f"{prefix}|{key.removeprefix('acc_')}_end"], m[f"{prefix}|{key.removeprefix('acc_')}_gain"] = end, end - start
    keys = ["credit/corr", "credit/first_error", "credit/fail_share", "credit/step_kl", "groups_all_same",
            *[f"credit/corr|{b}" for b in LENGTH_BAND_NAMES],
            # the critic's own gauges, beside the meter (critic arms only): explained variance of the return, of V*
            # (ev_critic_exact), of V* inside responses (ev_critic_within), and of the group mean and the step-count
            # floor; the response length, the entropy
            "explained_variance", "ev_critic_exact", "ev_critic_within", "ev_exact", "ev_group_baseline", "ev_floor",
            "response_len", "entropy"]
    for key in keys:
        values = [r[key] for r in steps if r.get(key) == r.get(key) and key in r]
        if values or key.startswith("credit/") or key == "groups_all_same":  # a critic's gauge only where measured
            m[f"{prefix}|{key.removeprefix('credit/')}"] = statistics.mean(values) if values else math.nan
    first = [r.get("groups_all_same", math.nan) for r in steps[:5]]
    m[f"{prefix}|all_same_first5"] = statistics.mean(first) if first else math.nan
    return m


def validation(folder: str) -> dict:
    """A finished run's final policy on the validation split (VALIDATION_PROBLEMS training-distribution problems of a
    seed no run trains on): greedy and avg@2 with the run's evaluation settings; cached in the run folder."""
    cache = os.path.join(folder, "validation.json")
    if os.path.exists(cache):
        return common.read_json(cache)
    cfg = vapo.Config(**common.read_json(os.path.join(folder, "config.json")))
    policy, tokenizer = load_policy(os.path.join(folder, "checkpoint", "policy"), dtype=torch.float32)
    rows = task.make_dataset(VALIDATION_PROBLEMS, VALIDATION_SEED, task.LONG.min_steps, task.LONG.max_steps,
                             split="train")
    engine = HFEngine(policy, tokenizer, max_new_tokens=cfg.max_new_tokens)
    out = vapo.evaluate(engine, rows, dataclasses_replace(cfg, eval_sampled_prompts=None), Verifier(arith_reward, 0))
    result = {"greedy": out["eval/acc_greedy"], "avg@2": out["eval/acc_avg@2"]}
    common.write_json(cache, result)
    return result


def dataclasses_replace(cfg, **changes):
    return dataclasses.replace(cfg, **changes)


def never_solved(out: str, candidates: int = 160, samples: int = 16, keep: int = 48,
                 kept: str | None = None) -> list[dict]:
    """Held-out problems of 21-40 steps that the base policy answers right in none of `samples` samples at T 1 (the
    first `keep` of them, among `candidates` of those steps): the set on which pass@8 asks whether training on hard
    problems found anything new. Cached in out/never-solved.json; taken from kept/credit-hard-never-solved.json where
    that is kept (the set is drawn by sampling, and another CPU's kernels can draw another set: a kept record's pass@8
    is only comparable on the set it was measured on)."""
    cache = os.path.join(out, "never-solved.json")
    published = os.path.join(kept, "credit-hard-never-solved.json") if kept else None
    if not os.path.exists(cache) and published and os.path.exists(published):
        os.makedirs(out, exist_ok=True)
        shutil.copyfile(published, cache)
    if os.path.exists(cache):
        return common.read_json(cache)["problems"]
    rows = [r for r in task.make_dataset(4 * candidates, 7, 21, 40, split="eval")][:candidates]
    policy, tokenizer = load_policy(folder_of("builtin-long"), dtype=torch.float32)
    engine = HFEngine(policy, tokenizer, max_new_tokens=task.LONG.max_response_tokens, batch_size=16)
    rollout = engine.generate([r["prompt"] for r in rows], n=samples, seed=11)
    right = torch.tensor([task.is_correct(t, rows[int(i)]["answer"]) for t, i in
                          zip(rollout.texts, rollout.prompt_index)]).view(len(rows), samples).any(1)
    chosen = [r for r, ok in zip(rows, right.tolist()) if not ok][:keep]
    common.write_json(cache, {"candidates": candidates, "samples": samples, "problems": chosen,
                              "solved_share": float(right.float().mean())})
    return chosen


def pass_at(folder: str, problems: list[dict], k: int = 8) -> float:
    """pass@k of a run's final policy on problems at T 1, cached in the run folder."""
    cache = os.path.join(folder, f"pass{k}-never-solved.json")
    if os.path.exists(cache):
        return common.read_json(cache)["pass"]
    policy, tokenizer = load_policy(os.path.join(folder, "checkpoint", "policy"), dtype=torch.float32)
    engine = HFEngine(policy, tokenizer, max_new_tokens=task.LONG.max_response_tokens, batch_size=16)
    rollout = engine.generate([p["prompt"] for p in problems], n=k, seed=13)
    right = torch.tensor([task.is_correct(t, problems[int(i)]["answer"]) for t, i in
                          zip(rollout.texts, rollout.prompt_index)]).view(len(problems), k).any(1)
    value = float(right.float().mean())
    common.write_json(cache, {"pass": value, "k": k, "problems": len(problems)})
    return value


LONG_CHAINS = 100  # held-out problems of 21-40 steps on which long_chain_errors reads a policy's misreads


def long_chain_errors(folder: str, problems: int = LONG_CHAINS) -> dict:
    """A run's final policy, greedy, on the first `problems` held-out problems of 21-40 steps (task.evaluate_accuracy):
    its accuracy, its misreads per line written (a line whose label, sign or term is not the prompt's: lookup_rate; a
    skipped term shifts every later line), the share of responses whose first error is a misread, and the borrow
    habit's rate. Cached in the run folder."""
    cache = os.path.join(folder, "long-chain-errors.json")
    if os.path.exists(cache):
        return common.read_json(cache)
    policy, tokenizer = load_policy(os.path.join(folder, "checkpoint", "policy"), dtype=torch.float32)
    rows = task.make_dataset(problems, 0, 21, 40, split="eval")
    acc = task.evaluate_accuracy(policy, tokenizer, rows, 0.0, max_new_tokens=task.LONG.max_response_tokens,
                                 batch_size=50)
    value = {"accuracy": acc["accuracy"], "misreads": acc["steps"]["lookup_rate"],
             "first_misread": acc["first_errors"]["misread"], "habit": acc["steps"]["habit_rate"], "problems": problems}
    common.write_json(cache, value)
    return value


def kept_record(name: str, seed: int, out: str, kept: str | None = None) -> tuple[dict | None, str | None]:
    """A seed's kept record NAME-sSEED.json (what measure wrote: each finished arm's measures and credit curve), from
    out or else from the folder `kept` (--kept: docs/lab keeps the published ones, since run folders are not
    committed), and its path; (None, None) if there is none."""
    for folder in (out, kept) if kept else (out,):
        path = os.path.join(folder, f"{name}-s{seed}.json")
        if os.path.exists(path):
            record = common.read_json(path)
            if record.get("seed") != seed or not isinstance(record.get("measures"), dict):
                raise ValueError(f"{path}: not a per-seed record of seed {seed} (keys seed, measures, curves)")
            return record, path
    return None, None


def measure(name: str, seed: int, out: str, kept: str | None = None) -> dict | None:
    """One seed's measures of an experiment's finished runs ("unfinished": the arms left out), or None while none
    has finished. An arm whose run folder is not finished here is taken from the seed's kept record (kept_record:
    run folders do not outlive a machine, the records in docs/lab do), its source named in "sources"; the merged
    record is written to out/NAME-sSEED.json."""
    arms = [(label, folder) for label, folder, _ in runs(name, [seed], out)]
    record, path = kept_record(name, seed, out, kept)
    kept_arms = set(record["curves"]) - set(record.get("unfinished", [])) if record else set()
    m, curves, sources = {}, {}, {}
    hard = None
    for label, folder in arms:
        if common.finished(folder):
            if name == "credit-hard" and hard is None:
                hard = never_solved(out, kept=kept)
            m |= run_measures(folder, label)
            if name == "credit-pilot":
                v = validation(folder)
                m[f"{label}|validation"] = (v["greedy"] + v["avg@2"]) / 2
            if hard is not None:
                m[f"{label}|pass8_never_solved"] = pass_at(folder, hard)
                errors = long_chain_errors(folder)
                m |= {f"{label}|{k}_21-40": errors[k] for k in ("accuracy", "misreads", "first_misread", "habit")}
            steps = common.rl_steps(common.read_records(folder))
            curves[label] = {"credit": [r.get("credit/corr", math.nan) for r in steps],
                             "first_error": [r.get("credit/first_error", math.nan) for r in steps],
                             **({"ev_critic_exact": [r.get("ev_critic_exact", math.nan) for r in steps]}
                                if any("ev_critic_exact" in r for r in steps) else {})}
            sources[label] = {"run": folder, "measured": common.now(), "machine": common.machine()}
        elif label in kept_arms:
            m |= {k: v for k, v in record["measures"].items() if k.split("|")[0] == label}
            curves[label] = record["curves"][label]
            sources[label] = record.get("sources", {}).get(label) or {"record": path}
    if not curves:
        return None
    unfinished = [label for label, _ in arms if label not in curves]
    kept_here = [label for label, folder in arms if label in curves and not common.finished(folder)]
    if kept_here:
        print(f"  seed {seed}: {', '.join(kept_here)} from the kept record {path}", flush=True)
    record = {"seed": seed, "measures": m, "curves": curves, "unfinished": unfinished, "sources": sources}
    common.write_json(os.path.join(out, f"{name}-s{seed}.json"), record)
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in record.items()}


def crossing(points: list[tuple[float, float]], level: float) -> float:
    """The credit at which gain(credit), linear between the points sorted by credit, first reaches `level` from below
    (NaN if it never does; the lowest credit if it is above everywhere)."""
    points = sorted(p for p in points if p[0] == p[0] and p[1] == p[1])
    if not points:
        return math.nan
    if points[0][1] >= level:
        return points[0][0]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if y0 < level <= y1:
            return x0 + (level - y0) / (y1 - y0) * (x1 - x0)
    return math.nan


def add_crossings(per_seed: list[dict]) -> None:
    """Each seed's credit at which the oracles' curve (gain of avg@2 against credit/corr) reaches GRPO's and NLL
    only's gain: `crossing|BASELINE` in its measures (so the mean and SE are over seeds); none for a seed that lacks
    an oracle."""
    for r in per_seed:
        m = r["measures"]
        points = [(m[f"{a}|corr"], m[f"{a}|avg@2_gain"]) for a in ORACLES if f"{a}|corr" in m]
        if len(points) < len(ORACLES):  # a seed without all its oracles has no curve to cross
            continue
        for b in BASELINES:
            if f"{b}|avg@2_gain" in m:
                m[f"crossing|{b}"] = crossing(points, m[f"{b}|avg@2_gain"])


def crossing_notes(per_seed: list[dict]) -> list[str]:
    """Per baseline, on how many of the seeds with a curve the oracles' curve reaches its gain: the mean and SE of
    `crossing|BASELINE` are over those seeds only, so a crossing that one seed of three reaches says so."""
    notes = []
    for b in BASELINES:
        values = [r["measures"][f"crossing|{b}"] for r in per_seed if f"crossing|{b}" in r["measures"]]
        reached = [v for v in values if v == v]
        if values:
            notes.append(f"the oracles' curve reaches {b}'s gain on {len(reached)} of {len(values)} seeds"
                         + (f" (at credit {', '.join(f'{v:.2f}' for v in reached)})" if reached else ""))
    return notes


def draw_credit(results: list[dict], path: str) -> None:
    """Final gain of avg@2 against measured credit: the oracles (points with SE bars), the learned critics, and the
    baselines as horizontal bands; beside it the same for the greedy gain on 31-40-step problems."""
    arms = [label for label, _ in CURVE_ARMS]
    panels = []
    for gain, title in (("avg@2_gain", "avg@2 gain against measured credit"),
                        ("greedy_steps_31-40_gain", "greedy gain at 31-40 steps against credit")):
        lines, curve = [], []
        for i, a in enumerate(arms):
            xs = [r["measures"].get(f"{a}|corr", math.nan) for r in results]
            ys = [r["measures"].get(f"{a}|{gain}", math.nan) for r in results]
            mx, my = _mean_se(xs), _mean_se(ys)
            if a in BASELINES and mx[0] != mx[0]:
                mx = (0.0, 0.0)
            if my[0] != my[0]:  # not run yet
                continue
            color = COLORS[i % len(COLORS)]
            marker = "o" if a in ORACLES else "s" if a in BASELINES else "^"  # oracle, baseline, learned or + NLL
            options = {"label": a, "color": color, "marker": marker, "xerr": mx[1], "yerr": my[1], "capsize": 2}
            lines.append(("errorbar", mx[0], my[0], options))
            if a in BASELINES:
                lines.append(("band", my[0], my[1], {"color": color}))
            if a in ORACLES:
                curve.append((mx[0], my[0]))
        if len(curve) > 1:  # the oracles' curve, linear between their means (what the crossings read, per seed)
            lines.append(("line", [x for x, _ in sorted(curve)], [y for _, y in sorted(curve)], {"color": "0.5"}))
        panels.append({"title": title, "xlabel": "credit/corr (weighted correlation with V*'s A*)",
                       "ylabel": "gain, points", "custom": lines})
    _draw_points(path, f"When a critic pays: gain against measured credit (mean +- SE over the seeds that ran each "
                       f"arm, up to {len(results)}; the dashed line joins the oracles)", panels)


COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf", "#000000", "#aec7e8"]  # one per arm of the curve (matplotlib's ten, then black and a pale blue)


def _mean_se(values: list[float]) -> tuple[float, float]:
    v = [x for x in values if x == x]
    if not v:
        return math.nan, 0.0
    return statistics.mean(v), (statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else 0.0)


def _draw_points(path: str, title: str, panels: list[dict]) -> None:
    from lab import _pyplot
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
    for ax, p in zip(axes[0], panels):
        for kind, x, y, options in p["custom"]:
            if kind == "errorbar":  # an arm: (credit, gain) with their SEs, the gain in points
                xerr, yerr = options.pop("xerr"), options.pop("yerr")
                ax.errorbar([x], [100 * y], xerr=[xerr], yerr=[100 * yerr], linestyle="none", **options)
            elif kind == "line":  # x, y: lists
                ax.plot(x, [100 * v for v in y], ls="--", lw=0.8, **options)
            else:  # a baseline's gain: mean +- 2 SE (x the mean, y its SE)
                ax.axhspan(100 * (x - 2 * y), 100 * (x + 2 * y), alpha=0.15, **options)
        ax.set(xlabel=p["xlabel"], ylabel=p["ylabel"])
        ax.set_title(p["title"], fontsize=9)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_runs(results: list[dict], path: str) -> None:
    """The pilot's and the hard runs' figure: each arm's credit over the RL steps (mean over seeds)."""
    arms = list(results[0]["curves"])
    lines = []
    for i, a in enumerate(arms):
        rows = [r["curves"][a]["credit"] for r in results if a in r["curves"]]
        n = min(map(len, rows)) if rows else 0
        lines.append((list(range(1, n + 1)), [statistics.mean(x for x in col if x == x) if any(x == x for x in col)
                                               else math.nan for col in zip(*[row[:n] for row in rows])],
                      "-", {"label": a, "color": f"C{i}"}))
    panels = [{"title": "credit/corr (mean over seeds)", "xlabel": "RL step", "lines": lines}]
    if any(f"{a}|pass8_never_solved" in r["measures"] for r in results for a in arms):  # the hard rows' outcomes
        def bars(keys):
            out = []
            for a in arms:
                cells = [_mean_se([100 * r["measures"][f"{a}|{k}"] for r in results if f"{a}|{k}" in r["measures"]])
                         for k in keys]
                out.append((a, [c[0] for c in cells], [c[1] for c in cells]))
            return out
        panels += [{"title": "greedy accuracy at the end, by step count (%)", "xlabel": "steps",
                    "bars": (STEP_BANDS, bars([f"greedy_steps_{b}_end" for b in STEP_BANDS]))},
                   {"title": "pass@8 on problems the base never solved (%)",
                    "bars": (("21-40 steps",), bars(["pass8_never_solved"]))},
                   {"title": "greedy misreads, % of lines, 21-40 steps",
                    "bars": (("21-40 steps",), bars(["misreads_21-40"]))}]
    draw(path, "credit/corr over the RL steps" + (", and the hard rows' outcomes (mean +- SE over seeds)"
                                                   if len(panels) > 1 else ""), panels)


TABLE = [("credit/corr over RL", "corr", 1, 3), ("credit at the first error (sd)", "first_error", 1, 2),
         ("|A| on all-fail groups", "fail_share", 1, 2), ("avg@2 gain", "avg@2_gain", 100, 1),
         ("greedy gain", "greedy_gain", 100, 1), ("pass@2 gain", "pass@2_gain", 100, 1),
         ("greedy gain, 31-40 steps", "greedy_steps_31-40_gain", 100, 1),
         ("critic's EV of V*", "ev_critic_exact", 1, 2), ("... inside responses", "ev_critic_within", 1, 2)]


TABLES = {"credit-hard": TABLE[:7] + [("pass@8, never solved", "pass8_never_solved", 100, 1),
                                      ("greedy, 21-40 steps", "accuracy_21-40", 100, 1),
                                      ("misreads, % of lines, 21-40", "misreads_21-40", 100, 2),
                                      ("first error a misread, 21-40", "first_misread_21-40", 100, 1)] + TABLE[7:]}


def table(name: str, per_seed: list[dict]) -> str:
    """The experiment's markdown table: each arm's measures, mean +- SE over the seeds that ran it (their number
    beside the arm), gains in points; "-" where an arm has no such measure."""
    columns = TABLES.get(name, TABLE)
    rows = ["| arm (seeds) | " + " | ".join(h.replace("|", "\\|") for h, *_ in columns) + " |",
            "|---" * (len(columns) + 1) + "|"]
    for arm, _ in RL[name]:
        ran = [r for r in per_seed if arm in r.get("curves", {})]
        if not ran:
            continue
        cells = []
        for _, key, scale, digits in columns:
            v = [r["measures"][f"{arm}|{key}"] * scale for r in ran
                 if r["measures"].get(f"{arm}|{key}", math.nan) == r["measures"].get(f"{arm}|{key}")]
            mean, se = _mean_se(v)
            sign = "+" if key.endswith("_gain") else ""  # a gain carries its sign; a level (pass@8, a rate) none
            cells.append("-" if not v else f"{mean:{sign}.{digits}f}" + (f" +- {se:.{digits}f}" if len(v) > 1 else ""))
        seeds = ",".join(str(r["seed"]) for r in ran)
        rows.append(f"| {arm.replace('*', chr(92) + '*')} ({seeds}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def report(name: str, seeds: list[int], out: str, kept: str | None = None) -> dict | None:
    """Judge an experiment's finished seeds (their runs in out, or their kept records: measure) against docs/lab.md's
    written predictions (lab.publish)."""
    per_seed, missing = [], []
    for seed in seeds:
        r = measure(name, seed, out, kept)
        (per_seed.append(r) if r is not None else missing.append(seed))
    if missing:
        print(f"seeds with no finished run (left out): {missing}")
    if not per_seed:
        return None
    unfinished = {r["seed"]: r["unfinished"] for r in per_seed if r["unfinished"]}
    if unfinished:
        print(f"unfinished runs (their arms not measured): {unfinished}")
    crossed = []
    if name == "credit":
        add_crossings(per_seed)
        crossed = crossing_notes(per_seed)
        print("\n".join(crossed))
    notes = ["one seed: no standard error, no verdict" if len(per_seed) < 2 else "",
             f"unfinished runs left out: {unfinished}" if unfinished else "", *crossed]
    summary = publish(name, per_seed, out, draw_credit if name == "credit" else draw_runs,
                      "; ".join(n for n in notes if n), seeds=[r["seed"] for r in per_seed], per_seed=per_seed)
    if name != "credit-pilot":
        print("\n" + table(name, per_seed))
        with open(os.path.join(out, f"{name}.md"), "w") as fh:
            fh.write(table(name, per_seed) + "\n")
    return summary


# --- calibration: the meter of each critic on the base's held-out responses, before any RL ------------------------
CALIBRATION_CRITICS = ("V* lambda 0", "V* lambda 0.9", "V* preset lambda", "V* lambda 1", "V* + noise 0.3", "late 3",
                       "late 10", "MC 4", "MC 16", "floor", "reward model", "value-pretrained", "GRPO")


def calibration(args, seed: int) -> dict:
    """One seed's calibration: args.prompts held-out long chains x args.group samples of the base at T 1, V* fitted on
    another sample set; for each critic, the meter of its advantages (whitened as the preset whitens; the critics'
    values at lambda 0 unless named), its EV of the return and, with values, its detection lag."""
    policy_name = "builtin-long"
    _, rollout, rewards, _ = sample_set(policy_name, args.prompts, args.group, seed)
    exact = fitted_exact(policy_name, args.prompts, args.group, seed)
    problems = [held_out(args.prompts)[int(i)] for i in rollout.prompt_index]
    tokenizer = load_tokenizer(folder_of(policy_name))
    mask = rollout.response_mask
    star = exact.values(rollout, problems, tokenizer)
    cfg = vapo.Config(**{**config.PRESETS["long"], "samples_per_prompt": args.group})
    errors = first_error_tokens(rollout, problems, tokenizer)
    oracle_values = lambda spec: exact_values.OracleCritic(spec, exact, tokenizer, seed).values_of(rollout)  # noqa
    adaptive = length_adaptive_lambda(rollout.lengths, ALPHA)
    values = {"V* lambda 0": (star, 0.0), "V* lambda 0.9": (star, 0.9), "V* preset lambda": (star, adaptive),
              "V* lambda 1": (star, 1.0), "V* + noise 0.3": (oracle_values("exact+noise:0.3"), 0.0),
              "late 3": (oracle_values("late:3"), 0.0), "late 10": (oracle_values("late:10"), 0.0),
              "MC 4": (oracle_values("mc:4"), 0.0), "MC 16": (oracle_values("mc:16"), 0.0),
              "floor": (exact.floor_values(rollout, problems), adaptive)}
    rm = load_value_model(folder_of("builtin-long-rm"), dtype=torch.float32)
    values["reward model"] = (score_rollout(None, rm, rollout, 8)["values"], adaptive)
    values["value-pretrained"] = (score_rollout(None, pretrained_critic(args, seed), rollout, 8)["values"], adaptive)
    m = {}
    for name, (v, lam) in values.items():
        advantages, _ = gae(terminal_rewards(rewards, mask), v, mask, lam=lam)
        m |= calibration_measures(name, masked_whiten(advantages, mask), v, rollout, rewards, star, problems, errors, cfg)
    m |= calibration_measures("GRPO", group_advantage(rewards, mask, args.group), None, rollout, rewards, star,
                              problems, errors, cfg)
    return {"seed": seed, "measures": m, "curves": {}}


def calibration_measures(name, advantages, values, rollout, rewards, star, problems, errors, cfg) -> dict:
    """The meter (credit_figures) of one critic's advantages, its EV of the return and its detection lag."""
    from types import SimpleNamespace
    batch = SimpleNamespace(cfg=vapo.Config(**{**config.PRESETS["long"], "samples_per_prompt": cfg.samples_per_prompt,
                                               "positive_nll": False}),
                            rollout=rollout, advantages=advantages, verdicts=rewards, rewards=rewards,
                            old_logprobs=rollout.sampler_logprobs)
    figures = credit_figures(batch, star, errors)
    out = {f"{name}|{k.removeprefix('credit/')}": v for k, v in figures.items()}
    if values is not None:
        mask = rollout.response_mask
        returns = terminal_rewards(rewards, mask).flip(1).cumsum(1).flip(1)  # the Monte-Carlo return at each token
        out[f"{name}|ev"] = explained_variance(values, returns, mask)
        lags = detection_lags(values, errors, rollout.lengths)
        out[f"{name}|lag_median"] = statistics.median(lags) if lags else math.nan
        out[f"{name}|lag_never"] = sum(math.isinf(x) for x in lags) / len(lags) if lags else math.nan
    return out


def detection_lags(values: torch.Tensor, errors: list[tuple[int, int]], lengths: torch.Tensor) -> list[float]:
    """Per wrong response, the tokens after its first wrong token until V has fallen half way from V(s_e) to -1
    (0: the state just after the wrong token shows it, as V*'s does); inf where it never does."""
    out = []
    for b, e in errors:
        n, v0 = int(lengths[b]), float(values[b, e])
        threshold = (v0 - 1) / 2
        later = [d for d in range(1, n - e) if float(values[b, e + d]) <= threshold]
        out.append(float(later[0] - 1) if later else math.inf)
    return out


def pretrained_critic(args, seed: int):
    """A critic value-pretrained as --preset long does (from the shipped reward model, Monte-Carlo targets, the
    preset's critic settings) on args.pretrain_steps batches of the base's training-split rollouts (lab_analyses's
    training_batches and fit_critic), cached under args.out."""
    from types import SimpleNamespace
    from lab_analyses import fit_critic, training_batches
    folder = os.path.join(args.out, f"pretrained-critic-s{seed}")
    if os.path.exists(os.path.join(folder, "config.json")):
        return load_value_model(folder, dtype=torch.float32)
    critic = load_value_model(folder_of("builtin-long-rm"), dtype=torch.float32)
    preset = config.PRESETS["long"]
    parts = training_batches(SimpleNamespace(batches=args.pretrain_steps, batch_prompts=preset["prompts_per_step"],
                                             group=preset["samples_per_prompt"]), seed)
    fit_critic(critic, parts, 1.0)
    SingleProcess().save_pretrained(critic, folder)
    return critic


CALIBRATION_SIZES = {"prompts": (100, "held-out problems"), "group": (8, "samples a problem (G)"),
                     "pretrain_steps": (20, "the value-pretrained critic's batches (the preset's steps)")}


def run_calibration(args, out: str) -> dict | None:
    """credit-calibration: each seed's measures (out/credit-calibration-sSEED.json), then judged over seeds."""
    args.out = out
    return publish_seeds("credit-calibration", args, out, calibration, CALIBRATION_SIZES, draw_calibration)


def draw_calibration(results: list[dict], path: str) -> None:
    names = [*CALIBRATION_CRITICS]
    bars = []
    for key, label in (("corr", "credit/corr"), ("first_error", "credit/first_error (SD)")):
        stats = [_mean_se([r["measures"].get(f"{n}|{key}", math.nan) for r in results]) for n in names]
        bars.append({"title": label, "bars": (names, [(None, [s[0] for s in stats], [s[1] for s in stats])]),
                     "hline": 0})
    draw(path, "credit of each critic on the base's held-out responses (mean +- SE over seeds)", bars, width=7.5)
