"""vapo.py: the config, each switch, a few training steps on a tiny random model, resume, the command line."""
import dataclasses
import functools
import json
import math
import os
import statistics
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import config
from machinery import data
from machinery import run, world
import vapo
from reward import Verifier, arith_reward
from vapo import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A few seconds per run: 4 prompts x 2 samples of at most 24 tokens on a 1M-parameter random model.
TINY = dict(dataset="builtin", steps=2, prompts_per_step=4, samples_per_prompt=2, mini_batch_size=4,
            micro_batch_size=2, max_new_tokens=24, actor_lr=1e-3, critic_lr=1e-3, warmup_steps=1,
            value_pretrain_steps=1, eval_every=0, eval_prompts=4, eval_samples=2, save_every=0, alpha=0.5,
            truncated_reward="graded",  # a random tiny model never ends in 24 tokens: its texts are graded
            whiten_advantages=False, value_pretrain_ev=None, eval_batch_size=None, overlong_cache_frac=0.2)


def tiny_config(model_dir, out_dir, **kw):
    return Config(**{**TINY, "model": model_dir, "output_dir": str(out_dir), **kw}).validate()


# For the runs here whose claims are not about the teaching views: their PNGs (5 matplotlib figures at step 0,
# after value pretraining and at every evaluation) took most of a tiny run's time. tests/test_views.py checks the
# views of a run, tests/test_faults.py's kill harness their records across resumes.
NO_VIEWS = dict(token_views=False)


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def weights(folder):
    return {k: v for f in os.listdir(folder) if f.endswith(".safetensors")
            for k, v in load_file(os.path.join(folder, f)).items()}


# ---- config -----------------------------------------------------------------------------------------------

def test_defaults_are_the_demos_and_the_paper_preset_the_papers():
    """Config's defaults are what `python vapo.py` runs (the demo preset sets nothing beyond them but its model and
    data); --preset paper has the paper's values (section 4.1) side by side with them in config.PRESET_TABLE."""
    c = Config()
    assert {k: getattr(c, k) for k in config.PRESETS["demo"]} == config.PRESETS["demo"]
    p = Config(**config.PRESETS["paper"])
    assert (p.actor_lr, p.critic_lr, p.eps_low, p.eps_high, p.mu, p.alpha, p.lam_critic) == \
        (1e-6, 2e-6, 0.2, 0.28, 0.1, 0.05, 1.0)
    assert (p.prompts_per_step, p.samples_per_prompt, p.mini_batch_size, p.value_pretrain_steps) == (512, 16, 512, 50)
    assert (p.eval_samples, p.eval_temperature, p.eval_top_p) == (32, 1.0, 0.7)
    assert p.batch_size == 8192 and p.loss_agg == "token-mean" and p.eps_high_used == 0.28
    assert all(len(row) == len(config.PRESET_NAMES) for row in config.PRESET_TABLE.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.mu = 0.5


@pytest.mark.parametrize("overrides, option", [
    (dict(clip_higher=True, eps_low=0.3, eps_high=0.2), "--eps-high"),
    (dict(alpha=0.0), "--alpha"),
    (dict(prompts_per_step=3, samples_per_prompt=2, mini_batch_size=4), "--mini-batch-size"),
    (dict(mini_batch_size=64, micro_batch_size=5), "--micro-batch-size"),
    (dict(temperature=0.0), "--temperature"),
])
def test_validation_names_the_option(overrides, option):
    with pytest.raises(ValueError, match=option):
        Config(**overrides).validate()


def test_help_shows_each_fields_documentation():
    text = config.build_parser(Config, vapo.ALGORITHMS).format_help()
    docs = config.field_docs(Config)
    assert set(docs) == {f.name for f in dataclasses.fields(Config)}  # every field is documented
    for name in ("eps_high", "value_pretrain_steps", "alpha"):
        assert f"--{name.replace('_', '-')}" in text
        assert docs[name].split()[0] in text
    assert "--no-clip-higher" in text and "--no-positive-nll" in text


def test_cli_overrides_preset_and_rejects_bad_values():
    cfg, resume, _ = vapo.config_from_args(["--steps", "7", "--no-clip-higher", "--value-clip", "0.5"])
    assert cfg.steps == 7 and not cfg.clip_higher and cfg.value_clip == 0.5 and resume is None
    assert cfg.prompts_per_step == config.PRESETS["demo"]["prompts_per_step"]  # no --model: the demo preset
    cfg, _, _ = vapo.config_from_args(["--model", "Qwen2.5-0.5B", "--dataset", "d.jsonl", "--value-clip", "none"])
    assert cfg.value_clip is None and cfg.model == "Qwen2.5-0.5B"  # with --model: one GPU's budget, not the paper's
    assert (cfg.steps, cfg.prompts_per_step) == (config.PRESETS["gpu-0.5b"]["steps"], 64) and cfg.bf16
    paper, _, _ = vapo.config_from_args(["--model", "./my-model", "--dataset", "d.jsonl", "--preset", "paper"])
    assert (paper.steps, paper.prompts_per_step, paper.samples_per_prompt) == (313, 512, 16) and not paper.bf16
    with pytest.raises(SystemExit, match="--eps-high"):
        vapo.config_from_args(["--eps-low", "0.3", "--eps-high", "0.1"])


def test_the_chosen_preset_is_said(caplog):
    with caplog.at_level("INFO", logger="vapo"):
        vapo.config_from_args(["--model", "./my-model", "--dataset", "d.jsonl"])
    assert "preset gpu-0.5b (the default with --model: one GPU's budget; --preset paper" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="vapo"):
        vapo.config_from_args(["--model", "./my-model", "--dataset", "d.jsonl", "--preset", "paper"])
    assert "preset paper:" in caplog.text and "default with --model" not in caplog.text


