"""Check on one GPU, offline, in one command of about 9 minutes: what `--preset gpu-0.5b` does on a random model of
Qwen2.5-0.5B's shape, part by part (update, train, numerics, resume, sample, sharded, evaluate, vllm), each part in
a time box and its figures kept as soon as it ends.

    python bench/gpu_check.py --out DIR --workdir WORK          # the whole check: about 7.5 minutes on one GPU
    python bench/gpu_check.py --parts update sample --out DIR   # only some parts
    python bench/gpu_check.py --tiny --device cpu --out DIR     # a 2-layer version on a CPU (the tests)

DIR/gpu_check.json is rewritten after every part ("status": partial, then complete, or stopped after a SIGTERM from
outside); DIR/gpu_check.txt gets one summary line a part. docs/scaling.md ("What a GPU run meets first") says what
each part measures, the time plan, the disk the work folder needs and how MFU is counted.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import torch

import common  # (puts the repository on the path)
import vapo
from common import QWEN25_05B, PeakMemory, in_use, n_params, sync
from config import PRESETS
from rollout import Rollout, score_rollout
from machinery import engines, run, task
from machinery.data import load_data
from machinery.models import load_models
from scale.memory import counts

log = logging.getLogger("gpu_check")
PRESET = PRESETS["gpu-0.5b"]
T_START = time.perf_counter()  # after the imports (about 10 s on the GPU image): the deadline and wall_s count here

# --tiny: heads of the real 64 dimensions with grouped KV (a head size vLLM's CPU attention supports), 2 layers, a
# vocabulary still larger than the tokenizer's, so that a CPU runs a step in seconds
TINY = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            intermediate_size=1024, vocab_size=4096)
FULL_RUN = dict(prompts_per_step=16, samples_per_prompt=8, max_new_tokens=512, eval_prompts=64, vllm_steps=2,
                sample_prompts=PRESET["prompts_per_step"], sample_new_tokens=PRESET["max_new_tokens"],
                update_prompt_tokens=252, update_new_tokens=PRESET["max_new_tokens"],  # 2,300 in all, as the docs
                sharded_prompts=4, sharded_samples=8, sharded_new_tokens=256)
TINY_RUN = dict(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=16, eval_prompts=2, vllm_steps=1,
                sample_prompts=4, sample_new_tokens=32, update_prompt_tokens=8, update_new_tokens=32,
                sharded_prompts=2, sharded_samples=2, sharded_new_tokens=16)
BOTH_RUNS = dict(value_pretrain_steps=1, update_repeats=3)

PARTS = ("update", "train", "numerics", "resume", "sample", "sharded", "evaluate", "vllm")  # in the order they run
PLAN_S = dict(update=25, train=90, numerics=0, resume=40, sample=50, sharded=70, evaluate=15, vllm=110)
PLAN_WITHOUT_VLLM_S = dict(update=30, train=100, numerics=0, resume=40, sample=65, sharded=140, evaluate=25, vllm=0)
PLAN_TOTAL_S = 400  # what --budget-s scales: both plans sum to it
DEADLINE_S = 440  # no part starts, or runs on, later than this after the start (default of --deadline-s)
MIN_BOX_S = 5  # a part left less than this before the deadline is skipped
STOP_GRACE_S = 90  # after a SIGTERM from outside: the step under way and its checkpoint, then the process ends
SHARDED_GRACE_S = 45  # after a sharded process's box: its SIGTERM stop (a step and a checkpoint) before a SIGKILL
CHECKPOINT_PARTS = ("train", "resume", "sharded")  # the parts that write checkpoints into the work folder
# docs/scaling.md's arithmetic for --preset gpu-0.5b: 512 responses and micro-batches of 4, 2,300 tokens each;
# its measurement without a GPU (bench/memory_measured.py at commit 758a9d0): 41.9 GB at the update's peak
README = dict(rows=512, micro=4, seq=2300, update_gb=33, sampling_gb=30, update_measured_gb=41.9)
KV_BYTES = 2  # one cached K or V element: the sampler's cache is bf16 under --bf16 (rollout.kv_cache_bytes_per_token)


# --- shapes, arithmetic, disk, measurement --------------------------------------------------------------------
def model_config(tokenizer, tiny: bool):
    from transformers import Qwen2Config
    return Qwen2Config(**{**QWEN25_05B, **(TINY if tiny else {})}, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=None, use_cache=True)


def memory_arithmetic(params: int, config, rows: int, micro: int, seq: int) -> dict:
    """docs/scaling.md's items, GB (1e9 bytes): float32 weights + gradients + AdamW moments of policy and critic;
    the KV cache of `rows` sequences of `seq` tokens; one micro-batch's checkpointed layer inputs (bf16) and its
    float32 logits, softmax and their gradient."""
    head_dim = config.hidden_size // config.num_attention_heads
    items = {"weights_grads_adamw_both": 2 * params * (4 + 4 + 8),
             "kv_cache": config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * KV_BYTES * rows * seq,
             "checkpointed_inputs": config.num_hidden_layers * micro * seq * config.hidden_size * 2,
             "logits": 3 * micro * seq * config.vocab_size * 4}
    gb = {k: v / 1e9 for k, v in items.items()}
    return {"items_gb": {k: round(v, 2) for k, v in gb.items()}, "rows": rows, "micro_batch": micro, "seq": seq,
            "update_peak_gb": round(gb["weights_grads_adamw_both"] + gb["checkpointed_inputs"] + gb["logits"], 2),
            "sampling_peak_gb": round(gb["weights_grads_adamw_both"] + gb["kv_cache"], 2)}


def disk_need(params: int) -> dict:
    """Bytes the work folder needs, a tenth more each: "model" (the float32 model folder), "checkpoints" (what a
    part that writes checkpoints adds at its peak: the checkpoint being written beside the one it replaces, each
    the float32 policy and critic and both AdamW states, 24 bytes a parameter, and the pretrained critic)."""
    return {"model": 1.1 * 4 * params, "checkpoints": 1.1 * (2 * 24 * params + 4 * params)}


def check_disk(workdir: str, need: dict) -> dict:
    """The work folder's free space against disk_need; SystemExit when not even the model folder fits."""
    free = shutil.disk_usage(workdir).free
    out = {"path": workdir, "free_gb": round(free / 1e9, 1), "need_model_gb": round(need["model"] / 1e9, 1),
           "need_with_checkpoints_gb": round((need["model"] + need["checkpoints"]) / 1e9, 1)}
    if free < need["model"]:
        raise SystemExit(f"--workdir {workdir}: {free / 1e9:.1f} GB free, the model folder alone needs "
                         f"{need['model'] / 1e9:.1f} GB")
    return out | {"checkpoints_fit": free >= need["model"] + need["checkpoints"]}


