"""A run's critic against Monte-Carlo values from the policy's own continuations: the counterpart of V* on a task
without exact values (a real model on a reasoning-gym task, say), on a small probe set.

    python bench/critic_probe.py RUN_FOLDER [--prompts 16] [--points 4] [--continuations 8] [--split held-out]
        [--temperature T] [--seed 0] [--out F.json] [--figure F.png]

RUN_FOLDER is a vapo.py run (its config.json and checkpoint/policy, checkpoint/critic). The final policy answers
--prompts problems once (the run's temperature unless --temperature; 0 is greedy); at --points places of each
response (t = 0, L/points, 2L/points, ... tokens in) the same policy continues the response --continuations times
from there, token for token (no text round trip), to the run's max_new_tokens in all; the mean reward of the
continuations is a Monte-Carlo estimate of V(s_t), the value of the state before token t under this policy
(VinePPO's estimate; what the critic's V(s_t) is trained towards). Reported:

    EV of the critic        1 - Var[M - V] / Var[M] over the probe's states (M the Monte-Carlo value), and the
                            same with the Monte-Carlo noise taken out (its sampling variance s^2 / K a state is
                            independent of V: subtracted from both variances): the EV against the true value
    EV of the prompt value  the same at t > 0 for M at t = 0 of the same response, the prompt's value: the baseline
                            GRPO's group mean estimates. A critic below it is a worse baseline than the group's
    segment credit          the correlation of the critic's change V(s_t') - V(s_t) with the Monte-Carlo change
                            M(t') - M(t) between consecutive points: whether the critic moves where the policy's
                            chances move, the credit a critic gives at this granularity (and with the last point to
                            the reward added, where both sides share the reward)
    the run's own gauges    explained_variance and ev_group_baseline of its RL steps (metrics.jsonl), their means

The critic at t = 0 of a response and the Monte-Carlo value there both estimate the prompt's value.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics

import torch

import common  # (puts the repository on the path)
import vapo
from machinery.data import load_data
from machinery.engines import HFEngine
from machinery.models import load_policy, load_value_model
from machinery.run import verifier_for
from rollout import sample, score_rollout


def load_run(run_dir: str):
    """(config, policy, critic or None, tokenizer) of a finished run's checkpoint; SystemExit naming what is missing."""
    config_path = os.path.join(run_dir, "config.json")
    if not os.path.exists(config_path):
        raise SystemExit(f"critic_probe: {run_dir}: no config.json (not a vapo.py run folder)")
    cfg = vapo.Config(**common.read_json(config_path))
    checkpoint = os.path.join(run_dir, "checkpoint")
    if not os.path.isdir(os.path.join(checkpoint, "policy")):
        raise SystemExit(f"critic_probe: {run_dir}: no checkpoint/policy (the run saves one at its end)")
    policy, tokenizer = load_policy(os.path.join(checkpoint, "policy"), dtype=torch.float32)
    critic_dir = os.path.join(checkpoint, "critic")
    critic = load_value_model(critic_dir, dtype=torch.float32) if os.path.isdir(critic_dir) else None
    return cfg, policy.eval(), critic.eval() if critic is not None else None, tokenizer


def probe_points(length: int, points: int) -> list[int]:
    """The token positions probed in a response of `length` tokens: t = floor(j * length / points), j < points,
    distinct (a short response has fewer)."""
    return sorted({int(j * length / points) for j in range(points)}) if length > 0 else []


