"""The mechanism lab (issue 47): each of VAPO's techniques seen acting on the failure it was made for, in a controlled,
labelled setup on the built-in task and its shipped models. docs/lab.md gives each experiment's failure, setup,
prediction (committed before any run), what would falsify it, and its results; PREDICTIONS below are its thresholds.

    python bench/lab.py value-pretraining | decoupled-gae | length-adaptive [--seeds 0 1 2] [--report]
    python bench/lab.py value-pretraining-rl | clip-higher | token-level | group-sampling | nll [--seeds 0 1 2]
                        [--extension] [--run [--jobs 2] | --report]   # with neither: print the planned vapo.py runs
    python bench/lab.py record -- VAPO.PY OPTIONS                     # one such run, writing its decisions.jsonl

Each experiment writes NAME.json (every seed's measures, their mean and SE over seeds, and the verdicts against the
written prediction: confirmed / falsified / not separated) and NAME.png into --out (default runs/lab/NAME); an
analysis also NAME-sSEED.json per seed, and sizes below the written setup's make it a smoke run, not a result. The
critics are constructed references, labelled so: V* (exact_values.ExactValues) plus a bias of known shape
b(t) = offset + slope * t / 100, or plus noise; where a critic must learn, V = V* + b + h, h a value network whose
head starts at zero, trained by the trainer's own critic step.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

import common  # (puts the repository on the path)
import config
from machinery import exact_values
from machinery import task
import vapo
from common import fitted_exact, folder_of, held_out, sample_set, token_ends
from machinery.data import prompt_batch
from machinery.engines import HFEngine
from gae import gae, length_adaptive_lambda, terminal_rewards
from losses import first_tenth_mask
from machinery.models import autocast, load_tokenizer, load_value_model, zero_head
from machinery.run import Hooks
from machinery.plots import read_jsonl
from rollout import response_logprobs, response_values, score_rollout

POLICY, CRITIC = "builtin-long", "builtin-long-rm"  # the long chains' base policy, and its outcome reward model
ALPHA = 0.5  # --preset long's alpha of the length-adaptive lambda
LENGTH_BANDS = ((1, 50), (50, 100), (100, 200), (200, 300), (300, 10_000))  # response length in tokens, [lo, hi)
LENGTH_BAND_NAMES = [f"{lo}+" if hi > 1000 else f"{lo}-{hi - 1}" for lo, hi in LENGTH_BANDS]
STEP_BANDS = ("1-10", "11-20", "21-30", "31-40")  # task.band_of(n_steps)
FIFTHS = 5


# --- the constructed critics, and the batch they are judged on ---------------------------------------------------
def parse_bias(text: str) -> tuple[float, float]:
    """"OFFSET:SLOPE" -> (offset, slope) of b(t) = offset + slope * t / 100."""
    offset, slope = text.split(":")
    return float(offset), float(slope)


def predicted_shift(lengths: torch.Tensor, T: int, offset: float, slope: float, lam) -> torch.Tensor:
    """(A1) of docs/lab.md in closed form, [B, T] (0 past each end): GAE(lambda) of V* + b minus GAE(lambda) of V*,
    dA_t = (slope/100) (1 - lambda^d) / (1 - lambda) - lambda^d b(l - 1) with d = l - 1 - t (at lambda 1 the fraction
    is d). lam a float or [B]. Written from the algebra, not from gae(), so that the two check each other."""
    B = lengths.shape[0]
    lam = torch.as_tensor(lam, dtype=torch.float64).expand(B)[:, None]  # [B, 1]
    length = lengths.to(torch.float64)[:, None]  # [B, 1]
    t = torch.arange(T, dtype=torch.float64)[None, :]  # [1, T]
    d = (length - 1 - t).clamp(min=0)  # [B, T]
    power = lam ** d  # [B, T]
    frac = torch.where(lam < 1, (1 - power) / (1 - lam).clamp(min=1e-12), d)  # sum_{k<d} lambda^k
    last = offset + slope * (length - 1) / 100  # [B, 1], b(l - 1)
    shift = slope / 100 * frac - power * last
    return (shift * (t < length)).float()


def bias_values(mask: torch.Tensor, offset: float, slope: float) -> torch.Tensor:
    """[B, T] b(t) = offset + slope * t / 100 on the real tokens (t = the token's index in its response, 0 = the
    first; slope in value units per 100 tokens), 0 under the mask. mask: [B, T]."""
    t = torch.arange(mask.shape[1], dtype=torch.float32, device=mask.device)[None, :]  # [1, T]
    return (offset + slope * t / 100) * mask


def noisy_values(star: torch.Tensor, mask: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    """[B, T] V* plus independent Gaussian noise of standard deviation sigma on every real token."""
    g = torch.Generator().manual_seed(seed)
    return (star + sigma * torch.randn(star.shape, generator=g)) * mask


def reference_set(prompts: int, samples: int, seed: int) -> dict:
    """The batch the analyses judge (common.sample_set of the base policy), with V* and the step-count floor fitted
    on another sample set of the same size (common.fitted_exact)."""
    _, rollout, rewards, _ = sample_set(POLICY, prompts, samples, seed)
    exact = fitted_exact(POLICY, prompts, samples, seed)
    problems = [held_out(prompts)[int(i)] for i in rollout.prompt_index]
    tokenizer = load_tokenizer(folder_of(POLICY))
    return {"rollout": rollout, "rewards": rewards, "problems": problems, "exact": exact, "tokenizer": tokenizer,
            "star": exact.values(rollout, problems, tokenizer), "floor": exact.floor_values(rollout, problems)}


def band_masks(rollout) -> dict[str, torch.Tensor]:
    """{length band: [B, T] bool}: the real tokens of the responses whose length falls in it."""
    bands = [next(name for name, (lo, hi) in zip(LENGTH_BAND_NAMES, LENGTH_BANDS) if lo <= n < hi)
             for n in rollout.lengths.tolist()]
    mask = rollout.response_mask.bool()
    return {name: mask & torch.tensor([b == name for b in bands])[:, None] for name in LENGTH_BAND_NAMES}


def part_masks(mask: torch.Tensor, parts: int = FIFTHS) -> list[torch.Tensor]:
    """[parts] of [B, T] bool: the real tokens in each fifth (tenth, ...) of their response, by t / l."""
    lengths = mask.sum(-1, keepdim=True).clamp(min=1)
    rel = torch.arange(mask.shape[1])[None, :] / lengths  # [B, T]
    return [mask.bool() & (rel >= k / parts) & (rel < (k + 1) / parts) for k in range(parts)]


def lambdas(name: str, lengths: torch.Tensor) -> torch.Tensor:
    """[B] lambda of each response: "adaptive" (1 - 1 / (ALPHA l)) or a number."""
    if name == "adaptive":
        return length_adaptive_lambda(lengths, ALPHA)
    return torch.full(lengths.shape, float(name))


# --- 1. value pretraining: the arithmetic before RL ----------------------------------------------------------------
VP_BIASES = ("0:-0.5", "0:-0.25", "-0.5:0.125", "0:0.5", "0.5:0", "0:0")
VP_LAMBDAS = ("0.95", "1", "adaptive")
MORE_TOKENS = 10  # "go on" at EOS: one more line (10 tokens) before an EOS
TIE = 1e-6  # a biased gap within this of 0 is float noise (at lambda 1 the shifts cancel exactly), not a preference


def line_starts(text: str, problem: dict) -> list[int]:
    """Character offsets of the step lines the response began while still on the correct chain (task.solve), and 0:
    where it could have written its answer line instead."""
    chain = task.solve(problem)
    k = len(os.path.commonprefix([text, chain]))
    starts = [0] + [i + 1 for i, ch in enumerate(text[:k]) if ch == "\n"]
    return [i for i in starts if i < k and not chain[i:].startswith(task.ANSWER_PREFIX)]


def decisions(ref: dict, offset: float, slope: float, lam_name: str) -> dict:
    """The decisions a critic V* + b reverses (docs/lab.md, 1b), by step band: stop or go on at each on-chain line
    start, end or write MORE_TOKENS more at each EOS. {"stop" | "eos": {band: [reversed, counted]}}."""
    rollout, exact, rewards = ref["rollout"], ref["exact"], ref["rewards"]
    shift = predicted_shift(rollout.lengths, rollout.T, offset, slope, lambdas(lam_name, rollout.lengths))  # [B, T]

    def shift_in(length: int, t: int) -> torch.Tensor:  # the shift token t would get in a response of that length
        n = torch.tensor([length])
        return predicted_shift(n, length, offset, slope, lambdas(lam_name, n))[0, t]
    out = {"stop": {b: [0, 0] for b in STEP_BANDS}, "eos": {b: [0, 0] for b in STEP_BANDS}}
    for b in range(rollout.B):
        problem, n = ref["problems"][b], int(rollout.lengths[b])
        band = task.band_of(problem["n_steps"])
        chain_values = exact.char_values(task.solve(problem), problem)  # V* along the correct chain
        guess_value = exact.char_values(task.ANSWER_PREFIX[0], problem)[1]  # 2 P(right | guess) - 1
        m = len(task.ANSWER_PREFIX) + len(problem["answer"]) + 1  # the answer line and its EOS
        ends = token_ends(ref["tokenizer"], rollout, b)
        for char in line_starts(rollout.texts[b], problem):
            t = int((ends <= char).sum())  # the token whose text covers that character
            q_stop = guess_value if char == 0 else -1.0  # stopping mid-chain states a total that is not the answer
            q_go = chain_values[char + 1]  # the chain's next character written right
            if q_stop - q_go >= 0:  # the true values do not prefer going on: not counted
                continue
            out["stop"][band][1] += 1
            out["stop"][band][0] += int(q_stop - q_go + shift_in(t + m, t) - shift[b, t] > TIE)
        if not rollout.truncated[b]:
            out["eos"][band][1] += 1
            out["eos"][band][0] += int(-1.0 - float(rewards[b]) + shift_in(n + MORE_TOKENS, n - 1) - shift[b, n - 1]
                                       > TIE)
    return out


def value_pretraining(args, seed: int) -> dict:
    """Experiment 1, part 1: per bias and lambda, the measured advantage shift A(V* + b) - A(V*) against (A1)-(A2)
    (first tenth, EOS, by tenth of the 300+-token responses), and the shares of decisions reversed."""
    ref = reference_set(args.prompts, args.samples, seed)
    rollout, star, rewards = ref["rollout"], ref["star"], ref["rewards"]
    mask = rollout.response_mask
    terminal = terminal_rewards(rewards, mask)
    first = first_tenth_mask(mask).bool()
    eos = torch.zeros_like(first)
    eos[torch.arange(rollout.B), rollout.lengths - 1] = True
    tenths = [(rollout.lengths >= 300)[:, None] & m for m in part_masks(mask, 10)]
    wrong = {band: [0, 0] for band in STEP_BANDS}
    for b in range(rollout.B):
        if not rollout.truncated[b]:
            cell = wrong[task.band_of(ref["problems"][b]["n_steps"])]
            cell[0] += int(rewards[b] < 0)
            cell[1] += 1
    out = {"responses": rollout.B, "mean_length": float(rollout.lengths.float().mean()),
           "right": float((rewards > 0).float().mean()), "wrong_share_by_band": _shares(wrong),
           "wrong_share": sum(c[0] for c in wrong.values()) / max(sum(c[1] for c in wrong.values()), 1), "cells": {}}
    measures = {}
    for bias in VP_BIASES:
        offset, slope = parse_bias(bias)
        biased = star + bias_values(mask, offset, slope)
        for lam_name in VP_LAMBDAS:
            lam = lambdas(lam_name, rollout.lengths)
            measured = gae(terminal, biased, mask, lam=lam)[0] - gae(terminal, star, mask, lam=lam)[0]  # [B, T]
            predicted = predicted_shift(rollout.lengths, rollout.T, offset, slope, lam)
            d = decisions(ref, offset, slope, lam_name)
            cell = {"first_tenth": float(measured[first].mean()),
                    "first_tenth_predicted": float(predicted[first].mean()),
                    "eos": float(measured[eos].mean()), "eos_predicted": float(predicted[eos].mean()),
                    "max_abs_difference": float((measured - predicted).abs().max()),
                    "long_by_tenth": [float(measured[m].mean()) if m.any() else float("nan") for m in tenths],
                    "stop_reversed": _shares(d["stop"]), "stop_counts": d["stop"],
                    "eos_reversed": _shares(d["eos"]), "eos_counts": d["eos"]}
            out["cells"][f"{bias} lambda {lam_name}"] = cell
            key = f"{bias}|{lam_name}"
            measures[f"{key}|max_abs_difference"] = cell["max_abs_difference"]
            for band in STEP_BANDS:
                measures[f"{key}|stop|{band}"] = cell["stop_reversed"][band]
                measures[f"{key}|eos|{band}"] = cell["eos_reversed"][band]
    for band in STEP_BANDS:
        measures[f"wrong|{band}"] = out["wrong_share_by_band"][band]
    out["measures"] = measures
    return out


def _shares(counts: dict) -> dict:
    """{band: reversed / counted} (NaN where nothing was counted)."""
    return {band: (r / n if n else float("nan")) for band, (r, n) in counts.items()}


def draw_value_pretraining(results: list[dict], path: str) -> None:
    biases = results[0]["biases"]
    cells = lambda bias, lam, key: [r["cells"][f"{bias} lambda {lam}"][key] for r in results]  # noqa: E731
    shift = {"title": "advantage shift A(V*+b) - A(V*), responses of 300+ tokens\nsolid: lambda 0.95, dotted: "
                      "lambda 1 (= -b(t))", "xlabel": "position in the response (%)",
             "lines": [(range(5, 100, 10), _mean(cells(bias, lam, "long_by_tenth")), style,
                        dict(color=f"C{i}", marker="o", ms=3, label=bias if lam == "0.95" else None))
                       for i, bias in enumerate(biases) for lam, style in (("0.95", "-"), ("1", ":"))]}
    stops = [{"title": f"stopping made to look better, lambda {lam}", "xlabel": "problem's steps",
              "ylabel": "share of on-chain line starts", "ylim": (0, 1),
              "bars": (STEP_BANDS, [(bias, _mean([[c[b] for b in STEP_BANDS] for c in cells(bias, lam, "stop_reversed")]),
                                     None) for bias in biases])} for lam in ("0.95", "adaptive")]
    draw(path, f"constructed critics V* + b(t), b = offset:slope = offset + slope t/100, before any RL "
               f"({len(results)} seed(s))", [shift, *stops])


# --- 2. decoupled GAE: critic-only fits from a biased start -------------------------------------------------------
CHECKPOINTS = (5, 10, 20)  # the fits are judged at 0 batches, these, and the last


def training_batches(args, seed: int) -> list[dict]:
    """args.batches batches of args.batch_prompts training-split problems x args.group samples of the frozen base
    policy (value pretraining's prompt stream of this seed), each {"rollout", "problems", "rewards"}."""
    from machinery.models import load_policy
    model, tokenizer = load_policy(folder_of(POLICY), dtype=torch.float32)
    engine = HFEngine(model, tokenizer, max_new_tokens=task.LONG.max_response_tokens, batch_size=args.batch_prompts)
    rows = task.make_dataset(20000, config.stream(seed, "builtin_rows"), task.LONG.min_steps, task.LONG.max_steps,
                             split="train")
    parts = []
    for s in range(args.batches):
        batch = prompt_batch(rows, s, args.batch_prompts, config.stream(seed, "pretrain_prompts"))
        with torch.no_grad():
            rollout = engine.generate([r["prompt"] for r in batch], n=args.group, seed=1000 * (seed + 1) + s)
        problems = [batch[int(i)] for i in rollout.prompt_index]
        rewards = torch.tensor([1.0 if task.is_correct(t, p["answer"]) else -1.0
                                for t, p in zip(rollout.texts, problems)])
        parts.append({"rollout": rollout, "problems": problems, "rewards": rewards})
    return parts


def fit_critic(critic, parts: list[dict], lam: float, base=None, checkpoints=(), look=None) -> list[dict]:
    """Critic-only updates with --preset long's critic settings: per batch, V = h + base(part) (or h alone), the
    targets GAE(lambda)'s returns of V, and h stepped on them minus base by the trainer's own critic step
    (vapo.update, train_policy False). Returns look(batches) at each batch count in checkpoints (0: before any)."""
    cfg = vapo.Config(**{**config.PRESETS["long"], "value_model": None}).validate()
    optimizers = {"critic": vapo.make_optimizer(critic, cfg.critic_lr, cfg)}
    records = [look(0)] if look is not None and 0 in checkpoints else []
    for i, part in enumerate(parts):
        rollout, mask = part["rollout"], part["rollout"].response_mask
        h = score_rollout(None, critic, rollout, cfg.micro_batch_size)["values"]  # [B, T]
        offset = base(part) if base is not None else torch.zeros_like(h)
        _, returns = gae(terminal_rewards(part["rewards"], mask), h + offset, mask, lam=lam)
        vapo.update(None, critic, optimizers, rollout, {"values": h, "returns": returns - offset}, cfg,
                    train_policy=False)
        if look is not None and i + 1 in checkpoints:
            records.append(look(i + 1))
    return records


def residual_table(residual: torch.Tensor, rollout) -> dict:
    """{band: {"tokens": n, "by_fifth": [mean residual per fifth]}} over the real tokens of each length band."""
    out = {}
    for band, bm in band_masks(rollout).items():
        cells = [residual[bm & f] for f in part_masks(rollout.response_mask)]
        out[band] = {"tokens": int(bm.sum()), "by_fifth": [float(c.mean()) if c.numel() else float("nan")
                                                           for c in cells]}
    return out


def decoupled_gae(args, seed: int) -> dict:
    """Experiment 2: from V = V* + b + h (h the reward model's network, head zeroed), critic-only fits with target
    lambda 0.95 and 1 on the same batches; the residual bias V - V* by fifth and length band on held-out responses
    at each checkpoint, and beside it what one exact tabular update leaves ((A4): b + (A1))."""
    torch.manual_seed(seed)
    offset, slope = parse_bias(args.bias)
    parts = training_batches(args, seed)
    tokenizer = load_tokenizer(folder_of(POLICY))
    exact = exact_values.ExactValues()  # V* of the frozen policy, fitted on the training batches
    for part in parts:
        exact.observe(part["rollout"].texts, part["problems"], part["rewards"])
    for part in parts:
        part["base"] = exact.values(part["rollout"], part["problems"], tokenizer) + bias_values(
            part["rollout"].response_mask, offset, slope)
    _, val, _, _ = sample_set(POLICY, args.prompts, args.samples, seed)  # held-out responses to judge on
    val_bias = bias_values(val.response_mask, offset, slope)
    checkpoints = tuple(sorted({0, *[c for c in CHECKPOINTS if c <= args.batches], args.batches}))
    out = {"bias": args.bias, "batches": args.batches, "responses": val.B, "checkpoints": list(checkpoints), "fits": {},
           "tabular_one_update": {}}
    for lam in (0.95, 1.0):
        torch.manual_seed(seed)
        critic = zero_head(load_value_model(folder_of(CRITIC), dtype=torch.float32))
        look = lambda batches: {"batches": batches, "residual": residual_table(  # noqa: E731
            val_bias + score_rollout(None, critic, val, 16)["values"], val)}
        out["fits"][f"{lam:g}"] = fit_critic(critic, parts, lam, lambda p: p["base"], checkpoints, look)
        one_update = val_bias + predicted_shift(val.lengths, val.T, offset, slope, torch.full((val.B,), lam))
        out["tabular_one_update"][f"{lam:g}"] = residual_table(one_update, val)
    measures = {}
    for lam, records in out["fits"].items():
        for band, cell in records[-1]["residual"].items():
            for k, value in enumerate(cell["by_fifth"]):
                measures[f"{lam}|{band}|{k}"] = value
            measures[f"{lam}|{band}|tokens"] = cell["tokens"]
    out["measures"] = measures
    return out


def draw_decoupled(results: list[dict], path: str) -> None:
    band, fifths = LENGTH_BAND_NAMES[-1], range(10, 100, 20)
    panels = [{"title": f"target lambda {lam}", "xlabel": f"position in the response (%), responses of {band} tokens",
               "ylabel": "residual bias V - V* (constructed critic)", "hline": 0,
               "lines": [(fifths, _mean([r["fits"][lam][j]["residual"][band]["by_fifth"] for r in results]), "o-",
                          {"label": f"after {n} batches"}) for j, n in enumerate(results[0]["checkpoints"])]
               + [(fifths, _mean([r["tabular_one_update"][lam][band]["by_fifth"] for r in results]), "k--",
                   {"label": "a table, one exact update (A4)"})]} for lam in ("0.95", "1")]
    draw(path, f"critic-only fits from V* + b, b = {results[0]['bias']} (offset:slope per 100 tokens), "
               f"{len(results)} seed(s)", panels, sharey=True)


# --- 3. length-adaptive GAE: the lambda that best matches V*'s advantages ------------------------------------------
HORIZONS = [10 ** (i / 10) for i in range(31)] + [math.inf]  # H = 1 / (1 - lambda): 1 (lambda 0) .. 1000, and lambda 1
INF_LOG10 = 4.0  # log10 of the horizon recorded for lambda 1 (one step past the grid's 1000)
LA_CRITICS = ("exact", "exact+bias:0.5:0", "exact+bias:-0.5:0.125", "exact+noise:0.1", "exact+noise:0.3", "floor",
              CRITIC, "pretrained")


def lam_of(horizon: float) -> float:
    return 1.0 if math.isinf(horizon) else 1.0 - 1.0 / horizon


def noise_horizon(sigma: float, v: float) -> float:
    """The best horizon 1 / (1 - lambda) for V* + independent noise sigma, where V*'s TD errors have variance v a
    token: lambda / (1 - lambda)^2 = sigma^2 / v (docs/lab.md, experiment 3), solved for lambda."""
    if v <= 0:
        return math.inf
    x = sigma ** 2 / v
    lam = ((2 * x + 1) - math.sqrt(4 * x + 1)) / (2 * x)
    return 1.0 / (1.0 - lam)


def best_lambda(values: torch.Tensor, star: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor,
                bands: dict[str, torch.Tensor], horizons=HORIZONS) -> dict:
    """Per band ({name: [B, T] bool}), the correlation over its tokens between GAE(lambda) of values and V*'s
    one-step TD error for each horizon, and the best. {band: {"curve", "best_horizon", "best_lambda"}}."""
    terminal = terminal_rewards(rewards, mask)
    delta = gae(terminal, star, mask, lam=0.0)[0]  # [B, T], V*'s advantages
    curves = {band: [] for band in bands}
    for horizon in horizons:
        adv = gae(terminal, values, mask, lam=lam_of(horizon))[0]
        for band, m in bands.items():
            curves[band].append(_corr(adv[m], delta[m]))
    out = {}
    for band, curve in curves.items():
        finite = [c if c == c else -2.0 for c in curve]
        i = max(range(len(horizons)), key=lambda j: finite[j])
        out[band] = {"curve": curve, "best_horizon": horizons[i], "best_lambda": lam_of(horizons[i])}
    return out


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    denom = (a.pow(2).sum() * b.pow(2).sum()).sqrt()
    return float((a * b).sum() / denom) if a.numel() > 2 and denom > 0 else float("nan")


def critic_values(name: str, ref: dict, args, seed: int) -> torch.Tensor:
    """[B, T] the values of one of LA_CRITICS on the reference batch ("pretrained": the reward model after value
    pretraining here, lambda 1)."""
    rollout, star = ref["rollout"], ref["star"]
    mask = rollout.response_mask
    if name == "exact":
        return star
    if name.startswith("exact+bias:"):
        return star + bias_values(mask, *parse_bias(name.removeprefix("exact+bias:")))
    if name.startswith("exact+noise:"):
        return noisy_values(star, mask, float(name.removeprefix("exact+noise:")), seed)
    if name == "floor":
        return ref["floor"]
    critic = load_value_model(folder_of(CRITIC if name == "pretrained" else name), dtype=torch.float32)
    if name == "pretrained":
        fit_critic(critic, training_batches(args, seed), 1.0)
    return score_rollout(None, critic, rollout, 16)["values"]


def length_adaptive(args, seed: int) -> dict:
    """Experiment 3: per critic and length band, the lambda whose advantages best match V*'s."""
    torch.manual_seed(seed)
    ref = reference_set(args.prompts, args.samples, seed)
    rollout, star, rewards = ref["rollout"], ref["star"], ref["rewards"]
    mask = rollout.response_mask
    bands = band_masks(rollout)
    delta = gae(terminal_rewards(rewards, mask), star, mask, lam=0.0)[0]
    out = {"responses": rollout.B, "horizons": [h if not math.isinf(h) else "inf" for h in HORIZONS], "bands": {},
           "critics": {}}
    for band, m in bands.items():
        lengths = rollout.lengths[m.any(-1)].float()
        out["bands"][band] = {"tokens": int(m.sum()), "responses": int(m.any(-1).sum()),
                              "mean_length": float(lengths.mean()) if lengths.numel() else float("nan"),
                              "v": float(delta[m].pow(2).mean()) if m.any() else float("nan")}
    measures = {}
    for name in LA_CRITICS:
        fit = best_lambda(critic_values(name, ref, args, seed), star, rewards, mask, bands)
        for band, cell in fit.items():
            h, length = cell["best_horizon"], out["bands"][band]["mean_length"]
            cell["alpha"] = h / length if length == length else float("nan")
            if name.startswith("exact+noise:"):
                cell["predicted_horizon"] = noise_horizon(float(name.split(":")[1]), out["bands"][band]["v"])
            measures[f"{name}|{band}|lambda"] = cell["best_lambda"]
            measures[f"{name}|{band}|log10_horizon"] = INF_LOG10 if math.isinf(h) else math.log10(h)
            measures[f"{name}|{band}|corr_at_0"] = cell["curve"][0]
            for k in ("best_horizon", "alpha", "predicted_horizon"):  # JSON has no infinity: lambda 1 is "inf"
                if k in cell and math.isinf(cell[k]):
                    cell[k] = "inf"
        out["critics"][name] = fit
    for band, cell in out["bands"].items():
        for k in ("tokens", "v", "mean_length"):
            measures[f"band|{band}|{k}"] = cell[k]
    out["measures"] = measures
    return out


def draw_length_adaptive(results: list[dict], path: str) -> None:
    lengths = [results[0]["bands"][b]["mean_length"] for b in LENGTH_BAND_NAMES]
    best = lambda name, band: statistics.mean(10 ** INF_LOG10 if h == "inf" else h for h in  # noqa: E731
                                              (r["critics"][name][band]["best_horizon"] for r in results))
    lines = [(lengths, [best(name, b) for b in LENGTH_BAND_NAMES], "o-", {"label": name})
             for name in results[0]["critics"]]
    lines += [(lengths, [max(alpha * n, 1) for n in lengths], style, {"lw": 0.8, "label": f"paper: H = {alpha} l"})
              for alpha, style in ((0.05, "k:"), (0.5, "k--"))]
    draw(path, "the lambda whose advantages best match V*'s, per length band (constructed critics labelled exact+...)",
         [{"xlabel": "mean response length of the band (tokens)", "log": True, "lines": lines,
           "ylabel": "best horizon H = 1/(1 - lambda) (10^4: lambda 1)"}], width=8)


# --- the RL experiments: their runs, and each run's per-update record of the batch's borrow decisions ---------------
DECISIONS = "decisions.jsonl"  # in the run folder of `bench/lab.py record -- VAPO.PY OPTIONS`, one line per RL step
RECORD = ("bench/lab.py", "record", "--")  # what runs each RL run: vapo.py, with that record


def decision_table(policy, rollout, tokenizer, temperature: float) -> dict[str, torch.Tensor]:
    """The batch's borrow decisions (task.borrow_decisions) under policy: rows, cols [n] (response b, token t),
    "right" (the sample wrote the right digit), "lp_right" (log pi of the right digit, from a copy of the batch with
    that one token swapped in: the same prefix), "lp_sampled" and "entropy" there. Decisions on a token of more than
    one character are left out (the built-in tokenizer has none)."""
    rows, cols, right_ids, right = [], [], [], []
    for b, text in enumerate(rollout.texts):
        ends = token_ends(tokenizer, rollout, b)
        for char, digit in task.borrow_decisions(text):
            t = int((ends <= char).sum())  # the token whose text covers that character
            if t >= len(ends) or int(ends[t]) - (int(ends[t - 1]) if t else 0) != 1:
                continue
            ids = tokenizer.encode(digit, add_special_tokens=False)
            rows.append(b), cols.append(t), right_ids.append(ids[0]), right.append(text[char] == digit)
    rows, cols = torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)
    swapped = rollout.response_ids.clone()
    swapped[rows, cols] = torch.tensor(right_ids, dtype=torch.long)
    was_training = policy.training
    policy.eval()
    with torch.no_grad():
        lp, entropy = response_logprobs(policy, rollout, temperature, with_entropy=True)  # [B, T]
        lp_right, _ = response_logprobs(policy, dataclasses.replace(rollout, response_ids=swapped), temperature)
    policy.train(was_training)
    return {"rows": rows, "cols": cols, "right": torch.tensor(right, dtype=torch.bool),
            "lp_right": lp_right[rows, cols], "lp_sampled": lp[rows, cols], "entropy": entropy[rows, cols]}


