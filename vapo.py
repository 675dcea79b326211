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
        """Raise ValueError naming the first option that cannot work, and why."""
        checks = [
            (self.steps >= 0, "steps", "must be >= 0"),
            (self.max_samples is None or self.max_samples >= 1, "max_samples", "must be >= 1 (or none)"),
            (self.prompts_per_step >= 1, "prompts_per_step", "must be >= 1"),
            (self.samples_per_prompt >= 1, "samples_per_prompt", "must be >= 1"),
            (self.mini_batch_size >= 1, "mini_batch_size", "must be >= 1"),
            (self.batch_size % self.mini_batch_size == 0, "mini_batch_size",
             f"must divide the batch of prompts_per_step x samples_per_prompt = {self.batch_size} samples"),
            (self.micro_batch_size >= 1 and self.mini_batch_size % self.micro_batch_size == 0, "micro_batch_size",
             f"must divide mini_batch_size = {self.mini_batch_size}"),
            (self.ppo_epochs >= 1, "ppo_epochs", "must be >= 1"),
            (self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1"),
            (self.temperature > 0, "temperature", "must be > 0 for training rollouts (PPO needs a stochastic policy)"),
            (0 < self.top_p <= 1, "top_p", "must be in (0, 1]"),
            (self.actor_lr > 0, "actor_lr", "must be > 0"),
            (self.critic_lr > 0, "critic_lr", "must be > 0"),
            (self.warmup_steps >= 0, "warmup_steps", "must be >= 0"),
            (self.max_grad_norm > 0, "max_grad_norm", "must be > 0"),
            (self.value_pretrain_steps >= 0, "value_pretrain_steps", "must be >= 0"),
            (0 <= self.lam_critic <= 1, "lam_critic", "must be in [0, 1]"),
            (self.alpha > 0, "alpha", "must be > 0 (lambda_policy = 1 - 1 / (alpha * length))"),
            (0 <= self.lam_policy_fixed <= 1, "lam_policy_fixed", "must be in [0, 1]"),
            (0 <= self.eps_low < 1, "eps_low", "must be in [0, 1)"),
            (not self.clip_higher or self.eps_high >= self.eps_low, "eps_high",
             f"must be >= eps_low = {self.eps_low} with clip-higher (it raises the upper bound)"),
            (self.mu >= 0, "mu", "must be >= 0"),
            (self.algo in ALGORITHMS, "algo", f"must be one of {', '.join(ALGORITHMS)}"),
            (self.dynamic_sampling_rounds >= 0, "dynamic_sampling_rounds", "must be >= 0"),
            (not self.group_advantage or self.group_size >= 2, "group_advantage",
             "needs groups: group sampling on and samples_per_prompt >= 2 (a group of one has no baseline)"),
            (not self.overlong_shaping or 0 <= self.overlong_cache <= self.max_new_tokens, "overlong_cache",
             f"must be in [0, max_new_tokens = {self.max_new_tokens}] with overlong shaping"),
            (0 < self.gamma <= 1, "gamma", "must be in (0, 1]"),
            (self.value_clip is None or self.value_clip > 0, "value_clip", "must be > 0 (or none)"),
            (self.eval_every >= 0 and self.save_every >= 0, "eval_every/save_every", "must be >= 0"),
            (self.eval_prompts >= 0 and self.eval_samples >= 1, "eval_prompts/eval_samples", "must be >= 0 / >= 1"),
            (0 < self.eval_top_p <= 1 and self.eval_temperature >= 0, "eval_top_p/eval_temperature",
             "must be in (0, 1] / >= 0"),
            (self.template in ("base", "chat", "raw"), "template", "must be base, chat or raw"),
            (self.report_to in ("none", "tensorboard", "wandb"), "report_to", "must be none, tensorboard or wandb"),
            (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"), "device",
             "must be auto, cpu or cuda[:N]"),
        ]
        for ok, name, why in checks:
            if not ok:
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
    hints, docs = typing.get_type_hints(Config), field_docs()
    for f in dataclasses.fields(Config):
        flags = [f"--{f.name.replace('_', '-')}"]
        kind = hints[f.name]
        helptext = f"{docs.get(f.name, '')} (paper/default: {f.default})"
        if kind is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, help=helptext)
        else:
            base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
            parse = _parse_optional(base) if type(None) in typing.get_args(kind) else base
            parser.add_argument(*flags, type=parse, metavar=base.__name__.upper(), help=helptext)
    return parser


