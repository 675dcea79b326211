"""The mechanism lab (issue 47): each of VAPO's techniques seen acting on the failure it was made for, in a controlled,
labelled setup on the built-in task and its shipped models. docs/lab.md gives each experiment's failure, setup,
prediction (committed before any run), what would falsify it, and its results; PREDICTIONS below are its thresholds.

    python bench/lab.py value-pretraining | decoupled-gae | length-adaptive [--seeds 0 1 2] [--report]
    python bench/lab.py value-pretraining-rl | clip-higher | token-level | group-sampling | nll [--seeds 0 1 2]
                        [--extension] [--run [--jobs 2] | --report]   # with neither: print the planned vapo.py runs
    python bench/lab.py record -- VAPO.PY OPTIONS                     # one such run, writing its decisions.jsonl
    python bench/lab.py credit-calibration [--seeds 0 1 2] [--report]         # 8. when a critic pays: the meter
    python bench/lab.py credit-pilot | credit | credit-hard [--seeds 0 1 2] [--arms LABEL ...]
                        [--run [--jobs 2] [--kept DIR] | --report]
    python bench/lab.py critic-fits [--seeds 0 1 2] [--report]                # 9. the learned critic on the curve

Each experiment writes NAME.json (every seed's measures, their mean and SE over seeds, and the verdicts against the
written prediction: confirmed / falsified / not separated) and NAME.png into --out (default runs/lab/NAME); an
analysis also NAME-sSEED.json per seed, and sizes below the written setup's make it a smoke run, not a result. The
critics are constructed references, labelled so: V* (exact_values.ExactValues) plus a bias of known shape
b(t) = offset + slope * t / 100, or plus noise; where a critic must learn, V = V* + b + h, h a value network whose
head starts at zero, trained by the trainer's own critic step.
"""
# The lab is three files, one kind of experiment each: this one is the command line and what every experiment shares
# (the constants, the constructed bias b(t), the written predictions and their verdicts, the figure, publish);
# lab_analyses.py holds the critic-only analyses on constructed critics (experiments 1-3), lab_rl.py the RL
# experiments (their vapo.py runs, the `record` command and its trainer hooks, each run's measures and figures).
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

import torch

import common  # (puts the repository on the path)

POLICY, CRITIC = "builtin-long", "builtin-long-rm"  # the long chains' base policy, and its outcome reward model
LENGTH_BANDS = ((1, 50), (50, 100), (100, 200), (200, 300), (300, 10_000))  # response length in tokens, [lo, hi)
LENGTH_BAND_NAMES = [f"{lo}+" if hi > 1000 else f"{lo}-{hi - 1}" for lo, hi in LENGTH_BANDS]
STEP_BANDS = ("1-10", "11-20", "21-30", "31-40")  # task.band_of(n_steps)
FIFTHS = 5
# the critics and the RL experiments' arms whose measures the predictions below name (run in lab_analyses.py, lab_rl.py)
LA_CRITICS = ("exact", "exact+bias:0.5:0", "exact+bias:-0.5:0.125", "exact+noise:0.1", "exact+noise:0.3", "floor",
              CRITIC, "pretrained")
CLIP_ARMS = ("0.2", "0.28", "0.4")
TL_ARMS = (("per-sample", "per-sample loss"), ("token-level", "token-level loss"))
GS_ARMS = (("2", "GRPO 32 prompts x 2"), ("8", "GRPO 8 prompts x 8"), ("32", "GRPO 2 prompts x 32"))


# --- the constructed bias: the analyses' critics V* + b, the RL runs' offset critic V*_0 + b + h ---------------------
def bias_values(mask: torch.Tensor, offset: float, slope: float) -> torch.Tensor:
    """[B, T] b(t) = offset + slope * t / 100 on the real tokens (t = the token's index in its response, 0 = the
    first; slope in value units per 100 tokens), 0 under the mask. mask: [B, T]."""
    t = torch.arange(mask.shape[1], dtype=torch.float32, device=mask.device)[None, :]  # [1, T]
    return (offset + slope * t / 100) * mask


