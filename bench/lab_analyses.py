"""The mechanism lab's analyses (docs/lab.md, experiments 1-3): critic-only, before any RL, on constructed critics
(V* of the built-in long task plus a bias of known shape, or plus noise) and on the shipped reward model.

    python bench/lab.py value-pretraining | decoupled-gae | length-adaptive [--seeds 0 1 2] [--report]

Each analysis gives one seed's measures; run_analysis runs the seeds, and lab.publish judges them against docs/lab.md's
written predictions (lab.PREDICTIONS) and draws them (the draw_* functions here).
"""
from __future__ import annotations

import math
import os
import statistics

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
from machinery.models import load_tokenizer, load_value_model, zero_head
from rollout import score_rollout
from lab import (CRITIC, FIFTHS, LA_CRITICS, LENGTH_BAND_NAMES, LENGTH_BANDS, POLICY, STEP_BANDS, _mean, bias_values,
                 draw, noise_horizon, publish)

ALPHA = 0.5  # --preset long's alpha of the length-adaptive lambda


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


def lam_of(horizon: float) -> float:
    return 1.0 if math.isinf(horizon) else 1.0 - 1.0 / horizon


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


# --- running an analysis on each seed --------------------------------------------------------------------------------
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
SIZES = {"prompts": (100, "held-out problems judged"), "samples": (2, "samples per held-out problem"),
         "batches": (20, "training batches of a critic fit"), "batch_prompts": (8, "problems per training batch"),
         "group": (8, "samples per problem of a training batch")}  # the written setup's
