"""The built-in task: generator, solver, demonstrations with the habit, tokenizer/model round trips; and the
base-model build (builds.py). CPU, seconds; the base model is only trained for a couple of steps here."""
import json
import os
import random
import statistics

import pytest
import torch

from machinery import builds
from machinery import task


def _value(expr_terms) -> int:
    """Plain left-to-right evaluation, written independently of task.py."""
    first, terms = expr_terms
    for op, b in terms:
        first = first + b if op == "+" else first - b
    return first


def test_dataset_is_deterministic_and_balanced():
    a, b = task.make_dataset(200, seed=0), task.make_dataset(200, seed=0)
    assert a == b
    assert a != task.make_dataset(200, seed=1)
    counts = {n: sum(p["n_steps"] == n for p in a) for n in range(task.MIN_STEPS, task.MAX_STEPS + 1)}
    assert set(counts.values()) == {200 // len(counts)}
    short = task.make_dataset(30, seed=0, min_steps=2, max_steps=4)
    assert {p["n_steps"] for p in short} == {2, 3, 4}


def test_problem_format_and_gold():
    rng = random.Random(0)
    for n in range(1, task.MAX_STEPS + 1):
        p = task.make_problem(rng, n)
        first, terms = task.parse_expr(p)
        labelled = " ".join(f"{tag}{op}{b}" for tag, (op, b) in zip(task.TAGS, terms))
        assert p["prompt"] == f"Compute: {first} {labelled}\n" and p["n_steps"] == n
        assert p["expr"] == str(first) + "".join(f"{op}{b}" for op, b in terms)
        assert len(terms) == n and all(1 <= b <= 9 for _, b in terms) and 0 <= first <= task.MAX_VALUE
        assert task.MAX_VALUE >= int(p["answer"]) == _value((first, terms)) >= 0


def test_solver_gives_gold_on_every_problem():
    for p in task.make_dataset(2000, seed=3) + task.make_dataset(500, seed=3, split="eval"):
        response = task.solve(p)
        lines = response.split("\n")
        assert len(lines) == p["n_steps"] + 1 and lines[-1] == f"Answer: {p['answer']}"
        first, terms = task.parse_expr(p)
        totals = [first]
        for op, b in terms:
            totals.append(_value((totals[-1], [(op, b)])))
        assert lines[:-1] == [f"{a:02d} {tag}{op}{b}={c:02d}"
                              for tag, (op, b), a, c in zip(task.TAGS, terms, totals, totals[1:])]
        assert task.is_correct(response, p["answer"])
        assert task.is_correct(response, p["answer"])


def test_project_verifier_agrees_with_generator():
    reward = pytest.importorskip("reward", reason="reward.py (the project's verifier) is not there yet")
    for p in task.make_dataset(1000, seed=4):
        assert reward.arith_reward(task.solve(p), p["answer"]) > 0
        wrong = task.solve(p).rsplit("Answer: ", 1)[0] + f"Answer: {int(p['answer']) + 1}"
        assert reward.arith_reward(wrong, p["answer"]) < reward.arith_reward(task.solve(p), p["answer"])
    assert reward.arith_reward("03 a-5=-2\nAnswer: -2", "-2") > 0  # slips may take a wrong chain below 0


def test_is_correct_reads_the_last_answer_line_as_the_reward_does():
    assert task.is_correct("Answer: 3\nAnswer: -12", "-12") and not task.is_correct("Answer: 3\nAnswer: -12", "3")
    assert not task.is_correct("12+3", "15")
    assert not task.is_correct("no answer", "5")
    assert task.is_correct("Answer: -7", "-7")


def test_held_out_prompts_never_overlap_training_prompts():
    train = {p["prompt"] for p in task.make_dataset(5000, seed=0)}
    held_out = {p["prompt"] for p in task.make_dataset(1000, seed=0, split="eval")}
    assert train.isdisjoint(held_out)
    assert all(task.split_of(p["expr"]) == "eval" for p in task.make_dataset(1000, seed=0, split="eval"))
    with pytest.raises(ValueError):
        task.make_dataset(1, seed=0, split="test")


def test_response_lengths_span_the_intended_range(tokenizer):
    problems = task.make_dataset(1000, seed=0)
    lengths = [len(tokenizer(task.solve(p))["input_ids"]) + 1 for p in problems]  # + EOS
    assert min(lengths) == 20 and max(lengths) == 111 and max(lengths) < task.MAX_RESPONSE_TOKENS
    assert 55 <= statistics.mean(lengths) <= 70
    by_steps = {n: statistics.mean(l for l, p in zip(lengths, problems) if p["n_steps"] == n) for n in (1, 5, 10)}
    assert by_steps[1] < by_steps[5] < by_steps[10]


def test_demonstrations_have_the_habit_at_the_intended_rate():
    rng = random.Random(0)
    problems = task.make_dataset(3000, seed=0)
    demos = [task.make_demonstration(p, rng) for p in problems]
    borrow = sum(d["borrow_steps"] for d in demos)
    steps = sum(p["n_steps"] for p in problems)
    assert 0.15 < borrow / steps < 0.3  # a borrow step is common, but most steps are not
    assert abs(sum(d["habit_steps"] for d in demos) / borrow - task.HABIT_PROB) < 0.03
    assert abs(sum(d["slips"] for d in demos) / steps - task.ERROR_PROB) < 0.01
    assert 0.2 < statistics.mean(d["correct"] for d in demos) < 0.5
    # a perfect imitator decoding greedily always takes the habit: right only on problems without a borrow
    always = [task.make_demonstration(p, rng, habit_prob=1.0, error_prob=0.0)["correct"] for p in problems]
    by_steps = {n: statistics.mean(c for c, p in zip(always, problems) if p["n_steps"] == n) for n in (1, 5, 10)}
    assert by_steps[1] > 0.7 and by_steps[1] > by_steps[5] > by_steps[10] and by_steps[10] < 0.1
    assert 0.15 < statistics.mean(always) < 0.4


def test_habit_is_a_consistent_rule_and_the_chain_follows_the_written_value():
    rng = random.Random(0)
    p = {"prompt": "Compute: 7 a+5 b-7 c+9 d-6\n", "answer": "8", "n_steps": 4}
    assert task.solve(p) == "07 a+5=12\n12 b-7=05\n05 c+9=14\n14 d-6=08\nAnswer: 8"
    assert task.make_demonstration(p, rng, habit_prob=0.0, error_prob=0.0)["response"] == task.solve(p)
    habit = task.make_demonstration(p, rng, habit_prob=1.0, error_prob=0.0)
    # 12-7 -> 15 (borrow forgotten); the chain goes on from 15: 15+9=24, and 24-6 -> 28 (forgotten again)
    assert habit["response"] == "07 a+5=12\n12 b-7=15\n15 c+9=24\n24 d-6=28\nAnswer: 28"
    assert habit["habit_steps"] == habit["borrow_steps"] == 2 and not habit["correct"]
    assert task.habit_value(12, "-", 7) == 15
    assert task.is_borrow_step(12, "-", 5) and task.is_borrow_step(31, "-", 4)
    assert not task.is_borrow_step(17, "-", 5) and not task.is_borrow_step(7, "-", 5)
    assert not task.is_borrow_step(17, "+", 5)


def test_step_errors_tell_the_habit_from_other_mistakes():
    p = {"prompt": "Compute: 7 a+5 b-7 c+9 d-6\n", "answer": "8", "n_steps": 4}
    assert task.step_errors(task.solve(p), p) == dict(borrow=2, habit=0, borrow_ok=2, other=2, other_wrong=0,
                                                      lookup_wrong=0)
    habit = "07 a+5=12\n12 b-7=15\n15 c+9=24\n24 d-6=28\nAnswer: 28"  # judged from each line's own total
    assert task.step_errors(habit, p) == dict(borrow=2, habit=2, borrow_ok=0, other=2, other_wrong=0,
                                              lookup_wrong=0)
    # a wrong sum (07+5=13), a misread term (c for b) on a correct step, then text that is no step: stops there
    assert task.step_errors("07 a+5=13\n13 c-7=06\nAnswer: 6\n06 c+9=15", p) == dict(
        borrow=1, habit=0, borrow_ok=1, other=1, other_wrong=1, lookup_wrong=1)
    assert task.step_errors("", p) == dict(borrow=0, habit=0, borrow_ok=0, other=0, other_wrong=0, lookup_wrong=0)


def test_tokenizer_and_model_survive_save_and_reload(tmp_path, tokenizer, tiny_policy):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tiny_policy.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    text = "Compute: 7 a+5 b-7\n07 a+5=12\n12 b-7=15\nAnswer: -15"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text) and tok2(text)["input_ids"] == ids
    assert tok2.decode(ids) == text and tok2.eos_token == tok2.pad_token == task.EOS
    assert tok2.padding_side == "left"
    x = torch.tensor([ids + [tokenizer.eos_token_id]])
    with torch.no_grad():
        assert torch.equal(tiny_policy(x).logits, model2(x).logits)


