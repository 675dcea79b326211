"""Rollouts: G samples per prompt from the current policy, the loop that samples them, and the per-token log-probs
and values of those samples.

    prompts --engines.HFEngine.generate--> sample (the KV-cached loop below) --> Rollout (token ids, masks, lengths,
                                                                                 sampler log-probs and entropy)
    Rollout --score_rollout--> old log-probs, values, entropy (no grad: step 3 of the loop; the trainer takes the
                               old log-probs and entropy from the sampler instead where they are the policy's
                               own, see vapo.old_logprobs_from_sampler, and then scores the critic alone)
    Rollout --response_logprobs / response_values--> the same, with grad (inside the update, step 5)

Layout of one sample b of a Rollout (P prompt columns, left-padded; T response columns, right-padded):

    prompt_ids[b]    pad pad  p0  p1  p2        prompt_mask[b]    0 0 1 1 1
    response_ids[b]  r0  r1  r2  EOS pad pad    response_mask[b]  1 1 1 1 0 0     lengths[b] = 4

The EOS token is part of the response (mask 1): it is an action like any other, and the policy has to learn when to
take it; the reward sits on it. A response cut at max_new_tokens has no EOS and `truncated[b]` is True.

Group sampling (paper technique 7): the G = n samples of prompt i are rows b = i * G + g, g = 0..G-1, and
`prompt_index[b] = i`.

The sampling loop (sample, sample_next) is ours rather than `model.generate`, and shares position_ids and entropy_of
with the scoring functions, so that sampling and scoring count positions and entropy the same way. On a GPU it
takes a fast path that keeps its numbers (machinery/decoding.py: a KV cache allocated once; the HF engine switches
the policy's decode attention to one that does not copy the cache to every query head). The scoring functions take
any Rollout, whichever engine sampled it (engines.py); rollout_from_tokens builds one from token lists (a vLLM
engine's output, a recorded response).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from machinery.decoding import on_fast_path, preallocated_cache  # the sampler's GPU fast path


@dataclass
class Rollout:
    """A batch of B = prompts x G sampled responses, as tensors. Masks are 0/1 `torch.long`."""
    prompt_ids: torch.Tensor  # [B, P] left-padded with pad_id
    prompt_mask: torch.Tensor  # [B, P] 1 on real prompt tokens
    response_ids: torch.Tensor  # [B, T] right-padded with pad_id
    response_mask: torch.Tensor  # [B, T] 1 on real response tokens, the EOS token included
    lengths: torch.Tensor  # [B] long, = response_mask.sum(1)
    truncated: torch.Tensor  # [B] bool, hit max_new_tokens without an EOS
    sampler_logprobs: torch.Tensor  # [B, T] float32, log-prob under the sampling distribution; 0 under the mask
    prompt_index: torch.Tensor  # [B] long, which input prompt row b came from
    texts: list[str]  # [B] decoded responses, special tokens (EOS) left out
    pad_id: int = 0
    entropy: torch.Tensor | None = None  # [B, T] float32, the sampler's entropy per token (see sample_next),
    # 0 under the mask; None when the engine does not give it (vLLM returns the chosen tokens' log-probs only)

    @property
    def B(self) -> int:
        return self.response_ids.shape[0]

    @property
    def T(self) -> int:
        return self.response_ids.shape[1]

    @property
    def P(self) -> int:
        return self.prompt_ids.shape[1]

    def select(self, idx, min_T: int = 0) -> "Rollout":
        """The rows `idx` (list of ints, long or bool tensor, or slice), as a Rollout of their own. Padding columns
        that only the left-out rows needed are dropped (P and T shrink to the longest selected prompt and
        response), which changes nothing for the selected rows: those columns are masked for all of them.
        min_T: keep at least this many response columns (padding if need be), e.g. 1 so that a micro-batch of
        empty responses still has a forward pass (the sharded update needs every process to run one)."""
        if isinstance(idx, slice):
            idx = range(self.B)[idx]
        idx = torch.as_tensor(idx, device=self.response_ids.device).reshape(-1)
        if idx.dtype == torch.bool:
            idx = idx.nonzero().squeeze(1)
        idx = idx.long()
        lengths = self.lengths[idx]  # [b]
        P = int(self.prompt_mask[idx].sum(1).max()) if len(idx) else 0
        T = max(int(lengths.max()) if len(idx) else 0, min_T)
        widen = (0, max(T - self.T, 0))  # only when min_T asks for more columns than there are
        return Rollout(
            prompt_ids=self.prompt_ids[idx, self.P - P:],  # [b, P'] left padding: keep the right-most columns
            prompt_mask=self.prompt_mask[idx, self.P - P:],  # [b, P']
            response_ids=F.pad(self.response_ids[idx, :T], widen, value=self.pad_id),  # [b, T']
            response_mask=F.pad(self.response_mask[idx, :T], widen),  # [b, T']
            lengths=lengths,
            truncated=self.truncated[idx],
            sampler_logprobs=F.pad(self.sampler_logprobs[idx, :T], widen),  # [b, T']
            prompt_index=self.prompt_index[idx],
            texts=[self.texts[i] for i in idx.tolist()],
            pad_id=self.pad_id,
            entropy=None if self.entropy is None else F.pad(self.entropy[idx, :T], widen),  # [b, T']
        )

    def to(self, device) -> "Rollout":
        return Rollout(**{f.name: getattr(self, f.name).to(device) if torch.is_tensor(getattr(self, f.name))
                          else getattr(self, f.name) for f in fields(self)})

    @staticmethod
    def cat(rollouts: list["Rollout"]) -> "Rollout":
        """Stack rollouts row-wise, padding prompts on the left and responses on the right to a common P and T.
        `prompt_index` is kept as it is: offset it beforehand if the parts index different prompt lists."""
        P = max(r.P for r in rollouts)
        T = max(r.T for r in rollouts)
        pad = rollouts[0].pad_id

        def stack(name, width, left, value):
            parts = [getattr(r, name) for r in rollouts]
            parts = [F.pad(x, (width - x.shape[1], 0) if left else (0, width - x.shape[1]), value=value)
                     for x in parts]
            return torch.cat(parts, 0)  # [sum of B, width]

        return Rollout(
            prompt_ids=stack("prompt_ids", P, True, pad),
            prompt_mask=stack("prompt_mask", P, True, 0),
            response_ids=stack("response_ids", T, False, pad),
            response_mask=stack("response_mask", T, False, 0),
            lengths=torch.cat([r.lengths for r in rollouts]),
            truncated=torch.cat([r.truncated for r in rollouts]),
            sampler_logprobs=stack("sampler_logprobs", T, False, 0.0),
            prompt_index=torch.cat([r.prompt_index for r in rollouts]),
            texts=[t for r in rollouts for t in r.texts],
            pad_id=pad,
            entropy=None if any(r.entropy is None for r in rollouts) else stack("entropy", T, False, 0.0),
        )


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so a left-padded prompt starts at 0 like an unpadded one (padding
    columns get 0; they are masked anyway). [B, L] -> [B, L]."""
    return (attention_mask.long().cumsum(1) - 1).clamp(min=0)


