"""What a first GPU run meets on the one-GPU and vLLM paths, checked on a CPU: a run's models freed when train()
returns, a prompt too long for the vLLM engine refused at load with its row named, --device cuda:N refused with
vLLM before anything loads, and the engine asleep around the teaching views' scoring (a stub vLLM, as in
test_vllm_engine.py)."""
import contextlib
import gc
import importlib.util
import types
import weakref

import pytest
import torch

import vapo
from machinery import run
from machinery import views as views_mod
from machinery.engines import HFEngine
from machinery.models import SingleProcess
from scale import vllm_engine

TINY_RUN = dict(steps=1, prompts_per_step=2, samples_per_prompt=2, mini_batch_size=4, micro_batch_size=2,
                max_new_tokens=8, value_pretrain_steps=1, eval_prompts=2, eval_samples=1, eval_every=1,
                save_every=0, report_to="none", device="cpu")


def test_train_frees_its_models_when_it_returns(tiny_model_dir, tmp_path, monkeypatch):
    """Run and its TokenViews referred to each other, a cycle that only a full garbage collection frees: the
    models, optimizers and engine stayed allocated (16 GB on a GPU at 0.5B) after train() returned. With the
    collector off, nothing of them may be left once train returns."""
    held = []
    attach = run.Run.attach

    def spy(self, policy, critic, tokenizer, optimizers, engine, observers):
        held.extend(weakref.ref(m) for m in (policy, critic))
        attach(self, policy, critic, tokenizer, optimizers, engine, observers)
    monkeypatch.setattr(run.Run, "attach", spy)
    cfg = vapo.Config(model=tiny_model_dir, output_dir=str(tmp_path / "run"), **TINY_RUN).validate()
    gc.collect()
    gc.disable()
    try:
        vapo.train(cfg)
        alive = [type(r()).__name__ for r in held if r() is not None]
    finally:
        gc.enable()
    assert len(held) == 2 and alive == [], f"still referenced after train returned: {alive}"


def test_a_prompt_longer_than_the_vllm_engines_room_is_refused_at_load(tiny_model_dir, tmp_path):
    """vLLM's max_model_len is max_new_tokens + 2,048, capped by the model's max_position_embeddings (1,024 for the
    tiny model); vLLM refuses a prompt that fills it and stops a response short where prompt + response reach it,
    mid-run. load_inputs refuses such a prompt first, naming the row and the room."""
    cfg = vapo.Config(model=tiny_model_dir, output_dir=str(tmp_path / "run"), engine="vllm",
                      **{**TINY_RUN, "max_new_tokens": 1010}).validate()
    assert vllm_engine.vllm_max_model_len(1010, types.SimpleNamespace(max_position_embeddings=1024)) == 1024
    with pytest.raises(SystemExit, match=r"training row \d+: .*\d+ tokens.*room for 14 .*max_model_len 1024"):
        run.load_inputs(cfg, False, False, SingleProcess())
    ok = vapo.Config(model=tiny_model_dir, output_dir=str(tmp_path / "ok"), engine="vllm", **TINY_RUN).validate()
    run.load_inputs(ok, False, False, SingleProcess())  # 8 new tokens: room for every built-in prompt


def test_check_prompt_room_names_the_first_row_too_long(tokenizer):
    rows = [{"prompt": "short"}, {"prompt": "x" * 40}, {"prompt": "y" * 50}]
    room = lambda n: types.SimpleNamespace(max_position_embeddings=n)  # noqa: E731  max_model_len n
    vllm_engine.check_prompt_room(rows, [], tokenizer, 8, room(108))
    with pytest.raises(SystemExit, match=r"training row 2: 40 tokens of prompt \(and 1 more\).*room for 30"):
        vllm_engine.check_prompt_room(rows, [], tokenizer, 8, room(38))
    with pytest.raises(SystemExit, match=r"held-out row 1: 5 tokens"):
        vllm_engine.check_prompt_room([], rows[:1], tokenizer, 8, room(12))