# --- the written predictions: docs/lab.md's thresholds, judged on the mean and SE over seeds -------------------------
def judge(stat, lo=None, hi=None) -> str:
    """stat = (mean, SE): confirmed when inside [lo, hi] by more than 2 SE, falsified when outside by more than 2 SE,
    else not separated; NaN: not measured."""
    mean, se = stat
    if mean != mean:
        return "not measured"
    lo = -math.inf if lo is None else lo
    hi = math.inf if hi is None else hi
    if lo <= mean - 2 * se and mean + 2 * se <= hi:
        return "confirmed"
    if mean + 2 * se < lo or mean - 2 * se > hi:
        return "falsified"
    return "not separated"


def combine(verdicts: list[str]) -> str:
    """All confirmed -> confirmed; any falsified -> falsified; any judged on one seed -> one seed; else not
    separated."""
    if "falsified" in verdicts:
        return "falsified"
    if "one seed" in verdicts:
        return "one seed"
    if verdicts and all(v == "confirmed" for v in verdicts):
        return "confirmed"
    return "not separated"


def check(s: dict, keys, lo=None, hi=None) -> str:
    """judge() of a measure (a key of s), of a paired difference (a, b), or of a list of these, all within [lo, hi];
    "no difference" as lo: a null, confirmed unless the measure is more than 2 SE from 0."""
    if isinstance(keys, list):
        return combine([check(s, k, lo, hi) for k in keys])
    stat = _diff(s, *keys) if isinstance(keys, tuple) else s.get(keys, (math.nan, 0.0))
    if _seeds(s, keys) == 1 and stat[0] == stat[0]:  # measured on one seed only: no SE, so no verdict
        return "one seed"
    if lo == "no difference":
        verdict = judge(stat, 0, 0)
        return verdict if verdict in ("not measured", "falsified") else "confirmed"
    return judge(stat, lo, hi)


class Stats(dict):
    """{measure: (mean, SE over seeds)}, with the seeds' own measures kept (per_seed) for paired differences."""
    per_seed: list[dict] = []


def _seeds(s: dict, keys) -> int | None:
    """How many seeds measured a key of s, or both sides of a paired difference (a, b); None without per_seed."""
    per_seed = getattr(s, "per_seed", [])
    if not per_seed:
        return None
    keys = keys if isinstance(keys, tuple) else (keys,)
    return sum(all(r["measures"].get(k, math.nan) == r["measures"].get(k, math.nan) for k in keys) for r in per_seed)


def summarise(per_seed: list[dict]) -> Stats:
    """{measure: (mean, standard error over seeds)} of the seeds' "measures" (NaN or absent ones left out: a seed may
    lack an arm; SE 0 for one)."""
    out = Stats()
    out.per_seed = per_seed
    for key in dict.fromkeys(k for r in per_seed for k in r["measures"]):
        vals = [r["measures"][key] for r in per_seed if r["measures"].get(key, math.nan) == r["measures"].get(key)]
        if any(math.isinf(v) for v in vals):  # a lag that never came, say: infinite, with no spread to measure
            out[key] = (statistics.mean(vals), 0.0)
            continue
        if not vals:
            out[key] = (math.nan, 0.0)
            continue
        se = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
        out[key] = (statistics.mean(vals), se)
    return out


def _diff(s: dict, a: str, b: str) -> tuple[float, float]:
    """(mean, SE over seeds) of a - b, paired (from each seed's own difference) when s holds the seeds' measures,
    else as if the two were independent (docs/lab.md, experiment 1: "On the SE")."""
    per_seed = getattr(s, "per_seed", [])
    if per_seed:
        diffs = [r["measures"][a] - r["measures"][b] for r in per_seed if a in r["measures"] and b in r["measures"]]
        diffs = [d for d in diffs if d == d]
        if diffs:
            return statistics.mean(diffs), (statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0)
        return math.nan, 0.0
    (ma, sa), (mb, sb) = s.get(a, (math.nan, 0)), s.get(b, (math.nan, 0))
    return ma - mb, math.hypot(sa, sb)