def entropy_of(logits: torch.Tensor, logsumexp: torch.Tensor | None = None) -> torch.Tensor:
    """H = logsumexp(z) - sum_v softmax(z)_v z_v over the last dimension: [..., V] float32 -> [...].
    logsumexp: logits.logsumexp(-1) [...] when the caller has it already (not computed twice)."""
    logsumexp = logits.logsumexp(-1) if logsumexp is None else logsumexp
    return logsumexp - (logits.softmax(-1) * logits).sum(-1)


# ---- sampling: the KV-cached loop that fills a Rollout (engines.HFEngine calls sample) ----------------------

COMPACT_FRACTION = 0.125  # drop finished rows from the sampling batch once they are this share of it


def _cache_kwarg(model) -> str:
    # transformers 5.x renamed the forward argument `past_key_values` to `cache`; accept either.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _output_cache(out):
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator=None):
    """One sampling step. logits [B, V] float32 -> (token [B] long, log-prob of that token [B] float32,
    entropy [B] float32).

    The log-prob is under the distribution actually sampled from: softmax(logits / temperature), restricted to the
    top-p nucleus (the smallest set of most likely tokens with mass >= top_p) and renormalised. With top_p < 1 it is
    therefore NOT the policy's log-prob at that temperature (rollout.response_logprobs computes that one); with
    top_p = 1 the two agree. temperature 0 is greedy: the token is the argmax and its log-prob is taken at
    temperature 1 (the sampling distribution itself would be a point mass, log-prob 0, which tells nothing).
    The entropy is the policy's at that temperature, before top-p, H = logsumexp(z) - sum_v softmax(z)_v z_v with
    z = logits / temperature (temperature 1 when greedy): what rollout.response_logprobs(with_entropy=True)
    computes.
    """
    if temperature == 0:
        token = logits.argmax(-1)  # [B]
        return token, logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(1), entropy_of(logits)
    logits = logits / temperature
    entropy = entropy_of(logits)  # [B]
    if top_p < 1.0:
        sorted_logits, order = logits.sort(-1, descending=True)  # [B, V]
        probs = sorted_logits.softmax(-1)
        outside = probs.cumsum(-1) - probs >= top_p  # the mass before this token already reaches top_p
        sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)  # back to vocabulary order
    logprobs = logits.log_softmax(-1)  # [B, V]
    token = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(1)  # [B]
    return token, logprobs.gather(-1, token[:, None]).squeeze(1), entropy


