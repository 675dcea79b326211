"""The mechanism lab (bench/lab.py, docs/lab.md): each experiment's setup does what the page says it does, on tiny
hand-worked cases: the bias has the slope asked for, GAE of V* + b differs from GAE of V* by the page's arithmetic,
the decisions it reverses are the ones the arithmetic names, the length-adaptive fit finds a known lambda, and the
critic-only fit regresses on the targets the arithmetic gives."""
import math
import os
import sys

import pytest
import torch

import task
import vapo
from gae import gae, terminal_rewards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import lab  # noqa: E402


def right_padded(lengths: list[int]) -> torch.Tensor:
    T = max(lengths)
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()


def test_the_bias_has_the_slope_asked_for():
    """b(t) = offset + slope * t / 100 on the real tokens: a least-squares line through it has that slope per token
    and that intercept, and nothing sits under the mask."""
    mask = right_padded([7, 300, 41])
    for offset, slope in ((0.0, -0.5), (-0.5, 0.125), (0.5, 0.0)):
        b = lab.bias_values(mask, offset, slope)
        t = torch.arange(mask.shape[1], dtype=torch.float64)[None, :].expand_as(b)[mask.bool()]
        y = b[mask.bool()].double()
        fitted = ((t - t.mean()) * (y - y.mean())).sum() / ((t - t.mean()) ** 2).sum()
        assert float(fitted) * 100 == pytest.approx(slope, abs=1e-6)
        assert float(y.mean() - fitted * t.mean()) == pytest.approx(offset, abs=1e-5)
        assert (b[~mask.bool()] == 0).all()
    assert lab.parse_bias("-0.5:0.125") == (-0.5, 0.125)


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0, "adaptive"])
def test_gae_of_a_biased_critic_shifts_by_the_pages_arithmetic(lam):
    """(A1): GAE(V* + b) - GAE(V*) is predicted_shift, written from the algebra, for any V*, rewards and lambda
    (per response under the length-adaptive lambda)."""
    torch.manual_seed(0)
    lengths = [3, 60, 411, 120]
    mask = right_padded(lengths)
    star = torch.rand(mask.shape) * 2 - 1
    terminal = terminal_rewards(torch.tensor([1.0, -1.0, -1.0, 1.0]), mask)
    lam_b = lab.lambdas("adaptive", torch.tensor(lengths)) if lam == "adaptive" else torch.full((4,), lam)
    for offset, slope in ((0.0, -0.5), (-0.5, 0.125), (0.5, 0.0)):
        measured = gae(terminal, star + lab.bias_values(mask, offset, slope), mask, lam=lam_b)[0] - gae(
            terminal, star, mask, lam=lam_b)[0]
        predicted = lab.predicted_shift(torch.tensor(lengths), mask.shape[1], offset, slope, lam_b)
        assert torch.allclose(measured, predicted, atol=2e-5)


def test_the_pages_worked_numbers():
    """docs/lab.md, experiment 1: for 0:-0.5 on a 411-token response, -0.10 a token far from the end at lambda 0.95,
    -b(t) at lambda 1, +2.05 at EOS at every lambda; a flat bias c keeps c (1 - 0.95^d) of itself in the critic's
    targets (A4), 0.36 c over a 20-token response."""
    n = torch.tensor([411])
    at_95 = lab.predicted_shift(n, 411, 0.0, -0.5, 0.95)[0]
    assert at_95[:40].mean().item() == pytest.approx(-0.10, abs=1e-3)
    at_1 = lab.predicted_shift(n, 411, 0.0, -0.5, 1.0)[0]
    assert torch.allclose(at_1, 0.005 * torch.arange(411.0), atol=1e-5)
    for lam in (0.0, 0.95, 1.0):
        assert lab.predicted_shift(n, 411, 0.0, -0.5, lam)[0, 410].item() == pytest.approx(2.05, abs=1e-5)
    c = 0.5
    short = torch.tensor([20])
    target = lab.bias_values(right_padded([20]), c, 0.0)[0] + lab.predicted_shift(short, 20, c, 0.0, 0.95)[0]
    assert torch.allclose(target, c * (1 - 0.95 ** (19 - torch.arange(20.0))), atol=1e-6)
    assert target.mean().item() == pytest.approx(0.36 * c, abs=0.005)