def decision_record(before: dict, after: dict, advantages: torch.Tensor, bands: list[str] | None,
                    eps_high: float) -> dict:
    """One step's record of its borrow decisions (decision_table before and after the update): "pushed" (right, with
    a positive advantage), "binding" (pushed, ratio at or past 1 + eps_high), growth = p_after / p_before of the right
    digit; with bands (each row's step band), the samples, decisions and the habit's count per band."""
    n = len(before["rows"])
    out = {"decisions": n}
    if n == 0:
        return out | ({f"rows|{band}": sum(b == band for b in bands) for band in STEP_BANDS} if bands else {})
    p0, p1 = before["lp_right"].exp(), after["lp_right"].exp()
    growth = p1 / p0.clamp(min=1e-12)
    ratio = (after["lp_sampled"] - before["lp_sampled"]).exp()
    pushed = before["right"] & (advantages[before["rows"], before["cols"]] > 0)
    binding = pushed & (ratio >= 1 + eps_high - 1e-6)
    out |= {"p_right_before": p0.mean().item(), "p_right_after": p1.mean().item(),
            "entropy_before": before["entropy"].mean().item(), "entropy_after": after["entropy"].mean().item(),
            "sampled_right": before["right"].float().mean().item(), "pushed": int(pushed.sum()),
            "binding": int(binding.sum()),
            "growth_pushed": growth[pushed].mean().item() if pushed.any() else None,
            "growth_binding": growth[binding].mean().item() if binding.any() else None,
            "growth_max": growth[pushed].max().item() if pushed.any() else None}
    if bands is not None:
        for band in STEP_BANDS:
            out[f"rows|{band}"] = sum(b == band for b in bands)  # the batch's samples by their problem's band
            here = torch.tensor([bands[int(b)] == band for b in before["rows"]], dtype=torch.bool)
            out[f"exposures|{band}"] = int(here.sum())
            out[f"habit|{band}"] = int((here & ~before["right"]).sum())
    return out