def test_algo_is_a_named_set_of_switches_under_the_users_options():
    grpo, _, _ = vapo.config_from_args(["--algo", "grpo"])
    assert grpo.algo == "grpo" and grpo.group_advantage and not grpo.value_pretraining
    assert not grpo.clip_higher and grpo.loss_agg == "seq-mean-token-mean" and not grpo.positive_nll
    assert grpo.prompts_per_step == config.PRESETS["demo"]["prompts_per_step"]  # still the demo's budget
    ablated, _, _ = vapo.config_from_args(["--algo", "grpo", "--clip-higher"])  # what the user types wins
    assert ablated.clip_higher and ablated.group_advantage
    dapo, _, _ = vapo.config_from_args(["--algo", "dapo"])
    assert dapo.dynamic_sampling and dapo.overlong_shaping and dapo.clip_higher and dapo.loss_agg == "token-mean"
    ppo, _, _ = vapo.config_from_args(["--algo", "ppo"])
    assert ppo.group_size == 1 and ppo.batch_size == vapo.config_from_args([])[0].batch_size  # same budget
    assert not (ppo.value_pretraining or ppo.decoupled_gae or ppo.length_adaptive or ppo.clip_higher)
    assert vapo.config_from_args(["--algo", "vapo"])[0] == dataclasses.replace(vapo.config_from_args([])[0],
                                                                                algo="vapo")
    with pytest.raises(SystemExit, match="--algo"):
        vapo.config_from_args(["--algo", "reinforce"])
    with pytest.raises(SystemExit, match="group"):
        vapo.config_from_args(["--algo", "grpo", "--no-group-sampling"])
    text = config.build_parser(Config, vapo.ALGORITHMS).format_help()
    assert "ppo: value_pretraining=False" in text and "dapo: group_advantage=True" in text


def test_switches_change_derived_values():
    c = Config(clip_higher=False, token_level_loss=False, group_sampling=False)
    assert c.eps_high_used == c.eps_low
    assert c.loss_agg == "seq-mean-token-mean"
    assert c.group_size == 1 and c.prompts_per_rollout == c.batch_size


# ---- phases of a step -------------------------------------------------------------------------------------

class FakeRollout:
    def __init__(self, lengths, T):
        self.lengths = torch.tensor(lengths)
        self.response_mask = (torch.arange(T)[None, :] < self.lengths[:, None]).long()
        self.B = len(lengths)


def test_terminal_rewards_sit_on_the_last_token():
    mask = FakeRollout([3, 1, 0], T=4).response_mask
    r = vapo.terminal_rewards(torch.tensor([1.0, -1.0, 1.0]), mask)
    assert r.tolist() == [[0, 0, 1, 0], [-1, 0, 0, 0], [0, 0, 0, 0]]


def test_length_adaptive_and_decoupled_switches():
    ro = FakeRollout([10, 40], T=40)
    scores = torch.tensor([1.0, -1.0])  # one reward per response
    rewards = vapo.terminal_rewards(scores, ro.response_mask)  # [B, T]
    values = torch.rand(2, 40) * ro.response_mask
    _, ret, lam = vapo.advantages_and_returns(ro, scores, values, Config(alpha=0.5))
    assert lam.tolist() == pytest.approx([0.8, 0.95])
    torch.testing.assert_close(ret, rewards.sum(-1, keepdim=True) * ro.response_mask)  # lam_critic = 1: MC
    _, _, lam = vapo.advantages_and_returns(ro, scores, values, Config(length_adaptive=False,
                                                                         lam_policy_fixed=0.9))
    assert lam.tolist() == pytest.approx([0.9, 0.9])
    adv, ret, lam = vapo.advantages_and_returns(ro, scores, values, Config(alpha=0.5, decoupled_gae=False))
    from gae import gae
    torch.testing.assert_close(ret, gae(rewards, values, ro.response_mask, lam=lam)[1])  # critic uses lam_policy
    assert not torch.allclose(ret, rewards.sum(-1, keepdim=True) * ro.response_mask)


class FakeEngine:
    """Returns, for each prompt, G responses of the given scripted answers ("1" right, anything else wrong)."""

    def __init__(self, answers):
        self.answers = answers  # prompt -> list of G answers
        self.device = torch.device("cpu")  # the engine interface: where its rollouts' tensors live
        self.calls = 0

    def generate(self, prompts, n=1):
        from rollout import Rollout
        self.calls += 1
        texts = [f"Answer: {a}" for p in prompts for a in self.answers[p][:n]]
        B = len(texts)
        return Rollout(prompt_ids=torch.ones(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.long),
                       response_ids=torch.ones(B, 3, dtype=torch.long),
                       response_mask=torch.ones(B, 3, dtype=torch.long), lengths=torch.full((B,), 3),
                       truncated=torch.zeros(B, dtype=torch.bool), sampler_logprobs=torch.zeros(B, 3),
                       prompt_index=torch.arange(len(prompts)).repeat_interleave(n), texts=texts)


def test_dynamic_sampling_keeps_varied_groups_and_refills():
    answers = {"mixed": ["1", "0"], "right": ["1", "1"], "wrong": ["0", "0"], "mixed2": ["0", "1"]}
    rows = {k: {"prompt": k, "answer": "1"} for k in answers}
    cfg = Config(prompts_per_step=2, samples_per_prompt=2, mini_batch_size=4, dynamic_sampling=True,
                 dynamic_sampling_rounds=2)
    rounds = [[rows["wrong"], rows["right"]], [rows["mixed2"], rows["right"]]]
    engine = FakeEngine(answers)
    verifier = Verifier(arith_reward, 0)
    rollout, scores, stats = vapo.sample_and_reward(engine, [rows["mixed"], rows["wrong"]], cfg, verifier,
                                                    refill=lambda r: rounds[r - 1])
    assert rollout.texts == ["Answer: 1", "Answer: 0", "Answer: 0", "Answer: 1"]  # mixed, then mixed2
    assert scores.tolist() == [1.0, -1.0, -1.0, 1.0]
    assert (stats["samples_generated"], stats["dynamic/groups_dropped"], stats["dynamic/rounds"]) == (12, 4, 2)
    assert rollout.prompt_index.tolist() == [0, 0, 4, 4]  # groups of later rounds are numbered after earlier ones
    # nothing varied, no refill budget left: an empty batch, which the step reports instead of training on
    cfg0 = dataclasses.replace(cfg, dynamic_sampling_rounds=0)
    rollout, scores, stats = vapo.sample_and_reward(FakeEngine(answers), [rows["right"], rows["wrong"]], cfg0,
                                                    verifier, refill=lambda r: pytest.fail("no extra round allowed"))
    assert rollout.B == 0 and stats["dynamic/groups_dropped"] == 2 and stats["samples_generated"] == 4
    # off: everything is kept, whatever the rewards
    off = dataclasses.replace(cfg, dynamic_sampling=False)
    rollout, _, stats = vapo.sample_and_reward(FakeEngine(answers), [rows["right"], rows["wrong"]], off, verifier)
    assert rollout.B == 4 and stats["samples_generated"] == 4 and "dynamic/rounds" not in stats