def test_device_cuda_n_with_vllm_is_refused_before_anything_loads(tmp_path):
    """One process's vLLM engine runs on GPU 0 whatever --device says (below, vLLM's own code where installed):
    --device cuda:1 --engine vllm is refused at once, before any model or data loads (the model folder here does
    not even exist), saying how to pick the GPU. cuda:0 and a sharded run's devices are not refused."""
    cfg = vapo.Config(model=str(tmp_path / "no-such-model"), engine="vllm", device="cuda:1",
                      output_dir=str(tmp_path / "run"), steps=1).validate()
    with pytest.raises(SystemExit, match=r"CUDA_VISIBLE_DEVICES=1 and --device cuda"):
        run.load_inputs(cfg, False, False, SingleProcess())
    vllm_engine.check_vllm_device(torch.device("cuda", 0), distributed=False)
    vllm_engine.check_vllm_device(torch.device("cuda"), distributed=False)
    vllm_engine.check_vllm_device(torch.device("cuda", 3), distributed=True)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed: the finding is read "
                    "from its source (pip install -r scale/requirements-cpu.txt)")
def test_vllms_in_process_executor_takes_gpu_0_from_a_bare_cuda_device():
    """The finding behind the refusal, in vLLM's own code: its device config holds torch.device("cuda") (no
    index) on a GPU platform, and the in-process executor takes the worker's local rank, the GPU it runs on, from
    that device's index: 0."""
    from vllm.v1.executor.uniproc_executor import UniProcExecutor
    config = types.SimpleNamespace(device_config=types.SimpleNamespace(device=torch.device("cuda")))
    _, rank, local_rank = UniProcExecutor._distributed_args(types.SimpleNamespace(vllm_config=config))
    assert (rank, local_rank) == (0, 0)


class SleepyEngine:
    """An engine as the trainer sees it: idle() is where a vLLM engine on a GPU sleeps, and leaving it where it takes
    the policy's weights (test_vllm_engine.py checks VLLMEngine.idle itself)."""

    def __init__(self, calls):
        self.calls, self.asleep = calls, False

    @contextlib.contextmanager
    def idle(self, weights_change=True):
        self.calls.append(f"idle, weights change: {weights_change}")
        self.asleep = True
        yield
        self.asleep = False
        self.calls.append("awake")


def test_the_views_score_with_the_engine_asleep(tiny_policy, tokenizer, monkeypatch):
    """The teaching views score the probes with the policy (float32 logits of a micro-batch: gigabytes at a 150k
    vocabulary) between rollouts, when the engine is awake; they put it to sleep around that scoring and write
    the weights back after, so the scoring never shares the device with the engine's memory."""
    calls = []
    engine = SleepyEngine(calls)
    monkeypatch.setattr(views_mod, "score_rollout", lambda *a, **k: calls.append(f"score asleep={engine.asleep}") or
                        {"old_logprobs": torch.zeros(1, 1)})
    views = views_mod.TokenViews.__new__(views_mod.TokenViews)
    views.cfg = vapo.Config(steps=1, micro_batch_size=2)
    views.run = types.SimpleNamespace(engine=engine, generated=0, evaluates=lambda *a: True)
    views.enabled, views.probes, views.old_logprobs = True, (object(), None), None
    views.keep_old(tiny_policy, 1)
    assert calls == ["idle, weights change: False", "score asleep=True", "awake"] and not engine.asleep
    with HFEngine(tiny_policy, tokenizer).idle():
        pass  # the HF engine of one process samples from the policy itself: nothing to free or sync


def test_value_pretraining_trains_the_critic_with_the_engine_asleep(tiny_policy, monkeypatch):
    """Value pretraining samples with the engine, then scores and trains the critic (its gradients, AdamW's
    temporaries, a micro-batch's logits) with the engine asleep, and writes the policy's weights back to wake it:
    the same pattern as an RL step's update."""
    from machinery.models import value_model_from_policy
    calls = []
    engine = SleepyEngine(calls)
    critic = value_model_from_policy(tiny_policy)
    cfg = vapo.Config(steps=1, prompts_per_step=1, samples_per_prompt=2, mini_batch_size=2, micro_batch_size=2,
                      value_pretrain_steps=2)
    fake = types.SimpleNamespace(response_mask=torch.ones(2, 3), lengths=torch.full((2,), 3), B=2)
    monkeypatch.setattr(vapo, "sample_round", lambda *a: calls.append(f"sample asleep={engine.asleep}") or
                        (fake, torch.tensor([1.0, -1.0]), {}))
    monkeypatch.setattr(vapo, "score_rollout", lambda *a, **k: calls.append(f"score asleep={engine.asleep}") or
                        {"values": torch.zeros(2, 3)})
    monkeypatch.setattr(vapo, "update", lambda *a, **k: calls.append(f"update asleep={engine.asleep}") or
                        {"skipped_nonfinite": 0})
    rows = [{"prompt": "p", "answer": "1"}]
    assert vapo.pretrain_value(tiny_policy, critic, {}, engine, rows, cfg, None, emit=lambda r: None)
    assert calls == ["sample asleep=False", "idle, weights change: False", "score asleep=True", "update asleep=True",
                     "awake"] * 2 and not engine.asleep


