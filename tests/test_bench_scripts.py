"""bench/bench_step.py and bench/gpu_check.py run, in their smallest forms, and write the JSON they promise (the
figures themselves are measurements for an idle machine or a GPU, not checked here)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_bench_step_tiny_writes_phases_floors_and_ratios(tmp_path):
    out = tmp_path / "bench_step.json"
    proc = run(["bench/bench_step.py", "--tiny", "--device", "cpu", "--settings", "demo", "13m", "--repeats", "1",
                "--warmup", "0", "--out", str(out)])
    assert "| update / (fwd+bwd + AdamW)" in proc.stdout and "machine:" in proc.stdout
    report = json.loads(out.read_text())
    assert {"machine", "date", "settings"} <= report.keys()
    for name in ("demo", "13m"):
        r = report["settings"][name]
        assert set(r["phases"]) == {"rollout", "reward", "scoring", "advantages", "update", "step"}
        assert set(r["floors"]) == {"sampling", "update_fwd_bwd", "update_adamw", "update"}
        assert set(r["ratios"]) == {"update/floor", "update/fwd_bwd", "sampling/floor"}
        assert all(v > 0 for v in r["ratios"].values())
        assert all(p["median_s"] > 0 for k, p in r["phases"].items() if k in ("rollout", "scoring", "update"))
        assert r["rollouts"][0]["B"] == 4 and r["config"]["max_new_tokens"] == 16
        assert r["optimizer_steps_per_update"] == 4  # 2 mini-batches x 2 models
        assert r["memory"]["peak_mb"] > 0
    assert 12e6 < report["settings"]["13m"]["model"]["policy_params"] < 14e6


def test_gpu_check_tiny_runs_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = run(["bench/gpu_check.py", "--tiny", "--device", "cpu", "--steps", "1", "--out", str(out)])
    assert "README arithmetic" in proc.stdout
    report = json.loads(out.read_text())
    assert {"machine", "date", "model", "config", "steps", "generation", "update", "memory", "wall_s"} <= report.keys()
    assert report["steps_done"] == 1 and len(report["steps"]) == 1
    assert report["config"]["bf16"] and report["config"]["gradient_checkpointing"]  # the gpu-0.5b preset's
    shape = report["model"]["config"]
    assert shape["num_attention_heads"] == 14 and shape["num_key_value_heads"] == 2 and shape["num_hidden_layers"] == 2
    assert report["generation"]["tokens_per_s"] > 0 and report["update"]["tokens_per_s"] > 0
    assert 0 < report["update"]["mfu"] < 1
    readme = report["memory"]["readme"]  # README.md's 33 GB (update) and 30 GB (sampling), from its arithmetic
    assert round(readme["update_peak_gb"]) == 33 and round(readme["sampling_peak_gb"]) == 30
    assert len(report["checkpoint_s"]) == 2  # at step 0 and at the end: vapo.train's real path