def test_overlong_penalties_and_group_advantages_in_the_step_phases():
    cfg = Config(max_new_tokens=128, overlong_cache_frac=0.125, prompts_per_step=1, samples_per_prompt=4,
                 mini_batch_size=4, group_advantage=True)
    assert vapo.overlong_penalties(torch.tensor([20, 112, 120, 128]), cfg).tolist() == [0.0, 0.0, -0.5, -1.0]
    ro = FakeRollout([3, 5, 2, 4], T=5)
    adv, returns, lam = vapo.advantages_and_returns(ro, torch.tensor([1.0, -1.0, -1.0, -1.0]), None, cfg)
    assert returns is None and lam is None
    assert adv[0, 0] > 0 and (adv[1:, 0] < 0).all() and torch.equal(adv[0, 3:], torch.zeros(2))


def test_group_sampling_off_uses_distinct_prompts():
    rows = [{"prompt": str(i), "answer": "0"} for i in range(100)]
    on = data.prompt_batch(rows, 0, Config(prompts_per_step=4, samples_per_prompt=4).prompts_per_rollout, 0)
    off_cfg = Config(prompts_per_step=4, samples_per_prompt=4, group_sampling=False)
    off = data.prompt_batch(rows, 0, off_cfg.prompts_per_rollout, 0)
    assert len(on) == 4 and len(off) == 16 and len({r["prompt"] for r in off}) == 16
    assert data.prompt_batch(rows, 3, 16, 0) == data.prompt_batch(rows, 3, 16, 0)  # pure function of the step


# ---- training on the tiny model ---------------------------------------------------------------------------

def test_a_few_steps_change_both_models_and_log_everything(tiny_model_dir, tmp_path):
    run_dir = vapo.train(tiny_config(tiny_model_dir, tmp_path / "run", **NO_VIEWS))
    policy = weights(os.path.join(run_dir, "checkpoint", "policy"))
    critic = weights(os.path.join(run_dir, "checkpoint", "critic"))
    start = weights(tiny_model_dir)
    assert any(not torch.equal(policy[k], start[k]) for k in start)
    assert any(v.abs().sum() > 0 for k, v in critic.items() if k.startswith("score."))  # head left zero
    assert any(not torch.equal(critic[k], start[k]) for k in start if k in critic)  # backbone trained too
    records = read_metrics(run_dir)
    steps = [r for r in records if "train_acc" in r and "step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for key in ("reward_mean", "train_acc", "response_len", "policy_loss", "value_loss", "explained_variance",
                "lam_policy", "clip_frac_low", "clip_frac_high", "entropy", "nll_loss", "time/rollout",
                "time/score", "time/update"):
        assert key in steps[0], key
    assert any("value_pretrain_step" in r for r in records)
    evals = [r for r in records if any("eval" in k and "acc" in k for k in r)]
    assert [r["step"] for r in evals] == [0, 2]
    assert os.path.exists(os.path.join(run_dir, "curves.png"))
    assert os.path.exists(os.path.join(run_dir, "critic_pretrained", "config.json"))


def odd_length_verifier(response: str, gold: str) -> float:
    """Right when the response has an odd number of characters: varied rewards from a random model, so that
    group advantages are not all zero (a random model never solves the task)."""
    return 1.0 if len(response) % 2 else -1.0


@pytest.mark.parametrize("algo", ["grpo", "dapo", "ppo"])
def test_baselines_train_and_grpo_has_no_critic(tiny_model_dir, tmp_path, algo, monkeypatch):
    monkeypatch.setattr(run, "verifier_for", lambda cfg: Verifier(odd_length_verifier, 0))
    cfg = tiny_config(tiny_model_dir, tmp_path / algo, algo=algo, **vapo.ALGORITHMS[algo], overlong_cache_frac=8 / 24,
                      **NO_VIEWS)
    run_dir = vapo.train(cfg)
    policy = weights(os.path.join(run_dir, "checkpoint", "policy"))
    start = weights(tiny_model_dir)
    assert any(not torch.equal(policy[k], start[k]) for k in start)
    steps = [r for r in read_metrics(run_dir) if "samples_generated" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["samples_generated"] >= 8 for r in steps)
    critic_saved = os.path.exists(os.path.join(run_dir, "checkpoint", "critic"))
    if algo == "ppo":
        assert critic_saved and "explained_variance" in steps[0]
    else:  # no critic: nothing built, trained, scored or saved
        assert not critic_saved and not any("value" in k or "explained" in k for r in steps for k in r)
    state = torch.load(os.path.join(run_dir, "checkpoint", "state.pt"), weights_only=False)
    assert set(state["optimizers"]) == ({"policy", "critic"} if algo == "ppo" else {"policy"})


def test_old_logprobs_come_from_the_sampler_only_where_they_are_the_policys():
    """auto: the sampler's log-probs are PPO's old ones only from the HF engine of one process (it samples from
    the policy itself) at top_p 1 without bf16; sampler at top_p < 1 is refused (the nucleus's log-probs are not
    the policy's)."""
    own = SimpleNamespace(own_weights=False)  # HFEngine in one process
    copy = SimpleNamespace(own_weights=True)  # vLLM, or the HF engine of a sharded run
    auto = Config()
    assert vapo.old_logprobs_from_sampler(auto, own)
    assert not vapo.old_logprobs_from_sampler(auto, copy)
    assert not vapo.old_logprobs_from_sampler(Config(top_p=0.9), own)
    assert not vapo.old_logprobs_from_sampler(Config(bf16=True), own)
    assert not vapo.old_logprobs_from_sampler(Config(old_logprobs="recompute"), own)
    assert vapo.old_logprobs_from_sampler(Config(old_logprobs="sampler"), copy)  # the user's call
    with pytest.raises(ValueError, match="--old-logprobs: sampler needs top_p = 1"):
        Config(old_logprobs="sampler", top_p=0.9).validate()
    with pytest.raises(ValueError, match="--old-logprobs"):
        Config(old_logprobs="cached").validate()


