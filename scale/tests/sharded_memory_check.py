"""Each rank's resident memory in the setup of a sharded run (scale/train.py, 2 CPU processes), for
scale/tests/test_scale.py.

    python scale/tests/sharded_memory_check.py [--sizes 100] [--out sharded_memory.json]

For each size (millions of parameters), a random Qwen2 model of that size (hidden 768, 12 heads, 4 KV heads,
intermediate 3,072, 12 layers per 104M, the built-in byte tokenizer) is saved in bfloat16, as released
checkpoints are, and `accelerate launch --num_processes 2 scale/train.py` trains it for one step (2 prompts x 2
samples of 8 tokens, no value pretraining, no evaluation, no checkpoint). Inside each rank (this script again,
with --probe) the resident set is read from /proc/self/status around loading the models, starting the engine,
the first checkpoint and the first RL step, as growth over the rank's baseline (after the imports), in GB and in
full float32 copies of the policy (4 bytes x its parameters).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
HIDDEN, HEADS, KV_HEADS, INTERMEDIATE = 768, 12, 4, 3072
PER_LAYER_M = 8.65  # parameters of one such layer, millions (attention 1.57 + MLP 7.08)


def status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak():
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM back to the current resident set


def probe(out_path: str, code: str, train_args: list[str]):
    """One rank of the launched run: scale/train.py's main, with the resident set read around the first step."""
    sys.path.insert(0, code)
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import vapo
    from scale import train
    reset_peak()
    marks = {"baseline_kb": status_kb("VmRSS"), "phases": {}}

    def phase(owner, name, label):  # the peak of each part of setup, over the resident set before it
        original = getattr(owner, name)

        def measured(*args, **kwargs):
            if label in marks["phases"] or "setup_peak_kb" in marks:
                return original(*args, **kwargs)
            before = status_kb("VmRSS")
            hwm = status_kb("VmHWM")
            reset_peak()
            out = original(*args, **kwargs)
            marks["phases"][label] = {"before_kb": before, "peak_kb": status_kb("VmHWM"), "after_kb": status_kb("VmRSS")}
            if hwm > status_kb("VmHWM"):  # keep the setup's peak so far: the reset above lowered it
                marks["earlier_peak_kb"] = max(marks.get("earlier_peak_kb", 0), hwm)
            return out
        setattr(owner, name, measured)

    phase(vapo, "load_inputs", "load models and data")
    phase(vapo, "make_engine", "start the engine")
    phase(vapo.Run, "save", "first checkpoint")
    rl_step = vapo.rl_step

    def measured_step(*args, **kwargs):
        if "setup_peak_kb" not in marks:
            marks["setup_peak_kb"] = max(status_kb("VmHWM"), marks.get("earlier_peak_kb", 0),
                                         *(p["peak_kb"] for p in marks["phases"].values()))
            marks["setup_end_kb"] = status_kb("VmRSS")
            reset_peak()
        out = rl_step(*args, **kwargs)
        marks.setdefault("step_peak_kb", status_kb("VmHWM"))
        return out

    vapo.rl_step = measured_step
    train.main(train_args)
    rank = int(os.environ.get("RANK", 0))
    with open(f"{out_path}.rank{rank}.json", "w") as fh:
        json.dump(marks, fh)


def build_model(folder: str, millions: int) -> int:
    """A random Qwen2 of about `millions` M parameters, saved in bfloat16 with the built-in tokenizer -> params."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    sys.path.insert(0, ROOT)
    from machinery import task
    tokenizer = task.build_tokenizer()
    layers = max(1, round(millions / PER_LAYER_M))
    config = Qwen2Config(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         intermediate_size=INTERMEDIATE, num_hidden_layers=layers, vocab_size=len(tokenizer),
                         tie_word_embeddings=True, max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100], help="millions of parameters")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--code", default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="sharded_memory.json")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # inside a launched rank
    args, rest = parser.parse_known_args(argv)
    if args.probe:
        return probe(args.probe, args.code, [a for a in rest if a != "--"])

    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    report = {"engine": args.engine, "world_size": 2, "sizes": {}}
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=args.code)
    with tempfile.TemporaryDirectory(prefix="sharded_memory-") as work:
        for millions in args.sizes:
            folder = os.path.join(work, f"model-{millions}m")
            params = build_model(folder, millions)
            copy_gb = 4 * params / 1e9
            out = os.path.join(work, f"probe-{millions}")
            cmd = [accelerate, "launch", "--config_file", os.path.join(ROOT, "scale/configs/cpu.yaml"),
                   "--num_processes", "2", os.path.abspath(__file__), "--probe", out, "--code", args.code, "--",
                   "--model", folder, "--dataset", "builtin", "--steps", "1", "--prompts-per-step", "2",
                   "--samples-per-prompt", "2", "--mini-batch-size", "4", "--micro-batch-size", "2",
                   "--max-new-tokens", "8", "--no-value-pretraining", "--eval-prompts", "0", "--save-every", "0",
                   "--no-dynamic-sampling", "--engine", args.engine, "--output-dir", os.path.join(work, f"run-{millions}"),
                   "--report-to", "none", "--device", "cpu", "--no-bf16"]
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"the launched run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
            ranks = []
            for rank in range(2):
                with open(f"{out}.rank{rank}.json") as fh:
                    m = json.load(fh)
                setup = (m["setup_peak_kb"] - m["baseline_kb"]) * 1e3 / 1e9
                step = (m["step_peak_kb"] - m["baseline_kb"]) * 1e3 / 1e9
                phases = {label: {"peak_gb": round((p["peak_kb"] - m["baseline_kb"]) * 1e3 / 1e9, 3),
                                  "added_gb": round((p["after_kb"] - p["before_kb"]) * 1e3 / 1e9, 3)}
                          for label, p in m["phases"].items()}
                ranks.append({"rank": rank, "baseline_gb": round(m["baseline_kb"] * 1e3 / 1e9, 3), "phases": phases,
                              "setup_end_gb": round((m["setup_end_kb"] - m["baseline_kb"]) * 1e3 / 1e9, 3),
                              "setup_gb": round(setup, 3), "setup_copies": round(setup / copy_gb, 2),
                              "step_gb": round(step, 3), "step_copies": round(step / copy_gb, 2)})
            report["sizes"][str(millions)] = {"params": params, "full_float32_copy_gb": round(copy_gb, 3),
                                              "ranks": ranks}
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
