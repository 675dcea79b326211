"""vapo: Value-based Augmented Proximal Policy Optimization (Yue et al. 2025, arXiv 2504.05118), the algorithm.

    python vapo.py                      # the built-in demo: a 1M-parameter model learns multi-step arithmetic on a CPU
    python vapo.py --preset long        # long chains (10-411 tokens), the critic from a reward model: ~17 min, 1 core
    python vapo.py --model SmolLM2-135M-Instruct.Q4_1.gguf --preset cpu-135m  # a real model on a CPU: ~30 min
    python vapo.py --model Qwen2.5-0.5B --dataset openai/gsm8k --preset gpu-0.5b     # one GPU
    python vapo.py --help               # every option: its default (the demo's) and the paper preset's value

VAPO is PPO with a learned critic, made stable on long chains of thought by seven techniques. One run (train):

    0. value pretraining: critic-only steps on the frozen initial policy's rollouts          pretrain_value
    then, every step                                                                          rl_step
    1. rollout     G samples per prompt from the current policy                               sample_and_reward
    2. reward      the verifier's +1 / -1, placed on each response's last token          gae.terminal_rewards
    3. score       the policy's old log-probs and the critic's V(s_t), no grad               score
    4. advantages  decoupled, length-adaptive GAE: critic targets and policy advantages       advantages_and_returns
    5. update      mini-batches of PPO (policy) and value-loss (critic) steps                 update
    6. log         one flat record; evaluate, plot, checkpoint (machinery/run.py: when)       evaluate

The seven techniques, each one switch of Config (e.g. `--no-clip-higher`) and one `if` where it acts:

    1 Value-Pretraining (3.1)       pretrain_value: critic-only steps, Monte-Carlo targets (lambda = 1)
    2 Decoupled-GAE (3.2)           gae.decoupled_gae: returns with lam_critic = 1, advantages with lam_policy
    3 Length-adaptive GAE (3.2)     gae.length_adaptive_lambda: lam_policy = 1 - 1 / (alpha * length)
    4 Clip-Higher (3.3)             losses.policy_loss: the ratio clipped to [1 - eps_low, 1 + eps_high]
    5 Token-level loss (3.3)        losses.aggregate(..., "token-mean"): 1 / (sum of lengths) over the mini-batch
    6 Positive-example LM loss (3.4) losses.positive_nll_loss, added as mu * NLL in update
    7 Group-Sampling (3.4)          engines.HFEngine.generate(prompts, n=G): G samples per prompt

The paper's baselines are named sets of the same switches (`--algo`, config.ALGORITHMS): `ppo`, `grpo` (no
critic: gae.group_advantage) and `dapo` (GRPO with clip-higher, the token-level loss, dynamic sampling in
sample_and_reward and the soft overlong punishment). Where we differ from the paper: docs/techniques.md.

What is not the algorithm plugs in through two hooks (machinery/run.py, Hooks), never through these functions'
parameters: observers, called with every scored batch (the critic judge and the credit meter against the built-in
task's exact values V*, the lab's instruments), and critics, modules the trainer calls like its own (the constructed
reference critics of known quality). Everything else around the loop (the run folder, checkpoints, models, data,
engines, the built-in task, views and plots, the statistics over processes) is in machinery/.
"""
from __future__ import annotations

import logging
import math
import sys
import time

import torch
import torch.nn.functional as F

import config
from config import ALGORITHMS, Config
from gae import decoupled_gae, gae, group_advantage, length_adaptive_lambda, terminal_rewards
from losses import (explained_variance, first_tenth_mask, kl_to_reference, masked_mean, masked_whiten, policy_loss,
                    positive_nll_loss, value_loss)
from reward import Verifier, last_number, overlong_penalty, truncation_rule
from rollout import Rollout, by_length, response_logprobs, response_values, score_rollout
from machinery import world
from machinery.data import gold_of, prompt_batch
from machinery.engines import make_engine
from machinery.models import SingleProcess, autocast, frozen_copy, trains
from machinery.run import Hooks, Observed, Progress, Run, Setup, load_inputs, seed_all, timed
from machinery.world import Mean

log = logging.getLogger("vapo")


# ==================================================================================================================
# The loop
# ==================================================================================================================

