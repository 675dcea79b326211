"""Check on one GPU, offline, in one command of about 9 minutes: what `--preset gpu-0.5b` does on a model of
Qwen2.5-0.5B's shape, part by part, each figure kept as soon as its part ends.

    python bench/gpu_check.py --out DIR --workdir WORK       # the whole check: about 7.5 minutes on one GPU
    python bench/gpu_check.py --parts update sample --out DIR   # only some parts
    python bench/gpu_check.py --tiny --device cpu --out DIR  # a 2-layer version on a CPU (the tests)

It needs only torch, transformers, accelerate, safetensors and tokenizers (no math-verify, datasets or vLLM, no
network): the built-in task scores with its exact integer check, and the vLLM part says it is skipped where vLLM is
not installed.

What it keeps, and when. DIR/gpu_check.json is written after every part (and after every RL step of the train
part), with "status": "partial" until the end ("complete"; "stopped" after a SIGTERM from outside, which ends the
part under way, keeps what is done and writes the report). A part that fails is recorded with its error and
traceback, and the next part still runs. Each part also prints one JSON line on stdout (`{"part": ...}`: what comes
back of a command's output when its files do not). The train part's run records are copied to
DIR/train-metrics.jsonl (resume and sharded runs likewise), since the work folder is deleted at the end.
DIR/gpu_check.txt gets the summary at the end.

The work folder: a folder made inside --workdir (default: the system's temporary folder) and deleted at the end
(--keep-workdir keeps it). Its free space is checked first against disk_need: the model folder, and for the parts
that write checkpoints (train, resume, sharded) two checkpoints at once (float32 policy and critic and both AdamW
states, 24 bytes a parameter: 11.9 GB at 0.5B; the one being written beside the one it replaces) and the
pretrained critic: about 28 GB at 0.5B, 30 GB with a tenth for slack. The fallback checkpoint.prev is deleted after
each write (not needed here), and each run folder once its part is done. Parts that do not fit are skipped, saying
so.

The parts, in this order (the most telling first, so that a late failure loses the least):
- update: vapo.update at the preset's full length, on a synthetic batch of one micro-batch (4 rows x the prompt
  width of docs/scaling.md's arithmetic + the preset's 2,048 response tokens, every row to the end: the
  update's worst case), bf16 autocast and gradient checkpointing as the preset has them, repeated while its box
  lasts (at most --update-repeats): peak allocated and reserved against the arithmetic (33 GB) and the fake-tensor
  measurement (41.9 GB), tokens a second, MFU; the old log-probs from a scoring pass at that length first;
- train: vapo.train for --value-pretrain-steps critic-only steps and --steps RL steps of --prompts-per-step x
  --samples-per-prompt, up to --max-new-tokens, with checkpoints after pretraining and at the end, stopping after
  the step under way once its box is spent: throughput, MFU and the peak memory of sampling, scoring, the update
  and checkpointing per step;
- numerics: from the train and update parts' records, no device time: the gap between the sampler's log-probs and
  the trainer's recomputation under bf16 (per RL step, mean and largest), and the first mini-batch's PPO ratio
  (mean and largest distance from 1) and clipped share, which tell whether PPO starts at ratio 1;
- resume: vapo.train --resume on the train part's folder for one RL step more: the checkpoint read back and
  trained on;
- sample: one HFEngine.generate at the preset's shape, 64 prompts x 8 samples and 2,048 new tokens, no cut (its
  preallocated KV cache for the whole length is the sampling peak), the stop tokens set for that length (a mean
  of 1,024 tokens, 14% to the end); a deadline in the model's forward ends it at its box, and the report says
  after how many decoding steps;
- sharded: scale/train.py's main in a process of its own with no launcher, a world of one (NCCL on a GPU, gloo on
  a CPU): FSDP2 with its bf16 policy, value pretraining, one RL step, the gathered save and the optimizer's
  distributed checkpoint; then a second process with --resume for one step more;
- evaluate: vapo.evaluate over --eval-prompts held-out prompts (avg@k and greedy, in the bounded passes a run uses),
  cut to what the train part's generation speed says fits its box;
- vllm: where vLLM is installed, vapo.train with --engine vllm for --vllm-steps steps: the engine's start,
  generation, sleep and weight sync, timed, with the device memory in use after each.

The time plan (PLAN_S, seconds; --budget-s scales it): 400 s of part boxes. Where vLLM is installed: update 25,
train 90, resume 40, sample 50, sharded 70, evaluate 15, vllm 110. Where it is not (the GPU machine's image): its
110 s go to the new parts and the evaluation: update 30, train 100, resume 40, sample 65, sharded 140 (two
processes' start, loading and checkpoints of 12 GB), evaluate 25 (PLAN_WITHOUT_VLLM_S). Setup (the imports, about
10 s, and the model's build and save, about 20 s) comes first. No part starts, and no box runs, past --deadline-s
(440 s after the imports); a part left less than MIN_BOX_S is skipped, saying so. A part stopped at its box
finishes the step under way (train, resume, vllm: at most a step and a checkpoint, 30-60 s) or gets
SHARDED_GRACE_S (45 s) to write its checkpoint (sharded), and only the last part's overrun can pass the deadline:
about 7.5 minutes typically, at most 8.5 (10 + 440 + 60 s), inside a 9-minute command limit.

No download: the model is built here from a Qwen2Config of Qwen2.5-0.5B's shape (QWEN25_05B: hidden 896, 24
layers, 14 attention heads and 2 KV heads of 64 dimensions, intermediate 4864, vocabulary 151,936, tied
embeddings; 494,032,768 parameters) with random weights and the built-in task's byte-level tokenizer (257 tokens;
EOS = pad = id 256). Every reward is -1 (no learning to speak of). Ragged lengths: ragged_eos makes about
2 / --max-new-tokens of the vocabulary stop tokens, so responses stop at every length and e^-2 = 14% run to the end.

MFU: 6 x (policy + critic parameters) x tokens / seconds / --peak-tflops (default 989, the H100/H200 SXM
datasheet's dense bf16 figure); it counts the embeddings in both models and leaves out attention's quadratic term
and gradient checkpointing's recomputation. GB are 1e9 bytes. Peak memory on a GPU is torch's allocated and
reserved peaks (counters that nest without resetting each other: common.PeakMemory); on a CPU the resident set.
"""
from __future__ import annotations

import argparse
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
import engines
import run
import task
import vapo
from common import QWEN25_05B, PeakMemory, in_use, n_params, sync
from config import PRESETS
from data import load_data
from models import load_models
from rollout import Rollout, score_rollout
from scale.memory import counts

log = logging.getLogger("gpu_check")
PRESET = PRESETS["gpu-0.5b"]
T_START = time.perf_counter()  # after the imports (about 10 s on the GPU image): the deadline and wall_s count here

# --tiny: heads of the real 64 dimensions with grouped KV (4 heads, 2 KV heads: a head size vLLM's CPU attention
# supports), 2 layers, a 4,096-token vocabulary (still larger than the tokenizer's, as in the full check), so a
# CPU runs a step in seconds.
TINY = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            intermediate_size=1024, vocab_size=4096)
FULL_RUN = dict(prompts_per_step=16, samples_per_prompt=8, max_new_tokens=512, eval_prompts=64, vllm_steps=2,
                sample_prompts=PRESET["prompts_per_step"], sample_new_tokens=PRESET["max_new_tokens"],
                update_prompt_tokens=252, update_new_tokens=PRESET["max_new_tokens"],  # 2,300 in all, as the docs
                sharded_prompts=4, sharded_samples=8, sharded_new_tokens=256)
