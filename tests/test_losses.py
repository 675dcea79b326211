"""losses.py: hand-worked values, gradients where they should and should not flow, mask invariance."""
import math

import pytest
import torch

from losses import (aggregate, explained_variance, masked_mean, masked_whiten, policy_loss,
                    positive_nll_loss, value_loss)

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])


# ---- aggregation --------------------------------------------------------------------------------------------

def test_aggregate_hand_worked():
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)


def test_seq_mean_leaves_out_empty_samples():
    loss = torch.cat([LOSS, torch.full((1, 3), 99.0)])
    mask = torch.cat([MASK, torch.zeros(1, 3)])
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(2.5)


def test_aggregate_unknown_mode_names_it():
    with pytest.raises(ValueError, match="token-sum"):
        aggregate(LOSS, MASK, "token-sum")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_aggregate_padding_invariance_and_no_gradient_under_mask(mode):
    x = LOSS.clone().requires_grad_(True)
    base = aggregate(x, MASK, mode)
    base.backward()
    assert (x.grad[MASK == 0] == 0).all()
    junk = torch.tensor([[0.0, 0.0, 0.0], [0.0, float("inf"), float("nan")]])
    wide = torch.nn.functional.pad(LOSS + junk, (0, 5), value=float("nan"))
    wide_mask = torch.nn.functional.pad(MASK, (0, 5))
    assert aggregate(wide, wide_mask, mode).item() == pytest.approx(base.item())


def test_micro_batches_with_global_count_sum_to_the_full_batch():
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 8, generator=g)
    mask = (torch.arange(8)[None, :] < torch.tensor([8, 1, 5, 0, 3, 7])[:, None]).float()
    full_tok = aggregate(loss, mask, "token-mean")
    full_seq = aggregate(loss, mask, "seq-mean-token-mean")
    n_tok, n_seq = mask.sum().item(), (mask.sum(-1) > 0).sum().item()
    parts_tok = sum(aggregate(loss[i:i + 2], mask[i:i + 2], "token-mean", num_tokens=n_tok) for i in (0, 2, 4))
    parts_seq = sum(aggregate(loss[i:i + 2], mask[i:i + 2], "seq-mean-token-mean", num_seqs=n_seq)
                    for i in (0, 2, 4))
    assert parts_tok.item() == pytest.approx(full_tok.item())
    assert parts_seq.item() == pytest.approx(full_seq.item())


def test_all_masked_gives_zero_loss_with_zero_gradient():
    x = torch.randn(2, 3, requires_grad=True)
    for mode in ("token-mean", "seq-mean-token-mean"):
        out = aggregate(x, torch.zeros(2, 3), mode)
        out.backward()
        assert out.item() == 0.0 and torch.isfinite(x.grad).all() and (x.grad == 0).all()
        x.grad = None


# ---- policy loss ------------------------------------------------------------------------------------------

def test_policy_loss_at_ratio_one_is_minus_mean_advantage_with_matching_gradient():
    adv = torch.tensor([[1.0, -2.0, 0.5], [3.0, 7.0, 7.0]])
    old = torch.log(torch.tensor([[0.3, 0.5, 0.2], [0.9, 0.1, 0.1]]))
    new = old.clone().requires_grad_(True)
    loss, stats = policy_loss(new, old, adv, MASK)
    assert loss.item() == pytest.approx(-(1 - 2 + 0.5 + 3) / 4)
    loss.backward()
    torch.testing.assert_close(new.grad, -adv * MASK / 4)  # d(-ratio*A)/dlogp = -A at ratio 1, over 4 tokens
    assert stats["clip_frac"] == 0.0 and stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)


