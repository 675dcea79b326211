"""The mechanism lab (bench/lab.py, lab_analyses.py, lab_rl.py; docs/lab.md): each experiment's setup does what the
page says it does, on tiny hand-worked cases: the bias has the slope asked for, GAE of V* + b differs from GAE of V*
by the page's arithmetic, the decisions it reverses are the ones the arithmetic names, the length-adaptive fit finds a
known lambda, and the critic-only fit regresses on the targets the arithmetic gives."""
import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch

import vapo
from gae import gae, terminal_rewards
from machinery import exact_values, task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, os.path.join(ROOT, "bench"))
import lab  # noqa: E402
import lab_analyses  # noqa: E402
import lab_rl  # noqa: E402


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
    assert lab_analyses.parse_bias("-0.5:0.125") == (-0.5, 0.125)


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0, "adaptive"])
def test_gae_of_a_biased_critic_shifts_by_the_pages_arithmetic(lam):
    """(A1): GAE(V* + b) - GAE(V*) is predicted_shift, written from the algebra, for any V*, rewards and lambda
    (per response under the length-adaptive lambda)."""
    torch.manual_seed(0)
    lengths = [3, 60, 411, 120]
    mask = right_padded(lengths)
    star = torch.rand(mask.shape) * 2 - 1
    terminal = terminal_rewards(torch.tensor([1.0, -1.0, -1.0, 1.0]), mask)
    lam_b = lab_analyses.lambdas("adaptive", torch.tensor(lengths)) if lam == "adaptive" else torch.full((4,), lam)
    for offset, slope in ((0.0, -0.5), (-0.5, 0.125), (0.5, 0.0)):
        measured = gae(terminal, star + lab.bias_values(mask, offset, slope), mask, lam=lam_b)[0] - gae(
            terminal, star, mask, lam=lam_b)[0]
        predicted = lab_analyses.predicted_shift(torch.tensor(lengths), mask.shape[1], offset, slope, lam_b)
        assert torch.allclose(measured, predicted, atol=2e-5)


def test_the_pages_worked_numbers():
    """docs/lab.md, experiment 1: for 0:-0.5 on a 411-token response, -0.10 a token far from the end at lambda 0.95,
    -b(t) at lambda 1, +2.05 at EOS at every lambda; a flat bias c keeps c (1 - 0.95^d) of itself in the critic's
    targets (A4), 0.36 c over a 20-token response."""
    n = torch.tensor([411])
    at_95 = lab_analyses.predicted_shift(n, 411, 0.0, -0.5, 0.95)[0]
    assert at_95[:40].mean().item() == pytest.approx(-0.10, abs=1e-3)
    at_1 = lab_analyses.predicted_shift(n, 411, 0.0, -0.5, 1.0)[0]
    assert torch.allclose(at_1, 0.005 * torch.arange(411.0), atol=1e-5)
    for lam in (0.0, 0.95, 1.0):
        assert lab_analyses.predicted_shift(n, 411, 0.0, -0.5, lam)[0, 410].item() == pytest.approx(2.05, abs=1e-5)
    c = 0.5
    short = torch.tensor([20])
    target = lab.bias_values(right_padded([20]), c, 0.0)[0] + lab_analyses.predicted_shift(short, 20, c, 0.0, 0.95)[0]
    assert torch.allclose(target, c * (1 - 0.95 ** (19 - torch.arange(20.0))), atol=1e-6)
    assert target.mean().item() == pytest.approx(0.36 * c, abs=0.005)


