"""Everything around the algorithm of vapo.py: loading what a run needs, its folder, its checkpoints, its signals,
the decision after each step, and the hooks through which what is not the algorithm plugs in.

    load_inputs        options checked, data read and checked before the model (which may take minutes), models,
                       the verifier, the held-out gold answers checked against themselves
    Run                the run folder: config.json, metrics.jsonl, checkpoint/ (+ checkpoint.prev/, the fallback),
                       critic_pretrained/, curves.png; resume (Progress), the signals, the after-step decision
                       (log; stop on non-finite steps; evaluate and plot; save; stop on a signal)
    Hooks              observers of every scored batch, and constructed critics (Setup, Observed: what they get)
    timed              a phase's seconds in the step's record

Rooms of their own beside it: world.py (the statistics over processes), checkpoints.py (writing a checkpoint so that
a kill leaves a whole one, reading it back with its fallback), models.py (SingleProcess, how the models are held)
and views.py (the per-token record behind the teaching views, TokenViews).

A kill at any moment leaves a run that `--resume` continues: records are whole lines, checkpoints are swapped in
whole, and a run killed before its first checkpoint starts again from the beginning (or from critic_pretrained/).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.util
import json
import logging
import math
import os
import random
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from tqdm import tqdm

from reward import Verifier, arith_reward, math_reward, reasoning_gym_reward
from machinery import world
from machinery.checkpoints import fault_point, load_checkpoint, save_checkpoint, save_pretrained_atomic, write_atomically
from machinery.data import check_gold_answers, is_reasoning_gym, load_data
from machinery.engines import sampling_seed
from machinery.exact_values import ExactReference, oracle_critic
from machinery.models import (BUILTIN_MODELS, SingleProcess, found_or_exit, gguf_location, is_gguf, load_tokenizer,
                              pick_device, shipped_model, trains)
from machinery.plots import plot_metrics
from machinery.task import first_error
from machinery.views import TokenViews

log = logging.getLogger("vapo")


# ==================================================================================================================
# The hooks: what is not the algorithm
# ==================================================================================================================

@dataclass
class Setup:
    """What a hook may use to build itself, once the run's models, data and engine are made (before a resume
    restores the weights): cfg (a config.Config), the policy, its tokenizer, the engine, the training rows and
    the verifier."""
    cfg: object
    policy: torch.nn.Module
    tokenizer: object
    engine: object
    rows: list
    verifier: Verifier


@dataclass
class Observed:
    """One scored batch, as observers see it: phases 1-4 of an RL step (stage "rl", before the update) or of a value
    pretraining step (stage "value pretraining"; no advantages, no old log-probs). step counts from 1. rollout: the
    B responses; problems [B] the row of each one's prompt; verdicts [B] the verifier's, rewards [B] what GAE sees
    (with --overlong-shaping, shaped); values, returns, advantages (as the policy loss uses them, whitened where
    whitening is on) and old_logprobs [B, T], None where the step has none."""
    stage: str
    step: int
    rollout: object
    problems: list
    verdicts: torch.Tensor
    rewards: torch.Tensor
    policy: torch.nn.Module
    cfg: object
    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None


@dataclass
class Hooks:
    """The two places where what is not the algorithm plugs into vapo.train (docs/techniques.md, "Hooks"); the lab
    and the benchmarks use them and never add parameters to the trainer's functions or replace them.

    critic(critic, setup) -> the critic the trainer calls, given the one it built (a value network with a zero head,
        or None for GRPO): that one unchanged, a wrapper of it, or a constructed critic. The trainer calls it like
        its own (rollout.response_values, which asks a critic with a values_of(rollout) method for its [B, T]
        values), trains it only if it has trainable weights (models.trains), and checkpoints its state_dict().
    observers(setup, critic) -> a list of observers. Each has observe(batch: Observed) -> dict, called after every
        scoring (figures it returns join the RL step's record); optionally updated(batch) -> dict, after the update;
        and state_dict() / load_state_dict(state), which the run's checkpoints keep, so a resumed run continues it.
    with_builtin adds the built-in task's own, in one process without dynamic sampling, where they are defined: its
    exact values V* (exact_values.ExactReference: the critic judge, the credit meter, the teaching views' V*) and,
    with --critic-oracle, the oracle critic that reads them."""
    critic: Callable | None = None
    observers: Callable | None = None

    def with_builtin(self, setup: Setup) -> "Hooks":
        cfg = setup.cfg
        if not cfg.builtin or cfg.dynamic_sampling or world.world_size() > 1:
            if cfg.critic_oracle and world.world_size() > 1:
                raise SystemExit("--critic-oracle: one process only (its V* is fitted on one process's samples): run "
                                 "vapo.py, not scale/train.py")
            return self
        if cfg.critic_oracle and self.critic is not None:
            raise SystemExit(f"--critic-oracle {cfg.critic_oracle}: the run has a constructed critic already (a hook's, "
                             f"e.g. bench/lab.py record's --critic-offset): give one of the two")
        reference, theirs = ExactReference(setup.tokenizer), self.observers
        critic = (lambda net, setup: oracle_critic(cfg.critic_oracle, reference, setup)) if cfg.critic_oracle else \
            self.critic

        def observers(setup, critic):
            return [reference] + (theirs(setup, critic) if theirs is not None else [])
        return Hooks(critic=critic, observers=observers)


def seed_all(cfg):
    """torch's and random's streams seeded from --seed (config.STREAMS["trainer"]). Sharded, each process its own
    draws, except the processes of one tensor-parallel vLLM engine (--vllm-tp): its sampler draws from this same
    stream in every one of them, and they must sample alike."""
    seed = sampling_seed(cfg)
    torch.manual_seed(seed)
    random.seed(seed)


@contextlib.contextmanager
def timed(stats: dict, phase: str, device: torch.device | None = None):
    """Adds the seconds the block takes to stats["time/<phase>"]. On a CUDA device the queued kernels are waited for
    before and after the block (torch.cuda.synchronize), so that each phase is charged with its own GPU work, not
    the previous phase's (the phases end in .item() calls that wait for most of it anyway), and the phase's peak of
    torch's allocated and reserved memory goes to stats["memory/<phase>_peak_gb"] and ["memory/<phase>_reserved_gb"]
    (GB = 1e9 bytes; torch's peak counters are reset at the block's start). On a CPU nothing waits or is counted."""
    cuda = device is not None and device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    t = time.perf_counter()
    yield
    if cuda:
        torch.cuda.synchronize(device)
        for kind, peak in (("peak", torch.cuda.max_memory_allocated), ("reserved", torch.cuda.max_memory_reserved)):
            key = f"memory/{phase}_{kind}_gb"
            stats[key] = max(stats.get(key, 0.0), peak(device) / 1e9)
    stats[f"time/{phase}"] = stats.get(f"time/{phase}", 0.0) + time.perf_counter() - t


# ==================================================================================================================
# What a run needs, loaded and checked
# ==================================================================================================================

def check_inputs(cfg):
    """What can be checked before any model or data loads, beyond config.validate: local model folders exist, a
    GGUF file exists with the gguf package installed (and --engine hf, as vLLM starts from a folder), the logging
    package of --report-to is installed. SystemExit with the option and the fix."""
    if is_gguf(cfg.model):
        gguf_location(cfg.model)  # the file is there and the gguf package too, or one line
        if cfg.engine == "vllm":
            raise SystemExit(f"--engine vllm with --model {cfg.model}: the vLLM engine starts from a model folder; "
                             f"use --engine hf, or save the dequantised model as a folder first (models.load_policy, "
                             f"then save_pretrained) and give that folder")
    for option, name in (("--model", cfg.model), ("--value-model", cfg.value_model)):
        if name is None or name in BUILTIN_MODELS or (option == "--model" and is_gguf(name)):
            continue
        local = name.startswith((".", "/", "~")) or name.endswith("/") or os.sep in name.strip("/").split("/", 1)[-1]
        if local and not os.path.isdir(os.path.expanduser(name)):
            raise SystemExit(f"{option} {name}: no such folder (a local model is a folder written by "
                             f"save_pretrained; a hub model is named org/name)")
    package = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(cfg.report_to)
    if package and importlib.util.find_spec(package) is None:
        raise SystemExit(f"--report-to {cfg.report_to}: the {package} package is not installed "
                         f"(pip install {package}), or use --report-to none")


def load_inputs(cfg, resume: bool, overwrite: bool, layout: SingleProcess) -> tuple:
    """(policy, critic or None, tokenizer, training rows, held-out rows, Verifier), after every check that can
    fail fast: the options, the run folder, the data (read and checked before the model, which may take minutes
    to load) and, once loaded, the held-out gold answers against the verifier. The models load through layout
    (sharded as they load in a sharded run)."""
    if cfg.engine == "vllm":  # optional, in scale/: imported only for the vLLM engine
        from scale.vllm_engine import check_prompt_room, check_vllm_device
        if cfg.device.startswith("cuda:"):
            check_vllm_device(torch.device(cfg.device), distributed=world.world_size() > 1)
    check_inputs(cfg)
    if cfg.vllm_tp > 1 and world.world_size() == 1:
        raise SystemExit(f"--vllm-tp {cfg.vllm_tp}: a tensor-parallel engine spans several processes; launch "
                         f"scale/train.py with a multiple of {cfg.vllm_tp} processes, or use --vllm-tp 1")
    Run.check_folder(cfg.output_dir, resume, overwrite)
    if not cfg.builtin:
        with found_or_exit("--model", cfg.model):
            tokenizer = load_tokenizer(cfg.model)
        rows, held_out = load_data(cfg, tokenizer)
    name = shipped_model(cfg.model) if cfg.model in BUILTIN_MODELS else cfg.model  # a shipped model's folder
    if cfg.value_model in BUILTIN_MODELS:  # the shipped reward model: its folder (config.json keeps the name)
        cfg = dataclasses.replace(cfg, value_model=shipped_model(cfg.value_model))
    policy, critic, tokenizer = layout.load_models(cfg, pick_device(cfg.device), name)
    if cfg.builtin:
        rows, held_out = load_data(cfg, tokenizer)
    if cfg.engine == "vllm":
        check_prompt_room(rows, held_out, tokenizer, cfg.max_new_tokens, policy.config)
    verifier = verifier_for(cfg)
    check_gold_answers(held_out, verifier)
    return policy, critic, tokenizer, rows, held_out, verifier


def verifier_for(cfg) -> Verifier:
    """The built-in task's exact integer check in-process; for datasets, in worker processes, a reasoning-gym
    generator's own score_answer or else math-verify."""
    if cfg.builtin:
        return Verifier(arith_reward, 0)
    return Verifier(reasoning_gym_reward if is_reasoning_gym(cfg.dataset) else math_reward, cfg.reward_workers)


def last_step(cfg, step: int, generated: int) -> bool:
    """Whether RL step `step`, after which `generated` samples have been generated in all, is the run's last:
    --steps reached, or --max-samples."""
    return step == cfg.steps or (cfg.max_samples is not None and generated >= cfg.max_samples)


def evaluates(cfg, step: int, before: int, after: int) -> bool:
    """Whether an evaluation follows RL step `step`, which took the samples generated from `before` to `after`:
    the last step's (last_step), and every --eval-every-samples samples if set, else every --eval-every steps.
    (bench/vs_trl.py evaluates TRL's run by the same rule.)"""
    if last_step(cfg, step, after):
        return True
    if cfg.eval_every_samples:
        return after // cfg.eval_every_samples > before // cfg.eval_every_samples
    return bool(cfg.eval_every) and step % cfg.eval_every == 0


# ==================================================================================================================
# The run folder
# ==================================================================================================================

RUN_FILES = ("config.json", "metrics.jsonl", "checkpoint", "checkpoint.prev", "checkpoint.tmp", "critic_pretrained",
             "curves.png", "tokens.jsonl", "probes.json", "views")


@dataclass
class Progress:
    """Where a run stands: what a checkpoint restores."""
    step: int = 0
    """RL steps done"""
    value_pretrained: bool = False
    """value pretraining finished (or not wanted)"""
    pretrain: dict = field(default_factory=lambda: {"step": 0, "recent": []})
    """value pretraining's steps done and its last explained variances, while it is unfinished"""


class Run:
    """The run folder: config.json, metrics.jsonl (one flat JSON object per line), checkpoint/ (the latest
    verified checkpoint) and checkpoint.prev/ (the one before it, the fallback), critic_pretrained/, curves.png.

    A folder that already holds a run (any of RUN_FILES) is only reused to resume it, or emptied first with
    overwrite=True: two runs never mix their records. Other files there (a redirected log) are left alone.
    layout: how the models are held (models.SingleProcess, or scale's Sharded); only the main process writes."""

    def __init__(self, cfg, layout: SingleProcess, resume: bool = False, overwrite: bool = False):
        self.cfg, self.layout = cfg, layout
        self.dir = cfg.output_dir or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
        existing = Run.check_folder(self.dir, resume, overwrite)
        if existing and not resume and world.is_main():
            log.warning("--overwrite: deleting the earlier run's %s in %s", ", ".join(existing), self.dir)
            for f in existing:
                path = os.path.join(self.dir, f)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        os.makedirs(self.dir, exist_ok=True)
        world.barrier()
        self.metrics_path = os.path.join(self.dir, "metrics.jsonl")
        self.t0 = time.perf_counter()
        self.writer = None
        self.observers = []  # the hooks' observers: their state goes into every checkpoint
        self.stop = StopRequest()
        if world.is_main():  # one process writes the run folder
            if cfg.report_to == "tensorboard":
                from torch.utils.tensorboard import SummaryWriter  # optional: check_inputs found it installed
                self.writer = SummaryWriter(self.dir)
            elif cfg.report_to == "wandb":
                import wandb  # optional: check_inputs found it installed
                self.writer = wandb.init(project="vapo", config=dataclasses.asdict(cfg), dir=self.dir)
            write_atomically(os.path.join(self.dir, "config.json"), json.dumps(dataclasses.asdict(cfg), indent=2))
            log.info("run folder %s; config:\n%s", self.dir, json.dumps(dataclasses.asdict(cfg), indent=1))
        self.views = TokenViews(self)  # the per-token record (tokens.jsonl, views/)
        self.views.first_error = first_error if cfg.builtin else None  # the built-in task marks the first wrong token

    @staticmethod
    def check_folder(folder: str | None, resume: bool, overwrite: bool) -> list[str]:
        """The run files already in folder; SystemExit if there are some and neither resume nor overwrite is
        set (called before any model loads, and again when the folder is set up)."""
        existing = [f for f in RUN_FILES if folder and os.path.exists(os.path.join(folder, f))]
        if existing and not resume and not overwrite:
            raise SystemExit(f"--output-dir {folder}: already holds a run ({', '.join(existing)}). Continue it "
                             f"with --resume {folder}, or start over with --overwrite (deletes those files).")
        return existing

    def attach(self, policy, critic, tokenizer, optimizers: dict, engine, observers: list):
        """What this run's checkpoints hold (the models as trained, the optimizers, the observers' state) and the
        engine it closes; the teaching views draw V* beside V where an observer knows it (exact_values)."""
        self.policy, self.critic, self.tokenizer, self.optimizers, self.engine = (policy, critic, tokenizer,
                                                                                   optimizers, engine)
        self.observers = observers
        self.views.exact = next((o.exact for o in observers if isinstance(o, ExactReference)), None)

    # --- metrics ------------------------------------------------------------------------------------------------
    def emit(self, record: dict):
        """Append one record as one line, written by one call and flushed, so a kill leaves at most a torn last
        line (records() drops it). Only the main process writes (every figure is already over all processes)."""
        if not world.is_main():
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

    def emit_eval(self, step: int, figures: dict):
        """An evaluation's record, logged and shown."""
        record = {"step": step, **figures}
        self.emit(record)
        log.info("eval at step %d: %s", step, {k: round(v, 4) for k, v in record.items()})

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
        world.barrier()  # every process has read the records before they are rewritten
        if world.is_main():
            write_atomically(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
        world.barrier()

    # --- checkpoints --------------------------------------------------------------------------------------------
    def save(self, progress: Progress):
        """A checkpoint of where the run stands (save_checkpoint), logged with its bytes and seconds (the figures
        are also the log record's `checkpoint` attribute, for a reader of the log such as bench/gpu_check.py)."""
        critic = self.critic if trains(self.critic) else None  # a constructed critic without weights: nothing to save
        written = save_checkpoint(self, progress.step, self.policy, critic, self.tokenizer, self.optimizers,
                                  progress.value_pretrained, None if progress.value_pretrained else progress.pretrain,
                                  [o.state_dict() for o in self.observers])
        if world.is_main():
            log.info("checkpoint at step %d: %.3f GB, written in %.1f s, read back in %.1f s, fsynced and renamed "
                     "in %.1f s", written["step"], written["bytes"] / 1e9, written["write_s"], written["verify_s"],
                     written["swap_s"], extra={"checkpoint": written})

    def save_pretrained_critic(self):
        """critic_pretrained/: the value-pretrained critic, a Hugging Face folder (--value-model takes it)."""
        save_pretrained_atomic(self.critic, os.path.join(self.dir, "critic_pretrained"), self.layout)
        fault_point("pretrained-critic-written")

    def restore(self) -> Progress:
        """Resume: weights, optimizers and RNG from the newest readable checkpoint, and the metrics cut back to
        what it covers. A run killed before its first checkpoint starts the RL phase from the critic of
        critic_pretrained/ if that was written, else from the beginning."""
        t0 = time.perf_counter()
        saved = load_checkpoint(self, self.policy, self.critic if trains(self.critic) else None, self.optimizers)
        if saved is not None and world.is_main():
            loaded = {"step": saved["step"], "seconds": time.perf_counter() - t0}
            log.info("checkpoint of step %d read back into the models and optimizers in %.1f s", saved["step"],
                     loaded["seconds"], extra={"checkpoint_loaded": loaded})
        pretrained_critic = os.path.join(self.dir, "critic_pretrained")
        if saved is not None:
            progress = Progress(saved["step"], saved["value_pretrained"], saved["pretrain"] or Progress().pretrain)
            states = saved["observers"] or []
            if len(states) != len(self.observers):
                log.warning("the checkpoint holds the state of %d observers and this run has %d: they start afresh",
                            len(states), len(self.observers))
            else:
                for observer, state in zip(self.observers, states):
                    observer.load_state_dict(state)
            self.truncate_metrics(progress.step, None if progress.value_pretrained else progress.pretrain["step"])
            log.info("resumed from step %d%s", progress.step, "" if progress.value_pretrained else
                     f" (value pretraining step {progress.pretrain['step']})")
        elif trains(self.critic) and os.path.exists(os.path.join(pretrained_critic, "config.json")):
            self.layout.load_weights(self.critic, pretrained_critic)
            # value pretraining is over but not yet marked so: train() runs none of its steps, then what follows
            # them (the views after it, a fresh critic optimizer, the first checkpoint)
            progress = Progress(pretrain={"step": self.cfg.value_pretrain_steps, "recent": []})
            self.truncate_metrics(0)
            log.warning("no complete checkpoint in %s: starting the RL phase from step 0 with the critic of "
                        "critic_pretrained/", self.dir)
        else:
            progress = Progress()
            self.truncate_metrics(-1, 0)
            log.warning("no complete checkpoint in %s: starting the run from the beginning", self.dir)
        self.views.truncate(progress.step, progress.value_pretrained, progress.pretrain["step"])
        return progress

    # --- signals and the steps ----------------------------------------------------------------------------------
    def stop_requested(self) -> bool:
        """A SIGTERM or SIGINT arrived in any process (every process then stops at the same step)."""
        return world.any_process(self.stop.signal_name is not None)

    def steps(self, progress: Progress):
        """The RL steps left to run, under a progress bar: from progress.step to --steps, or none when
        --max-samples was reached before a resume."""
        cfg = self.cfg
        self.generated, self.nonfinite_streak = self.samples_generated(), 0  # 0 unless resumed
        start = progress.step
        if cfg.max_samples is not None and self.generated >= cfg.max_samples:
            log.info("--max-samples %d already reached (%d generated): no step left to run", cfg.max_samples,
                     self.generated)
            start = cfg.steps
        self.bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=cfg.algo.upper(),
                        dynamic_ncols=True, disable=not world.is_main())
        return self.bar

    def after_step(self, record: dict, progress: Progress, evaluate) -> bool:
        """After an RL step: log it; stop the run on a streak of non-finite steps (a checkpoint, then SystemExit);
        evaluate (evaluate(step)) and plot when `evaluates` says and at the last; checkpoint every save_every
        steps, at the last and on a signal. True when the loop ends here."""
        cfg = self.cfg
        self.emit(record)
        fault_point("step-logged")
        before, self.generated = self.generated, self.generated + record["samples_generated"]
        self.bar.set_postfix({k: f"{record[key]:{fmt}}" for k, key, fmt in (
            ("acc", "train_acc", ".2f"), ("len", "response_len", ".0f"), ("ev", "explained_variance", ".2f"),
            ("s", "time/step", ".1f")) if key in record}, refresh=False)
        progress.step = done = record["step"]
        self.nonfinite_streak = self.nonfinite_streak + 1 if record.get("skipped_nonfinite", 0) else 0
        if self.nonfinite_streak >= cfg.max_nonfinite_steps:
            self.save(progress)
            close_engine(self.engine)
            raise SystemExit(
                f"vapo: stopped at step {done}: {self.nonfinite_streak} consecutive steps had a non-finite loss or "
                f"gradient ({record.get('nonfinite_cause', 'see the log')}); their updates were skipped, so the "
                f"checkpoint in {self.dir} holds the last finite weights. Lower --actor-lr/--critic-lr or check "
                f"the data, then continue with --resume {self.dir} (--max-nonfinite-steps sets the limit).")
        last = last_step(cfg, done, self.generated)
        if self.evaluates(done, before, self.generated):
            evaluate(done)
            plot(self)
        stop_now = self.stop_requested()
        if last or (cfg.save_every and done % cfg.save_every == 0) or stop_now:
            self.save(progress)
        if last:
            if done < cfg.steps:
                log.info("stopping after step %d: %d samples generated (--max-samples %d)", done, self.generated,
                         cfg.max_samples)
            return True
        return stop_now and self.stopped(done)

    def evaluates(self, step: int, before: int, after: int) -> bool:
        """Whether an evaluation follows step `step`, which took the samples generated from `before` to `after`
        (evaluates, the module's rule: the last step, and every --eval-every-samples or --eval-every)."""
        return evaluates(self.cfg, step, before, after)

    def stopped(self, step: int) -> bool:
        """If a signal asked to stop: say how to continue, and True."""
        if not self.stop_requested():
            return False
        log.warning("stopped by %s with a checkpoint at step %d. Continue with: python vapo.py --resume %s",
                    self.stop.signal_name, step, self.dir)
        return True

    def finish(self, final_plot: bool = True) -> str:
        """The last plot, the engine closed; the run folder."""
        if final_plot:
            plot(self)
        close_engine(self.engine)
        return self.dir


class StopRequest:
    """SIGTERM (what SLURM and other schedulers send before a kill) and SIGINT (Ctrl-C) during train(): the first
    one is remembered and the loop stops at its next safe point (after the step or pretraining step under way),
    writes a checkpoint and returns; a second Ctrl-C interrupts at once, without saving."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: the user means it
        self.signal_name = signal.Signals(signum).name
        log.warning("%s received: stopping after the current step with a checkpoint (Ctrl-C again quits without "
                    "saving)", self.signal_name)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


def close_engine(engine):
    """Shut down an engine that has processes or memory of its own (vLLM) once every process is done with it: its
    shutdown also takes torch.distributed's process group down, so nothing collective may follow."""
    world.barrier()
    if hasattr(engine, "close"):
        engine.close()


def plot(run: Run):
    """curves.png in the run folder (see plots.py); a plotting failure is logged, never fatal to training.

    A closed matplotlib figure is a reference cycle (about 9 MiB for this one, its renderer's buffers included)
    that only a full garbage collection frees, and those come rarely in a long run: collected here, at once.
    Twice: a log axis's tick labels go through mathtext, whose parser leaves exceptions whose tracebacks hold the
    drawing frames (and through them the figure); the first collection frees those, the second the figure."""
    if not world.is_main():
        return
    try:
        plot_metrics(run.metrics_path, os.path.join(run.dir, "curves.png"))
    except Exception as err:  # noqa: BLE001 - a broken plot must not stop a long run
        log.warning("could not plot %s: %s", run.metrics_path, err)
    for _ in range(2):
        gc.collect()
