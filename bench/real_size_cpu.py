"""The one-GPU path at its real size, on a CPU: `python vapo.py --preset gpu-0.5b` on a Qwen2.5-0.5B-shaped model of
random weights (common.build_qwen_folder: 494M parameters at 24 layers, Qwen2.5's vocabulary and special ids, the chat
template, the instruct model's EOS), small batches, a GSM8K-form file: value pretraining, rollout, math reward,
update, checkpoint, then --resume for one more step. Float32 (--no-bf16): bf16 is emulated on many CPUs.

    python bench/real_size_cpu.py [--layers 24] [--out real_size_cpu.json]

Prints the machine and date, each command's wall time and the peak resident memory so far, the phases of each RL
step (from metrics.jsonl) and the checkpoint's size; writes them as JSON. tests/test_real_size.py runs the same at
2 layers.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import common  # (puts the repository on the path)


def run(cmd: list[str], env: dict) -> dict:
    """One command's wall time and the peak resident memory of the largest child process so far (GB: getrusage
    keeps one maximum over all children, so a later command's figure is never below an earlier one's)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=common.ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return {"command": " ".join(cmd[1:]), "wall_s": round(time.perf_counter() - t0, 1),
            "peak_rss_gb_so_far": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6, 2)}


def folder_gb(path: str) -> float:
    return round(sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs) / 1e9, 2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--out", default="real_size_cpu.json")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="real-size-")
    try:
        model, out = os.path.join(work, "model"), os.path.join(work, "run")
        t0 = time.perf_counter()
        params = common.build_qwen_folder(model, layers=args.layers)
        build_s = time.perf_counter() - t0
        data = os.path.join(work, "train.jsonl")
        with open(data, "w") as fh:
            fh.writelines(json.dumps({"question": q, "answer": a}) + "\n" for q, a in common.GSM8K_ROWS)
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        common = ["--no-bf16", "--device", "cpu", "--reward-workers", "1"]
        first = run([sys.executable, "vapo.py", "--model", model, "--dataset", data, "--eval-dataset", data,
                     "--template", "chat", "--steps", "1", "--prompts-per-step", "2", "--samples-per-prompt", "2",
                     "--mini-batch-size", "4", "--micro-batch-size", "2", "--max-new-tokens", "8",
                     "--value-pretrain-steps", "1", "--eval-prompts", "2", "--eval-samples", "2", *common,
                     "--output-dir", out], env)
        second = run([sys.executable, "vapo.py", "--resume", out, "--steps", "2"], env)
        records = common.read_records(out)
        steps = [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()
                  if k == "step" or k.startswith("time/") or k in ("response_len", "reward_mean")}
                 for r in records if "samples_generated" in r]
        report = {"machine": common.machine(), "date": common.now(),
                  "layers": args.layers, "parameters": params, "build_s": round(build_s, 1),
                  "runs": [first, second], "steps": steps,
                  "checkpoint_gb": folder_gb(os.path.join(out, "checkpoint"))}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    common.write_json(args.out, report)
    print(f"machine: {report['machine']}\ndate: {report['date']}\n"
          f"model: {params:,} parameters ({args.layers} layers, Qwen2.5-0.5B's widths and vocabulary), built in "
          f"{report['build_s']} s; checkpoint {report['checkpoint_gb']} GB")
    for r in report["runs"]:
        print(f"{r['wall_s']:7.1f} s, peak RSS so far {r['peak_rss_gb_so_far']:.2f} GB: python {r['command']}")
    for s in steps:
        print(f"step {s['step']}: " + ", ".join(f"{k[5:]} {v} s" for k, v in s.items() if k.startswith("time/")
                                                 and k != "time/elapsed"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
