"""Check on one GPU, offline: a few RL steps of `--preset gpu-0.5b` on a model of Qwen2.5-0.5B's shape, with
throughput, model FLOPs utilisation and peak memory against docs/performance.md's arithmetic.

    python bench/gpu_check.py --out DIR                         # the whole check, about 9 minutes; DIR gets the report
    python bench/gpu_check.py --budget-s 300 --out DIR          # the whole check in about 5 minutes
    python bench/gpu_check.py --parts train resume sample       # leave out the evaluation and the vLLM engine
    python bench/gpu_check.py --tiny --device cpu --steps 1     # a 2-layer version on a CPU (the test)

On a machine whose python has only torch, transformers, accelerate, safetensors, tokenizers, matplotlib and tqdm
(no math-verify, datasets or vLLM, no network): `python bench/gpu_check.py --out DIR` runs every part but vLLM's,
which says it was skipped. The built-in task scores with its exact integer check, so nothing here needs
math-verify or datasets. DIR/gpu_check.json holds the figures, DIR/gpu_check.txt the printed summary.

Five parts, each in its share of --budget-s (default 540 s, so that the check fits 10 minutes with the model's
build; train 35%, resume 10%, sample 15%, evaluation 10%, vLLM 30%), each reported with its seconds and peak memory:
- train: vapo.train for --value-pretrain-steps critic-only steps (default 1: value pretraining's own path) and
  --steps RL steps (below), with checkpoints after pretraining and at the end; it stops after the step under way
  once its share is spent;
- resume: vapo.train --resume on that run folder for one more RL step: the checkpoint read back (weights,
  AdamW states, RNG) and trained on, timed;
- sample: one HFEngine.generate at the preset's own shapes (64 prompts x 8 samples, 2,048 new tokens: the
  sampling peak of docs/performance.md), with max_new_tokens cut to what the train part's generation speed says
  fits its share (the report says so);
- evaluate: vapo.evaluate over --eval-prompts held-out prompts (avg@k and greedy, in the bounded passes a run
  uses) with the HF engine on the same model; the prompts are cut to what the train part's generation speed says
  fits its share, and the report says so;
- vllm: where vLLM is installed, vapo.train again for --vllm-steps steps with --engine vllm: the engine's start,
  its generation, its sleep during the update and the weight sync after it (wake the weights, write them, wake
  the KV cache), timed one by one, with the device memory in use after each (vLLM's memory pool is not torch's,
  so torch's peak counters do not see it). Skipped, and said, where vLLM is not installed.

No download: the model is built here from a Qwen2Config of Qwen2.5-0.5B's shape (QWEN25_05B: hidden
896, 24 layers, 14 attention heads and 2 KV heads of 64 dimensions, intermediate 4864, vocabulary 151,936, tied
embeddings; 494,032,768 parameters, the published 0.49B) with random weights, saved with the built-in task's
byte-level tokenizer (task.build_tokenizer(), 257 tokens; EOS = pad = id 256) into a temporary folder, and
that folder is the run's --model. Prompts use the small tokenizer's ids, which are valid ids of the large
vocabulary; sampled ids beyond the tokenizer's 257 decode to nothing; every reward is -1 (no learning to speak
of). Ragged lengths: a random model would almost never sample EOS (1 in 151,936), so ragged_eos makes about
2 / --max-new-tokens of the vocabulary stop tokens (the generation config's eos_token_id list, as an instruct
model's <|im_end|> and <|endoftext|> are): responses of every length, e^-2 = 14% of them expected to run to
--max-new-tokens (the longest micro-batch, the update's worst case, still runs to it), rows leaving the
sampler's batch on the way (its compaction) as in a real run.

It runs `vapo.train` end to end on that folder with the built-in dataset: Config = PRESETS["gpu-0.5b"] (bf16
autocast, gradient checkpointing, micro-batches of 4, mini-batches of 128) with --steps, --prompts-per-step,
--samples-per-prompt and --max-new-tokens, no held-out evaluation (--eval-prompts 0), checkpoints after value
pretraining and at the end only (the real path: policy, critic and AdamW states, written, synced and read back).
To measure, it wraps (times, synchronising the GPU, and takes the peak memory of) HFEngine.generate,
vapo.pretrain_value, rollout.score_rollout, vapo.update, checkpoints.save_checkpoint and checkpoints.load_checkpoint
(where run.py imported them) while train runs; nothing else is changed.

Reports, per RL step and in summary (medians over the steps; the first step includes CUDA's start-up):
- generation tokens per second: response tokens generated (EOS included) / seconds of HFEngine.generate, and the
  lengths sampled (shortest, median, longest, the share cut at max_new_tokens);
- update tokens per second: (prompt + response tokens) x ppo_epochs / seconds of vapo.update;
- MFU of the update: 6 x (policy + critic parameters) x update tokens / seconds / --peak-tflops (default 989,
  the H100/H200 SXM datasheet's dense bf16 figure). 6 N per token is the usual model-FLOPs convention: it
  counts the embedding matrix in both models (the critic has no LM head, and the policy's runs only on response
  positions, so this over-counts a little), and leaves out attention's quadratic term and the recomputation of
  gradient checkpointing;
- peak memory (torch.cuda.max_memory_allocated, reset before each call) of sampling, scoring, the update and
  checkpointing, the largest of them as the run's peak, against docs/performance.md's arithmetic ("One GPU, 0.5B: memory
  arithmetic": 33 GB at an update of micro-batch 4 x 2,300 tokens, 30 GB sampling 512 x 2,300 tokens, which
  memory_arithmetic reproduces), and the same arithmetic at this run's shapes (sequence = prompt width +
  response width); each part's own peak; what torch still holds once train() has returned (its models should be
  gone). GB here are 1e9 bytes, as in the docs. On a CPU the peak resident set instead.

A part's time box works through the stop a scheduler sends: once the share is spent the script sends itself
SIGTERM as soon as vapo.train's loop handles it, which train takes as a scheduler's stop (after the step under
way, with a checkpoint), so a time-boxed run still reports (--stop-after-s sets the train part's box itself).
Writes gpu_check.json and gpu_check.txt into --out (default runs/gpu_check) and prints the summary.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import logging
import math
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time

import torch

import common  # (puts the repository on the path)
import engines
import run
import task
import vapo
from common import QWEN25_05B, PeakMemory, n_params, sync
from config import PRESETS
from data import load_data

# --tiny: heads of the real 64 dimensions with grouped KV (4 heads, 2 KV heads: a head size vLLM's CPU attention
# supports), 2 layers, a 4,096-token vocabulary (still larger than the tokenizer's, as in the full check), so a
# CPU runs a step in seconds.
TINY = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            intermediate_size=1024, vocab_size=4096)
TINY_RUN = dict(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=16, eval_prompts=2, vllm_steps=1,
                sample_prompts=4, sample_new_tokens=32)
SHARES = dict(train=0.35, resume=0.10, sample=0.15, evaluate=0.10, vllm=0.30)  # of --budget-s

# docs/performance.md's arithmetic for --preset gpu-0.5b: 512 responses and micro-batches of 4, 2,300 tokens each
README = dict(rows=512, micro=4, seq=2300, update_gb=33, sampling_gb=30)
# bytes of one cached K or V element while sampling under --bf16 with float32 weights: the sampler's preallocated
# cache stores bf16 (sampler.kv_cache_bytes_per_token, tests/test_rollout.py)
KV_BYTES = 2


def model_config(tokenizer, tiny: bool):
    from transformers import Qwen2Config
    kw = {**QWEN25_05B, **(TINY if tiny else {})}
    return Qwen2Config(**kw, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=None, use_cache=True)


def memory_arithmetic(params: int, config, rows: int, micro: int, seq: int) -> dict:
    """docs/performance.md's items, GB (1e9 bytes): float32 weights + gradients + AdamW moments of policy and
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