@torch.no_grad()
def sample(model, prompt_ids, prompt_mask, max_new_tokens: int, temperature: float, top_p: float,
           eos_ids: list[int], pad_id: int, generator=None, n: int = 1, preallocate: bool | None = None):
    """Autoregressive sampling with a KV cache, one token per step for every unfinished row, until every row has
    produced an EOS or max_new_tokens steps have run. A row that is done gets pad tokens with log-prob 0.

    prompt_ids, prompt_mask [N, P] left-padded; n samples of each prompt, rows b = i * n + g of the B = N * n
    outputs -> (tokens [B, T0] long, logprobs [B, T0] float32, entropy [B, T0] float32), T0 <= max_new.
    Our own loop rather than `model.generate`: generate only exposes the sampling distribution through
    `output_scores`, a [B, V] tensor per step kept for the whole generation (gigabytes for a 150k vocabulary),
    while this loop keeps one [B, V] at a time.
    The G = n samples of a prompt share it: the prompts go through the model once (N rows) and their KV cache is
    repeated n times (on the demo the prefill of 128 rows was a quarter of a rollout; see docs/results.md).
    Finished rows leave the batch (and the KV cache) once they are at least COMPACT_FRACTION of it, so a batch
    of ragged lengths does not pay for its longest response on every row (docs/results.md, "The sampler"). One host sync
    per generated token (the count of finished rows), which a GPU otherwise waits on several times a step.
    preallocate: the KV cache is a decoding.PreallocatedLayer per layer, allocated once for prompt + max_new_tokens
    and filled in place, in the autocast dtype when autocast is on (False: transformers' own cache, which grows by
    concatenation; docs/results.md, "The sampler", compares the two; None: preallocated on a GPU, where it pays).
    The attention mask is preallocated in either case.
    """
    device = prompt_ids.device
    preallocate = on_fast_path(device) if preallocate is None else preallocate
    eos = torch.tensor(eos_ids, device=device)
    P = prompt_ids.shape[1]
    positions = position_ids(prompt_mask)  # [N, P]
    # the mask of every column the generation can reach, [N, P + max_new]; step t passes its first P + t + 1
    attention_mask = F.pad(prompt_mask.long(), (0, max_new_tokens), value=1)
    cache_kw = _cache_kwarg(model)
    autocast_dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    cache = preallocated_cache(model, P + max_new_tokens, autocast_dtype) if preallocate else None
    out = model(input_ids=prompt_ids, attention_mask=attention_mask[:, :P], position_ids=positions, use_cache=True,
                logits_to_keep=1, **({cache_kw: cache} if cache is not None else {}))
    cache = _output_cache(out)
    logits = out.logits[:, -1]  # [N, V]
    if n > 1:
        if not hasattr(cache, "batch_repeat_interleave"):  # a cache class that cannot be repeated: no sharing
            return sample(model, prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0),
                          max_new_tokens, temperature, top_p, eos_ids, pad_id, generator, preallocate=preallocate)
        cache.batch_repeat_interleave(n)  # [N, ...] -> [N * n, ...], rows i * n + g
        logits, attention_mask, positions = (x.repeat_interleave(n, 0) for x in (logits, attention_mask, positions))
    B = logits.shape[0]
    next_position = positions[:, -1:] + 1  # [B, 1]; the last prompt column is real in every row (left padding)
    can_compact = hasattr(cache, "batch_select_indices")
    rows = torch.arange(B, device=device)  # [b] the original row of each row still in the batch
    done = torch.zeros(B, dtype=torch.bool, device=device)  # [b] rows in the batch that have finished
    tokens = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)  # [B, max_new]
    logprobs = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device)  # [B, max_new]
    entropy = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device)  # [B, max_new]
    steps = 0
    for t in range(max_new_tokens):
        token, logprob, h = sample_next(logits.float(), temperature, top_p, generator)  # [b] each
        # finished rows write what they already hold (pad, 0): index by rows, no boolean mask, no host sync
        tokens[rows, t] = token.masked_fill(done, pad_id)
        logprobs[rows, t] = logprob.masked_fill(done, 0.0)
        entropy[rows, t] = h.masked_fill(done, 0.0)
        steps = t + 1
        done |= torch.isin(token, eos)
        n_done = int(done.sum())  # the one host sync of a step: stop, or compact
        if n_done == len(rows):
            break
        if can_compact and n_done >= COMPACT_FRACTION * len(rows):
            keep = (~done).nonzero().squeeze(1)  # [b']
            cache.batch_select_indices(keep)
            rows, done, token = rows[keep], done[keep], token[keep]
            attention_mask, next_position = attention_mask[keep], next_position[keep]
        token = token.masked_fill(done, pad_id)
        out = model(input_ids=token[:, None], attention_mask=attention_mask[:, :P + t + 1],  # [b, P + t + 1]
                    position_ids=next_position, use_cache=True, **{cache_kw: cache})
        cache = _output_cache(out)
        logits = out.logits[:, -1]  # [b, V]
        next_position = next_position + 1
    return tokens[:, :steps], logprobs[:, :steps], entropy[:, :steps]  # [B, T0] each


