"""gae.py: hand-worked numbers, GAE equal to a plain loop over numbers written here, invariance to what sits under
the mask."""
import math

import pytest
import torch

from gae import decoupled_gae, gae, group_advantage, length_adaptive_lambda


def ragged_batch(lengths, T, seed=0):
    """Random values, a terminal +-1 reward at each row's last real token, right-padded mask."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()  # [B, T]
    values = torch.randn(B, T, generator=g) * mask
    rewards = torch.zeros(B, T)
    for b, n in enumerate(lengths):
        if n > 0:
            rewards[b, n - 1] = 1.0 if b % 2 == 0 else -1.0
    return rewards, values, mask


# ---- length-adaptive lambda -------------------------------------------------------------------------------

def test_length_adaptive_lambda_hand_worked():
    lam = length_adaptive_lambda(torch.tensor([100, 1000, 20, 0]), alpha=0.05)
    assert lam.dtype == torch.float32
    assert lam[0].item() == pytest.approx(0.8)
    assert lam[1].item() == pytest.approx(0.98)
    assert lam[2].item() == 0.0  # alpha * l = 1 -> 1 - 1 = 0
    assert lam[3].item() == 0.0 and torch.isfinite(lam).all()  # empty response: finite, clamped


def test_length_adaptive_lambda_clamps_and_validates():
    lam = length_adaptive_lambda(torch.tensor([1.0, 5.0, 1e9]), alpha=0.05)
    assert (lam >= 0).all() and (lam <= 1).all()
    assert lam[2].item() == pytest.approx(1.0)
    for bad in (0.0, -0.5):
        with pytest.raises(ValueError, match="alpha"):
            length_adaptive_lambda(torch.tensor([10]), alpha=bad)


# ---- GAE: hand-worked numbers -----------------------------------------------------------------------------

def test_monte_carlo_case_return_is_final_reward():
    """lambda = 1, gamma = 1, terminal reward R: return R at every real token, advantage R - V_t."""
    rewards, values, mask = ragged_batch([5, 3, 7], T=8, seed=1)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    final = rewards.sum(-1, keepdim=True)  # [B, 1], the one terminal reward of each row
    torch.testing.assert_close(ret, final * mask)
    torch.testing.assert_close(adv, (final - values) * mask)


def test_small_case_worked_on_paper():
    """T = 3, r = (0, 0, 1), V = (0.5, 0.2, 0.4).
    gamma = 1, lambda = 0.5: deltas (-0.3, 0.2, 0.6); A_2 = 0.6, A_1 = 0.2 + 0.5*0.6 = 0.5,
    A_0 = -0.3 + 0.5*0.5 = -0.05; returns A + V = (0.45, 0.7, 1.0).
    gamma = 0.9, lambda = 0.5: deltas (0.9*0.2-0.5, 0.9*0.4-0.2, 1-0.4) = (-0.32, 0.16, 0.6);
    A_2 = 0.6, A_1 = 0.16 + 0.45*0.6 = 0.43, A_0 = -0.32 + 0.45*0.43 = -0.1265."""
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.2, 0.4]])
    m = torch.ones(1, 3)
    adv, ret = gae(r, v, m, gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.05, 0.5, 0.6]]))
    torch.testing.assert_close(ret, torch.tensor([[0.45, 0.7, 1.0]]))
    adv, _ = gae(r, v, m, gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.1265, 0.43, 0.6]]))


def test_lambda_zero_is_one_step_td():
    rewards, values, mask = ragged_batch([4, 6], T=6, seed=2)
    adv, _ = gae(rewards, values, mask, gamma=1.0, lam=0.0)
    next_v = torch.cat([values[:, 1:], torch.zeros(2, 1)], dim=1) * mask
    torch.testing.assert_close(adv, (rewards + next_v - values) * mask)


# ---- GAE: equivalence with the plain loop -----------------------------------------------------------------

def plain_gae(rewards, values, mask, gamma, lam):
    """GAE one number at a time, in Python floats: each response from its last real token back."""
    advantages = [[0.0] * len(row) for row in rewards]
    for b, (r, v, m) in enumerate(zip(rewards, values, mask)):
        n, running = sum(m), 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else 0.0
            running = r[t] + gamma * next_v - v[t] + gamma * lam[b] * running
            advantages[b][t] = running
    return advantages


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_gae_equals_a_plain_loop_with_per_sample_lambda(gamma):
    lengths = [0, 1, 7, 64, 65, 150]
    rewards, values, mask = ragged_batch(lengths, max(lengths), seed=3)
    lam = torch.tensor([0.0, 0.3, 0.8, 0.95, 1.0, 0.99])
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    expected = torch.tensor(plain_gae(rewards.tolist(), values.tolist(), mask.long().tolist(), gamma, lam.tolist()))
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, (expected + values) * mask, atol=1e-5, rtol=1e-5)


def test_per_sample_lambda_equals_scalar_lambda_row_by_row():
    lengths = [3, 70, 129, 40]
    rewards, values, mask = ragged_batch(lengths, 130, seed=4)
    lam = length_adaptive_lambda(torch.tensor(lengths), alpha=0.05)
    adv, ret = gae(rewards, values, mask, lam=lam)
    for b in range(len(lengths)):
        adv_b, ret_b = gae(rewards[b:b + 1], values[b:b + 1], mask[b:b + 1], lam=float(lam[b]))
        torch.testing.assert_close(adv[b:b + 1], adv_b)
        torch.testing.assert_close(ret[b:b + 1], ret_b)


def test_long_sequence_stays_accurate():
    """T = 5000 with lambda close to 1: accumulated in float32 from the end, no drift against the plain loop."""
    rewards, values, mask = ragged_batch([5000, 4321], 5000, seed=5)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.999)
    expected = torch.tensor(plain_gae(rewards.tolist(), values.tolist(), mask.long().tolist(), 1.0, [0.999] * 2))
    torch.testing.assert_close(adv, expected, atol=1e-4, rtol=1e-4)
    assert torch.isfinite(ret).all()


# ---- GAE: masks, padding, invariance ----------------------------------------------------------------------

def test_outputs_zero_under_mask_and_returns_are_advantages_plus_values():
    rewards, values, mask = ragged_batch([2, 5, 0], T=6, seed=6)
    adv, ret = gae(rewards, values, mask, lam=0.9)
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
    torch.testing.assert_close(ret[mask == 1], (adv + values)[mask == 1])
    assert (adv[2] == 0).all() and (ret[2] == 0).all()  # an empty generation breaks nothing


def test_invariant_to_anything_under_the_mask():
    rewards, values, mask = ragged_batch([3, 6, 1], T=6, seed=7)
    lam = torch.tensor([0.5, 0.9, 1.0])
    adv, ret = gae(rewards, values, mask, gamma=0.95, lam=lam)
    junk = torch.randn(3, 6) * 100
    pad = mask == 0
    adv2, ret2 = gae(torch.where(pad, junk, rewards), torch.where(pad, -junk, values), mask, gamma=0.95, lam=lam)
    torch.testing.assert_close(adv, adv2, rtol=0, atol=0)
    torch.testing.assert_close(ret, ret2, rtol=0, atol=0)


def test_extra_padding_changes_nothing():
    rewards, values, mask = ragged_batch([3, 6], T=6, seed=8)
    adv, ret = gae(rewards, values, mask, lam=0.8)
    wide = [torch.nn.functional.pad(x, (0, 100), value=v) for x, v in ((rewards, 5.0), (values, -3.0), (mask, 0.0))]
    adv_w, ret_w = gae(*wide, lam=0.8)
    torch.testing.assert_close(adv_w[:, :6], adv, rtol=0, atol=1e-6)  # block layout may round differently
    torch.testing.assert_close(ret_w[:, :6], ret, rtol=0, atol=1e-6)
    assert (adv_w[:, 6:] == 0).all() and (ret_w[:, 6:] == 0).all()


def test_rejects_mask_that_is_not_right_padded_and_bad_shapes():
    r = torch.zeros(1, 4)
    with pytest.raises(ValueError, match="right-padded"):
        gae(r, r, torch.tensor([[1.0, 0.0, 1.0, 0.0]]))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        gae(r, torch.zeros(1, 3), torch.ones(1, 4))


def test_empty_time_dimension():
    z = torch.zeros(3, 0)
    adv, ret = gae(z, z, z, lam=torch.tensor([0.1, 0.2, 0.3]))
    assert adv.shape == (3, 0) and ret.shape == (3, 0)


def test_no_gradient_flows_into_targets():
    rewards, values, mask = ragged_batch([4, 2], T=4, seed=9)
    values.requires_grad_(True)
    adv, ret = gae(rewards, values, mask)
    assert not adv.requires_grad and not ret.requires_grad


def test_bfloat16_inputs_accumulate_in_float32():
    rewards, values, mask = ragged_batch([30, 64, 17], T=64, seed=10)
    v16 = values.to(torch.bfloat16)
    adv, ret = gae(rewards.to(torch.bfloat16), v16, mask.to(torch.bfloat16), lam=0.95)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    adv_ref, ret_ref = gae(rewards, v16.float(), mask, 1.0, 0.95)  # same inputs, rounded to bf16
    torch.testing.assert_close(adv, adv_ref, atol=1e-5, rtol=1e-5)


# ---- Decoupled GAE ----------------------------------------------------------------------------------------

def test_decoupled_gae_uses_each_lambda_for_its_output():
    lengths = [10, 50, 90]
    rewards, values, mask = ragged_batch(lengths, 90, seed=11)
    lam_policy = length_adaptive_lambda(torch.tensor(lengths), alpha=0.1)
    adv, ret = decoupled_gae(rewards, values, mask, lam_policy=lam_policy, lam_critic=1.0)
    torch.testing.assert_close(adv, gae(rewards, values, mask, lam=lam_policy)[0])
    torch.testing.assert_close(ret, gae(rewards, values, mask, lam=1.0)[1])
    # lambda_critic = 1, gamma = 1: the critic's target is the final reward at every token, whatever V says.
    torch.testing.assert_close(ret, rewards.sum(-1, keepdim=True) * mask)
    # and the policy's advantages really differ from the Monte-Carlo ones (lambda < 1 uses the critic)
    assert not torch.allclose(adv, ret - values * mask)


def test_decoupled_with_equal_lambdas_is_plain_gae():
    rewards, values, mask = ragged_batch([5, 9], T=9, seed=12)
    a1, r1 = decoupled_gae(rewards, values, mask, lam_policy=0.95, lam_critic=0.95)
    a2, r2 = gae(rewards, values, mask, lam=0.95)
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(r1, r2)
    assert math.isfinite(a1.sum().item())


# ---- GRPO's group advantage -------------------------------------------------------------------------------

def loop_group_advantage(scores, lengths, G, T, eps=1e-6):
    """The definition, one group and one sample at a time, in float64: (R - mean) / (unbiased std + eps)."""
    adv = torch.zeros(len(scores), T, dtype=torch.float64)
    for start in range(0, len(scores), G):
        group = [float(x) for x in scores[start:start + G]]
        mean = sum(group) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (G - 1)) if G > 1 else 0.0
        for i, x in enumerate(group):
            value = 0.0 if G == 1 else (x - mean) / (std + eps)
            adv[start + i, :lengths[start + i]] = value
    return adv


@pytest.mark.parametrize("G", [1, 2, 4, 8])
def test_group_advantage_equals_plain_loop(G):
    g = torch.Generator().manual_seed(G)
    B, T = 4 * G, 9
    scores = torch.randint(0, 2, (B,), generator=g).double() * 2 - 1 + 0.1 * torch.randn(B, generator=g).double()
    lengths = torch.randint(0, T + 1, (B,), generator=g).tolist()
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    got = group_advantage(scores, mask, G)
    assert got.dtype == torch.float32 and got.shape == (B, T)
    torch.testing.assert_close(got.double(), loop_group_advantage(scores, lengths, G, T), atol=1e-5, rtol=1e-5)


def test_group_advantage_hand_worked_and_edge_cases():
    mask = torch.ones(8, 3)
    scores = torch.tensor([1.0, -1.0, -1.0, -1.0,  1.0, 1.0, 1.0, 1.0])  # one right in four; all right
    adv = group_advantage(scores, mask, 4)
    std = math.sqrt(4 * 0.75 / 3)  # rewards 1,-1,-1,-1: mean -0.5, unbiased variance 1
    torch.testing.assert_close(adv[0], torch.full((3,), 1.5 / (std + 1e-6)))
    torch.testing.assert_close(adv[1], torch.full((3,), -0.5 / (std + 1e-6)))
    assert torch.equal(adv[4:], torch.zeros(4, 3))  # identical rewards: no signal, and no NaN
    assert torch.equal(group_advantage(scores, mask, 1), torch.zeros(8, 3))  # G = 1: nothing to compare with
    masked = group_advantage(scores, torch.tensor([[1, 1, 0]] * 8), 4)
    assert torch.equal(masked[:, 2], torch.zeros(8)) and torch.equal(masked[:, :2], adv[:, :2])
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantage(scores, mask, 3)
    with pytest.raises(ValueError, match="mask"):
        group_advantage(scores, torch.ones(7, 3), 4)