class DecisionRecorder:
    """An observer (machinery/run.py, Hooks) of a lab run: the batch's borrow decisions scored under the policy before
    and after each RL step's update (decision_table, decision_record), one line per step in the run folder's
    DECISIONS. Its record is a file of its own, so its checkpointed state is empty."""

    def __init__(self, folder: str, tokenizer):
        self.path, self.tokenizer, self.before = os.path.join(folder, DECISIONS), tokenizer, None

    def observe(self, batch) -> dict:
        if batch.stage == "rl":  # value pretraining does not move the policy
            self.before = decision_table(batch.policy, batch.rollout, self.tokenizer, batch.cfg.temperature)
        return {}

    def updated(self, batch) -> dict:
        cfg = batch.cfg
        after = decision_table(batch.policy, batch.rollout, self.tokenizer, cfg.temperature)
        bands = None if cfg.dynamic_sampling else [task.band_of(p["n_steps"]) for p in batch.problems]
        record = {"step": batch.step, **decision_record(self.before, after, batch.advantages, bands, cfg.eps_high_used)}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict):
        pass


class OffsetCritic(torch.nn.Module):
    """The mechanism lab's constructed critic of a known bias (docs/lab.md, experiment 1), a reference, not the
    paper's method:

        V(s_t) = V*_0(s_t) + b(t) + h(s_t),      b(t) = offset + slope * t / 100

    V*_0 the exact values (exact_values.ExactValues) of the initial policy, fitted once before step 0 on
    OFFSET_RESPONSES responses of it (offset_critic) and then fixed; b a bias of the response position t (V = 0
    after the last token, GAE's convention, so the bias stops at the end: docs/lab.md's (A1)-(A4) assume it); h the
    run's critic network, its head set to zero, so V starts at V*_0 + b exactly. The trainer calls it like its own
    critic (values_of) and trains h alone: the value loss regresses h on R - V*_0 - b. Its weights are h's (its
    state_dict, config and save_pretrained are the network's), so checkpoints hold a stock value model."""

    def __init__(self, net, exact: exact_values.ExactValues, tokenizer, offset: float, slope: float):
        super().__init__()
        self.net, self.exact, self.tokenizer, self.offset, self.slope = zero_head(net), exact, tokenizer, offset, slope

    def values_of(self, rollout) -> torch.Tensor:
        """[B, T] V*_0 + b + h of the rollout's response tokens, 0 under the mask."""
        problems = exact_values.problems_of(rollout, self.tokenizer)
        fixed = self.exact.values(rollout, problems, self.tokenizer) + bias_values(rollout.response_mask, self.offset,
                                                                                  self.slope)
        return response_values(self.net, rollout) + fixed

    def state_dict(self, *args, **kwargs):
        return self.net.state_dict(*args, **kwargs)

    def load_state_dict(self, state, strict: bool = True, assign: bool = False):
        return self.net.load_state_dict(state, strict=strict, assign=assign)

    def save_pretrained(self, folder: str):
        self.net.save_pretrained(folder)

    @property
    def config(self):
        return self.net.config