TINY_RUN = dict(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=16, eval_prompts=2, vllm_steps=1,
                sample_prompts=4, sample_new_tokens=32, update_prompt_tokens=8, update_new_tokens=32,
                sharded_prompts=2, sharded_samples=2, sharded_new_tokens=16)

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
# bytes of one cached K or V element while sampling under --bf16 with float32 weights: the sampler's preallocated
# cache stores bf16 (rollout.kv_cache_bytes_per_token, tests/test_rollout.py)
KV_BYTES = 2


# --- shapes, arithmetic, disk ---------------------------------------------------------------------------------
def model_config(tokenizer, tiny: bool):
    from transformers import Qwen2Config
    kw = {**QWEN25_05B, **(TINY if tiny else {})}
    return Qwen2Config(**kw, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=None, use_cache=True)


def memory_arithmetic(params: int, config, rows: int, micro: int, seq: int) -> dict:
    """docs/scaling.md's items, GB (1e9 bytes): float32 weights + gradients + AdamW moments of policy and
    critic; the KV cache of `rows` sequences of `seq` tokens (KV_BYTES per element); one micro-batch's
    checkpointed layer inputs (bf16) and its float32 logits, softmax and their gradient."""
    head_dim = config.hidden_size // config.num_attention_heads
    items = {
        "weights_grads_adamw_both": 2 * params * (4 + 4 + 8),
        "kv_cache": config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * KV_BYTES * rows * seq,
        "checkpointed_inputs": config.num_hidden_layers * micro * seq * config.hidden_size * 2,
        "logits": 3 * micro * seq * config.vocab_size * 4,
    }
    gb = {k: v / 1e9 for k, v in items.items()}
    return {"items_gb": {k: round(v, 2) for k, v in gb.items()}, "rows": rows, "micro_batch": micro, "seq": seq,
            "update_peak_gb": round(gb["weights_grads_adamw_both"] + gb["checkpointed_inputs"] + gb["logits"], 2),
            "sampling_peak_gb": round(gb["weights_grads_adamw_both"] + gb["kv_cache"], 2)}


def disk_need(params: int) -> dict:
    """Bytes the work folder needs: "model" (the float32 model folder), "checkpoints" (what a part that writes
    checkpoints adds at its peak: the checkpoint being written beside the one it replaces, each the float32
    policy and critic and both models' AdamW moments, 24 bytes a parameter, and the pretrained critic's folder),
    with a tenth more for tokenizers, configs and the file system."""
    return {"model": 1.1 * 4 * params, "checkpoints": 1.1 * (2 * 24 * params + 4 * params)}


# --- timing and memory of the trainer's own functions ---------------------------------------------------------
class Probe:
    """Wraps the functions train() calls to time them (device synchronised) and take their peak memory (allocated
    and reserved); a list of records {"what", "phase", "seconds", "peak_gb", "peak_reserved_gb", ...} in call
    order. on_record(record) is called after each record (the report saves itself there)."""

    def __init__(self, device: torch.device, on_record=None):
        self.device, self.records, self._undo, self.on_record = device, [], [], on_record
        self.phase = "train"  # which part of the check the records belong to

    def wrap(self, owner, name: str, what: str, describe=None, after=None):
        """owner.name timed; describe(args, kwargs, out) -> more fields of its record; after(args, kwargs, out)
        runs once it is recorded, outside its time."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            memory = PeakMemory(self.device)
            memory.start()
            t0 = time.perf_counter()
            try:
                out = original(*args, **kwargs)
                sync(self.device)
            finally:
                peak = memory.stop()
            record = {"what": what, "phase": self.phase, "seconds": time.perf_counter() - t0, **gb(peak)}
            if self.device.type == "cuda":  # all of the device's memory in use, vLLM's pool included
                free, total = torch.cuda.mem_get_info(self.device)
                record["device_used_gb"] = round((total - free) / 1e9, 3)
            if describe is not None:
                record |= describe(args, kwargs, out)
            self.records.append(record)
            if after is not None:
                after(args, kwargs, out)
            if self.on_record is not None:
                self.on_record(record)
            return out

        self.replace(owner, name, wrapper)

    def hook(self, owner, name: str, before=None, after=None):
        """owner.name with before(args, kwargs) and after(args, kwargs, out) around it, not timed."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if before is not None:
                before(args, kwargs)
            out = original(*args, **kwargs)
            if after is not None:
                after(args, kwargs, out)
            return out

        self.replace(owner, name, wrapper)

    def replace(self, owner, name: str, new):
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def undo(self):
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def of(self, phase: str, what: str) -> list[dict]:
        return [r for r in self.records if r["phase"] == phase and r["what"] == what]


def gb(peak: dict) -> dict:
    """PeakMemory.stop()'s MB as {"peak_gb", "peak_reserved_gb"} (None: no reserved figure, a CPU)."""
    reserved = peak["peak_reserved_mb"]
    return {"peak_gb": round(peak["peak_mb"] / 1e3, 3),
            "peak_reserved_gb": None if reserved is None else round(reserved / 1e3, 3)}


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
            "params": {name: n_params(m) if m is not None else 0
                       for name, m in (("policy", policy), ("critic", critic))}}


class FirstMiniBatch:
    """The PPO ratio of the first mini-batch of each vapo.update call, before any optimizer step: its policy
    losses' token-weighted ratio mean, largest |ratio - 1| and clipped shares (losses.policy_loss's stats), one
    record per update that trains the policy, in `records` (with the probe's phase). At ratio 1 the sampler's (or
    scoring pass's) log-probs and the update's forward agree; under bf16 they differ by rounding."""

    def __init__(self, probe: Probe):
        self.probe, self.records, self.current = probe, [], None
        probe.hook(vapo, "update", before=self._open)
        probe.hook(vapo, "policy_loss", after=self._add)  # as vapo.py imported it
        probe.hook(vapo, "step_or_skip", after=self._close)

    def _open(self, args, kwargs):
        self.current = {"tokens": 0.0, "sums": {}, "max_abs_ratio_minus_1": 0.0}

    def _add(self, args, kwargs, out):
        if self.current is None:
            return
        logprobs, old, mask = args[0], args[1], args[3]
        weight = float(mask.sum())
        ratio = torch.exp(logprobs.detach().float() - old.float())  # [b, T]
        dev = float(((ratio - 1).abs() * mask).max()) if weight else 0.0
        c = self.current
        c["tokens"] += weight
        c["max_abs_ratio_minus_1"] = max(c["max_abs_ratio_minus_1"], dev)
        for k, v in out[1].items():
            c["sums"][k] = c["sums"].get(k, 0.0) + v * weight

    def _close(self, args, kwargs, out):
        c, self.current = self.current, None
        if c and c["tokens"]:  # a critic-only update (value pretraining) has no policy loss
            self.records.append({"phase": self.probe.phase, "tokens": int(c["tokens"]),
                                 "max_abs_ratio_minus_1": c["max_abs_ratio_minus_1"],
                                 **{k: s / c["tokens"] for k, s in c["sums"].items()}})


# --- stopping: a part's box, the deadline, a SIGTERM from outside ---------------------------------------------
class Stopped(BaseException):
    """A SIGTERM from outside the script (a command's time limit, a scheduler) outside vapo.train: the part under
    way ends here, the report is written and the script stops."""


class PartTimeout(Exception):
    """A part's box is spent inside one long call (sampling, an update): raised from the model's forward."""