def noise_horizon(sigma: float, v: float) -> float:
    """The best horizon 1 / (1 - lambda) for V* + independent noise sigma, where V*'s TD errors have variance v a
    token: lambda / (1 - lambda)^2 = sigma^2 / v (docs/lab.md, experiment 3), solved for lambda."""
    if v <= 0:
        return math.inf
    x = sigma ** 2 / v
    lam = ((2 * x + 1) - math.sqrt(4 * x + 1)) / (2 * x)
    return 1.0 / (1.0 - lam)


VP_TABLE = {  # docs/lab.md experiment 1, prediction 3: (lo, hi) per step band of the share reversed at lambda 0.95
    "0:-0.5": ((0, 0.05), (0, 0.15), (0.3, 0.9), (0.8, 1)),
    "0:-0.25": ((0, 0.05), (0, 0.1), (0, 0.5), (0.6, 1)),
    "-0.5:0.125": ((0, 0.05), (0, 0.15), (0.3, 0.9), (0.8, 1)),
    "0:0.5": ((0, 0),) * 4, "0.5:0": ((0, 0),) * 4, "0:0": ((0, 0),) * 4}


def _predictions_value_pretraining(s: dict) -> list[tuple[str, str]]:
    out = [("1. measured shifts = (A1)-(A2) within 1e-4, every bias and lambda",
            check(s, [k for k in s if k.endswith("max_abs_difference")], hi=1e-4)),
           ("2. lambda 1 reverses no decision", check(s, [k for k in s if "|1|" in k and ("|stop|" in k or "|eos|" in k)],
                                                       0, 0))]
    for bias, ranges in VP_TABLE.items():
        out.append((f"3. lambda 0.95, {bias}: stop reversed in the table's ranges",
                    combine([check(s, f"{bias}|0.95|stop|{b}", lo, hi) for b, (lo, hi) in zip(STEP_BANDS, ranges)])))
        if bias in ("0:-0.5", "0:-0.25", "-0.5:0.125"):
            out.append((f"3. adaptive lambda, {bias}: at least lambda 0.95's share at 21-40 steps",
                        check(s, [(f"{bias}|adaptive|stop|{b}", f"{bias}|0.95|stop|{b}") for b in STEP_BANDS[2:]], 0)))
    for bias in ("0:0.5", "0.5:0"):
        out.append((f"4. lambda 0.95, {bias}: going on at EOS looks better on every wrong response, no right one",
                    check(s, [(f"{bias}|0.95|eos|{b}", f"wrong|{b}") for b in STEP_BANDS], -0.02, 0.02)))
    for bias in ("0:-0.5", "0:-0.25", "0:0"):
        out.append((f"4. lambda 0.95, {bias}: going on at EOS never looks better",
                    check(s, [f"{bias}|0.95|eos|{b}" for b in STEP_BANDS], 0, 0)))
    return out


def _predictions_decoupled(s: dict) -> list[tuple[str, str]]:
    if s.per_seed[0]["bias"] != "0.5:0":
        return [("no written prediction for this bias (docs/lab.md writes it for 0.5:0)", "not judged")]
    long = LENGTH_BAND_NAMES[-1]
    spread = [s[f"1|{long}|{k}"][0] for k in range(FIFTHS)]
    ones = [check(s, f"1|{band}|{k}", -0.1, 0.1) for band in LENGTH_BAND_NAMES for k in range(FIFTHS)
            if s[f"1|{band}|tokens"][0] >= 500]
    return [("1. lambda 1: residual <= 0.1 in every fifth of every band of >= 500 tokens, fifths of 300+ within 0.1",
             combine(ones + ["confirmed" if max(spread) - min(spread) <= 0.1 else "falsified"])),
            ("2. lambda 0.95: the first fifth of 300+-token responses keeps >= 0.25, more than lambda 1 there",
             combine([check(s, f"0.95|{long}|0", 0.25), check(s, (f"0.95|{long}|0", f"1|{long}|0"), 0)])),
            ("3. lambda 0.95: first fifth of 300+ above its last fifth by > 0.05",
             check(s, (f"0.95|{long}|0", f"0.95|{long}|4"), 0.05))]