def exact_and_problem():
    """A 30-step problem and V* observed on 40 responses that write its whole chain: 2 end there (right), 38 go on
    writing (wrong), so P(EOS | the whole chain) = 0.05 and V* = 2 x 0.05 - 1 = -0.9 on every prefix of the chain."""
    problem = next(p for p in task.make_dataset(200, 0, task.LONG.min_steps, task.LONG.max_steps, split="eval")
                   if p["n_steps"] == 30)
    chain = task.solve(problem)
    exact = task.ExactValues()
    exact.observe([chain] * 2 + [chain + "0"] * 38, [problem] * 40, torch.tensor([1.0] * 2 + [-1.0] * 38))
    return exact, problem, chain


def tiny_ref(tokenizer, texts, rewards):
    from rollout import rollout_from_tokens
    exact, problem, _ = exact_and_problem()
    eos = tokenizer.eos_token_id
    ids = [tokenizer(t)["input_ids"] + [eos] for t in texts]
    rollout = rollout_from_tokens([tokenizer(problem["prompt"])["input_ids"]], ids, [[0.0] * len(x) for x in ids],
                                  len(texts), [eos], tokenizer.pad_token_id, tokenizer, "cpu")
    return {"rollout": rollout, "rewards": torch.tensor(rewards), "problems": [problem] * len(texts), "exact": exact,
            "tokenizer": tokenizer}


def test_the_decisions_the_bias_reverses_are_the_arithmetics(tokenizer):
    """On the right 30-step chain, V* = -0.9 on the chain, so stopping costs 1 + V* = 0.1: a falling bias at lambda
    0.95 makes stopping look better at every line start but t = 0 (gap 0.091 there, 0.12 and more after), at lambda 1
    at none, and a rising one at none. At EOS: a rising bias makes going on look better on the wrong response (a tie
    broken) and not on the right one (the gap, 0.6, is under 2)."""
    exact, problem, chain = exact_and_problem()
    assert exact.char_values(chain, problem)[:-1] == pytest.approx([-0.9] * len(chain))
    ref = tiny_ref(tokenizer, [chain, chain + "0"], [1.0, -1.0])
    assert lab.line_starts(chain, problem) == [10 * j for j in range(30)]
    band = task.band_of(30)
    falling = lab.decisions(ref, 0.0, -0.5, "0.95")
    assert falling["stop"][band] == [2 * 29, 2 * 30]  # both responses write the whole chain
    for offset, slope, lam in ((0.0, -0.5, "1"), (0.0, 0.0, "0.95"), (0.0, 0.5, "0.95"), (0.5, 0.0, "1")):
        assert lab.decisions(ref, offset, slope, lam)["stop"][band][0] == 0
    rising = lab.decisions(ref, 0.0, 0.5, "0.95")
    assert rising["eos"][band] == [1, 2]
    assert lab.decisions(ref, 0.0, 0.5, "1")["eos"][band] == [0, 2]
    assert lab.decisions(ref, 0.0, -0.5, "0.95")["eos"][band] == [0, 2]


def stars_with_advantages(advantages: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] values whose one-step TD errors are the given advantages (right-padded mask): V_{l-1} = R - A_{l-1},
    V_t = V_{t+1} - A_t, so V_t = R - sum_{k >= t} A_k."""
    after = torch.flip(torch.cumsum(torch.flip(advantages * mask, [1]), 1), [1])  # [B, T], sum_{k >= t} A_k
    return (rewards[:, None] - after) * mask


def test_the_length_adaptive_fit_finds_a_known_lambda():
    """If V*'s advantages are exactly GAE(0.9) of a critic, the fit names lambda 0.9 (H = 10) for that critic."""
    torch.manual_seed(0)
    lengths = [30, 80, 150, 260, 350] * 4
    mask = right_padded(lengths)
    values = (torch.rand(mask.shape) * 2 - 1) * mask
    rewards = torch.where(torch.rand(len(lengths)) < 0.5, 1.0, -1.0)
    target = gae(terminal_rewards(rewards, mask), values, mask, lam=0.9)[0]
    star = stars_with_advantages(target, rewards, mask)
    bands = {"all": mask.bool()}
    fit = lab.best_lambda(values, star, rewards, mask, bands)["all"]
    assert fit["best_horizon"] == pytest.approx(10.0) and fit["best_lambda"] == pytest.approx(0.9)
    assert max(c for c in fit["curve"] if c == c) == pytest.approx(1.0, abs=1e-6)