def gb(peak: dict) -> dict:
    """PeakMemory.stop()'s MB as {"peak_gb", "peak_reserved_gb"} (None: no reserved figure, a CPU)."""
    reserved = peak["peak_reserved_mb"]
    return {"peak_gb": round(peak["peak_mb"] / 1e3, 3),
            "peak_reserved_gb": None if reserved is None else round(reserved / 1e3, 3)}


@contextlib.contextmanager
def measure(device: torch.device):
    """`with measure(device) as m:` m gets the block's "seconds" (the device synchronised) and its peaks (gb())."""
    m, memory = {}, PeakMemory(device)
    memory.start()
    t0 = time.perf_counter()
    try:
        yield m
        sync(device)
    finally:
        m.update(seconds=time.perf_counter() - t0, **gb(memory.stop()))


# --- the probe on the trainer's own functions -----------------------------------------------------------------
class Probe:
    """The trainer's functions wrapped; `records` holds one {"what", "phase", "seconds", "peak_gb",
    "peak_reserved_gb", ...} a timed call, in call order, and on_record(record) is called after each."""

    def __init__(self, device: torch.device, on_record=None):
        self.device, self.records, self.originals, self.on_record = device, [], [], on_record
        self.phase = "train"  # which part of the check the records belong to

    def wrap(self, owner, name: str, what=None, describe=None, before=None, after=None):
        """owner.name with before(args, kwargs) and after(args, kwargs, out) around it, and timed with its peak
        memory when `what` names it (describe(args, kwargs, out) -> more fields of its record)."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if before is not None:
                before(args, kwargs)
            if what is None:
                return after_call(args, kwargs, original(*args, **kwargs))
            with measure(self.device) as m:
                out = original(*args, **kwargs)
            record = {"what": what, "phase": self.phase, **m}
            if self.device.type == "cuda":  # all of the device's memory in use, vLLM's pool included
                free, total = torch.cuda.mem_get_info(self.device)
                record["device_used_gb"] = round((total - free) / 1e9, 3)
            self.records.append(record | (describe(args, kwargs, out) if describe else {}))
            after_call(args, kwargs, out)
            if self.on_record is not None:
                self.on_record(record)
            return out

        def after_call(args, kwargs, out):
            if after is not None:
                after(args, kwargs, out)
            return out

        self.originals.append((owner, name, original))
        setattr(owner, name, wrapper)

    def undo(self):
        for owner, name, original in reversed(self.originals):
            setattr(owner, name, original)
        self.originals.clear()

    def of(self, phase: str, what: str) -> list[dict]:
        return [r for r in self.records if r["phase"] == phase and r["what"] == what]


def _generated(args, kwargs, out):
    lengths = out.lengths.float()
    return {"rows": out.B, "prompt_width": out.P, "response_width": out.T, "tokens": int(out.lengths.sum()),
            "lengths": {"min": int(lengths.min()), "median": float(lengths.median()), "max": int(lengths.max()),
                        "truncated_frac": round(float(out.truncated.float().mean()), 3)}}


def _updated(args, kwargs, out):
    policy, critic, rollout, cfg = args[0], args[1], args[3], args[5]  # update(policy, critic, optimizers,
    tokens = int(rollout.prompt_mask.sum() + rollout.lengths.sum()) * cfg.ppo_epochs  # rollout, batch, cfg, ...)
    return {"tokens": tokens, "train_policy": kwargs.get("train_policy", args[6] if len(args) > 6 else True),
            "prompt_width": rollout.P, "response_width": rollout.T,
            "params": {name: n_params(m) if m is not None else 0 for name, m in (("policy", policy),
                                                                                 ("critic", critic))}}


class FirstMiniBatch:
    """The PPO ratio of each vapo.update's first mini-batch, before any optimizer step: its token-weighted ratio
    mean, largest |ratio - 1| and clipped shares (losses.policy_loss's stats), one record an update that trains the
    policy. At ratio 1 the sampler's (or scoring pass's) log-probs and the update's forward agree."""

    def __init__(self, probe: Probe):
        self.probe, self.records, self.current = probe, [], None
        probe.wrap(vapo, "update", before=self._open)
        probe.wrap(vapo, "policy_loss", after=self._add)  # as vapo.py imported it
        probe.wrap(vapo, "step_or_skip", after=self._close)

    def _open(self, args, kwargs):
        self.current = {"tokens": 0.0, "sums": {}, "max_abs_ratio_minus_1": 0.0}

    def _add(self, args, kwargs, out):
        if (c := self.current) is None:
            return
        logprobs, old, mask = args[0], args[1], args[3]
        weight, ratio = float(mask.sum()), torch.exp(logprobs.detach().float() - old.float())  # [b, T]
        c["tokens"] += weight
        c["max_abs_ratio_minus_1"] = max(c["max_abs_ratio_minus_1"],
                                         float(((ratio - 1).abs() * mask).max()) if weight else 0.0)
        for k, v in out[1].items():
            c["sums"][k] = c["sums"].get(k, 0.0) + v * weight

    def _close(self, args, kwargs, out):
        c, self.current = self.current, None
        if c and c["tokens"]:  # a critic-only update (value pretraining) has no policy loss
            self.records.append({"phase": self.probe.phase, "tokens": int(c["tokens"]),
                                 "max_abs_ratio_minus_1": c["max_abs_ratio_minus_1"],
                                 **{k: s / c["tokens"] for k, s in c["sums"].items()}})

    def of(self, phase: str) -> list[dict]:
        return [r for r in self.records if r["phase"] == phase]


# --- stopping: a part's box, a SIGTERM from outside -----------------------------------------------------------
class Stopped(BaseException):
    """A SIGTERM from outside (a command's time limit): the part under way ends, the report is written, the
    script stops."""


class PartTimeout(Exception):
    """A part's box spent inside one long call (sampling, an evaluation): raised from the model's forward."""