def _predictions_length_adaptive(s: dict) -> list[tuple[str, str]]:
    bands = [b for b in LENGTH_BAND_NAMES if s.get(f"band|{b}|tokens", (0, 0))[0] >= 1000]
    out = [("1. exact: best lambda 0 and correlation 1 in every band",
            combine([check(s, [f"exact|{b}|lambda" for b in bands], 0, 0),
                     check(s, [f"exact|{b}|corr_at_0" for b in bands], 0.999)]))]
    out += [(f"2. {name}: best lambda 0 in every band", check(s, [f"{name}|{b}|lambda" for b in bands], 0, 0))
            for name in LA_CRITICS if name.startswith("exact+bias:")]
    for name in [c for c in LA_CRITICS if c.startswith("exact+noise:")]:
        cells = []
        for b in bands:
            predicted = math.log10(noise_horizon(float(name.split(":")[1]), s[f"band|{b}|v"][0]))
            cells.append(check(s, f"{name}|{b}|log10_horizon", predicted - math.log10(2), predicted + math.log10(2)))
        if len(bands) >= 2:
            cells.append(check(s, (f"{name}|{bands[-1]}|log10_horizon", f"{name}|{bands[0]}|log10_horizon"), 0))
        out.append((f"3. {name}: best H within 2x of sigma-over-v's in every band, rising with length", combine(cells)))
    out += [(f"4. {name}: best lambda >= 0.98 in every band", check(s, [f"{name}|{b}|lambda" for b in bands], 0.98))
            for name in ("floor", "builtin-long-rm", "pretrained")]
    for name in ("builtin-long-rm", "pretrained") if len(bands) >= 2 else ():
        alphas = [10 ** s[f"{name}|{b}|log10_horizon"][0] / s[f"band|{b}|mean_length"][0] for b in bands]
        law = (s[f"{name}|{bands[0]}|lambda"][0] <= 0.9 and s[f"{name}|{bands[-1]}|lambda"][0] >= 0.98
               and max(alphas) <= 2 * min(alphas))
        out.append((f"5. the paper's law (one alpha, lambda rising with length) does not describe {name}",
                    "falsified" if law else "confirmed"))
    return out


def _predictions_token_level(s: dict) -> list[tuple[str, str]]:
    ratio = {k: s[f"{k}|long_over_short"] for k, _ in TL_ARMS}
    issue = ratio["per-sample"][0] < 0.5 and ratio["token-level"][0] >= 0.8
    return [("1. long bands' (21-40) habit decline per exposure >= 0.7 of the short bands' (1-20), both arms",
             "falsified" if issue else check(s, [f"{k}|long_over_short" for k in ratio], 0.7)),
            ("2. the habit falls at least as fast overall under the per-sample loss",
             check(s, "decline|per-sample-token-level", 0)),
            ("3. misreads at 27-40 steps: the two losses not separated",
             check(s, "lookup_27_40|per-sample-token-level", "no difference"))]


V0, NLL, GRPO, LEARNED = "V* lambda 0", "NLL only", "GRPO token-level", "VAPO mu 0 (learned critic)"