def test_every_row_of_a_dynamically_sampled_batch_is_judged_against_its_own_prompt(tiny_model_dir):
    """With dynamic sampling a batch holds refill rounds' prompts, and rollout.prompt_index counts every round's:
    the problems an RL step hands its observers are each row's own. Round 0's groups are made to
    all get the same reward, so every kept row comes from a refill."""
    from machinery import task
    from machinery.data import gold_of
    from machinery.engines import HFEngine
    from machinery.models import load_policy, value_model_from_policy
    rows = task.make_dataset(64, seed=0, split="train")
    cfg = tiny_config(tiny_model_dir, "unused", algo="vapo", dynamic_sampling=True, dynamic_sampling_rounds=2)
    first = {gold_of(r) for r in vapo.step_prompts(rows, 0, cfg)}
    verifier = Verifier(functools.partial(round_zero_alike, frozenset(first)), 0)
    torch.manual_seed(0)
    policy, tok = load_policy(tiny_model_dir)
    critic = value_model_from_policy(policy)
    optimizers = {"policy": vapo.make_optimizer(policy, cfg.actor_lr, cfg),
                  "critic": vapo.make_optimizer(critic, cfg.critic_lr, cfg)}
    engine = HFEngine(policy, tok, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    seen = []
    observer = SimpleNamespace(observe=lambda batch: seen.append((batch.rollout, batch.problems)) or {})
    record = vapo.rl_step(0, policy, critic, optimizers, engine, rows, cfg, verifier, observers=[observer])
    assert record["dynamic/rounds"] >= 1 and seen
    rollout, problems = seen[0]
    assert len(problems) == rollout.B > 0 and not {gold_of(p) for p in problems} & first  # all from refills
    for b in range(rollout.B):
        prompt = tok.decode(rollout.prompt_ids[b][rollout.prompt_mask[b].bool()])
        assert problems[b]["prompt"] in prompt, (b, problems[b]["prompt"], prompt)


def round_zero_alike(first: frozenset, response: str, gold: str) -> float:
    """-1 for every response to a prompt of round 0 (gold in first): their groups are all alike and dropped; else
    odd_length_verifier's varied rewards."""
    return -1.0 if gold in first else odd_length_verifier(response, gold)


@pytest.mark.parametrize("algo", ["vapo", "grpo"])
def test_sampler_old_logprobs_make_the_same_step_as_a_scoring_pass(tiny_model_dir, algo):
    """One RL step from the same weights and random state, old log-probs from the sampler against a scoring pass:
    the same samples, the same losses and statistics to 1e-5, the same weights after the update to 1e-4 (measured
    1.6e-5: AdamW's first steps move a weight by up to lr = 1e-3 whatever the gradient's size, so rounding in
    a near-zero gradient shows), and the logged entropy the same. The scoring pass finds the sampler's
    log-probs equal to its own (the logged gap)."""
    from machinery import task
    from machinery.models import load_policy, value_model_from_policy
    from machinery.engines import HFEngine
    rows = task.make_dataset(32, seed=0, split="train")
    out = {}
    for mode in ("sampler", "recompute"):
        cfg = tiny_config(tiny_model_dir, "unused", algo=algo, old_logprobs=mode,
                          **vapo.ALGORITHMS[algo])
        torch.manual_seed(0)
        policy, tok = load_policy(tiny_model_dir)
        critic = None if cfg.group_advantage else value_model_from_policy(policy)
        optimizers = {"policy": vapo.make_optimizer(policy, cfg.actor_lr, cfg)}
        if critic is not None:
            optimizers["critic"] = vapo.make_optimizer(critic, cfg.critic_lr, cfg)
        engine = HFEngine(policy, tok, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        record = vapo.rl_step(0, policy, critic, optimizers, engine, rows, cfg, Verifier(odd_length_verifier, 0))
        out[mode] = (record, [p.detach().clone() for m in (policy, critic) if m is not None for p in m.parameters()])
    (fast, fast_w), (slow, slow_w) = out["sampler"], out["recompute"]
    assert "sampler_logprob_gap_mean" not in fast and slow["sampler_logprob_gap_max"] < 1e-4
    assert fast["response_len"] == slow["response_len"] and fast["train_acc"] == slow["train_acc"]  # same samples
    assert 0 < fast["train_acc"] < 1  # rewards that vary (odd_length_verifier): advantages and EV are defined
    for key in ("policy_loss", "entropy", "approx_kl", "clip_frac_low", "clip_frac_high", "advantage_mean",
                *(("value_loss", "explained_variance") if algo == "vapo" else ())):
        assert math.isclose(fast[key], slow[key], rel_tol=1e-4, abs_tol=1e-5), (key, fast[key], slow[key])
    assert max((a - b).abs().max().item() for a, b in zip(fast_w, slow_w)) < 1e-4


def test_max_samples_stops_at_an_equal_budget_of_samples(tiny_model_dir, tmp_path):
    run_dir = vapo.train(tiny_config(tiny_model_dir, tmp_path / "run", steps=5, max_samples=10,
                                     value_pretraining=False, **NO_VIEWS))  # 8 samples per step: 2 steps reach 10
    records = read_metrics(run_dir)
    assert [r["step"] for r in records if "samples_generated" in r] == [1, 2]
    assert [r["step"] for r in records if "eval/acc_greedy" in r] == [0, 2]  # the last evaluation at the stop
    assert torch.load(os.path.join(run_dir, "checkpoint", "state.pt"), weights_only=False)["step"] == 2


def test_evaluation_at_sample_counts(tiny_model_dir, tmp_path):
    """--eval-every-samples 12 at 8 samples a step: evaluations after the steps that pass 12 and 24 samples (steps
    2 and 3, not 4 at 32) and at the last; --eval-every is then not used. Every step logs the critic's fit and the
    raw advantage on the first tenth of responses and on the rest."""
    run_dir = vapo.train(tiny_config(tiny_model_dir, tmp_path / "run", steps=5, eval_every=1, eval_every_samples=12,
                                     value_pretraining=False, **NO_VIEWS))
    records = read_metrics(run_dir)
    assert [r["step"] for r in records if "eval/acc_greedy" in r] == [0, 2, 3, 5]
    steps = [r for r in records if "samples_generated" in r]
    assert all({"advantage_first_tenth", "advantage_rest", "ev_first_tenth", "ev_rest"} <= set(r) for r in steps)
    with pytest.raises(ValueError, match="--eval-every-samples"):
        tiny_config(tiny_model_dir, tmp_path / "bad", eval_every_samples=-1)


def test_advantage_by_position_is_the_raw_advantage_split():
    """The logged first-tenth and rest figures are the masked means of the unwhitened advantages over each
    response's first tenth (losses.first_tenth_mask) and the rest, whether or not the update whitens them."""
    from losses import first_tenth_mask, masked_mean
    ro = FakeRollout([10, 40], T=40)
    scores, values = torch.tensor([1.0, -1.0]), torch.rand(2, 40) * ro.response_mask
    raw, _, _ = vapo.advantages_and_returns(ro, scores, values, Config(alpha=0.5, whiten_advantages=False))
    stats = {}
    whitened, _, _ = vapo.advantages_and_returns(ro, scores, values, Config(alpha=0.5, whiten_advantages=True), stats)
    head = first_tenth_mask(ro.response_mask)
    assert head.sum(-1).tolist() == [1, 4]  # positions t < 0.1 * length
    assert stats["advantage_first_tenth"] == pytest.approx(masked_mean(raw, head).item())
    assert stats["advantage_rest"] == pytest.approx(masked_mean(raw, ro.response_mask - head).item())
    assert not torch.allclose(raw, whitened)


def test_positive_nll_switch(tiny_model_dir, tmp_path):
    """Off: no NLL term at all. On, with every sample marked correct: the NLL is logged and positive."""
    from machinery.models import load_policy, value_model_from_policy
    from machinery.engines import HFEngine
    from rollout import score_rollout
    policy, tok = load_policy(tiny_model_dir)
    critic = value_model_from_policy(policy)
    rollout = HFEngine(policy, tok, max_new_tokens=8).generate(["Compute: 1+2\n"] * 4, n=1, seed=0)
    scored = score_rollout(policy, critic, rollout)
    batch = {"old_logprobs": scored["old_logprobs"], "values": scored["values"],
             "advantages": torch.zeros_like(scored["values"]), "returns": torch.ones_like(scored["values"]),
             "positive": torch.ones(4, dtype=torch.bool)}
    for on in (False, True):
        cfg = Config(positive_nll=on, prompts_per_step=4, samples_per_prompt=1, mini_batch_size=4,
                     micro_batch_size=2)
        opts = {"policy": vapo.make_optimizer(policy, 1e-4, cfg), "critic": vapo.make_optimizer(critic, 1e-4, cfg)}
        before = [p.detach().clone() for p in policy.parameters()]
        stats = vapo.update(policy, critic, opts, rollout, batch, cfg)
        moved = any(not torch.equal(a, p) for a, p in zip(before, policy.parameters()))
        if on:
            assert stats["nll_loss"] > 0 and moved  # zero advantages: only the NLL moves the policy
        else:
            assert "nll_loss" not in stats and not moved


def test_no_policy_gradient_learns_from_the_nll_alone(tiny_model_dir):
    """--no-policy-gradient (online RAFT, a control): the advantages no longer reach the policy, so an update with
    random advantages lands where one with zero advantages does, and the NLL still moves it; with the policy
    gradient on, the same advantages move it elsewhere. Without the NLL the option is refused."""
    from machinery.models import load_policy, value_model_from_policy
    from machinery.engines import HFEngine
    from rollout import score_rollout
    policy, tok = load_policy(tiny_model_dir)
    critic = value_model_from_policy(policy)
    rollout = HFEngine(policy, tok, max_new_tokens=8).generate(["Compute: 1+2\n"] * 4, n=1, seed=0)
    scored = score_rollout(policy, critic, rollout)
    start = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    advantages = torch.randn(scored["values"].shape, generator=torch.Generator().manual_seed(0))

    def updated(advantages, pg: bool):
        policy.load_state_dict(start)
        torch.manual_seed(0)  # the same mini-batch order each time
        batch = {"old_logprobs": scored["old_logprobs"], "values": scored["values"], "advantages": advantages,
                 "returns": torch.ones_like(scored["values"]), "positive": torch.tensor([True, False, True, False])}
        cfg = Config(policy_gradient=pg, mu=1.0, prompts_per_step=4, samples_per_prompt=1, mini_batch_size=4,
                     micro_batch_size=2).validate()
        opts = {"policy": vapo.make_optimizer(policy, 1e-3, cfg), "critic": vapo.make_optimizer(critic, 1e-4, cfg)}
        vapo.update(policy, critic, opts, rollout, batch, cfg)
        return [p.detach().clone() for p in policy.parameters()]

    nll_random, nll_zero = updated(advantages, False), updated(torch.zeros_like(advantages), False)
    assert all(torch.equal(a, b) for a, b in zip(nll_random, nll_zero))
    assert any(not torch.equal(a, start[k]) for a, k in zip(nll_zero, [n for n, _ in policy.named_parameters()]))
    with_pg = updated(advantages, True)
    assert any(not torch.equal(a, b) for a, b in zip(with_pg, nll_random))
    with pytest.raises(ValueError, match="--policy-gradient: off needs --positive-nll"):
        Config(policy_gradient=False, positive_nll=False).validate()


def test_value_pretraining_switch_and_critic_only(tiny_model_dir, tmp_path):
    run_dir = vapo.train(tiny_config(tiny_model_dir, tmp_path / "run", steps=1, value_pretraining=False,
                                     **NO_VIEWS))
    assert not any("value_pretrain_step" in r for r in read_metrics(run_dir))
    assert not os.path.exists(os.path.join(run_dir, "critic_pretrained"))


def test_stopped_and_resumed_equals_straight_through(tiny_model_dir, tmp_path):
    straight = vapo.train(tiny_config(tiny_model_dir, tmp_path / "straight", steps=4, eval_every=2))
    part = vapo.train(tiny_config(tiny_model_dir, tmp_path / "part", steps=2, eval_every=2))
    with open(os.path.join(part, "config.json")) as fh:
        saved = json.load(fh)
    resumed = vapo.train(Config(**{**saved, "steps": 4}).validate(), resume=True)

    def comparable(run_dir):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(run_dir)]

    a, b = comparable(straight), comparable(resumed)
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            same = (ra[k] == rb[k]) or (isinstance(ra[k], float) and math.isnan(ra[k]) and math.isnan(rb[k]))
            assert same or ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-6), (ra.get("step"), k, ra[k], rb[k])