def test_clip_higher_bounds():
    """ratio 1.5 with A > 0: clipped at 1 + eps_high = 1.28 (no gradient); ratio 0.5 with A < 0: clipped at
    1 - eps_low = 0.8 (no gradient); ratio 1.5 with A < 0 and ratio 0.5 with A > 0: the pessimistic unclipped
    term wins (gradient flows)."""
    ratio = torch.tensor([[1.5, 0.5, 1.5, 0.5]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    mask = torch.ones(1, 4)
    new = torch.log(ratio).requires_grad_(True)
    loss, stats = policy_loss(new, torch.zeros(1, 4), adv, mask, eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(-(1.28 - 0.8 - 1.5 + 0.5) / 4)
    loss.backward()
    assert new.grad[0, 0] == 0 and new.grad[0, 1] == 0
    assert new.grad[0, 2].item() == pytest.approx(1.5 / 4) and new.grad[0, 3].item() == pytest.approx(-0.5 / 4)
    assert stats["clip_frac_high"] == pytest.approx(0.25) and stats["clip_frac_low"] == pytest.approx(0.25)
    assert stats["clip_frac"] == pytest.approx(0.5) and stats["approx_kl"] > 0


def test_symmetric_clip_differs_from_clip_higher():
    new = torch.log(torch.tensor([[1.25]]))
    args = (torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    assert policy_loss(new, *args, eps_low=0.2, eps_high=0.2)[0].item() == pytest.approx(-1.2)
    assert policy_loss(new, *args, eps_low=0.2, eps_high=0.28)[0].item() == pytest.approx(-1.25)


def test_no_gradient_through_old_logprobs_or_advantages():
    old = torch.randn(2, 3, requires_grad=True)
    adv = torch.randn(2, 3, requires_grad=True)
    new = (old.detach() + 0.1).requires_grad_(True)
    loss, _ = policy_loss(new, old, adv, MASK)
    loss.backward()
    assert old.grad is None and adv.grad is None and new.grad is not None


def test_policy_loss_invariant_to_padding_and_bfloat16():
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(2, 3, generator=g)
    new = old + 0.1 * torch.randn(2, 3, generator=g)
    adv = torch.randn(2, 3, generator=g)
    loss, _ = policy_loss(new, old, adv, MASK)
    junk = torch.where(MASK.bool(), 0.0, 50.0)
    loss_junk, _ = policy_loss(new + junk, old - junk, adv + junk, MASK)
    assert loss_junk.item() == pytest.approx(loss.item())
    pad = lambda x: torch.nn.functional.pad(x, (0, 4), value=3.0)  # noqa: E731
    loss_wide, _ = policy_loss(pad(new), pad(old), pad(adv), torch.nn.functional.pad(MASK, (0, 4)))
    assert loss_wide.item() == pytest.approx(loss.item())
    loss16, _ = policy_loss(new.bfloat16(), old.bfloat16(), adv.bfloat16(), MASK.bfloat16())
    assert loss16.dtype == torch.float32 and loss16.item() == pytest.approx(loss.item(), abs=0.05)


def test_token_level_and_sample_level_losses_weigh_long_responses_differently():
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]])
    lp = torch.zeros(2, 3)
    tok, _ = policy_loss(lp, lp, adv, MASK, agg="token-mean")
    seq, _ = policy_loss(lp, lp, adv, MASK, agg="seq-mean-token-mean")
    assert tok.item() == pytest.approx(-(3 - 1) / 4) and seq.item() == pytest.approx(0.0)


# ---- value loss -------------------------------------------------------------------------------------------

def test_value_loss_hand_worked_and_padding_invariant():
    v = torch.tensor([[0.0, 1.0, 2.0], [5.0, 9.0, 9.0]], requires_grad=True)
    r = torch.tensor([[1.0, 1.0, 0.0], [1.0, -9.0, -9.0]])
    loss, stats = value_loss(v, r, MASK)
    assert loss.item() == pytest.approx(0.5 * (1 + 0 + 4 + 16) / 4)
    loss.backward()
    assert (v.grad[MASK == 0] == 0).all()
    assert stats["value_abs_err"] == pytest.approx((1 + 0 + 2 + 4) / 4)


def test_value_clipping_takes_the_larger_error():
    """old 0, V 1, R 2, clip 0.2: V_clip = 0.2; errors (1-2)^2 = 1 and (0.2-2)^2 = 3.24 -> 0.5 * 3.24."""
    v = torch.tensor([[1.0]], requires_grad=True)
    loss, stats = value_loss(v, torch.tensor([[2.0]]), torch.ones(1, 1), old_values=torch.zeros(1, 1), clip=0.2)
    assert loss.item() == pytest.approx(1.62)
    assert stats["value_clip_frac"] == 1.0
    loss.backward()
    assert v.grad.item() == 0.0  # the clipped branch is flat in V
    with pytest.raises(ValueError, match="old_values"):
        value_loss(v, v.detach(), torch.ones(1, 1), clip=0.2)


# ---- positive-example NLL ---------------------------------------------------------------------------------

def test_positive_nll_hand_worked_and_mask_invariant():
    lp = torch.tensor([[-1.0, -2.0, -50.0], [-3.0, -4.0, -5.0]], requires_grad=True)
    loss = positive_nll_loss(lp, MASK, torch.tensor([True, False]))
    assert loss.item() == pytest.approx((1 + 2 + 50) / 3)
    loss = positive_nll_loss(lp, torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]), torch.tensor([True, False]))
    assert loss.item() == pytest.approx(1.5)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]))