@torch.no_grad()
def continue_from(engine: HFEngine, prefixes: list[list[int]], budgets: list[int], k: int, temperature: float,
                  top_p: float, seed: int, batch: int = 8) -> list[list[list[int]]]:
    """k continuations of each token prefix (prompt + the response so far) by the engine's model, each at most its
    budget of new tokens and cut after its first EOS: [prefix][k] lists of the new token ids."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(0, len(prefixes), batch):
        chunk, chunk_budgets = prefixes[i:i + batch], budgets[i:i + batch]
        P = max(map(len, chunk))
        ids = torch.full((len(chunk), P), engine.pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), P), dtype=torch.long)
        for r, prefix in enumerate(chunk):  # left padding, as the engine pads its prompts
            ids[r, P - len(prefix):] = torch.tensor(prefix)
            mask[r, P - len(prefix):] = 1
        tokens, _, _ = sample(engine.model, ids, mask, max(chunk_budgets), temperature, top_p, engine.eos_ids,
                              engine.pad_id, generator, n=k)  # [len(chunk) * k, T0]
        for r, budget in enumerate(chunk_budgets):
            rows = []
            for row in tokens[r * k:(r + 1) * k, :budget].tolist():
                end = next((j + 1 for j, tok in enumerate(row) if tok in engine.eos_ids), len(row))
                rows.append(row[:end])
            out.append(rows)
    return out


def _var(x: list[float]) -> float:
    """The population variance of x (NaN for fewer than 2 values)."""
    return statistics.pvariance(x) if len(x) > 1 else math.nan


def explained(target: list[float], estimate: list[float], noise: list[float], estimate_noise: list[float] | None = None
              ) -> tuple[float, float]:
    """(EV, EV with the Monte-Carlo noise taken out) of estimate for target: 1 - Var[target - estimate] / Var[target],
    the noise's mean variance subtracted from both variances (and estimate_noise's from the first, where the
    estimate is a Monte-Carlo value too); NaN where the target does not vary (beyond its noise)."""
    var_t, var_d = _var(target), _var([a - b for a, b in zip(target, estimate)])
    n = statistics.mean(noise) if noise else 0.0
    n_e = statistics.mean(estimate_noise) if estimate_noise else 0.0
    raw = 1 - var_d / var_t if var_t > 1e-12 else math.nan
    clean = 1 - (var_d - n - n_e) / (var_t - n) if var_t - n > 1e-12 else math.nan
    return raw, clean


def correlation(x: list[float], y: list[float]) -> float:
    """Pearson's correlation of x and y; NaN where either does not vary."""
    if len(x) < 2 or _var(x) <= 1e-12 or _var(y) <= 1e-12:
        return math.nan
    return statistics.correlation(x, y)


def probe(run_dir: str, prompts: int = 16, points: int = 4, continuations: int = 8, split: str = "held-out",
          temperature: float | None = None, seed: int = 0) -> dict:
    """The probe (module docstring): its states (response, t, V, M, the continuations' rewards) and summary."""
    if prompts < 1 or points < 1 or continuations < 2:
        raise SystemExit("critic_probe: --prompts and --points must be >= 1, --continuations >= 2 (a Monte-Carlo "
                         "value needs a spread to have a noise)")
    cfg, policy, critic, tokenizer = load_run(run_dir)
    temperature = cfg.temperature if temperature is None else temperature
    train, held_out = load_data(cfg, tokenizer)
    rows = (held_out if split == "held-out" else train)[:prompts]
    verifier = verifier_for(cfg)
    engine = HFEngine(policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=temperature, top_p=cfg.top_p,
                      batch_size=16)
    rollout = engine.generate([r["prompt"] for r in rows], n=1, seed=seed)
    golds = [r["answer"] for r in rows]
    rewards = verifier.rewards(rollout.texts, golds)
    values = score_rollout(None, critic, rollout)["values"] if critic is not None else None  # [B, T]: V(s_t)
    states, prefixes, budgets = [], [], []
    for b in range(rollout.B):
        prompt = rollout.prompt_ids[b][rollout.prompt_mask[b].bool()].tolist()
        response = rollout.response_ids[b, :int(rollout.lengths[b])].tolist()
        for t in probe_points(len(response), points):
            states.append({"response": b, "t": t, "length": len(response), "reward": rewards[b],
                           "V": float(values[b, t]) if values is not None else math.nan})
            prefixes.append(prompt + response[:t])
            budgets.append(cfg.max_new_tokens - t)
    conts = continue_from(engine, prefixes, budgets, continuations, temperature, cfg.top_p, seed + 1)
    texts = [tokenizer.decode(p[len(p) - s["t"]:] + c, skip_special_tokens=True)  # the response so far + its end
             for s, p, cs in zip(states, prefixes, conts) for c in cs]
    scores = verifier.rewards(texts, [golds[s["response"]] for s in states for _ in range(continuations)])
    for i, s in enumerate(states):
        got = scores[i * continuations:(i + 1) * continuations]
        s["rewards"], s["M"] = got, statistics.mean(got)
        s["noise"] = statistics.variance(got) / continuations  # the sampling variance of M
    return {"run": run_dir, "date": common.now(), "machine": common.machine(), "split": split, "prompts": len(rows),
            "points": points, "continuations": continuations, "temperature": temperature, "seed": seed,
            "has_critic": critic is not None, "summary": summarise(states, points, run_dir), "states": states}