def test_command_line_runs(tiny_model_dir, tmp_path):
    out = tmp_path / "cli"
    cmd = [sys.executable, os.path.join(ROOT, "vapo.py"), "--preset", "demo", "--model", tiny_model_dir,
           "--steps", "1", "--prompts-per-step", "2", "--samples-per-prompt", "2", "--mini-batch-size", "4",
           "--micro-batch-size", "4", "--max-new-tokens", "16", "--value-pretrain-steps", "1",
           "--eval-prompts", "2", "--eval-samples", "1", "--output-dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.load(open(out / "config.json"))  # what was typed reached the run, over the demo preset
    assert (saved["steps"], saved["prompts_per_step"], saved["max_new_tokens"]) == (1, 2, 16)
    assert saved["alpha"] == config.PRESETS["demo"]["alpha"]
    records = read_metrics(out)
    assert [r["step"] for r in records if "samples_generated" in r] == [1] and records[-1]["step"] == 1
    assert [r["step"] for r in records if "eval/acc_greedy" in r] == [0, 1]
    assert [r["value_pretrain_step"] for r in records if "value_pretrain_step" in r] == [1]
    step = next(r for r in records if "samples_generated" in r)
    assert step["samples_generated"] == 4 and 0 <= step["train_acc"] <= 1 and 1 <= step["response_len"] <= 16
    assert torch.load(out / "checkpoint" / "state.pt", weights_only=False)["step"] == 1
    assert proc.stdout.strip().endswith(f"done: {out}")
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "vapo.py"), "--alpha", "-1"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert bad.returncode != 0 and "--alpha" in bad.stderr


