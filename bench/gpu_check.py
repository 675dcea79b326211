"""Check on one GPU, offline, in one command of about 9 minutes: what `--preset gpu-0.5b` does on a random model of
Qwen2.5-0.5B's shape, part by part (update, train, numerics, resume, sample, sharded, evaluate, vllm), each part in
a time box and its figures kept as soon as it ends.

    python bench/gpu_check.py --out DIR --workdir WORK          # the whole check: about 8 minutes on one GPU
    python bench/gpu_check.py --parts update sample --out DIR   # only some parts
    python bench/gpu_check.py --tiny --device cpu --out DIR     # a 2-layer version on a CPU (the tests)

It replaces none of the trainer's functions. Its figures are what the trainer records (metrics.jsonl's time/ and,
on a GPU, memory/ figures of each phase; the run's log of each checkpoint, read from the log records' attributes),
what an observer (run.Hooks) sees of each scored batch, and, in the parts that call the trainer's functions
themselves (update, numerics, sample, evaluate), their own clocks and forward hooks on the models they built.

DIR/gpu_check.json is rewritten after every part ("status": partial, then complete; failed when the setup failed;
stopped after a SIGTERM from outside); DIR/gpu_check.txt gets one summary line a part. docs/scaling.md ("What a GPU
run meets first") says what each part measures, the time plan, the disk the work folder needs and how MFU is counted.
Needs torch, transformers, accelerate, safetensors and tokenizers only.
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
from machinery import decoding, engines, run, task
from machinery.data import load_data
from machinery.models import float32_head, load_models
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
                sharded_prompts=4, sharded_samples=8, sharded_new_tokens=256, numerics_prompts=8,
                numerics_new_tokens=128, write_probe_mb=1024, decode_shapes="64x512,512x1024,512x2048")
TINY_RUN = dict(prompts_per_step=2, samples_per_prompt=4, max_new_tokens=16, eval_prompts=2, vllm_steps=1,
                sample_prompts=4, sample_new_tokens=32, update_prompt_tokens=8, update_new_tokens=32,
                sharded_prompts=2, sharded_samples=2, sharded_new_tokens=16, numerics_prompts=2,
                numerics_new_tokens=16, write_probe_mb=16, decode_shapes="8x64,32x128")
BOTH_RUNS = dict(value_pretrain_steps=1, update_repeats=3)
MINI_BATCHES = 4  # optimizer steps per RL step in the train part, as the preset's 512 samples in mini-batches of 128
UPDATE_ROWS = PRESET["micro_batch_size"]  # the update part's one micro-batch
PEAKED_LOGIT = 25.0  # the numerics probe's median largest logit: a trained model's chosen logits are 15-30

PARTS = ("update", "train", "numerics", "resume", "sample", "sharded", "evaluate", "vllm")  # in the order they run
PLAN_S = dict(update=25, train=85, numerics=20, resume=35, sample=45, sharded=70, evaluate=10, vllm=110)
PLAN_WITHOUT_VLLM_S = dict(update=30, train=100, numerics=25, resume=40, sample=60, sharded=120, evaluate=25, vllm=0)
PLAN_TOTAL_S = 400  # what --budget-s scales: both plans sum to it
DEADLINE_S = 440  # no part starts, or runs on, later than this after the start (default of --deadline-s)
MIN_BOX_S = 5  # a part left less than this before the deadline is skipped
STOP_GRACE_S = 90  # after a SIGTERM from outside: the step under way and its checkpoint, then the process ends
SHARDED_GRACE_S = 45  # after a sharded process's box: its SIGTERM stop (a step and a checkpoint) before a SIGKILL
CHECKPOINT_PARTS = ("train", "resume", "sharded")  # the parts that write checkpoints into the work folder
# docs/scaling.md's arithmetic for --preset gpu-0.5b: 512 responses, micro-batches of 4 x 2,300 tokens, of which the
# update keeps 2,048 logit columns (the response's); its measurement without a GPU (bench/memory_measured.py at
# commit 758a9d0): 41.9 GB at the update's peak
README = dict(rows=512, micro=4, seq=2300, response=2048, update_gb=31.5, sampling_gb=26.3, update_measured_gb=41.9)
KV_BYTES = 2  # one cached K or V element: the sampler's cache is bf16 under --bf16 (decoding.PreallocatedLayer)
# dense bf16 peaks (TFLOP/s, no sparsity) of the datasheets, by the device name torch reports: the first match wins
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H200 NVL", 835.0), ("GH200", 989.0),
                    ("H100", 989.0), ("H200", 989.0), ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.0),
                    ("A10G", 70.0), ("L4", 121.0))


# --- shapes, arithmetic, disk, the device, measurement --------------------------------------------------------
def model_config(tokenizer, tiny: bool):
    from transformers import Qwen2Config
    return Qwen2Config(**{**QWEN25_05B, **(TINY if tiny else {})}, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=None, use_cache=True)


def memory_arithmetic(params: int, config, rows: int, micro: int, seq: int, kept: int | None = None) -> dict:
    """docs/scaling.md's items, GB (1e9 bytes): float32 weights + gradients + AdamW moments of policy and critic;
    the KV cache of `rows` sequences of `seq` tokens (sampling computes no gradient: only the weights and AdamW
    states stay beside it); one micro-batch's checkpointed layer inputs (float32: the residual stream stays float32
    under autocast, whose matmuls alone run in bf16) and its float32 logits, softmax and their gradient over the
    `kept` response columns (logits_to_keep; default seq)."""
    head_dim = config.hidden_size // config.num_attention_heads
    kept = seq if kept is None else kept
    items = {"weights_grads_adamw_both": 2 * params * (4 + 4 + 8),
             "kv_cache": config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * KV_BYTES * rows * seq,
             "checkpointed_inputs": config.num_hidden_layers * micro * seq * config.hidden_size * 4,
             "logits": 3 * micro * kept * config.vocab_size * 4}
    gb = {k: v / 1e9 for k, v in items.items()}
    return {"items_gb": {k: round(v, 2) for k, v in gb.items()}, "rows": rows, "micro_batch": micro, "seq": seq,
            "logit_columns": kept,
            "update_peak_gb": round(gb["weights_grads_adamw_both"] + gb["checkpointed_inputs"] + gb["logits"], 2),
            "sampling_peak_gb": round(2 * params * (4 + 8) / 1e9 + gb["kv_cache"], 2)}


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


def write_probe(workdir: str, megabytes: int) -> dict:
    """One timed write of `megabytes` MB into the work folder, fsynced (as a checkpoint's files are), then deleted:
    what the disk gives a checkpoint of about 12 GB."""
    path, block = os.path.join(workdir, "write-probe.bin"), os.urandom(1 << 20)
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        for _ in range(megabytes):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - t0
    os.remove(path)
    return {"bytes": megabytes << 20, "seconds": round(seconds, 3),
            "gb_per_s": round((megabytes << 20) / seconds / 1e9, 3)}


def peak_bf16_tflops(name: str | None) -> float | None:
    """The dense bf16 peak of a GPU by the name torch gives it (PEAK_BF16_TFLOPS), None where it is not known."""
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS if name and key in name), None)


def driver_version() -> str | None:
    """The NVIDIA driver's version: nvidia-smi's, else the kernel module's (/proc), else None."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    with contextlib.suppress(OSError, StopIteration):
        with open("/proc/driver/nvidia/version") as fh:
            return next(w for w in fh.readline().split() if w[:1].isdigit() and "." in w)
    return None


def device_info(device: torch.device, peak_tflops: float | None) -> dict:
    """The device: name, memory, compute capability, CUDA and driver versions, and the bf16 peak MFU divides by
    (--peak-tflops, else chosen by the name; None on a CPU or an unknown card: no MFU then)."""
    if device.type != "cuda":
        return {"type": "cpu", "peak_bf16_tflops": peak_tflops, "peak_from": "--peak-tflops" if peak_tflops else None}
    props = torch.cuda.get_device_properties(device)
    by_name = peak_bf16_tflops(props.name)
    return {"type": "cuda", "name": props.name, "memory_gb": round(props.total_memory / 1e9, 1),
            "capability": f"{props.major}.{props.minor}", "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "driver": driver_version(),
            "peak_bf16_tflops": peak_tflops or by_name,
            "peak_from": "--peak-tflops" if peak_tflops else ("the device's name" if by_name else None)}


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


def quantiles(values: torch.Tensor) -> dict:
    """mean, p99 and max of a 1-D float tensor (None each when it is empty)."""
    if values.numel() == 0:
        return {"mean": None, "p99": None, "max": None}
    v = values.double().cpu()
    return {"mean": float(v.mean()), "p99": float(v.quantile(0.99)), "max": float(v.max())}


# --- what the trainer records, read from outside ----------------------------------------------------------------
class Batches:
    """An observer (run.Hooks) of the check's runs: one record per scored batch, {"phase", "stage", "step", "rows",
    "prompt_width", "response_width", "tokens" (prompt and response tokens: what the update's passes read),
    "generated_tokens", "lengths" {min, median, max, truncated_frac}, and on a GPU "device_used_gb" (every process's
    memory on the device while the engine idles: vLLM asleep)}; it adds nothing to the run's records and keeps no
    state in its checkpoints. hooks(phase) gives the run.Hooks that plug it in, and notes when the run's models and
    engine were ready (the observers are made then) and their sizes."""

    def __init__(self, device: torch.device):
        self.device, self.records, self.ready = device, [], {}

    def hooks(self, phase: str) -> run.Hooks:
        def observers(setup, critic):
            self.ready[phase] = {"at": time.perf_counter(), "run_dir": setup.cfg.output_dir, "params": {
                "policy": n_params(setup.policy), "critic": n_params(critic) if critic is not None else 0}}
            return [Observer(self, phase, setup.cfg.output_dir)]
        return run.Hooks(observers=observers)

    def of(self, phase: str, stage: str = "rl") -> list[dict]:
        return [r for r in self.records if r["phase"] == phase and r["stage"] == stage]


class Observer:
    """One run's observer of Batches (what run.Hooks calls). It also deletes the run's checkpoint.prev (the fallback
    to a damaged checkpoint, which the check never reads) once a step is under way, so that a save holds two
    checkpoints on the disk at most (disk_need), not three."""

    def __init__(self, batches: Batches, phase: str, run_dir: str | None):
        self.batches, self.phase, self.run_dir = batches, phase, run_dir

    def observe(self, batch: run.Observed) -> dict:
        if self.run_dir is not None:
            shutil.rmtree(os.path.join(self.run_dir, "checkpoint.prev"), ignore_errors=True)
        r = batch.rollout
        lengths = r.lengths.float()
        record = {"phase": self.phase, "stage": batch.stage, "step": batch.step, "rows": r.B, "prompt_width": r.P,
                  "response_width": r.T, "tokens": int(r.prompt_mask.sum() + r.lengths.sum()),
                  "generated_tokens": int(r.lengths.sum()),
                  "lengths": {"min": int(lengths.min()), "median": float(lengths.median()), "max": int(lengths.max()),
                              "truncated_frac": round(float(r.truncated.float().mean()), 3)}}
        if self.batches.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.batches.device)
            record["device_used_gb"] = round((total - free) / 1e9, 3)
        self.batches.records.append(record)
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict):
        pass