def test_with_independent_noise_the_best_lambda_is_sigma_over_v():
    """docs/lab.md, experiment 3: for V* plus independent noise sigma, where V*'s TD errors have variance v a token, the
    best lambda solves lambda / (1 - lambda)^2 = sigma^2 / v (H = 3.5 for sigma 0.3, v 0.01), not the
    (1 - lambda^2)^2 variant (H = 5)."""
    torch.manual_seed(1)
    B, T, v, sigma = 128, 800, 0.01, 0.3
    mask = torch.ones(B, T, dtype=torch.long)
    delta = torch.randn(B, T) * math.sqrt(v)
    rewards = delta.sum(-1)
    star = stars_with_advantages(delta, rewards, mask)
    noisy = lab.noisy_values(star, mask, sigma, seed=2)
    fit = lab.best_lambda(noisy, star, rewards, mask, {"all": mask.bool()})["all"]
    predicted = lab.noise_horizon(sigma, v)
    assert predicted == pytest.approx(1 / (1 - (19 - math.sqrt(37)) / 18))
    assert predicted / 1.25 <= fit["best_horizon"] <= predicted * 1.25
    assert lab.best_lambda(star, star, rewards, mask, {"all": mask.bool()})["all"]["best_lambda"] == 0.0


def test_the_critic_only_fit_regresses_on_the_arithmetics_targets(tiny_policy, tokenizer, monkeypatch):
    """decoupled-gae's step: from V = V* + b + h with h = 0, V* = 0 and a flat bias c, the targets h is stepped on are
    (R - c) lambda^d: R - c on every token at lambda 1, the bias kept far from the end at lambda 0.95."""
    from models import value_model_from_policy
    from rollout import rollout_from_tokens
    seen = []
    monkeypatch.setattr(vapo, "update", lambda policy, critic, opt, rollout, batch, cfg, train_policy: seen.append(
        (batch["values"].clone(), batch["returns"].clone())) or {})
    lengths, c = [5, 40], 0.5
    eos = tokenizer.eos_token_id
    ids = [[7] * (n - 1) + [eos] for n in lengths]
    rollout = rollout_from_tokens([[5, 6]], ids, [[0.0] * n for n in lengths], 2, [eos], tokenizer.pad_token_id,
                                  tokenizer, "cpu")
    part = {"rollout": rollout, "rewards": torch.tensor([1.0, -1.0])}
    critic = value_model_from_policy(tiny_policy)
    base = lambda p: lab.bias_values(p["rollout"].response_mask, c, 0.0)  # noqa: E731  V* = 0
    mask = rollout.response_mask
    d = (rollout.lengths[:, None] - 1 - torch.arange(rollout.T)[None, :]).clamp(min=0)  # tokens after each one
    for lam in (1.0, 0.95):
        lab.fit_critic(critic, [part], lam, base=base)
        h, targets = seen.pop()
        assert (h == 0).all()
        assert torch.allclose(targets, (part["rewards"][:, None] - c) * lam ** d * mask, atol=1e-5)


def test_zero_head_starts_a_critic_at_zero(tiny_policy, tokenizer):
    from models import value_model_from_policy
    from rollout import rollout_from_tokens, score_rollout
    critic = value_model_from_policy(tiny_policy)
    torch.nn.init.normal_(critic.score.weight)
    eos = tokenizer.eos_token_id
    rollout = rollout_from_tokens([[5, 6]], [[7, 8, eos]], [[0.0] * 3], 1, [eos], tokenizer.pad_token_id, tokenizer,
                                  "cpu")
    assert score_rollout(None, critic, rollout)["values"].abs().sum() > 0
    assert (score_rollout(None, lab.zero_head(critic), rollout)["values"] == 0).all()