def train(cfg: Config, resume: bool = False, overwrite: bool = False, hooks: Hooks | None = None,
          layout: SingleProcess | None = None) -> str:
    """Run VAPO with cfg (the box in this file's docstring); returns the run folder. resume: continue the run in
    cfg.output_dir from its newest readable checkpoint (from the start, if it has none yet); overwrite: start
    over in a folder that holds a run. hooks: observers and critics that are not the algorithm (run.Hooks; the
    built-in task's own are added by Hooks.with_builtin). layout: how the models are held (models.SingleProcess;
    scale/train.py passes its FSDP2 Sharded, and every process runs this same function)."""
    layout = layout or SingleProcess()
    seed_all(cfg)
    policy, critic, tokenizer, rows, held_out, verifier = load_inputs(cfg, resume, overwrite, layout)  # checked first
    run = Run(cfg, layout, resume=resume, overwrite=overwrite)  # made once everything it needs has loaded
    reference = frozen_copy(policy) if cfg.kl_coef > 0 else None  # the initial weights (before any restore)
    engine = make_engine(cfg, policy, tokenizer, layout, critic)  # after the models: sized for what is left
    policy, critic = layout.wrap(policy), (layout.wrap(critic) if critic is not None else None)
    reference = layout.wrap(reference) if reference is not None else None
    setup = Setup(cfg, policy, tokenizer, engine, rows, verifier)
    hooks = (hooks or Hooks()).with_builtin(setup)  # the task's exact values beside the critic, where it has them
    critic = hooks.critic(critic, setup) if hooks.critic is not None else critic  # a constructed critic, or as is
    observers = hooks.observers(setup, critic) if hooks.observers is not None else []
    optimizers = {"policy": make_optimizer(policy, cfg.actor_lr, cfg)}
    if trains(critic):
        optimizers["critic"] = make_optimizer(critic, cfg.critic_lr, cfg)
    run.attach(policy, critic, tokenizer, optimizers, engine, observers)
    progress = Progress()
    if resume:
        with engine.idle():  # the engine samples from the restored weights
            progress = run.restore()

    def evaluate_at(step: int, stage: str = "evaluation"):
        if held_out:
            run.emit_eval(step, evaluate(engine, held_out, cfg, verifier))
        run.views.record(step, stage, policy, critic, engine, held_out, verifier)  # tokens.jsonl, views/

    with run.stop:  # SIGTERM / SIGINT: stop at the next safe point, with a checkpoint
        if not progress.value_pretrained:
            if progress.pretrain["step"] == 0:
                evaluate_at(0, "step 0")  # the base model's accuracy
            if trains(critic) and cfg.value_pretraining and cfg.value_pretrain_steps > 0:  # technique 1
                if not pretrain_value(policy, critic, optimizers, engine, rows, cfg, verifier, run.emit,
                                      progress.pretrain, should_stop=run.stop_requested, observers=observers):
                    run.save(progress)  # stopped by a signal: resumable mid-pretraining
                    run.stopped(0)
                    return run.finish(final_plot=False)
                run.save_pretrained_critic()
                run.views.record(0, "after value pretraining", policy, critic, engine, held_out, verifier)
                optimizers["critic"] = make_optimizer(critic, cfg.critic_lr, cfg)  # fresh warmup for the RL phase
            progress.value_pretrained = True
            run.save(progress)
        for step in run.steps(progress):
            run.views.keep_old(policy, step + 1)  # the probes' pi_old, when this step is evaluated
            record = rl_step(step, policy, critic, optimizers, engine, rows, cfg, verifier, reference,  # 1-6
                             observers)
            if run.after_step(record, progress, evaluate_at):  # log; then evaluate, plot, save or stop
                break
    return run.finish()


def rl_step(step: int, policy, critic, optimizers, engine, rows, cfg: Config, verifier: Verifier,
            reference=None, observers=()) -> dict:
    """One VAPO step: 1 rollout, 2 reward, 3 score, 4 advantages, 5 update; returns 6's flat log dict.
    critic None (GRPO, DAPO): nothing is scored or trained for it. reference: the frozen initial policy of
    --kl-coef (None: no KL term). observers (run.Hooks): each sees the scored batch before the update and may add
    figures to the record. A step left without samples (dynamic sampling found no group with varied rewards)
    skips phases 3-5 and says so in its record."""
    t_start = time.perf_counter()
    prompts = world.shard(step_prompts(rows, step, cfg))  # this process's share
    refill = lambda r: world.shard(step_prompts(rows, step, cfg, r))  # noqa: E731  dynamic sampling's rounds
    rollout, verdicts, stats = sample_and_reward(engine, prompts, cfg, verifier, refill)  # 1, 2
    stats["samples_generated"] = int(world.total(torch.tensor(stats["samples_generated"])))
    with engine.idle():  # a vLLM engine frees the GPU for the update, and takes the updated weights after it
        if rollout.B == 0:
            log.warning("step %d: no group with varied rewards after dynamic sampling: no update", step + 1)
            return {"step": step + 1, "skipped_no_samples": 1, **stats, "time/step": time.perf_counter() - t_start}
        drawn = prompts + [p for r in range(1, stats.get("dynamic/rounds", 0) + 1) for p in refill(r)]  # every round's
        problems = [drawn[int(i)] for i in rollout.prompt_index]  # [B], row b's prompt (prompt_index counts all rounds)
        rewards = verdicts.float()  # [B], the verifier's
        if cfg.overlong_shaping:
            rewards = rewards + overlong_penalties(rollout.lengths, cfg)
        device = rollout.response_mask.device
        with timed(stats, "score", device):
            scored = score(policy, critic, engine, rollout, cfg, stats, reference)  # 3. no grad
        with timed(stats, "advantages", device):
            values = scored.get("values")  # [B, T], or None without a critic
            advantages, returns, lam_policy = advantages_and_returns(rollout, rewards, values, cfg, stats)  # 4
        seen = Observed("rl", step + 1, rollout, problems, verdicts, rewards, policy, cfg, values, returns,
                        advantages, scored["old_logprobs"])
        figures = {k: v for o in observers for k, v in o.observe(seen).items()}  # before the update changes pi
        with timed(stats, "update", device):
            batch = {"old_logprobs": scored["old_logprobs"], "advantages": advantages, "positive": verdicts > 0}
            if reference is not None:
                batch["ref_logprobs"] = scored["ref_logprobs"]
            if trains(critic):
                batch |= {"values": values, "returns": returns}
            train_stats = update(policy, critic, optimizers, rollout, batch, cfg)  # 5
        for o in observers:
            figures |= o.updated(seen) if hasattr(o, "updated") else {}
    stats["time/step"] = time.perf_counter() - t_start
    record = step_record(step, rollout, verdicts, rewards, scored, advantages, returns, lam_policy, cfg,
                         train_stats | stats)
    return record | figures | {"lr/actor": optimizers["policy"][1].get_last_lr()[0]}