class Stops:
    """The part's time box, `with stops.box(seconds, model):`, and a SIGTERM from outside. Once the box is spent,
    a vapo.train under way is asked to stop at its next safe point (Run.stop_requested, hooked: its StopRequest
    set as a SIGTERM sets it), so it stops after the step under way, with a checkpoint; and `model`'s next forward
    raises PartTimeout (`forwards` counts them: a sampler's prefill, then one a decoding step). A SIGTERM from
    outside raises Stopped, or inside vapo.train (whose StopRequest takes it) stops the run after its step; no part
    starts after it, and the process ends within STOP_GRACE_S whatever it is doing."""

    def __init__(self):
        self.end, self.seconds, self.forwards, self.outside = math.inf, 0.0, 0, False
        signal.signal(signal.SIGTERM, self._sigterm)

    def watch(self, probe: Probe):
        probe.wrap(run.Run, "stop_requested", before=self._safe_point)
        probe.wrap(run.StopRequest, "_handle", before=lambda args, kwargs: self._from_outside())

    @contextlib.contextmanager
    def box(self, seconds: float, model=None):
        self.end, self.seconds, self.forwards = time.perf_counter() + seconds, seconds, 0
        hook = model.register_forward_pre_hook(self._forward) if model is not None else None
        try:
            yield self
        finally:
            self.end = math.inf
            if hook is not None:
                hook.remove()

    def _forward(self, module, args):
        if time.perf_counter() >= self.end:
            raise PartTimeout(f"box of {self.seconds:.0f} s spent after {self.forwards} forward passes")
        self.forwards += 1

    def _safe_point(self, args, kwargs):
        stop = args[0].stop  # the Run's StopRequest
        if time.perf_counter() >= self.end and stop.signal_name is None:
            log.warning("box of %g s spent: asking the run to stop", self.seconds)
            stop.signal_name = "the part's box"

    def _from_outside(self):
        if not self.outside:
            self.outside = True
            backstop = threading.Timer(STOP_GRACE_S, os._exit, (143,))  # the last word if the stop hangs
            backstop.daemon = True
            backstop.start()

    def _sigterm(self, signum, frame):
        self._from_outside()
        raise Stopped("SIGTERM")


# --- the model, the runs' configs, what the parts share -------------------------------------------------------
def ragged_eos(model, tokenizer, hazard: float, seed: int) -> list[int]:
    """Ragged lengths from a random model: hazard x (vocabulary - tokenizer) ids above the tokenizer's own join EOS
    in the model's generation config (the path an instruct model's several stop tokens take). A random model's
    next-token distribution is nearly uniform, so a step stops with probability about hazard: at 2 /
    max_new_tokens, a mean of max_new_tokens / 2 and e^-2 = 14% of the rows cut at max_new_tokens."""
    vocab, first = model.config.vocab_size, len(tokenizer)
    k = max(1, round(hazard * (vocab - first)))
    ids = (torch.randperm(vocab - first, generator=torch.Generator().manual_seed(seed))[:k] + first).tolist()
    model.generation_config.eos_token_id = [tokenizer.eos_token_id] + sorted(ids)
    return ids