def test_positive_nll_with_no_positive_sample_is_zero_and_safe():
    lp = torch.randn(2, 3, requires_grad=True)
    loss = positive_nll_loss(lp, MASK, torch.tensor([False, False]))
    loss.backward()
    assert loss.item() == 0.0 and math.isfinite(loss.item())
    assert (lp.grad == 0).all()


# ---- statistics -------------------------------------------------------------------------------------------

def test_explained_variance():
    r = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 7.0, 7.0]])
    assert explained_variance(r, r, MASK) == pytest.approx(1.0)
    mean = masked_mean(r, MASK)
    assert explained_variance(torch.full_like(r, mean.item()), r, MASK) == pytest.approx(0.0, abs=1e-6)
    assert explained_variance(-r, r, MASK) < 0
    assert math.isnan(explained_variance(r, torch.ones(2, 3), MASK))  # constant returns: undefined


def test_masked_whiten_and_mean():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, generator=g) * 4 + 3
    w = masked_whiten(x, MASK)
    assert masked_mean(w, MASK).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_mean(w ** 2, MASK).item() == pytest.approx(1.0, abs=1e-5)
    assert (w[MASK == 0] == 0).all()
    pos = masked_whiten(x.abs(), MASK, shift_mean=False)
    assert (pos[MASK == 1] > 0).all()
    assert masked_mean(LOSS, MASK).item() == pytest.approx(2.5)
    torch.testing.assert_close(masked_mean(LOSS, MASK, dim=1), torch.tensor([2.0, 4.0]))
    assert masked_mean(LOSS, torch.zeros(2, 3)).item() == 0.0


def test_kl_to_reference_is_k3_zero_at_the_reference_and_pulls_back_to_it():
    from losses import kl_to_reference
    mask = torch.tensor([[1, 1, 0]])
    ref = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    same = ref.clone().requires_grad_(True)
    loss, stats = kl_to_reference(same, ref, mask)
    assert float(loss.detach()) == 0.0 and stats["kl_ref"] == 0.0
    lp = torch.log(torch.tensor([[0.7, 0.1, 0.3]])).requires_grad_(True)
    loss, stats = kl_to_reference(lp, ref, mask)
    d = ref - lp.detach()
    expected = ((torch.exp(d) - d - 1) * mask).sum() / 2
    torch.testing.assert_close(loss, expected)
    loss.backward()  # dL/dlp = (1 - exp(d)) / n: down where the policy is above the reference, up where below
    assert lp.grad[0, 0] > 0 and lp.grad[0, 1] < 0 and lp.grad[0, 2] == 0