def exact_and_problem():
    """A 30-step problem and V* observed on 40 responses that write its whole chain: 2 end there (right), 38 go on
    writing (wrong), so P(EOS | the whole chain) = 0.05 and V* = 2 x 0.05 - 1 = -0.9 on every prefix of the chain."""
    problem = next(p for p in task.make_dataset(200, 0, task.LONG.min_steps, task.LONG.max_steps, split="eval")
                   if p["n_steps"] == 30)
    chain = task.solve(problem)
    exact = exact_values.ExactValues()
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
    assert lab_analyses.line_starts(chain, problem) == [10 * j for j in range(30)]
    band = task.band_of(30)
    falling = lab_analyses.decisions(ref, 0.0, -0.5, "0.95")
    assert falling["stop"][band] == [2 * 29, 2 * 30]  # both responses write the whole chain
    for offset, slope, lam in ((0.0, -0.5, "1"), (0.0, 0.0, "0.95"), (0.0, 0.5, "0.95"), (0.5, 0.0, "1")):
        assert lab_analyses.decisions(ref, offset, slope, lam)["stop"][band][0] == 0
    rising = lab_analyses.decisions(ref, 0.0, 0.5, "0.95")
    assert rising["eos"][band] == [1, 2]
    assert lab_analyses.decisions(ref, 0.0, 0.5, "1")["eos"][band] == [0, 2]
    assert lab_analyses.decisions(ref, 0.0, -0.5, "0.95")["eos"][band] == [0, 2]


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
    fit = lab_analyses.best_lambda(values, star, rewards, mask, bands)["all"]
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
    noisy = lab_analyses.noisy_values(star, mask, sigma, seed=2)
    fit = lab_analyses.best_lambda(noisy, star, rewards, mask, {"all": mask.bool()})["all"]
    predicted = lab.noise_horizon(sigma, v)
    assert predicted == pytest.approx(1 / (1 - (19 - math.sqrt(37)) / 18))
    assert predicted / 1.25 <= fit["best_horizon"] <= predicted * 1.25
    assert lab_analyses.best_lambda(star, star, rewards, mask, {"all": mask.bool()})["all"]["best_lambda"] == 0.0


def test_the_critic_only_fit_regresses_on_the_arithmetics_targets(tiny_policy, tokenizer, monkeypatch):
    """decoupled-gae's step: from V = V* + b + h with h = 0, V* = 0 and a flat bias c, the targets h is stepped on are
    (R - c) lambda^d: R - c on every token at lambda 1, the bias kept far from the end at lambda 0.95."""
    from machinery.models import value_model_from_policy
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
        lab_analyses.fit_critic(critic, [part], lam, base=base)
        h, targets = seen.pop()
        assert (h == 0).all()
        assert torch.allclose(targets, (part["rewards"][:, None] - c) * lam ** d * mask, atol=1e-5)


def test_zero_head_starts_a_critic_at_zero(tiny_policy, tokenizer):
    from machinery.models import value_model_from_policy, zero_head
    from rollout import rollout_from_tokens, score_rollout
    critic = value_model_from_policy(tiny_policy)
    torch.nn.init.normal_(critic.score.weight)
    eos = tokenizer.eos_token_id
    rollout = rollout_from_tokens([[5, 6]], [[7, 8, eos]], [[0.0] * 3], 1, [eos], tokenizer.pad_token_id, tokenizer,
                                  "cpu")
    assert score_rollout(None, critic, rollout)["values"].abs().sum() > 0
    assert (score_rollout(None, zero_head(critic), rollout)["values"] == 0).all()