def build_model_folder(folder: str, tiny: bool, device: torch.device, seed: int, max_new_tokens: int):
    """The random Qwen2.5-0.5B-shaped policy (ragged_eos) and the built-in tokenizer, saved -> (config, params)."""
    from transformers import Qwen2ForCausalLM
    tokenizer = task.build_tokenizer()
    config = model_config(tokenizer, tiny)
    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it will run: seconds on a GPU for 0.5B
        model = Qwen2ForCausalLM(config)
    ragged_eos(model, tokenizer, 2 / max_new_tokens, seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return config, n_params(model)


def free_device(device: torch.device):
    """What a part left behind, collected, and torch's cache handed back, so the next part starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_config(args, folder: str, run_dir: str, **changes) -> vapo.Config:
    """The preset's Config at the check's shapes: mini-batches of the preset's 128 where they divide the batch."""
    mini = math.gcd(args.prompts_per_step * args.samples_per_prompt, PRESET["mini_batch_size"])
    over = dict(model=folder, dataset="builtin", steps=args.steps, prompts_per_step=args.prompts_per_step,
                samples_per_prompt=args.samples_per_prompt, max_new_tokens=args.max_new_tokens,
                mini_batch_size=mini, micro_batch_size=math.gcd(mini, PRESET["micro_batch_size"]),
                value_pretrain_steps=args.value_pretrain_steps, eval_prompts=0, eval_every=0, save_every=0,
                output_dir=run_dir, device=args.device, seed=args.seed, report_to="none")
    return vapo.Config(**{**PRESET, **over, **changes}).validate()


@dataclasses.dataclass
class Check:
    """What the parts share: the options, the device, the model folder and its shape, the work folder, the probe,
    the stops, the disk, each part's box and the results of the parts done so far."""
    args: argparse.Namespace
    device: torch.device
    folder: str
    config: object
    params: int
    workdir: str
    probe: Probe
    first: FirstMiniBatch
    stops: Stops
    disk: dict
    boxes: dict
    done: dict = dataclasses.field(default_factory=dict)

    @property
    def run_dir(self) -> str:
        return os.path.join(self.workdir, "run")

    def train(self, phase: str, cfg, box_s: float, resume: bool = False):
        """vapo.train in the part's box: it stops after the step under way once the box is spent."""
        self.probe.phase = phase
        with self.stops.box(box_s):
            vapo.train(cfg, resume=resume)

    def hf_policy(self):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        return (AutoModelForCausalLM.from_pretrained(self.folder).to(self.device),
                AutoTokenizer.from_pretrained(self.folder))


def keep_metrics(run_dir: str, out: str, name: str) -> str | None:
    """A run folder's metrics.jsonl copied to out/name (the run folder goes with the work folder)."""
    src = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(src):
        return None
    shutil.copyfile(src, os.path.join(out, name))
    return name


def drop_fallback(args, kwargs, out):
    """After run.save_checkpoint(run, ...): its fallback checkpoint.prev deleted (disk_need counts two at most)."""
    shutil.rmtree(os.path.join(args[0].dir, "checkpoint.prev"), ignore_errors=True)


def steps_done(run_dir: str) -> int:
    return len([r for r in common.read_records(run_dir) if "step" in r and "time/step" in r])


def gaps(records: list[dict]) -> list[dict]:
    """The sampler's log-probs against the trainer's recomputation, per RL step: mean and largest gap."""
    return [{"mean": r.get("sampler_logprob_gap_mean"), "max": r.get("sampler_logprob_gap_max")} for r in records]


# --- the parts ------------------------------------------------------------------------------------------------
def update_part(c: Check, box_s: float) -> dict:
    """vapo.update at the preset's full length on one micro-batch of rows that all run to the end (the update's
    worst case), the old log-probs and values from a scoring pass first (timed); returns of +1 and -1 on alternate
    rows, advantages returns - values (GAE at lambda 1). Repeated while the box lasts, at most update_repeats."""
    a, device = c.args, c.device
    cfg = run_config(a, c.folder, os.path.join(c.workdir, "run-update"), max_new_tokens=a.update_new_tokens)
    policy, critic, tokenizer = load_models(cfg, device, c.folder)
    optimizers = {"policy": vapo.make_optimizer(policy, cfg.actor_lr, cfg),
                  "critic": vapo.make_optimizer(critic, cfg.critic_lr, cfg)}
    rows, prompt, response = cfg.micro_batch_size, a.update_prompt_tokens, a.update_new_tokens
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(0, len(tokenizer), (rows, n), generator=g).to(device)  # noqa: E731
    ones = lambda n: torch.ones(rows, n, dtype=torch.long, device=device)  # noqa: E731
    rollout = Rollout(prompt_ids=ids(prompt), prompt_mask=ones(prompt), response_ids=ids(response),
                      response_mask=ones(response), lengths=torch.full((rows,), response, device=device),
                      truncated=torch.ones(rows, dtype=torch.bool, device=device),
                      sampler_logprobs=torch.zeros(rows, response, device=device),
                      prompt_index=torch.arange(rows, device=device), texts=[""] * rows,
                      pad_id=tokenizer.pad_token_id)
    c.probe.phase = "update"
    with measure(device) as scoring, vapo.autocast(cfg, device):
        scored = score_rollout(policy, critic, rollout, cfg.micro_batch_size, cfg.temperature)
    returns = torch.where(torch.arange(rows, device=device) % 2 == 0, 1.0, -1.0)[:, None].expand(rows, response)
    batch = {"old_logprobs": scored["old_logprobs"], "values": scored["values"], "returns": returns,
             "advantages": returns - scored["values"], "positive": returns[:, 0] > 0}
    flops, tokens = 6 * (n_params(policy) + n_params(critic)), rows * (prompt + response)
    repeats, t_part = [], time.perf_counter()
    while len(repeats) < a.update_repeats and (not repeats or time.perf_counter() - t_part < box_s):
        with measure(device) as m:
            stats = vapo.update(policy, critic, optimizers, rollout, batch, cfg)
        repeats.append({**m, "seconds": round(m["seconds"], 3), "tokens_per_s": tokens / m["seconds"],
                        "mfu": flops * tokens / m["seconds"] / (a.peak_tflops * 1e12),
                        "skipped_nonfinite": stats["skipped_nonfinite"]})
    timed = repeats[1:] or repeats  # the first includes AdamW's first step (its moments allocated) and warm-up
    reserved = [r["peak_reserved_gb"] for r in repeats if r["peak_reserved_gb"] is not None]
    return {"rows": rows, "prompt_tokens": prompt, "response_tokens": response, "tokens_per_update": tokens,
            "scoring": {**scoring, "seconds": round(scoring["seconds"], 3)}, "repeats": repeats,
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
            "mfu": statistics.median(r["mfu"] for r in timed), "peak_gb": max(r["peak_gb"] for r in repeats),
            "peak_reserved_gb": max(reserved, default=None),
            "arithmetic_update_gb": memory_arithmetic(c.params, c.config, README["rows"], rows,
                                                      prompt + response)["update_peak_gb"],
            "docs_measured_update_gb": None if a.tiny else README["update_measured_gb"],
            "first_minibatch": c.first.of("update")[:1]}


def train_part(c: Check, box_s: float) -> dict:
    """vapo.train on the model folder, stopped after the step under way once its box is spent; its records kept in
    --out (train-metrics.jsonl) and summarised per RL step (summarise)."""
    cfg = run_config(c.args, c.folder, c.run_dir)
    c.train("train", cfg, box_s)
    records = common.read_records(c.run_dir)
    pretrain = (c.probe.of("train", "pretrain_value") or [dict.fromkeys(("seconds", "peak_gb",
                                                                         "peak_reserved_gb"))])[0]
    return {"steps_done": steps_done(c.run_dir),
            "value_pretrain_steps_done": len([r for r in records if "value_pretrain_step" in r]),
            "value_pretrain_s": pretrain["seconds"] and round(pretrain["seconds"], 2),
            "value_pretrain_peak_gb": pretrain["peak_gb"],
            "value_pretrain_peak_reserved_gb": pretrain["peak_reserved_gb"],
            **summarise(c, cfg, records), "metrics": keep_metrics(c.run_dir, c.args.out, "train-metrics.jsonl")}


def numerics_part(c: Check, box_s: float) -> dict:
    """From the train (kept in --out) and update parts' records, no device time: the log-prob gap per RL step, and
    the first mini-batch's PPO ratio and clipped share: the update part's first (its later repeats start from
    weights their old log-probs no longer match) and every RL step's."""
    kept = os.path.join(c.args.out, "train-metrics.jsonl")
    records = [r for r in common.read_jsonl(kept) if "step" in r and "time/step" in r] if os.path.exists(kept) else []
    first = c.first.of("update")[:1] + c.first.of("train")
    if not records and not first:
        return {"skipped": "no RL step or update was recorded (the train and update parts did not run)"}
    keys = ("phase", "tokens", "ratio_mean", "max_abs_ratio_minus_1", "clip_frac", "clip_frac_low",
            "clip_frac_high", "approx_kl")
    return {"bf16": PRESET["bf16"], "sampler_logprob_gap": [{"step": r["step"], **g} for r, g in
                                                            zip(records, gaps(records))],
            "first_minibatch": [{k: r.get(k) for k in keys} for r in first]}


def resume_part(c: Check, box_s: float) -> dict:
    """vapo.train --resume on the train part's folder for one RL step more: the checkpoint read back (weights,
    AdamW states, RNG: timed) and trained on. The run folder is deleted after it."""
    if c.done.get("train", {}).get("status") != "ok":
        return {"skipped": "needs the train part's run folder"}
    before = steps_done(c.run_dir)
    try:
        c.train("resume", dataclasses.replace(run_config(c.args, c.folder, c.run_dir), steps=before + 1), box_s,
                resume=True)
        load = (c.probe.of("resume", "load_checkpoint") or [{"seconds": None, "peak_gb": None}])[0]
        return {"steps_before": before, "steps_after": steps_done(c.run_dir),
                "load_checkpoint_s": load["seconds"] and round(load["seconds"], 2),
                "load_checkpoint_peak_gb": load["peak_gb"],
                "checkpoint_s": [round(r["seconds"], 2) for r in c.probe.of("resume", "save_checkpoint")],
                "sampler_logprob_gap": gaps([r for r in common.read_records(c.run_dir) if r.get("step") == before + 1]),
                "metrics": keep_metrics(c.run_dir, c.args.out, "train-metrics.jsonl")}
    finally:
        shutil.rmtree(c.run_dir, ignore_errors=True)


def sample_part(c: Check, box_s: float) -> dict:
    """One HFEngine.generate at the preset's shape (sample_prompts x the preset's 8 samples, up to
    sample_new_tokens) under the run's autocast, not cut: its KV cache is preallocated for the whole length at the
    first forward, so the sampling peak is measured however far it gets; the box ends it in the forward."""
    a, n = c.args, PRESET["samples_per_prompt"]
    policy, tokenizer = c.hf_policy()
    ragged_eos(policy, tokenizer, 2 / a.sample_new_tokens, a.seed)  # lengths for this length, not the train part's
    engine = engines.HFEngine(policy, tokenizer, max_new_tokens=a.sample_new_tokens)
    cfg = run_config(a, c.folder, c.run_dir, prompts_per_step=a.sample_prompts, max_new_tokens=a.sample_new_tokens)
    prompts = [r["prompt"] for r in load_data(cfg, tokenizer)[0][:a.sample_prompts]]
    out, stopped = None, None
    with measure(c.device) as m, c.stops.box(box_s, policy) as box:
        try:
            with vapo.autocast(cfg, c.device):
                out = engine.generate(prompts, n=n, seed=a.seed)
        except PartTimeout as err:
            stopped = str(err)
    longest = max(len(ids) for ids in tokenizer(prompts)["input_ids"]) + a.sample_new_tokens
    arithmetic = memory_arithmetic(c.params, c.config, len(prompts) * n, PRESET["micro_batch_size"], longest)
    result = {"prompts": len(prompts), "samples_per_prompt": n, "max_new_tokens": a.sample_new_tokens,
              **m, "seconds": round(m["seconds"], 2), "decoding_steps": max(box.forwards - 1, 0),
              "stopped_at_box": stopped,
              # this part holds the float32 policy and the cache; a run's sampling peak adds the critic and AdamW
              "arithmetic_gb": round(4 * c.params / 1e9 + arithmetic["items_gb"]["kv_cache"], 2),
              "arithmetic_in_a_run_gb": arithmetic["sampling_peak_gb"]}
    if out is not None:
        result |= {"tokens_per_s": int(out.lengths.sum()) / m["seconds"], **_generated(None, None, out)}
    return result


def sharded_process(c: Check, argv: list[str], name: str, seconds: float) -> dict:
    """`python bench/gpu_check.py --sharded-child RECORD -- ARGV` (sharded_child), its output in --out/NAME.log;
    SIGTERM once `seconds` have passed (it stops after the step under way, with a checkpoint; before its steps
    begin, it dies), SIGKILL SHARDED_GRACE_S later. -> its return code, seconds and record."""
    record, stopped = os.path.join(c.workdir, f"{name}.json"), False
    with socket.socket() as s:  # a free port for its process group
        s.bind(("127.0.0.1", 0))
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]),
                   TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    with open(os.path.join(c.args.out, f"{name}.log"), "w") as log_file:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--sharded-child", record, "--", *argv],
                                cwd=common.ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=max(seconds, 1))
        except subprocess.TimeoutExpired:
            stopped = True
            proc.terminate()
            try:
                code = proc.wait(timeout=SHARDED_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        except BaseException:  # Stopped: the child goes too
            proc.kill()
            proc.wait()
            raise
    out = {"returncode": code, "seconds": round(time.perf_counter() - t0, 2), "log": f"{name}.log"}
    return out | ({"stopped_at_box": True} if stopped else {}) | (common.read_json(record)
                                                                   if os.path.exists(record) else {})


def sharded_child(record: str, argv: list[str]):
    """The sharded part's process: scale/train.py's main (a world of one, as `python scale/train.py ARGV` starts
    it), its peak memory and the trainer's calls (checkpoints, updates) written to record as JSON at the end."""
    from scale import train as scale_train
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    probe = Probe(device)
    probe.phase = "sharded"
    probe.wrap(vapo, "pretrain_value", "pretrain_value")
    probe.wrap(vapo, "update", "update", _updated)
    probe.wrap(run, "save_checkpoint", "save_checkpoint", after=drop_fallback)
    probe.wrap(run, "load_checkpoint", "load_checkpoint")
    m = {}
    try:
        with measure(device) as m:
            scale_train.main(argv)
    finally:
        common.write_json(record, {"peak_gb": m.get("peak_gb"), "peak_reserved_gb": m.get("peak_reserved_gb"),
                                   "world_size": 1,
                                   "calls": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                                              if k not in ("phase", "params")} for r in probe.records]})