class Probe:
    """Wraps the functions train() calls to time them (device synchronised) and take their peak memory; a list
    of records {"what", "seconds", "peak_gb", ...} in call order."""

    def __init__(self, device: torch.device):
        self.device, self.records, self._undo = device, [], []
        self.phase = "train"  # which part of the check the records belong to

    def wrap(self, owner, name: str, what: str, describe=None):
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            memory = PeakMemory(self.device)
            memory.start()
            sync(self.device)
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            sync(self.device)
            record = {"what": what, "phase": self.phase, "seconds": time.perf_counter() - t0,
                      "peak_gb": memory.stop()["peak_mb"] / 1e3}
            if self.device.type == "cuda":  # all of the device's memory in use, vLLM's pool included
                free, total = torch.cuda.mem_get_info(self.device)
                record["device_used_gb"] = round((total - free) / 1e9, 3)
            if describe is not None:
                record |= describe(args, kwargs, out)
            self.records.append(record)
            return out

        setattr(owner, name, wrapper)
        self._undo.append((owner, name, original))

    def undo(self):
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)


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


class Stopper:
    """--stop-after-s: once the time is up, SIGTERM to this process, sent only while vapo.train's StopRequest
    handles it (it then stops after the step under way, with a checkpoint); until then the run goes on. A
    SIGTERM from elsewhere, outside train, still ends the script (through SystemExit, so temporary folders go)."""

    def __init__(self, seconds: float):
        self.seconds, self.fired, self.done = seconds, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.previous = signal.signal(signal.SIGTERM, self._outside_train)
        self.thread.start()
        return self

    def _outside_train(self, signum, frame):
        if not self.fired.is_set():
            raise SystemExit(128 + signum)

    def _watch(self):
        while not self.done.wait(0.2):
            handler = signal.getsignal(signal.SIGTERM)
            if (time.perf_counter() - self.t0 >= self.seconds
                    and isinstance(getattr(handler, "__self__", None), run.StopRequest)):
                logging.getLogger("gpu_check").warning("--stop-after-s %g: asking the run to stop", self.seconds)
                self.fired.set()
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        signal.signal(signal.SIGTERM, self.previous)
        return False


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
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return config, params