# ---- scoring: log-probs and values of a Rollout ---------------------------------------------------------------

def _inputs(rollout: Rollout):
    """The model input that scores every response token in one forward pass: the prompt followed by the response
    without its last column (whose output would predict past the end). [B, P + T - 1] ids, mask and positions."""
    input_ids = torch.cat([rollout.prompt_ids, rollout.response_ids[:, :-1]], 1)  # [B, P + T - 1]
    attention_mask = torch.cat([rollout.prompt_mask, rollout.response_mask[:, :-1]], 1).long()  # [B, P + T - 1]
    return input_ids, attention_mask, position_ids(attention_mask)


def response_logprobs(model, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False):
    """log pi(r_t | prompt, r_<t) of every response token under `model` at `temperature`, with gradients.

    Returns (logprobs [B, T] float32, entropy [B, T] float32 or None), both exactly 0 under the mask. The output at
    input position P-1+t predicts response token t. Computed in float32 from the chosen token's logit minus the
    logsumexp over the vocabulary, so no [B, T, V] log-softmax is kept beyond the float32 logits themselves; the
    entropy H = logsumexp(z) - sum_v softmax(z)_v z_v needs the whole distribution and is only computed on request.
    These equal the sampler's log-probs on the same weights when the rollout was sampled with top_p = 1 at the same
    temperature (see sample_next); for top_p < 1 they are the untruncated policy's, as PPO's ratio needs.
    """
    if rollout.T == 0:  # only empty responses: nothing to score (and logits_to_keep=0 would mean "keep all")
        empty = rollout.response_mask.float()  # [B, 0]
        return empty, (empty if with_entropy else None)
    input_ids, attention_mask, positions = _inputs(rollout)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False,
                logits_to_keep=rollout.T)
    logits = out.logits.float()  # [B, T, V], position P-1+t predicts response token t
    if temperature != 1.0:
        logits = logits / temperature
    logsumexp = logits.logsumexp(-1)  # [B, T]
    chosen = logits.gather(-1, rollout.response_ids[..., None]).squeeze(-1)  # [B, T]
    mask = rollout.response_mask.bool()
    logprobs = torch.where(mask, chosen - logsumexp, 0.0)  # [B, T]
    entropy = None
    if with_entropy:
        entropy = torch.where(mask, entropy_of(logits, logsumexp), 0.0)  # [B, T]
    return logprobs, entropy


