"""The mechanism lab's RL experiments (docs/lab.md, experiment 1 part 2 and experiments 4-7): vapo.py runs on the
built-in task, one per arm and seed, each made through `bench/lab.py record` (vapo.py's own run with the lab's hooks:
the DecisionRecorder always, the OffsetCritic for --critic-offset), then one seed's measures read back from its arms'
run folders and judged over seeds.

    python bench/lab.py value-pretraining-rl | clip-higher | token-level | group-sampling | nll [--seeds 0 1 2]
                        [--extension] [--run [--jobs 2] | --report]   # with neither: print the planned vapo.py runs
    python bench/lab.py record -- VAPO.PY OPTIONS                     # one such run, writing its decisions.jsonl

report_rl judges the finished runs with lab.publish against docs/lab.md's written predictions (lab.PREDICTIONS).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shlex
import statistics
from concurrent.futures import ThreadPoolExecutor

import torch

import common  # (puts the repository on the path)
import config
from machinery import exact_values
from machinery import task
import vapo
from common import folder_of, sample_set, token_ends
from lab_critic import SolutionCritic
from machinery.data import prompt_batch
from machinery.models import autocast, zero_head
from machinery.run import Hooks
from machinery.plots import read_jsonl
from rollout import response_logprobs, response_values
from lab import CLIP_ARMS, GS_ARMS, POLICY, STEP_BANDS, TL_ARMS, _mean, bias_values, draw, publish, summarise

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
    """`bench/lab.py record -- [--critic-offset exact:OFFSET:SLOPE | --critic-solution] VAPO.PY OPTIONS`: vapo.py's
    own run with the lab's hooks (machinery/run.py, Hooks): the DecisionRecorder always; the OffsetCritic with
    --critic-offset (the built-in long task, a critic, one process, no dynamic sampling); the critic that reads the
    reference solution with --critic-solution (lab_critic.SolutionCritic: the run's critic network, reading the
    correct chain before each response). The choice is kept in the run folder's lab.json, so `record -- --resume DIR`
    continues with it. Returns the run folder."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    argv = argv[1:] if argv[:1] == ["--"] else list(argv)
    solution = "--critic-solution" in argv
    spec, argv = split_offset([a for a in argv if a != "--critic-solution"])
    cfg, resume, overwrite = vapo.config_from_args(argv)
    if not (cfg.output_dir or resume):
        raise SystemExit("bench/lab.py record: give vapo.py's --output-dir (the record goes into the run folder)")
    if not cfg.builtin:
        raise SystemExit(f"bench/lab.py record: the built-in task's borrow decisions only (--dataset {cfg.dataset})")
    saved = os.path.join(cfg.output_dir, "lab.json")
    if resume and os.path.exists(saved):
        spec, solution = (json.load(open(saved)).get(k) for k in ("critic_offset", "critic_solution"))
    if solution and (spec is not None or cfg.group_advantage or cfg.critic_oracle):
        raise SystemExit("--critic-solution: needs the run's own critic network (not --critic-offset, --critic-oracle "
                         "or the group advantage)")
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
            json.dump({"critic_offset": spec, "critic_solution": solution}, fh)
    critic = (offset_critic(spec) if spec else
              (lambda net, setup: SolutionCritic(net, setup.tokenizer)) if solution else None)
    hooks = Hooks(critic=critic,
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
# (CLIP_ARMS, TL_ARMS and GS_ARMS are in lab.py, beside the predictions that name their measures)
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


# --- figures: each experiment's, and the panels of its runs' curves (means over seeds) they draw ---------------------
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


def _curve_mean(results: list[dict], arm: str, key: str) -> list[float]:
    rows = [r["curves"][arm][key] for r in results if r["curves"].get(arm, {}).get(key)]
    n = min(map(len, rows)) if rows else 0
    return _mean([row[:n] for row in rows])


def _eval_mean(results: list[dict], arm: str, key: str) -> tuple[list[int], list[float]]:
    points = [dict(r["curves"][arm][key]) for r in results if arm in r["curves"]]
    steps = sorted(set.intersection(*(set(p) for p in points))) if points else []
    return steps, [statistics.mean(p[k] for p in points) for k in steps]


# --- judging the finished runs ---------------------------------------------------------------------------------------
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


def _wall(folder: str) -> float | None:
    try:
        with open(os.path.join(folder, "wall_seconds")) as fh:
            return float(fh.read())
    except (OSError, ValueError):
        return None


RL_JUDGES = {"value-pretraining-rl": (measure_value_pretraining_rl, draw_value_pretraining_rl),
             "clip-higher": (measure_clip_higher, draw_clip_higher),
             "token-level": (measure_token_level, draw_token_level),
             "group-sampling": (measure_group_sampling, draw_group_sampling),
             "nll": (measure_nll, draw_nll)}
