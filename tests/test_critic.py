"""The critic on its own terms (its mini-batches, epochs, gate) and the task's exact values it is measured against."""
import logging
import math

import pytest
import torch

from machinery import exact_values
from machinery import task
import vapo
from test_vapo import read_metrics, tiny_config

# a two-step problem whose first step is a borrow (12 - 5 crosses ten): the habit writes 17 there
PROBLEM = {"prompt": "Compute: 12 a-5 b+3\n", "answer": "10", "n_steps": 2}
RIGHT = "12 a-5=07\n07 b+3=10\nAnswer: 10"
HABIT = "12 a-5=17\n17 b+3=20\nAnswer: 20"


def observed() -> exact_values.ExactValues:
    """30 right chains, 10 with the habit (they leave the chain at character 7), 10 right and 10 wrong guesses."""
    exact = exact_values.ExactValues()
    texts = [RIGHT] * 30 + [HABIT] * 10 + ["Answer: 10"] * 10 + ["Answer: 3"] * 10
    rewards = [1.0] * 30 + [-1.0] * 10 + [1.0] * 10 + [-1.0] * 10
    exact.observe(texts, [PROBLEM] * len(texts), torch.tensor(rewards))
    return exact


def test_the_chain_is_the_solver_and_its_keys_name_each_line():
    chain, keys = exact_values.ExactValues._chain(PROBLEM)
    assert chain == RIGHT == task.solve(PROBLEM)
    assert keys[:10] == [("borrow", 0, i) for i in range(10)] and keys[10:20] == [("other", 0, i) for i in range(10)]
    assert keys[20:] == [("answer", i) for i in range(len("Answer: 10"))]


def test_exact_values_hand_worked():
    """P(guess) = 1/3, P(right | guess) = 1/2, the borrow's tens digit right 30 times in 40, every other character
    always: V* = 2 P(right) - 1 before the first character (1/3 x 1/2 + 2/3 x 3/4 = 2/3 -> 1/3), 0.5 on the chain
    up to the borrow's digit, 1 once it is written right, -1 once it is written wrong; a guess is worth 0 until
    it leaves the gold answer (-1) or completes it (1)."""
    exact = observed()
    assert exact.rate(("borrow", 0, 7)) == pytest.approx(0.75)
    assert exact.rate(("borrow", 0, 8)) == 1.0 and exact.rate(("eos",)) == 1.0
    right = exact.char_values(RIGHT, PROBLEM)
    assert len(right) == len(RIGHT) + 1
    assert right[0] == pytest.approx(1 / 3)
    assert right[1:8] == pytest.approx([0.5] * 7)
    assert right[8:] == pytest.approx([1.0] * (len(RIGHT) - 7))
    habit = exact.char_values(HABIT, PROBLEM)
    assert habit[1:8] == pytest.approx([0.5] * 7) and habit[8:] == [-1.0] * (len(HABIT) - 7)
    assert exact.char_values("Answer: 10", PROBLEM)[1:] == pytest.approx([0.0] * 9 + [1.0])
    assert exact.char_values("Answer: 3", PROBLEM)[1:] == pytest.approx([0.0] * 8 + [-1.0])
    s = exact.summary()
    assert s["guess"] == pytest.approx(1 / 3) and s["borrow_line"] == pytest.approx(0.75) and s["other_line"] == 1.0


def test_exact_values_and_the_floor_on_a_rollout_by_token(tokenizer):
    """values() maps each token to the state before it (the EOS token: the state after the whole text);
    floor_values() is the mean reward of the prompt's step count: (30 + 10 - 10 - 10) / 60 = 1/3 on every token."""
    exact = observed()
    texts = [RIGHT, HABIT]
    ids = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    T = max(map(len, ids))

    class Batch:
        B = 2
        lengths = torch.tensor([len(i) for i in ids])
        response_ids = torch.tensor([i + [tokenizer.pad_token_id] * (T - len(i)) for i in ids])
        response_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    star = exact.values(Batch, [PROBLEM] * 2, tokenizer)
    for b, text in enumerate(texts):
        chars = exact.char_values(text, PROBLEM)
        assert star[b, :len(text) + 1].tolist() == pytest.approx(chars)
        assert (star[b, len(text) + 1:] == 0).all()
    floor = exact.floor_values(Batch, [PROBLEM] * 2)
    assert floor[0, :len(ids[0])].tolist() == pytest.approx([1 / 3] * len(ids[0]))
    assert (floor * (1 - Batch.response_mask) == 0).all()


