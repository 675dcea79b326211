"""Generalised Advantage Estimation for VAPO: GAE (the textbook loop), the length-adaptive lambda, and
Decoupled-GAE; and the critic-free group advantage of GRPO and DAPO, the baselines VAPO is compared with.

VAPO (Yue et al. 2025, arXiv 2504.05118) works on a token-level MDP: the state is prompt + response so far, the
action is the next token, and the verifier gives one reward at the last response token. gamma = 1.

Shapes, as everywhere in this project: B samples, T response tokens (right-padded). `rewards`, `values`,
`mask`, `advantages`, `returns` are [B, T]; `mask[b, t]` is 1 on real response tokens; `values[b, t]` is
V(s_t), the value of the state *before* response token t. Per-sample quantities (`lengths`, a per-sample
lambda) are [B]. Pure tensor functions: this file imports only torch.
"""
from __future__ import annotations

import torch

def terminal_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """rewards[b, t] = scores[b] at the last real token of sample b, 0 elsewhere (a sparse verifier reward).

    scores: [B]; mask: [B, T] right-padded. An empty response (no token) has nowhere to put its reward: it gets
    none (and the caller counts it in the step's log)."""
    lengths = mask.sum(-1).long()  # [B]
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)  # [B, T]
    has = lengths > 0
    rewards[has.nonzero().squeeze(1), lengths[has] - 1] = scores[has].float()
    return rewards