class RunLog(logging.Handler):
    """The run's log, read as it is written: the figures the trainer attaches to its log records (run.Run.save's
    "checkpoint": bytes and seconds of each save; Run.restore's "checkpoint_loaded"), each with the part it came
    from, and a SIGTERM the run took (its StopRequest's warning), which Stops tells from its own."""

    def __init__(self, stops: "Stops | None" = None):
        super().__init__(logging.INFO)
        self.stops, self.phase, self.saves, self.loads = stops, "setup", [], []

    def emit(self, record: logging.LogRecord):
        if hasattr(record, "checkpoint"):
            self.saves.append({"phase": self.phase, **record.checkpoint})
        if hasattr(record, "checkpoint_loaded"):
            self.loads.append({"phase": self.phase, **record.checkpoint_loaded})
        if (self.stops is not None and isinstance(record.msg, str) and record.msg.startswith("%s received")
                and isinstance(record.args, tuple) and record.args[:1] == ("SIGTERM",)):
            self.stops.run_took_sigterm()

    def saved(self, phase: str) -> list[dict]:
        return [{k: round(v, 3) if isinstance(v, float) else v for k, v in s.items() if k != "phase"}
                for s in self.saves if s["phase"] == phase]

    def attach(self):
        logging.getLogger("vapo").addHandler(self)
        return self