def _predictions_calibration(s: dict) -> list[tuple[str, str]]:
    order = ("V* lambda 0", "V* lambda 0.9", "V* preset lambda", "V* lambda 1")
    return [("1. V* at lambda 0 correlates 1 with its own advantages; its credit falls as lambda rises (0, 0.9, the "
             "preset's, 1)", combine([check(s, "V* lambda 0|corr", 0.999, 1.001),
                                      check(s, [(f"{a}|corr", f"{b}|corr") for a, b in zip(order, order[1:])], 0)])),
            ("2. GRPO's credit below V*'s at the preset's lambda by at least 0.1",
             check(s, ("V* preset lambda|corr", "GRPO|corr"), 0.1)),
            ("3. the value-pretrained critic: credit below V*'s at the preset's lambda, at the first error at least "
             "0.5 SD less negative, a median detection lag of at least 5 tokens",
             combine([check(s, ("V* preset lambda|corr", "value-pretrained|corr"), 0),
                      check(s, ("value-pretrained|first_error", "V* preset lambda|first_error"), 0.5),
                      check(s, "value-pretrained|lag_median", 5)])),
            ("4. the degraded oracles below V* in the order made: noise 0.3 and late 3 below exact, late 10 below "
             "late 3, MC 16 above MC 4", check(s, [("V* lambda 0|corr", "V* + noise 0.3|corr"),
                                                   ("V* lambda 0|corr", "late 3|corr"), ("late 3|corr", "late 10|corr"),
                                                   ("MC 16|corr", "MC 4|corr")], 0))]


def _predictions_credit(s: dict) -> list[tuple[str, str]]:
    gain = lambda a: f"{a}|avg@2_gain"  # noqa: E731
    return [("1. V* at lambda 0 (no NLL) gains more avg@2 than token-level GRPO", check(s, (gain(V0), gain(GRPO)), 0)),
            ("2. ... and more than the NLL alone (self-imitation)", check(s, (gain(V0), gain(NLL)), 0)),
            ("3. the oracle's credit falls with lambda (0 > the preset's > 1), and its gain with it (0 > 1)",
             combine([check(s, [("V* lambda 0|corr", "V* preset lambda|corr"), ("V* preset lambda|corr",
                                                                             "V* lambda 1|corr")], 0),
                      check(s, (gain(V0), gain("V* lambda 1")), 0)])),
            ("4. MC 16 gains at least as much as MC 4", check(s, (gain("MC 16 lambda 0"), gain("MC 4 lambda 0")), 0)),
            ("5. with perfect credit the NLL adds nothing: V* lambda 0 + NLL and V* lambda 0 not separated",
             check(s, (gain("V* lambda 0 + NLL"), gain(V0)), "no difference")),
            ("6. the learned critic sits at GRPO: credit within 0.1 of GRPO's, gains not separated",
             combine([check(s, (f"{LEARNED}|corr", f"{GRPO}|corr"), -0.1, 0.1),
                      check(s, (gain(LEARNED), gain(GRPO)), "no difference")])),
            ("7. where the oracles' curve reaches GRPO's and NLL only's gain (recorded, no prediction)", "not judged")]


def _predictions_hard(s: dict) -> list[tuple[str, str]]:
    end = lambda a: f"{a}|greedy_steps_31-40_end"  # noqa: E731
    return [("1. on 21-40-step problems most of GRPO's first groups are all-fail (>= 0.6 all alike over its first 5 "
             "steps), and the oracle puts at least 0.3 of its |A| on all-fail groups",
             combine([check(s, f"{GRPO}|all_same_first5", 0.6), check(s, f"{V0}|fail_share", 0.3)])),
            ("2. greedy accuracy at 31-40 steps at the end: the oracle above GRPO and above NLL only",
             check(s, [(end(V0), end(GRPO)), (end(V0), end(NLL))], 0)),
            ("3. pass@8 on held-out problems the base never solved (0 of 16): the oracle above GRPO",
             check(s, (f"{V0}|pass8_never_solved", f"{GRPO}|pass8_never_solved"), 0))]