def run_config(args, folder: str, run_dir: str, **changes) -> vapo.Config:
    preset = PRESETS["gpu-0.5b"]
    batch = args.prompts_per_step * args.samples_per_prompt
    mini = math.gcd(batch, preset["mini_batch_size"])  # the preset's 128 where it divides the batch
    micro = math.gcd(mini, args.micro_batch_size or preset["micro_batch_size"])
    over = dict(model=folder, dataset="builtin", steps=args.steps, prompts_per_step=args.prompts_per_step,
                samples_per_prompt=args.samples_per_prompt, max_new_tokens=args.max_new_tokens,
                mini_batch_size=mini, micro_batch_size=micro,
                value_pretrain_steps=args.value_pretrain_steps, eval_prompts=0, eval_every=0, save_every=0,
                output_dir=run_dir, device=args.device, seed=args.seed, report_to="none")
    return vapo.Config(**{**preset, **over, **changes}).validate()


def summarise(probe: Probe, params: dict, args) -> dict:
    train = [r for r in probe.records if r["phase"] == "train"]
    gens = [r for r in train if r["what"] == "generate"]
    updates = [r for r in train if r["what"] == "update" and r["train_policy"]]
    flops_per_token = 6 * (params["policy"] + params["critic"])
    steps = []
    for i, (g, u) in enumerate(zip(gens[-len(updates):] if updates else [], updates)):
        steps.append({"step": i + 1, "generate_s": round(g["seconds"], 3), "generated_tokens": g["tokens"],
                      "generation_tokens_per_s": g["tokens"] / g["seconds"],
                      "update_s": round(u["seconds"], 3), "update_tokens": u["tokens"],
                      "update_tokens_per_s": u["tokens"] / u["seconds"],
                      "update_tflops": flops_per_token * u["tokens"] / u["seconds"] / 1e12,
                      "mfu": flops_per_token * u["tokens"] / u["seconds"] / (args.peak_tflops * 1e12),
                      "generate_peak_gb": round(g["peak_gb"], 3), "update_peak_gb": round(u["peak_gb"], 3)})

    def med(key):
        return statistics.median(s[key] for s in steps) if steps else None

    def peak(what):
        values = [r["peak_gb"] for r in train if r["what"] == what]
        return round(max(values), 3) if values else None

    return {"steps": steps,
            "generation": {"tokens_per_s": med("generation_tokens_per_s"),
                           "rows": gens[-1]["rows"] if gens else None,
                           "response_width": gens[-1]["response_width"] if gens else None},
            "update": {"tokens_per_s": med("update_tokens_per_s"), "tflops": med("update_tflops"),
                       "mfu": med("mfu"), "peak_tflops": args.peak_tflops,
                       "flops_per_token": flops_per_token},
            "peaks_gb": {"sampling": peak("generate"), "scoring": peak("score_rollout"), "update": peak("update"),
                         "checkpoint": peak("save_checkpoint")},
            "checkpoint_s": [round(r["seconds"], 2) for r in train if r["what"] == "save_checkpoint"],
            "scoring_s": [round(r["seconds"], 3) for r in train if r["what"] == "score_rollout"]}