OFFSET_RESPONSES = 256  # responses of the initial policy that V*_0 is fitted on, one to each of as many prompts


def offset_critic(spec: str):
    """The Hooks.critic of `--critic-offset exact:OFFSET:SLOPE`: the run's critic network wrapped as an OffsetCritic,
    V*_0 fitted on OFFSET_RESPONSES responses of the initial policy to training prompts of the run's own stream (a
    resumed run fits the same draws again, before its checkpoint is restored)."""
    offset, slope = parse_offset(spec)

    def make(critic, setup):
        cfg, engine = setup.cfg, setup.engine
        prompts = prompt_batch(setup.rows, 0, OFFSET_RESPONSES, config.stream(cfg.seed, "critic_offset"))
        with autocast(cfg, engine.device):
            rollout = engine.generate([r["prompt"] for r in prompts], n=1, batch_size=cfg.batch_size,
                                      seed=config.stream(cfg.seed, "critic_offset"))
        verdicts = vapo.verify(rollout, prompts, cfg, setup.verifier)
        exact = exact_values.ExactValues()
        exact.observe(rollout.texts, [prompts[int(i)] for i in rollout.prompt_index], verdicts)
        print(f"--critic-offset {spec}: V*_0 fitted on {rollout.B} responses of the initial policy "
              f"({100 * float((verdicts > 0).float().mean()):.1f}% right); the critic is V*_0 + b + h, h from zero",
              flush=True)
        return OffsetCritic(critic, exact, setup.tokenizer, offset, slope)
    return make