def step_record(step: int, rollout, verdicts, rewards, scored: dict, advantages, returns, lam_policy, cfg: Config,
                stats: dict) -> dict:
    """Phase 6: the step's flat record, every figure over the whole batch (every process's share of it). verdicts,
    rewards, lam_policy [B]; advantages, returns and scored's entries [B, T]; stats: the phases' own figures. With a
    critic, its fit (explained variance of its targets, overall, on each response's first tenth and on the rest) and,
    with groups, ev_group_baseline: the same of the mean reward of the other samples of each one's group."""
    mask, every = rollout.response_mask, world.all_sum
    record = {"step": step + 1, "reward_mean": world.mean(rewards), "train_acc": world.mean(verdicts > 0),
              "response_len": world.mean(rollout.lengths), "truncated_frac": world.mean(rollout.truncated),
              "empty_responses": int(world.total(rollout.lengths == 0)),
              "groups_all_same": group_all_same(verdicts, cfg.group_size),
              "advantage_mean": masked_mean(advantages, mask, all_sum=every).item(), **stats}
    if "entropy" in scored:  # not given by a sampler that returns only the chosen tokens' log-probs (vLLM)
        record["entropy"] = masked_mean(scored["entropy"], mask, all_sum=every).item()
    if "values" in scored:  # a critic's fit overall, on each response's first tenth (where a bias sits), on the rest
        values, head = scored["values"], first_tenth_mask(mask)
        record |= {"explained_variance": explained_variance(values, returns, mask, all_sum=every),
                   "ev_first_tenth": explained_variance(values, returns, head, all_sum=every),
                   "ev_rest": explained_variance(values, returns, mask - head, all_sum=every),
                   "value_mean": masked_mean(values, mask, all_sum=every).item(),
                   "value_error": masked_mean(values - returns, mask, all_sum=every).item(),  # the critic's bias
                   "lam_policy": world.mean(lam_policy)}
        G = cfg.group_size
        if G > 1:  # the bar a critic must clear to be a better baseline than the group's (EVPO, arXiv 2604.19485)
            others = ((rewards.view(-1, G).sum(1, keepdim=True) - rewards.view(-1, G)) / (G - 1)).view(-1)  # [B]
            record["ev_group_baseline"] = explained_variance(others[:, None] * mask, returns, mask, all_sum=every)
    return record


def step_prompts(rows: list[dict], step: int, cfg: Config, r: int = 0) -> list[dict]:
    """The prompts of round r of a step (0: its batch; 1, 2, ...: dynamic sampling's refills), from one stream: with
    dynamic sampling step s owns a block of 1 + dynamic_sampling_rounds batches, so each prompt comes once an epoch
    and a step never holds one twice; without it, batch s of the stream."""
    block = 1 + cfg.dynamic_sampling_rounds if cfg.dynamic_sampling else 1
    return prompt_batch(rows, step * block + r, cfg.prompts_per_rollout, config.stream(cfg.seed, "rl_prompts"))


# ==================================================================================================================
# Phases 1-2: sampling and reward, with DAPO's dynamic sampling
# ==================================================================================================================