def test_exact_values_explain_the_return_better_than_the_floor():
    """On responses of two step counts whose success hangs on one borrow each, V* (which sees the borrow's digit)
    explains more of the return's variance than the step-count floor (which sees only the prompt)."""
    from losses import explained_variance
    exact = observed()
    texts = [RIGHT] * 3 + [HABIT]
    chars = [exact.char_values(t, PROBLEM) for t in texts]
    T = max(map(len, chars))
    mask = torch.tensor([[1] * len(c) + [0] * (T - len(c)) for c in chars])
    star = torch.tensor([c + [0.0] * (T - len(c)) for c in chars])
    returns = torch.tensor([1.0, 1.0, 1.0, -1.0])[:, None] * mask
    floor = torch.full_like(star, 1 / 3) * mask
    assert explained_variance(star, returns, mask) > explained_variance(floor, returns, mask) + 0.3


def count_steps(monkeypatch) -> list[tuple]:
    """Records which models each optimizer step (vapo.step_or_skip) stepped."""
    calls = []
    real = vapo.step_or_skip

    def spy(models, optimizers, cfg, stats, bad):
        calls.append(tuple(sorted(models)))
        return real(models, optimizers, cfg, stats, bad)
    monkeypatch.setattr(vapo, "step_or_skip", spy)
    return calls


def test_the_critic_steps_beside_the_policy_by_default(tiny_model_dir, tmp_path, monkeypatch):
    calls = count_steps(monkeypatch)
    vapo.train(tiny_config(tiny_model_dir, tmp_path / "run", steps=1, value_pretrain_steps=1))
    # value pretraining: 8 samples in mini-batches of 4; the RL step: the same, both models on each
    assert calls == [("critic",)] * 2 + [("critic", "policy")] * 2


def test_the_critic_on_its_own_mini_batches_and_epochs(tiny_model_dir, tmp_path, monkeypatch):
    """--critic-mini-batch-size 2 --critic-epochs 3: 3 x 8 / 2 = 12 critic steps after the policy's 2, in value
    pretraining and in each RL step; the share of clipped critic steps and the NLL's weight are logged."""
    calls = count_steps(monkeypatch)
    run_dir = vapo.train(tiny_config(tiny_model_dir, tmp_path / "run", steps=1, value_pretrain_steps=1,
                                     critic_mini_batch_size=2, critic_epochs=3))
    assert calls == [("critic",)] * 12 + [("policy",)] * 2 + [("critic",)] * 12
    step = [r for r in read_metrics(run_dir) if r.get("step") == 1 and "train_acc" in r][0]
    assert 0 <= step["grad_clipped/critic"] <= 1 and 0 <= step["grad_clipped/policy"] <= 1
    assert "value_loss" in step and "policy_loss" in step


def test_the_nll_weight_is_mu_times_tokens_over_positive_tokens(tiny_policy, tokenizer):
    """The positive NLL's weight beside one token of a token-level policy loss: mu x N_tokens / N_positive_tokens
    of the mini-batch (a real update of the tiny policy on one mini-batch of its own samples, the odd rows correct)."""
    from machinery.engines import HFEngine
    cfg = vapo.Config(prompts_per_step=2, samples_per_prompt=2, mini_batch_size=4, micro_batch_size=2, mu=2.0,
                      max_new_tokens=12)
    torch.manual_seed(0)
    rollout = HFEngine(tiny_policy, tokenizer, max_new_tokens=12).generate(["Compute: 3 a+4\n", "Compute: 5 a-2\n"],
                                                                           n=2)
    positive = torch.tensor([False, True, False, True])
    zeros = torch.zeros(rollout.response_mask.shape)
    batch = {"old_logprobs": rollout.sampler_logprobs, "advantages": zeros, "positive": positive}
    out = vapo.update(tiny_policy, None, {"policy": vapo.make_optimizer(tiny_policy, 1e-3, cfg)}, rollout, batch, cfg)
    mask = rollout.response_mask
    assert out["nll_weight"] == pytest.approx(2.0 * float(mask.sum()) / float(mask[positive].sum()))