class Signals:
    """SIGTERM bookkeeping for the whole script: `sent` counts the ones Stopper sends itself, `received` the ones
    vapo.train's StopRequest took (hooked by watch_train); more received than sent means one came from outside,
    and the script stops after the part under way. Outside train a SIGTERM that is not ours raises Stopped. Once
    one has come from outside, the process ends within STOP_GRACE_S whatever it is doing (the report of the parts
    done is on disk already)."""

    def __init__(self):
        self.sent = self.received = 0
        self.outside = False

    def install(self):
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        if self.sent > self.received:  # ours, arriving just after train's handler was taken down
            self.received += 1
            return
        self._from_outside()
        raise Stopped("SIGTERM")

    def _from_outside(self):
        if not self.outside:
            self.outside = True
            backstop = threading.Timer(STOP_GRACE_S, os._exit, (143,))  # the last word if the stop hangs
            backstop.daemon = True
            backstop.start()

    def watch_train(self, probe: Probe):
        def took(args, kwargs):
            self.received += 1
            if self.received > self.sent:
                self._from_outside()
        probe.hook(run.StopRequest, "_handle", before=took)


class Stopper:
    """A part's box inside vapo.train: once the time is up, SIGTERM to this process, sent only while train's
    StopRequest handles it (it then stops after the step under way, with a checkpoint); until then the run goes on."""

    def __init__(self, seconds: float, signals: Signals):
        self.seconds, self.signals, self.done = seconds, signals, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.thread.start()
        return self

    def _watch(self):
        while not self.done.wait(0.2):
            handler = signal.getsignal(signal.SIGTERM)
            if (time.perf_counter() - self.t0 >= self.seconds
                    and isinstance(getattr(handler, "__self__", None), run.StopRequest)):
                log.warning("box of %g s spent: asking the run to stop", self.seconds)
                self.signals.sent += 1
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        return False


