"""bench/critic_probe.py: continuations start exactly where the response was cut (greedy continuations of a greedy
response give it back, so every Monte-Carlo value is the response's own reward), the figures on a sampled probe, and
the refusals."""
import json
import math
import os
import shutil
import sys

import pytest
import torch

import vapo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import critic_probe  # noqa: E402
import common  # noqa: E402
from machinery.models import load_policy, value_model_from_policy  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A vapo.py run folder by hand: the demo's config, the shipped base as its policy, a critic made from it (its
    head zero) with a head nudged so that V varies."""
    folder = tmp_path_factory.mktemp("run")
    cfg = vapo.Config(output_dir=str(folder))
    common.write_json(os.path.join(folder, "config.json"), __import__("dataclasses").asdict(cfg))
    policy_dir = os.path.join(folder, "checkpoint", "policy")
    shutil.copytree(common.folder_of("builtin"), policy_dir)
    policy, _ = load_policy(policy_dir, dtype=torch.float32)
    critic = value_model_from_policy(policy)
    with torch.no_grad():
        torch.manual_seed(0)
        critic.score.weight.normal_(0, 0.05)
    critic.save_pretrained(os.path.join(folder, "checkpoint", "critic"))
    return str(folder)


def test_greedy_continuations_give_the_response_back(run_dir):
    result = critic_probe.probe(run_dir, prompts=6, points=4, continuations=2, temperature=0.0)
    states = result["states"]
    assert len(states) > 6 and any(s["t"] > 0 for s in states)
    for s in states:  # the continuation from t reproduces the greedy response: its reward, every time
        assert s["rewards"] == [s["reward"]] * 2 and s["M"] == s["reward"] and s["noise"] == 0
    assert all(s["V"] == s["V"] for s in states)  # the critic read at every probed state
    _, policy, _, tokenizer = critic_probe.load_run(run_dir)
    engine = critic_probe.HFEngine(policy, tokenizer, max_new_tokens=40, temperature=0.0)
    rollout = engine.generate(["3+4=?", "2*5+1=?"], n=1)
    prefixes, rests, budgets = [], [], []
    for b in range(2):
        prompt = rollout.prompt_ids[b][rollout.prompt_mask[b].bool()].tolist()
        response = rollout.response_ids[b, :int(rollout.lengths[b])].tolist()
        for t in (0, 1, len(response) // 2):
            prefixes.append(prompt + response[:t])
            rests.append(response[t:])
            budgets.append(40 - t)  # the response's own budget left (it may have run to 40 tokens without an EOS)
    got = critic_probe.continue_from(engine, prefixes, budgets, 2, 0.0, 1.0, 0)
    assert all(cs == [rest, rest] for cs, rest in zip(got, rests))  # token for token, at every cut


def test_a_sampled_probe_reports_its_figures(run_dir, tmp_path):
    out, figure = tmp_path / "probe.json", tmp_path / "probe.png"
    result = critic_probe.main([run_dir, "--prompts", "8", "--points", "3", "--continuations", "4", "--out", str(out),
                                "--figure", str(figure)])
    s = result["summary"]
    assert {"ev_critic", "ev_critic_denoised", "ev_prompt_value", "segment_credit", "by_point"} <= set(s)
    assert all(-1 <= st["M"] <= 1 for st in result["states"])
    assert set(s["by_point"]) <= {"0/3", "1/3", "2/3"} and "0/3" in s["by_point"]
    assert math.isnan(s["run|explained_variance"])  # a folder with no RL steps: its gauges not measured
    assert json.loads(out.read_text())["summary"]["states"] == len(result["states"]) and figure.exists()


def test_the_explained_variance_takes_the_noise_out():
    target, estimate = [0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0]
    assert critic_probe.explained(target, estimate, [0.0] * 4) == (1.0, 1.0)
    raw, clean = critic_probe.explained([0.0, 1.0, 0.5, 0.5], [0.0, 1.0, 0.25, 0.75], [0.01] * 4)
    assert raw == pytest.approx(1 - 0.03125 / 0.125) and clean == pytest.approx(1 - (0.03125 - 0.01) / (0.125 - 0.01))
    assert critic_probe.probe_points(10, 4) == [0, 2, 5, 7] and critic_probe.probe_points(2, 4) == [0, 1]


def test_the_probe_refuses_what_it_cannot_measure(tmp_path, run_dir):
    with pytest.raises(SystemExit, match="no config.json"):
        critic_probe.probe(str(tmp_path))
    with pytest.raises(SystemExit, match="--continuations"):
        critic_probe.probe(run_dir, continuations=1)