def test_evaluate_accuracy_runs_greedy_and_sampled(tokenizer, tiny_policy):
    problems = task.make_dataset(4, seed=0, min_steps=1, max_steps=2, split="eval")
    for temperature in (0.0, 1.0):
        r = task.evaluate_accuracy(tiny_policy, tokenizer, problems, temperature, samples=2, max_new_tokens=6)
        assert r["count"] == 8 and set(r["by_steps"]) == {1, 2} and 0 <= r["accuracy"] <= 1
        assert 1 <= r["mean_tokens"] <= 6
        assert 0 <= r["steps"]["habit_rate"] <= 1 and 0 <= r["steps"]["other_error_rate"] <= 1


def test_build_base_model_writes_a_loadable_folder(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    out = tmp_path / "base"
    info = builds.build_base_model(str(out), steps=2, eval_per_step=0, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["base"]  # no temporary folder left behind
    assert json.load(open(out / builds.BUILD_INFO))["recipe"]["steps"] == 2 == info["recipe"]["steps"]
    tokenizer, model = AutoTokenizer.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out)
    assert tokenizer("7+5")["input_ids"] == task.build_tokenizer()("7+5")["input_ids"]
    assert 0.9e6 < sum(p.numel() for p in model.parameters()) < 1.2e6
    builds.build_base_model(str(out), steps=1, eval_per_step=0, progress=False)  # a rebuild replaces it
    assert json.load(open(out / builds.BUILD_INFO))["recipe"]["steps"] == 1
    assert sorted(os.listdir(tmp_path)) == ["base"]


def test_the_demo_starts_from_the_shipped_base_model(monkeypatch, tmp_path):
    """The built-in names are the shipped folders; a checkout that lacks one is told, in one line, how to build it."""
    from machinery import models
    assert models.shipped_model("builtin") == builds.SHIPPED_BASE
    monkeypatch.setitem(models.BUILTIN_MODELS, "builtin", (str(tmp_path / "absent"), models.BUILTIN_MODELS["builtin"][1]))
    with pytest.raises(SystemExit, match="python -m machinery.builds build --out base-model"):
        models.shipped_model("builtin")


def test_shipped_base_model_is_the_recorded_one_and_scores_as_recorded():
    """The shipped files are the ones the recipe built (checksum), load with stock transformers, and score on the
    build's held-out problems what build_info.json recorded. Greedy decoding of the same weights can still
    differ between CPUs where two logits are within rounding of each other, so the check allows 2 points (6 of
    300 problems); a wrong or damaged model is off by far more."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = builds.SHIPPED_BASE
    info = json.load(open(os.path.join(path, builds.BUILD_INFO)))
    assert builds.weights_sha256(path) == builds.SHIPPED_SHA256 == info["sha256"]
    assert info["name"] == builds.BASE_NAME and info["recipe"]["steps"] == builds.SFT_STEPS
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    problems = task.make_dataset(info["eval"]["per_step"] * (task.MAX_STEPS - task.MIN_STEPS + 1),
                                 info["eval"]["seed"], split="eval")
    greedy = task.evaluate_accuracy(model, tokenizer, problems, temperature=0.0)
    assert abs(greedy["accuracy"] - info["eval"]["greedy"]["accuracy"]) <= 0.02, (greedy, info["eval"]["greedy"])
    assert abs(greedy["mean_tokens"] - info["eval"]["greedy"]["mean_tokens"]) <= 1.0


def test_first_error_is_where_a_wrong_response_leaves_the_correct_chain():
    p = {"prompt": "Compute: 7 a+5 b-7 c+9 d-6\n", "answer": "8", "n_steps": 4, "expr": "7+5-7+9-6"}
    right = task.solve(p)
    assert right == "07 a+5=12\n12 b-7=05\n05 c+9=14\n14 d-6=08\nAnswer: 8" and task.first_error(right, p) is None
    assert task.first_error("Answer: 8", p) is None  # a right guess is not wrong
    habit = "07 a+5=12\n12 b-7=15\n15 c+9=24\n24 d-6=18\nAnswer: 18"
    assert task.first_error(habit, p) == 17 and habit[17] == "1"  # the forgotten borrow's tens digit
    misread = "07 a+5=12\n12 c-7=05\n05 c+9=14\n14 d-6=08\nAnswer: 8x"
    assert task.first_error(misread, p) == 13 and misread[13] == "c"  # a misread label, though the answer's
    assert task.first_error("Answer: 3", p) == 0  # a wrong guess leaves the chain at once
    assert task.first_error(right[:20], p) == 20  # cut short: wrong where it stops


def test_first_error_kind_names_what_a_wrong_response_did_first():
    """#30: one kind per wrong response, from its first wrong line (step_errors counts every line, so a skipped
    term misaligns all the later ones); evaluate_accuracy gives each kind's share of the responses."""
    p = {"prompt": "Compute: 7 a+5 b-7 c+9 d-6\n", "answer": "8", "n_steps": 4, "expr": "7+5-7+9-6"}
    kind = lambda text: task.first_error_kind(text, p)  # noqa: E731
    assert kind(task.solve(p)) is None and kind("Answer: 8") is None
    assert kind("07 a+5=12\n12 b-7=15\n15 c+9=24\n24 d-6=18\nAnswer: 18") == "habit"  # forgot 12-7's borrow
    assert kind("07 a+5=12\n12 b-9=03\n03 c+9=12\n12 d-6=06\nAnswer: 6") == "misread"  # b's term read as 9
    assert kind("07 a+5=12\n12 c+9=21\n21 d-6=15\nAnswer: 15") == "misread"  # b skipped: c's line on b's
    assert kind("07 a+5=13\n13 b-7=06\n06 c+9=15\n15 d-6=09\nAnswer: 9") == "slip"  # 7+5 written 13
    assert kind("07 a+5=12\n12 b-7=05\nAnswer: 5") == "early" and kind("Answer: 3") == "early"
    assert kind("07 a+5=12\nwhat") == "other" and kind(task.solve(p).replace("Answer: 8", "Answer: 9")) == "other"
    problems = task.make_dataset(6, seed=0, min_steps=1, max_steps=3, split="eval")
    rng = random.Random(0)
    demos = [task.make_demonstration(q, rng, habit_prob=1.0, error_prob=0.0) for q in problems]
    kinds = [kind_ for d, q in zip(demos, problems) if (kind_ := task.first_error_kind(d["response"], q))]
    assert set(kinds) <= {"habit"} and len(kinds) == sum(d["habit_steps"] > 0 for d in demos)


def test_evaluate_accuracy_gives_the_share_of_each_first_error(tokenizer, tiny_policy):
    problems = task.make_dataset(4, seed=0, min_steps=1, max_steps=2, split="eval")
    r = task.evaluate_accuracy(tiny_policy, tokenizer, problems, 1.0, samples=2, max_new_tokens=6)
    assert set(r["first_errors"]) == set(task.FIRST_ERROR_KINDS)
    assert sum(r["first_errors"].values()) == pytest.approx(1 - r["accuracy"])  # every wrong response has a kind
