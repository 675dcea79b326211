"""The long-chain regime (`--preset long`): the task's long version, its demonstrations with the shortcut, the
outcome reward model's build, the shipped long models, and the preset's run. CPU; the builds are tiny here."""
import json
import os
import random
import statistics

import pytest
import torch

from machinery import builds
import config
from machinery import data
from machinery import task
import vapo



def test_long_chains_span_tens_to_four_hundred_tokens_with_many_borrow_decisions(tokenizer):
    problems = task.make_dataset(2000, 0, task.LONG.min_steps, task.LONG.max_steps)
    assert {p["n_steps"] for p in problems} == set(range(1, 41))
    lengths = [len(tokenizer(task.solve(p))["input_ids"]) + 1 for p in problems]  # + EOS
    assert min(lengths) == 20 and max(lengths) == 411 < task.LONG.max_response_tokens
    assert 180 < statistics.mean(lengths) < 240
    forty = [p for p in problems if p["n_steps"] == 40]
    borrows = [sum(task.is_borrow_step(a, op, b) for a, op, b in steps_of(p)) for p in forty]
    assert statistics.mean(borrows) > 6  # many decisive steps in a long response
    # the labels go on past j: a-z then A-N, and the prompt gives each one its term
    p = forty[0]
    assert p["prompt"].split()[-1].startswith("N") and task.solve(p).split("\n")[39].split()[1].startswith("N")
    # the demo's problems are unchanged by the longer label set
    assert task.make_dataset(50, 0) == task.make_dataset(50, 0, task.MIN_STEPS, task.MAX_STEPS)


def steps_of(problem):
    """(total before, op, term) of each step of the correct chain."""
    value, terms = task.parse_expr(problem)
    out = []
    for op, b in terms:
        out.append((value, op, b))
        value = task._apply(value, op, b)
    return out


def test_long_demonstrations_have_the_habit_the_slips_and_the_shortcut_at_their_rates():
    chains = task.LONG
    rng = random.Random(0)
    problems = task.make_dataset(4000, 0, chains.min_steps, chains.max_steps)
    demos = [task.make_demonstration(p, rng, chains.habit_prob, chains.error_prob, chains.shortcut_prob)
             for p in problems]
    shortcut = [d for d in demos if d["shortcut"]]
    assert abs(len(shortcut) / len(demos) - chains.shortcut_prob) < 0.015
    assert all(d["response"] == f"Answer: {p['answer']}" and d["correct"]
               for d, p in zip(demos, problems) if d["shortcut"])
    chained = [(d, p) for d, p in zip(demos, problems) if not d["shortcut"]]
    borrow = sum(d["borrow_steps"] for d, _ in chained)
    assert abs(sum(d["habit_steps"] for d, _ in chained) / borrow - chains.habit_prob) < 0.02
    assert abs(sum(d["slips"] for d, _ in chained) / sum(p["n_steps"] for _, p in chained) - chains.error_prob) < 0.004
    # an imitator that samples as the demonstrations do is right often on short chains and rarely on the longest
    right = {n: statistics.mean(d["correct"] for d, p in chained if p["n_steps"] == n) for n in (1, 2, 39, 40)}
    assert right[1] > 0.8 and right[39] < 0.12 and right[40] < 0.12, right
    # the demo's demonstrations draw nothing for the shortcut: its recipe (and its shipped model) is unchanged
    a, b = random.Random(5), random.Random(5)
    assert [task.make_demonstration(p, a) for p in problems[:50]] == \
        [task.make_demonstration(p, b, shortcut_prob=0.0) for p in problems[:50]]


def test_step_errors_read_the_long_labels_and_the_shortcut_is_counted(tokenizer, tiny_policy):
    p = task.make_dataset(1, 0, 40, 40)[0]
    counts = task.step_errors(task.solve(p), p)
    assert counts["lookup_wrong"] == counts["habit"] == counts["other_wrong"] == 0
    assert counts["borrow"] + counts["other"] == 40
    assert task.step_errors("Answer: 7", p)["borrow"] == 0
    assert task.band_of(1) == "1-10" and task.band_of(10) == "1-10" and task.band_of(31) == "31-40"
    assert task.by_band({1: 1.0, 2: 0.0, 6: 0.5}, 5) == {"1-5": 0.5, "6-10": 0.5}


