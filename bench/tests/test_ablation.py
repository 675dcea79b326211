"""bench/ablation.py --quick: every row of the paper's ablation table still runs (2 steps each, one seed), and the
sweep writes its tables, JSON and plots: the four algorithms and one ablation in the long chains' regime, VAPO, the
other six ablations and the six controls in the demo's, so that the two tests together run all seventeen rows. Slow
(a few minutes each on 2 cores); CI runs them."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


LONG_ROWS = ["PPO", "GRPO", "DAPO", "VAPO", "w/o Clip-Higher"]  # run by the long regime's test below


@pytest.mark.slow
def test_the_ablations_and_the_controls_run_in_the_demo_regime(tmp_path):
    """--quick in the demo's regime, in one sweep (one VAPO run, whose pretrained critic the rows that share it
    take): VAPO, the six ablations that the long regime's test does not run, and the six controls (not in the
    paper). The rows that switch one technique off share VAPO's pretrained critic (w/o Value-Pretraining starts from
    the preset's), every row stops at the same budget of samples, and the tables have a line for each row.
    Each control is the row it modifies with one change, read from the runs' config.json: NLL only has no policy
    gradient and no critic; GRPO + NLL and PPO + NLL add the NLL at the preset's mu; VAPO mu 0.1 shares VAPO's
    pretrained critic; DAPO at equal updates takes the budget's steps and more samples than the budget; GRPO
    token-level changes only the loss's aggregation. The table that tells VAPO from self-imitation has a line for
    each row."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import ablation
    ablations = [r for r, _, _ in ablation.ROWS if (r not in LONG_ROWS or r == "VAPO") and r not in ablation.CONTROLS]
    assert len(ablations) == 7 and set(ablations) | set(LONG_ROWS) | set(ablation.CONTROLS) == {
        r for r, _, _ in ablation.ROWS}
    names = ablations + ablation.CONTROLS  # ROWS' order, which the sweep keeps
    out = tmp_path / "ablation"
    proc = subprocess.run([sys.executable, "bench/ablation.py", "--quick", "--out", str(out), "--rows", *names],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.load(open(out / "ablation.json"))
    rows = {r["row"]: r for r in result["rows"]}
    assert list(rows) == names and all(r["seeds"] == 1 for r in rows.values())
    assert all(r["samples"] >= result["budget"] for r in rows.values())  # each stopped at the same budget

    def config(row):
        return json.load(open(out / f"{ablation.slug(row)}-s0" / "config.json"))

    assert config("w/o Decoupled-GAE")["value_model"].endswith(os.path.join("vapo-s0", "critic_pretrained"))
    alone = config("w/o Value-Pretraining")
    assert not alone["value_pretraining"] and "critic_pretrained" not in str(alone["value_model"])
    # five tables (results, diagnostics, VAPO or self-imitation, every run, time to learn), each a header, a
    # separator and the 13 rows (one seed each: the table of every run has a line per row too)
    report = (out / "ablation.md").read_text()
    assert report.count("\n|") == 5 * (2 + len(names)) and (out / "ablation.png").exists()
    assert rows["VAPO"]["diagnostics"]["lam_policy"] is not None
    # the controls
    raft, grpo_nll, ppo_nll = config("NLL only (online RAFT)"), config("GRPO + NLL"), config("PPO + NLL")
    assert not raft["policy_gradient"] and raft["positive_nll"] and raft["group_advantage"]
    assert grpo_nll["positive_nll"] and grpo_nll["policy_gradient"] and grpo_nll["mu"] == config("VAPO")["mu"]
    assert ppo_nll["positive_nll"] and not ppo_nll["value_pretraining"] and not ppo_nll["decoupled_gae"]
    assert config("VAPO mu 0.1")["mu"] == 0.1
    assert config("VAPO mu 0.1")["value_model"].endswith(os.path.join("vapo-s0", "critic_pretrained"))
    dapo = config("DAPO equal updates")
    assert dapo["max_samples"] is None and dapo["dynamic_sampling"]
    assert rows["DAPO equal updates"]["samples"] >= result["budget"]
    assert config("GRPO token-level")["token_level_loss"] and not config("GRPO token-level")["positive_nll"]
    table = report.split("VAPO or self-imitation?")[1].split("\n\n")[1]
    assert [line.split(" | ")[0][2:] for line in table.splitlines()[2:]] == names
    assert "NLL mu 0.1 alone: no policy gradient" in table and "NLL mu 3" not in table  # the demo preset: mu 0.1


@pytest.mark.slow
def test_every_row_runs_in_the_long_regime(tmp_path):
    """--preset long --quick, the four algorithms and one row that shares VAPO's pretrained critic (the demo
    regime's test runs the other six): every row evaluated at the same sample counts (0, 8, 16:
    --eval-every-samples), every final critic judged on the same base-model responses (GRPO and DAPO have none),
    the views of VAPO, PPO and GRPO side by side, and every seed's figures in the JSON."""
    out = tmp_path / "ablation-long"
    proc = subprocess.run([sys.executable, "bench/ablation.py", "--quick", "--preset", "long", "--out", str(out),
                           "--rows", *LONG_ROWS], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.load(open(out / "ablation.json"))
    rows = {r["row"]: r for r in result["rows"]}
    assert len(rows) == 5 and result["preset"] == "long" and result["budget"] == 16
    shared = json.load(open(out / "w-o-clip-higher-s0" / "config.json"))
    assert shared["value_model"].endswith(os.path.join("vapo-s0", "critic_pretrained"))
    for name in ("VAPO", "PPO", "GRPO", "w/o Clip-Higher"):
        (seed,) = rows[name]["per_seed"]
        assert [e["samples"] for e in seed["eval_curve"]] == [0, 8, 16], name
        assert set(seed["bands"]) == {"1-10", "11-20", "21-30", "31-40"}
    config = json.load(open(out / "vapo-s0" / "config.json"))
    assert config["model"] == "builtin-long" and config["value_model"] == "builtin-long-rm"
    assert rows["GRPO"]["per_seed"][0]["critic_after_rl"] is None and "critic_after_rl" not in rows["GRPO"]
    judged = rows["PPO"]["per_seed"][0]["critic_after_rl"]
    assert judged["lambda"] == "0.95" and rows["VAPO"]["per_seed"][0]["critic_after_rl"]["lambda"] == "adaptive"
    assert len(judged["ev_by_fifth"]) == 5 and judged["credit"] > 0
    assert any(k.startswith("reward model") for k in result["critics_at_start"])
    report = (out / "ablation.md").read_text()
    assert "credit at decisive tokens" in report and (out / "views.png").exists() and (out / "ablation.png").exists()
    (ppo_line,) = [line for line in report.splitlines() if line.startswith("| PPO (0) |")]  # every run on a line
    assert ppo_line.split(" | ")[1].count("->") == 2 and ppo_line.count("|") == 9
    (grpo_line,) = [line for line in report.splitlines() if line.startswith("| GRPO (0) |")]
    assert grpo_line.endswith("| no critic |")


def test_the_verdict_on_the_papers_ordering_weighs_the_seeds_spread():
    """VAPO above a row by more than twice the standard error of the difference: reproduced; below by as much:
    reversed; else not separated. One seed is no verdict."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import ablation
    vapo = {"row": "VAPO", "seeds": 3, "avg_final": (0.30, 0.02)}
    assert ablation.verdict({"row": "PPO", "seeds": 3, "avg_final": (0.25, 0.02)}, vapo).startswith("reproduced")
    assert ablation.verdict({"row": "PPO", "seeds": 5, "avg_final": (0.36, 0.02)}, vapo).startswith("reversed")
    assert ablation.verdict({"row": "PPO", "seeds": 3, "avg_final": (0.28, 0.05)}, vapo).startswith("not separated")
    assert ablation.verdict({"row": "PPO", "seeds": 1, "avg_final": (0.10, 0.0)}, vapo) == "-"
    assert ablation.verdict(vapo, vapo) == "-"


def test_every_run_gets_a_line_with_its_curve():
    """seed_table: a run's evaluations in order, its judged policy and critic; a run of another trainer (TRL's)
    gets its curve, named by its folder."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import ablation
    curve = [{"samples": 0, "greedy": 0.62, "avg@2": 0.195}, {"samples": 2560, "greedy": 0.641, "avg@2": 0.48}]
    policy = {"greedy": {"lookup_rate": 0.082, "first_misread": 0.35}, "sampled": {"habit_rate": 0.087}}
    rows = [{"row": "VAPO", "per_seed": [{"run": "vapo-s3", "eval_curve": curve, "policy_after_rl": policy,
                                          "critic_after_rl": {"explained_variance": 0.06, "credit": 1.1},
                                          "clip_frac_low": 0.0007, "clip_frac_high": 0.0001}]},
            {"row": "GRPO"}]  # not run: no line
    lines = ablation.seed_table(rows, {"TRL": [("runs/trl-s1/", {"eval_curve": curve})]}).splitlines()
    assert lines[2] == "| VAPO (3) | 62.0 -> 64.1 | 19.5 -> 48.0 | 8.2 | 35.0 | 8.7 | 0.07 / 0.01 | 0.06 / 1.10 |"
    assert lines[3] == "| TRL (trl-s1) | 62.0 -> 64.1 | 19.5 -> 48.0 | | | | | |" and len(lines) == 4


def test_pass_at_k_of_a_run_made_before_it_was_logged_is_read_off_its_checkpoint(tmp_path):
    """A finished run whose final evaluation lacks pass@k (made before it was logged): its final evaluation made
    again from the checkpoint draws the same responses (the evaluation's seed is fixed), so avg@k and greedy come
    out as logged and pass@k is the one the run would have logged; a run whose logged figures do not come out the
    same gets none."""
    import vapo
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import ablation
    cfg = vapo.Config(steps=2, prompts_per_step=4, samples_per_prompt=2, mini_batch_size=4, micro_batch_size=2,
                      max_new_tokens=64, value_pretrain_steps=1, eval_every=0, eval_prompts=16, eval_samples=2,
                      save_every=2, value_pretrain_ev=None, eval_batch_size=None, truncated_reward="graded",
                      output_dir=str(tmp_path / "run")).validate()
    run_dir = vapo.train(cfg)  # the shipped demo model: some right, some wrong
    path = os.path.join(run_dir, "metrics.jsonl")
    records = [json.loads(line) for line in open(path)]
    logged = records[-1]["eval/pass@2"]
    assert 0 < records[-1]["eval/acc_avg@2"] < logged < 1  # a pass@k that is not avg@k
    with open(path, "w") as fh:  # as a run made before pass@k was logged
        fh.writelines(json.dumps({k: v for k, v in r.items() if not k.startswith("eval/pass@")}) + "\n"
                      for r in records)
    assert ablation.pass_again(run_dir) == {"pass_final": logged, "same_responses": True}
    records[-1]["eval/acc_avg@2"] += 0.25  # a record that the checkpoint does not reproduce
    with open(path, "w") as fh:
        fh.writelines(json.dumps({k: v for k, v in r.items() if not k.startswith("eval/pass@")}) + "\n"
                      for r in records)
    assert ablation.pass_again(run_dir) is None


def test_each_algorithm_family_runs_at_its_own_actor_lr(monkeypatch, tmp_path):
    """A rate picked for an algorithm (ACTOR_LR) reaches its row and the rows that modify it (FAMILY), in folders
    that name it, and no other row: VAPO and the rows sharing its critic keep the preset's."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import ablation
    monkeypatch.setitem(ablation.ACTOR_LR, "long", {"PPO": "5e-6"})
    sweep = ["--preset", "long", "--steps", "40", "--max-samples", "2560"]
    opts = dict((r, o) for r, _, o in ablation.ROWS)

    def run(row):
        args = ablation.row_args(row, opts[row], 0, str(tmp_path), sweep)
        lr = args[args.index("--actor-lr") + 1] if "--actor-lr" in args else None
        return lr, os.path.basename(args[args.index("--output-dir") + 1])

    assert run("PPO") == ("5e-6", "ppo-lr5e-6-s0")
    assert run("PPO + NLL") == ("5e-6", "ppo-nll-lr5e-6-s0")
    assert run("GRPO + NLL") == (None, "grpo-nll-s0")
    assert run("VAPO") == (None, "vapo-s0")
    shared = ablation.row_args("w/o Decoupled-GAE", opts["w/o Decoupled-GAE"], 1, str(tmp_path), sweep)
    assert shared[shared.index("--value-model") + 1] == os.path.join(str(tmp_path), "vapo-s1", "critic_pretrained")
    assert "--actor-lr" not in shared