def parse_offset(text: str) -> tuple[float, float]:
    """--critic-offset "exact:OFFSET:SLOPE" -> (OFFSET, SLOPE), two finite numbers; SystemExit naming what is wrong."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] != "exact":
        raise SystemExit(f"--critic-offset: {text!r} is not of the form exact:OFFSET:SLOPE (e.g. exact:0:-0.5)")
    try:
        numbers = [float(x) for x in parts[1:]]
    except ValueError:
        raise SystemExit(f"--critic-offset {text}: OFFSET and SLOPE must be numbers (exact:OFFSET:SLOPE, e.g. "
                         f"exact:0:-0.5)") from None
    if not all(math.isfinite(x) for x in numbers):
        raise SystemExit(f"--critic-offset {text}: OFFSET and SLOPE must be finite numbers")
    return numbers[0], numbers[1]


def split_offset(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the value of --critic-offset or None, the rest: vapo.py's options)."""
    if "--critic-offset" not in argv:
        return None, argv
    i = argv.index("--critic-offset")
    if i + 1 == len(argv):
        raise SystemExit("--critic-offset: give exact:OFFSET:SLOPE (e.g. exact:0:-0.5)")
    return argv[i + 1], argv[:i] + argv[i + 2:]


def record(argv: list[str]) -> str:
    """`bench/lab.py record -- [--critic-offset exact:OFFSET:SLOPE] VAPO.PY OPTIONS`: vapo.py's own run with the lab's
    hooks (machinery/run.py, Hooks): the DecisionRecorder always, the OffsetCritic with --critic-offset (the built-in
    long task, a critic, one process, no dynamic sampling). The offset is kept in the run folder's lab.json, so
    `record -- --resume DIR` continues with it. Returns the run folder."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    spec, argv = split_offset(argv[1:] if argv[:1] == ["--"] else list(argv))
    cfg, resume, overwrite = vapo.config_from_args(argv)
    if not (cfg.output_dir or resume):
        raise SystemExit("bench/lab.py record: give vapo.py's --output-dir (the record goes into the run folder)")
    if not cfg.builtin:
        raise SystemExit(f"bench/lab.py record: the built-in task's borrow decisions only (--dataset {cfg.dataset})")
    saved = os.path.join(cfg.output_dir, "lab.json")
    if resume and os.path.exists(saved):
        spec = json.load(open(saved)).get("critic_offset")
    if spec is not None:
        parse_offset(spec)
        why = ("a critic to offset (not --algo grpo or dapo)" if cfg.group_advantage else
               "the built-in long task (--dataset builtin-long), whose exact values V* it starts from"
               if cfg.dataset != "builtin-long" else
               "no --dynamic-sampling (the refill rounds' problems are not kept)" if cfg.dynamic_sampling else None)
        if why:
            raise SystemExit(f"--critic-offset {spec}: needs {why}")
    os.makedirs(cfg.output_dir, exist_ok=True)
    if not resume:
        with open(saved, "w") as fh:
            json.dump({"critic_offset": spec}, fh)
    hooks = Hooks(critic=offset_critic(spec) if spec else None,
                  observers=lambda setup, critic: [DecisionRecorder(cfg.output_dir, setup.tokenizer)])
    return vapo.train(cfg, resume=resume is not None, overwrite=overwrite, hooks=hooks)


def read_decisions(folder: str) -> dict[int, dict]:
    """{step: its last record} of a run folder's DECISIONS (a resumed run writes its redone steps again)."""
    return {r["step"]: r for r in read_jsonl(os.path.join(folder, DECISIONS))}


def rl_runs(name: str, seeds: list[int], out: str, extension: bool = False) -> list[tuple[str, list[str]]]:
    """(label, vapo.py options) of each run of an RL experiment, per seed, at the page's sizes."""
    long_eval = ["--eval-prompts", "200", "--eval-sampled-prompts", "100", "--eval-samples", "2"]
    arms = {
        "value-pretraining-rl": [
            ("falling slope -0.5, no value pretraining", ["--algo", "ppo", "--critic-offset", "exact:0:-0.5"]),
            ("falling slope -0.5, value pretraining", ["--algo", "ppo", "--critic-offset", "exact:0:-0.5",
                                                       "--value-pretraining", "--value-pretrain-steps", "20",
                                                       "--value-pretrain-ev", "none"]),
            ("V* alone (control)", ["--algo", "ppo", "--critic-offset", "exact:0:0"])],
        "clip-higher": [(f"eps_high {e}", ["--algo", "grpo", "--clip-higher", "--eps-high", e]) for e in CLIP_ARMS],
        "token-level": [("per-sample loss", ["--algo", "grpo", "--no-token-level-loss"]),
                        ("token-level loss", ["--algo", "grpo", "--token-level-loss"])],
        "group-sampling": [(f"GRPO {p} prompts x {g}", ["--algo", "grpo", "--prompts-per-step", p,
                                                         "--samples-per-prompt", g])
                           for p, g in (("32", "2"), ("8", "8"), ("2", "32"))],
        "nll": [("GRPO", ["--algo", "grpo"]), ("GRPO + NLL mu 3", ["--algo", "grpo", "--positive-nll", "--mu", "3"])],
    }
    extensions = {"group-sampling": [("VAPO 8 prompts x 8", []), ("VAPO 64 prompts x 1", ["--no-group-sampling"])],
                  "nll": [("GRPO + NLL mu 0.1", ["--algo", "grpo", "--positive-nll", "--mu", "0.1"])],
                  "value-pretraining-rl": [("rising slope +0.5, no value pretraining",
                                            ["--algo", "ppo", "--critic-offset", "exact:0:0.5"])]}
    common_args = {"clip-higher": ["--preset", "demo", "--mini-batch-size", "8", "--micro-batch-size", "8", "--steps",
                                   "12", "--eval-every", "6", "--eval-prompts", "100", "--eval-samples", "4"],
                   "value-pretraining-rl": ["--preset", "long", "--steps", "12", *long_eval]}
    runs = []
    for seed in seeds:
        for label, options in arms[name] + (extensions.get(name, []) if extension else []):
            folder = os.path.join(out, "-".join("".join(c if c.isalnum() or c == "." else " " for c in label.lower())
                                                .split()) + f"-s{seed}")
            base = common_args.get(name, ["--preset", "long", "--steps", "16", *long_eval])
            runs.append((f"{label}, seed {seed}", [*base, *options, "--seed", str(seed), "--output-dir", folder]))
    return runs


def output_dir(options: list[str]) -> str:
    return options[options.index("--output-dir") + 1]


def run_rl(name: str, seeds: list[int], out: str, extension: bool, jobs: int) -> None:
    """Run an RL experiment's runs, `jobs` at a time with one thread each, through `record`; a finished run is read
    back and an interrupted one resumed (common.run_vapo)."""
    runs = rl_runs(name, seeds, out, extension)
    print(f"{common.now()}, {common.machine()}: lab {name}, {len(runs)} runs, {jobs} at a time, into {out}",
          flush=True)
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda run: common.run_vapo(run[0], run[1], output_dir(run[1]), RECORD), runs))


def print_rl_runs(name: str, seeds: list[int], out: str, extension: bool) -> list[tuple[str, list[str]]]:
    runs = rl_runs(name, seeds, out, extension)
    print(f"{name}: the runs docs/lab.md plans ({len(runs)}); this command runs none of them and claims no result "
          "(--run runs them, --report judges the finished ones).")
    if name == "value-pretraining-rl":
        print("  the critic is vapo.py's --critic-offset exact:OFFSET:SLOPE, a constructed reference critic "
              "V*_0 + b + h (docs/lab.md, experiment 1, part 2)")
    for label, options in runs:
        print(f"  # {label}\n  python vapo.py {shlex.join(options)}")
    print("results: not judged here (--report; docs/lab.md)")
    return runs


# --- the RL experiments' measures: one seed's, from its arms' run folders (and what the base policy did) ---------
CLIP_ARMS = ("0.2", "0.28", "0.4")
TL_ARMS = (("per-sample", "per-sample loss"), ("token-level", "token-level loss"))
GS_ARMS = (("2", "GRPO 32 prompts x 2"), ("8", "GRPO 8 prompts x 8"), ("32", "GRPO 2 prompts x 32"))
P_BASE = {"1-10": 0.71, "11-20": 0.22, "21-30": 0.04, "31-40": 0.005}  # docs/lab.md experiment 6's arithmetic
NLL_ARMS = (("grpo", "GRPO"), ("nll", "GRPO + NLL mu 3"), ("nll0.1", "GRPO + NLL mu 0.1"))
VP_ARMS = (("falling", "falling slope -0.5, no value pretraining"), ("pretrained", "falling slope -0.5, value "
           "pretraining"), ("control", "V* alone (control)"))
PROFILE = "lab-profile.json"  # a final policy's profile, cached in its run folder
PROFILE_PROBLEMS = 200  # held-out long-chain problems (five per step count), one sample each at temperature 1