class deadline_guard:
    """`with deadline_guard(model, seconds) as guard:` PartTimeout from the model's next forward once `seconds` have
    passed (guard.calls counts the forwards: a sampler's prefill, then one a decoding step)."""

    def __init__(self, model, seconds: float):
        self.model, self.seconds, self.calls = model, seconds, 0

    def _check(self, module, args, kwargs):
        if time.perf_counter() - self.t0 >= self.seconds:
            raise PartTimeout(f"box of {self.seconds:.0f} s spent after {self.calls} forward passes")
        self.calls += 1

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.handle = self.model.register_forward_pre_hook(self._check, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()
        return False


# --- the model and the runs' configs --------------------------------------------------------------------------
def ragged_eos(model, tokenizer, hazard: float, seed: int) -> list[int]:
    """Ragged lengths from a random model, through the path an instruct model's several stop tokens take: K =
    hazard x (vocabulary - tokenizer) ids drawn above the tokenizer's own (ids that decode to nothing) join EOS in
    the model's generation config, which save_pretrained writes and engines.eos_token_ids reads. A random model's
    next-token distribution is nearly uniform (the logsumexp of its logits is log V + 0.2, the same at every
    position to 1e-3), so a step stops with probability about hazard and lengths are about geometric: with hazard
    2 / max_new_tokens, a mean of max_new_tokens / 2 and e^-2 = 14% of the rows cut at max_new_tokens. (Raising
    EOS's own logit does not work: the final hidden states share no direction across sequences.) -> the ids."""
    vocab, first = model.config.vocab_size, len(tokenizer)
    k = max(1, round(hazard * (vocab - first)))
    ids = (torch.randperm(vocab - first, generator=torch.Generator().manual_seed(seed))[:k] + first).tolist()
    model.generation_config.eos_token_id = [tokenizer.eos_token_id] + sorted(ids)
    return ids


def build_model_folder(folder: str, tiny: bool, device: torch.device, seed: int, max_new_tokens: int):
    """The random Qwen2.5-0.5B-shaped policy (EOS made likely enough for ragged lengths: ragged_eos) and the
    built-in tokenizer, saved in folder -> (config, params)."""
    from transformers import Qwen2ForCausalLM
    tokenizer = task.build_tokenizer()
    config = model_config(tokenizer, tiny)
    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it will run: seconds on a GPU for 0.5B
        model = Qwen2ForCausalLM(config)
    ragged_eos(model, tokenizer, 2 / max_new_tokens, seed)
    params = n_params(model)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    free_device(device)
    return config, params


def free_device(device: torch.device):
    """What a part left behind, collected, and torch's cache handed back, so the next part starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_config(args, folder: str, run_dir: str, **changes) -> vapo.Config:
    """The preset's Config at the check's shapes: mini-batches of the preset's 128 where they divide the batch."""
    batch = args.prompts_per_step * args.samples_per_prompt
    mini = math.gcd(batch, PRESET["mini_batch_size"])
    micro = math.gcd(mini, args.micro_batch_size or PRESET["micro_batch_size"])
    over = dict(model=folder, dataset="builtin", steps=args.steps, prompts_per_step=args.prompts_per_step,
                samples_per_prompt=args.samples_per_prompt, max_new_tokens=args.max_new_tokens,
                mini_batch_size=mini, micro_batch_size=micro,
                value_pretrain_steps=args.value_pretrain_steps, eval_prompts=0, eval_every=0, save_every=0,
                output_dir=run_dir, device=args.device, seed=args.seed, report_to="none")
    return vapo.Config(**{**PRESET, **over, **changes}).validate()


# --- the report, kept after every part ------------------------------------------------------------------------
class Report:
    """DIR/gpu_check.json, rewritten whole (to a temporary file, then renamed) each time save() is called, with
    "status" partial until finish(); each part's result under "parts", and one JSON line a part on stdout."""

    def __init__(self, out: str, head: dict):
        self.out, self.data = out, {"status": "partial", **head, "parts": {}}
        os.makedirs(out, exist_ok=True)

    @property
    def path(self) -> str:
        return os.path.join(self.out, "gpu_check.json")

    def save(self):
        self.data["wall_s"] = round(time.perf_counter() - T_START, 1)
        common.write_json(self.path + ".tmp", self.data)
        os.replace(self.path + ".tmp", self.path)

    def part(self, name: str, result: dict):
        self.data["parts"][name] = result
        self.save()
        print(json.dumps({"part": name, **compact(result)}), flush=True)

    def finish(self, status: str):
        self.data["status"] = status
        self.save()


def compact(result: dict, limit: int = 1200) -> dict:
    """A part's result for its stdout line (a command's output keeps only its tail): when the line would be longer
    than limit, lists and larger dicts left out (they are in the JSON file), then the traceback cut to its end."""
    out = dict(result)
    for drop in (lambda v: isinstance(v, list), lambda v: isinstance(v, dict) and len(json.dumps(v)) > 300):
        if len(json.dumps(out)) > limit:
            out = {k: v for k, v in out.items() if k in ("measured", "traceback") or not drop(v)}
    if "traceback" in out and len(json.dumps(out)) > limit:
        out["traceback"] = out["traceback"][-600:]
    return out


def run_part(name: str, work, box_s: float, device: torch.device, report: Report) -> dict:
    """One part, work(box_s) -> its result, with its seconds and its peak memory (allocated and reserved) under
    "measured", recorded at once. A failure is recorded with its traceback ("status": "failed") and the check goes on;
    a SIGTERM from outside (Stopped) is recorded, then ends the check."""
    memory = PeakMemory(device)
    memory.start()
    t0 = time.perf_counter()
    stopped = None
    try:
        result = {"status": "ok", **work(box_s)}
    except Stopped as err:
        stopped, result = err, {"status": "stopped", "error": "SIGTERM from outside the check"}
    except (Exception, SystemExit) as err:  # noqa: BLE001  (a part's failure must not end the check)
        result = {"status": "failed", "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        log.error("part %s failed: %s", name, result["error"])
    finally:
        peak = memory.stop()
    if "skipped" not in result:
        result["measured"] = {"seconds": round(time.perf_counter() - t0, 2), "box_s": round(box_s, 1), **gb(peak)}
        if device.type == "cuda":
            result["measured"]["allocated_at_end_gb"] = round(in_use(device) / 1e9, 3)
    else:
        result["status"] = "skipped"
    free_device(device)
    report.part(name, result)
    if stopped is not None:
        raise stopped
    return result


@dataclasses.dataclass
class Check:
    """What the parts share: the options, the device, the model folder and its shape, the work folder, --out, the
    probe on the trainer's functions, the signals, and the results of the parts done so far."""
    args: argparse.Namespace
    device: torch.device
    folder: str
    config: object
    params: int
    workdir: str
    out: str
    probe: Probe
    first: FirstMiniBatch
    signals: Signals
    done: dict
    disk: dict
    boxes: dict

    @property
    def run_dir(self) -> str:
        return os.path.join(self.workdir, "run")


def keep_metrics(run_dir: str, out: str, name: str) -> str | None:
    """A run folder's metrics.jsonl copied to out/name (the run folder goes with the work folder)."""
    src = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(src):
        return None
    shutil.copyfile(src, os.path.join(out, name))
    return name


def drop_fallback(args, kwargs, out):
    """After a checkpoint is written (run.save_checkpoint(run, ...)): its fallback checkpoint.prev deleted, so that
    the work folder holds at most the checkpoint and the one being written (disk_need)."""
    shutil.rmtree(os.path.join(args[0].dir, "checkpoint.prev"), ignore_errors=True)


def steps_done(run_dir: str) -> int:
    return len([r for r in common.read_records(run_dir) if "step" in r and "time/step" in r])


# --- the parts ------------------------------------------------------------------------------------------------
def synthetic_batch(tokenizer, rows: int, prompt: int, response: int, device: torch.device) -> Rollout:
    """A Rollout of `rows` full-length rows: `prompt` prompt tokens and `response` response tokens, every one real
    (the update's worst case: no row ends early), token ids drawn from the tokenizer's."""
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(0, len(tokenizer), (rows, n), generator=g).to(device)  # noqa: E731
    ones = lambda n: torch.ones(rows, n, dtype=torch.long, device=device)  # noqa: E731
    return Rollout(prompt_ids=ids(prompt), prompt_mask=ones(prompt), response_ids=ids(response),
                   response_mask=ones(response), lengths=torch.full((rows,), response, device=device),
                   truncated=torch.ones(rows, dtype=torch.bool, device=device),
                   sampler_logprobs=torch.zeros(rows, response, device=device),
                   prompt_index=torch.arange(rows, device=device), texts=[""] * rows, pad_id=tokenizer.pad_token_id)


def scored_batch(policy, critic, rollout: Rollout, cfg, device: torch.device) -> tuple[dict, dict]:
    """The update's batch for a synthetic rollout: old log-probs and values from a scoring pass (rollout.
    score_rollout under the run's autocast, timed, with its peaks), returns of +1 and -1 on alternate rows, the
    advantages GAE gives them at lambda 1 (returns - values). -> (batch, the scoring pass's seconds and peaks)."""
    memory = PeakMemory(device)
    memory.start()
    t0 = time.perf_counter()
    with vapo.autocast(cfg, device):
        scored = score_rollout(policy, critic, rollout, cfg.micro_batch_size, cfg.temperature)
    sync(device)
    scoring = {"seconds": round(time.perf_counter() - t0, 3), **gb(memory.stop())}
    rows = torch.arange(rollout.B, device=device)
    returns = torch.where(rows % 2 == 0, 1.0, -1.0)[:, None].expand(rollout.B, rollout.T)  # [B, T]
    return {"old_logprobs": scored["old_logprobs"], "values": scored["values"], "returns": returns,
            "advantages": returns - scored["values"], "positive": returns[:, 0] > 0}, scoring


def update_part(c: Check, box_s: float) -> dict:
    """vapo.update at the preset's full length on a synthetic batch of one micro-batch (synthetic_batch), the old
    log-probs and values from a scoring pass of it first; repeated while the box lasts, at most --update-repeats."""
    a = c.args
    cfg = run_config(a, c.folder, os.path.join(c.workdir, "run-update"), max_new_tokens=a.update_new_tokens)
    policy, critic, tokenizer = load_models(cfg, c.device, c.folder)
    optimizers = {"policy": vapo.make_optimizer(policy, cfg.actor_lr, cfg),
                  "critic": vapo.make_optimizer(critic, cfg.critic_lr, cfg)}
    rows = cfg.micro_batch_size
    rollout = synthetic_batch(tokenizer, rows, a.update_prompt_tokens, a.update_new_tokens, c.device)
    c.probe.phase = "update"
    batch, scoring = scored_batch(policy, critic, rollout, cfg, c.device)
    flops = 6 * (n_params(policy) + n_params(critic))
    tokens = rows * (a.update_prompt_tokens + a.update_new_tokens)
    repeats, t_part = [], time.perf_counter()
    while len(repeats) < a.update_repeats and (not repeats or time.perf_counter() - t_part < box_s):
        memory = PeakMemory(c.device)
        memory.start()
        t0 = time.perf_counter()
        stats = vapo.update(policy, critic, optimizers, rollout, batch, cfg)
        sync(c.device)
        seconds = time.perf_counter() - t0
        repeats.append({"seconds": round(seconds, 3), "tokens_per_s": tokens / seconds,
                        "mfu": flops * tokens / seconds / (a.peak_tflops * 1e12), **gb(memory.stop()),
                        "skipped_nonfinite": stats["skipped_nonfinite"]})
    timed = repeats[1:] or repeats  # the first includes AdamW's first step (its moments allocated) and warm-up
    arithmetic = memory_arithmetic(c.params, c.config, README["rows"], rows, tokens // rows)
    del policy, critic, optimizers, batch, rollout
    return {"rows": rows, "prompt_tokens": a.update_prompt_tokens, "response_tokens": a.update_new_tokens,
            "tokens_per_update": tokens, "scoring": scoring,
            "repeats": repeats, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
            "mfu": statistics.median(r["mfu"] for r in timed),
            "peak_gb": max(r["peak_gb"] for r in repeats),
            "peak_reserved_gb": max((r["peak_reserved_gb"] for r in repeats if r["peak_reserved_gb"] is not None),
                                    default=None),
            "arithmetic_update_gb": arithmetic["update_peak_gb"],
            "docs_measured_update_gb": None if a.tiny else README["update_measured_gb"],
            "first_minibatch": [r for r in c.first.records if r["phase"] == "update"][:1]}


def train_part(c: Check, box_s: float) -> dict:
    """vapo.train on the model folder (run_config), stopped after the step under way once its box is spent;
    its records kept in --out (train-metrics.jsonl) and summarised per RL step (summarise)."""
    cfg = run_config(c.args, c.folder, c.run_dir)
    c.probe.phase = "train"
    with Stopper(box_s, c.signals):
        vapo.train(cfg)
    records = common.read_records(c.run_dir)
    pretrain = c.probe.of("train", "pretrain_value")
    return {"steps_done": steps_done(c.run_dir),
            "value_pretrain_steps_done": len([r for r in records if "value_pretrain_step" in r]),
            "value_pretrain_s": round(pretrain[0]["seconds"], 2) if pretrain else None,
            "value_pretrain_peak_gb": pretrain[0]["peak_gb"] if pretrain else None,
            "value_pretrain_peak_reserved_gb": pretrain[0]["peak_reserved_gb"] if pretrain else None,
            **summarise(c, cfg, records), "metrics": keep_metrics(c.run_dir, c.out, "train-metrics.jsonl")}


def numerics_part(c: Check, box_s: float) -> dict:
    """The first numbers a bf16 run owes, from the records of the train (kept in --out) and update parts: per RL
    step, the gap between the sampler's log-probs and the trainer's recomputation (mean, largest), and the first
    mini-batch's PPO ratio and clipped share (FirstMiniBatch): the update part's first (its later repeats start
    from weights their old log-probs no longer match) and every RL step's."""
    kept = os.path.join(c.out, "train-metrics.jsonl")
    records = [r for r in common.read_jsonl(kept) if "step" in r and "time/step" in r] if os.path.exists(kept) else []
    gap = [{"step": r["step"], "mean": r.get("sampler_logprob_gap_mean"), "max": r.get("sampler_logprob_gap_max")}
           for r in records]
    first = [r for r in c.first.records if r["phase"] == "update"][:1] + [r for r in c.first.records
                                                                          if r["phase"] == "train"]
    if not gap and not first:
        return {"skipped": "no RL step or update was recorded (the train and update parts did not run)"}
    keys = ("phase", "tokens", "ratio_mean", "max_abs_ratio_minus_1", "clip_frac", "clip_frac_low",
            "clip_frac_high", "approx_kl")
    return {"bf16": PRESET["bf16"], "sampler_logprob_gap": gap,
            "first_minibatch": [{k: r.get(k) for k in keys} for r in first]}


def resume_part(c: Check, box_s: float) -> dict:
    """vapo.train --resume on the train part's folder for one RL step more: the checkpoint read back (weights,
    AdamW states, RNG: checkpoints.load_checkpoint, timed) and trained on. The run folder is deleted after it."""
    if c.done.get("train", {}).get("status") != "ok":
        return {"skipped": "needs the train part's run folder"}
    before = steps_done(c.run_dir)
    cfg = dataclasses.replace(run_config(c.args, c.folder, c.run_dir), steps=before + 1)
    c.probe.phase = "resume"
    try:
        with Stopper(box_s, c.signals):
            vapo.train(cfg, resume=True)
        loads = c.probe.of("resume", "load_checkpoint")
        return {"steps_before": before, "steps_after": steps_done(c.run_dir),
                "load_checkpoint_s": round(loads[0]["seconds"], 2) if loads else None,
                "load_checkpoint_peak_gb": loads[0]["peak_gb"] if loads else None,
                "checkpoint_s": [round(r["seconds"], 2) for r in c.probe.of("resume", "save_checkpoint")],
                "sampler_logprob_gap": [{"mean": r.get("sampler_logprob_gap_mean"),
                                         "max": r.get("sampler_logprob_gap_max")}
                                        for r in common.read_records(c.run_dir) if r.get("step") == before + 1],
                "metrics": keep_metrics(c.run_dir, c.out, "train-metrics.jsonl")}
    finally:
        shutil.rmtree(c.run_dir, ignore_errors=True)


def sample_part(c: Check, box_s: float) -> dict:
    """One HFEngine.generate at the preset's shape (--sample-prompts x the preset's 8 samples, up to
    --sample-new-tokens: 64 x 8 x 2,048), under the run's autocast, on the model folder, not cut: its KV cache is
    preallocated for the whole length at the first forward, so the sampling peak is measured however far it gets.
    A deadline in the forward ends it at its box (the result says after how many decoding steps)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    a = c.args
    n = PRESET["samples_per_prompt"]
    tokenizer = AutoTokenizer.from_pretrained(c.folder)
    policy = AutoModelForCausalLM.from_pretrained(c.folder).to(c.device)
    ragged_eos(policy, tokenizer, 2 / a.sample_new_tokens, a.seed)  # lengths for 2,048 tokens, not the train part's
    engine = engines.HFEngine(policy, tokenizer, max_new_tokens=a.sample_new_tokens)
    cfg = run_config(a, c.folder, c.run_dir, prompts_per_step=a.sample_prompts, max_new_tokens=a.sample_new_tokens)
    rows, _ = load_data(cfg, tokenizer)
    prompts = [r["prompt"] for r in rows[:a.sample_prompts]]
    memory = PeakMemory(c.device)
    memory.start()
    t0 = time.perf_counter()
    out, stopped = None, None
    with deadline_guard(policy, box_s) as guard:
        try:
            with vapo.autocast(cfg, c.device):
                out = engine.generate(prompts, n=n, seed=a.seed)
        except PartTimeout as err:
            stopped = str(err)
    sync(c.device)
    seconds = time.perf_counter() - t0
    longest = max(len(ids) for ids in tokenizer(prompts)["input_ids"]) + a.sample_new_tokens
    arithmetic = memory_arithmetic(c.params, c.config, len(prompts) * n, PRESET["micro_batch_size"], longest)
    result = {"prompts": len(prompts), "samples_per_prompt": n, "max_new_tokens": a.sample_new_tokens,
              "seconds": round(seconds, 2), **gb(memory.stop()), "decoding_steps": max(guard.calls - 1, 0),
              "stopped_at_box": stopped,
              # this part holds the float32 policy and the cache; a run's sampling peak adds the critic and AdamW
              "arithmetic_gb": round(4 * c.params / 1e9 + arithmetic["items_gb"]["kv_cache"], 2),
              "arithmetic_in_a_run_gb": arithmetic["sampling_peak_gb"]}
    if out is not None:
        result |= {"tokens_per_s": int(out.lengths.sum()) / seconds, **_generated(None, None, out)}
    del engine, policy, out
    return result


def sharded_argv(c: Check, run_dir: str) -> list[str]:
    """scale/train.py's options for the sharded part: the preset at small shapes, value pretraining and one RL
    step, a checkpoint after each."""
    a = c.args
    batch = a.sharded_prompts * a.sharded_samples
    mini = math.gcd(batch, PRESET["mini_batch_size"])
    return ["--model", c.folder, "--dataset", "builtin", "--preset", "gpu-0.5b", "--steps", "1",
            "--prompts-per-step", str(a.sharded_prompts), "--samples-per-prompt", str(a.sharded_samples),
            "--max-new-tokens", str(a.sharded_new_tokens), "--mini-batch-size", str(mini),
            "--micro-batch-size", str(math.gcd(mini, PRESET["micro_batch_size"])), "--value-pretrain-steps", "1",
            "--eval-prompts", "0", "--eval-every", "0", "--save-every", "0", "--output-dir", run_dir,
            "--device", a.device, "--seed", str(a.seed), "--report-to", "none"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sharded_process(c: Check, argv: list[str], name: str, seconds: float) -> dict:
    """One process of `python bench/gpu_check.py --sharded-child RECORD -- ARGV` (sharded_child: scale/train.py's
    main, a world of one), its output in --out/NAME.log; SIGTERM once `seconds` have passed (it stops after the
    step under way, with a checkpoint), SIGKILL SHARDED_GRACE_S later. -> its return code, seconds and record."""
    record = os.path.join(c.workdir, f"{name}.json")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, os.path.abspath(__file__), "--sharded-child", record, "--", *argv]
    t0 = time.perf_counter()
    with open(os.path.join(c.out, f"{name}.log"), "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=common.ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=max(seconds, 1))
        except subprocess.TimeoutExpired:
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
    if os.path.exists(record):
        out |= common.read_json(record)
    return out


def sharded_child(record: str, argv: list[str]):
    """The sharded part's process: scale/train.py's main (a world of one, as `python scale/train.py ARGV` starts
    it), with its peak memory and the trainer's calls (checkpoints, updates) written to record as JSON at the end."""
    from scale import train as scale_train
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    probe = Probe(device)
    probe.phase = "sharded"
    probe.wrap(vapo, "pretrain_value", "pretrain_value")
    probe.wrap(vapo, "update", "update", _updated)
    probe.wrap(run, "save_checkpoint", "save_checkpoint", after=drop_fallback)
    probe.wrap(run, "load_checkpoint", "load_checkpoint")
    memory = PeakMemory(device)
    memory.start()
    try:
        scale_train.main(argv)
    finally:
        common.write_json(record, {**gb(memory.stop()), "world_size": 1,
                                   "calls": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                                              if k not in ("phase", "params")} for r in probe.records]})


def sharded_part(c: Check, box_s: float) -> dict:
    """scale/train.py as a world of one (sharded_process): value pretraining, one RL step and their checkpoints
    (the gathered save of the policy and critic, the optimizers' distributed checkpoint), then --resume for one
    step more; each process gets what is left of the box. The run's records go to --out/sharded-metrics.jsonl."""
    run_dir = os.path.join(c.workdir, "run-sharded")
    t0 = time.perf_counter()
    try:
        first = sharded_process(c, sharded_argv(c, run_dir), "sharded-1", box_s)
        steps_first = steps_done(run_dir)
        left = box_s - (time.perf_counter() - t0)
        second = (sharded_process(c, ["--resume", run_dir, "--steps", str(steps_first + 1)], "sharded-2", left)
                  if left >= MIN_BOX_S else {"skipped": f"{left:.0f} s of the box left for the resume"})
        saved = os.path.join(run_dir, "checkpoint")
        return {"steps_after_first": steps_first, "steps_after_resume": steps_done(run_dir),
                "value_pretrain_steps_done": len([r for r in common.read_records(run_dir)
                                                  if "value_pretrain_step" in r]),
                "checkpoint_holds": sorted(os.listdir(saved)) if os.path.isdir(saved) else [],
                "first": first, "resume": second,
                "metrics": keep_metrics(run_dir, c.out, "sharded-metrics.jsonl")}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def evaluation_part(c: Check, box_s: float) -> dict:
    """vapo.evaluate as a run calls it (HF engine, autocast, bounded passes) on the model folder, over as many of
    --eval-prompts as the box holds at the train part's generation speed (counting every response to
    max_new_tokens: (eval_samples + 1) x max_new_tokens tokens a prompt, an upper bound); a deadline in the
    forward stops it at the box where that speed is unknown."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    a = c.args
    cfg = run_config(a, c.folder, c.run_dir)
    speed = c.done.get("train", {}).get("generation", {}).get("tokens_per_s")
    prompts = a.eval_prompts
    if speed:
        prompts = max(1, min(prompts, int(box_s * speed / ((cfg.eval_samples + 1) * cfg.max_new_tokens))))
    cfg = dataclasses.replace(cfg, eval_prompts=prompts)
    tokenizer = AutoTokenizer.from_pretrained(c.folder)
    policy = AutoModelForCausalLM.from_pretrained(c.folder).to(c.device)
    engine = engines.HFEngine(policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                              top_p=cfg.top_p)
    _, held_out = load_data(cfg, tokenizer)
    t0 = time.perf_counter()
    try:
        with deadline_guard(policy, box_s if not speed else math.inf):
            result = vapo.evaluate(engine, held_out, cfg, run.verifier_for(cfg))
    except PartTimeout as err:
        return {"prompts": prompts, "asked": a.eval_prompts, "stopped_at_box": str(err)}
    sync(c.device)
    seconds = time.perf_counter() - t0
    del engine, policy
    return {"prompts": prompts, "asked": a.eval_prompts, "eval_samples": cfg.eval_samples,
            "rows_per_pass": (cfg.eval_batch_size or max(1, cfg.batch_size // cfg.eval_samples)) * cfg.eval_samples,
            "seconds": round(seconds, 2), "box_s": round(box_s, 1),
            "tokens_per_s": sum(result[f"eval/response_len_{name}"] * prompts * n for name, n in
                                ((f"avg@{cfg.eval_samples}", cfg.eval_samples), ("greedy", 1))) / seconds,
            "result": result}


def vllm_part(c: Check, box_s: float) -> dict:
    """vapo.train with --engine vllm for --vllm-steps steps, in its box; the engine's calls timed by the probe."""
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vllm is not installed on this machine"}
    cfg = run_config(c.args, c.folder, os.path.join(c.workdir, "run-vllm"), engine="vllm", steps=c.args.vllm_steps)
    c.probe.phase = "vllm"
    c.probe.wrap(vapo, "make_engine", "engine start")  # as vapo.py imported it
    for name in ("generate", "sleep", "load_weights"):
        c.probe.wrap(engines.VLLMEngine, name, f"vllm {name}", _generated if name == "generate" else None)
    t0 = time.perf_counter()
    with Stopper(box_s, c.signals):
        vapo.train(cfg)
    calls = [r for r in c.probe.records if r["phase"] == "vllm"]
    gens = [r for r in calls if r["what"] == "vllm generate"]
    return {"seconds": round(time.perf_counter() - t0, 1), "box_s": round(box_s, 1),
            "steps_done": steps_done(cfg.output_dir),
            "generation_tokens_per_s": statistics.median(r["tokens"] / r["seconds"] for r in gens) if gens else None,
            "calls": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "phase"}
                      for r in calls]}


