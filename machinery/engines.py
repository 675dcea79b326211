"""The sampling engine: G samples per prompt -> Rollout, and a run's engine made and kept in step with the policy.

The engine is an interface in all but name: anything with `generate(prompts, n, temperature, top_p, max_new_tokens,
seed) -> Rollout` and `idle()` can replace HFEngine (scale/vllm_engine.py's VLLMEngine does), and rollout.py's
scoring functions take any Rollout.

    HFEngine             rollout.sample over a Hugging Face model: the training policy itself in one process
                         (nothing to sync), a whole copy of it in a sharded run (synced after every update)
    make_engine          a run's engine (--engine hf | vllm)
"""
from __future__ import annotations

import contextlib
import logging

import torch

from config import stream
from rollout import Rollout, sample
from machinery import world
from machinery.decoding import on_fast_path, use_grouped_attention
from machinery.models import float32_head, load_policy

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
    weights: None, the model is the training policy itself; else the model is the engine's own copy (a sharded
    run: the policy is split over processes and cannot sample alone), and weights() gives the policy's (name, full
    tensor) pairs, which idle() writes into it after every update, as into a vLLM engine.
    grouped_decode: the model's decode steps attend with decoding.grouped_attention, which reads the cached KV heads
    without copying them to every query head (the model's other passes are unchanged: they take transformers' own
    SDPA path, bit for bit); None: on a GPU (decoding.on_fast_path). Where transformers' own SDPA already decodes
    grouped (decoding.TRANSFORMERS_DECODES_GROUPED) it is left to do so and this is False. It equals transformers' SDPA to rounding, not
    bit for bit, so a CPU run keeps its numbers by default.
    """

    def __init__(self, model, tokenizer, max_new_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0,
                 batch_size: int | None = None, weights=None, grouped_decode: bool | None = None):
        self.model = model
        if on_fast_path(self.device) if grouped_decode is None else grouped_decode:
            self.grouped_decode = use_grouped_attention(model)  # False for a model on another attention
        else:
            self.grouped_decode = False
        self.weights = weights
        self.own_weights = weights is not None
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

    @contextlib.contextmanager
    def idle(self, weights_change: bool = True):
        """Around work that runs while the engine does not sample (scoring and the update, the teaching views): an
        engine with weights of its own takes the policy's on leaving, if they changed (load_weights)."""
        yield
        if self.own_weights and weights_change:
            self.load_weights(self.weights())

    @torch.no_grad()
    def load_weights(self, named_tensors):
        """(name, full tensor) pairs, e.g. models.SingleProcess.named_full_tensors(policy), copied into the
        engine's own model one at a time. A name the model does not have is an error, not skipped."""
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


# --- making and syncing a run's engine ----------------------------------------------------------------------
HF_ENGINE_MAX_PARAMS = 2e9  # a sharded run's HF engine holds a whole float32 copy per process: refused above this


def sampling_seed(cfg) -> int:
    """The seed of this process's sampler (config.STREAMS["trainer"]), run.seed_all's: each process its own, except
    the processes of one tensor-parallel vLLM engine (--vllm-tp), which must sample alike."""
    return stream(cfg.seed, "trainer") + world.rank() // (cfg.vllm_tp if cfg.engine == "vllm" else 1)


def make_engine(cfg, policy, tokenizer, layout, critic=None):
    """The sampler of a run's rollouts and evaluations (cfg.engine, a config.Config), started once the models are
    loaded (sharded ones: only this process's shards). "hf": in one process our KV-cached loop over the policy
    itself (nothing to sync); sharded, over a whole copy of the policy read from its folder, given the policy's
    weights through layout after every update (HFEngine.idle), refused above HF_ENGINE_MAX_PARAMS. "vllm": a vLLM
    engine per process (scale/vllm_engine.py, imported only then). critic: for the memory the trainer keeps."""
    if cfg.engine == "vllm":
        from scale.vllm_engine import make_vllm_engine  # optional, heavy
        return make_vllm_engine(cfg, policy, tokenizer, layout, critic)
    if world.world_size() == 1:
        return HFEngine(policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                        top_p=cfg.top_p)
    params = sum(p.numel() for p in policy.parameters())  # a sharded parameter's numel is the whole tensor's
    if params > HF_ENGINE_MAX_PARAMS:
        raise SystemExit(f"--engine hf: a sharded run's HF engine holds a whole float32 copy of the policy in every "
                         f"process ({params / 1e9:.1f}B parameters, {4 * params / 1e9:.0f} GB each); above "
                         f"{HF_ENGINE_MAX_PARAMS / 1e9:g}B use --engine vllm")
    copy_of_policy, _ = load_policy(policy.name_or_path, dtype=torch.float32, device=policy.device)
    if cfg.fp32_lm_head:
        float32_head(copy_of_policy)
    return HFEngine(copy_of_policy, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                    top_p=cfg.top_p, weights=lambda: layout.named_full_tensors(policy))