def sample_and_reward(engine, rows: list[dict], cfg: Config, verifier: Verifier, refill=None) -> tuple:
    """Phases 1-2 of an RL step: G samples per prompt (technique 7) and the verifier's reward, with DAPO's dynamic
    sampling (section 3.2) when cfg.dynamic_sampling:

        keep the groups whose G rewards are not all equal (0 < accuracy < 1: the others have zero advantage
        under a group baseline, so they only shrink the batch's signal), and sample refill(r) prompts in extra
        rounds r = 1, 2, ... until the batch is full again or cfg.dynamic_sampling_rounds rounds have run;
        then train on the groups there are (possibly fewer, possibly none: logged).

    Returns (rollout, verdicts [B], stats): the timings, the verifier's counts, "samples_generated" (what the step
    cost) and, with dynamic sampling, "dynamic/groups_dropped" and "dynamic/rounds"."""
    rollout, verdicts, stats = sample_round(engine, rows, cfg, verifier)
    stats["samples_generated"] = rollout.B
    if not cfg.dynamic_sampling:
        return rollout, verdicts, stats
    G, want = cfg.group_size, rollout.B
    parts, dropped, rounds, offset = [], 0, 0, 0
    while True:
        varied = ~(verdicts.view(-1, G) == verdicts.view(-1, G)[:, :1]).all(1)  # [prompts]
        dropped += int((~varied).sum())
        keep = varied.repeat_interleave(G)  # [B], whole groups
        kept = rollout.select(keep)
        kept.prompt_index = kept.prompt_index + offset  # prompts of later rounds come after earlier ones
        parts.append((kept, verdicts[keep]))
        offset += len(varied)
        if sum(p.B for p, _ in parts) >= want or rounds >= cfg.dynamic_sampling_rounds or refill is None:
            break
        rounds += 1
        rollout, verdicts, more = sample_round(engine, refill(rounds), cfg, verifier)
        for k, v in more.items():
            stats[k] = stats.get(k, 0) + v
        stats["samples_generated"] += rollout.B
    rollout = Rollout.cat([p for p, _ in parts])
    verdicts = torch.cat([sc for _, sc in parts])
    if rollout.B > want:  # the last round over-filled: keep the first groups, a full batch
        rollout, verdicts = rollout.select(slice(0, want)), verdicts[:want]
    if rollout.B < want:
        log.info("dynamic sampling: %d of %d groups have varied rewards after %d extra rounds", rollout.B // G,
                 want // G, rounds)
    return rollout, verdicts, stats | {"dynamic/groups_dropped": dropped, "dynamic/rounds": rounds}


def sample_round(engine, rows: list[dict], cfg: Config, verifier: Verifier) -> tuple:
    """One round of phases 1-2: G samples of each prompt, and their rewards. Returns (rollout, verdicts [B], stats):
    the timings and the verifier's reward/timeouts, reward/errors and reward/oversized counts."""
    stats: dict = {}  # the verifier's timeouts, failures and oversized responses: counted in the step's record
    with timed(stats, "rollout", engine.device), autocast(cfg, engine.device):
        rollout = engine.generate([r["prompt"] for r in rows], n=cfg.group_size)  # 1. rollout
    with timed(stats, "reward", engine.device):
        verdicts = verify(rollout, rows, cfg, verifier, stats)  # 2. reward
    return rollout, verdicts, stats


def verify(rollout: Rollout, rows: list[dict], cfg: Config, verifier: Verifier, stats: dict | None = None):
    """Phase 2, the reward of each response [B] float: the verifier's score of its text against its prompt's gold
    answer; a response cut at max_new_tokens (no EOS) earns the wrong reward under cfg.truncated_reward "wrong"
    (it stated no final answer: it never ended), its text's score under "graded"."""
    golds = [gold_of(rows[int(i)]) for i in rollout.prompt_index]
    verdicts = truncation_rule(verifier.rewards(rollout.texts, golds, stats=stats), rollout.truncated.tolist(),
                             cfg.truncated_reward)
    return torch.tensor(verdicts, dtype=torch.float32, device=rollout.response_mask.device)


def overlong_penalties(lengths: torch.Tensor, cfg: Config) -> torch.Tensor:
    """DAPO's soft overlong punishment (reward.overlong_penalty) of each response, [B] -> [B] float32."""
    return torch.tensor([overlong_penalty(int(n), cfg.max_new_tokens, cfg.overlong_cache) for n in lengths],
                        dtype=torch.float32, device=lengths.device)


# ==================================================================================================================
# Phases 3-4: scoring, advantages and returns
# ==================================================================================================================

def score(policy, critic, engine, rollout: Rollout, cfg: Config, stats: dict, reference=None) -> dict:
    """Phase 3, no grad: {"old_logprobs", "values" (with a critic), "entropy" (when known), "ref_logprobs" (with
    --kl-coef)}, each [B, T]. PPO's old log-probs come from the sampler where they are the policy's own
    (old_logprobs_from_sampler); otherwise from a pass of the policy, with the gap to the sampler's logged."""
    from_sampler = old_logprobs_from_sampler(cfg, engine)
    with autocast(cfg, rollout.response_mask.device):
        scored = score_rollout(None if from_sampler else policy, critic, rollout, cfg.micro_batch_size,
                               cfg.temperature)
    if from_sampler:
        scored["old_logprobs"] = rollout.sampler_logprobs  # [B, T]
        if rollout.entropy is not None:
            scored["entropy"] = rollout.entropy  # [B, T]
    else:
        # the sampler's log-probs against the recomputation (another engine, other kernels): equal up to rounding
        # at top_p = 1 (with top_p < 1 the sampler's are of the truncated distribution)
        mask = rollout.response_mask
        gap = torch.where(mask.bool(), (scored["old_logprobs"] - rollout.sampler_logprobs).abs(), 0.0)  # [B, T]
        stats["sampler_logprob_gap_mean"] = masked_mean(gap, mask, all_sum=world.all_sum).item()
        stats["sampler_logprob_gap_max"] = world.all_max(gap.max() if gap.numel() else gap.new_zeros(())).item()
    if reference is not None:
        with autocast(cfg, rollout.response_mask.device):
            scored["ref_logprobs"] = score_rollout(reference, None, rollout, cfg.micro_batch_size,
                                                   cfg.temperature)["old_logprobs"]  # [B, T]
    return scored


def old_logprobs_from_sampler(cfg: Config, engine) -> bool:
    """Phase 3's choice (--old-logprobs): PPO's old log-probs from the sampler instead of a scoring pass. They are
    the same numbers (to rounding, about 3e-7 on the demo) when the sampler drew from the policy's own weights at
    top_p 1 in float32, so "auto" takes them only then: the HF engine of one process, top_p 1, no bf16."""
    if cfg.old_logprobs != "auto":
        return cfg.old_logprobs == "sampler"
    return not getattr(engine, "own_weights", True) and cfg.top_p == 1 and not cfg.bf16


def advantages_and_returns(rollout, rewards: torch.Tensor, values: torch.Tensor | None, cfg: Config,
                           stats: dict | None = None):
    """Phase 4: Decoupled (technique 2), length-adaptive (technique 3) GAE; or, with cfg.group_advantage, GRPO's
    group advantage (no critic, no returns). rewards [B], each placed on its response's last token. Returns
    (advantages [B, T], returns [B, T] or None, lam_policy [B] or None). stats gets the raw mean advantage over each
    response's first tenth and over the rest: a critic biased at the start of responses shows as a gap."""
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
    if stats is not None:
        head = first_tenth_mask(mask)
        stats["advantage_first_tenth"] = masked_mean(advantages, head, all_sum=world.all_sum).item()
        stats["advantage_rest"] = masked_mean(advantages, mask - head, all_sum=world.all_sum).item()
    if cfg.whiten_advantages:
        advantages = masked_whiten(advantages, mask, all_sum=world.all_sum)
    return advantages, returns, lam_policy


# ==================================================================================================================
# Phase 5: the update
# ==================================================================================================================

def update(policy, critic, optimizers: dict, rollout, batch: dict[str, torch.Tensor], cfg: Config,
           train_policy: bool = True) -> dict[str, float]:
    """Phase 5: for each epoch, each shuffled mini-batch, each micro-batch (gradients accumulate), the losses

        policy: L = L_PPO(ratio clipped to [1 - eps_low, 1 + eps_high], token-level)  (Eq. 8, techniques 4, 5)
                    + beta * KL(pi || pi_init)  (our option, --kl-coef)  + mu * L_NLL(correct samples)  (Eq. 9, 6)
        critic: L_V = 0.5 * (V - R)^2, aggregated as the policy loss is, clipped around the old values (--value-clip)

    then one optimizer step of each model (step_or_skip). Each micro-batch's loss is divided by the whole
    mini-batch's counts (over every process), so the gradients sum to the mini-batch's and the micro-batch size never
    changes the result; the policy's backward runs before the critic's forward, so the two graphs are never alive at
    once. The critic steps on the actor's mini-batches, or (--critic-mini-batch-size, --critic-epochs) in a loop of
    its own after the policy's, as verl's does. batch: "old_logprobs", "advantages" [B, T] and "positive" [B] for the
    policy; "values", "returns" [B, T] for the critic; "ref_logprobs" [B, T] with --kl-coef. train_policy False: the
    critic alone (value pretraining); critic None (GRPO, DAPO) or one that does not train: the policy alone."""
    stats, causes, sharded = Mean(), [], world.world_size() > 1
    both = ({"critic": critic} if trains(critic) else {}) | ({"policy": policy} if train_policy else {})
    loops = [(both, cfg.mini_batch_size, cfg.ppo_epochs)]  # (models, mini-batch size, epochs)
    if "critic" in both and cfg.critic_apart:  # the critic on its own terms, after the policy
        own = ({"critic": critic}, cfg.critic_mini_batch_size or cfg.mini_batch_size, cfg.critic_epochs or cfg.ppo_epochs)
        loops = ([({"policy": policy}, cfg.mini_batch_size, cfg.ppo_epochs)] if train_policy else []) + [own]
    for models, mini_batch_size, epochs in loops:
        for model in models.values():
            model.train()
        for _ in range(epochs):  # the order is drawn on the CPU (the same stream on every device)
            for mb_inds in torch.randperm(rollout.B).to(rollout.lengths.device).split(mini_batch_size // world.world_size()):
                mask = rollout.response_mask[mb_inds]  # [b, T]
                positive = mask * batch["positive"][mb_inds, None] if "policy" in models else mask.new_zeros(())
                counts = torch.stack([mask.sum(), (mask.sum(-1) > 0).sum(), positive.sum()]).double()
                n_tokens, n_seqs, n_positive = world.all_sum(counts).tolist()  # the whole mini-batch's: the normalisers
                if n_tokens == 0:  # only empty responses
                    continue
                mb_stats, bad = Mean(), []  # this mini-batch's; merged into stats only if it is applied
                for micro_inds in by_length(rollout, mb_inds).split(cfg.micro_batch_size):
                    sub = rollout.select(micro_inds, min_T=1 if sharded else 0)  # trimmed to its lengths
                    m, n = sub.response_mask, float(sub.response_mask.sum())  # [b, T]; sharded: every process runs
                    if n == 0 and not sharded:  # as many passes, for FSDP's collectives
                        continue
                    d = {k: F.pad(v[micro_inds], (0, max(sub.T - v.shape[1], 0)))[:, :sub.T] if v.dim() == 2
                         else v[micro_inds] for k, v in batch.items()}  # [b, T] or [b]
                    if "policy" in models:
                        with autocast(cfg, m.device):
                            logprobs, _ = response_logprobs(policy, sub, cfg.temperature)  # [b, T]
                        pg_loss, pg_stats = policy_loss(logprobs, d["old_logprobs"], d["advantages"], m, cfg.eps_low,
                                                        cfg.eps_high_used, cfg.loss_agg, n_tokens, n_seqs)  # Eq. 8
                        loss = pg_loss if cfg.policy_gradient else 0.0 * pg_loss  # off: a control (stats still logged)
                        if cfg.kl_coef > 0:
                            kl, kl_stats = kl_to_reference(logprobs, d["ref_logprobs"], m, cfg.loss_agg, n_tokens,
                                                           n_seqs)
                            loss = loss + cfg.kl_coef * kl
                            mb_stats.add(kl_stats, n)
                        if cfg.positive_nll:  # Eq. 9
                            nll = positive_nll_loss(logprobs, m, d["positive"], num_tokens=n_positive)
                            loss = loss + cfg.mu * nll
                            n_right = float((m * d["positive"][:, None]).sum())
                            mb_stats.add({"nll_loss": nll.item() * n_positive / max(n_right, 1)}, n_right)
                        bad += [] if torch.isfinite(loss) else ["policy loss"]
                        loss.backward()
                        # logged as the mini-batch's loss: each micro-batch's share, weighted by its tokens
                        mb_stats.add({"policy_loss": pg_loss.item() * n_tokens / max(n, 1), **pg_stats}, n)
                    if "critic" in models:
                        with autocast(cfg, m.device):
                            values = response_values(critic, sub)  # [b, T]
                        v_loss, v_stats = value_loss(values, d["returns"], m, d["values"], cfg.value_clip,
                                                     cfg.loss_agg, n_tokens, n_seqs)
                        bad += [] if torch.isfinite(v_loss) else ["value loss"]
                        v_loss.backward()
                        norm, part = (n_tokens, n) if cfg.token_level_loss else (n_seqs, float((m.sum(-1) > 0).sum()))
                        mb_stats.add({"value_loss": v_loss.item() * norm / max(part, 1)}, part)
                        mb_stats.add(v_stats, n)
                if "policy" in models and cfg.positive_nll and n_positive > 0:  # the NLL's weight beside a token's PG
                    mb_stats.add({"nll_weight": cfg.mu * n_tokens / n_positive})
                cause = step_or_skip(models, optimizers, cfg, mb_stats, bad)  # clip and step, or skip it all
                if cause is None:
                    stats.merge(mb_stats)
                else:  # nothing of it is applied or averaged into the step's figures
                    causes.append(cause)
    return stats.result() | {"skipped_nonfinite": len(causes)} | (
        {"nonfinite_cause": "; ".join(dict.fromkeys(causes))} if causes else {})


def step_or_skip(models: dict, optimizers: dict, cfg: Config, stats: Mean, bad: list[str]) -> str | None:
    """The end of a mini-batch: clip each model's gradient norm, then one optimizer and scheduler step of each, or
    none if any loss or gradient, in any process, was not finite; gradients zeroed either way. None when stepped,
    else the cause ("policy loss, policy gradient", ...)."""
    for name, model in models.items():
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # sharded: a DTensor
        if not torch.isfinite(norm):
            bad.append(f"{name} gradient")
        stats.add({f"grad_norm/{name}": norm.item(), f"grad_clipped/{name}": float(norm.item() > cfg.max_grad_norm)})
    if world.any_process(bool(bad)) and not bad:
        bad.append("loss in another process")
    if not bad:
        for name in models:
            optimizers[name][0].step()
            optimizers[name][1].step()
    else:
        log.warning("non-finite %s in a mini-batch: its optimizer step is skipped", ", ".join(dict.fromkeys(bad)))
    for name in models:
        optimizers[name][0].zero_grad(set_to_none=True)
    return ", ".join(dict.fromkeys(bad)) if bad else None


def make_optimizer(model, lr: float, cfg: Config):
    """AdamW with linear warmup over cfg.warmup_steps optimizer steps, then a constant learning rate."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
    warm = max(cfg.warmup_steps, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: min(1.0, (n + 1) / warm))
    return opt, sched


# ==================================================================================================================
# Value pretraining, evaluation
# ==================================================================================================================

def pretrain_value(policy, critic, optimizers, engine, rows, cfg: Config, verifier: Verifier, emit,
                   progress: dict | None = None, should_stop=lambda: False, observers=()) -> bool:
    """Technique 1, Value-Pretraining (section 3.1): critic-only steps on rollouts of the frozen initial policy,
    targets = Monte-Carlo returns (GAE with lambda = 1: every token's target is the final reward).

    Each step's explained variance is measured on its fresh rollouts *before* the critic trains on them: a held-out
    figure. Stops after value_pretrain_steps, or once the mean of the last 3 reaches value_pretrain_ev (the gate;
    the last record says whether it was reached, and a cap reached first is a warning). progress = {"step",
    "recent": the last explained variances} is updated in place (a resumed run passes the checkpoint's);
    should_stop() is asked after each step; observers (run.Hooks) see each scored batch (the critic judge counts
    the initial policy's responses). True when finished, False when stopped on request (the caller checkpoints)."""
    progress = progress if progress is not None else {"step": 0, "recent": []}
    for step in range(progress["step"], cfg.value_pretrain_steps):
        t0 = time.perf_counter()
        prompts = world.shard(prompt_batch(rows, step, cfg.prompts_per_rollout,
                                           config.stream(cfg.seed, "pretrain_prompts")))
        rollout, verdicts, timing = sample_round(engine, prompts, cfg, verifier)  # timing: time/rollout, time/reward
        mask = rollout.response_mask
        with engine.idle(weights_change=False):  # a vLLM engine frees the GPU for the critic's update
            with autocast(cfg, mask.device):
                values = score_rollout(None, critic, rollout, cfg.micro_batch_size)["values"]  # [B, T], no grad
            _, returns = gae(terminal_rewards(verdicts, mask), values, mask, gamma=cfg.gamma, lam=1.0)  # Monte-Carlo
            ev = explained_variance(values, returns, mask, all_sum=world.all_sum)
            error = masked_mean(values - returns, mask, all_sum=world.all_sum).item()  # bias, defined when EV is not
            if observers:
                problems = [prompts[int(i)] for i in rollout.prompt_index]  # [B], row b's prompt
                seen = Observed("value pretraining", step + 1, rollout, problems, verdicts, verdicts, policy, cfg,
                                values, returns)
                for o in observers:
                    o.observe(seen)
            with timed(timing, "update", mask.device):
                stats = update(policy, critic, optimizers, rollout, {"values": values, "returns": returns}, cfg,
                               train_policy=False)
        progress["recent"] = recent = (progress["recent"] + [ev])[-3:]
        progress["error"] = error
        progress["step"] = step + 1
        reached = cfg.value_pretrain_ev is not None and len(recent) == 3 and sum(recent) / 3 >= cfg.value_pretrain_ev
        last = reached or step + 1 == cfg.value_pretrain_steps
        gate = ({"value_pretrain_reached": reached, "value_pretrain_ev_last3": sum(recent) / len(recent)}
                if last and cfg.value_pretrain_ev is not None else {})
        emit({"value_pretrain_step": step + 1, **{k: stats[k] for k in ("value_loss", "grad_clipped/critic")
                                                   if k in stats},
              "explained_variance": ev, "value_error": error, "skipped_nonfinite": stats["skipped_nonfinite"],
              "train_acc": world.mean(verdicts > 0), "response_len": world.mean(rollout.lengths),
              "time/step": time.perf_counter() - t0, **timing, **gate})
        if reached:
            log.info("value pretraining reached explained variance %.3f after %d steps", sum(recent) / 3, step + 1)
            return True
        if step + 1 < cfg.value_pretrain_steps and should_stop():
            return False
    warn_below_gate(cfg, progress)
    return True


def warn_below_gate(cfg: Config, progress: dict):
    """Value pretraining's cap reached before its gate: a warning, and the critic's bias when EV is undefined."""
    if cfg.value_pretrain_ev is None or not progress["recent"]:
        return
    log.warning("value pretraining stopped at its cap of %d steps with explained variance %.3f (mean of the last %d), "
                "below its gate of %.2f: the critic starts RL without reaching it", cfg.value_pretrain_steps,
                sum(progress["recent"]) / len(progress["recent"]), len(progress["recent"]), cfg.value_pretrain_ev)
    if any(math.isnan(ev) for ev in progress["recent"]) and "error" in progress:
        log.warning("explained variance is undefined where every return of a batch is equal (all wrong, say), so the "
                    "gate could not judge; the critic's mean error V - R on the last fresh rollouts was %+.3f (its "
                    "bias: |error| near 0 means it has at least learned the mean return)", progress["error"])


def evaluate(engine, rows: list[dict], cfg: Config, verifier: Verifier) -> dict[str, float]:
    """Held-out accuracy: avg@k (k = eval_samples at eval_temperature / eval_top_p, the paper's protocol; on the
    first eval_sampled_prompts rows when set), pass@k (k > 1) and greedy, each with its standard error over prompts;
    on a dataset also each one lenient (eval/lenient_...: the stated answer right, or the gold the reply's last
    number), the task's skill apart from the answer format.
    A fixed sampling seed (evaluations differ only by the weights; the training RNG is untouched), in passes of
    eval_batch prompts so the KV cache never holds more rows than a training rollout's (or --eval-batch-size x k)."""
    # rows with a "band" (the long chains' step counts, "1-10" ...) also get the accuracy of each band
    bands = sorted({r["band"] for r in rows if "band" in r}, key=lambda b: int(b.split("-")[0]))
    sampled = rows[:cfg.eval_sampled_prompts]  # avg@k on the first eval_sampled_prompts (all by default)
    out = {}
    eval_batch = cfg.eval_batch_size or max(1, cfg.batch_size // cfg.eval_samples)
    for name, n, temperature, top_p, mine in (
            ("avg@%d" % cfg.eval_samples, cfg.eval_samples, cfg.eval_temperature, cfg.eval_top_p, sampled),
            ("greedy", 1, 0.0, 1.0, rows)):
        prompts = len(mine)
        mine = world.shard(mine)  # each process evaluates its share; the figures are over all of them
        if not mine:  # more processes than held-out prompts: this one has none, and adds nothing to the sums
            out[f"eval/acc_{name}"] = world.mean(torch.zeros(0))
            out[f"eval/acc_{name}_se"] = world.standard_error(torch.zeros(0), prompts)
            if n > 1:
                out[f"eval/pass@{n}"] = world.mean(torch.zeros(0))
            out[f"eval/response_len_{name}"] = world.mean(torch.zeros(0))
            out |= {f"eval/acc_{name}_steps_{band}": world.mean(torch.zeros(0)) for band in bands}
            if not cfg.builtin:
                out |= {f"eval/lenient_{key}": world.mean(torch.zeros(0)) for key in
                        (name, *([f"pass@{n}"] if n > 1 else []))}
            continue
        with autocast(cfg, engine.device):
            rollout = engine.generate([r["prompt"] for r in mine], n=n, temperature=temperature, top_p=top_p,
                                      seed=config.stream(cfg.seed, "evaluation"), batch_size=eval_batch)
        verdicts = verify(rollout, mine, cfg, verifier)
        out[f"eval/acc_{name}"] = world.mean(verdicts > 0)
        per_prompt = torch.zeros(len(mine), dtype=torch.float64).index_add_(  # each prompt's share right
            0, rollout.prompt_index.long().cpu(), (verdicts > 0).double().cpu()) / n
        out[f"eval/acc_{name}_se"] = world.standard_error(per_prompt, prompts)
        if n > 1:  # pass@k: the share of prompts with any right sample (sharpening raises avg@k, not pass@k)
            out[f"eval/pass@{n}"] = world.mean((per_prompt > 0).double())
        out[f"eval/response_len_{name}"] = world.mean(rollout.lengths)
        if not cfg.builtin:  # skill apart from format: the answer stated right, or the gold the reply's last number
            golds = [gold_of(mine[int(i)]) for i in rollout.prompt_index]
            last = [f"Answer: {x}" if x is not None else "" for x in map(last_number, rollout.texts)]
            lenient = (verdicts > 0) | (torch.tensor(verifier.rewards(last, golds), device=verdicts.device) > 0)
            out[f"eval/lenient_{name}"] = world.mean(lenient)
            if n > 1:
                any_right = torch.zeros(len(mine), dtype=torch.float64).index_add_(
                    0, rollout.prompt_index.long().cpu(), lenient.double().cpu()) > 0
                out[f"eval/lenient_pass@{n}"] = world.mean(any_right.double())
        for band in bands:
            pick = torch.tensor([mine[int(i)].get("band") == band for i in rollout.prompt_index], dtype=torch.bool)
            out[f"eval/acc_{name}_steps_{band}"] = world.mean(verdicts[pick] > 0)
    return out


def group_all_same(verdicts: torch.Tensor, G: int) -> float:
    """Share of prompts whose G samples all got the same reward (their group-relative signal is zero)."""
    if G < 2:
        return float("nan")
    groups = verdicts.view(-1, G)  # [prompts, G]
    return world.mean((groups == groups[:, :1]).all(1))


def config_from_args(argv=None) -> tuple[Config, str | None, bool]:
    """Parse the command line -> (validated Config, run folder to resume or None, --overwrite)."""
    return config.config_from_args(Config, ALGORITHMS, argv, description=__doc__)


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    cfg, resume, overwrite = config_from_args(argv)
    run_dir = train(cfg, resume=resume is not None, overwrite=overwrite)
    print(f"done: {run_dir}")


if __name__ == "__main__":
    main(sys.argv[1:])
