"""The one-GPU path at Qwen2.5-0.5B's real vocabulary and widths, on a CPU: `python vapo.py --preset gpu-0.5b` on a
random-weight model of that shape at 2 of its 24 layers (166M parameters, the 151,936-token embedding included),
with a tokenizer whose special tokens sit at Qwen2.5's ids and the instruct model's EOS, on a GSM8K-form file:
value pretraining, rollout, math reward, update, evaluation, the teaching views, checkpoint. In float32 (--no-bf16:
bf16 is emulated on many CPUs). The full depth ran in bench/real_size_cpu.py at commit 758a9d0 (docs/results.md).
Slow (two to three minutes), and over 6 GB on disk at the peak: the model folder (0.7 GB) and a checkpoint of two
models of this size with their AdamW states (4 GB). --resume is tested on the tiny models (test_vapo.py,
test_faults.py): a second run here would hold two such checkpoints at once (the new one is written beside the old)
for no new shape."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, os.path.join(ROOT, "bench"))
import common  # noqa: E402

QUESTIONS = common.GSM8K_ROWS
DISK_NEEDED_GB = 8  # seen: 6.3 GB at the peak


def cli(*args):
    return [sys.executable, "vapo.py", *args]


@pytest.mark.slow
def test_gpu_preset_at_real_vocabulary_runs_and_checkpoints(tmp_path):
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    if free_gb < DISK_NEEDED_GB:
        pytest.skip(f"needs {DISK_NEEDED_GB} GB free under {tmp_path.parent}, has {free_gb:.1f} GB")
    model = tmp_path / "qwen25-2layers"
    params = common.build_qwen_folder(str(model), layers=2)
    assert params == 165_960_320
    for name, rows in (("train", QUESTIONS), ("eval", QUESTIONS[:2])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n"
                                                        for q, a in rows))
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # one core: the other runs another test
    first = subprocess.run(cli("--model", str(model), "--dataset", str(tmp_path / "train.jsonl"),
                               "--eval-dataset", str(tmp_path / "eval.jsonl"), "--template", "chat",
                               "--steps", "1", "--prompts-per-step", "2", "--samples-per-prompt", "2",
                               "--mini-batch-size", "4", "--micro-batch-size", "2", "--max-new-tokens", "8",
                               "--value-pretrain-steps", "1", "--eval-prompts", "2", "--eval-samples", "2",
                               "--no-bf16", "--device", "cpu", "--reward-workers", "1", "--output-dir", str(out)),
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "preset gpu-0.5b (the default with --model" in first.stderr  # a bare --model: one GPU's budget
    saved = json.load(open(out / "config.json"))
    assert saved["gradient_checkpointing"] and not saved["bf16"] and saved["template"] == "chat"
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    steps = [r for r in records if "samples_generated" in r]
    assert [r["step"] for r in steps] == [1] and all(r["samples_generated"] == 4 for r in steps)
    assert all(-1 <= r["reward_mean"] <= 1 and 1 <= r["response_len"] <= 8 for r in steps)
    assert all(r["skipped_nonfinite"] == 0 and r["grad_norm/policy"] > 0 for r in steps)
    assert [r["step"] for r in records if "eval/acc_greedy" in r] == [0, 1]
    assert [r["value_pretrain_step"] for r in records if "value_pretrain_step" in r] == [1]
    views = [json.loads(line) for line in open(out / "tokens.jsonl")]  # the teaching views at this vocabulary
    assert [(r["step"], r["stage"]) for r in views] == [(0, "step 0"), (0, "after value pretraining"),
                                                        (1, "evaluation")]
    assert (out / "views" / "step-1" / "index.html").exists()
    policy = out / "checkpoint" / "policy"
    assert json.load(open(policy / "config.json"))["vocab_size"] == 151936
    from transformers import AutoTokenizer, GenerationConfig
    tok = AutoTokenizer.from_pretrained(policy)
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]
    assert GenerationConfig.from_pretrained(policy).eos_token_id == [151645, 151643]  # the instruct model's
    assert torch.load(out / "checkpoint" / "state.pt", weights_only=True, mmap=True)["step"] == 1