def length_adaptive_lambda(lengths: torch.Tensor, alpha: float = 0.05) -> torch.Tensor:
    """Length-adaptive lambda for the policy's GAE (VAPO section 3.2, Eq. 7).

        lambda_policy = 1 - 1 / (alpha * l),   clamped to [0, 1]

    chosen so that the effective horizon sum_t lambda^t = 1 / (1 - lambda) equals alpha * l: a long response
    gets a lambda near 1 (little bias, the reward reaches early tokens), a short one a smaller lambda (less
    variance). l = 100 gives 0.8 and l = 1000 gives 0.98 at the paper's alpha = 0.05. For alpha * l <= 1 the
    formula is <= 0 and clamps to 0 (pure one-step TD); l = 0 (an empty response) gives 0, finite.

    lengths: [B] response lengths (any numeric dtype). Returns [B] float32.
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    horizon = alpha * lengths.to(torch.float32)  # [B]; 0 for an empty response -> 1/0 = inf -> clamps to 0
    return (1.0 - 1.0 / horizon).clamp(0.0, 1.0)


def _check_right_padded(mask: torch.Tensor) -> None:
    """GAE runs backwards from each response's last token; that needs every row to be 1...1 0...0."""
    if mask.shape[-1] > 1 and (mask[:, 1:] > mask[:, :-1]).any():
        raise ValueError("mask must be right-padded: each row ones then zeros, with no holes")


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float | torch.Tensor = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015, arXiv 1506.02438; VAPO section 2, Eq. 3-4), as the
    textbook writes it, one token at a time from the end:

        delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)             (V = 0 after the last real token)
        A_t     = delta_t + gamma * lambda * A_{t+1}            (A = 0 after the last real token)
        R_t     = A_t + V(s_t)                                  (the critic's target, "returns")

    V(s_{t+1}) = 0 after the last real token: the response has ended, no reward is still to come. With gamma =
    lambda = 1 and a single terminal reward R, R_t = R at every real token and A_t = R - V(s_t) (Monte-Carlo).
    Everything under the mask is ignored and both outputs are exactly 0 there; an empty row gives all zeros. No
    whitening here (losses.masked_whiten). Accumulated in float32 whatever the input dtype (bfloat16 values would
    lose the small per-token deltas); the outputs are targets, with no gradient, even if `values` requires grad.

    rewards, values, mask: [B, T], mask right-padded (1 on real response tokens). lam: a float, or a [B] tensor
    (the length-adaptive case). Returns (advantages [B, T], returns [B, T]), float32.
    """
    m, r, v, lam = _checked(rewards, values, mask, lam)  # [B, T] x 3, [B]
    B, T = r.shape
    advantages = torch.zeros_like(r)  # [B, T]
    running = torch.zeros(B, device=r.device)  # [B], A_{t+1}
    for t in reversed(range(T)):
        next_v = v[:, t + 1] if t + 1 < T else torch.zeros_like(running)  # [B]
        delta = r[:, t] + gamma * next_v - v[:, t]  # [B]
        running = (delta + gamma * lam * running) * m[:, t]  # [B]; 0 on padding (right-padded: 0 after it too)
        advantages[:, t] = running
    return advantages, (advantages + v) * m


def _checked(rewards, values, mask, lam):
    """GAE's inputs checked ([B, T] each, mask right-padded) and made float32 targets: (m, r, v, lam [B])."""
    if rewards.shape != values.shape or rewards.shape != mask.shape or rewards.dim() != 2:
        raise ValueError(f"rewards, values, mask must all be [B, T]; got {tuple(rewards.shape)}, "
                         f"{tuple(values.shape)}, {tuple(mask.shape)}")
    _check_right_padded(mask)
    m = mask.to(torch.float32)  # [B, T]
    r = rewards.detach().to(torch.float32) * m  # [B, T]; targets carry no gradient
    v = values.detach().to(torch.float32) * m  # [B, T]; 0 on padding, so V(s_{t+1}) = 0 past the end
    lam = torch.as_tensor(lam, dtype=torch.float32, device=rewards.device).expand(rewards.shape[0])  # [B]
    return m, r, v, lam


def decoupled_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                  lam_policy: float | torch.Tensor = 0.95,
                  lam_critic: float | torch.Tensor = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled-GAE (VAPO section 3.2; from VC-PPO, arXiv 2503.01491): one lambda per consumer.

        advantages = GAE(r, V; lambda = lam_policy).A        -> the policy gradient
        returns    = GAE(r, V; lambda = lam_critic).A + V    -> the critic's regression targets

    lam_critic = 1 makes the critic's targets unbiased Monte-Carlo returns (with gamma = 1 every token's
    target is the final reward), so the reward signal reaches early tokens of long responses undecayed,
    whatever the critic currently believes. A smaller lam_policy (a float or a [B] tensor, e.g. from
    length_adaptive_lambda) trades some bias for lower-variance advantages.

    rewards, values, mask: [B, T]. Returns (advantages [B, T], returns [B, T]), float32, 0 under the mask.
    """
    advantages, _ = gae(rewards, values, mask, gamma=gamma, lam=lam_policy)
    _, returns = gae(rewards, values, mask, gamma=gamma, lam=lam_critic)
    return advantages, returns


def group_advantage(scores: torch.Tensor, mask: torch.Tensor, group_size: int,
                    eps: float = 1e-6) -> torch.Tensor:
    """GRPO's group-relative advantage (Shao et al. 2024, arXiv 2402.03300, section 4.1.2; DAPO Eq. 1), the
    critic-free baseline that VAPO is compared with:

        A_{i,t} = (R_i - mean(R_1..R_G)) / (std(R_1..R_G) + eps)     for every token t of response i

    over the G = group_size samples of one prompt (rows i*G .. i*G+G-1, as rollout.py lays them out), std being
    torch's unbiased (G - 1) estimate. Every token of a response gets its response's advantage: no critic, no
    credit assignment inside the response. A group whose rewards are all equal (all right or all wrong) gives 0
    for all its tokens: it carries no signal. G = 1 has no group to compare with: 0 everywhere (and no NaN).

    scores: [B] one reward per response; mask: [B, T]. Returns advantages [B, T] float32, 0 under the mask.
    """
    B = scores.shape[0]
    if group_size < 1 or B % group_size:
        raise ValueError(f"the batch of {B} responses is not a whole number of groups of {group_size}")
    if mask.dim() != 2 or mask.shape[0] != B:
        raise ValueError(f"mask must be [B={B}, T]; got {tuple(mask.shape)}")
    r = scores.detach().to(torch.float32).view(-1, group_size)  # [prompts, G]
    if group_size == 1:
        centred = torch.zeros_like(r)
        std = torch.ones_like(r[:, :1])
    else:
        centred = r - r.mean(1, keepdim=True)  # [prompts, G]
        std = r.std(1, keepdim=True)  # [prompts, 1], unbiased
    adv = (centred / (std + eps)).view(B)  # [B]; equal rewards: 0 / (0 + eps) = 0
    return adv[:, None] * mask.to(torch.float32)  # [B, T]