# --- the train part's figures ---------------------------------------------------------------------------------
def summarise(c: Check, cfg, records: list[dict]) -> dict:
    """Per RL step of the train part: generation and update tokens a second, TFLOP/s and MFU of the update, peak
    memory of sampling and of the update; medians over the steps, each phase's peak (allocated and reserved),
    checkpoint and scoring seconds, and the memory arithmetic at the docs' and at this run's shapes."""
    train = [r for r in c.probe.records if r["phase"] == "train"]
    gens = [r for r in train if r["what"] == "generate"]
    updates = [r for r in train if r["what"] == "update" and r["train_policy"]]
    counted = updates[0]["params"] if updates else {"policy": c.params, "critic": c.params}
    flops_per_token = 6 * (counted["policy"] + counted["critic"])
    steps = []
    for i, (g, u) in enumerate(zip(gens[-len(updates):] if updates else [], updates)):
        steps.append({"step": i + 1, "generate_s": round(g["seconds"], 3), "generated_tokens": g["tokens"],
                      "generation_tokens_per_s": g["tokens"] / g["seconds"], "lengths": g["lengths"],
                      "update_s": round(u["seconds"], 3), "update_tokens": u["tokens"],
                      "update_tokens_per_s": u["tokens"] / u["seconds"],
                      "update_tflops": flops_per_token * u["tokens"] / u["seconds"] / 1e12,
                      "mfu": flops_per_token * u["tokens"] / u["seconds"] / (c.args.peak_tflops * 1e12),
                      "generate_peak_gb": g["peak_gb"], "update_peak_gb": u["peak_gb"],
                      "update_peak_reserved_gb": u["peak_reserved_gb"]})

    def med(key):
        return statistics.median(s[key] for s in steps) if steps else None

    def peak(what, key="peak_gb"):
        values = [r[key] for r in train if r["what"] == what and r[key] is not None]
        return round(max(values), 3) if values else None

    phases = {"generate": "sampling", "score_rollout": "scoring", "update": "update", "save_checkpoint": "checkpoint"}
    longest = max((g["prompt_width"] + g["response_width"] for g in gens), default=cfg.max_new_tokens)
    return {"params": counted, "steps": steps,
            "generation": {"tokens_per_s": med("generation_tokens_per_s"),
                           "rows": gens[-1]["rows"] if gens else None,
                           "response_width": gens[-1]["response_width"] if gens else None},
            "update": {"tokens_per_s": med("update_tokens_per_s"), "tflops": med("update_tflops"), "mfu": med("mfu"),
                       "peak_tflops": c.args.peak_tflops, "flops_per_token": flops_per_token},
            "peaks_gb": {name: peak(what) for what, name in phases.items()},
            "peaks_reserved_gb": {name: peak(what, "peak_reserved_gb") for what, name in phases.items()},
            "checkpoint_s": [round(r["seconds"], 2) for r in train if r["what"] == "save_checkpoint"],
            "scoring_s": [round(r["seconds"], 3) for r in train if r["what"] == "score_rollout"],
            "arithmetic_this_run": memory_arithmetic(c.params, c.config, cfg.batch_size, cfg.micro_batch_size,
                                                     longest),
            "rl_records": [{k: v for k, v in r.items() if k.startswith("time/")} for r in records
                           if "step" in r and "time/step" in r]}


