"""The per-token record behind the teaching views (python -m machinery.plots tokens RUN_DIR): TokenViews, which run.Run
makes for every run and vapo.train calls at step 0, after value pretraining and at every evaluation.

It writes into the run folder probes.json (the fixed probe responses, sampled once, so that a resumed run keeps
them) and tokens.jsonl (one JSON line per record: the probes scored token by token); plots.py draws them into
views/step-N/. It sees the run only through the Run passed in, and never imports run.py or vapo.py.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import weakref

import torch

from machinery import world
from machinery.checkpoints import write_atomically
from config import stream
from machinery.data import gold_of
from machinery.exact_values import exact_advantages
from gae import decoupled_gae, gae, group_advantage, length_adaptive_lambda, terminal_rewards
from machinery.plots import pick_probes, plot_tokens, read_tokens
from reward import truncation_rule
from rollout import rollout_from_tokens, score_rollout

log = logging.getLogger("vapo")


PROBE_PROMPTS, PROBE_SAMPLES = 8, 4  # the probe set: held-out prompts x samples from the starting policy


class TokenViews:
    """A fixed set of probe responses (PROBE_PROMPTS held-out prompts x PROBE_SAMPLES, sampled once from the
    starting policy with a fixed seed, kept in probes.json so that a resumed run keeps them), scored token by token
    at step 0, after value pretraining and at every evaluation; one JSON line per record in tokens.jsonl, with
    every probe's reward and length, and these rows for the four that plots.py draws (plots.pick_probes):

        V(s_t) and the critic's return target (lambda_critic) under the current critic; the policy's advantage,
        raw (before whitening), under the length-adaptive lambda, a fixed 0.95 and 1.0 (critic-free runs: the
        group advantage); the probability ratio pi_new / pi_old of the step's update (pi_old: the policy before
        that step's update; 1 where there was none yet) with the clip bounds; the entropy; and, over the whole
        probe set, the mean V(s_t) and the mean Monte-Carlo return (gamma = 1: the reward) by token position.

    One process only (a sharded run's models cannot score alone: the views are skipped there). plots.py draws
    them; nothing here needs a service running."""

    def __init__(self, run: "Run"):
        # a weak reference: Run holds its views, and a cycle between the two would keep the run's models, optimizers
        # and engine allocated after train() returns, until a full garbage collection (16 GB on a GPU at 0.5B)
        self.run, self.cfg = weakref.proxy(run), run.cfg
        self.path, self.probes_path = os.path.join(run.dir, "tokens.jsonl"), os.path.join(run.dir, "probes.json")
        self.enabled = run.cfg.token_views and world.world_size() == 1
        self.probes, self.old_logprobs, self.rows = None, None, None
        self.exact = None  # the built-in task's exact values of the current policy (exact_values.ExactValues)
        # (response text, problem) -> the character where it first goes wrong, from a task that knows every correct
        # step (the built-in task's task.first_error, given by run.Run); None: no first wrong token is marked
        self.first_error = None

    def _probes(self, engine, held_out, verifier):
        """The probe Rollout and its rewards: read from probes.json, or sampled now and written there."""
        tokenizer = self.run.tokenizer
        if os.path.exists(self.probes_path):
            with open(self.probes_path) as fh:
                saved = json.load(fh)
        else:
            rows = held_out[:PROBE_PROMPTS]
            r = engine.generate([row["prompt"] for row in rows], n=PROBE_SAMPLES,
                                seed=stream(self.cfg.seed, "views_probe"))
            golds = [gold_of(rows[int(i)]) for i in r.prompt_index]
            saved = {"prompts": [ids[m.bool()].tolist() for ids, m in zip(r.prompt_ids[::PROBE_SAMPLES],
                                                                         r.prompt_mask[::PROBE_SAMPLES])],
                     "responses": [ids[:n].tolist() for ids, n in zip(r.response_ids, r.lengths)],
                     "rewards": truncation_rule(verifier.rewards(r.texts, golds), r.truncated.tolist(),
                                                self.cfg.truncated_reward)}
            if world.is_main():
                write_atomically(self.probes_path, json.dumps(saved))
        probes = rollout_from_tokens(saved["prompts"], saved["responses"], [[0.0] * len(x) for x in saved["responses"]],
                                     PROBE_SAMPLES, engine.eos_ids, engine.pad_id, tokenizer, engine.device)
        return probes, torch.tensor(saved["rewards"], device=engine.device)

    def keep_old(self, policy, step: int):
        """Before step `step`'s update, when an evaluation follows it: the probes' log-probs under the policy then
        (pi_old of that update's ratio). With --eval-every-samples the step's cost is foreseen as one batch; a
        step that generates more (DAPO's extra rounds) and so reaches an evaluation unforeseen shows a ratio of 1
        in its views."""
        cfg, before = self.cfg, self.run.generated
        after = before + cfg.batch_size
        if self.enabled and self.probes is not None and self.run.evaluates(step, before, after):
            with self.run.engine.idle(weights_change=False):  # float32 logits: not beside the engine
                self.old_logprobs = score_rollout(policy, None, self.probes[0], cfg.micro_batch_size,
                                                  cfg.temperature)["old_logprobs"]

    def record(self, step: int, stage: str, policy, critic, engine, held_out, verifier):
        if not self.enabled or not held_out:
            return
        try:
            if self.probes is None:
                self.probes = self._probes(engine, held_out, verifier)
                self.rows = held_out[:PROBE_PROMPTS]  # the probes' problems, PROBE_SAMPLES responses each
            with engine.idle(weights_change=False):  # the scoring's logits: not beside the engine
                self._write(step, stage, policy, critic)
        except Exception as err:  # noqa: BLE001 - a view must not stop a long run
            log.warning("could not record the token views at step %d: %s", step, err)
        self.old_logprobs = None

    def _write(self, step: int, stage: str, policy, critic):
        cfg, (probes, rewards) = self.cfg, self.probes
        mask = probes.response_mask
        scored = score_rollout(policy, critic, probes, cfg.micro_batch_size, cfg.temperature)
        new = scored["old_logprobs"]  # [B, T] under the current policy
        old = self.old_logprobs if self.old_logprobs is not None else new
        terminal = terminal_rewards(rewards, mask)  # [B, T], the reward on the last token
        rows = {"logprob": new, "entropy": scored["entropy"], "ratio": torch.where(mask.bool(), (new - old).exp(), 0.0)}
        lam_policy = length_adaptive_lambda(probes.lengths, cfg.alpha)  # [B]
        if critic is not None:
            values = scored["values"]
            problems = [self.rows[b // PROBE_SAMPLES] for b in range(probes.B)]
            adaptive, returns = decoupled_gae(terminal, values, mask, gamma=cfg.gamma, lam_policy=lam_policy,
                                              lam_critic=cfg.lam_critic)
            rows |= {"value": values, "return": returns, "adv_adaptive": adaptive}
            for name, lam in (("adv_0.95", 0.95), ("adv_1.0", 1.0)):
                rows[name] = gae(terminal, values, mask, gamma=cfg.gamma, lam=lam)[0]
            counts = mask.sum(0).clamp(min=1)  # [T] responses that reach position t
            by_position = {"mean_value": ((values * mask).sum(0) / counts).tolist(),
                           "mean_return": ((rewards[:, None] * mask).sum(0) / counts).tolist(),
                           "count": mask.sum(0).tolist()}
        else:
            rows["adv_group"] = group_advantage(rewards, mask, PROBE_SAMPLES)
            by_position = None
        if self.exact is not None and self.exact.batches and self.rows and "expr" in self.rows[0]:
            problems = [self.rows[b // PROBE_SAMPLES] for b in range(probes.B)]
            star = self.exact.values(probes, problems, self.run.tokenizer)  # [B, T] V*, drawn beside V
            rows |= {"value_exact": star, "adv_exact": exact_advantages(star, rewards, mask, cfg.gamma)}
        tokenizer = self.run.tokenizer
        out = [{"reward": float(rewards[b]), "length": int(probes.lengths[b])} for b in range(probes.B)]
        for b in pick_probes(out):  # token by token for the four drawn only: a compact record at any length
            n = out[b]["length"]
            ids = probes.response_ids[b, :n].tolist()
            out[b] |= {"lam_policy": round(float(lam_policy[b]), 6), "tokens": ids,
                       "prompt": tokenizer.decode(probes.prompt_ids[b][probes.prompt_mask[b].bool()]),
                       "pieces": [tokenizer.decode([i]) for i in ids],
                       **{k: [round(float(x), 6) for x in v[b, :n]] for k, v in rows.items()}}
            wrong_at = self._first_wrong_token(b, ids, out[b]["pieces"])
            if wrong_at is not None:
                out[b]["first_error"] = wrong_at
        line = {"step": step, "stage": stage, "eps_low": cfg.eps_low, "eps_high": cfg.eps_high_used,
                "lam_critic": cfg.lam_critic, "alpha": cfg.alpha, "probes": out, "by_position": by_position}
        if world.is_main():
            with open(self.path, "a") as fh:
                fh.write(json.dumps(line) + "\n")
            plot_views(self.run.dir, step, stage)

    def _first_wrong_token(self, b: int, ids: list[int], pieces: list[str]) -> int | None:
        """The token at which probe b first goes wrong, where the task knows every correct step (the built-in
        task: task.first_error), else None."""
        row = self.rows[b // PROBE_SAMPLES] if self.rows else None
        if row is None or self.first_error is None or "expr" not in row:
            return None
        char = self.first_error(self.run.tokenizer.decode(ids, skip_special_tokens=True), row)
        if char is None:
            return None
        ends = 0
        for t, piece in enumerate(pieces):  # the token whose text covers that character
            ends += len(piece)
            if ends > char:
                return t
        return len(pieces) - 1

    def truncate(self, step: int, value_pretrained: bool = True, pretrain_step: int = 0):
        """Resume: keep the records that the restored point covers (RL steps done: step; value pretraining
        finished, or its steps done), drop the rest: they will be written again, each once."""
        def covered(r: dict) -> bool:
            if r["stage"] == "step 0":  # written before value pretraining's first step
                return value_pretrained or pretrain_step > 0
            if r["stage"] == "after value pretraining":
                return value_pretrained
            return r["step"] <= step
        if os.path.exists(self.path) and world.is_main():
            write_atomically(self.path, "".join(json.dumps(r) + "\n" for r in read_tokens(self.run.dir)
                                                if covered(r)))


def plot_views(run_dir: str, step: int, stage: str):
    """The teaching views of a record (plots.py), written into run_dir/views/; a failure is logged, never fatal."""
    try:
        plot_tokens(run_dir, step, stage)
    except Exception as err:  # noqa: BLE001
        log.warning("could not draw the token views of step %d: %s", step, err)
    gc.collect()