def test_value_pretraining_says_when_its_cap_came_before_its_gate(tiny_model_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="vapo"):
        run_dir = vapo.train(tiny_config(tiny_model_dir, tmp_path / "capped", steps=0, value_pretrain_steps=2,
                                         value_pretrain_ev=0.99))
    pretrain = [r for r in read_metrics(run_dir) if "value_pretrain_step" in r]
    assert [r["value_pretrain_step"] for r in pretrain] == [1, 2]
    assert "value_pretrain_reached" not in pretrain[0]
    assert pretrain[-1]["value_pretrain_reached"] is False
    assert pretrain[-1]["value_pretrain_ev_last3"] == pytest.approx(  # NaN when every return was the same
        sum(r["explained_variance"] for r in pretrain) / 2, nan_ok=True)
    assert "below its gate of 0.99" in caplog.text


def test_value_pretraining_reports_the_critics_bias_where_explained_variance_is_undefined(tiny_model_dir, tmp_path,
                                                                                           caplog):
    """Every return -1 (a random model answers nothing right): EV is NaN, the gate cannot judge and says so, and
    the record's value_error (mean V - R on the step's fresh rollouts, before training on them) is the bias: the
    zero head's V = 0 against R = -1 gives +1 at the first step; the RL step logs it too."""
    with caplog.at_level(logging.WARNING, logger="vapo"):
        run_dir = vapo.train(tiny_config(tiny_model_dir, tmp_path / "run", steps=1, value_pretrain_steps=2,
                                         value_pretrain_ev=0.5))
    records = read_metrics(run_dir)
    pretrain = [r for r in records if "value_pretrain_step" in r]
    assert [r["train_acc"] for r in pretrain] == [0.0, 0.0]  # the premise: nothing right, every return -1
    assert all(math.isnan(r["explained_variance"]) for r in pretrain)
    assert pretrain[0]["value_error"] == pytest.approx(1.0)
    assert pretrain[1]["value_error"] != pytest.approx(1.0)  # the critic moved after its first step
    assert "explained variance is undefined" in caplog.text
    assert f"{pretrain[-1]['value_error']:+.3f}" in caplog.text
    step = [r for r in records if r.get("step") == 1 and "train_acc" in r][0]
    assert -2 <= step["value_error"] <= 2