# ---- memory ------------------------------------------------------------------------------------------------

def test_plot_frees_its_figure(tmp_path):
    """A closed figure is a reference cycle: run.plot collects it instead of leaving it to a rare full
    collection (about 9 MiB each in the demo). Checked in a fresh interpreter, as in a training process: in this
    one, other tests' figures and the log records pytest keeps can hold figures of their own."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "train_acc": 0.5, "response_len": 40.0, "policy_loss": 0.1})
                               + "\n" for s in (1, 2, 3)))
    code = ("import gc, sys, types\n"
            "from machinery import run\n"
            "from matplotlib.figure import Figure\n"
            "if sys.argv[2] == 'no-collect':\n"
            "    run.gc = types.SimpleNamespace(collect=lambda: None)  # what plot did before\n"
            "folder = types.SimpleNamespace(metrics_path=sys.argv[1] + '/metrics.jsonl', dir=sys.argv[1])\n"
            "run.plot(folder)  # the first plot also fills matplotlib's caches\n"
            "gc.collect()\n"
            "run.plot(folder)\n"
            "print(sum(isinstance(o, Figure) for o in gc.get_objects()))\n")
    left = {}
    for mode in ("collect", "no-collect"):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path), mode], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        left[mode] = int(out.stdout.strip().splitlines()[-1])
    assert (tmp_path / "curves.png").exists()
    assert left["collect"] == 0
    assert left["no-collect"] >= 1  # without the collection the figures wait, alive or garbage (the test can fail)


def test_a_process_without_held_out_prompts_adds_nothing_to_the_figures(tiny_policy, tokenizer, monkeypatch):
    """Sharded with more processes than held-out prompts, a process gets none: it samples nothing and its figures are
    zero sums (the reductions over processes add every process's; here one process stands for such a rank)."""
    from machinery.engines import HFEngine
    monkeypatch.setattr(world, "shard", lambda items: [])
    engine = HFEngine(tiny_policy, tokenizer, max_new_tokens=4)
    engine.generate = lambda *a, **k: pytest.fail("a process without prompts sampled")
    out = vapo.evaluate(engine, [{"prompt": "Compute: 1 a+1\n", "answer": "2"}], Config(eval_samples=2),
                        Verifier(arith_reward, 0))
    assert out["eval/acc_greedy"] == 0.0 and out["eval/acc_greedy_se"] == 0.0 and out["eval/pass@2"] == 0.0


def test_a_dataset_evaluation_reports_the_skill_apart_from_the_format():
    """On a dataset every figure has a lenient twin: a reply counts when its stated answer is right, or when the gold is
    its last number ("3 + 4 = 7" with no answer line); pass@k counts a prompt once any sample is right either way."""
    from reward import last_number
    assert [last_number(t) for t in ("3 + 4 = 7.", "total 1,200", "none", "x = -5.5")] == ["7", "1200", None, "-5.5"]
    replies = {"p1": ["Answer: 7", "3 + 4 = 7"], "p2": ["so 9 - 2 is 7 and the answer is 7", "Answer: 5"]}

    class Scripted:
        device = torch.device("cpu")

        def generate(self, prompts, n=1, **kw):
            from rollout import Rollout
            texts = [replies[p][g] for p in prompts for g in range(n)]
            B = len(texts)
            return Rollout(prompt_ids=torch.ones(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                           response_ids=torch.ones(B, 2, dtype=torch.long), response_mask=torch.ones(B, 2, dtype=torch.long),
                           lengths=torch.full((B,), 2), truncated=torch.zeros(B, dtype=torch.bool),
                           sampler_logprobs=torch.zeros(B, 2),
                           prompt_index=torch.arange(len(prompts)).repeat_interleave(n), texts=texts)
    rows = [{"prompt": "p1", "answer": "7"}, {"prompt": "p2", "answer": "7"}]
    cfg = Config(dataset="data.jsonl", eval_samples=2)
    out = vapo.evaluate(Scripted(), rows, cfg, Verifier(arith_reward, 0))
    assert out["eval/acc_avg@2"] == 0.25 and out["eval/lenient_avg@2"] == 0.75  # 1 of 4 stated right; 3 of 4 lenient
    assert out["eval/pass@2"] == 0.5 and out["eval/lenient_pass@2"] == 1.0
    assert out["eval/acc_greedy"] == 0.5 and out["eval/lenient_greedy"] == 1.0  # the first reply of each prompt
    assert "eval/lenient_greedy" not in vapo.evaluate(Scripted(), rows, Config(eval_samples=2), Verifier(arith_reward, 0))


def test_evaluation_samples_in_bounded_passes(tiny_policy, tokenizer):
    """Held-out prompts x k are sampled in passes of at most a training rollout's rows (or --eval-batch-size
    prompts x k), not in one KV cache for the whole evaluation; greedy results do not depend on the passes."""
    from machinery.engines import HFEngine
    from machinery.task import make_dataset
    rows = make_dataset(6, seed=0, split="eval")
    engine = HFEngine(tiny_policy, tokenizer, max_new_tokens=8)
    widths = []
    forward = tiny_policy.forward
    tiny_policy.forward = lambda *a, **kw: (widths.append(kw["input_ids"].shape[0]), forward(*a, **kw))[1]
    cfg = Config(prompts_per_step=2, samples_per_prompt=2, mini_batch_size=4, eval_samples=2, max_new_tokens=8,
                 eval_batch_size=None)
    verifier = Verifier(arith_reward, 0)
    bounded = vapo.evaluate(engine, rows, cfg, verifier)
    assert max(widths) == 4  # 2 prompts x 2 samples per pass, never the 12 rows of all 6 prompts at once
    widths.clear()
    whole = vapo.evaluate(engine, rows, dataclasses.replace(cfg, eval_batch_size=6), verifier)
    assert max(widths) == 12 and whole["eval/acc_greedy"] == bounded["eval/acc_greedy"]
    assert whole["eval/response_len_greedy"] == bounded["eval/response_len_greedy"]
    with pytest.raises(ValueError, match="--eval-batch-size"):
        Config(eval_batch_size=0).validate()


def test_evaluation_gives_standard_errors_over_prompts_and_avg_at_k_on_a_subset(tiny_policy, tokenizer):
    """#30: each accuracy comes with its standard error over prompts (a prompt's k samples are one unit), and
    --eval-sampled-prompts N samples avg@k on the first N held-out prompts only while greedy takes them all."""
    from machinery.engines import HFEngine
    from machinery.task import make_dataset
    rows = make_dataset(6, seed=0, split="eval")
    engine = HFEngine(tiny_policy, tokenizer, max_new_tokens=8)
    prompts = []
    generate = engine.generate
    engine.generate = lambda p, **kw: (prompts.append((len(p), kw["n"])), generate(p, **kw))[1]
    cfg = Config(prompts_per_step=2, samples_per_prompt=2, mini_batch_size=4, eval_samples=2, max_new_tokens=8,
                 eval_sampled_prompts=2)
    out = vapo.evaluate(engine, rows, cfg, Verifier(arith_reward, 0))
    assert prompts == [(2, 2), (6, 1)]  # avg@2 on 2 prompts, greedy on all 6
    p = out["eval/acc_greedy"]
    assert out["eval/acc_greedy_se"] == pytest.approx((p * (1 - p) / 5) ** 0.5)  # 0/1 per prompt, s^2 over 5
    assert 0 <= out["eval/acc_avg@2_se"] <= 0.5
    assert world.standard_error(torch.tensor([0.0, 0.5, 1.0, 0.5], dtype=torch.float64), 4) == \
        pytest.approx(statistics.stdev([0.0, 0.5, 1.0, 0.5]) / 2)
    with pytest.raises(ValueError, match="--eval-sampled-prompts"):
        Config(eval_sampled_prompts=0).validate()


def test_pass_at_k_counts_a_prompt_once_any_of_its_samples_is_right(tiny_policy, tokenizer, monkeypatch):
    """Three prompts x 2 samples scored [+ -], [- -], [+ +]: avg@2 is 3 of 6, pass@2 is 2 of 3; greedy (k = 1) has
    no pass@k."""
    from machinery.engines import HFEngine
    from machinery.task import make_dataset
    fixed = {6: torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0, 1.0]), 3: torch.tensor([1.0, -1.0, -1.0])}
    monkeypatch.setattr(vapo, "verify", lambda rollout, rows, cfg, verifier, stats=None: fixed[rollout.B])
    cfg = Config(prompts_per_step=2, samples_per_prompt=2, mini_batch_size=4, eval_samples=2, max_new_tokens=4)
    out = vapo.evaluate(HFEngine(tiny_policy, tokenizer, max_new_tokens=4), make_dataset(3, seed=0, split="eval"),
                        cfg, Verifier(arith_reward, 0))
    assert out["eval/acc_avg@2"] == 0.5 and out["eval/pass@2"] == pytest.approx(2 / 3)
    assert not [k for k in out if k.startswith("eval/pass@1")]