def response_values(value_model, rollout: Rollout) -> torch.Tensor:
    """values[b, t] = V(s_t), the value of the state before response token t, with gradients; 0 under the mask.

    The value head's output at a position is the value of the state that ends with that position's token, so
    V(s_t) is read at the token just before r_t: the last prompt token for t = 0.

        input position   ...  P-2   P-1   P    P+1  ...  P+T-2
        input token      ...  p     p     r0   r1   ...  r_{T-2}
        head output            .  V(s_0) V(s_1) V(s_2) ... V(s_{T-1})
        values[b, :]             [  0     1     2   ...   T-1 ]

    The state after the last token (s_T, after the EOS) is terminal: V = 0 there by definition, so it is not
    computed (GAE uses 0, see gae.py). Returns [B, T] float32.
    """
    if hasattr(value_model, "values_of"):  # a constructed critic (machinery/run.py, Hooks): it computes its own
        return value_model.values_of(rollout)
    if rollout.T == 0:  # only empty responses: no state to value (and [:, -0:] would select every position)
        return rollout.response_mask.float()  # [B, 0]
    input_ids, attention_mask, positions = _inputs(rollout)
    out = value_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
    values = out.logits[:, -rollout.T:, 0].float()  # [B, T]: positions P-1 .. P+T-2
    return torch.where(rollout.response_mask.bool(), values, 0.0)


@torch.no_grad()
def score_rollout(policy, value_model, rollout: Rollout, micro_batch_size: int = 16, temperature: float = 1.0
                  ) -> dict[str, torch.Tensor]:
    """Step 3 of the loop: the old policy's log-probs and entropy, and the critic's values, of every response token,
    without gradients, `micro_batch_size` rows per forward pass, models in eval mode (their modes are restored).

    Returns {"old_logprobs": [B, T], "entropy": [B, T], "values": [B, T]} (float32, 0 under the mask), "values"
    only when value_model is not None (GRPO-style runs have no critic), the other two only when policy is not
    None (value pretraining scores the critic alone).
    """
    models = [m for m in (policy, value_model) if m is not None]
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    parts: dict[str, list[torch.Tensor]] = {}
    order = by_length(rollout, torch.arange(rollout.B, device=rollout.lengths.device))
    try:
        for micro in order.split(micro_batch_size):
            mb = rollout.select(micro)  # trimmed to its own longest prompt and response
            widen = (0, rollout.T - mb.T)  # back to the full batch's T
            if policy is not None:
                logprobs, entropy = response_logprobs(policy, mb, temperature, with_entropy=True)
                parts.setdefault("old_logprobs", []).append(F.pad(logprobs, widen))
                parts.setdefault("entropy", []).append(F.pad(entropy, widen))
            if value_model is not None:
                parts.setdefault("values", []).append(F.pad(response_values(value_model, mb), widen))
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)
    unsort = order.argsort()  # rows back in the rollout's order
    return {k: torch.cat(v, 0)[unsort] for k, v in parts.items()}  # each [B, T]


