"""bench/lab_critic.py (docs/lab.md, experiment 9): the critic that reads the reference solution sees it between the
prompt and the response, and trains through `bench/lab.py record -- --critic-solution`; the fresh critics' shapes; the
critic-only fits at smoke size."""
import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, os.path.join(ROOT, "bench"))
import lab_critic  # noqa: E402
import lab_rl  # noqa: E402
from machinery import task  # noqa: E402
from rollout import rollout_from_tokens  # noqa: E402


def test_the_solution_is_read_between_the_prompt_and_the_response(tokenizer):
    eos = tokenizer.eos_token_id
    prompt = tokenizer.encode("Compute: 12 a-5 b+3\n", add_special_tokens=False)
    response = tokenizer.encode("12 a-5=17\n", add_special_tokens=False) + [eos]
    rollout = rollout_from_tokens([prompt, tokenizer.encode("Compute: 4 a+5\n", add_special_tokens=False)],
                                  [response, response], [[0.0] * len(response)] * 2, 1, [eos], tokenizer.pad_token_id,
                                  tokenizer, "cpu")
    out = lab_critic.with_solutions(rollout, tokenizer)
    first = tokenizer.decode(out.prompt_ids[0][out.prompt_mask[0].bool()])
    assert first == "Compute: 12 a-5 b+3\nSolution:\n" + task.solve(task.problem_of("Compute: 12 a-5 b+3\n")) + "\n\n"
    assert torch.equal(out.response_ids, rollout.response_ids) and torch.equal(out.response_mask, rollout.response_mask)
    assert out.prompt_mask[1].sum() < out.prompt_mask[0].sum()  # each row its own solution, left-padded


@pytest.mark.parametrize("shape, key, factor", [("wide4", "hidden_size", 4), ("deep4", "num_hidden_layers", 4)])
def test_the_fresh_critics_shapes(shape, key, factor):
    base = lab_critic.fresh_critic("policy").config
    critic = lab_critic.fresh_critic(shape)
    assert getattr(critic.config, key) == factor * getattr(base, key) and (critic.score.weight == 0).all()


def test_record_trains_the_critic_that_reads_the_solution_and_refuses_it_beside_another(tmp_path):
    run = str(tmp_path / "run")
    argv = ["--", "--preset", "long", "--steps", "1", "--critic-solution", "--value-pretrain-steps", "1",
            "--prompts-per-step", "2", "--mini-batch-size", "4", "--critic-mini-batch-size", "4", "--eval-prompts", "2",
            "--eval-sampled-prompts", "2", "--no-token-views", "--output-dir", run]
    lab_rl.record(argv)
    assert json.load(open(os.path.join(run, "lab.json")))["critic_solution"] is True
    steps = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if '"train_acc"' in line]
    assert steps[-1]["grad_norm/critic"] > 0 and os.path.exists(os.path.join(run, "checkpoint", "critic"))
    with pytest.raises(SystemExit, match="--critic-solution: needs the run's own critic network"):
        lab_rl.record([*argv[:-2], "--algo", "grpo", "--output-dir", str(tmp_path / "grpo")])


def test_the_critic_fits_at_smoke_size(tmp_path):
    args = SimpleNamespace(seeds=[0], report=False, batches=1, prompts=3, group=2)
    summary = lab_critic.run_critic_fits(args, str(tmp_path))
    s = summary["mean_se"]
    assert all(f"{name}|1|corr|lambda0" in s for name in lab_critic.ROWS) and "smoke run" in summary["note"]
    assert (tmp_path / "critic-fits.png").exists()