class DecodeClock:
    """Forward hooks on a model the check built: every forward pass's rows, width of its new tokens, context (the
    attention mask's columns) and milliseconds (CUDA events on a GPU, no synchronisation per step; the process clock
    on a CPU). Counts survive a box that ends the pass midway: decoding_steps, tokens sampled so far (a decode step's
    rows are the tokens sampled before it), and a table of ms per decode step against rows x context."""

    def __init__(self, model, device: torch.device):
        self.device, self.passes, self.open = device, [], None
        self.handles = [model.register_forward_pre_hook(self._before, with_kwargs=True),
                        model.register_forward_hook(self._after, with_kwargs=True)]

    def _now(self):
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _before(self, module, args, kwargs):
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is not None:
            self.open = {"rows": ids.shape[0], "width": ids.shape[1],
                         "context": mask.shape[1] if mask is not None else ids.shape[1], "start": self._now()}

    def _after(self, module, args, kwargs, output):
        if self.open is not None:
            self.passes.append(self.open | {"end": self._now()})
            self.open = None

    def remove(self):
        for handle in self.handles:
            handle.remove()

    def summary(self, bins: int = 16) -> dict:
        sync(self.device)
        ms = [p["start"].elapsed_time(p["end"]) if self.device.type == "cuda" else (p["end"] - p["start"]) * 1e3
              for p in self.passes]
        decode = [(p, t) for p, t in zip(self.passes, ms) if p["width"] == 1]
        table = []
        size = max(1, math.ceil(len(decode) / bins))
        for i in range(0, len(decode), size):
            chunk = decode[i:i + size]
            table.append({"steps": len(chunk), "rows": round(statistics.mean(p["rows"] for p, _ in chunk), 1),
                          "context": [chunk[0][0]["context"], chunk[-1][0]["context"]],
                          "ms_per_step": round(statistics.median(t for _, t in chunk), 3)})
        prefills = [t for p, t in zip(self.passes, ms) if p["width"] > 1]
        return {"decoding_steps": len(decode), "tokens_sampled": sum(p["rows"] for p, _ in decode),
                "prefill_ms": [round(t, 2) for t in prefills], "decode_ms_total": round(sum(t for _, t in decode), 1),
                "decode_ms_by_context": table}


# --- stopping: a part's box, a SIGTERM from outside -----------------------------------------------------------
class Stopped(BaseException):
    """A SIGTERM from outside (a command's time limit): the part under way ends, the report is written, the
    script stops."""


class PartTimeout(Exception):
    """A part's box spent inside one long call (sampling, an evaluation, an update): raised from a forward pass."""