def test_value_pretraining_stops_at_its_gate_and_says_so(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(vapo, "explained_variance", lambda *a, **k: 0.5)  # a random model's returns are all alike
    run_dir = vapo.train(tiny_config(tiny_model_dir, tmp_path / "gated", steps=0, value_pretrain_steps=6,
                                     value_pretrain_ev=0.4))  # reached once three steps are in: after the third
    pretrain = [r for r in read_metrics(run_dir) if "value_pretrain_step" in r]
    assert len(pretrain) == 3 and pretrain[-1]["value_pretrain_reached"] is True


@pytest.mark.parametrize("overrides, option", [
    (dict(prompts_per_step=4, samples_per_prompt=2, mini_batch_size=4, micro_batch_size=2,
          critic_mini_batch_size=3), "--critic-mini-batch-size"),
    (dict(prompts_per_step=4, samples_per_prompt=2, mini_batch_size=4, micro_batch_size=4,
          critic_mini_batch_size=2), "--micro-batch-size"),
    (dict(critic_epochs=0), "--critic-epochs"),
])
def test_the_critics_options_are_checked(overrides, option):
    with pytest.raises(ValueError, match=option):
        vapo.Config(**overrides).validate()


def test_the_judge_measures_the_critic_on_what_it_saw_before(tiny_model_dir, tmp_path):
    """On the built-in task the RL records carry the floor's, V*'s and the critic's fit to V*, each fitted on the
    batches before (value pretraining's rollouts count; without it the first step has nothing seen yet), and the
    teaching views draw V* beside V(s_t) once it is known; GRPO has no critic to judge."""
    keys = {"ev_floor", "ev_exact", "ev_critic_exact", "ev_critic_within"}
    run_dir = vapo.train(tiny_config(tiny_model_dir, tmp_path / "run", steps=1, value_pretrain_steps=1))
    steps = [r for r in read_metrics(run_dir) if "train_acc" in r and "step" in r]
    assert keys <= set(steps[0])
    from machinery.plots import read_tokens
    views = read_tokens(run_dir)
    assert [any("value_exact" in p for p in r["probes"]) for r in views] == [False, True, True]  # step 0: none yet
    run_dir = vapo.train(tiny_config(tiny_model_dir, tmp_path / "cold", steps=2, value_pretraining=False))
    steps = [r for r in read_metrics(run_dir) if "train_acc" in r and "step" in r]
    assert not keys & set(steps[0]) and keys <= set(steps[1])
    run_dir = vapo.train(tiny_config(tiny_model_dir, tmp_path / "g", steps=1, algo="grpo", **vapo.ALGORITHMS["grpo"]))
    assert not keys & {k for r in read_metrics(run_dir) for k in r}  # no critic, nothing judged


def test_exact_values_put_the_td_error_on_the_habits_first_wrong_token(tokenizer):
    """V*'s TD error (GAE at lambda 0) on the habit response sits on its first wrong token (task.first_error: its
    whole drop from 0.5 to -1 happens there), far above an even spread; the step-count floor is the same on every
    token, so its TD error is 0 there (all of it at the end); and V* explains more of the return than the floor."""
    from types import SimpleNamespace
    from gae import gae, terminal_rewards
    from losses import explained_variance
    exact = observed()
    texts = [RIGHT, HABIT, RIGHT, HABIT]
    ids = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    T = max(map(len, ids))
    lengths = torch.tensor([len(i) for i in ids])
    rollout = SimpleNamespace(B=4, texts=texts, lengths=lengths,
                              response_ids=torch.tensor([i + [tokenizer.pad_token_id] * (T - len(i)) for i in ids]),
                              response_mask=(torch.arange(T)[None, :] < lengths[:, None]).long())
    mask = rollout.response_mask
    at = torch.zeros_like(mask, dtype=torch.bool)
    for b, text in enumerate(texts):
        char = task.first_error(text, PROBLEM)
        if char is not None:  # the token whose text covers that character
            ends = torch.tensor([len(tokenizer.decode([i])) for i in ids[b]]).cumsum(0)
            at[b, int((ends <= char).sum())] = True
    assert at.sum() == 2  # one mark on each habit response, none on the right ones
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0])
    terminal = terminal_rewards(rewards, mask)
    returns = rewards[:, None] * mask

    def credit(values):  # (share of sum |TD error| on the marked tokens) / (their share of the tokens)
        td = gae(terminal, values, mask, lam=0.0)[0].abs() * mask
        return float((td[at].sum() / td.sum().clamp(min=1e-12)) / (at.sum() / mask.sum()))
    star = exact.values(rollout, [PROBLEM] * 4, tokenizer)
    floor = exact.floor_values(rollout, [PROBLEM] * 4)
    assert credit(star) > 10 and credit(floor) == 0
    assert explained_variance(star, returns, mask) > explained_variance(floor, returns, mask)


def test_the_group_baseline_is_the_bar_a_critic_must_clear():
    """ev_group_baseline: the explained variance of the return by the mean reward of the other samples of each one's
    group (GRPO's baseline without the sample itself), beside the critic's own."""
    from types import SimpleNamespace
    from losses import explained_variance
    mask = torch.ones(4, 3, dtype=torch.long)
    rewards = torch.tensor([1.0, -1.0, 1.0, 1.0])
    returns = rewards[:, None] * mask
    rollout = SimpleNamespace(response_mask=mask, lengths=mask.sum(-1), truncated=torch.zeros(4, dtype=torch.bool))
    scored = {"values": torch.zeros(4, 3), "old_logprobs": torch.zeros(4, 3)}
    cfg = vapo.Config(prompts_per_step=2, samples_per_prompt=2)
    record = vapo.step_record(0, rollout, rewards, rewards, scored, torch.zeros(4, 3), returns, torch.zeros(4), cfg, {})
    others = torch.tensor([-1.0, 1.0, 1.0, 1.0])[:, None] * mask  # each sample's group partner's reward
    assert record["ev_group_baseline"] == pytest.approx(explained_variance(others, returns, mask))
    assert record["ev_group_baseline"] < 0  # here the partner predicts the return worse than its mean: below 0