def by_length(rollout: Rollout, idx: torch.Tensor) -> torch.Tensor:
    """The row indices idx reordered by total length (prompt + response), so that consecutive micro-batches hold
    rows of similar length and Rollout.select trims most of their padding. On the demo's rollouts (1 to 10 step
    problems in one batch) a forward and backward pass in sorted micro-batches of 16 was 2.5x faster than one
    pass and 1.3x faster than micro-batches in rollout order (bench/bench_micro_batches.py at commit
    758a9d0). Stable sort, so deterministic. idx may live on any device (the trainer draws its mini-batch order on the CPU); the result
    lives on the rollout's, ready to index its tensors."""
    idx = idx.to(rollout.lengths.device)
    total = rollout.prompt_mask[idx].sum(1) + rollout.lengths[idx]  # [b]
    return idx[torch.sort(total, stable=True).indices]


def rollout_from_tokens(prompts: list[list[int]], responses: list[list[int]], logprobs: list[list[float]], n: int,
                        eos_ids: list[int], pad_id: int, tokenizer, device) -> Rollout:
    """A Rollout from token lists: prompts [n_prompts][P_i], responses and their log-probs [n_prompts * n][T_b]
    (response b belongs to prompt b // n). Each response is cut after its first EOS (kept, mask 1), as in
    engines.HFEngine; one that has no EOS was cut by max_new_tokens: truncated. Padded into tensors first, so nothing
    loops over tokens in Python."""
    B, P = len(responses), max(len(p) for p in prompts)
    width = max((len(ids) for ids in responses), default=0)
    tokens = torch.full((B, width), pad_id, dtype=torch.long)  # [B, width] as generated
    sampled = torch.zeros((B, width), dtype=torch.float32)  # [B, width]
    for b, (ids, lp) in enumerate(zip(responses, logprobs)):
        tokens[b, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        sampled[b, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
    generated = torch.tensor([len(ids) for ids in responses], dtype=torch.long)  # [B]
    inside = torch.arange(width)[None, :] < generated[:, None]  # [B, width] generated, not padding
    is_eos = torch.isin(tokens, torch.tensor(eos_ids)) & inside  # [B, width]
    has_eos = is_eos.any(1)  # [B]
    lengths = torch.where(has_eos, is_eos.long().argmax(1) + 1, generated)  # [B] up to the first EOS
    T = int(lengths.max()) if B else 0
    response_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # [B, T]
    prompt_ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for i, ids in enumerate(prompts):  # left padding: the prompt ends where the response starts
        prompt_ids[i, P - len(ids):] = torch.tensor(ids, dtype=torch.long)
        prompt_mask[i, P - len(ids):] = 1
    texts = tokenizer.batch_decode([ids[:length] for ids, length in zip(responses, lengths.tolist())],
                                   skip_special_tokens=True)
    return Rollout(prompt_ids=prompt_ids.repeat_interleave(n, 0), prompt_mask=prompt_mask.repeat_interleave(n, 0),
                   response_ids=tokens[:, :T].masked_fill(response_mask == 0, pad_id), response_mask=response_mask,
                   lengths=lengths, truncated=~has_eos, sampler_logprobs=sampled[:, :T] * response_mask,
                   prompt_index=torch.arange(len(prompts)).repeat_interleave(n), texts=texts,
                   pad_id=pad_id).to(device)