def _eval_curve(folder: str, key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in common.evaluations(common.read_records(folder)) if key in r]


def _per_step(folder: str, key: str) -> list[float]:
    return [r.get(key, math.nan) for r in common.rl_steps(common.read_records(folder))]


def _end(m: dict, key: str, folder: str) -> None:
    """avg@2 and pass@2 at the run's first and last evaluations into m."""
    evals = common.evaluations(common.read_records(folder))
    for name in ("acc_avg@2", "pass@2"):
        short = name.removeprefix("acc_")
        m[f"{key}|{short}_start"] = evals[0].get(f"eval/{name}", math.nan) if evals else math.nan
        m[f"{key}|{short}_end"] = evals[-1].get(f"eval/{name}", math.nan) if evals else math.nan


def measure_clip_higher(arms: dict[str, str], base: dict) -> dict:
    """Experiment 4's measures, per arm and their differences (docs/lab.md: "What the judges fix")."""
    m, curves = {}, {}
    for e in CLIP_ARMS:
        folder = arms[f"eps_high {e}"]
        d = read_decisions(folder)
        steps = sorted(d)
        last = max(steps) if steps else 0
        totals = {key: sum(d[k].get(key, 0) for k in steps) for key in ("binding", "pushed")}
        for key in ("binding", "pushed"):
            m[f"{e}|growth_{key}"] = (sum(d[k][f"growth_{key}"] * d[k][key] for k in steps if d[k].get(key))
                                      / totals[key] if totals[key] else math.nan)
        m[f"{e}|binding_share"] = totals["binding"] / totals["pushed"] if totals["pushed"] else math.nan
        m[f"{e}|rise6"] = d[6]["p_right_after"] - d[1]["p_right_before"] if {1, 6} <= set(d) else math.nan
        for k in (3, 6):
            m[f"{e}|dH{k}"] = d[k]["entropy_after"] - d[1]["entropy_before"] if {1, k} <= set(d) else math.nan
        for key, step, measure in (("acc_avg@4", 6, "avg@4_6"), ("acc_avg@4", last, "avg@4_end"),
                                   ("pass@4", last, "pass@4_end")):
            m[f"{e}|{measure}"] = next((v for s, v in _eval_curve(folder, f"eval/{key}") if s == step), math.nan)
        curves[e] = {"p_right": [d[k]["p_right_before"] for k in steps] + [d[last]["p_right_after"]] if steps else [],
                     "entropy": [d[k]["entropy_before"] for k in steps] + [d[last]["entropy_after"]] if steps else [],
                     "growth_binding": [d[k].get("growth_binding") for k in steps],
                     "avg@4": _eval_curve(folder, "eval/acc_avg@4")}
    for hi, lo in (("0.4", "0.28"), ("0.28", "0.2")):
        m[f"rise6|{hi}-{lo}"] = m[f"{hi}|rise6"] - m[f"{lo}|rise6"]
        m[f"avg@4_6|{hi}-{lo}"] = m[f"{hi}|avg@4_6"] - m[f"{lo}|avg@4_6"]
    m["dH6|0.2-0.28"] = m["0.2|dH6"] - m["0.28|dH6"]
    return {"measures": m, "curves": curves}


def profile(folder: str, cache: str | None = None) -> dict:
    """A policy (a run folder's final checkpoint, or a shipped model's name) on PROFILE_PROBLEMS held-out problems, by
    step band and at 27-40 steps (task.evaluate_accuracy); cached in cache (default the run folder's PROFILE)."""
    cache = cache or os.path.join(folder, PROFILE)
    if os.path.exists(cache):
        return common.read_json(cache)
    model, tokenizer = common.load_policy(policy_path(folder), dtype=torch.float32)
    rows = task.make_dataset(PROFILE_PROBLEMS, 0, task.LONG.min_steps, task.LONG.max_steps, split="eval")
    subsets = {band: [r for r in rows if task.band_of(r["n_steps"]) == band] for band in STEP_BANDS}
    subsets["27-40"] = [r for r in rows if r["n_steps"] >= 27]
    out = {}
    for name, problems in subsets.items():
        torch.manual_seed(0)
        acc = task.evaluate_accuracy(model, tokenizer, problems, 1.0, max_new_tokens=task.LONG.max_response_tokens,
                                     batch_size=64)
        steps = acc["steps"]
        out[name] = {"accuracy": acc["accuracy"], "mean_tokens": acc["mean_tokens"], "habit_rate": steps["habit_rate"],
                     "habit": steps["habit"], "borrow": steps["borrow"], "lookup_rate": steps["lookup_rate"],
                     "early": acc["first_errors"]["early"]}
    common.write_json(cache, out)
    return out


def policy_path(folder: str) -> str:
    """A run folder's final policy (its checkpoint), or a shipped model's folder for its name."""
    checkpoint = os.path.join(folder, "checkpoint", "policy")
    return checkpoint if os.path.isdir(checkpoint) else folder_of(folder)


def _pooled_habit(p: dict, bands) -> float:
    return sum(p[b]["habit"] for b in bands) / max(sum(p[b]["borrow"] for b in bands), 1)


def measure_token_level(arms: dict[str, str], base: dict) -> dict:
    """Experiment 5's measures: the habit's decline by band (profile) against the batches' exposures to it."""
    m, curves, short, long = {}, {}, STEP_BANDS[:2], STEP_BANDS[2:]
    for key, label in TL_ARMS:
        final, d = profile(arms[label]), read_decisions(arms[label])
        exposures = {b: sum(r.get(f"exposures|{b}", 0) for r in d.values()) for b in STEP_BANDS}
        for b in STEP_BANDS:
            m[f"{key}|decline|{b}"] = base[b]["habit_rate"] - final[b]["habit_rate"]
            m[f"{key}|exposures|{b}"] = exposures[b]
        per = [(_pooled_habit(base, bands) - _pooled_habit(final, bands)) / max(sum(exposures[b] for b in bands), 1)
               for bands in (short, long)]
        m[f"{key}|long_over_short"] = per[1] / per[0] if per[0] > 0 else math.nan
        m[f"{key}|decline"] = _pooled_habit(base, STEP_BANDS) - _pooled_habit(final, STEP_BANDS)
        m[f"{key}|lookup_27_40"] = final["27-40"]["lookup_rate"]
        for b in STEP_BANDS:
            m[f"{key}|habit|{b}"] = final[b]["habit_rate"]
        curves[key] = {part: [sum(d[k].get(f"habit|{b}", 0) for b in bands)
                              / max(sum(d[k].get(f"exposures|{b}", 0) for b in bands), 1) for k in sorted(d)]
                       for part, bands in (("1-20", short), ("21-40", long))}
    for b in STEP_BANDS:
        m[f"base|habit|{b}"] = base[b]["habit_rate"]
    m["decline|per-sample-token-level"] = m["per-sample|decline"] - m["token-level|decline"]
    m["lookup_27_40|per-sample-token-level"] = m["per-sample|lookup_27_40"] - m["token-level|lookup_27_40"]
    return {"measures": m, "curves": curves}


def measure_group_sampling(arms: dict[str, str], base: dict) -> dict:
    """Experiment 6's measures: the share of all-equal groups at step 1 against p^G + (1 - p)^G; avg@2, pass@2."""
    m, curves = {}, {}
    for g, label in GS_ARMS:
        all_same = _per_step(arms[label], "groups_all_same")
        rows = read_decisions(arms[label]).get(1, {})
        n = sum(rows.get(f"rows|{b}", 0) for b in STEP_BANDS)
        G = int(g)
        predicted = (sum(rows.get(f"rows|{b}", 0) * (P_BASE[b] ** G + (1 - P_BASE[b]) ** G) for b in STEP_BANDS) / n
                     if n else math.nan)
        m[f"{g}|all_same_1"] = all_same[0] if all_same else math.nan
        m[f"{g}|all_same_1_predicted"] = predicted
        m[f"{g}|all_same_1_miss"] = m[f"{g}|all_same_1"] - predicted
        _end(m, g, arms[label])
        curves[g] = {"all_same": all_same, "avg@2": _eval_curve(arms[label], "eval/acc_avg@2")}
    m["avg@2|8-2"] = m["8|avg@2_end"] - m["2|avg@2_end"]
    m["avg@2|32-8"] = m["32|avg@2_end"] - m["8|avg@2_end"]
    if "VAPO 8 prompts x 8" in arms:
        for key, label in (("vapo8", "VAPO 8 prompts x 8"), ("vapo1", "VAPO 64 prompts x 1")):
            _end(m, key, arms[label])
        m["avg@2|vapo8-vapo1"] = m["vapo8|avg@2_end"] - m["vapo1|avg@2_end"]
    return {"measures": m, "curves": curves}