def test_the_rl_experiments_print_runs_of_vapo_py_and_claim_nothing(capsys):
    """Every planned run is a valid `python vapo.py` command line that sets what its label says (value-pretraining-rl's
    critic through `bench/lab.py record`'s --critic-offset, the trainer's critic hook)."""
    checks = {"eps_high 0.28": lambda cfg: cfg.eps_high_used == 0.28 and cfg.group_advantage,
              "per-sample loss": lambda cfg: cfg.loss_agg == "seq-mean-token-mean",
              "token-level loss": lambda cfg: cfg.loss_agg == "token-mean",
              "GRPO 2 prompts x 32": lambda cfg: (cfg.prompts_per_rollout, cfg.group_size) == (2, 32),
              "VAPO 64 prompts x 1": lambda cfg: (cfg.prompts_per_rollout, cfg.group_size) == (64, 1),
              "GRPO + NLL mu 3": lambda cfg: cfg.positive_nll and cfg.mu == 3 and cfg.group_advantage,
              "falling slope -0.5, no value pretraining": lambda cfg: cfg.bias == (0, -0.5) and cfg.algo == "ppo"
              and not cfg.value_pretraining and cfg.steps == 12,
              "falling slope -0.5, value pretraining": lambda cfg: cfg.bias == (0, -0.5) and cfg.algo == "ppo"
              and cfg.value_pretraining and cfg.value_pretrain_steps == 20 and cfg.value_pretrain_ev is None,
              "V* alone (control)": lambda cfg: cfg.bias == (0, 0) and not cfg.value_pretraining,
              "rising slope +0.5, no value pretraining": lambda cfg: cfg.bias == (0, 0.5)}
    seen = set()
    for name in ("clip-higher", "token-level", "group-sampling", "nll", "value-pretraining-rl"):
        runs = lab_rl.print_rl_runs(name, [0, 1, 2], "/tmp/lab", extension=True)
        assert len({options[options.index("--output-dir") + 1] for _, options in runs}) == len(runs)
        for label, options in runs:
            spec, options = lab_rl.split_offset(options)
            cfg, _, _ = vapo.config_from_args(options)
            cfg = SimpleNamespace(**vars(cfg), **dataclasses_props(cfg), bias=spec and lab_rl.parse_offset(spec))
            assert cfg.seed == int(label.rsplit(" ", 1)[1])
            for key, check in checks.items():
                if label.startswith(key):
                    assert check(cfg), label
                    seen.add(key)
    assert seen == set(checks)
    out = capsys.readouterr().out
    assert "runs none of them and claims no result" in out and "not judged here" in out
    assert "--critic-offset" in out and "does not have" not in out


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
    table = lab_analyses.residual_table(lab.bias_values(Batch.response_mask, 0.5, 0.0), Batch)
    assert table["1-49"]["tokens"] == 30 and table["300+"]["tokens"] == 400 and table["50-99"]["tokens"] == 0
    assert table["1-49"]["by_fifth"] == pytest.approx([0.5] * 5) and table["300+"]["by_fifth"] == pytest.approx([0.5] * 5)
    assert all(math.isnan(x) for x in table["100-199"]["by_fifth"])
    sloped = lab_analyses.residual_table(lab.bias_values(Batch.response_mask, 0.0, -0.5), Batch)["300+"]["by_fifth"]
    assert sloped == pytest.approx([-0.005 * (80 * k + 39.5) for k in range(5)])


# --- the lab's constructed critic through the trainer's critic hook: V = V*_0 + b + h --------------------------------
LAB_RUN = dict(vapo.ALGORITHMS["ppo"], algo="ppo", dataset="builtin-long", steps=1,
               prompts_per_step=4, samples_per_prompt=1, mini_batch_size=4, micro_batch_size=2, max_new_tokens=24,
               actor_lr=1e-3, critic_lr=1e-4, warmup_steps=1, eval_every=0, eval_prompts=2, eval_samples=1,
               save_every=0, token_views=False, truncated_reward="graded")


def dataclasses_props(cfg) -> dict:
    """The derived values of a Config (properties) that the checks read."""
    return {k: getattr(cfg, k) for k in ("eps_high_used", "loss_agg", "prompts_per_rollout", "group_size")}


def bias(mask: torch.Tensor, offset: float, slope: float) -> torch.Tensor:
    """b(t) = offset + slope * t / 100, written out again here (t from 0 on each response's first token)."""
    return torch.tensor([[offset + slope * t / 100 if mask[b, t] else 0.0 for t in range(mask.shape[1])]
                         for b in range(mask.shape[0])])