# ---- #31: fidelity of the reward, the critic's loss and the prompt stream to DAPO and verl ----

def test_a_truncated_response_earns_the_wrong_reward_unless_graded():
    """#31.1: a response cut at max_new_tokens that stated its answer early (and a response that stated it and
    then ran on) was rewarded as correct; by default it now earns the wrong reward, --truncated-reward graded
    grades its text as verl does."""
    from rollout import Rollout
    texts = ["Answer: 5", "Answer: 5\n" + "Let me double check. " * 300, "First \\boxed{5}. Wait\nAnswer: 3"]
    B = len(texts)
    rollout = Rollout(prompt_ids=torch.ones(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                      response_ids=torch.ones(B, 2, dtype=torch.long), response_mask=torch.ones(B, 2, dtype=torch.long),
                      lengths=torch.full((B,), 2), truncated=torch.tensor([False, True, False]),
                      sampler_logprobs=torch.zeros(B, 2), prompt_index=torch.zeros(B, dtype=torch.long), texts=texts)
    rows, verifier = [{"prompt": "p", "answer": "5"}], Verifier(arith_reward, 0)
    assert vapo.verify(rollout, rows, Config(), verifier).tolist() == [1.0, -1.0, -1.0]
    graded = Config(truncated_reward="graded")
    assert vapo.verify(rollout, rows, graded, verifier).tolist() == [1.0, 1.0, -1.0]
    with pytest.raises(ValueError, match="--truncated-reward"):
        Config(truncated_reward="half").validate()


class TableCritic(torch.nn.Module):
    """A constructed critic (machinery/run.py, Hooks) with one trainable value per row and token: row b's values are
    table[prompt_index[b]], so a micro-batch of any rows finds its own."""

    def __init__(self, B: int, T: int):
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(B, T))

    def values_of(self, rollout):
        return self.table[rollout.prompt_index, :rollout.T] * rollout.response_mask