def evaluation_part(args, cfg, folder: str, device: torch.device, box_s: float, tokens_per_s: float | None) -> dict:
    """vapo.evaluate as a run calls it (HF engine, autocast, bounded passes) on the model folder, over as many of
    --eval-prompts as the box holds at the train part's generation speed (counting every response to
    max_new_tokens: (eval_samples + 1) x max_new_tokens tokens a prompt, an upper bound)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokens_per_prompt = (cfg.eval_samples + 1) * cfg.max_new_tokens
    prompts = args.eval_prompts
    if tokens_per_s:
        prompts = max(1, min(prompts, int(box_s * tokens_per_s / tokens_per_prompt)))
    cfg = dataclasses.replace(cfg, eval_prompts=prompts)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    policy = AutoModelForCausalLM.from_pretrained(folder).to(device)
    engine = engines.HFEngine(policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                              top_p=cfg.top_p)
    _, held_out = load_data(cfg, tokenizer)
    memory = PeakMemory(device)
    memory.start()
    t0 = time.perf_counter()
    result = vapo.evaluate(engine, held_out, cfg, run.verifier_for(cfg))
    sync(device)
    seconds = time.perf_counter() - t0
    out = {"prompts": prompts, "asked": args.eval_prompts, "eval_samples": cfg.eval_samples,
           "rows_per_pass": (cfg.eval_batch_size or max(1, cfg.batch_size // cfg.eval_samples)) * cfg.eval_samples,
           "seconds": round(seconds, 2), "box_s": round(box_s, 1), "peak_gb": round(memory.stop()["peak_mb"] / 1e3, 3),
           "tokens_per_s": sum(result[f"eval/response_len_{name}"] * prompts * n for name, n in
                               ((f"avg@{cfg.eval_samples}", cfg.eval_samples), ("greedy", 1))) / seconds,
           "result": result}
    del engine, policy
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


class Part:
    """The seconds and peak memory (torch's on a GPU, the resident set on a CPU) of one part of the check, and
    what torch still holds on the device at its end: `with Part(device) as part: ...; part.result`."""

    def __init__(self, device: torch.device, box_s: float):
        self.device, self.box_s, self.memory = device, box_s, PeakMemory(device)

    def __enter__(self):
        self.memory.start()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.result = {"seconds": round(time.perf_counter() - self.t0, 2), "box_s": round(self.box_s, 1),
                       "peak_gb": round(self.memory.stop()["peak_mb"] / 1e3, 3)}
        if self.device.type == "cuda":
            self.result["allocated_at_end_gb"] = round(torch.cuda.memory_allocated(self.device) / 1e9, 3)
        return False


def steps_done(run_dir: str) -> int:
    return len([r for r in common.read_records(run_dir) if "step" in r and "time/step" in r])


def resume_part(args, cfg, probe: Probe, box_s: float) -> dict:
    """vapo.train --resume on the train part's folder for one RL step more: the checkpoint read back (weights,
    AdamW states, RNG: checkpoints.load_checkpoint, timed) and trained on."""
    before = steps_done(cfg.output_dir)
    cfg = dataclasses.replace(cfg, steps=before + 1)
    probe.phase = "resume"
    with Stopper(box_s):
        vapo.train(cfg, resume=True)
    loads = [r for r in probe.records if r["phase"] == "resume" and r["what"] == "load_checkpoint"]
    return {"steps_before": before, "steps_after": steps_done(cfg.output_dir),
            "load_checkpoint_s": round(loads[0]["seconds"], 2) if loads else None,
            "load_checkpoint_peak_gb": round(loads[0]["peak_gb"], 3) if loads else None}


def sample_part(args, cfg, folder: str, device: torch.device, box_s: float, seconds_per_token: float | None) -> dict:
    """One HFEngine.generate at the preset's shapes (--sample-prompts x the preset's samples per prompt, up to
    --sample-new-tokens), under the run's autocast, on the model folder; its peak memory is the sampling peak
    that docs/performance.md's arithmetic predicts at those shapes. max_new_tokens is cut to what fits the box at
    the train part's speed (seconds_per_token: seconds of one decoding step of the train part's rows, taken to grow
    in proportion to the rows), and the report says so."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    preset = PRESETS["gpu-0.5b"]
    prompts_n, n = args.sample_prompts, preset["samples_per_prompt"]
    rows_train = cfg.prompts_per_step * cfg.samples_per_prompt
    asked = new_tokens = args.sample_new_tokens
    if seconds_per_token:
        per_step = seconds_per_token * max(1.0, prompts_n * n / rows_train)
        new_tokens = max(1, min(asked, int(box_s / per_step)))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    policy = AutoModelForCausalLM.from_pretrained(folder).to(device)
    engine = engines.HFEngine(policy, tokenizer, max_new_tokens=new_tokens, temperature=cfg.temperature,
                              top_p=cfg.top_p)
    cfg = dataclasses.replace(cfg, prompts_per_step=prompts_n, max_new_tokens=new_tokens)
    rows, _ = load_data(cfg, tokenizer)
    prompts = [r["prompt"] for r in rows[:prompts_n]]
    memory = PeakMemory(device)
    memory.start()
    t0 = time.perf_counter()
    with vapo.autocast(cfg, device):
        out = engine.generate(prompts, n=n, seed=args.seed)
    sync(device)
    seconds = time.perf_counter() - t0
    result = {"prompts": prompts_n, "samples_per_prompt": n, "max_new_tokens": new_tokens, "asked_new_tokens": asked,
              "seconds": round(seconds, 2), "tokens_per_s": int(out.lengths.sum()) / seconds,
              "peak_gb": round(memory.stop()["peak_mb"] / 1e3, 3), **_generated(None, None, out),
              "arithmetic": memory_arithmetic(n_params(policy), policy.config, out.B,
                                              cfg.micro_batch_size, out.P + new_tokens)["sampling_peak_gb"]}
    del engine, policy, out
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def vllm_part(args, folder: str, workdir: str, probe: Probe, box_s: float) -> dict:
    """vapo.train with --engine vllm for --vllm-steps steps, in its box; the engine's calls timed by the probe."""
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vllm is not installed on this machine"}
    cfg = run_config(args, folder, os.path.join(workdir, "run-vllm"), engine="vllm", steps=args.vllm_steps)
    probe.phase = "vllm"
    probe.wrap(vapo, "make_engine", "engine start")  # as vapo.py imported it
    for name in ("generate", "sleep", "load_weights"):
        probe.wrap(engines.VLLMEngine, name, f"vllm {name}", _generated if name == "generate" else None)
    t0 = time.perf_counter()
    with Stopper(box_s):
        vapo.train(cfg)
    calls = [r for r in probe.records if r["phase"] == "vllm"]
    gens = [r for r in calls if r["what"] == "vllm generate"]
    return {"seconds": round(time.perf_counter() - t0, 1), "box_s": round(box_s, 1),
            "steps_done": steps_done(cfg.output_dir),
            "generation_tokens_per_s": statistics.median(r["tokens"] / r["seconds"] for r in gens) if gens else None,
            "calls": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "phase"}
                      for r in calls]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts-per-step", type=int, default=None, help="default 16 (2 with --tiny; the "
                                                                           "preset has 64)")
    parser.add_argument("--samples-per-prompt", type=int, default=None, help="default 8, the preset's (2 with "
                                                                             "--tiny)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 512 (16 with --tiny; the "
                                                                         "preset has 2048)")
    parser.add_argument("--micro-batch-size", type=int, default=None, help="default: the preset's 4")
    parser.add_argument("--value-pretrain-steps", type=int, default=1, help="critic-only steps first (default 1)")
    parser.add_argument("--sample-prompts", type=int, default=None, help="prompts of the sample part (default 64, "
                                                                         "the preset's; 4 with --tiny), x 8 samples")
    parser.add_argument("--sample-new-tokens", type=int, default=None, help="new tokens of the sample part (default "
                                                                            "2048, the preset's; 32 with --tiny), "
                                                                            "cut to its box")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="the GPU's dense bf16 peak, for MFU (default 989: H100/H200 SXM)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--tiny", action="store_true", help="2 layers, hidden 256, vocabulary 4096; 2 prompts x 2 "
                                                            "samples, 16 new tokens (a check that it runs)")
    parser.add_argument("--budget-s", type=float, default=540, help="the whole check's time, shared by its parts "
                                                                   "(default 540: 10 minutes with the setup)")
    parser.add_argument("--parts", nargs="+", choices=tuple(SHARES), default=list(SHARES))
    parser.add_argument("--stop-after-s", type=float, default=0, help="the train part's box instead of its share of "
                                                                      "--budget-s (0: the share)")
    parser.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts of the evaluation part "
                                                                       "(default 64, 2 with --tiny), cut to its box")
    parser.add_argument("--vllm-steps", type=int, default=None, help="RL steps of the vLLM part (default 2, 1 with "
                                                                     "--tiny)")
    parser.add_argument("--workdir", default=None, help="model and run folder (default: a temporary folder, "
                                                        "deleted at the end); a 0.5B run writes about 25 GB there")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join("runs", "gpu_check"),
                        help="folder for the report: gpu_check.json (the figures) and gpu_check.txt (the summary)")
    args = parser.parse_args(argv)
    defaults = TINY_RUN if args.tiny else dict(prompts_per_step=16, samples_per_prompt=8, max_new_tokens=512,
                                               eval_prompts=64, vllm_steps=2,
                                               sample_prompts=PRESETS["gpu-0.5b"]["prompts_per_step"],
                                               sample_new_tokens=PRESETS["gpu-0.5b"]["max_new_tokens"])
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")

    t_start = time.perf_counter()
    started = common.now()
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available on this machine")
    machine = common.machine(device)
    workdir = args.workdir or tempfile.mkdtemp(prefix="gpu_check-")
    folder, run_dir = os.path.join(workdir, "model"), os.path.join(workdir, "run")
    probe = Probe(device)
    try:
        config, params = build_model_folder(folder, args.tiny, device, args.seed, args.max_new_tokens)
        cfg = run_config(args, folder, run_dir)
        print(f"model: {params:,} parameters ({'tiny, ' if args.tiny else ''}Qwen2.5-0.5B shape), random weights; "
              f"{cfg.value_pretrain_steps} value-pretraining and {cfg.steps} RL steps of {cfg.prompts_per_step} x "
              f"{cfg.samples_per_prompt} samples, up to {cfg.max_new_tokens} new tokens, micro-batch "
              f"{cfg.micro_batch_size}", flush=True)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        probe.wrap(engines.HFEngine, "generate", "generate", _generated)
        probe.wrap(vapo, "pretrain_value", "pretrain_value")
        probe.wrap(vapo, "score_rollout", "score_rollout")  # as vapo.py imported it
        probe.wrap(vapo, "update", "update", _updated)
        probe.wrap(run, "save_checkpoint", "save_checkpoint")  # checkpoints.py's, as run.py imported it
        probe.wrap(run, "load_checkpoint", "load_checkpoint")  # (Run.save and Run.restore look them up there)
        t_train = time.perf_counter()
        records, parts = [], {}
        if "train" in args.parts:
            box = args.stop_after_s or SHARES["train"] * args.budget_s
            with Part(device, box) as part, Stopper(box):
                vapo.train(cfg)
            records = common.read_records(run_dir)
            pretrain = [r for r in probe.records if r["what"] == "pretrain_value"]
            parts["train"] = part.result | {
                "steps_done": steps_done(run_dir),
                "value_pretrain_steps_done": len([r for r in records if "value_pretrain_step" in r]),
                "value_pretrain_s": round(pretrain[0]["seconds"], 2) if pretrain else None,
                "value_pretrain_peak_gb": round(pretrain[0]["peak_gb"], 3) if pretrain else None}
        train_s = time.perf_counter() - t_train
        done = [r for r in probe.records if r["what"] == "generate" and r["phase"] == "train"]
        speed = sum(r["tokens"] for r in done) / sum(r["seconds"] for r in done) if done else None
        per_token = statistics.median(r["seconds"] / max(r["response_width"], 1) for r in done) if done else None
        for name, work in (
                ("resume", lambda box: resume_part(args, cfg, probe, box) if "train" in args.parts else
                 {"skipped": "needs the train part's run folder"}),
                ("sample", lambda box: sample_part(args, cfg, folder, device, box, per_token)),
                ("evaluate", lambda box: evaluation_part(args, cfg, folder, device, box, speed)),
                ("vllm", lambda box: vllm_part(args, folder, workdir, probe, box))):
            if name in args.parts:
                probe.phase = name
                with Part(device, SHARES[name] * args.budget_s) as part:
                    result = work(SHARES[name] * args.budget_s)
                parts[name] = result if "skipped" in result else {**result, "part": part.result}
    finally:
        probe.undo()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    counted = next((r["params"] for r in probe.records if r["what"] == "update"), None)
    critic_params = counted["critic"] if counted else params + config.hidden_size  # the backbone and a score head
    params_both = {"policy": params, "critic": critic_params}
    summary = summarise(probe, params_both, args)
    rl = [r for r in records if "step" in r and "time/step" in r]
    longest = max((s["prompt_width"] + s["response_width"] for s in probe.records if s["what"] == "generate"),
                  default=cfg.max_new_tokens)
    memory = {"kind": "cuda max_memory_allocated" if device.type == "cuda" else "rss",
              "peak_gb": max((v for v in summary["peaks_gb"].values() if v is not None), default=None),
              "phases_gb": summary["peaks_gb"],
              "readme": memory_arithmetic(494_032_768, model_config(task.build_tokenizer(), False), README["rows"],
                                          README["micro"], README["seq"]),
              "arithmetic_this_run": memory_arithmetic(params, config, cfg.batch_size, cfg.micro_batch_size,
                                                       longest)}
    report = {"machine": machine, "date": started, "device": str(device), "torch": torch.__version__,
              "tiny": args.tiny, "args": vars(args),
              "model": {"params_policy": params, "params_critic": critic_params,
                        "config": {**{k: getattr(config, k, None) for k in QWEN25_05B},  # rope_theta moved into
                                   "rope_parameters": getattr(config, "rope_parameters", None)}},  # transformers 5
              "config": {k: getattr(cfg, k) for k in ("steps", "prompts_per_step", "samples_per_prompt",
                                                       "max_new_tokens", "mini_batch_size", "micro_batch_size",
                                                       "ppo_epochs", "bf16", "gradient_checkpointing")},
              "steps_done": len(rl), "step_times": [{k: v for k, v in r.items() if k.startswith("time/")} for r in rl],
              **{k: summary[k] for k in ("steps", "generation", "update", "checkpoint_s", "scoring_s")},
              "memory": memory, "train_s": round(train_s, 1), **parts,
              "wall_s": round(time.perf_counter() - t_start, 1)}
    common.write_json(os.path.join(args.out, "gpu_check.json"), report)

    def fmt(x, spec):
        return "n/a" if x is None else format(x, spec)

    gen, upd = summary["generation"], summary["update"]
    readme, here = memory["readme"], memory["arithmetic_this_run"]
    lengths = [r["lengths"] for r in probe.records if r["what"] == "generate" and r["phase"] == "train"]
    text = (f"\nmachine: {machine}\ndate: {started}; {report['wall_s']:.0f} s in all, train {train_s:.0f} s, "
            f"{len(rl)} RL steps (medians over them; the first includes start-up)\n"
            f"generation: {fmt(gen['tokens_per_s'], ',.0f')} tokens/s ({gen['rows']} rows x {gen['response_width']}); "
            f"lengths {', '.join(length_range(x) for x in lengths)}\n"
            f"update: {fmt(upd['tokens_per_s'], ',.0f')} tokens/s, {fmt(upd['tflops'], '.1f')} TFLOP/s, MFU "
            f"{fmt(upd['mfu'] and 100 * upd['mfu'], '.1f')}% of {args.peak_tflops:g} (6 x {params + critic_params:,} "
            f"parameters per token)\n"
            f"checkpoints: {', '.join(f'{s:.1f} s' for s in summary['checkpoint_s'])}\n"
            f"peak memory ({memory['kind']}, GB): sampling {fmt(summary['peaks_gb']['sampling'], '.2f')}, scoring "
            f"{fmt(summary['peaks_gb']['scoring'], '.2f')}, update {fmt(summary['peaks_gb']['update'], '.2f')}\n"
            f"docs/performance.md arithmetic ({readme['rows']} rows, micro-batch {readme['micro_batch']} x "
            f"{readme['seq']} tokens): "
            f"update {readme['update_peak_gb']:.1f} GB, sampling {readme['sampling_peak_gb']:.1f} GB (the docs say "
            f"{README['update_gb']} and {README['sampling_gb']})\n"
            f"same arithmetic at this run's shapes ({here['rows']} rows, micro-batch {here['micro_batch']} x "
            f"{here['seq']} tokens): update {here['update_peak_gb']:.2f} GB, sampling {here['sampling_peak_gb']:.2f} GB"
            + "".join(part_line(name, parts.get(name)) for name in ("train", "resume", "sample"))
            + evaluation_line(parts.get("evaluate")) + vllm_line(parts.get("vllm")))
    with open(os.path.join(args.out, "gpu_check.txt"), "w") as fh:
        fh.write(text.lstrip("\n") + "\n")
    print(text + f"\nwrote {os.path.join(args.out, 'gpu_check.json')} and gpu_check.txt")