def sharded_part(c: Check, box_s: float) -> dict:
    """scale/train.py as a world of one (FSDP2, NCCL on a GPU, gloo on a CPU): value pretraining, one RL step and
    their checkpoints (the gathered save, the optimizers' distributed checkpoint), then --resume in a second
    process for one step more, each with what is left of the box; records in --out/sharded-metrics.jsonl. A
    process that did not end by itself with exit 0 leaves the part "stopped at its box" or "failed"."""
    a, run_dir = c.args, os.path.join(c.workdir, "run-sharded")
    mini = math.gcd(a.sharded_prompts * a.sharded_samples, PRESET["mini_batch_size"])
    argv = ["--model", c.folder, "--dataset", "builtin", "--preset", "gpu-0.5b", "--steps", "1",
            "--prompts-per-step", str(a.sharded_prompts), "--samples-per-prompt", str(a.sharded_samples),
            "--max-new-tokens", str(a.sharded_new_tokens), "--mini-batch-size", str(mini),
            "--micro-batch-size", str(math.gcd(mini, PRESET["micro_batch_size"])), "--value-pretrain-steps", "1",
            "--eval-prompts", "0", "--eval-every", "0", "--save-every", "0", "--output-dir", run_dir,
            "--device", a.device, "--seed", str(a.seed), "--report-to", "none"]
    t0 = time.perf_counter()
    try:
        first = sharded_process(c, argv, "sharded-1", box_s)
        steps_first = steps_done(run_dir)
        left = box_s - (time.perf_counter() - t0)
        second = (sharded_process(c, ["--resume", run_dir, "--steps", str(steps_first + 1)], "sharded-2", left)
                  if left >= MIN_BOX_S else {"skipped": f"{left:.0f} s of the box left for the resume"})
        saved = os.path.join(run_dir, "checkpoint")
        result = {"steps_after_first": steps_first, "steps_after_resume": steps_done(run_dir),
                  "value_pretrain_steps_done": len([r for r in common.read_records(run_dir)
                                                    if "value_pretrain_step" in r]),
                  "checkpoint_holds": sorted(os.listdir(saved)) if os.path.isdir(saved) else [],
                  "first": first, "resume": second, "metrics": keep_metrics(run_dir, a.out, "sharded-metrics.jsonl")}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    for which, p in (("first", first), ("resume", second)):
        if p.get("returncode", 0) != 0:  # killed at its box (-15: before its steps began), or failed
            return result | {"status": "stopped at its box" if p.get("stopped_at_box") else "failed",
                             "error": f"the {which} process ended with exit {p['returncode']}"}
    return result