def test_the_rl_experiments_print_runs_of_vapo_py_and_claim_nothing(capsys):
    """Every planned run is a valid `python vapo.py` command line that sets what its label says, except
    value-pretraining-rl's, which need the --critic-offset hook that vapo.py does not have yet (and say so)."""
    checks = {"eps_high 0.28": lambda cfg: cfg.eps_high_used == 0.28 and cfg.group_advantage,
              "per-sample loss": lambda cfg: cfg.loss_agg == "seq-mean-token-mean",
              "token-level loss": lambda cfg: cfg.loss_agg == "token-mean",
              "GRPO 2 prompts x 32": lambda cfg: (cfg.prompts_per_rollout, cfg.group_size) == (2, 32),
              "VAPO 64 prompts x 1": lambda cfg: (cfg.prompts_per_rollout, cfg.group_size) == (64, 1),
              "GRPO + NLL mu 3": lambda cfg: cfg.positive_nll and cfg.mu == 3 and cfg.group_advantage}
    seen = set()
    for name in ("clip-higher", "token-level", "group-sampling", "nll"):
        runs = lab.print_rl_runs(name, [0, 1, 2], "/tmp/lab", extension=True)
        assert len({options[options.index("--output-dir") + 1] for _, options in runs}) == len(runs)
        for label, options in runs:
            cfg, _, _ = vapo.config_from_args(options)
            assert cfg.seed == int(label.rsplit(" ", 1)[1])
            for key, check in checks.items():
                if label.startswith(key):
                    assert check(cfg), label
                    seen.add(key)
    assert seen == set(checks)
    runs = lab.print_rl_runs("value-pretraining-rl", [0], "/tmp/lab", extension=False)
    assert all("--critic-offset" in options for _, options in runs)
    with pytest.raises(SystemExit):
        vapo.config_from_args(runs[0][1])
    out = capsys.readouterr().out
    assert "runs none of them and claims no result" in out and "not run yet" in out and "hook" in out


def test_a_verdict_needs_two_standard_errors():
    assert lab.judge((0.5, 0.1), lo=0.25) == "confirmed"
    assert lab.judge((0.3, 0.1), lo=0.25) == "not separated"
    assert lab.judge((0.0, 0.1), lo=0.25) == "falsified"
    assert lab.judge((0.0, 0.0), 0, 0) == "confirmed"
    assert lab.judge((float("nan"), 0.0), 0, 1) == "not measured"
    assert lab.combine(["confirmed", "not measured"]) == "not separated"
    assert lab.combine(["confirmed", "falsified"]) == "falsified"


def test_the_residual_table_reads_the_bias_back_by_fifth_and_band():
    """decoupled-gae's measure at batch 0, where V - V* = b: a flat 0.5 reads 0.5 in every fifth of every band that has
    responses; a slope reads its mean over each fifth (a 400-token response's first fifth, t < 80: slope x 0.395)."""
    class Batch:
        lengths = torch.tensor([30, 400])
        response_mask = right_padded([30, 400])
    table = lab.residual_table(lab.bias_values(Batch.response_mask, 0.5, 0.0), Batch)
    assert table["1-49"]["tokens"] == 30 and table["300+"]["tokens"] == 400 and table["50-99"]["tokens"] == 0
    assert table["1-49"]["by_fifth"] == pytest.approx([0.5] * 5) and table["300+"]["by_fifth"] == pytest.approx([0.5] * 5)
    assert all(math.isnan(x) for x in table["100-199"]["by_fifth"])
    sloped = lab.residual_table(lab.bias_values(Batch.response_mask, 0.0, -0.5), Batch)["300+"]["by_fifth"]
    assert sloped == pytest.approx([-0.005 * (80 * k + 39.5) for k in range(5)])