def length_range(x: dict) -> str:
    return f"{x['min']}-{x['max']} (cut {x['truncated_frac']:.0%})"


def part_line(name: str, p) -> str:
    """One line of the summary for the train, resume or sample part: what it did, its seconds and peak memory."""
    if p is None:
        return ""
    if "skipped" in p:
        return f"\n{name}: skipped ({p['skipped']})"
    own = p.get("part", p)  # the train part's figures are its own; the others' are under "part"
    head = f"\n{name} part: {own['seconds']:.1f} s (box {own['box_s']:.0f} s), peak {own['peak_gb']:.2f} GB"
    if "allocated_at_end_gb" in own:
        head += f", {own['allocated_at_end_gb']:.2f} GB still allocated after it"
    if name == "train":
        return head + (f"; {p['value_pretrain_steps_done']} value-pretraining steps "
                       f"({p['value_pretrain_s'] or 0:.1f} s, peak {p['value_pretrain_peak_gb'] or 0:.2f} GB), "
                       f"{p['steps_done']} RL steps")
    if name == "resume":
        return head + (f"; from step {p['steps_before']} to {p['steps_after']}, checkpoint read back in "
                       f"{p['load_checkpoint_s'] or 0:.1f} s")
    cut = f", cut from {p['asked_new_tokens']} to fit" if p["max_new_tokens"] < p["asked_new_tokens"] else ""
    return head + (f"; {p['rows']} rows x up to {p['max_new_tokens']} new tokens{cut}: {p['seconds']:.1f} s, "
                   f"{p['tokens_per_s']:,.0f} tokens/s, lengths {length_range(p['lengths'])}, sampling peak "
                   f"{p['peak_gb']:.2f} GB against "
                   f"{p['arithmetic']:.2f} GB by the arithmetic")