def config_from_args(argv=None) -> tuple[Config, str | None]:
    """Parse the command line -> (validated Config, run folder to resume or None)."""
    args = vars(build_parser().parse_args(argv))
    resume = args.pop("resume", None)
    preset = args.pop("preset", None)
    if resume is not None:
        saved = os.path.join(resume, "config.json")
        if not os.path.exists(saved):
            raise SystemExit(f"--resume {resume}: no config.json there (is it a vapo run folder?)")
        with open(saved) as fh:
            base = json.load(fh)
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
        return Config(**{**base, **args}).validate(), resume
    except ValueError as err:
        raise SystemExit(f"vapo: {err}") from None


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
    policy, tokenizer = load_policy(name, dtype=torch.float32, device=device,
                                    gradient_checkpointing=cfg.gradient_checkpointing)
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
    train = load_prompts(cfg.dataset, split=cfg.train_split, **kw)
    if cfg.eval_dataset:
        held_out = load_prompts(cfg.eval_dataset, split=cfg.eval_split, **kw)[:cfg.eval_prompts]
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
    Returns (rollout, scores [B], timings)."""
    from reward import score_batch
    t0 = time.perf_counter()
    with autocast(cfg, next(engine.model.parameters()).device):
        rollout = engine.generate([r["prompt"] for r in rows], n=cfg.group_size)  # 1. rollout
    t1 = time.perf_counter()
    golds = [rows[int(i)]["answer"] for i in rollout.prompt_index]
    scores = torch.tensor(score_batch(rollout.texts, golds, verifier=verifier, num_workers=workers))  # 2. reward
    return rollout, scores.to(rollout.response_mask.device), {"time/rollout": t1 - t0,
                                                               "time/reward": time.perf_counter() - t1}


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
            stats[k] += v
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
        advantages = masked_whiten(advantages, mask)
    return advantages, returns, lam_policy


class Mean:
    """Weighted running means of named floats (stats of micro-batches weighted by their token counts)."""

    def __init__(self):
        self.sums, self.weights = {}, {}

    def add(self, stats: dict[str, float], weight: float = 1.0):
        for k, v in stats.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * weight
            self.weights[k] = self.weights.get(k, 0.0) + weight

    def result(self) -> dict[str, float]:
        """Each name's weighted mean; 0.0 for a name whose weights were all 0 (e.g. the NLL with no correct sample)."""
        return {k: self.sums[k] / self.weights[k] if self.weights[k] > 0 else 0.0 for k in self.sums}