def test_the_values_gae_sees_at_step_0_are_the_constructed_critics(tiny_model_dir, tiny_policy, tokenizer, tmp_path):
    """The offset critic exact:0.3:-0.5 on a tiny run: the values the observers see at step 0 (phase 4's) are
    V*_0 + b to 1e-6, even from a critic whose head was not zero (the wrapper zeroes it: h = 0), V*_0 fitted on the
    OFFSET_RESPONSES responses before step 0; the trainer's functions are its own throughout."""
    from machinery.models import value_model_from_policy
    from machinery.run import Hooks
    critic = value_model_from_policy(tiny_policy)
    torch.nn.init.normal_(critic.score.weight)  # a head that is not zero
    critic.save_pretrained(tmp_path / "critic")
    cfg = vapo.Config(**LAB_RUN, model=tiny_model_dir, value_model=str(tmp_path / "critic"),
                      output_dir=str(tmp_path / "run")).validate()
    seen, critics = [], []
    observer = SimpleNamespace(observe=lambda batch: seen.append((batch.rollout, batch.values.clone())) or {},
                               state_dict=dict, load_state_dict=lambda state: None)
    update, rl_step = vapo.update, vapo.rl_step
    vapo.train(cfg, hooks=Hooks(critic=lab_rl.offset_critic("exact:0.3:-0.5"),
                                observers=lambda setup, critic: critics.append(critic) or [observer]))
    assert (vapo.update, vapo.rl_step) == (update, rl_step)
    (rollout, values), (offset_critic,) = seen[0], critics
    assert isinstance(offset_critic, lab_rl.OffsetCritic)
    assert offset_critic.exact.batches[0][("start",)][0] == lab_rl.OFFSET_RESPONSES == 256
    problems = exact_values.problems_of(rollout, tokenizer)
    star = offset_critic.exact.values(rollout, problems, tokenizer)  # V*_0
    mask = rollout.response_mask
    assert star[mask.bool()].abs().min() > 0.1  # V*_0 is not 0 here: the sum is not b alone
    assert torch.allclose(values, star + bias(mask, 0.3, -0.5), atol=1e-6)
    assert (values[~mask.bool()] == 0).all()  # V = 0 past the end


def offset_rollout(tokenizer):
    """Four responses of assorted lengths to prompts of the long task (their problems read back from the prompts)."""
    from rollout import rollout_from_tokens
    eos = tokenizer.eos_token_id
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ("Compute: 12 a-5 b+3\n", "Compute: 4 a+5\n",
                                                                        "Compute: 9 a-2 b-3 c+1\n", "Compute: 7 a+1\n")]
    responses = [tokenizer.encode(r, add_special_tokens=False) + [eos] for r in ("12 a-5=07\n07 b+3=10\nAnswer: 10",
                                                                               "Answer: 9", "9 a-2=07\n", "Answer")]
    parts = [rollout_from_tokens([p], [r], [[0.0] * len(r)], 1, [eos], tokenizer.pad_token_id, tokenizer, "cpu")
             for p, r in zip(prompts, responses)]
    from rollout import Rollout
    rollout = Rollout.cat(parts)
    rollout.prompt_index = torch.arange(4)
    return rollout


def test_the_critics_step_moves_h_alone_on_the_returns_minus_the_offset(tiny_policy, tokenizer):
    """The critic step of an OffsetCritic (V = V*_0 + b + h) is the step of a plain critic h regressed on
    returns - (V*_0 + b): the offset is a constant, and h the only thing trained."""
    from machinery.models import value_model_from_policy
    from rollout import score_rollout
    cfg = vapo.Config(**{**LAB_RUN, "critic_mini_batch_size": 2}).validate()
    rollout = offset_rollout(tokenizer)
    mask = rollout.response_mask
    returns = terminal_rewards(torch.tensor([1.0, -1.0, -1.0, 1.0]), mask).flip(1).cumsum(1).flip(1)  # R everywhere
    critics = []
    for kind in ("offset", "shifted"):
        torch.manual_seed(0)  # the same mini-batches
        net = value_model_from_policy(tiny_policy)
        if kind == "offset":
            critic = lab_rl.OffsetCritic(net, exact_values.ExactValues(), tokenizer, 0.3, -0.5)
            values = score_rollout(None, critic, rollout)["values"]
            offset = values - score_rollout(None, net, rollout)["values"]  # V*_0 + b
            assert offset[mask.bool()].abs().min() > 0.05
            data = {"values": values, "returns": returns}
        else:
            critic = net
            data = {"values": score_rollout(None, net, rollout)["values"], "returns": returns - offset}
        sgd = torch.optim.SGD(critic.parameters(), lr=0.1)  # not Adam, whose first step is about sign(gradient)
        vapo.update(None, critic, {"critic": (sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda n: 1.0))}, rollout,
                    data, cfg, train_policy=False)
        critics.append(critic)
    start = value_model_from_policy(tiny_policy).state_dict()
    one, other = (c.state_dict() for c in critics)
    assert set(one) == set(start)  # the wrapper's weights are h's, under h's names
    assert any(not torch.equal(one[k], start[k]) for k in start)  # it stepped
    assert all(torch.allclose(one[k], other[k], atol=1e-6) for k in one)