def test_the_reward_model_is_trained_on_the_score_at_eos_only(tokenizer, tiny_policy):
    """reward_model_batch reads each row at its EOS token; train_reward_model's loss there falls, and the
    gradient of a batch comes from those positions only (a change after EOS, in the padding, changes nothing)."""
    from machinery.models import value_model_from_policy
    rng = random.Random(0)
    problems = task.make_dataset(32, 0, 1, 3)
    pairs = [(p, task.solve(p) if i % 2 else task.make_demonstration(p, rng, 1.0, 0.0)["response"])
             for i, p in enumerate(problems)]
    labels = torch.tensor([1.0 if task.is_correct(t, p["answer"]) else -1.0 for p, t in pairs])
    ids, mask, eos = builds.reward_model_batch(tokenizer, pairs[:4])
    assert (ids[torch.arange(4), eos] == tokenizer.eos_token_id).all()
    assert (mask.sum(-1) == eos + 1).all()
    rm = value_model_from_policy(tiny_policy)
    torch.nn.init.normal_(rm.score.weight, std=0.1)
    before = builds.reward_model_scores(rm, tokenizer, pairs[:4])
    padded = ids.clone()
    padded[mask == 0] = 7  # what sits after EOS (masked, and causally after it) cannot move the score
    rm.eval()
    with torch.no_grad():
        again = rm(input_ids=padded, attention_mask=mask).logits[torch.arange(4), eos, 0]
    torch.testing.assert_close(again, before)
    losses = builds.train_reward_model(rm, tokenizer, pairs, labels, epochs=6, batch_size=8, lr=3e-3, progress=False)
    assert len(losses) == 6 * 4 and statistics.mean(losses[-4:]) < statistics.mean(losses[:4])


def test_build_reward_model_writes_a_loadable_value_model(tmp_path):
    """`python -m machinery.builds reward-model` at tiny size: sampled, labelled, trained, saved with its build record; the
    critic's loader keeps its head (a reward model, not a policy with a zero head)."""
    from machinery.models import load_value_model
    base = tmp_path / "base"
    builds.build_base_model(str(base), steps=2, eval_per_step=0, progress=False, chains=task.LONG)
    assert json.load(open(base / builds.BUILD_INFO))["recipe"]["init"] == "builtin"
    out = tmp_path / "rm"
    builds.main(["reward-model", "--out", str(out), "--base", str(base), "--prompts", "8", "--samples", "2",
               "--epochs", "1", "--eval-prompts", "8"])
    info = json.load(open(out / builds.BUILD_INFO))
    assert info["train_samples"] == 16 and info["eval"]["samples"] == 8
    assert info["sha256"] == builds.weights_sha256(str(out))
    assert info["base_sha256"] == builds.weights_sha256(str(base))
    critic = load_value_model(str(out))
    assert critic.score.weight.abs().sum() > 0


@pytest.mark.skipif(not os.path.exists(os.path.join(builds.SHIPPED_LONG_BASE, builds.BUILD_INFO)),
                    reason="base-model-long/ is not shipped in this checkout")
def test_the_shipped_long_models_are_the_recorded_ones():
    """base-model-long/ and reward-model-long/ are the files their builds recorded (checksums), the reward model
    was built from this base model, and the base model's recorded accuracy is what the regime promises: right
    on short chains, a few percent on the longest when sampling."""
    base = json.load(open(os.path.join(builds.SHIPPED_LONG_BASE, builds.BUILD_INFO)))
    assert builds.weights_sha256(builds.SHIPPED_LONG_BASE) == builds.LONG_BASE_SHA256 == base["sha256"]
    rm = json.load(open(os.path.join(builds.SHIPPED_LONG_RM, builds.BUILD_INFO)))
    assert builds.weights_sha256(builds.SHIPPED_LONG_RM) == builds.LONG_RM_SHA256 == rm["sha256"]
    assert rm["base_sha256"] == base["sha256"]
    sampled = task.by_band(base["eval"]["sampled"]["by_steps"], 5)
    assert sampled["1-5"] > 0.6 and sampled["36-40"] < 0.15, sampled


def test_the_long_preset_is_the_regime(monkeypatch):
    cfg, _, _ = config.config_from_args(vapo.Config, vapo.ALGORITHMS, ["--preset", "long"])
    assert (cfg.model, cfg.value_model, cfg.dataset) == ("builtin-long", "builtin-long-rm", "builtin-long")
    assert cfg.max_new_tokens >= 411 + 1 and cfg.max_new_tokens - cfg.overlong_cache > 411  # no penalty on 40 steps
    bare, _, _ = config.config_from_args(vapo.Config, vapo.ALGORITHMS, ["--model", "builtin-long"])
    assert bare.dataset == "builtin-long" and bare.steps == cfg.steps  # the long model picks the long budget
    rows, held_out = data.load_data(cfg, None)
    assert max(r["n_steps"] for r in rows) == 40 and {r["band"] for r in held_out} == {"1-10", "11-20", "21-30",
                                                                                         "31-40"}
    assert not {r["prompt"] for r in rows[:2000]} & {r["prompt"] for r in held_out}
    ppo, _, _ = config.config_from_args(vapo.Config, vapo.ALGORITHMS, ["--preset", "long", "--algo", "ppo"])
    assert ppo.value_model == "builtin-long-rm" and not ppo.value_pretraining  # PPO: the RM's critic, untrained