def _predictions_critic_fits(s: dict) -> list[tuple[str, str]]:
    mc, corr = "MC, reward model", "corr|lambda0"
    return [("1. data: the Monte-Carlo critic's credit at lambda 0 rises from 20 to 200 batches, and stays below 0.5",
             combine([check(s, (f"{mc}|200|{corr}", f"{mc}|20|{corr}"), 0), check(s, f"{mc}|200|{corr}", hi=0.5)])),
            ("2. representation: distilled from V*, the same network reaches credit 0.7 at lambda 0 and a median lag "
             "of at most 2 tokens in 100 batches", combine([check(s, f"V*, reward model|100|{corr}", 0.7),
                                                           check(s, "V*, reward model|100|lag_median", hi=2)])),
            ("3. information: reading the reference solution, the critic's credit at 100 batches is above the "
             "Monte-Carlo critic's", check(s, (f"MC, reads the solution|100|{corr}", f"{mc}|100|{corr}"), 0)),
            ("4. capacity: 4x wider and 4x deeper fresh critics not above the fresh one at 50 batches",
             check(s, [(f"MC, fresh 4x wider|50|{corr}", f"MC, fresh|50|{corr}"),
                       (f"MC, fresh 4x deeper|50|{corr}", f"MC, fresh|50|{corr}")], "no difference")),
            ("5. the reward model as initialisation: above a fresh critic at 100 batches",
             check(s, (f"{mc}|100|{corr}", f"MC, fresh|100|{corr}"), 0))]


# docs/lab.md's written predictions, judged on the mean and SE over seeds: {experiment: s -> [(text, verdict)]}
PREDICTIONS = {
    "value-pretraining": _predictions_value_pretraining,
    "decoupled-gae": _predictions_decoupled,
    "length-adaptive": _predictions_length_adaptive,
    "clip-higher": lambda s: [
        *[(f"1. eps_high {e}: the right digit grows by at most 1 + eps_high + 0.1 where the bound was reached",
           check(s, f"{e}|growth_binding", hi=1 + float(e) + 0.1)) for e in CLIP_ARMS],
        ("1. p(right)'s rise over 6 rollouts ordered 0.4 > 0.28 > 0.2", check(s, ["rise6|0.4-0.28", "rise6|0.28-0.2"], 0)),
        ("2. entropy at borrow decisions rises over the first 3 rollouts (p(right) below 1/2), every arm",
         check(s, [f"{e}|dH3" for e in CLIP_ARMS], 0)),
        ("2. the issue's: entropy at decisions falls faster at 0.2 than at 0.28 from the start (6 rollouts; the page "
         "expects this to fail)", check(s, "dH6|0.2-0.28", hi=0)),
        ("3. avg@4 at step 6 ordered 0.4 >= 0.28 >= 0.2", check(s, ["avg@4_6|0.4-0.28", "avg@4_6|0.28-0.2"], 0))],
    "token-level": _predictions_token_level,
    "group-sampling": lambda s: [
        ("1. step 1's share of all-equal groups within 0.1 of the arithmetic, every G",
         check(s, [f"{g}|all_same_1_miss" for g, _ in GS_ARMS], -0.1, 0.1)),
        ("2. avg@2 at the end: G = 8 above G = 2", check(s, "avg@2|8-2", 0)),
        ("2. G = 32 against G = 8 (no prediction: recorded)", "not judged"),
        *([("3. VAPO at G = 1 and G = 8 not separated", check(s, "avg@2|vapo8-vapo1", "no difference"))]
          if "avg@2|vapo8-vapo1" in s else [])],
    "nll": lambda s: [
        ("1. entropy at borrow decisions falls more with the NLL", check(s, "entropy_fall|nll-grpo", 0)),
        ("2. avg@2 gains at least 5 points more with the NLL", check(s, "avg@2_gain|nll-grpo", 0.05)),
        ("2. pass@2 - avg@2 shrinks more with the NLL (sharpening)", check(s, "gap_change|nll-grpo", hi=0))],
    "credit-calibration": _predictions_calibration,
    "critic-fits": _predictions_critic_fits,
    "credit": _predictions_credit,
    "credit-hard": _predictions_hard,
    "credit-pilot": lambda s: [("the oracle arm's actor lr: the best validation mean of greedy and avg@2 (a pick, no "
                                "prediction)", "not judged")],
    "value-pretraining-rl": lambda s: [
        ("falling bias, no value pretraining: 21-40-step responses at least 30% shorter than the base's",
         check(s, "falling|length_change_21_40", hi=-0.3)),
        ("... and shorter than the control's", check(s, "length|falling-control", hi=0)),
        ("with value pretraining: within 10% of the control's length", check(s, "length|pretrained-control", -0.1, 0.1))],
}