def rows_of_lengths(lengths: list[int], T: int):
    """A Rollout of len(lengths) responses of those lengths (one prompt token each; row b is prompt b)."""
    from rollout import Rollout
    B = len(lengths)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    return Rollout(prompt_ids=torch.ones(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                   response_ids=torch.zeros(B, T, dtype=torch.long), response_mask=mask,
                   lengths=torch.tensor(lengths), truncated=torch.zeros(B, dtype=torch.bool),
                   sampler_logprobs=torch.zeros(B, T), prompt_index=torch.arange(B), texts=[""] * B)


@pytest.mark.parametrize("algo, agg", [("vapo", "token-mean"), ("ppo", "seq-mean-token-mean"),
                                       ("grpo", "seq-mean-token-mean")])
def test_the_critic_loss_is_aggregated_as_the_policy_loss(monkeypatch, algo, agg):
    """#31.3: the value loss was token-mean for every algorithm; verl's critic follows its actor's loss_agg_mode.
    The update's critic gradient on one mini-batch (a short and a long response: the two aggregations differ),
    taken at its optimizer step, is the aggregation's, whatever the micro-batches."""
    from losses import aggregate
    cfg = Config(**{**vapo.ALGORITHMS[algo], "group_advantage": False}, prompts_per_step=1, samples_per_prompt=2,
                 mini_batch_size=2, micro_batch_size=1)
    assert cfg.loss_agg == agg
    ro, critic = rows_of_lengths([1, 4], T=4), TableCritic(2, 4)
    returns = torch.tensor([[1.0, 0, 0, 0], [-1.0, -1.0, -1.0, -1.0]])
    grads = []
    monkeypatch.setattr(vapo, "step_or_skip", lambda models, optimizers, cfg, stats, bad: grads.append(
        (critic.table.grad.clone(), bad)) and None)
    out = vapo.update(None, critic, {}, ro, {"returns": returns, "values": torch.zeros(2, 4)}, cfg, train_policy=False)
    assert len(grads) == 1 and grads[0][1] == []  # one mini-batch, every loss finite
    values = torch.zeros(2, 4, requires_grad=True)
    aggregate(0.5 * (values - returns) ** 2, ro.response_mask, agg).backward()
    torch.testing.assert_close(grads[0][0], values.grad)  # the same gradient as the policy's aggregation gives
    assert out["value_loss"] == pytest.approx(float(aggregate(0.5 * returns ** 2, ro.response_mask, agg)))


def test_dynamic_sampling_refills_from_the_main_stream_without_repeats():
    """#31.4: the refill drew from a stream of its own (seed + 2), so a step could hold a prompt twice. Now step s
    owns a block of 1 + rounds batches of the one stream."""
    from machinery import data
    rows = [{"prompt": f"p{i}", "answer": "1"} for i in range(48)]  # 3 blocks of 16 an epoch
    cfg = Config(prompts_per_step=4, samples_per_prompt=2, dynamic_sampling=True, dynamic_sampling_rounds=3, seed=3)
    old_repeats = 0
    for step in range(10):  # the finding, in the old formula
        main = data.prompt_batch(rows, step, 4, cfg.seed)
        refills = [data.prompt_batch(rows, step * 3 + r - 1, 4, cfg.seed + 2) for r in (1, 2, 3)]
        ps = [p["prompt"] for b in [main, *refills] for p in b]
        old_repeats += len(ps) - len(set(ps))
    assert old_repeats > 0
    seen = []
    for step in range(12):  # 12 steps x 16 prompts = 4 epochs of 48
        ps = [p["prompt"] for r in range(4) for p in vapo.step_prompts(rows, step, cfg, r)]
        assert len(set(ps)) == len(ps)  # no prompt twice within a step
        seen += ps
    for epoch in range(4):  # every prompt once an epoch: the frequencies cannot drift
        assert sorted(seen[48 * epoch:48 * (epoch + 1)]) == sorted(r["prompt"] for r in rows)
    off = dataclasses.replace(cfg, dynamic_sampling=False)  # the other algorithms' stream is as it was
    assert vapo.step_prompts(rows, 5, off) == data.prompt_batch(rows, 5, 4, cfg.seed)


def test_the_paper_preset_in_the_papers_units_and_verls_unstated_choices():
    """#31.2, 6, 7: DAPO's overlong cache is the last 20% of the budget (it began at half of it), the paper's
    ~5,000 steps are gradient updates, and where the paper is silent the preset takes verl's defaults."""
    import config
    parse = lambda argv: config.config_from_args(vapo.Config, vapo.ALGORITHMS, argv)[0]  # noqa: E731
    paper = parse(["--preset", "paper"])
    assert paper.overlong_cache == round(0.2 * paper.max_new_tokens) == 1638
    assert vapo.overlong_penalty(6000, paper.max_new_tokens, paper.overlong_cache) == 0.0  # was 0.54
    updates = paper.steps * paper.batch_size // paper.mini_batch_size * paper.ppo_epochs
    assert paper.batch_size // paper.mini_batch_size == 16 and 5000 <= updates < 5000 + 16
    assert paper.whiten_advantages and paper.value_clip == 0.5
    longer = parse(["--preset", "paper", "--max-new-tokens", "20480"])
    assert longer.overlong_cache == 4096  # DAPO's own: the cache scales with the budget
    for name in ("demo", "long"):  # the built-in presets: the penalty starts after the longest correct response
        cfg = parse(["--preset", name])
        assert cfg.max_new_tokens - cfg.overlong_cache == {"demo": 112, "long": 416}[name]


def test_kl_coef_keeps_a_frozen_initial_policy_and_logs_the_kl(tiny_model_dir, tmp_path):
    """--kl-coef (a lever of the long-chain study, off by default as in the paper): the KL to the initial weights
    is 0 on the first mini-batch and grows once the policy has moved; with 0 no reference exists."""
    cfg = tiny_config(tiny_model_dir, tmp_path / "kl", kl_coef=0.5, steps=2, **NO_VIEWS)
    records = [r for r in read_metrics(vapo.train(cfg)) if "kl_ref" in r]
    assert len(records) == 2 and 0 < records[-1]["kl_ref"] < 1
    assert "kl_ref" not in read_metrics(vapo.train(tiny_config(tiny_model_dir, tmp_path / "off", **NO_VIEWS)))[-1]
    with pytest.raises(ValueError, match="--kl-coef"):
        Config(kl_coef=-1.0).validate()


def test_the_runs_random_streams_are_named_in_one_place():
    """config.STREAMS is where every seed of a run comes from: no module of the trainer adds an offset of its own
    to the seed, and the streams that must not share draws do not (the RL steps' prompts against value
    pretraining's; the evaluation's sampling against the trainer's)."""
    import re
    for name in ("vapo.py", "machinery/run.py", "machinery/views.py", "machinery/checkpoints.py", "rollout.py",
                 "machinery/engines.py", "machinery/data.py", "machinery/models.py", "config.py"):
        source = open(os.path.join(ROOT, name)).read()
        assert not re.search(r"seed\s*\+\s*\d", source), name
    streams = config.STREAMS
    assert streams["rl_prompts"] != streams["pretrain_prompts"] and streams["evaluation"] != streams["trainer"]
    from machinery import task
    cfg = Config(prompts_per_step=4, value_pretrain_steps=1)
    rows = task.make_dataset(200, config.stream(cfg.seed, "builtin_rows"), 1, 10, split="train")
    rl = vapo.step_prompts(rows, 0, cfg)
    pretrain = data.prompt_batch(rows, 0, cfg.prompts_per_rollout, config.stream(cfg.seed, "pretrain_prompts"))
    assert [p["expr"] for p in rl] != [p["expr"] for p in pretrain]