class Stops:
    """The part's time box, `with stops.box(seconds, model):`, and a SIGTERM from outside.

    Once the box is spent, `model`'s next forward raises PartTimeout (`forwards` counts them: a sampler's prefill,
    then one a decoding step); and a vapo.train under way is asked to stop after the step under way, with its
    checkpoint, as a scheduler asks it: the check sends itself a SIGTERM, once the run's StopRequest holds the
    signal (so never before the run has started; never replacing any of its functions). A SIGTERM from outside the
    check raises Stopped, or, inside vapo.train (whose StopRequest takes it and logs it: RunLog tells it from the
    check's own), stops the run after its step; no part starts after it, and the process ends within STOP_GRACE_S
    whatever it is doing. (A SIGTERM from outside in the very moment the box sends its own is counted as the box's.)"""

    def __init__(self):
        self.end, self.seconds, self.forwards, self.outside = math.inf, 0.0, 0, False
        self.sent = self.received = 0  # SIGTERMs the box sent; SIGTERMs received by either handler
        self.lock = threading.Lock()
        signal.signal(signal.SIGTERM, self._sigterm)

    @contextlib.contextmanager
    def box(self, seconds: float, model=None):
        self.end, self.seconds, self.forwards = time.perf_counter() + seconds, seconds, 0
        hook = model.register_forward_pre_hook(self._forward) if model is not None else None
        closed = threading.Event()
        asker = threading.Thread(target=self._ask_run_to_stop, args=(self.end, closed), daemon=True)
        asker.start()
        try:
            yield self
        finally:
            closed.set()
            asker.join()
            self.end = math.inf
            if hook is not None:
                hook.remove()

    def _forward(self, module, args):
        if time.perf_counter() >= self.end:
            raise PartTimeout(f"box of {self.seconds:.0f} s spent after {self.forwards} forward passes")
        self.forwards += 1

    def _ask_run_to_stop(self, end: float, closed: threading.Event):
        """At the box's end: a SIGTERM to this process as soon as a run's StopRequest handles it (its handler, not
        ours), once; nothing if the box closes first."""
        if closed.wait(None if math.isinf(end) else max(0.0, end - time.perf_counter())):
            return
        while not closed.wait(0.05):
            if signal.getsignal(signal.SIGTERM) != self._sigterm:  # a vapo.train under way holds the signal
                log.warning("box of %g s spent: asking the run to stop after its step", self.seconds)
                with self.lock:
                    self.sent += 1
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def _received_own(self) -> bool:
        with self.lock:
            self.received += 1
            return self.received <= self.sent

    def run_took_sigterm(self):
        """A run's StopRequest took a SIGTERM (RunLog saw its warning): the box's own, or one from outside."""
        if not self._received_own():
            self._from_outside()

    def _from_outside(self):
        if not self.outside:
            self.outside = True
            backstop = threading.Timer(STOP_GRACE_S, os._exit, (143,))  # the last word if the stop hangs
            backstop.daemon = True
            backstop.start()

    def _sigterm(self, signum, frame):
        if self._received_own():  # the box's, arriving after its run had already ended: nothing to stop
            return
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
    """The preset's Config at the check's shapes: MINI_BATCHES optimizer steps an RL step (so the update's
    micro-batches are not the scoring pass's, and the ratio of later mini-batches moves off 1, as in a run)."""
    mini = max(1, args.prompts_per_step * args.samples_per_prompt // MINI_BATCHES)
    over = dict(model=folder, dataset="builtin", steps=args.steps, prompts_per_step=args.prompts_per_step,
                samples_per_prompt=args.samples_per_prompt, max_new_tokens=args.max_new_tokens,
                mini_batch_size=mini, micro_batch_size=math.gcd(mini, PRESET["micro_batch_size"]),
                value_pretrain_steps=args.value_pretrain_steps, eval_prompts=0, eval_every=0, save_every=0,
                output_dir=run_dir, device=args.device, seed=args.seed, report_to="none")
    return vapo.Config(**{**PRESET, **over, **changes}).validate()


@dataclasses.dataclass
class Check:
    """What the parts share: the options, the device (and its peak), the model folder and its shape, the work
    folder, the observer's and the run log's records, the stops, the disk, each part's box and the results of the
    parts done so far."""
    args: argparse.Namespace
    device: torch.device
    folder: str
    config: object
    params: int
    workdir: str
    batches: Batches
    runlog: RunLog
    stops: Stops
    disk: dict
    boxes: dict
    peak_tflops: float | None = None
    done: dict = dataclasses.field(default_factory=dict)

    @property
    def run_dir(self) -> str:
        return os.path.join(self.workdir, "run")

    def train(self, phase: str, cfg, box_s: float, resume: bool = False) -> float:
        """vapo.train in the part's box, observed (Batches): it stops after the step under way once the box is
        spent. -> the seconds from the call until the run's models and engine were ready."""
        self.runlog.phase = phase
        t0 = time.perf_counter()
        with self.stops.box(box_s):
            vapo.train(cfg, resume=resume, hooks=self.batches.hooks(phase))
        return self.batches.ready.get(phase, {}).get("at", t0) - t0

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


def rl_records(run_dir: str) -> list[dict]:
    return [r for r in common.read_records(run_dir) if "step" in r and "time/step" in r]


def steps_done(run_dir: str) -> int:
    return len(rl_records(run_dir))


def gaps(records: list[dict]) -> list[dict]:
    """The sampler's log-probs against the trainer's recomputation, per RL step: mean and largest gap."""
    return [{"mean": r.get("sampler_logprob_gap_mean"), "max": r.get("sampler_logprob_gap_max")} for r in records]


def left_padded(rows: int, width: int, tokens: int, device, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, width] random ids and their mask, left-padded as the trainer's prompts are: row i holds
    width - i * width // (2 * rows) tokens (from the whole width down to about half)."""
    lengths = [width - i * width // (2 * rows) for i in range(rows)]
    mask = (torch.arange(width)[None, :] >= width - torch.tensor(lengths)[:, None]).long()  # [rows, width]
    ids = torch.randint(0, tokens, (rows, width), generator=generator) * mask
    return ids.to(device), mask.to(device)


# --- the parts ------------------------------------------------------------------------------------------------
def update_part(c: Check, box_s: float) -> dict:
    """vapo.update at the preset's full length on one micro-batch of rows whose responses all run to the end (the
    update's worst case) after left-padded prompts (the trainer's layout: the masked attention kernel), the old
    log-probs and values from a scoring pass first (timed); returns of +1 and -1 on alternate rows, advantages
    returns - values (GAE at lambda 1). Repeated while the box lasts, at most update_repeats; a box that ends an
    update midway ends the part, with the repeats done so far. The first repeat's statistics are those of a first
    mini-batch: its ratio differs from 1 only by the scoring pass's and the update's rounding."""
    a, device = c.args, c.device
    cfg = run_config(a, c.folder, os.path.join(c.workdir, "run-update"), max_new_tokens=a.update_new_tokens,
                     mini_batch_size=UPDATE_ROWS, micro_batch_size=UPDATE_ROWS, fp32_lm_head=a.fp32_lm_head)
    policy, critic, tokenizer = load_models(cfg, device, c.folder)
    optimizers = {"policy": vapo.make_optimizer(policy, cfg.actor_lr, cfg),
                  "critic": vapo.make_optimizer(critic, cfg.critic_lr, cfg)}
    rows, prompt, response = UPDATE_ROWS, a.update_prompt_tokens, a.update_new_tokens
    g = torch.Generator().manual_seed(0)
    prompt_ids, prompt_mask = left_padded(rows, prompt, len(tokenizer), device, g)
    rollout = Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                      response_ids=torch.randint(0, len(tokenizer), (rows, response), generator=g).to(device),
                      response_mask=torch.ones(rows, response, dtype=torch.long, device=device),
                      lengths=torch.full((rows,), response, device=device),
                      truncated=torch.ones(rows, dtype=torch.bool, device=device),
                      sampler_logprobs=torch.zeros(rows, response, device=device),
                      prompt_index=torch.arange(rows, device=device), texts=[""] * rows,
                      pad_id=tokenizer.pad_token_id)
    with measure(device) as scoring, vapo.autocast(cfg, device):
        scored = score_rollout(policy, critic, rollout, cfg.micro_batch_size, cfg.temperature)
    returns = torch.where(torch.arange(rows, device=device) % 2 == 0, 1.0, -1.0)[:, None].expand(rows, response)
    batch = {"old_logprobs": scored["old_logprobs"], "values": scored["values"], "returns": returns,
             "advantages": returns - scored["values"], "positive": returns[:, 0] > 0}
    flops, tokens = 6 * (n_params(policy) + n_params(critic)), int(prompt_mask.sum()) + rows * response
    repeats, stopped, t_part = [], None, time.perf_counter()
    with c.stops.box(box_s, policy):
        while len(repeats) < a.update_repeats and (not repeats or time.perf_counter() - t_part < box_s):
            try:
                with measure(device) as m:
                    stats = vapo.update(policy, critic, optimizers, rollout, batch, cfg)
            except PartTimeout as err:
                stopped = str(err)
                break
            tflops = flops * tokens / m["seconds"] / 1e12
            repeats.append({**m, "seconds": round(m["seconds"], 3), "tokens_per_s": tokens / m["seconds"],
                            "tflops": tflops, "mfu": tflops / c.peak_tflops if c.peak_tflops else None,
                            "skipped_nonfinite": stats["skipped_nonfinite"],
                            "ratio": {k: stats.get(k) for k in ("ratio_mean", "clip_frac", "approx_kl")}})
    timed = repeats[1:] or repeats  # the first includes AdamW's first step (its moments allocated) and warm-up
    reserved = [r["peak_reserved_gb"] for r in repeats if r["peak_reserved_gb"] is not None]
    med = lambda key: statistics.median(r[key] for r in timed) if timed and timed[0][key] is not None else None  # noqa
    return {"rows": rows, "prompt_tokens": prompt, "prompt_lengths": prompt_mask.sum(1).tolist(),
            "response_tokens": response, "tokens_per_update": tokens, "fp32_lm_head": cfg.fp32_lm_head,
            "scoring": {**scoring, "seconds": round(scoring["seconds"], 3)}, "repeats": repeats,
            "repeats_done": len(repeats), "stopped_at_box": stopped,
            "tokens_per_s": med("tokens_per_s"), "tflops": med("tflops"), "mfu": med("mfu"),
            "peak_gb": max((r["peak_gb"] for r in repeats), default=None),
            "peak_reserved_gb": max(reserved, default=None),
            "arithmetic_update_gb": memory_arithmetic(c.params, c.config, README["rows"], rows, prompt + response,
                                                      response)["update_peak_gb"],
            "docs_measured_update_gb": None if a.tiny else README["update_measured_gb"],
            "first_minibatch": repeats[0]["ratio"] if repeats else None}


def train_part(c: Check, box_s: float) -> dict:
    """vapo.train on the model folder (MINI_BATCHES optimizer steps an RL step), stopped after the step under way
    once its box is spent; its records kept in --out (train-metrics.jsonl) and summarised per RL step (summarise)."""
    cfg = run_config(c.args, c.folder, c.run_dir, fp32_lm_head=c.args.fp32_lm_head)
    ready_s = c.train("train", cfg, box_s)
    records = common.read_records(c.run_dir)
    pretrain = [r for r in records if "value_pretrain_step" in r]
    return {"steps_done": steps_done(c.run_dir), "run_setup_s": round(ready_s, 2),
            "value_pretrain_steps_done": len(pretrain),
            "value_pretrain_s": round(sum(r["time/step"] for r in pretrain), 2) if pretrain else None,
            "mini_batches_per_step": cfg.batch_size // cfg.mini_batch_size, "fp32_lm_head": cfg.fp32_lm_head,
            **summarise(c, cfg, "train", rl_records(c.run_dir)),
            "metrics": keep_metrics(c.run_dir, c.args.out, "train-metrics.jsonl")}


def numerics_part(c: Check, box_s: float) -> dict:
    """The log-prob gap between the sampler (one token a step, KV cache: the HF engine as a run has it, the grouped
    decode attention on a GPU) and the trainer's scoring pass (whole sequences), under the preset's bf16 autocast,
    on the model with peaked logits: its final norm scaled so that the median largest logit is PEAKED_LOGIT, a
    trained model's range, where bf16's spacing is 0.06-0.125 (the random model's logits have a std of about 0.6).
    Twice: the LM head in bf16 (as autocast runs it) and in float32 (--fp32-lm-head): the gap's mean, p99 and max
    over the response tokens of each. Then, from the train and update parts' records (no device time): the gap per
    RL step at the random model's logits, each step's PPO ratio over its MINI_BATCHES mini-batches (the later ones
    after optimizer steps: off 1) and the update part's first mini-batch (off 1 by rounding alone)."""
    a, cfg = c.args, run_config(c.args, c.folder, c.run_dir)
    policy, tokenizer = c.hf_policy()
    prompts = [r["prompt"] for r in load_data(cfg, tokenizer)[0][:a.numerics_prompts]]
    engine = engines.HFEngine(policy, tokenizer, max_new_tokens=a.numerics_new_tokens)
    with torch.no_grad(), vapo.autocast(cfg, c.device):
        ids = tokenizer(prompts, return_tensors="pt", padding=True).to(c.device)
        largest = policy(**ids).logits.float().amax(-1)[ids["attention_mask"].bool()]  # [real tokens]
        scale = PEAKED_LOGIT / float(largest.median())
        policy.model.norm.weight.mul_(scale)  # logits = head(norm(h)): every logit scaled by `scale`
        largest = policy(**ids).logits.float().amax(-1)[ids["attention_mask"].bool()]
    out = {"prompts": len(prompts), "samples_per_prompt": cfg.samples_per_prompt, "new_tokens": a.numerics_new_tokens,
           "logit_scale": round(scale, 3), "largest_logit": {"median": float(largest.median()),
                                                              "max": float(largest.max())},
           "grouped_decode": engine.grouped_decode}
    with c.stops.box(box_s, policy):
        for head in ("bf16_head", "fp32_head"):
            if head == "fp32_head":
                float32_head(policy)
            try:
                with measure(c.device) as m, vapo.autocast(cfg, c.device):
                    r = engine.generate(prompts, n=cfg.samples_per_prompt, seed=a.seed)
                    old = score_rollout(policy, None, r, cfg.micro_batch_size, cfg.temperature)["old_logprobs"]
            except PartTimeout as err:
                out[head] = {"stopped_at_box": str(err)}
                break
            gap = (old - r.sampler_logprobs).abs()[r.response_mask.bool()]  # [response tokens]
            out[head] = {"tokens": gap.numel(), "seconds": round(m["seconds"], 2), **quantiles(gap)}
    kept = os.path.join(a.out, "train-metrics.jsonl")
    records = [r for r in common.read_jsonl(kept) if "step" in r and "time/step" in r] if os.path.exists(kept) else []
    keys = ("ratio_mean", "clip_frac", "clip_frac_low", "clip_frac_high", "approx_kl")
    return out | {"bf16": cfg.bf16, "sampler_logprob_gap": [{"step": r["step"], **g} for r, g in
                                                           zip(records, gaps(records))],
                  "ratio_per_step": [{"step": r["step"], **{k: r.get(k) for k in keys}} for r in records],
                  "first_minibatch": c.done.get("update", {}).get("first_minibatch")}


def resume_part(c: Check, box_s: float) -> dict:
    """vapo.train --resume on the train part's folder for one RL step more: the checkpoint read back (weights,
    AdamW states, RNG: timed by the run, from its log) and trained on. The run folder is deleted after it."""
    if c.done.get("train", {}).get("status") != "ok":
        return {"skipped": "needs the train part's run folder"}
    before = steps_done(c.run_dir)
    try:
        cfg = dataclasses.replace(run_config(c.args, c.folder, c.run_dir, fp32_lm_head=c.args.fp32_lm_head),
                                  steps=before + 1)
        c.train("resume", cfg, box_s, resume=True)
        load = next((s for s in c.runlog.loads if s["phase"] == "resume"), {})
        records = rl_records(c.run_dir)
        return {"steps_before": before, "steps_after": len(records),
                "load_checkpoint_s": round(load["seconds"], 2) if load else None,
                "checkpoints": c.runlog.saved("resume"),
                "sampler_logprob_gap": gaps([r for r in records if r["step"] == before + 1]),
                "metrics": keep_metrics(c.run_dir, c.args.out, "train-metrics.jsonl")}
    finally:
        shutil.rmtree(c.run_dir, ignore_errors=True)


def decode_attention(c: Check, shapes: str, steps: int = 5) -> list[dict]:
    """ms per call of one attention layer of the model's shape at a decode step (one new token a row, a cache of
    `context` columns, rows left-padded down to half the context), transformers' "sdpa" (K and V copied to every
    query head) against decoding's grouped attention, under the run's autocast: median of `steps` after one."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, Qwen2RotaryEmbedding
    config, out = model_config(task.build_tokenizer(), c.args.tiny), []
    config._attn_implementation = "sdpa"
    layer = Qwen2Attention(config, layer_idx=0).to(c.device).eval()
    rotary, head_dim = Qwen2RotaryEmbedding(config).to(c.device), config.hidden_size // config.num_attention_heads
    cfg = run_config(c.args, c.folder, c.run_dir)
    decoding.register()

    class Cache:  # exactly `context` columns; each call writes its token into the last
        def __init__(self, rows, context, g):
            shape = (rows, config.num_key_value_heads, context, head_dim)
            dtype = torch.bfloat16 if cfg.bf16 else torch.float32  # the sampler's cache stores autocast's dtype
            self.k, self.v = (torch.randn(shape, generator=g).to(c.device, dtype) for _ in range(2))

        def update(self, key, value, *args, **kwargs):
            self.k[:, :, -1:], self.v[:, :, -1:] = key, value
            return self.k, self.v
    for shape in shapes.split(","):
        rows, context = map(int, shape.split("x"))
        g = torch.Generator().manual_seed(1)
        cache, lengths = Cache(rows, context, g), torch.randint(context // 2, context + 1, (rows,), generator=g)
        mask = (torch.arange(context)[None, :] >= context - lengths[:, None])[:, None, None, :].to(c.device)
        hidden = torch.randn(rows, 1, config.hidden_size, generator=g).to(c.device)
        position = rotary(hidden, (lengths - 1)[:, None].to(c.device))
        row = {"rows": rows, "context": context}
        for name in ("sdpa", decoding.GROUPED):
            config._attn_implementation = name
            times = []
            with torch.no_grad(), vapo.autocast(cfg, c.device):
                for _ in range(steps + 1):
                    sync(c.device)
                    t0 = time.perf_counter()
                    layer(hidden, position, mask, past_key_values=cache)
                    sync(c.device)
                    times.append((time.perf_counter() - t0) * 1e3)
            row[f"{name}_ms"] = round(statistics.median(times[1:]), 3)
        out.append(row | {"speedup": round(row["sdpa_ms"] / row[f"{decoding.GROUPED}_ms"], 2)})
        del cache
        free_device(c.device)
    return out


def sample_part(c: Check, box_s: float) -> dict:
    """One HFEngine.generate at the preset's shape (sample_prompts x the preset's 8 samples, left-padded prompts,
    up to sample_new_tokens) under the run's autocast, with the engine's defaults (on a GPU: the preallocated KV
    cache and the grouped decode attention), not cut: its cache is preallocated for the whole length at the first
    forward, so the sampling peak is measured however far it gets; the box ends it in the forward, and the counts
    so far are kept (DecodeClock: decoding steps, tokens, ms per decode step against rows x context). Before it, a
    few calls of one attention layer at decode shapes, transformers' SDPA against the grouped attention."""
    a, n = c.args, PRESET["samples_per_prompt"]
    attention = decode_attention(c, a.decode_shapes)
    policy, tokenizer = c.hf_policy()
    ragged_eos(policy, tokenizer, 2 / a.sample_new_tokens, a.seed)  # lengths for this length, not the train part's
    engine = engines.HFEngine(policy, tokenizer, max_new_tokens=a.sample_new_tokens)
    cfg = run_config(a, c.folder, c.run_dir, prompts_per_step=a.sample_prompts, max_new_tokens=a.sample_new_tokens)
    prompts = [r["prompt"] for r in load_data(cfg, tokenizer)[0][:a.sample_prompts]]
    prompt_lengths = [len(ids) for ids in tokenizer(prompts)["input_ids"]]
    out, stopped, clock = None, None, DecodeClock(policy, c.device)
    with measure(c.device) as m, c.stops.box(box_s, policy):
        try:
            with vapo.autocast(cfg, c.device):
                out = engine.generate(prompts, n=n, seed=a.seed)
        except PartTimeout as err:
            stopped = str(err)
    clock.remove()
    steps = clock.summary()
    arithmetic = memory_arithmetic(c.params, c.config, len(prompts) * n, PRESET["micro_batch_size"],
                                   max(prompt_lengths) + a.sample_new_tokens)
    result = {"prompts": len(prompts), "samples_per_prompt": n, "max_new_tokens": a.sample_new_tokens,
              "prompt_lengths": {"min": min(prompt_lengths), "max": max(prompt_lengths)},
              "grouped_decode": engine.grouped_decode, "preallocated_cache": decoding.on_fast_path(c.device),
              **m, "seconds": round(m["seconds"], 2), "stopped_at_box": stopped, **steps,
              "tokens_per_s": (int(out.lengths.sum()) if out is not None else steps["tokens_sampled"]) / m["seconds"],
              "decode_attention": attention,
              # this part holds the float32 policy and the cache; a run's sampling peak adds the critic and AdamW
              "arithmetic_gb": round(4 * c.params / 1e9 + arithmetic["items_gb"]["kv_cache"], 2),
              "arithmetic_in_a_run_gb": arithmetic["sampling_peak_gb"]}
    if out is not None:
        lengths = out.lengths.float()
        result |= {"rows": out.B, "tokens": int(out.lengths.sum()),
                   "lengths": {"min": int(lengths.min()), "median": float(lengths.median()),
                               "max": int(lengths.max()), "truncated_frac": round(float(out.truncated.float().mean()),
                                                                                   3)}}
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
    it), observed (Batches: its fallback checkpoint deleted once a step is under way), its peak memory and its
    checkpoints' figures (the run's log) written to record as JSON at the end."""
    from scale import train as scale_train
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runlog, batches = RunLog().attach(), Batches(device)
    m = {}
    try:
        with measure(device) as m:
            scale_train.main(argv, hooks=batches.hooks("sharded"))
    finally:
        run_dir, seen = batches.ready.get("sharded", {}).get("run_dir"), {b["step"] for b in batches.of("sharded")}
        phases = [v for r in (common.read_records(run_dir) if run_dir else []) if r.get("step") in seen
                  for k, v in r.items() if k.startswith("memory/") and k.endswith("_peak_gb")]  # this process's steps
        if m.get("peak_gb") is not None:  # the run's phases reset torch's peak counters: the larger of the two
            m["peak_gb"] = max([m["peak_gb"], *phases])
        common.write_json(record, {"peak_gb": m.get("peak_gb"), "peak_reserved_gb": m.get("peak_reserved_gb"),
                                   "world_size": 1, "checkpoints": runlog.saved("setup"),
                                   "checkpoint_loaded": [{k: round(v, 3) if isinstance(v, float) else v
                                                          for k, v in s.items() if k != "phase"}
                                                         for s in runlog.loads]})


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
    an upper bound); where that speed is unknown, the box ends it in the forward, and the counts so far are kept."""
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
    clock = DecodeClock(policy, c.device)
    try:
        with measure(c.device) as m, c.stops.box(math.inf if speed else box_s, policy):
            result = vapo.evaluate(engine, held_out, cfg, run.verifier_for(cfg))
    except PartTimeout as err:
        steps = clock.summary()
        return {"prompts": prompts, "asked": a.eval_prompts, "stopped_at_box": str(err),
                "decoding_steps": steps["decoding_steps"], "tokens_sampled": steps["tokens_sampled"]}
    finally:
        clock.remove()
    tokens = sum(result[f"eval/response_len_{name}"] * prompts * n
                 for name, n in ((f"avg@{cfg.eval_samples}", cfg.eval_samples), ("greedy", 1)))
    return {"prompts": prompts, "asked": a.eval_prompts, "eval_samples": cfg.eval_samples,
            "rows_per_pass": (cfg.eval_batch_size or max(1, cfg.batch_size // cfg.eval_samples)) * cfg.eval_samples,
            "seconds": round(m["seconds"], 2), "box_s": round(box_s, 1), "tokens_per_s": tokens / m["seconds"],
            "result": result}


def vllm_part(c: Check, box_s: float) -> dict:
    """vapo.train with --engine vllm for vllm_steps steps, in its box: the engine's start (with the models' loading:
    until the run's observers are made), each step's generation and update (the run's records), what the rest of
    the step took (the weights' sync into the engine, its sleep and wake-up, the scoring pass), and the device
    memory in use while the engine idles (the observer's)."""
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vllm is not installed on this machine"}
    cfg = run_config(c.args, c.folder, os.path.join(c.workdir, "run-vllm"), engine="vllm", steps=c.args.vllm_steps)
    t0 = time.perf_counter()
    ready_s = c.train("vllm", cfg, box_s)
    records = rl_records(cfg.output_dir)
    summary = summarise(c, cfg, "vllm", records)
    shutil.rmtree(cfg.output_dir, ignore_errors=True)
    return {"seconds": round(time.perf_counter() - t0, 1), "box_s": round(box_s, 1), "steps_done": len(records),
            "setup_and_engine_start_s": round(ready_s, 2),
            "generation_tokens_per_s": summary["generation"]["tokens_per_s"], "steps": summary["steps"]}


def summarise(c: Check, cfg, phase: str, records: list[dict]) -> dict:
    """A run's figures per RL step, from its records (time/ and, on a GPU, memory/ of each phase) and the observer's
    (tokens, lengths): generation and update tokens a second, the update's TFLOP/s and MFU, each phase's peak, and
    what the step spent outside its timed phases (the observers, an engine's weight sync); their medians; the
    checkpoints (the run's log) and the memory arithmetic at this run's shapes."""
    seen = {b["step"]: b for b in c.batches.of(phase)}
    counted = c.batches.ready.get(phase, {}).get("params") or {"policy": c.params, "critic": c.params}
    flops_per_token = 6 * (counted["policy"] + counted["critic"])
    phases = ("rollout", "reward", "score", "advantages", "update")
    steps = []
    for r in records:
        b = seen.get(r["step"])
        if b is None:
            continue
        update_s, generate_s = r.get("time/update"), r.get("time/rollout")
        tflops = flops_per_token * b["tokens"] * cfg.ppo_epochs / update_s / 1e12 if update_s else None
        steps.append({"step": r["step"], "generate_s": generate_s, "generated_tokens": b["generated_tokens"],
                      "generation_tokens_per_s": b["generated_tokens"] / generate_s if generate_s else None,
                      "lengths": b["lengths"], "score_s": r.get("time/score"), "update_s": update_s,
                      "update_tokens": b["tokens"] * cfg.ppo_epochs,
                      "update_tokens_per_s": b["tokens"] * cfg.ppo_epochs / update_s if update_s else None,
                      "update_tflops": tflops, "mfu": tflops / c.peak_tflops if tflops and c.peak_tflops else None,
                      "step_s": r["time/step"], "outside_phases_s": r["time/step"] - sum(
                          r.get(f"time/{p}", 0.0) for p in phases),
                      "peaks_gb": {p: r.get(f"memory/{p}_peak_gb") for p in phases if f"memory/{p}_peak_gb" in r},
                      "reserved_gb": {p: r.get(f"memory/{p}_reserved_gb") for p in phases
                                      if f"memory/{p}_reserved_gb" in r},
                      **({"device_used_gb": b["device_used_gb"]} if "device_used_gb" in b else {})})

    def med(key):
        values = [s[key] for s in steps if s[key] is not None]
        return statistics.median(values) if values else None

    def peaks(key):
        return {p: max((s[key][p] for s in steps if p in s[key]), default=None) for p in phases} if steps else {}
    longest = max((b["prompt_width"] + b["response_width"] for b in seen.values()), default=cfg.max_new_tokens)
    last = seen[max(seen)] if seen else {}
    return {"params": counted, "steps": steps,
            "generation": {"tokens_per_s": med("generation_tokens_per_s"), "rows": last.get("rows"),
                           "response_width": last.get("response_width")},
            "update": {"tokens_per_s": med("update_tokens_per_s"), "tflops": med("update_tflops"), "mfu": med("mfu"),
                       "peak_tflops": c.peak_tflops, "flops_per_token": flops_per_token},
            "peaks_gb": peaks("peaks_gb"), "peaks_reserved_gb": peaks("reserved_gb"),
            "checkpoints": c.runlog.saved(phase),
            "checkpoint_s": [s["seconds"] for s in c.runlog.saved(phase)],
            "checkpoint_gb": [round(s["bytes"] / 1e9, 3) for s in c.runlog.saved(phase)],
            "scoring_s": [s["score_s"] for s in steps],
            "arithmetic_this_run": memory_arithmetic(c.params, c.config, cfg.batch_size, cfg.micro_batch_size,
                                                     longest)}


WORK = dict(update=update_part, train=train_part, numerics=numerics_part, resume=resume_part, sample=sample_part,
            sharded=sharded_part, evaluate=evaluation_part, vllm=vllm_part)


# --- the plan, the report, each part in its box ---------------------------------------------------------------
def plan(budget_s: float, with_vllm: bool) -> dict:
    """Each part's box in seconds: PLAN_S where vLLM is installed, else PLAN_WITHOUT_VLLM_S (its share given to
    the other parts), scaled to budget_s."""
    return {name: s * budget_s / PLAN_TOTAL_S for name, s in (PLAN_S if with_vllm else PLAN_WITHOUT_VLLM_S).items()}


def guarded(c: Check, name: str, box_s: float) -> dict:
    """A part's work, unless it cannot be done: no time left before the deadline, or no room on the disk (read
    again now: what the parts before it left) for the checkpoints it writes (the reason is its result)."""
    if c.boxes[name] > 0 and box_s < MIN_BOX_S * min(1.0, c.args.budget_s / PLAN_TOTAL_S):
        return {"skipped": f"{box_s:.0f} s left before the deadline of {c.args.deadline_s:g} s"}
    free = shutil.disk_usage(c.workdir).free
    need = disk_need(c.params)["checkpoints"]
    if name in CHECKPOINT_PARTS and free < need:
        return {"skipped": f"the work folder has {free / 1e9:.1f} GB free, its checkpoints need "
                           f"{need / 1e9:.1f} GB (--workdir elsewhere)", "disk_free_gb": round(free / 1e9, 1)}
    return {"disk_free_gb": round(free / 1e9, 1), **WORK[name](c, box_s)}


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
        # a run's phases reset torch's peak counters (run.timed): the part's peaks are the larger of the two
        for key, phases in (("peak_gb", "peaks_gb"), ("peak_reserved_gb", "peaks_reserved_gb")):
            values = [v for v in [m[key], *result.get(phases, {}).values()] if v is not None]
            m[key] = max(values, default=None)
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
    """The model folder built (timed), one fsynced write timed, the run log read."""
    t0 = time.perf_counter()
    folder = os.path.join(workdir, "model")
    config, params = build_model_folder(folder, args.tiny, device, args.seed, args.max_new_tokens)
    free_device(device)
    report.data["model"] = {"params_policy": params,
                            "config": {**{k: getattr(config, k, None) for k in QWEN25_05B},  # rope_theta moved into
                                       "rope_parameters": getattr(config, "rope_parameters", None)}}  # transformers 5
    report.data["setup_s"] = round(time.perf_counter() - t0, 1)
    report.data["disk_write"] = write_probe(workdir, args.write_probe_mb)
    report.save()
    return Check(args=args, device=device, folder=folder, config=config, params=params, workdir=workdir,
                 batches=Batches(device), runlog=RunLog(stops).attach(), stops=stops, disk=report.data["workdir"],
                 boxes=boxes, peak_tflops=report.data["device_info"]["peak_bf16_tflops"])


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
    p.add_argument("--fp32-lm-head", action="store_true", help="the update, train and resume parts with the "
                                                               "trainer's --fp32-lm-head (the numerics part "
                                                               "measures both heads either way)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the GPU's dense bf16 peak, for MFU (default: by the device's name, e.g. 989 for an H100 "
                        "SXM or H200, 756 for an H100 PCIe; none on a CPU: no MFU)")
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
                               "device_info": device_info(device, args.peak_tflops),
                               "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                                            **{n: version(n) for n in ("transformers", "accelerate", "vllm")}},
                               "tiny": args.tiny, "args": vars(args),
                               "plan": {"boxes_s": {k: round(v, 1) for k, v in boxes.items()},
                                        "deadline_s": args.deadline_s, "vllm_installed": with_vllm}})
    os.makedirs(args.workdir or tempfile.gettempdir(), exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="gpu_check-", dir=args.workdir)
    status, check = "complete", None
    try:
        try:
            shape = {**QWEN25_05B, **(TINY if args.tiny else {})}
            report.data["workdir"] = check_disk(workdir, disk_need(counts(shape)["policy"]))  # before any build
            report.save()
            check = setup(args, device, workdir, report, boxes, stops)
        except (Exception, SystemExit) as err:  # noqa: BLE001  (recorded, not lost: no part can run without it)
            status = "failed"
            report.data["setup_error"] = {"error": f"{type(err).__name__}: {err}",
                                          "traceback": traceback.format_exc()}
            log.error("setup failed: %s", report.data["setup_error"]["error"])
        for name in [p for p in PARTS if p in args.parts and check is not None]:
            if stops.outside:
                break
            check.done[name] = run_part(check, name, report)
            if name == "train" and ("resume" not in args.parts or check.done[name]["status"] != "ok"):
                shutil.rmtree(check.run_dir, ignore_errors=True)  # no resume will read it: the disk back
    except Stopped:
        pass
    finally:
        if check is not None:
            logging.getLogger("vapo").removeHandler(check.runlog)
        report.save("stopped" if stops.outside else status)
        if not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    write_summary(report)
    if stops.outside:
        raise SystemExit(143)
    if status == "failed" or any(p["status"] == "failed" for p in report.data["parts"].values()):
        raise SystemExit(1)  # every part has run; the report says which failed and why