# --- the plan, the setup, the command line --------------------------------------------------------------------
WORK = dict(update=update_part, train=train_part, numerics=numerics_part, resume=resume_part, sample=sample_part,
            sharded=sharded_part, evaluate=evaluation_part, vllm=vllm_part)


def plan(budget_s: float, with_vllm: bool) -> dict:
    """Each part's box in seconds: PLAN_S where vLLM is installed, else PLAN_WITHOUT_VLLM_S (its share given to
    the other parts), scaled to budget_s."""
    base = PLAN_S if with_vllm else PLAN_WITHOUT_VLLM_S
    return {name: seconds * budget_s / PLAN_TOTAL_S for name, seconds in base.items()}


def part_box(name: str, boxes: dict, args) -> float:
    """A part's box: its plan's, cut to what is left before --deadline-s."""
    box = args.stop_after_s if name == "train" and args.stop_after_s else boxes[name]
    return max(0.0, min(box, args.deadline_s - (time.perf_counter() - T_START)))


def guarded(c: Check, name: str, box_s: float) -> dict:
    """A part's work, unless it cannot be done: no time left before the deadline, or no room on the disk for the
    checkpoints it writes (the reason is its result)."""
    if c.boxes[name] > 0 and box_s < MIN_BOX_S * min(1.0, c.args.budget_s / PLAN_TOTAL_S):
        return {"skipped": f"{box_s:.0f} s left before the deadline of {c.args.deadline_s:g} s"}
    if name in CHECKPOINT_PARTS and not c.disk["checkpoints_fit"]:
        return {"skipped": f"the work folder has {c.disk['free_gb']} GB free, its checkpoints need "
                           f"{c.disk['need_with_checkpoints_gb']} GB (--workdir elsewhere)"}
    return WORK[name](c, box_s)