def decision_entropy(folder: str, ref: dict, cache: str | None = None) -> float:
    """Mean entropy of a run's final policy (or a shipped model's) at the borrow decisions of a fixed set of the base's
    responses (ref: common.sample_set's rollout and decisive), cached in cache (default the run's lab-entropy.json)."""
    cache = cache or os.path.join(folder, "lab-entropy.json")
    if os.path.exists(cache):
        return common.read_json(cache)["entropy_at_decisions"]
    model, _ = common.load_policy(policy_path(folder), dtype=torch.float32)
    entropies = []
    with torch.no_grad():
        for k in range(0, ref["rollout"].B, 16):
            part = ref["rollout"].select(slice(k, k + 16))
            _, entropy = response_logprobs(model.eval(), part, 1.0, with_entropy=True)
            entropies.append(entropy[ref["decisive"][k:k + 16, :part.T]])
    value = float(torch.cat(entropies).mean())
    common.write_json(cache, {"entropy_at_decisions": value})
    return value


def measure_nll(arms: dict[str, str], base: dict) -> dict:
    """Experiment 7's measures: entropy at the base's borrow decisions, and the gains of avg@2 and pass@2."""
    m, curves = {}, {}
    for key, label in NLL_ARMS:
        if label not in arms:
            continue
        m[f"{key}|entropy_fall"] = base["entropy_at_decisions"] - decision_entropy(arms[label], base["ref"])
        m[f"{key}|entropy_at_decisions"] = base["entropy_at_decisions"] - m[f"{key}|entropy_fall"]
        curves[key] = {"avg@2": _eval_curve(arms[label], "eval/acc_avg@2"),
                       "pass@2": _eval_curve(arms[label], "eval/pass@2"), "entropy": _per_step(arms[label], "entropy")}
        _end(m, key, arms[label])
        m[f"{key}|avg@2_gain"] = m[f"{key}|avg@2_end"] - m[f"{key}|avg@2_start"]
        m[f"{key}|gap_change"] = ((m[f"{key}|pass@2_end"] - m[f"{key}|avg@2_end"])
                                  - (m[f"{key}|pass@2_start"] - m[f"{key}|avg@2_start"]))
    for name in ("entropy_fall", "avg@2_gain", "gap_change"):
        m[f"{name}|nll-grpo"] = m[f"nll|{name}"] - m[f"grpo|{name}"]
    m["base|entropy_at_decisions"] = base["entropy_at_decisions"]
    return {"measures": m, "curves": curves}


def measure_value_pretraining_rl(arms: dict[str, str], base: dict) -> dict:
    """Experiment 1 part 2's measures: the held-out length at 21-40 steps against the base's, and early answers."""
    m, curves = {}, {}
    base_len = (base["21-30"]["mean_tokens"] + base["31-40"]["mean_tokens"]) / 2
    for key, label in VP_ARMS:
        final = profile(arms[label])
        m[f"{key}|length_change_21_40"] = (final["21-30"]["mean_tokens"] + final["31-40"]["mean_tokens"]) / 2 / \
            base_len - 1
        m[f"{key}|early_21_40"] = (final["21-30"]["early"] + final["31-40"]["early"]) / 2
        curves[key] = {"length": _per_step(arms[label], "response_len"),
                       "advantage_first_tenth": _per_step(arms[label], "advantage_first_tenth")}
    m["base|early_21_40"] = (base["21-30"]["early"] + base["31-40"]["early"]) / 2
    m["length|falling-control"] = m["falling|length_change_21_40"] - m["control|length_change_21_40"]
    m["length|pretrained-control"] = m["pretrained|length_change_21_40"] - m["control|length_change_21_40"]
    return {"measures": m, "curves": curves}


def draw_clip_higher(results: list[dict], path: str) -> None:
    arms = [(e, f"eps_high {e}") for e in CLIP_ARMS]
    draw(path, f"clip-higher (GRPO, 16 optimizer steps a rollout), mean of {len(results)} seeds", [
        _steps_panel(results, arms, "p_right", "p(right tens digit) at the batch's borrow decisions", first=0),
        _steps_panel(results, arms, "entropy", "entropy at the borrow decisions (nats)", first=0),
        _evals_panel(results, arms, ["avg@4"])])


def draw_token_level(results: list[dict], path: str) -> None:
    habit = {"title": "held-out habit rate by step band (forgotten borrows / borrow steps), after 16 steps",
             "xlabel": "problem's steps", "bars": (STEP_BANDS, [(label, *_stats(results, [f"{key}|habit|{b}" for b in
                                                                                              STEP_BANDS]))
                                                                 for key, label in (("base", "base"), *TL_ARMS)])}
    share = {"title": "habit's share of the batch's borrow decisions, per step", "xlabel": "RL step",
             "lines": [(range(1, len(ys) + 1), ys, style, {"color": f"C{i + 1}", "label": f"{label}, {part} steps"})
                       for i, (key, label) in enumerate(TL_ARMS) for part, style in (("1-20", "-"), ("21-40", "--"))
                       for ys in [_curve_mean(results, key, part)]]}
    draw(path, f"token-level loss (GRPO, --preset long), mean of {len(results)} seeds", [habit, share], width=5.5)


def draw_group_sampling(results: list[dict], path: str) -> None:
    groups = [g for g, _ in GS_ARMS]
    share = {"title": "share of samples in all-equal groups, step 1", "xlabel": "prompts x samples a prompt",
             "bars": ([f"{64 // int(g)} x {g}" for g in groups],
                      [(label, *_stats(results, [f"{g}|{key}" for g in groups]))
                       for label, key in (("logged", "all_same_1"), ("arithmetic", "all_same_1_predicted"))])}
    draw(path, f"group sampling at 64 samples a step (GRPO, --preset long), mean of {len(results)} seeds", [
        share, _steps_panel(results, GS_ARMS, "all_same", "share in all-equal groups (no GRPO signal), per step"),
        _evals_panel(results, GS_ARMS, ["avg@2"])])


def draw_nll(results: list[dict], path: str) -> None:
    arms = [(k, label) for k, label in NLL_ARMS if f"{k}|entropy_at_decisions" in results[0]["measures"]]
    entropy = {"title": "entropy at the borrow decisions of the base's responses (nats)",
               "bars": (["base"] + [label for _, label in arms],
                        [(None, *_stats(results, [f"{k}|entropy_at_decisions" for k, _ in [("base", ""), *arms]]))])}
    draw(path, f"positive-example NLL (GRPO, --preset long), mean of {len(results)} seeds", [
        entropy, _evals_panel(results, arms, ["avg@2", "pass@2"], first_color=1),
        _steps_panel(results, arms, "entropy", "the batch's mean entropy (all response tokens)", first_color=1)])


def draw_value_pretraining_rl(results: list[dict], path: str) -> None:
    change = {"title": "held-out length, 21-40 steps: change from the base\n(dotted: the -30% predicted)",
              "hline": -0.3, "ylim": (-0.35, 0.05),
              "bars": (["falling, no VP", "falling, VP", "V* alone"],
                       [(None, *_stats(results, [f"{key}|length_change_21_40" for key, _ in VP_ARMS]))])}
    draw(path, f"value pretraining against a falling critic bias (PPO, --preset long), mean of {len(results)} seeds", [
        _steps_panel(results, VP_ARMS, "length", "the batch's mean response length (tokens)"),
        _steps_panel(results, VP_ARMS, "advantage_first_tenth", "mean advantage on each response's first tenth"),
        change])


# --- the written predictions: docs/lab.md's thresholds, judged on the mean and SE over seeds ------------------------
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
    """All confirmed -> confirmed; any falsified -> falsified; else not separated."""
    if "falsified" in verdicts:
        return "falsified"
    if verdicts and all(v == "confirmed" for v in verdicts):
        return "confirmed"
    return "not separated"


def check(s: dict, keys, lo=None, hi=None) -> str:
    """judge() of a measure (a key of s), of a paired difference (a, b), or of a list of these, all within [lo, hi];
    "no difference" as lo: a null, confirmed unless the measure is more than 2 SE from 0."""
    if isinstance(keys, list):
        return combine([check(s, k, lo, hi) for k in keys])
    stat = _diff(s, *keys) if isinstance(keys, tuple) else s.get(keys, (math.nan, 0.0))
    if lo == "no difference":
        verdict = judge(stat, 0, 0)
        return verdict if verdict in ("not measured", "falsified") else "confirmed"
    return judge(stat, lo, hi)


class Stats(dict):
    """{measure: (mean, SE over seeds)}, with the seeds' own measures kept (per_seed) for paired differences."""
    per_seed: list[dict] = []


def summarise(per_seed: list[dict]) -> Stats:
    """{measure: (mean, standard error over seeds)} of the seeds' "measures" (NaN ones left out; SE 0 for one)."""
    out = Stats()
    out.per_seed = per_seed
    for key in per_seed[0]["measures"]:
        vals = [r["measures"][key] for r in per_seed if r["measures"].get(key) == r["measures"].get(key)]
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


# docs/lab.md's written predictions, judged on the mean and SE over seeds: {experiment: s -> [(text, verdict)]}


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
    "value-pretraining-rl": lambda s: [
        ("falling bias, no value pretraining: 21-40-step responses at least 30% shorter than the base's",
         check(s, "falling|length_change_21_40", hi=-0.3)),
        ("... and shorter than the control's", check(s, "length|falling-control", hi=0)),
        ("with value pretraining: within 10% of the control's length", check(s, "length|pretrained-control", -0.1, 0.1))],
}