SUMMARY = dict(  # the figures on each part's summary line (a dot goes into a dict); the JSON has them all
    update="rows prompt_tokens response_tokens repeats_done tokens_per_s tflops mfu peak_gb peak_reserved_gb "
           "arithmetic_update_gb",
    train="value_pretrain_steps_done steps_done mini_batches_per_step generation.tokens_per_s update.tokens_per_s "
          "update.mfu peaks_gb checkpoint_s checkpoint_gb",
    numerics="largest_logit bf16_head fp32_head first_minibatch",
    resume="steps_before steps_after load_checkpoint_s",
    sample="prompts samples_per_prompt max_new_tokens grouped_decode stopped_at_box decoding_steps tokens_sampled "
           "tokens_per_s lengths peak_gb arithmetic_gb arithmetic_in_a_run_gb",
    sharded="steps_after_first steps_after_resume first.returncode resume.returncode first.peak_gb resume.peak_gb "
            "checkpoint_holds",
    evaluate="prompts asked stopped_at_box eval_samples tokens_per_s",
    vllm="steps_done setup_and_engine_start_s generation_tokens_per_s")


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
    """gpu_check.txt and the printed summary: the device, the docs' arithmetic, then one line a part (SUMMARY's
    figures)."""
    d = report.data
    docs = memory_arithmetic(494_032_768, model_config(task.build_tokenizer(), False), README["rows"],
                             README["micro"], README["seq"], README["response"])
    info = d.get("device_info", {})
    lines = [f"machine: {d['machine']}", f"date: {d['date']}; {d['wall_s']:.0f} s in all ({d['status']}); setup "
             f"{d.get('setup_s', 0):.0f} s; {', '.join(f'{k} {v}' for k, v in d['versions'].items())}",
             f"device: {fmt({k: v for k, v in info.items() if k != 'type'})}; disk write {fmt(d.get('disk_write'))}",
             f"docs/scaling.md arithmetic ({README['rows']} rows, micro-batch {README['micro']} x {README['seq']} "
             f"tokens, {README['response']} logit columns): update {docs['update_peak_gb']:.1f} GB, sampling "
             f"{docs['sampling_peak_gb']:.1f} GB (the docs say {README['update_gb']} and {README['sampling_gb']}; "
             f"measured with fake tensors: update {README['update_measured_gb']} GB)"]
    if "setup_error" in d:
        lines.append(f"setup: failed; {d['setup_error']['error']}")
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