def setup(args, device: torch.device, workdir: str, signals: Signals, report: Report, boxes: dict) -> Check:
    """The model folder built (build_model_folder, timed) and the trainer's functions wrapped by the probe."""
    t0 = time.perf_counter()
    folder = os.path.join(workdir, "model")
    config, params = build_model_folder(folder, args.tiny, device, args.seed, args.max_new_tokens)
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
    signals.watch_train(probe)
    report.data["probe"] = probe.records  # saved with every report: the calls so far, even if a part is killed
    return Check(args=args, device=device, folder=folder, config=config, params=params, workdir=workdir,
                 out=args.out, probe=probe, first=first, signals=signals, done={}, disk=report.data["workdir"],
                 boxes=boxes)


def versions() -> dict:
    out = {"torch": torch.__version__}
    for name in ("transformers", "accelerate", "vllm"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def check_disk(workdir: str, need: dict) -> dict:
    """The work folder's free space against disk_need; SystemExit when not even the model folder fits."""
    free = shutil.disk_usage(workdir).free
    out = {"path": workdir, "free_gb": round(free / 1e9, 1), "need_model_gb": round(need["model"] / 1e9, 1),
           "need_with_checkpoints_gb": round((need["model"] + need["checkpoints"]) / 1e9, 1)}
    if free < need["model"]:
        raise SystemExit(f"--workdir {workdir}: {free / 1e9:.1f} GB free, the model folder alone needs "
                         f"{need['model'] / 1e9:.1f} GB")
    return out | {"checkpoints_fit": free >= need["model"] + need["checkpoints"]}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3, help="RL steps of the train part (it stops sooner at its box)")
    p.add_argument("--prompts-per-step", type=int, default=None, help="train part: default 16 (2 with --tiny; the "
                                                                      "preset has 64)")
    p.add_argument("--samples-per-prompt", type=int, default=None, help="default 8, the preset's (2 with --tiny)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="train part: default 512 (16 with --tiny; the "
                                                                    "preset's 2048 is the update and sample parts')")
    p.add_argument("--micro-batch-size", type=int, default=None, help="default: the preset's 4")
    p.add_argument("--value-pretrain-steps", type=int, default=1, help="critic-only steps first (default 1)")
    p.add_argument("--update-repeats", type=int, default=3, help="updates of the update part, if its box lasts")
    p.add_argument("--update-prompt-tokens", type=int, default=None, help="update part: prompt tokens a row "
                                                                          "(default 252: 2,300 with the response)")
    p.add_argument("--update-new-tokens", type=int, default=None, help="update part: response tokens a row "
                                                                       "(default 2048, the preset's)")
    p.add_argument("--sample-prompts", type=int, default=None, help="sample part: prompts x 8 samples (default 64, "
                                                                    "the preset's; 4 with --tiny)")
    p.add_argument("--sample-new-tokens", type=int, default=None, help="sample part: new tokens (default 2048, the "
                                                                       "preset's; 32 with --tiny)")
    p.add_argument("--sharded-prompts", type=int, default=None, help="sharded part: prompts a step (default 4)")
    p.add_argument("--sharded-samples", type=int, default=None, help="sharded part: samples a prompt (default 8)")
    p.add_argument("--sharded-new-tokens", type=int, default=None, help="sharded part: new tokens (default 256)")
    p.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts of the evaluation part "
                                                                  "(default 64, 2 with --tiny), cut to its box")
    p.add_argument("--vllm-steps", type=int, default=None, help="RL steps of the vLLM part (default 2, 1 with --tiny)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="the GPU's dense bf16 peak, for MFU (default 989: H100/H200 SXM)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--tiny", action="store_true", help="2 layers, hidden 256, vocabulary 4096, small shapes (a "
                                                       "check that every part runs)")
    p.add_argument("--budget-s", type=float, default=PLAN_TOTAL_S, help="the parts' boxes together (default 400; "
                                                                        "the plan is scaled to it)")
    p.add_argument("--deadline-s", type=float, default=DEADLINE_S, help="no part starts or runs past this many "
                                                                        "seconds after the start (default 440)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--stop-after-s", type=float, default=0, help="the train part's box instead of its plan's")
    p.add_argument("--workdir", default=None, help="where the work folder is made (default: the system's "
                                                   "temporary folder); it needs about 30 GB at 0.5B")
    p.add_argument("--keep-workdir", action="store_true", help="keep the work folder (model and runs) at the end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join("runs", "gpu_check"),
                   help="folder for the report: gpu_check.json (after every part), gpu_check.txt, the runs' records")
    args = p.parse_args(argv)
    for k, v in (TINY_RUN if args.tiny else FULL_RUN).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    signals = Signals()
    signals.install()
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available on this machine")
    with_vllm = importlib.util.find_spec("vllm") is not None
    boxes = plan(args.budget_s, with_vllm)
    report = Report(args.out, {"machine": common.machine(device), "date": common.now(), "device": str(device),
                               "versions": versions(), "tiny": args.tiny, "args": vars(args),
                               "plan": {"boxes_s": {k: round(v, 1) for k, v in boxes.items()},
                                        "deadline_s": args.deadline_s, "vllm_installed": with_vllm}})
    os.makedirs(args.workdir or tempfile.gettempdir(), exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="gpu_check-", dir=args.workdir)
    shape = {**QWEN25_05B, **(TINY if args.tiny else {})}
    status, check = "complete", None
    try:
        report.data["workdir"] = check_disk(workdir, disk_need(counts(shape)["policy"]))
        report.save()
        check = setup(args, device, workdir, signals, report, boxes)
        for name in [p for p in PARTS if p in args.parts]:
            if signals.outside:
                break
            check.done[name] = run_part(name, lambda box, name=name: guarded(check, name, box),
                                        part_box(name, boxes, args), device, report)
            if signals.outside:  # taken by vapo.train's StopRequest: the part ended after the step under way
                check.done[name]["stopped_by"] = "SIGTERM from outside the check"
                report.part(name, check.done[name])
            if name == "train" and "resume" not in args.parts:
                shutil.rmtree(check.run_dir, ignore_errors=True)  # no resume to come: the disk back
    except Stopped:
        signals.outside = True
    finally:
        if check is not None:
            check.probe.undo()
        report.finish("stopped" if signals.outside else status)
        if not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    write_summary(report)
    if signals.outside:
        raise SystemExit(143)
    if any(p["status"] == "failed" for p in report.data["parts"].values()):
        raise SystemExit(1)  # every part has run; the report says which failed and why


