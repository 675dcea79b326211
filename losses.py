"""VAPO's losses and the statistics logged beside them: clip-higher token-level policy loss, value loss,
positive-example NLL, masked aggregation, whitening and explained variance.

Shapes: B samples, T response tokens (right-padded). `logprobs`, `old_logprobs`, `advantages`, `values`,
`returns`, `mask` are [B, T]; `mask[b, t]` is 1 on real response tokens; `positive` is [B] bool. Every loss
returns a scalar tensor. Pure tensor functions: this file imports only torch.

Gradient accumulation: a mini-batch that is split into micro-batches must still be normalised by the whole
mini-batch, or the token-level loss silently becomes a per-micro-batch mean. The `num_tokens` / `num_seqs`
arguments carry that count; left as None they are counted from the mask.
"""
from __future__ import annotations

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean")

# Bound on |log ratio| before exp(): a ratio of e^20 is already far outside any clip range, and the bound
# keeps one stale token from turning the loss into inf.
MAX_LOG_RATIO = 20.0


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, all_sum=None) -> torch.Tensor:
    """Mean of x over the entries where mask is 1: sum(x * mask) / sum(mask).

    x, mask: [B, T]. dim None -> a scalar; dim d -> that dimension reduced. An all-zero mask gives 0 (not
    NaN): nothing to average means nothing to learn from. Values under the mask never matter, even inf/NaN.
    all_sum: when the batch is split over processes (scale/), a function that sums a tensor over all of them;
    both sums are then taken over the whole batch, so the mean is the one a single process would compute.
    """
    m = mask.to(x.dtype)
    total = torch.where(m.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim)
    count = m.sum(dim)
    if all_sum is not None:
        total, count = all_sum(torch.stack([total, count])).unbind(0)
    return total / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, all_sum=None) -> torch.Tensor:
    """Population variance of x over the real entries: mean((x - mean)^2). x, mask: [B, T]. Scalar.
    all_sum: as in masked_mean (the batch split over processes)."""
    mean = masked_mean(x, mask, all_sum=all_sum)
    return masked_mean((x - mean) ** 2, mask, all_sum=all_sum)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8, all_sum=None) -> torch.Tensor:
    """Advantage whitening over the real tokens of the batch: (x - mean) / sqrt(var + eps).

    Not in the VAPO paper: our option (--whiten-advantages, on in every preset but cpu-135m), as verl's GAE always
    whitens. shift_mean=False only rescales, keeping the sign of every advantage. x, mask: [B, T]. Returns [B, T],
    exactly 0 under the mask.
    all_sum: as in masked_mean (mean and variance of the whole batch when it is split over processes).
    """
    mean = masked_mean(x, mask, all_sum=all_sum)
    var = masked_var(x, mask, all_sum=all_sum)
    out = (x - mean) if shift_mean else x
    out = out * torch.rsqrt(var + eps)
    return torch.where(mask.bool(), out, torch.zeros((), dtype=out.dtype, device=out.device))