def summarise(states: list[dict], points: int, run_dir: str) -> dict:
    """The probe's figures (module docstring) from its states."""
    out = {"states": len(states), "reward_mean": statistics.mean(s["reward"] for s in states) if states else math.nan}
    critic = [s for s in states if s["V"] == s["V"]]
    if critic:
        out["ev_critic"], out["ev_critic_denoised"] = explained([s["M"] for s in critic], [s["V"] for s in critic],
                                                                [s["noise"] for s in critic])
        out["corr_critic"] = correlation([s["V"] for s in critic], [s["M"] for s in critic])
    start = {s["response"]: s for s in states if s["t"] == 0}
    later = [s for s in states if s["t"] > 0 and s["response"] in start]
    if later:  # the prompt's value (M at t = 0) as the baseline of the later states, beside the critic there
        out["ev_prompt_value"], out["ev_prompt_value_denoised"] = explained(
            [s["M"] for s in later], [start[s["response"]]["M"] for s in later], [s["noise"] for s in later],
            [start[s["response"]]["noise"] for s in later])
        with_v = [s for s in later if s["V"] == s["V"]]
        if with_v:
            out["ev_critic_later"], out["ev_critic_later_denoised"] = explained(
                [s["M"] for s in with_v], [s["V"] for s in with_v], [s["noise"] for s in with_v])
    # each segment's advantage, (value after) - (value before): between consecutive points of a response, and from
    # the last to the end, where the value after is the reward (the state after EOS is terminal)
    inner, ends = [], []  # (Monte-Carlo's, the critic's)
    by_response: dict[int, list[dict]] = {}
    for s in states:
        by_response.setdefault(s["response"], []).append(s)
    for seq in by_response.values():
        seq = sorted(seq, key=lambda s: s["t"])
        inner += [(b["M"] - a["M"], b["V"] - a["V"]) for a, b in zip(seq, seq[1:]) if a["V"] == a["V"]]
        if seq[-1]["V"] == seq[-1]["V"]:
            ends.append((seq[-1]["reward"] - seq[-1]["M"], seq[-1]["reward"] - seq[-1]["V"]))
    out["segments"] = len(inner)
    if inner:
        out["segment_credit"] = correlation([m for m, _ in inner], [v for _, v in inner])
    if inner or ends:  # the last segments share the reward on both sides: reported apart
        out["segment_credit_with_end"] = correlation([m for m, _ in inner + ends], [v for _, v in inner + ends])
    by_point = {}
    for j in range(points):
        at = [s for s in states if s["length"] and int(j * s["length"] / points) == s["t"]]
        if at:
            by_point[f"{j}/{points}"] = {"M": statistics.mean(s["M"] for s in at),
                                         "V": statistics.mean(s["V"] for s in at) if at[0]["V"] == at[0]["V"]
                                         else math.nan, "states": len(at)}
    out["by_point"] = by_point
    steps = common.rl_steps(common.read_records(run_dir))
    for key in ("explained_variance", "ev_group_baseline"):
        got = [r[key] for r in steps if key in r and r[key] == r[key]]
        out[f"run|{key}"] = statistics.mean(got) if got else math.nan
    return out


def draw(result: dict, path: str) -> None:
    """The critic's V(s_t) against the Monte-Carlo value at each probed state, coloured by the point."""
    import matplotlib  # here, not at the top: the file-only backend must be chosen before pyplot is imported
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 4.2))
    points = result["points"]
    for j in range(points):
        at = [s for s in result["states"]
              if s["length"] and int(j * s["length"] / points) == s["t"] and s["V"] == s["V"]]
        ax.scatter([s["M"] for s in at], [s["V"] for s in at], s=12, label=f"t = {j}/{points} of the response")
    lo = min([s["M"] for s in result["states"]] + [-1.0])
    ax.plot([lo, 1], [lo, 1], "k--", lw=0.7)
    s = result["summary"]
    ax.set(xlabel=f"Monte-Carlo value ({result['continuations']} continuations)", ylabel="critic V(s_t)",
           title=f"EV {s.get('ev_critic', math.nan):.2f} (denoised {s.get('ev_critic_denoised', math.nan):.2f}); "
                 f"prompt value's {s.get('ev_prompt_value_denoised', math.nan):.2f}")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a vapo.py run folder (config.json, checkpoint/policy, checkpoint/critic)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--points", type=int, default=4, help="places probed a response (t = 0, L/points, ...)")
    ap.add_argument("--continuations", type=int, default=8, help="continuations a place (the Monte-Carlo K)")
    ap.add_argument("--split", default="held-out", choices=("held-out", "train"))
    ap.add_argument("--temperature", type=float, default=None, help="default: the run's (0: greedy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="the JSON record (states and summary)")
    ap.add_argument("--figure", default=None, help="the scatter of V against the Monte-Carlo value (PNG)")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    result = probe(args.run, args.prompts, args.points, args.continuations, args.split, args.temperature, args.seed)
    for key, value in result["summary"].items():
        print(f"{key:>28}  {value}")
    if args.out:
        common.write_json(args.out, result)
    if args.figure:
        draw(result, args.figure)
    return result


if __name__ == "__main__":
    main()