# --- the summary ----------------------------------------------------------------------------------------------
def fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def write_summary(report: Report):
    """gpu_check.txt and the printed summary: one line of figures a part."""
    d = report.data
    lines = [f"machine: {d['machine']}", f"date: {d['date']}; {d['wall_s']:.0f} s in all ({d['status']}); setup "
             f"{d.get('setup_s', 0):.0f} s; {', '.join(f'{k} {v}' for k, v in d['versions'].items())}"]
    readme = memory_arithmetic(494_032_768, model_config(task.build_tokenizer(), False), README["rows"],
                               README["micro"], README["seq"])
    lines.append(f"docs/scaling.md arithmetic ({README['rows']} rows, micro-batch {README['micro']} x "
                 f"{README['seq']} tokens): update {readme['update_peak_gb']:.1f} GB, sampling "
                 f"{readme['sampling_peak_gb']:.1f} GB (the docs say {README['update_gb']} and "
                 f"{README['sampling_gb']}; "
                 f"measured with fake tensors: update {README['update_measured_gb']} GB)")
    for name, p in d["parts"].items():
        lines.append(part_line(name, p))
    text = "\n".join(lines)
    with open(os.path.join(report.out, "gpu_check.txt"), "w") as fh:
        fh.write(text + "\n")
    print("\n" + text + f"\nwrote {report.path} and gpu_check.txt")


def part_line(name: str, p: dict) -> str:
    """One line of the summary: the part's status, seconds, box and peaks, then its own figures."""
    if p["status"] == "skipped":
        return f"{name}: skipped ({p['skipped']})"
    own = p.get("measured", {})
    head = (f"{name}: {p['status']}, {own.get('seconds', 0):.1f} s (box {own.get('box_s', 0):.0f} s), peak "
            f"{fmt(own.get('peak_gb'), '.2f')} GB allocated, {fmt(own.get('peak_reserved_gb'), '.2f')} GB reserved")
    if p["status"] != "ok":
        return head + f"; {p.get('error', '')}"
    return head + "; " + FIGURES.get(name, lambda p: "")(p)


FIGURES = {
    "update": lambda p: (f"{p['rows']} rows x {p['prompt_tokens']} + {p['response_tokens']} tokens: "
                         f"{p['tokens_per_s']:,.0f} tokens/s, MFU {100 * p['mfu']:.1f}%, update peak "
                         f"{p['peak_gb']:.2f} GB allocated / {fmt(p['peak_reserved_gb'], '.2f')} GB reserved against "
                         f"{p['arithmetic_update_gb']:.2f} GB by the arithmetic"),
    "train": lambda p: (f"{p['value_pretrain_steps_done']} value-pretraining and {p['steps_done']} RL steps; "
                        f"generation {fmt(p['generation']['tokens_per_s'], ',.0f')} tokens/s, update "
                        f"{fmt(p['update']['tokens_per_s'], ',.0f')} tokens/s, MFU "
                        f"{fmt(p['update']['mfu'] and 100 * p['update']['mfu'], '.1f')}%; peaks (GB) "
                        + ", ".join(f"{k} {fmt(v, '.2f')}" for k, v in p["peaks_gb"].items())
                        + f"; checkpoints {', '.join(f'{s:.1f} s' for s in p['checkpoint_s'])}"),
    "numerics": lambda p: ("log-prob gap (sampler - trainer) per step: "
                           + (", ".join(f"{fmt(g['mean'], '.2e')} mean / {fmt(g['max'], '.2e')} max"
                                        for g in p["sampler_logprob_gap"]) or "none")
                           + "; first mini-batch: " + (", ".join(
                               f"{r['phase']} ratio {fmt(r['ratio_mean'], '.4f')} (|r-1| up to "
                               f"{fmt(r['max_abs_ratio_minus_1'], '.3f')}), clipped {fmt(r['clip_frac'], '.4f')}"
                               for r in p["first_minibatch"]) or "none")),
    "resume": lambda p: (f"from step {p['steps_before']} to {p['steps_after']}, checkpoint read back in "
                         f"{fmt(p['load_checkpoint_s'], '.1f')} s"),
    "sample": lambda p: (f"{p['prompts']} x {p['samples_per_prompt']} rows, up to {p['max_new_tokens']} new tokens"
                         + (f", stopped at its box after {p['decoding_steps']} decoding steps" if p["stopped_at_box"]
                            else f": {p['tokens_per_s']:,.0f} tokens/s, lengths {p['lengths']['min']}-"
                                 f"{p['lengths']['max']}")
                         + f"; sampling peak {p['peak_gb']:.2f} GB against {p['arithmetic_gb']:.2f} GB by the "
                           f"arithmetic (policy and KV cache; {p['arithmetic_in_a_run_gb']:.2f} GB in a run)"),
    "sharded": lambda p: (f"world of one: steps {p['steps_after_first']} then {p['steps_after_resume']} after "
                          f"--resume (exit {p['first']['returncode']}, {p['resume'].get('returncode')}); peaks "
                          f"{fmt(p['first'].get('peak_gb'), '.2f')} / {fmt(p['resume'].get('peak_gb'), '.2f')} GB; "
                          f"checkpoint holds {', '.join(p['checkpoint_holds'])}"),
    "evaluate": lambda p: (f"{p['prompts']} of {p['asked']} prompts, stopped at its box ({p['stopped_at_box']})"
                           if p.get("stopped_at_box") else
                           f"{p['prompts']} of {p['asked']} prompts x ({p['eval_samples']} + greedy): "
                           f"{p['tokens_per_s']:,.0f} tokens/s"),
    "vllm": lambda p: (f"{p['steps_done']} steps; generation {fmt(p['generation_tokens_per_s'], ',.0f')} tokens/s; "
                       + ", ".join(f"{k} {statistics.median(t):.2f} s (x{len(t)})" for k, t in _by_what(p).items())),
}


def _by_what(p: dict) -> dict:
    each = {}
    for call in p["calls"]:
        each.setdefault(call["what"], []).append(call["seconds"])
    return each


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sharded-child"]:  # the sharded part's process: RECORD -- scale/train.py's options
        sharded_child(sys.argv[2], sys.argv[4:])
    else:
        main()