def test_a_missing_long_model_names_its_build_command(monkeypatch, tmp_path):
    from machinery import models
    monkeypatch.setitem(models.BUILTIN_MODELS, "builtin-long-rm", (str(tmp_path / "absent"),
                                                                   models.BUILTIN_MODELS["builtin-long-rm"][1]))
    with pytest.raises(SystemExit, match="python -m machinery.builds reward-model"):
        models.shipped_model("builtin-long-rm")


def test_borrow_digits_are_the_tens_digits_of_borrow_steps():
    text = "12 a-5=07\n07 b+3=10\n10 c-1=19\n19 d+1=20\nAnswer: 20"  # c-1 is a borrow step, habit-written
    assert [text[i - 1:i + 2] for i in task.borrow_digits(text)] == ["=07", "=19"]
    assert task.borrow_digits("Answer: 7") == [] and task.borrow_digits("12 a-5=07\ngarbage\n12 b-5=07") == [7]


@pytest.mark.slow
def test_the_long_preset_runs_two_steps_from_the_shipped_models(tmp_path):
    """`python vapo.py --preset long` at two steps (one of value pretraining, a small evaluation): the shipped
    long base model and reward model load, the critic starts from the reward model (not zero: V varies along a
    response at step 0), evaluation reports accuracy by band, and the views are written with their
    value-by-position record before and after value pretraining."""
    from machinery import plots
    cfg, _, _ = config.config_from_args(vapo.Config, vapo.ALGORITHMS, [
        "--preset", "long", "--steps", "2", "--value-pretrain-steps", "1", "--eval-prompts", "8",
        "--eval-every", "2", "--output-dir", str(tmp_path / "run")])
    vapo.train(cfg)
    records = plots.read_jsonl(os.path.join(cfg.output_dir, "metrics.jsonl"))
    evals = [r for r in records if "eval/acc_greedy" in r]
    assert [r["step"] for r in evals] == [0, 2]
    assert any(k.startswith("eval/acc_avg@2_steps_") for k in evals[0]) and "eval/acc_greedy_se" in evals[0]
    assert [r["step"] for r in records if "reward_mean" in r] == [1, 2]
    assert max(r["response_len"] for r in records if "response_len" in r) > 100  # long responses in the batch
    views = plots.read_tokens(cfg.output_dir)
    assert [(r["step"], r["stage"]) for r in views][:2] == [(0, "step 0"), (0, "after value pretraining")]
    start = [v for p in views[0]["probes"] if "value" in p for v in p["value"]]
    assert max(start) - min(start) > 0.05  # the reward model's values, not a zero head's
    assert os.path.exists(os.path.join(cfg.output_dir, "views", "step-2", "value-by-position.png"))


def test_a_build_resumed_after_a_stage_gives_the_uninterrupted_builds_weights(tmp_path, monkeypatch):
    """How base-model-long/ was built: stage 1, then the rest from stage 1's saved weights. The weights are those
    of one uninterrupted build (each stage has a fresh optimizer and its own seed), checked at tiny size."""
    monkeypatch.setitem(builds.RECIPES, "long", {**builds.RECIPES["long"], "stages": ((3, 1e-3), (2, 1e-3))})
    whole = builds.build_base_model(str(tmp_path / "whole"), eval_per_step=0, progress=False, chains=task.LONG)
    monkeypatch.setitem(builds.RECIPES, "long", {**builds.RECIPES["long"], "stages": ((3, 1e-3),)})
    builds.build_base_model(str(tmp_path / "first"), eval_per_step=0, progress=False, chains=task.LONG)
    monkeypatch.setitem(builds.RECIPES, "long", {**builds.RECIPES["long"], "stages": ((3, 1e-3), (2, 1e-3))})
    resumed = builds.build_base_model(str(tmp_path / "resumed"), eval_per_step=0, progress=False, chains=task.LONG,
                                    resume=(str(tmp_path / "first"), 1))
    assert resumed["sha256"] == whole["sha256"] and resumed["recipe"]["resumed_after_stages"] == 1
    assert whole["sha256"] != json.load(open(tmp_path / "first" / builds.BUILD_INFO))["sha256"]