def test_value_pretraining_trains_h_on_the_returns_minus_the_offset(tiny_policy, tokenizer):
    """A value-pretraining step of an OffsetCritic: the values it sees are V*_0 + b + h (h = 0 at first), and its
    update lowers h's loss against returns - (V*_0 + b) on that step's rollout."""
    from machinery.engines import HFEngine
    from machinery.models import value_model_from_policy
    from machinery.run import Setup
    from reward import Verifier, arith_reward
    from rollout import response_values
    torch.manual_seed(0)  # the mini-batches' order
    cfg = vapo.Config(**{**LAB_RUN, "value_pretraining": True, "value_pretrain_steps": 1}).validate()
    engine = HFEngine(tiny_policy, tokenizer, max_new_tokens=cfg.max_new_tokens)
    rows = task.make_dataset(200, 0, task.LONG.min_steps, task.LONG.max_steps, split="train")
    verifier = Verifier(arith_reward, 0)
    critic = lab_rl.offset_critic("exact:0.3:-0.5")(value_model_from_policy(tiny_policy),
                                                  Setup(cfg, tiny_policy, tokenizer, engine, rows, verifier))
    seen = []

    def h_loss(batch):
        with torch.no_grad():
            h = response_values(critic.net, batch.rollout)
        offset, mask = seen[0][1], batch.rollout.response_mask
        return float((0.5 * (h - (batch.returns - offset)) ** 2 * mask).sum() / mask.sum())
    observer = SimpleNamespace(observe=lambda batch: seen.append((batch, batch.values.clone())) or {})
    optimizers = {"critic": vapo.make_optimizer(critic, cfg.critic_lr, cfg)}
    assert vapo.pretrain_value(tiny_policy, critic, optimizers, engine, rows, cfg, verifier, lambda r: None,
                               observers=[observer])
    (batch, values), = seen
    with torch.no_grad():
        assert (response_values(critic.net, batch.rollout) != 0).any()  # h moved
    h0 = torch.zeros_like(values)
    mask = batch.rollout.response_mask
    before = float((0.5 * (h0 - (batch.returns - values)) ** 2 * mask).sum() / mask.sum())  # h = 0: V = offset
    assert h_loss(batch) < before


