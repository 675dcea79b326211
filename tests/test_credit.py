"""The credit meter and the oracle critics (machinery/exact_values.py): the meter's figures on hand-made batches, each
oracle's values against V* (exact to 1e-6, noise of its stated sd, late by its delay, Monte-Carlo unbiased), their
refusals by name, and a tiny run of each that logs the meter."""
import json
import os
import statistics
from types import SimpleNamespace

import pytest
import torch

import vapo
from config import Config, parse_oracle
from gae import group_advantage
from machinery import exact_values, task, world
from machinery.exact_values import (ExactValues, OracleCritic, credit_figures, exact_advantages, first_error_tokens,
                                    weighted_corr)
from rollout import Rollout, rollout_from_tokens

PROBLEM = task.problem_of("Compute: 12 a-5 b+3 c-4\n")  # the chain 12 a-5=07 / 07 b+3=10 / 10 c-4=06 / Answer: 6
CHAIN = task.solve(PROBLEM)
HABIT = "12 a-5=17\n17 b+3=20\n20 c-4=16\nAnswer: 16"  # the borrow forgotten at token 7, carried to the end


def fitted_exact() -> ExactValues:
    """V* of a made-up policy: right 9 times in 10 on each borrow character, always on the others."""
    exact = ExactValues()
    problems = task.make_dataset(60, 1, 1, 10, split="train")
    texts, rewards = [], []
    for i, p in enumerate(problems):
        chain = task.solve(p)
        wrong = i % 10 == 0  # a slip on the first line's tens digit
        texts.append(chain[:7] + ("9" if chain[7] != "9" else "8") + chain[8:] if wrong else chain)
        rewards.append(-1.0 if wrong else 1.0)
    exact.observe(texts, problems, rewards)
    return exact


def rollout_of(tokenizer, texts: list[str], problem=PROBLEM) -> Rollout:
    eos = tokenizer.eos_token_id
    prompt = tokenizer.encode(problem["prompt"], add_special_tokens=False)
    responses = [tokenizer.encode(t, add_special_tokens=False) + [eos] for t in texts]
    return rollout_from_tokens([prompt], responses, [[0.0] * len(r) for r in responses], len(texts), [eos],
                               tokenizer.pad_token_id, tokenizer, "cpu")


# --- the meter -------------------------------------------------------------------------------------------------------
def test_weighted_correlation_is_pearsons_with_weights_as_counts():
    x, y = torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor([[2.0, 1.0, 4.0, 3.0]])
    w = torch.tensor([[1.0, 2.0, 0.0, 1.0]])  # weight 2 counts a token twice; weight 0 leaves it out
    xs, ys = [1.0, 2.0, 2.0, 4.0], [2.0, 1.0, 1.0, 3.0]
    assert weighted_corr(x, y, w) == pytest.approx(statistics.correlation(xs, ys))
    assert weighted_corr(x, x, w) == pytest.approx(1.0) and weighted_corr(x, -x, w) == pytest.approx(-1.0)
    assert weighted_corr(x, torch.ones_like(x), w) != weighted_corr(x, torch.ones_like(x), w)  # NaN: no variance