def first_tenth_mask(mask: torch.Tensor, share: float = 0.1) -> torch.Tensor:
    """[B, T] -> [B, T]: the real tokens in each response's first `share` of its length (position t / length <
    share; at least the first token of a non-empty response). mask minus it is the rest of each response. Where a
    critic initialised from a reward model is biased, the bias sits here (VAPO section 3.1)."""
    lengths = mask.sum(-1, keepdim=True)  # [B, 1]
    pos = torch.arange(mask.shape[-1], device=mask.device)[None, :]  # [1, T]
    return mask * (pos < share * lengths).to(mask.dtype)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, all_sum=None) -> float:
    """How much of the returns' variance the critic explains, over real tokens:

        EV = 1 - Var[R - V] / Var[R]

    1 is perfect, 0 is no better than predicting the mean, negative is worse than that. The number to watch
    during value pretraining (VAPO section 3.1). NaN when Var[R] = 0 (e.g. every sample got the same reward):
    undefined, and logged as such rather than as a made-up number. values, returns, mask: [B, T]. all_sum: as in
    masked_mean (the batch split over processes).
    """
    v, r = values.detach().double(), returns.detach().double()  # float64: a constant R must give Var 0 exactly
    var_r = masked_var(r, mask, all_sum)
    if var_r.item() <= 1e-12:
        return float("nan")
    return (1.0 - masked_var(r - v, mask, all_sum) / var_r).item()


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              num_tokens: float | None = None, num_seqs: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar.

    "token-mean" (VAPO's token-level loss, section 3.3; DAPO section 3.3):
        L = sum_{b,t} mask * loss / sum_{b,t} mask
      every token of the batch weighs the same, so a long response is not worth less per token than a short
      one (a per-sample mean first would shrink each token of a long response by 1 / its length).
    "seq-mean-token-mean" (the sample-level loss of vanilla PPO / GRPO):
        L = mean over samples with tokens of ( sum_t mask * loss / sum_t mask )
      samples with no real token are left out of the outer mean.

    num_tokens / num_seqs: the denominators when this is one micro-batch of a larger mini-batch (default:
    counted from this mask). An all-zero mask gives a zero loss that still backpropagates (zero gradients).
    """
    m = mask.to(loss_mat.dtype)
    masked = torch.where(mask.bool(), loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    if mode == "token-mean":
        denom = m.sum() if num_tokens is None else torch.as_tensor(float(num_tokens))
        return masked.sum() / denom.clamp(min=1)
    if mode == "seq-mean-token-mean":
        tokens = m.sum(-1)  # [B]
        per_seq = masked.sum(-1) / tokens.clamp(min=1)  # [B]
        denom = (tokens > 0).sum() if num_seqs is None else torch.as_tensor(float(num_seqs))
        return per_seq.sum() / denom.clamp(min=1)
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, eps_low: float = 0.2, eps_high: float = 0.28, agg: str = "token-mean",
                num_tokens: float | None = None,
                num_seqs: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate with Clip-Higher (VAPO section 3.3, Eq. 8; DAPO section 3.1):

        ratio_t = pi(o_t | s_t) / pi_old(o_t | s_t) = exp(logprobs - old_logprobs)
        L       = - agg( min( ratio_t * A_t, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A_t ) )

    eps_high > eps_low leaves more room to raise the probability of unlikely tokens with positive advantage,
    which keeps entropy from collapsing; eps_low stays small so that tokens are not pushed to zero
    probability. With the default agg="token-mean" this is VAPO's token-level loss.

    Only `logprobs` carries gradient: old log-probs and advantages are detached (they are data).
    logprobs, old_logprobs, advantages, mask: [B, T].
    Returns (loss, stats) where stats (floats over real tokens) has clip_frac_low (ratio < 1 - eps_low with
    A < 0: the clip is active there), clip_frac_high (ratio > 1 + eps_high with A > 0), clip_frac (either),
    approx_kl (k3 estimator mean((ratio - 1) - log ratio) of KL(pi_old || pi), always >= 0) and ratio_mean.
    """
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    log_ratio = (logprobs.float() - old_logprobs.detach().float()).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    adv = advantages.detach().float()  # [B, T]
    surrogate = ratio * adv  # [B, T]
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv  # [B, T]
    loss = aggregate(-torch.minimum(surrogate, clipped), mask, agg, num_tokens, num_seqs)
    with torch.no_grad():
        low = (ratio < 1.0 - eps_low) & (adv < 0)  # [B, T]
        high = (ratio > 1.0 + eps_high) & (adv > 0)  # [B, T]
        stats = {
            "clip_frac_low": masked_mean(low.float(), mask).item(),
            "clip_frac_high": masked_mean(high.float(), mask).item(),
            "clip_frac": masked_mean((low | high).float(), mask).item(),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
        }
    return loss, stats


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               old_values: torch.Tensor | None = None, clip: float | None = None, agg: str = "token-mean",
               num_tokens: float | None = None,
               num_seqs: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The critic's regression loss (VAPO section 2, Eq. 5):

        L_V = agg( 0.5 * (V(s_t) - R_t)^2 )

    With `clip` (and `old_values`), PPO-style value clipping (our option; the paper does not state it):
        V_clip = V_old + clip(V - V_old, -clip, +clip)
        L_V    = agg( 0.5 * max((V - R)^2, (V_clip - R)^2) )
    which keeps one update from moving a value far from where the rollout's critic had it.

    values (with gradient), returns, old_values, mask: [B, T]. Returns (loss, stats) with stats
    value_clip_frac (share of real tokens where the clipped error was the larger) and value_abs_err.
    """
    v = values.float()
    r = returns.detach().float()
    err = (v - r) ** 2  # [B, T]
    clip_frac = 0.0
    if clip is not None:
        if old_values is None:
            raise ValueError("value clipping needs old_values")
        if clip <= 0:
            raise ValueError(f"value clip must be > 0, got {clip}")
        old = old_values.detach().float()
        v_clipped = old + (v - old).clamp(-clip, clip)  # [B, T]
        err_clipped = (v_clipped - r) ** 2  # [B, T]
        clip_frac = masked_mean((err_clipped > err).float(), mask).item()
        err = torch.maximum(err, err_clipped)
    loss = aggregate(0.5 * err, mask, agg, num_tokens, num_seqs)
    stats = {"value_clip_frac": clip_frac, "value_abs_err": masked_mean((v - r).abs().detach(), mask).item()}
    return loss, stats


def kl_to_reference(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean",
                    num_tokens: float | None = None, num_seqs: float | None = None
                    ) -> tuple[torch.Tensor, dict[str, float]]:
    """A KL penalty to a frozen reference policy (our option; VAPO and DAPO use none, GRPO and verl's
    use_kl_loss do), with the k3 estimator of KL(pi || pi_ref) per token (Schulman's, GRPO's, verl's
    "low_var_kl"), unbiased and never negative:

        d_t = log pi_ref(r_t) - log pi(r_t),    KL_t = exp(d_t) - d_t - 1,    L_KL = agg(KL_t)

    logprobs (with gradient), ref_logprobs, mask: [B, T]. Returns (loss, {"kl_ref": the masked mean of KL_t})."""
    d = (ref_logprobs.detach().float() - logprobs.float()).clamp(-20, 20)  # [B, T]; the clamp as verl's
    kl = torch.exp(d) - d - 1.0
    return aggregate(kl, mask, agg, num_tokens, num_seqs), {"kl_ref": masked_mean(kl.detach(), mask).item()}


def positive_nll_loss(logprobs: torch.Tensor, mask: torch.Tensor, positive: torch.Tensor,
                      num_tokens: float | None = None) -> torch.Tensor:
    """Positive-example LM loss (VAPO section 3.4, Eq. 9): negative log-likelihood of the correct samples,

        L_NLL = - 1 / sum_{o_i in Correct} |o_i| * sum_{o_i in Correct} sum_t log pi(o_t | s_t)

    added to the policy loss as L = L_PPO + mu * L_NLL, so that correct answers, which are rare early in
    training, are imitated directly and not only through their (noisy) advantages.

    logprobs (with gradient), mask: [B, T]; positive: [B] bool. num_tokens: the count of positive tokens in
    the whole mini-batch when this is one micro-batch (default: counted here). When no sample is positive
    the loss is exactly 0, finite, and backpropagates zero gradients (never 0 / 0).
    """
    keep = mask.bool() & positive.bool()[:, None]  # [B, T]
    nll = torch.where(keep, -logprobs.float(), torch.zeros((), device=logprobs.device))  # [B, T]
    denom = keep.sum() if num_tokens is None else torch.as_tensor(float(num_tokens))
    return nll.sum() / denom.clamp(min=1)
