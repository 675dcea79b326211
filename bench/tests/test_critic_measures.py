"""bench/common.py's measures of a critic (bench/ablation.py judges each run's final critic with them): its bias by
position against the Monte-Carlo return, and its credit at the decisive tokens, on hand-made rows."""
import os
import sys

import pytest
import torch

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_critic_bias_compares_mean_values_with_the_monte_carlo_return_by_position():
    """common.bias_table (bench/ablation.py judges each run's final critic with it) on hand-made rows: a critic
    equal to each row's reward has no bias anywhere; a constant critic c is off by c minus the mean reward of the
    responses that reach each position."""
    sys.path.insert(0, BENCH)
    import common  # bench/ablation.py's measures of a critic
    mask = torch.zeros(3, 20, dtype=torch.long)
    mask[0, :20], mask[1, :10], mask[2, :5] = 1, 1, 1
    rewards = torch.tensor([1.0, -1.0, -1.0])
    exact = common.bias_table(rewards[:, None] * mask, rewards, mask, alpha=0.5)
    assert all(abs(c["bias"]) < 1e-6 for c in exact["by_fifth"] + exact["by_position"])
    assert exact["explained_variance"] > 0.999
    const = common.bias_table(torch.full((3, 20), 0.5) * mask, rewards, mask, alpha=0.5)
    first = const["by_position"][0]  # positions 0-9: rows 0 (+1, 10 tokens), 1 (-1, 10), 2 (-1, 5)
    assert first["tokens"] == 25 and abs(first["mean_return"] - (10 - 10 - 5) / 25) < 1e-6
    assert abs(first["bias"] - (0.5 - first["mean_return"])) < 1e-6
    assert [c["tokens"] for c in const["by_fifth"]] == [1 + 2 + 4, 1 + 2 + 4, 1 + 2 + 4, 1 + 2 + 4, 1 + 2 + 4]


def test_credit_at_the_decisive_tokens():
    """Credit assignment as bench/ablation.py measures it (common.bias_table): a critic whose value changes only at
    the decisive token puts every TD error there (credit = 1 / the decisive tokens' share, its maximum); GRPO's group advantage,
    the same on every token of a response, is spread evenly (credit 1 when the responses are of equal length)."""
    sys.path.insert(0, BENCH)
    import common  # bench/ablation.py's measures of a critic
    mask = torch.ones(4, 10, dtype=torch.long)
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0])
    decisive = torch.zeros(4, 10, dtype=torch.bool)
    decisive[:, 3] = True  # the outcome is decided at token 3: V is 0 before it and the reward from it on
    values = torch.zeros(4, 10)
    values[:, 4:] = rewards[:, None]
    table = common.bias_table(values, rewards, mask, alpha=0.5, decisive=decisive)
    assert table["credit_lambda_0 (TD error)"] == pytest.approx(10.0)  # all of |delta| on 1 token in 10
    assert 1.0 < table["credit_lambda_0.95"] < 10.0  # lambda > 0 spreads it back over the earlier tokens
    assert common.group_credit(rewards, mask, decisive, group_size=2) == pytest.approx(1.0)
    # the same responses judged at their first error (the wrong ones, 1 and 3, go wrong at token 3): the critic
    # leaves the steps before it at zero advantage and puts the TD error there; lambda 0.95 spreads it back
    before, at = torch.zeros_like(decisive), torch.zeros_like(decisive)
    before[[1, 3], :3], at[[1, 3], 3] = True, True
    table = common.bias_table(values, rewards, mask, alpha=0.5, decisive=decisive, errors=(before, at))
    assert table["advantage_before_error_lambda_0 (TD error)"] == 0.0
    assert table["advantage_before_error_lambda_0.95"] < 0  # blame leaks onto the correct steps before the error
    assert table["credit_at_error_lambda_0 (TD error)"] == pytest.approx(10.0)
    # by the kind of the first error: a critic that sees the habit (response 3: V drops at its error) and not the
    # misread (response 1: V stays 0 to the end, the whole TD error on the last token) credits them differently
    values[1, 4:] = 0.0
    table = common.bias_table(values, rewards, mask, alpha=0.5, decisive=decisive, errors=(before, at),
                            kinds=[None, "misread", None, "habit"])
    assert table["credit_at_habit_lambda_0 (TD error)"] == pytest.approx(10.0)  # 1 of 4 |delta|s, 1 token in 40
    assert table["credit_at_misread_lambda_0 (TD error)"] == 0.0
    assert "credit_at_habit_lambda_0.95" in table and "credit_at_misread_lambda_adaptive" in table