@pytest.mark.parametrize("spec, options, problem", [
    ("exact:a:b", [], "OFFSET and SLOPE must be numbers"),
    ("exact:0", [], "not of the form exact:OFFSET:SLOPE"),
    ("bias:0:-0.5", [], "not of the form exact:OFFSET:SLOPE"),
    ("exact:inf:0", [], "must be finite numbers"),
    ("exact:0:-0.5", ["--preset", "demo"], "the built-in long task"),
    ("exact:0:-0.5", ["--algo", "grpo"], "a critic to offset"),
    ("exact:0:-0.5", ["--algo", "dapo", "--no-dynamic-sampling"], "a critic to offset"),
    ("exact:0:-0.5", ["--dynamic-sampling"], "--dynamic-sampling"),
])
def test_the_offset_critic_refuses_what_it_cannot_do(tmp_path, spec, options, problem):
    """Each refusal of `bench/lab.py record --critic-offset` is one line naming it, before any model loads."""
    argv = ["--", "--preset", "long", *options, "--critic-offset", spec, "--output-dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit, match=problem):
        lab_rl.record(argv)
    assert not (tmp_path / "run" / "config.json").exists()


# --- the RL experiments' per-update record (bench/lab.py record) and their judge -----------------------------------
def test_the_decision_table_reads_the_right_digits_probability(tiny_policy, tokenizer):
    """At a borrow line's tens digit ("12 b-5=17": the habit wrote 1, the right digit is 0) the table holds log pi of
    the right digit and of the sampled one at that position, computed here by a forward pass written out."""
    from rollout import rollout_from_tokens
    assert task.borrow_decisions("12 b-5=17\n20 c+3=23") == [(7, "0")]
    eos = tokenizer.eos_token_id
    prompt = tokenizer.encode("Compute: 12 b-5 c+3\n", add_special_tokens=False)
    response = tokenizer.encode("12 b-5=17\n", add_special_tokens=False) + [eos]
    rollout = rollout_from_tokens([prompt], [response], [[0.0] * len(response)], 1, [eos], tokenizer.pad_token_id,
                                  tokenizer, "cpu")
    table = lab_rl.decision_table(tiny_policy, rollout, tokenizer, 1.0)
    assert table["rows"].tolist() == [0] and table["cols"].tolist() == [7] and table["right"].tolist() == [False]
    with torch.no_grad():
        logits = tiny_policy(torch.tensor([prompt + response[:7]])).logits[0, -1].log_softmax(-1)
    zero, one = (tokenizer.encode(d, add_special_tokens=False)[0] for d in "01")
    assert float(table["lp_right"][0]) == pytest.approx(float(logits[zero]), abs=1e-5)
    assert float(table["lp_sampled"][0]) == pytest.approx(float(logits[one]), abs=1e-5)
    assert float(table["entropy"][0]) == pytest.approx(float(-(logits.exp() * logits).sum()), abs=1e-5)


def test_a_decision_is_pushed_when_right_with_a_positive_advantage_and_binding_at_the_bound():
    """pushed = the right digit sampled and a positive advantage; binding = pushed with pi_new / pi_old >= 1 + eps_high;
    growth = p_after(right) / p_before(right); exposures and the habit's samples counted by band."""
    log = lambda xs: torch.tensor(xs).log()  # noqa: E731
    before = {"rows": torch.tensor([0, 0, 1, 2]), "cols": torch.tensor([3, 9, 3, 5]),
              "right": torch.tensor([True, True, False, True]), "lp_right": log([0.3, 0.5, 0.2, 0.4]),
              "lp_sampled": log([0.3, 0.5, 0.8, 0.4]), "entropy": torch.tensor([0.6, 0.7, 0.5, 0.6])}
    after = dict(before, lp_right=log([0.39, 0.55, 0.3, 0.6]), lp_sampled=log([0.39, 0.55, 0.7, 0.6]))
    advantages = torch.zeros(3, 10)
    advantages[0] = 1.0
    advantages[2] = -1.0
    r = lab_rl.decision_record(before, after, advantages, ["1-10", "31-40", "31-40"], eps_high=0.28)
    assert (r["decisions"], r["pushed"], r["binding"]) == (4, 2, 1)  # 0.39 / 0.3 = 1.3 >= 1.28; 0.55 / 0.5 = 1.1
    assert r["growth_binding"] == pytest.approx(1.3) and r["growth_pushed"] == pytest.approx((1.3 + 1.1) / 2)
    assert r["p_right_before"] == pytest.approx(0.35) and r["sampled_right"] == 0.75
    assert (r["exposures|1-10"], r["habit|1-10"], r["exposures|31-40"], r["habit|31-40"]) == (2, 0, 2, 1)


def test_record_writes_each_rl_steps_decisions_and_leaves_the_trainer_as_it_is(tmp_path, monkeypatch):
    """`bench/lab.py record -- OPTIONS` is vapo.py's run with one line per RL step in decisions.jsonl (the shipped demo
    base model writes borrow lines, so the batch has decisions); without --output-dir it refuses."""
    update, rl_step = vapo.update, vapo.rl_step
    with pytest.raises(SystemExit, match="--output-dir"):
        lab.main(["record", "--", "--steps", "1"])
    run = str(tmp_path / "run")
    lab.main(["record", "--", "--algo", "grpo", "--steps", "2", "--prompts-per-step", "2", "--samples-per-prompt", "4",
              "--mini-batch-size", "4", "--micro-batch-size", "4", "--eval-every", "0", "--eval-prompts", "2",
              "--eval-samples", "1", "--save-every", "0", "--output-dir", run])
    records = lab_rl.read_decisions(run)
    assert (vapo.update, vapo.rl_step) == (update, rl_step)  # the record came through the hooks
    assert sorted(records) == [1, 2]
    assert all(r["decisions"] > 0 and 0 < r["p_right_before"] < 1 and r["pushed"] >= r["binding"] >= 0
               for r in records.values())


def test_the_clip_higher_judge_reads_the_arms_and_orders_them(tmp_path):
    """On made-up run folders whose records say eps_high 0.4 raised p(right) most and 0.2 least, the judge confirms
    the order (three seeds, differences of 0.1 with no spread), reads growth at binding decisions pooled over steps,
    and writes its json and figure."""
    import json
    out = str(tmp_path)
    for seed in (0, 1, 2):
        for label, options in lab_rl.rl_runs("clip-higher", [seed], out):
            e = float(label.split()[1].rstrip(","))
            folder = lab_rl.output_dir(options)
            os.makedirs(folder)
            with open(os.path.join(folder, "config.json"), "w") as fh:
                json.dump({"steps": 12}, fh)
            with open(os.path.join(folder, "metrics.jsonl"), "w") as fh:
                for step, acc in ((0, 0.3), (6, 0.3 + e), (12, 0.4 + e)):
                    fh.write(json.dumps({"step": step, "eval/acc_greedy": 0.5, "eval/acc_avg@4": acc,
                                         "eval/pass@4": 0.9}) + "\n")
            with open(os.path.join(folder, lab_rl.DECISIONS), "w") as fh:
                for step in range(1, 13):
                    fh.write(json.dumps({"step": step, "decisions": 10, "p_right_before": 0.3 + e * (step - 1) / 5,
                                         "p_right_after": 0.3 + e * step / 5, "entropy_before": 0.6 + 0.01 * step,
                                         "entropy_after": 0.61 + 0.01 * step, "pushed": 4, "binding": 2,
                                         "growth_binding": 1 + e, "growth_pushed": 1.1}) + "\n")
    summary = lab_rl.report_rl("clip-higher", [0, 1, 2], out, extension=False)
    verdicts = dict((text, v) for text, v in summary["verdicts"])
    assert verdicts["1. p(right)'s rise over 6 rollouts ordered 0.4 > 0.28 > 0.2"] == "confirmed"
    assert summary["mean_se"]["0.4|growth_binding"] == pytest.approx([1.4, 0.0])
    assert summary["mean_se"]["0.28|rise6"][0] == pytest.approx(0.28 * 6 / 5)
    assert os.path.exists(os.path.join(out, "clip-higher.png")) and os.path.exists(os.path.join(out, "clip-higher.json"))


def _fake_run(folder: str, steps: int, evals: list[dict], decisions: list[dict], step_records: list[dict]) -> None:
    import json
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"steps": steps}, fh)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as fh:
        for r in step_records + evals:
            fh.write(json.dumps(r) + "\n")
    with open(os.path.join(folder, lab_rl.DECISIONS), "w") as fh:
        for r in decisions:
            fh.write(json.dumps(r) + "\n")