def test_the_32b_arithmetic_gives_a_share_that_starts():
    """scale/memory.py: one engine per GPU (--vllm-tp 1) of the 32B policy needs 0.6 of a 141 GB GPU (weights 65.5
    GB + 8 sequences of KV cache), more than the default --vllm-memory 0.4, and cannot fit 80 GB; --vllm-tp 4 fits
    80 GB at the default. The update's logits: bf16 + 4 float32 copies, 25 GB for one 9,216-token sequence."""
    from scale import memory
    c = memory.QWEN25_32B
    assert 0.4 < memory.engine_share(c, 1, 8 * 9216, 141) < 0.65
    assert memory.engine_share(c, 1, 8 * 9216, 80) > 1
    assert memory.engine_share(c, 4, 8 * 9216, 80) < 0.4
    rows = {name: size for name, _, size in memory.per_gpu(c, 64, 9216, 1, 8 * 9216)}
    logits = next(size for name, size in rows.items() if name.startswith("update: logits"))
    assert round(logits / 1e9, 1) == 25.2


def test_phase_timings_wait_for_the_gpu_only_on_a_gpu(monkeypatch):
    """vapo.timed on a CUDA device waits for the queued kernels before and after the block, so a phase's time/*
    figure counts its own GPU work, and records the phase's own peak of allocated and reserved memory (the counters
    reset at its start; a phase timed twice in a step keeps the larger); on a CPU, or with no device, it never calls
    into CUDA (checked here with torch.cuda's functions replaced by recorders: no GPU is needed)."""
    calls, peaks = [], iter([3e9, 4e9, 2e9, 5e9])  # allocated, reserved; then the second block's
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: next(peaks))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: next(peaks))
    stats = {}
    gpu = torch.device("cuda", 0)
    with vapo.timed(stats, "update", gpu):
        calls.append("block")
    assert calls == [gpu, "reset", "block", gpu] and stats["time/update"] >= 0
    assert (stats["memory/update_peak_gb"], stats["memory/update_reserved_gb"]) == (3.0, 4.0)
    with vapo.timed(stats, "update", gpu):
        pass
    assert (stats["memory/update_peak_gb"], stats["memory/update_reserved_gb"]) == (3.0, 5.0)
    calls.clear()
    stats = {}
    with vapo.timed(stats, "update", torch.device("cpu")):
        pass
    with vapo.timed(stats, "update"):
        pass
    assert calls == [] and list(stats) == ["time/update"]


def test_making_the_vllm_engine_leaves_the_trainers_random_streams_as_they_were(tiny_policy, tokenizer, monkeypatch):
    """vLLM seeds torch, random and numpy in the process that makes an in-process engine (as its worker starts and
    after its warm-up), after the trainer seeded them: the mini-batch order would then be vLLM's. make_vllm_engine
    keeps the streams as they were around an engine that re-seeds them (here a stand-in that seeds with 999)."""
    import random
    monkeypatch.setattr(vllm_engine, "VLLMEngine", lambda *a, **k: (torch.manual_seed(999), random.seed(999)))
    cfg = vapo.Config(engine="vllm", max_new_tokens=8)
    torch.manual_seed(0)
    random.seed(0)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(0)
    random.seed(0)
    vllm_engine.make_vllm_engine(cfg, tiny_policy, tokenizer, SingleProcess())
    drawn = (torch.rand(3), random.random())
    assert torch.equal(drawn[0], expected[0]) and drawn[1] == expected[1]