def update(policy, critic, optimizers: dict, rollout, batch: dict[str, torch.Tensor], cfg: Config,
           train_policy: bool = True) -> dict[str, float]:
    """Phase 5: shuffled mini-batches; per mini-batch one optimizer step of each model.

        policy: L = L_PPO(clip-higher, token-level) + mu * L_NLL(correct samples)      (Eq. 8 and 9)
        critic: L_V = 0.5 * (V - R)^2 (token-level)

    Micro-batches accumulate gradients; the losses are normalised by the whole mini-batch's token counts, so
    the micro-batch size never changes the result. A mini-batch whose loss or gradient is not finite is
    skipped (no optimizer step) and counted in `skipped_nonfinite`.

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
    stats, skipped = Mean(), 0
    for _ in range(cfg.ppo_epochs):
        for mb in torch.randperm(rollout.B).split(cfg.mini_batch_size):
            mask = rollout.response_mask[mb]  # [b, T]
            n_tokens = float(mask.sum())
            n_seqs = float((mask.sum(-1) > 0).sum())
            n_positive = float((mask * batch["positive"][mb, None]).sum()) if train_policy else 0.0
            finite = True
            for micro in by_length(rollout, mb).split(cfg.micro_batch_size):
                sub = rollout.select(micro)  # trimmed to its own longest prompt and response
                d = {k: v[micro][:, :sub.T] if v.dim() == 2 else v[micro] for k, v in batch.items()}
                m = sub.response_mask
                weight = float(m.sum())
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
                        stats.add({"nll_loss": nll.item() * n_positive / max(micro_positive, 1)}, micro_positive)
                    finite &= bool(torch.isfinite(loss))
                    loss.backward()
                    stats.add({"policy_loss": pg_loss.item() * n_tokens / max(weight, 1), **pg_stats}, weight)
                if critic is not None:
                    with amp:
                        values = response_values(critic, sub)  # [b, T]
                    v_loss, v_stats = value_loss(values, d["returns"], m, d["values"], cfg.value_clip,
                                                 "token-mean", n_tokens)
                    finite &= bool(torch.isfinite(v_loss))
                    v_loss.backward()
                    stats.add({"value_loss": v_loss.item() * n_tokens / max(weight, 1), **v_stats}, weight)
            for name, model in models.items():
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                finite &= bool(torch.isfinite(norm))
                stats.add({f"grad_norm/{name}": norm.item()})
            if finite:
                for name in models:
                    optimizers[name][0].step()
                    optimizers[name][1].step()
            else:
                skipped += 1
                log.warning("non-finite loss or gradient in a mini-batch: skipped its optimizer step")
            for name, model in models.items():
                optimizers[name][0].zero_grad(set_to_none=True)
    out = stats.result()
    out["skipped_nonfinite"] = skipped
    return out


def rl_step(step: int, policy, critic, optimizers, engine, rows, cfg: Config, verifier, workers) -> dict:
    """One VAPO step: 1 rollout, 2 reward, 3 score, 4 advantages, 5 update; returns 6's flat log dict.
    critic None (GRPO, DAPO): nothing is scored or trained for it. A step left without samples (dynamic sampling
    found no group with varied rewards) skips phases 3-5 and says so in its record."""
    from losses import explained_variance, masked_mean
    from rollout import score_rollout
    t_start = time.perf_counter()
    prompts = prompt_batch(rows, step, cfg.prompts_per_rollout, cfg.seed)
    refill = lambda r: prompt_batch(rows, step * cfg.dynamic_sampling_rounds + r - 1,  # noqa: E731
                                    cfg.prompts_per_rollout, cfg.seed + 2)  # its own stream, a function of step
    rollout, scores, stats = collect(engine, prompts, cfg, verifier, workers, refill)  # 1, 2
    if rollout.B == 0:
        log.warning("step %d: no group with varied rewards after dynamic sampling: no update", step + 1)
        return {"step": step + 1, "skipped_no_samples": 1, **stats, "time/step": time.perf_counter() - t_start}
    mask = rollout.response_mask
    rewards = scores.float()  # [B], the verifier's
    if cfg.overlong_shaping:
        rewards = rewards + overlong_penalties(rollout.lengths, cfg)

    t = time.perf_counter()
    with autocast(cfg, mask.device):
        scored = score_rollout(policy, critic, rollout, cfg.micro_batch_size, cfg.temperature)  # 3. score, no grad
    stats["time/score"] = time.perf_counter() - t

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

    record = {  # 6. log
        "step": step + 1,
        "reward_mean": rewards.mean().item(),
        "train_acc": (scores > 0).float().mean().item(),
        "response_len": rollout.lengths.float().mean().item(),
        "truncated_frac": rollout.truncated.float().mean().item(),
        "empty_responses": int((rollout.lengths == 0).sum()),
        "groups_all_same": group_all_same(scores, cfg.group_size),
        "advantage_mean": masked_mean(advantages, mask).item(),
        "entropy": masked_mean(scored["entropy"], mask).item(),
        "lr/actor": optimizers["policy"][1].get_last_lr()[0],
        **train_stats, **stats,
    }
    if critic is not None:
        record |= {"explained_variance": explained_variance(values, returns, mask),
                   "value_mean": masked_mean(values, mask).item(), "lam_policy": lam_policy.float().mean().item()}
    return record


def group_all_same(scores: torch.Tensor, G: int) -> float:
    """Share of prompts whose G samples all got the same reward (their group-relative signal is zero)."""
    if G < 2:
        return float("nan")
    groups = scores.view(-1, G)  # [prompts, G]
    return (groups == groups[:, :1]).all(1).float().mean().item()


# ==================================================================================================================
# Value pretraining, evaluation
# ==================================================================================================================

def pretrain_value(policy, critic, optimizers, engine, rows, cfg: Config, verifier, workers, emit) -> None:
    """Technique 1, Value-Pretraining (section 3.1): critic-only steps on rollouts of the frozen initial policy,
    targets = Monte-Carlo returns (GAE with lambda = 1: every token's target is the final reward).

    The explained variance of each step is measured on that step's fresh rollouts *before* the critic trains on
    them, so it is a held-out figure. Stops after value_pretrain_steps, or earlier once the mean of the last 3
    reaches value_pretrain_ev."""
    from gae import gae
    from losses import explained_variance
    from rollout import score_rollout
    recent: list[float] = []
    for step in range(cfg.value_pretrain_steps):
        t0 = time.perf_counter()
        prompts = prompt_batch(rows, step, cfg.prompts_per_rollout, cfg.seed + 1)  # its own stream of prompts
        rollout, scores, _ = sample_and_score(engine, prompts, cfg, verifier, workers)
        mask = rollout.response_mask
        with autocast(cfg, mask.device):
            values = score_rollout(None, critic, rollout, cfg.micro_batch_size)["values"]  # [B, T], no grad
        _, returns = gae(terminal_rewards(scores, mask), values, mask, gamma=cfg.gamma, lam=1.0)  # Monte-Carlo
        ev = explained_variance(values, returns, mask)
        batch = {"values": values, "returns": returns}
        stats = update(policy, critic, optimizers, rollout, batch, cfg, train_policy=False)
        recent = (recent + [ev])[-3:]
        emit({"value_pretrain_step": step + 1, "value_loss": stats["value_loss"], "explained_variance": ev,
              "train_acc": (scores > 0).float().mean().item(), "response_len": rollout.lengths.float().mean().item(),
              "time/step": time.perf_counter() - t0})
        if cfg.value_pretrain_ev is not None and len(recent) == 3 and sum(recent) / 3 >= cfg.value_pretrain_ev:
            log.info("value pretraining reached explained variance %.3f after %d steps", sum(recent) / 3, step + 1)
            break


def evaluate(engine, rows: list[dict], cfg: Config, verifier, workers) -> dict[str, float]:
    """Held-out accuracy: avg@k (k = eval_samples at eval_temperature / eval_top_p, the paper's protocol) and
    greedy. A fixed sampling seed, so evaluations differ only by the weights, and the training RNG is untouched."""
    from reward import score_batch
    out = {}
    for name, n, temperature, top_p in (("avg@%d" % cfg.eval_samples, cfg.eval_samples, cfg.eval_temperature,
                                         cfg.eval_top_p), ("greedy", 1, 0.0, 1.0)):
        with autocast(cfg, next(engine.model.parameters()).device):
            rollout = engine.generate([r["prompt"] for r in rows], n=n, temperature=temperature, top_p=top_p,
                                      seed=cfg.seed + 7919)
        golds = [rows[int(i)]["answer"] for i in rollout.prompt_index]
        scores = torch.tensor(score_batch(rollout.texts, golds, verifier=verifier, num_workers=workers))
        out[f"eval/acc_{name}"] = (scores > 0).float().mean().item()
        out[f"eval/response_len_{name}"] = rollout.lengths.float().mean().item()
    return out


# ==================================================================================================================
# Run folder: config, metrics, checkpoints, plots
# ==================================================================================================================

class Run:
    """The run folder: config.json, metrics.jsonl (one flat JSON object per line), checkpoint/, curves.png."""

    def __init__(self, cfg: Config):
        self.dir = cfg.output_dir or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
        os.makedirs(self.dir, exist_ok=True)
        self.metrics_path = os.path.join(self.dir, "metrics.jsonl")
        self.t0 = time.perf_counter()
        self.writer = None
        if cfg.report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
            self.writer = SummaryWriter(self.dir)
        elif cfg.report_to == "wandb":
            import wandb
            self.writer = wandb.init(project="vapo", config=dataclasses.asdict(cfg), dir=self.dir)

    def save_config(self, cfg: Config):
        with open(os.path.join(self.dir, "config.json"), "w") as fh:
            json.dump(dataclasses.asdict(cfg), fh, indent=2)

    def emit(self, record: dict):
        record["time/elapsed"] = time.perf_counter() - self.t0  # seconds since this process started the run
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        step = record.get("step", record.get("value_pretrain_step", 0))
        if self.writer is not None and hasattr(self.writer, "add_scalar"):
            for k, v in record.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self.writer.add_scalar(k, v, step)
        elif self.writer is not None:
            self.writer.log(record)

    def samples_generated(self) -> int:
        """Responses generated by the RL steps logged so far (for --max-samples on resume)."""
        if not os.path.exists(self.metrics_path):
            return 0
        with open(self.metrics_path) as fh:
            return sum(json.loads(line).get("samples_generated", 0) for line in fh if line.strip())

    def truncate_metrics(self, step: int):
        """On resume, drop logged steps after the checkpoint (they will be run again)."""
        if not os.path.exists(self.metrics_path):
            return
        with open(self.metrics_path) as fh:
            kept = [line for line in fh if json.loads(line).get("step", 0) <= step]
        with open(self.metrics_path, "w") as fh:
            fh.writelines(kept)


def save_checkpoint(run: Run, step: int, policy, critic, tokenizer, optimizers, value_pretrained: bool):
    """checkpoint/ = policy/ and critic/ (Hugging Face format), state.pt (optimizers, schedulers, RNG states,
    step). Written to checkpoint.tmp, then swapped in, so a run killed mid-write keeps its previous checkpoint."""
    final, tmp, old = (os.path.join(run.dir, n) for n in ("checkpoint", "checkpoint.tmp", "checkpoint.old"))
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(os.path.join(tmp, "policy"))
    tokenizer.save_pretrained(os.path.join(tmp, "policy"))
    if critic is not None:  # GRPO and DAPO have none
        critic.save_pretrained(os.path.join(tmp, "critic"))
    torch.save({"step": step, "value_pretrained": value_pretrained,
                "optimizers": {k: (o.state_dict(), s.state_dict()) for k, (o, s) in optimizers.items()},
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}},
               os.path.join(tmp, "state.pt"))
    if os.path.exists(final):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(run: Run, policy, critic, optimizers) -> tuple[int, bool]:
    """Restore weights, optimizers and RNG from the run's checkpoint -> (step, value_pretrained)."""
    from safetensors.torch import load_file
    path = os.path.join(run.dir, "checkpoint")
    if not os.path.exists(path) and os.path.exists(path + ".old"):  # killed between the two renames
        path += ".old"
    if not os.path.exists(os.path.join(path, "state.pt")):
        raise SystemExit(f"--resume {run.dir}: no checkpoint there to resume from")
    for name, model in (("policy", policy), ("critic", critic)):
        if model is None:
            continue
        files = [f for f in os.listdir(os.path.join(path, name)) if f.endswith(".safetensors")]
        state = {}
        for f in files:
            state.update(load_file(os.path.join(path, name, f)))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
        if missing or unexpected:
            raise SystemExit(f"checkpoint {path}/{name} does not fit the model: missing {missing}, "
                             f"unexpected {unexpected}")
    state = torch.load(os.path.join(path, "state.pt"), weights_only=False)
    for k, (opt_state, sched_state) in state["optimizers"].items():
        optimizers[k][0].load_state_dict(opt_state)
        optimizers[k][1].load_state_dict(sched_state)
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    if state["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state["step"], state["value_pretrained"]


# ==================================================================================================================
# The training loop
# ==================================================================================================================

def train(cfg: Config, resume: bool = False) -> str:
    """Run VAPO with cfg; returns the run folder."""
    from rollout import HFEngine
    from tqdm import tqdm
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    device = pick_device(cfg)
    run = Run(cfg)
    run.save_config(cfg)
    log.info("run folder %s; config:\n%s", run.dir, json.dumps(dataclasses.asdict(cfg), indent=1))

    policy, critic, tokenizer = load_models(cfg, device)
    rows, held_out = load_data(cfg, tokenizer)
    verifier, workers = verifier_for(cfg)
    engine = HFEngine(policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                      top_p=cfg.top_p)
    optimizers = {"policy": make_optimizer(policy, cfg.actor_lr, cfg)}
    if critic is not None:
        optimizers["critic"] = make_optimizer(critic, cfg.critic_lr, cfg)

    start, value_done = 0, False
    if resume:
        start, value_done = load_checkpoint(run, policy, critic, optimizers)
        run.truncate_metrics(start)
        log.info("resumed from step %d", start)

    def run_eval(step):
        if held_out:
            record = {"step": step, **evaluate(engine, held_out, cfg, verifier, workers)}
            run.emit(record)
            log.info("eval at step %d: %s", step, {k: round(v, 4) for k, v in record.items()})

    if start == 0 and not value_done:
        run_eval(0)  # the base model's accuracy
        if critic is not None and cfg.value_pretraining and cfg.value_pretrain_steps > 0:  # technique 1
            pretrain_value(policy, critic, optimizers, engine, rows, cfg, verifier, workers, run.emit)
            critic.save_pretrained(os.path.join(run.dir, "critic_pretrained"))
            optimizers["critic"] = make_optimizer(critic, cfg.critic_lr, cfg)  # fresh warmup for the RL phase
        value_done = True
        save_checkpoint(run, 0, policy, critic, tokenizer, optimizers, value_done)

    generated = run.samples_generated()  # 0 unless resumed
    if cfg.max_samples is not None and generated >= cfg.max_samples:
        log.info("--max-samples %d already reached (%d generated): no step left to run", cfg.max_samples, generated)
        start = cfg.steps
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=cfg.algo.upper(), dynamic_ncols=True)
    for step in bar:
        record = rl_step(step, policy, critic, optimizers, engine, rows, cfg, verifier, workers)
        run.emit(record)
        generated += record["samples_generated"]
        bar.set_postfix({k: f"{record[key]:{fmt}}" for k, key, fmt in (
            ("acc", "train_acc", ".2f"), ("len", "response_len", ".0f"), ("ev", "explained_variance", ".2f"),
            ("s", "time/step", ".1f")) if key in record}, refresh=False)
        done = step + 1
        last = done == cfg.steps or (cfg.max_samples is not None and generated >= cfg.max_samples)
        if last or (cfg.eval_every and done % cfg.eval_every == 0):
            run_eval(done)
            plot(run)
        if last or (cfg.save_every and done % cfg.save_every == 0):
            save_checkpoint(run, done, policy, critic, tokenizer, optimizers, value_done)
        if last:
            if done < cfg.steps:
                log.info("stopping after step %d: %d samples generated (--max-samples %d)", done, generated,
                         cfg.max_samples)
            break
    plot(run)
    return run.dir


def plot(run: Run):
    """curves.png in the run folder (see plots.py); a plotting failure is logged, never fatal to training."""
    try:
        from plots import plot_metrics
        plot_metrics(run.metrics_path, os.path.join(run.dir, "curves.png"))
    except Exception as err:  # noqa: BLE001 - a broken plot must not stop a long run
        log.warning("could not plot %s: %s", run.metrics_path, err)


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    cfg, resume = config_from_args(argv)
    run_dir = train(cfg, resume=resume is not None)
    print(f"done: {run_dir}")


if __name__ == "__main__":
    main(sys.argv[1:])