def evaluation_line(e) -> str:
    if e is None:
        return ""
    cut = f", cut from {e['asked']} to fit {e['box_s']:.0f} s" if e["prompts"] < e["asked"] else ""
    return (f"\nevaluation: {e['prompts']} prompts x ({e['eval_samples']} + greedy){cut}, passes of "
            f"{e['rows_per_pass']} rows: {e['seconds']:.1f} s, {e['tokens_per_s']:,.0f} tokens/s, peak "
            f"{e['peak_gb']:.2f} GB")


def vllm_line(v) -> str:
    if v is None:
        return ""
    if "skipped" in v:
        return f"\nvLLM: skipped ({v['skipped']})"
    each = {}
    for c in v["calls"]:
        each.setdefault(c["what"], []).append(c["seconds"])
    used = [c["device_used_gb"] for c in v["calls"] if "device_used_gb" in c]
    speed = v["generation_tokens_per_s"]
    return (f"\nvLLM: {v['steps_done']} steps in {v['seconds']:.0f} s (box {v['box_s']:.0f} s); generation "
            f"{'n/a' if speed is None else format(speed, ',.0f')} tokens/s; "
            + ", ".join(f"{k} {statistics.median(t):.2f} s (x{len(t)})" for k, t in each.items())
            + (f"; device memory in use up to {max(used):.1f} GB" if used else ""))


if __name__ == "__main__":
    main()