# --- figures: one plot of panels, and the means over seeds it draws ----------------------------------------------
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
        if ticks:
            ax.set_xticks(range(len(ticks)), ticks, fontsize=7)
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


def _stats(results: list[dict], keys: list[str]) -> tuple[list[float], list[float]]:
    """The means and SEs over seeds of the measures keys."""
    s = summarise(results)
    return [s.get(k, (math.nan, math.nan))[0] for k in keys], [s.get(k, (math.nan, math.nan))[1] for k in keys]


def _steps_panel(results, arms, key, title, first=1, first_color=0) -> dict:
    """A panel of one per-step curve (mean over seeds) for each (arm, label); x from `first`."""
    lines = [(range(first, first + len(ys)), ys, "-", {"color": f"C{i + first_color}", "label": label})
             for i, (arm, label) in enumerate(arms) for ys in [_curve_mean(results, arm, key)]]
    return {"title": title, "xlabel": "RL step" if first else "rollout (before its update)", "lines": lines}


def _evals_panel(results, arms, keys, first_color=0) -> dict:
    """A panel of the held-out evaluations keys (mean over seeds) for each (arm, label)."""
    return {"title": "held-out " + " and ".join(keys), "xlabel": "step",
            "lines": [(*_eval_mean(results, arm, key), "o-" if j == 0 else "s--",
                       {"color": f"C{i + first_color}", "label": label + (f": {key}" if len(keys) > 1 else "")})
                      for i, (arm, label) in enumerate(arms) for j, key in enumerate(keys)]}


def _mean(rows: list[list[float]]) -> list[float]:
    return [statistics.mean(col) if all(c == c for c in col) else float("nan") for col in zip(*rows)]


def _curve_mean(results: list[dict], arm: str, key: str) -> list[float]:
    rows = [r["curves"][arm][key] for r in results if r["curves"].get(arm, {}).get(key)]
    n = min(map(len, rows)) if rows else 0
    return _mean([row[:n] for row in rows])


def _eval_mean(results: list[dict], arm: str, key: str) -> tuple[list[int], list[float]]:
    points = [dict(r["curves"][arm][key]) for r in results if arm in r["curves"]]
    steps = sorted(set.intersection(*(set(p) for p in points))) if points else []
    return steps, [statistics.mean(p[k] for p in points) for k in steps]


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# --- the command line -----------------------------------------------------------------------------------------------
def rl_base(name: str, out: str) -> dict:
    """What the measures compare against: the base's profile; for nll its responses and entropy at their decisions."""
    if name == "clip-higher":
        return {}
    base = {**profile("builtin-long", cache=os.path.join(out, "base-" + PROFILE))}
    if name == "nll":
        _, rollout, _, decisive = sample_set(POLICY, 100, 2, 0)
        ref = {"rollout": rollout, "decisive": decisive}
        base |= {"ref": ref, "entropy_at_decisions": decision_entropy("builtin-long", ref,
                                                                      os.path.join(out, "base-lab-entropy.json"))}
    return base


def report_rl(name: str, seeds: list[int], out: str, extension: bool) -> dict | None:
    """Judge an RL experiment's finished runs: the measures of each seed whose arms all finished."""
    measure, draw = RL_JUDGES[name]
    per_seed, missing, base = [], [], None
    for seed in seeds:
        arms = {label.rsplit(", seed ", 1)[0]: output_dir(options) for label, options in
                rl_runs(name, [seed], out, extension)}
        unfinished = [f for f in arms.values() if not common.finished(f)]
        if unfinished:
            missing += unfinished
            continue
        if base is None:
            base = rl_base(name, out)
        result = measure(arms, base)
        result.update(seed=seed, wall_seconds={label: _wall(f) for label, f in arms.items()})
        per_seed.append(result)
    if missing:
        print(f"not finished (left out with their seed): {', '.join(missing)}")
    if not per_seed:
        return None
    return publish(name, per_seed, out, draw, "one seed: no standard error" if len(per_seed) < 2 else "",
                   seeds=[r["seed"] for r in per_seed], per_seed=per_seed)


def publish(name: str, results: list[dict], out: str, draw, note: str, **fields) -> dict:
    """Judge the seeds' measures (their mean and SE) against docs/lab.md's written predictions: NAME.json (with
    fields) and NAME.png (draw(results, path)) into out, and the verdicts printed."""
    stats = summarise(results)
    summary = {"name": name, "date": common.now(), "machine": common.machine(), **fields, "note": note,
               "mean_se": {k: list(v) for k, v in stats.items()}, "verdicts": PREDICTIONS[name](stats)}
    common.write_json(os.path.join(out, f"{name}.json"), summary)
    draw(results, os.path.join(out, f"{name}.png"))
    print(f"\nverdicts against docs/lab.md's written predictions{' (' + note + ')' if note else ''}:")
    for text, verdict in summary["verdicts"]:
        print(f"  {verdict:>14}  {text}")
    print(f"figures and records: {out}")
    return summary


def _wall(folder: str) -> float | None:
    try:
        with open(os.path.join(folder, "wall_seconds")) as fh:
            return float(fh.read())
    except (OSError, ValueError):
        return None


def run_analysis(args, out: str) -> dict:
    """Run an analysis on each seed (or read back its records, --report), then judge and draw the seeds together."""
    torch.set_num_threads(1)
    run, draw_seeds = ANALYSES[args.name]
    smaller = [k for k, (v, _) in SIZES.items() if getattr(args, k) < v]
    print(f"{common.now()}, {common.machine()}: lab {args.name}, seeds {args.seeds}", flush=True)
    results = []
    for seed in args.seeds:
        path = os.path.join(out, f"{args.name}-s{seed}.json")
        if args.report:  # judge again the seeds' records of an earlier run (its sizes must be the ones given)
            results.append(common.read_json(path))
            continue
        result = run(args, seed)
        result.update(seed=seed, biases=list(VP_BIASES))
        results.append(result)
        common.write_json(path, result)
        print(f"  seed {seed} done", flush=True)
    note = (f"smaller than the written setup ({', '.join(smaller)}): a smoke run, not a result" if smaller else
            "one seed: no standard error" if len(args.seeds) < 2 else "")
    return publish(args.name, results, out, draw_seeds, note, seeds=args.seeds,
                   sizes={k: getattr(args, k) for k in SIZES})


ANALYSES = {"value-pretraining": (value_pretraining, draw_value_pretraining),
            "decoupled-gae": (decoupled_gae, draw_decoupled),
            "length-adaptive": (length_adaptive, draw_length_adaptive)}
RL_JUDGES = {"value-pretraining-rl": (measure_value_pretraining_rl, draw_value_pretraining_rl),
             "clip-higher": (measure_clip_higher, draw_clip_higher),
             "token-level": (measure_token_level, draw_token_level),
             "group-sampling": (measure_group_sampling, draw_group_sampling),
             "nll": (measure_nll, draw_nll)}
SIZES = {"prompts": (100, "held-out problems judged"), "samples": (2, "samples per held-out problem"),
         "batches": (20, "training batches of a critic fit"), "batch_prompts": (8, "problems per training batch"),
         "group": (8, "samples per problem of a training batch")}  # the written setup's


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["record"]:
        return record(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = ap.add_subparsers(dest="name", required=True, metavar="NAME")
    commands.add_parser("record", help="-- VAPO.PY OPTIONS: one vapo.py run writing its decisions.jsonl")
    for name in (*ANALYSES, *RL_JUDGES):
        p = commands.add_parser(name, help=f"docs/lab.md, {name}", description=f"docs/lab.md, {name}")
        p.add_argument("--seeds", type=int, nargs="+", default=[0])
        p.add_argument("--out", default=None, help="default runs/lab/NAME")
        p.add_argument("--report", action="store_true", help="run nothing: judge the finished runs, or the seeds' "
                       "records (NAME-sSEED.json) in --out")
        for size, (default, help_) in SIZES.items() if name in ANALYSES else ():
            p.add_argument("--" + size.replace("_", "-"), type=int, default=default, help=f"{help_} ({default})")
        if name == "decoupled-gae":
            p.add_argument("--bias", default="0.5:0", help="OFFSET:SLOPE of the starting bias b")
        if name in RL_JUDGES:
            p.add_argument("--extension", action="store_true", help="also the page's extension arms")
            p.add_argument("--run", action="store_true", help="run them (resumable), then judge them")
            p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    args = ap.parse_args(argv)
    out = args.out or os.path.join(common.ROOT, "runs", "lab", args.name)
    if args.name in ANALYSES:
        return run_analysis(args, out)
    if args.run:
        run_rl(args.name, args.seeds, out, args.extension, args.jobs)
    if args.run or args.report:
        return report_rl(args.name, args.seeds, out, args.extension)
    return print_rl_runs(args.name, args.seeds, out, args.extension)


if __name__ == "__main__":
    main()