def evaluation_part(c: Check, box_s: float) -> dict:
    """vapo.evaluate as a run calls it (HF engine, autocast, bounded passes) on the model folder, over as many of
    eval_prompts as the box holds at the train part's generation speed (every response counted at max_new_tokens:
    an upper bound); where that speed is unknown, the box ends it in the forward."""
    a = c.args
    cfg = run_config(a, c.folder, c.run_dir)
    speed = c.done.get("train", {}).get("generation", {}).get("tokens_per_s")
    prompts = a.eval_prompts
    if speed:
        prompts = max(1, min(prompts, int(box_s * speed / ((cfg.eval_samples + 1) * cfg.max_new_tokens))))
    cfg = dataclasses.replace(cfg, eval_prompts=prompts)
    policy, tokenizer = c.hf_policy()
    engine = engines.HFEngine(policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                              top_p=cfg.top_p)
    held_out = load_data(cfg, tokenizer)[1]
    try:
        with measure(c.device) as m, c.stops.box(math.inf if speed else box_s, policy):
            result = vapo.evaluate(engine, held_out, cfg, run.verifier_for(cfg))
    except PartTimeout as err:
        return {"prompts": prompts, "asked": a.eval_prompts, "stopped_at_box": str(err)}
    tokens = sum(result[f"eval/response_len_{name}"] * prompts * n
                 for name, n in ((f"avg@{cfg.eval_samples}", cfg.eval_samples), ("greedy", 1)))
    return {"prompts": prompts, "asked": a.eval_prompts, "eval_samples": cfg.eval_samples,
            "rows_per_pass": (cfg.eval_batch_size or max(1, cfg.batch_size // cfg.eval_samples)) * cfg.eval_samples,
            "seconds": round(m["seconds"], 2), "box_s": round(box_s, 1), "tokens_per_s": tokens / m["seconds"],
            "result": result}


def vllm_part(c: Check, box_s: float) -> dict:
    """vapo.train with --engine vllm for vllm_steps steps, in its box: the engine's start, generation, sleep and
    weight sync timed, with the device memory in use after each."""
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vllm is not installed on this machine"}
    cfg = run_config(c.args, c.folder, os.path.join(c.workdir, "run-vllm"), engine="vllm", steps=c.args.vllm_steps)
    c.probe.wrap(vapo, "make_engine", "engine start")  # as vapo.py imported it
    from scale import vllm_engine  # optional: vllm is installed (checked above)
    for name in ("generate", "idle", "load_weights"):
        c.probe.wrap(vllm_engine.VLLMEngine, name, f"vllm {name}", _generated if name == "generate" else None)
    t0 = time.perf_counter()
    c.train("vllm", cfg, box_s)
    calls = [r for r in c.probe.records if r["phase"] == "vllm"]
    gens = [r for r in calls if r["what"] == "vllm generate"]
    return {"seconds": round(time.perf_counter() - t0, 1), "box_s": round(box_s, 1),
            "steps_done": steps_done(cfg.output_dir),
            "generation_tokens_per_s": statistics.median(r["tokens"] / r["seconds"] for r in gens) if gens else None,
            "calls": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "phase"}
                      for r in calls]}


def summarise(c: Check, cfg, records: list[dict]) -> dict:
    """The train part's figures per RL step (generation and update tokens a second, the update's TFLOP/s and MFU,
    the peaks of sampling and of the update) and their medians; each phase's peak, checkpoint and scoring seconds,
    and the memory arithmetic at this run's shapes."""
    train = [r for r in c.probe.records if r["phase"] == "train"]
    gens = [r for r in train if r["what"] == "generate"]
    updates = [r for r in train if r["what"] == "update" and r["train_policy"]]
    counted = updates[0]["params"] if updates else {"policy": c.params, "critic": c.params}
    flops_per_token = 6 * (counted["policy"] + counted["critic"])
    steps = [{"step": i + 1, "generate_s": round(g["seconds"], 3), "generated_tokens": g["tokens"],
              "generation_tokens_per_s": g["tokens"] / g["seconds"], "lengths": g["lengths"],
              "update_s": round(u["seconds"], 3), "update_tokens": u["tokens"],
              "update_tokens_per_s": u["tokens"] / u["seconds"],
              "update_tflops": flops_per_token * u["tokens"] / u["seconds"] / 1e12,
              "mfu": flops_per_token * u["tokens"] / u["seconds"] / (c.args.peak_tflops * 1e12),
              "generate_peak_gb": g["peak_gb"], "update_peak_gb": u["peak_gb"],
              "update_peak_reserved_gb": u["peak_reserved_gb"]}
             for i, (g, u) in enumerate(zip(gens[-len(updates):] if updates else [], updates))]
    med = lambda key: statistics.median(s[key] for s in steps) if steps else None  # noqa: E731
    phases = {"generate": "sampling", "score_rollout": "scoring", "update": "update", "save_checkpoint": "checkpoint"}

    def peaks(key):
        values = {name: [r[key] for r in train if r["what"] == what and r[key] is not None]
                  for what, name in phases.items()}
        return {name: round(max(v), 3) if v else None for name, v in values.items()}

    longest = max((g["prompt_width"] + g["response_width"] for g in gens), default=cfg.max_new_tokens)
    return {"params": counted, "steps": steps,
            "generation": {"tokens_per_s": med("generation_tokens_per_s"), "rows": gens[-1]["rows"] if gens else None,
                           "response_width": gens[-1]["response_width"] if gens else None},
            "update": {"tokens_per_s": med("update_tokens_per_s"), "tflops": med("update_tflops"), "mfu": med("mfu"),
                       "peak_tflops": c.args.peak_tflops, "flops_per_token": flops_per_token},
            "peaks_gb": peaks("peak_gb"), "peaks_reserved_gb": peaks("peak_reserved_gb"),
            "checkpoint_s": [round(r["seconds"], 2) for r in train if r["what"] == "save_checkpoint"],
            "scoring_s": [round(r["seconds"], 3) for r in train if r["what"] == "score_rollout"],
            "arithmetic_this_run": memory_arithmetic(c.params, c.config, cfg.batch_size, cfg.micro_batch_size,
                                                     longest),
            "rl_records": [{k: v for k, v in r.items() if k.startswith("time/")} for r in records
                           if "step" in r and "time/step" in r]}