@pytest.mark.parametrize("name", ["token-level", "group-sampling", "nll", "value-pretraining-rl"])
def test_the_long_chain_judges_read_their_arms(name, tmp_path, monkeypatch):
    """Each long-chain experiment's judge on made-up finished runs (profiles and entropies given, not measured): the
    measures are the differences the page's predictions name, worked by hand here, and the verdicts follow."""
    out = str(tmp_path)
    bands = lab.STEP_BANDS
    base = {b: {"accuracy": 0.5, "mean_tokens": 200.0, "habit_rate": 0.6, "habit": 60, "borrow": 100,
                "lookup_rate": 0.1, "early": 0.0} for b in (*bands, "27-40")}

    def final(folder):  # the per-sample arm halves the habit everywhere, the token-level arm takes a third off
        f = {b: dict(v) for b, v in base.items()}
        cut = 0.5 if "per-sample" in folder else 1 / 3
        for b in bands:
            f[b].update(habit_rate=0.6 * (1 - cut), habit=60 * (1 - cut))
            f[b]["mean_tokens"] = 100.0 if "no-value-pretraining" in folder else 190.0
            f[b]["early"] = 0.4 if "no-value-pretraining" in folder else 0.0
        return f
    monkeypatch.setattr(lab_rl, "profile", lambda folder, cache=None: base if cache else final(folder))
    monkeypatch.setattr(lab_rl, "decision_entropy", lambda folder, ref, cache=None: 0.6 if cache else
                        (0.2 if "nll-mu-3" in folder else 0.5))
    monkeypatch.setattr(lab_rl, "sample_set", lambda *a: (None, None, None, None))
    for seed in (0, 1, 2):
        for label, options in lab_rl.rl_runs(name, [seed], out, extension=True):
            G = int(label.split(" x ")[1].split(",")[0]) if " x " in label else 8
            nll = "NLL mu 3" in label
            evals = [{"step": 0, "eval/acc_greedy": 0.5, "eval/acc_avg@2": 0.3, "eval/pass@2": 0.5},
                     {"step": 16, "eval/acc_greedy": 0.5, "eval/acc_avg@2": 0.5 if nll else 0.35 + 0.01 * G,
                      "eval/pass@2": 0.6}]
            rows = {f"rows|{b}": 16 for b in bands}
            decisions = [{"step": s, "decisions": 40, **rows, **{f"exposures|{b}": 10 * (i + 1) for i, b in
                                                                 enumerate(bands)}} for s in range(1, 17)]
            all_same = sum(lab_rl.P_BASE[b] ** G + (1 - lab_rl.P_BASE[b]) ** G for b in bands) / 4
            steps = [{"step": s, "train_acc": 0.3, "groups_all_same": all_same} for s in range(1, 17)]
            _fake_run(lab_rl.output_dir(options), 16, evals, decisions, steps)
    summary = lab_rl.report_rl(name, [0, 1, 2], out, extension=True)
    s, verdicts = summary["mean_se"], dict(summary["verdicts"])
    if name == "token-level":  # exposures 30 at 1-20 and 70 at 21-40, the same decline: 30/70 of the short bands'
        assert s["per-sample|long_over_short"][0] == pytest.approx(3 / 7)
        assert s["decline|per-sample-token-level"][0] == pytest.approx(0.3 - 0.2)
        assert verdicts["2. the habit falls at least as fast overall under the per-sample loss"] == "confirmed"
    elif name == "group-sampling":
        assert s["8|all_same_1_miss"][0] == pytest.approx(0, abs=1e-9)
        assert s["avg@2|8-2"][0] == pytest.approx(0.06)
        assert verdicts["2. avg@2 at the end: G = 8 above G = 2"] == "confirmed"
    elif name == "nll":
        assert s["entropy_fall|nll-grpo"][0] == pytest.approx(0.3)
        assert s["avg@2_gain|nll-grpo"][0] == pytest.approx(0.2 - 0.13)
        assert verdicts["1. entropy at borrow decisions falls more with the NLL"] == "confirmed"
    else:
        assert s["falling|length_change_21_40"][0] == pytest.approx(-0.5)
        assert s["length|pretrained-control"][0] == pytest.approx(0)
        assert all(v == "confirmed" for v in verdicts.values())
    assert os.path.exists(os.path.join(out, f"{name}.png"))


def test_a_difference_is_judged_on_each_seeds_own_difference():
    """Two measures equal on every seed differ by 0 +- 0 (paired), though each varies over seeds; the independent SE
    is what a Stats without its seeds gives."""
    per_seed = [{"measures": {"a": x, "b": x}} for x in (0.4, 0.8, 0.95)]
    s = lab.summarise(per_seed)
    assert lab._diff(s, "a", "b") == (0.0, 0.0)
    assert lab.judge(lab._diff(s, "a", "b"), -0.02, 0.02) == "confirmed"
    assert lab._diff(dict(s), "a", "b")[1] == pytest.approx(math.hypot(s["a"][1], s["b"][1]))