# --- figures: one plot of panels -------------------------------------------------------------------------------------
def draw(path: str, title: str, panels: list[dict], width: float = 4.6, **subplots) -> None:
    """One figure of panels side by side, each a dict: title, xlabel, ylabel; lines [(xs, ys, format, plot
    options)]; bars (tick labels, [(label, means, SEs or None)]): grouped bars, one series without a label coloured bar
    by bar; hline (a level drawn dotted), ylim, log (both axes)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 3.9), squeeze=False, **subplots)
    for ax, p in zip(axes[0], panels):
        for xs, ys, fmt, options in p.get("lines", []):
            ax.plot(xs, ys, fmt, **options)
        ticks, series = p.get("bars", ((), ()))
        w = 0.8 / max(len(series), 1)
        for i, (label, means, ses) in enumerate(series):
            ax.bar([x + (i - (len(series) - 1) / 2) * w for x in range(len(ticks))], means, w, label=label,
                   yerr=None if ses is None else [se if se == se else 0 for se in ses],
                   color=f"C{i}" if label else [f"C{k}" for k in range(len(means))])
        if ticks:  # many bars: their labels slanted, so that they do not overlap
            ax.set_xticks(range(len(ticks)), ticks, fontsize=7, rotation=30 if len(ticks) > 6 else 0,
                          ha="right" if len(ticks) > 6 else "center")
        if "hline" in p:
            ax.axhline(p["hline"], color="k", lw=0.5, ls=":")
        if p.get("log"):
            ax.set(xscale="log", yscale="log")
        ax.set(xlabel=p.get("xlabel", ""), ylabel=p.get("ylabel", ""), **({"ylim": p["ylim"]} if "ylim" in p else {}))
        ax.set_title(p.get("title", ""), fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mean(rows: list[list[float]]) -> list[float]:
    return [statistics.mean(col) if all(c == c for c in col) else float("nan") for col in zip(*rows)]


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# --- publishing an experiment's verdicts, and the command line -------------------------------------------------------
def publish(name: str, results: list[dict], out: str, draw, note: str, **fields) -> dict:
    """Judge the seeds' measures (their mean and SE) against docs/lab.md's written predictions: NAME.json (with
    fields) and NAME.png (draw(results, path)) into out, and the verdicts printed."""
    stats = summarise(results)
    verdicts = PREDICTIONS[name](stats)
    if len(results) < 2:  # one seed has no standard error: every difference would look separated
        verdicts = [(text, "not judged" if verdict == "not judged" else "one seed") for text, verdict in verdicts]
    summary = {"name": name, "date": common.now(), "machine": common.machine(), **fields, "note": note,
               "mean_se": {k: list(v) for k, v in stats.items()}, "verdicts": verdicts}
    common.write_json(os.path.join(out, f"{name}.json"), summary)
    draw(results, os.path.join(out, f"{name}.png"))
    print(f"\nverdicts against docs/lab.md's written predictions{' (' + note + ')' if note else ''}:")
    for text, verdict in summary["verdicts"]:
        print(f"  {verdict:>14}  {text}")
    print(f"figures and records: {out}")
    return summary


def publish_seeds(name: str, args, out: str, make, sizes: dict, draw) -> dict | None:
    """An experiment without RL runs: each seed's record out/NAME-sSEED.json, made by make(args, seed) where it is
    missing (kept where it is not; with --report, nothing is made), then judged over the seeds (publish), noting a
    smoke run below the written sizes (sizes: {option: (written default, help)})."""
    per_seed = []
    for seed in args.seeds:
        path = os.path.join(out, f"{name}-s{seed}.json")
        if not os.path.exists(path):
            if args.report:
                continue
            common.write_json(path, make(args, seed))
        per_seed.append(common.read_json(path))
    if not per_seed:
        return None
    small = any(getattr(args, k) < d for k, (d, _) in sizes.items())
    return publish(name, per_seed, out, draw, "a smoke run below the written sizes" if small else "",
                   seeds=[r["seed"] for r in per_seed], sizes={k: getattr(args, k) for k in sizes})


def main(argv=None):
    from lab_analyses import ANALYSES, SIZES, run_analysis  # imported here, not at the top: both import this module
    from lab_credit import CALIBRATION_SIZES, RL as CREDIT_RL, arm_labels, print_runs, report, run, run_calibration
    from lab_critic import SIZES as FIT_SIZES, run_critic_fits
    from lab_rl import RL_JUDGES, print_rl_runs, record, report_rl, run_rl
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["record"]:
        return record(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = ap.add_subparsers(dest="name", required=True, metavar="NAME")
    commands.add_parser("record", help="-- VAPO.PY OPTIONS: one vapo.py run writing its decisions.jsonl")
    for name in (*ANALYSES, *RL_JUDGES, "credit-calibration", *CREDIT_RL, "critic-fits"):
        p = commands.add_parser(name, help=f"docs/lab.md, {name}", description=f"docs/lab.md, {name}")
        p.add_argument("--seeds", type=int, nargs="+", default=[0])
        p.add_argument("--out", default=None, help="default runs/lab/NAME")
        p.add_argument("--report", action="store_true", help="run nothing: judge the finished runs, or the seeds' "
                       "records (NAME-sSEED.json) in --out")
        sizes = {"credit-calibration": CALIBRATION_SIZES, "critic-fits": FIT_SIZES}.get(name, SIZES if name in
                                                                                         ANALYSES else {})
        for size, (default, help_) in sizes.items():
            p.add_argument("--" + size.replace("_", "-"), type=int, default=default, help=f"{help_} ({default})")
        if name == "decoupled-gae":
            p.add_argument("--bias", default="0.5:0", help="OFFSET:SLOPE of the starting bias b")
        if name in CREDIT_RL:
            p.add_argument("--run", action="store_true", help="run them (resumable), then judge them")
            p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
            p.add_argument("--kept", metavar="DIR", help="a folder of kept per-seed records NAME-sSEED.json (docs/lab "
                           "keeps the published ones): their arms are measured, not run again")
            p.add_argument("--arms", nargs="+", metavar="LABEL", help="run (or print) only these arms, by their exact "
                           "labels (for example 'NLL only'); the report still judges every arm measured")
        if name in RL_JUDGES:
            p.add_argument("--extension", action="store_true", help="also the page's extension arms")
            p.add_argument("--run", action="store_true", help="run them (resumable), then judge them")
            p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    args = ap.parse_args(argv)
    out = args.out or os.path.join(common.ROOT, "runs", "lab", args.name)
    if args.name in ANALYSES:
        return run_analysis(args, out)
    if args.name == "credit-calibration":
        return run_calibration(args, out)
    if args.name == "critic-fits":
        return run_critic_fits(args, out)
    if args.name in CREDIT_RL:
        try:
            arm_labels(args.name, args.arms)
        except ValueError as e:
            ap.error(str(e))
        if args.run:
            run(args.name, args.seeds, out, args.jobs, args.kept, args.arms)
        if args.run or args.report:
            return report(args.name, args.seeds, out, args.kept)
        return print_runs(args.name, args.seeds, out, args.arms)
    if args.run:
        run_rl(args.name, args.seeds, out, args.extension, args.jobs)
    if args.run or args.report:
        return report_rl(args.name, args.seeds, out, args.extension)
    return print_rl_runs(args.name, args.seeds, out, args.extension)


if __name__ == "__main__":
    main()