def test_exact_advantages_are_v_stars_td_errors():
    """A*_t = r_t + V*(s_{t+1}) - V*(s_t), V* = 0 after the last token, the reward there."""
    star = torch.tensor([[0.2, 0.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    a = exact_advantages(star, torch.tensor([-1.0]), mask)
    torch.testing.assert_close(a, torch.tensor([[0.3, -1.5, 0.0, 0.0]]))


def batch_of(advantages, verdicts, mask, old_logprobs=None, cfg=None, values=None):
    B, T = mask.shape
    cfg = cfg or Config(samples_per_prompt=2, positive_nll=False)
    return SimpleNamespace(cfg=cfg, rollout=SimpleNamespace(response_mask=mask, lengths=mask.sum(-1), B=B, T=T),
                           advantages=advantages, verdicts=verdicts, rewards=verdicts,
                           old_logprobs=torch.full((B, T), -0.5) if old_logprobs is None else old_logprobs,
                           values=values)


def test_within_response_takes_each_responses_level_out():
    """A critic that knows each response's level but not its moves explains V*'s variance, none of it inside."""
    star = torch.tensor([[0.5, 0.5, -1.0, 0.0], [0.9, 0.9, 0.9, 0.9]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    level = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.9, 0.9, 0.9, 0.9]])  # each response's own mean of V*
    within = exact_values.within_response(star, mask)
    assert within[0, :3].tolist() == pytest.approx([0.5, 0.5, -1.0]) and within[0, 3] == 0  # row 0's mean is 0
    assert within[1].abs().sum() == 0
    from losses import explained_variance
    assert explained_variance(level, star, mask) > 0.4  # the levels: about half of this V*'s variance
    assert explained_variance(exact_values.within_response(level, mask), within, mask) == pytest.approx(0.0)


def test_the_meter_on_a_hand_made_batch():
    """Advantages equal to A* correlate 1 with it; a first wrong token with a negative advantage is blamed (negative
    credit/first_error); GRPO's group advantage puts no weight on an all-fail group; the NLL's weight sits on correct
    samples' tokens."""
    mask = torch.ones(4, 3, dtype=torch.long)
    star = torch.tensor([[0.5, 0.6, 0.9], [0.5, -1.0, -1.0], [-0.2, -1.0, -1.0], [-0.2, -0.4, -1.0]])
    verdicts = torch.tensor([1.0, -1.0, -1.0, -1.0])  # group 0: one right; group 1: all wrong
    exact = exact_advantages(star, verdicts, mask)
    figures = credit_figures(batch_of(exact, verdicts, mask), star, [(1, 0), (2, 0), (3, 1)])
    assert figures["credit/corr"] == pytest.approx(1.0)
    assert figures["credit/first_error"] == figures["credit/first_error_exact"] < 0
    grpo = group_advantage(verdicts, mask, 2)
    figures = credit_figures(batch_of(grpo, verdicts, mask), star, [(1, 0)])
    assert figures["credit/fail_share"] == 0.0 and figures["credit/first_error"] < 0
    nll = batch_of(torch.zeros(4, 3), verdicts, mask, cfg=Config(samples_per_prompt=2, mu=0.5, policy_gradient=False))
    effective = exact_values.effective_advantages(nll)
    assert effective[0].tolist() == pytest.approx([0.5 * 12 / 3] * 3) and (effective[1:] == 0).all()
    by_band = credit_figures(batch_of(exact, verdicts, mask), star, [])
    assert by_band["credit/corr|1-49"] == pytest.approx(1.0) and by_band["credit/first_error"] != \
        by_band["credit/first_error"]  # no wrong token given: NaN


def test_the_meter_weighs_tokens_by_their_gradients_size():
    """A token the policy takes with probability ~1 has no gradient (1 - pi_old ~ 0): what sits there does not move
    the correlation."""
    mask = torch.ones(2, 3, dtype=torch.long)
    star = torch.tensor([[0.0, 0.5, 0.5], [0.0, -0.5, -0.5]])
    verdicts = torch.tensor([1.0, -1.0])
    exact = exact_advantages(star, verdicts, mask)
    wrong_where_certain = exact.clone()
    wrong_where_certain[:, 2] = -wrong_where_certain[:, 2]  # the last token's sign flipped ...
    certain = torch.full((2, 3), -0.7)
    certain[:, 2] = 0.0  # ... where pi_old = 1
    figures = credit_figures(batch_of(wrong_where_certain, verdicts, mask, certain), star, [])
    assert figures["credit/corr"] == pytest.approx(1.0)


def test_first_error_tokens_find_the_wrong_digit(tokenizer):
    assert CHAIN == "12 a-5=07\n07 b+3=10\n10 c-4=06\nAnswer: 6"
    rollout = rollout_of(tokenizer, [CHAIN, HABIT, "Answer: 5"])
    assert first_error_tokens(rollout, [PROBLEM] * 3, tokenizer) == [(1, 7), (2, 0)]


# --- the oracles -----------------------------------------------------------------------------------------------------
def test_the_oracles_values_against_v_star(tokenizer):
    """exact: V* to 1e-6; noise: V* plus noise of sd sigma, the same on a second scoring; late:D: V* that sees the
    error D tokens late; mc:K: unbiased at line starts (the mean over seeds), interpolated between them."""
    exact = fitted_exact()
    rollout = rollout_of(tokenizer, [CHAIN, HABIT] * 8)
    star = exact.values(rollout, [PROBLEM] * rollout.B, tokenizer)
    mask = rollout.response_mask.bool()
    oracle = lambda spec, seed=0: OracleCritic(spec, exact, tokenizer, seed).values_of(rollout)  # noqa: E731
    torch.testing.assert_close(oracle("exact"), star, atol=1e-6, rtol=0)
    noisy = oracle("exact+noise:0.3")
    assert (noisy - star)[mask].std().item() == pytest.approx(0.3, rel=0.08)
    assert torch.equal(noisy, oracle("exact+noise:0.3")) and not torch.equal(noisy, oracle("exact+noise:0.3", 1))
    late = oracle("late:3")[1]
    assert late[:8].tolist() == star[1, :8].tolist() and late[8] > -1 and late[10] > -1 and late[11] == -1
    assert star[1, 8] == -1  # V* sees it at once: after the wrong character (token 7)
    starts = [0, 10, 20]  # line starts of the chain (10 characters a line)
    means = torch.stack([oracle("mc:4", seed)[0, starts] for seed in range(300)]).mean(0)
    assert means.tolist() == pytest.approx(star[0, starts].tolist(), abs=0.1)
    one = oracle("mc:4")[0]
    steps = one[1:10] - one[:9]
    torch.testing.assert_close(steps, torch.full((9,), float(steps[0])))  # a line's tokens share its advantage


@pytest.mark.parametrize("spec, problem", [("mc:0", "whole number of continuations"), ("late:x", "whole number"),
                                           ("exact+noise:-1", "SIGMA > 0"), ("oracle", "is not one of")])
def test_a_malformed_oracle_is_named(spec, problem):
    with pytest.raises(ValueError, match=problem):
        parse_oracle(spec)


@pytest.mark.parametrize("changes, problem", [
    (dict(dataset="data.jsonl"), "built-in task's exact values"),
    (dict(vapo.ALGORITHMS["grpo"], algo="grpo"), "is a critic, and the group's advantage needs none"),
    (dict(dynamic_sampling=True), "dynamic sampling's batches"),
    (dict(train_steps="3-12"), "LO-HI with 1 <= LO <= HI <= 10"),
])
def test_each_refusal_says_why(changes, problem):
    with pytest.raises(ValueError, match=problem):
        Config(**{"critic_oracle": "exact", **changes}).validate()


def test_an_oracle_in_a_sharded_run_or_beside_another_critic_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    from machinery.run import Hooks, Setup
    cfg = Config(critic_oracle="exact")
    setup = Setup(cfg, None, None, None, [], None)
    with pytest.raises(SystemExit, match="a constructed critic already"):
        Hooks(critic=lambda critic, setup: critic).with_builtin(setup)
    monkeypatch.setattr(world, "world_size", lambda: 2)
    with pytest.raises(SystemExit, match="one process only"):
        Hooks().with_builtin(setup)


TINY = dict(steps=2, prompts_per_step=4, samples_per_prompt=4, mini_batch_size=16, micro_batch_size=8,
            max_new_tokens=64, value_pretrain_steps=1, eval_every=0, eval_prompts=8, eval_samples=2, save_every=0,
            token_views=False, value_pretrain_ev=None, eval_batch_size=None)


def rl_records(folder) -> list[dict]:
    with open(os.path.join(folder, "metrics.jsonl")) as fh:
        return [r for r in map(json.loads, fh) if "train_acc" in r and "step" in r]


@pytest.mark.parametrize("spec", ["exact", "mc:4"])
def test_an_oracle_run_builds_no_critic_and_logs_its_credit(tmp_path, spec):
    """The shipped demo model with --critic-oracle: no critic network is built, value-pretrained or saved; the exact
    oracle explains all of V*'s variance (it is V* of the judge's own window); every step logs the meter."""
    cfg = Config(**TINY, critic_oracle=spec, output_dir=str(tmp_path / "run")).validate()
    folder = vapo.train(cfg)
    records = rl_records(folder)
    assert len(records) == 2 and not os.path.exists(os.path.join(folder, "critic_pretrained"))
    assert not os.path.exists(os.path.join(folder, "checkpoint", "critic"))
    assert all(-1 <= r["credit/corr"] <= 1 and r["credit/step_kl"] > 0 for r in records)
    if spec == "exact":
        assert all(r["ev_critic_exact"] == pytest.approx(1.0, abs=1e-6) for r in records)
        assert all(r["ev_critic_within"] == pytest.approx(1.0, abs=1e-6) for r in records)  # inside responses too


def test_a_run_without_a_critic_logs_the_meter_and_trains_on_the_steps_asked(tmp_path):
    """GRPO on the built-in task logs the credit meter too (from its second step: V* needs a batch first); with
    --train-steps 6-10 every training prompt has 6 to 10 steps."""
    seen = []
    from machinery.run import Hooks
    observer = SimpleNamespace(observe=lambda batch: seen.extend(p["n_steps"] for p in batch.problems) or {},
                               state_dict=dict, load_state_dict=lambda state: None)
    cfg = Config(**{**TINY, **vapo.ALGORITHMS["grpo"]}, algo="grpo", train_steps="6-10",
                 output_dir=str(tmp_path / "run")).validate()
    records = rl_records(vapo.train(cfg, hooks=Hooks(observers=lambda setup, critic: [observer])))
    assert "credit/corr" not in records[0] and "credit/corr" in records[1] and "ev_exact" not in records[1]
    share = records[1]["credit/fail_share"]  # the group's advantage has nothing for all-fail groups: 0 (NaN if no
    assert share == 0.0 or (share != share and records[1]["groups_all_same"] == 1.0)  # group has any advantage)
    assert seen and min(seen) >= 6 and max(seen) <= 10