WORK = dict(update=update_part, train=train_part, numerics=numerics_part, resume=resume_part, sample=sample_part,
            sharded=sharded_part, evaluate=evaluation_part, vllm=vllm_part)


# --- the plan, the report, each part in its box ---------------------------------------------------------------
def plan(budget_s: float, with_vllm: bool) -> dict:
    """Each part's box in seconds: PLAN_S where vLLM is installed, else PLAN_WITHOUT_VLLM_S (its share given to
    the other parts), scaled to budget_s."""
    return {name: s * budget_s / PLAN_TOTAL_S for name, s in (PLAN_S if with_vllm else PLAN_WITHOUT_VLLM_S).items()}


def guarded(c: Check, name: str, box_s: float) -> dict:
    """A part's work, unless it cannot be done: no time left before the deadline, or no room on the disk for the
    checkpoints it writes (the reason is its result)."""
    if c.boxes[name] > 0 and box_s < MIN_BOX_S * min(1.0, c.args.budget_s / PLAN_TOTAL_S):
        return {"skipped": f"{box_s:.0f} s left before the deadline of {c.args.deadline_s:g} s"}
    if name in CHECKPOINT_PARTS and not c.disk["checkpoints_fit"]:
        return {"skipped": f"the work folder has {c.disk['free_gb']} GB free, its checkpoints need "
                           f"{c.disk['need_with_checkpoints_gb']} GB (--workdir elsewhere)"}
    return WORK[name](c, box_s)


class Report:
    """DIR/gpu_check.json, rewritten whole (a temporary file, then renamed) at each save(); part() records a part
    and prints it as one JSON line on stdout (what comes back of a command's output when its files do not)."""

    def __init__(self, out: str, head: dict):
        self.out, self.path, self.data = out, os.path.join(out, "gpu_check.json"), {"status": "partial", **head}
        self.data["parts"] = {}
        os.makedirs(out, exist_ok=True)

    def save(self, status: str | None = None):
        self.data["status"] = status or self.data["status"]
        self.data["wall_s"] = round(time.perf_counter() - T_START, 1)
        common.write_json(self.path + ".tmp", self.data)
        os.replace(self.path + ".tmp", self.path)

    def part(self, name: str, result: dict):
        self.data["parts"][name] = result
        self.save()
        short = {k: v for k, v in result.items()  # lists and long dicts are in the JSON file; the traceback's end
                 if k == "measured" or not (isinstance(v, list) or isinstance(v, dict) and len(json.dumps(v)) > 300)}
        if "traceback" in short:
            short["traceback"] = short["traceback"][-600:]
        print(json.dumps({"part": name, **short}), flush=True)


def run_part(c: Check, name: str, report: Report) -> dict:
    """One part in its box (its plan's, cut to what is left before --deadline-s), its seconds and peak memory under
    "measured", recorded at once. A failure is recorded with its traceback and the check goes on; a SIGTERM from
    outside (Stopped) is recorded, then ends the check."""
    box_s = max(0.0, min(c.boxes[name], c.args.deadline_s - (time.perf_counter() - T_START)))
    stopped = None
    try:
        with measure(c.device) as m:
            result = {"status": "ok", **guarded(c, name, box_s)}
    except Stopped as err:
        stopped, result = err, {"status": "stopped", "error": "SIGTERM from outside the check"}
    except (Exception, SystemExit) as err:  # noqa: BLE001  (a part's failure must not end the check)
        result = {"status": "failed", "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        log.error("part %s failed: %s", name, result["error"])
    if "skipped" in result:
        result["status"] = "skipped"
    else:
        result["measured"] = {**m, "seconds": round(m["seconds"], 2), "box_s": round(box_s, 1)}
        if c.device.type == "cuda":
            result["measured"]["allocated_at_end_gb"] = round(in_use(c.device) / 1e9, 3)
    if c.stops.outside and stopped is None:  # vapo.train's StopRequest took it: the part ended after its step
        result["stopped_by"] = "SIGTERM from outside the check"
    free_device(c.device)
    report.part(name, result)
    if stopped is not None:
        raise stopped
    return result


# --- the setup, the command line, the summary -----------------------------------------------------------------
def setup(args, device: torch.device, workdir: str, report: Report, boxes: dict, stops: Stops) -> Check:
    """The model folder built (timed), the trainer's functions wrapped by the probe, the stops' hooks."""
    t0 = time.perf_counter()
    folder = os.path.join(workdir, "model")
    config, params = build_model_folder(folder, args.tiny, device, args.seed, args.max_new_tokens)
    free_device(device)
    report.data["model"] = {"params_policy": params,
                            "config": {**{k: getattr(config, k, None) for k in QWEN25_05B},  # rope_theta moved into
                                       "rope_parameters": getattr(config, "rope_parameters", None)}}  # transformers 5
    report.data["setup_s"] = round(time.perf_counter() - t0, 1)
    probe = Probe(device, on_record=lambda record: report.save() if record["what"] == "update" else None)
    probe.wrap(engines.HFEngine, "generate", "generate", _generated)
    probe.wrap(vapo, "pretrain_value", "pretrain_value")
    probe.wrap(vapo, "score_rollout", "score_rollout")  # as vapo.py imported it
    probe.wrap(vapo, "update", "update", _updated)
    probe.wrap(run, "save_checkpoint", "save_checkpoint", after=drop_fallback)  # checkpoints.py's, as run.py
    probe.wrap(run, "load_checkpoint", "load_checkpoint")  # imported them (Run.save and Run.restore use those)
    first = FirstMiniBatch(probe)
    stops.watch(probe)
    report.data["probe"] = probe.records  # saved with every report: the calls so far, even if a part is killed
    return Check(args=args, device=device, folder=folder, config=config, params=params, workdir=workdir,
                 probe=probe, first=first, stops=stops, disk=report.data["workdir"], boxes=boxes)


def version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--out", default=os.path.join("runs", "gpu_check"),
                   help="folder for the report: gpu_check.json (after every part), gpu_check.txt, the runs' records")
    p.add_argument("--workdir", default=None, help="where the work folder is made (default: the system's "
                                                   "temporary folder); it needs about 30 GB at 0.5B")
    p.add_argument("--keep-workdir", action="store_true", help="keep the work folder (model and runs) at the end")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--tiny", action="store_true", help="2 layers, hidden 256, vocabulary 4096, small shapes (a "
                                                       "check that every part runs)")
    p.add_argument("--budget-s", type=float, default=PLAN_TOTAL_S, help="the parts' boxes together (default 400; "
                                                                        "the plan is scaled to it)")
    p.add_argument("--deadline-s", type=float, default=DEADLINE_S, help="no part starts or runs past this many "
                                                                        "seconds after the start (default 440)")
    p.add_argument("--steps", type=int, default=3, help="RL steps of the train part (it stops sooner at its box)")
    p.add_argument("--sample-prompts", type=int, help="sample part: prompts x 8 samples (default 64; 4 with --tiny)")
    p.add_argument("--eval-prompts", type=int, help="evaluation part: held-out prompts (default 64; 2 with --tiny), "
                                                    "cut to its box")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="the GPU's dense bf16 peak, for MFU (default 989: H100/H200 SXM)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for k, v in {**(TINY_RUN if args.tiny else FULL_RUN), **BOTH_RUNS}.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    return args


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    stops = Stops()
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available on this machine")
    with_vllm = importlib.util.find_spec("vllm") is not None
    boxes = plan(args.budget_s, with_vllm)
    report = Report(args.out, {"machine": common.machine(device), "date": common.now(), "device": str(device),
                               "versions": {"torch": torch.__version__,
                                            **{n: version(n) for n in ("transformers", "accelerate", "vllm")}},
                               "tiny": args.tiny, "args": vars(args),
                               "plan": {"boxes_s": {k: round(v, 1) for k, v in boxes.items()},
                                        "deadline_s": args.deadline_s, "vllm_installed": with_vllm}})
    os.makedirs(args.workdir or tempfile.gettempdir(), exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="gpu_check-", dir=args.workdir)
    check = None
    try:
        shape = {**QWEN25_05B, **(TINY if args.tiny else {})}
        report.data["workdir"] = check_disk(workdir, disk_need(counts(shape)["policy"]))  # before anything is built
        report.save()
        check = setup(args, device, workdir, report, boxes, stops)
        for name in [p for p in PARTS if p in args.parts]:
            if stops.outside:
                break
            check.done[name] = run_part(check, name, report)
            if name == "train" and "resume" not in args.parts:
                shutil.rmtree(check.run_dir, ignore_errors=True)  # no resume to come: the disk back
    except Stopped:
        pass
    finally:
        if check is not None:
            check.probe.undo()
        report.save("stopped" if stops.outside else "complete")
        if not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    write_summary(report)
    if stops.outside:
        raise SystemExit(143)
    if any(p["status"] == "failed" for p in report.data["parts"].values()):
        raise SystemExit(1)  # every part has run; the report says which failed and why


SUMMARY = dict(  # the figures on each part's summary line (a dot goes into a dict); the JSON has them all
    update="rows prompt_tokens response_tokens tokens_per_s mfu peak_gb peak_reserved_gb arithmetic_update_gb",
    train="value_pretrain_steps_done steps_done generation.tokens_per_s update.tokens_per_s update.mfu peaks_gb "
          "checkpoint_s",
    numerics="sampler_logprob_gap first_minibatch", resume="steps_before steps_after load_checkpoint_s",
    sample="prompts samples_per_prompt max_new_tokens stopped_at_box decoding_steps tokens_per_s lengths peak_gb "
           "arithmetic_gb arithmetic_in_a_run_gb",
    sharded="steps_after_first steps_after_resume first.returncode resume.returncode first.peak_gb resume.peak_gb "
            "checkpoint_holds",
    evaluate="prompts asked stopped_at_box eval_samples tokens_per_s", vllm="steps_done generation_tokens_per_s")


def fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} {fmt(x)}" for k, x in v.items() if k not in ("phase", "step")) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return str(v)


def write_summary(report: Report):
    """gpu_check.txt and the printed summary: the docs' arithmetic, then one line a part (SUMMARY's figures)."""
    d = report.data
    docs = memory_arithmetic(494_032_768, model_config(task.build_tokenizer(), False), README["rows"],
                             README["micro"], README["seq"])
    lines = [f"machine: {d['machine']}", f"date: {d['date']}; {d['wall_s']:.0f} s in all ({d['status']}); setup "
             f"{d.get('setup_s', 0):.0f} s; {', '.join(f'{k} {v}' for k, v in d['versions'].items())}",
             f"docs/scaling.md arithmetic ({README['rows']} rows, micro-batch {README['micro']} x {README['seq']} "
             f"tokens): update {docs['update_peak_gb']:.1f} GB, sampling {docs['sampling_peak_gb']:.1f} GB (the "
             f"docs say {README['update_gb']} and {README['sampling_gb']}; measured with fake tensors: update "
             f"{README['update_measured_gb']} GB)"]
    for name, p in d["parts"].items():
        m = p.get("measured", {})
        if p["status"] == "skipped":
            lines.append(f"{name}: skipped ({p['skipped']})")
            continue
        figures = [] if p["status"] == "failed" else [
            f"{key} {fmt(value)}" for key in SUMMARY[name].split() if (value := functools.reduce(
                lambda v, k: v.get(k) if isinstance(v, dict) else None, key.split("."), p)) is not None]
        lines.append(f"{name}: {p['status']}, {m.get('seconds', 0):.1f} s (box {m.get('box_s', 0):.0f} s), peak "
                     f"{fmt(m.get('peak_gb'))} GB allocated, {fmt(m.get('peak_reserved_gb'))} GB reserved; "
                     + "; ".join(x for x in (", ".join(figures), p.get("error")) if x))
    text = "\n".join(lines)
    with open(os.path.join(report.out, "gpu_check.txt"), "w") as fh:
        fh.write(text + "\n")
    print("\n" + text + f"\nwrote {report.path} and gpu_check.txt")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sharded-child"]:  # the sharded part's process: RECORD -- scale/train.py's options
        sharded_child(sys.argv[2], sys.argv[4:])
    else:
        main()
