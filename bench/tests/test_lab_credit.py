"""bench/lab_credit.py (docs/lab.md, experiment 8): its planned runs are vapo.py command lines that set what their
labels say, the crossing points on hand-made curves, the report on made-up run folders, and the calibration at smoke
size on the shipped long-chain models."""
import json
import math
import os
import shutil
import sys
from types import SimpleNamespace

import pytest

import vapo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, os.path.join(ROOT, "bench"))
import lab  # noqa: E402
import lab_credit  # noqa: E402
import common  # noqa: E402


def test_every_planned_run_is_a_vapo_py_run_of_its_arm(tmp_path):
    checks = {"V* lambda 0": lambda c: c.critic_oracle == "exact" and c.lam_policy_fixed == 0 and not c.length_adaptive
              and not c.positive_nll and c.actor_lr == float(lab_credit.ORACLE_LR),
              "V* lambda 1": lambda c: c.lam_policy_fixed == 1 and not c.length_adaptive,
              "MC 16 lambda 0": lambda c: c.critic_oracle == "mc:16",
              "V* lambda 0 + NLL": lambda c: c.critic_oracle == "exact" and c.positive_nll and c.mu == 3,
              "GRPO token-level": lambda c: c.group_advantage and c.token_level_loss and c.critic_oracle is None,
              "NLL only": lambda c: not c.policy_gradient and c.positive_nll,
              "VAPO mu 0 (learned critic)": lambda c: not c.group_advantage and not c.positive_nll,
              "V* lambda 0, lr 5e-6": lambda c: c.actor_lr == 5e-6}
    seen = set()
    for name, seeds in (("credit", [0, 1]), ("credit-hard", [0]), ("credit-pilot", [0])):
        for label, folder, options in lab_credit.runs(name, seeds, str(tmp_path)):
            cfg, _, _ = vapo.config_from_args(options)
            assert cfg.output_dir == folder and cfg.steps == 40 and cfg.dataset == "builtin-long"
            assert (cfg.train_steps == "21-40") == (name == "credit-hard")
            if label in checks:
                assert checks[label](cfg), label
                seen.add(label)
    assert seen == set(checks)
    assert lab_credit.ORACLES == ["V* lambda 0", "V* preset lambda", "V* lambda 1", "MC 4 lambda 0", "MC 16 lambda 0",
                                  "V* + noise 0.3 lambda 0"]


def test_the_crossing_is_where_the_curve_reaches_the_level():
    points = [(0.9, 0.30), (0.5, 0.10), (0.7, 0.20)]
    assert lab_credit.crossing(points, 0.15) == pytest.approx(0.6)  # between (0.5, 0.10) and (0.7, 0.20)
    assert lab_credit.crossing(points, 0.05) == 0.5  # above the level everywhere: the lowest credit
    assert math.isnan(lab_credit.crossing(points, 0.4))  # never reached
    per_seed = [{"measures": {"crossing|GRPO token-level": 0.6, "crossing|NLL only": c}} for c in (math.nan, 0.95)]
    per_seed.append({"measures": {}})  # a seed without every oracle: no curve
    assert lab_credit.crossing_notes(per_seed) == [
        "the oracles' curve reaches GRPO token-level's gain on 2 of 2 seeds (at credit 0.60, 0.60)",
        "the oracles' curve reaches NLL only's gain on 1 of 2 seeds (at credit 0.95)"]


def write_run(folder, start: float, end: float, corr: float, steps: int = 3):
    os.makedirs(folder, exist_ok=True)
    records = [{"step": 0, "eval/acc_avg@2": start, "eval/acc_greedy": start, "eval/pass@2": start}]
    records += [{"step": s, "train_acc": 0.5, "credit/corr": corr, "credit/first_error": -1.0, "credit/fail_share": 0.1,
                 "credit/step_kl": 0.01, "groups_all_same": 0.3} for s in range(1, steps + 1)]
    records.append({"step": steps, "eval/acc_avg@2": end, "eval/acc_greedy": end, "eval/pass@2": end})
    with open(os.path.join(folder, "metrics.jsonl"), "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"steps": steps}, fh)  # common.finished: the last step's evaluation is there


def test_the_report_judges_made_up_runs(tmp_path):
    """Runs whose gains follow their credit (gain = credit / 4), GRPO at credit 0.5 and gain 0.1, NLL only at 0.2:
    the oracle beats GRPO, the crossings come out where the line says, and the figure is drawn."""
    credit = {"V* lambda 0": 1.0, "V* preset lambda": 0.9, "V* lambda 1": 0.6, "MC 4 lambda 0": 0.8,
              "MC 16 lambda 0": 0.85, "V* + noise 0.3 lambda 0": 0.7, "V* lambda 0 + NLL": 1.0, "GRPO token-level": 0.5,
              "NLL only": 0.3, "VAPO mu 0 (learned critic)": 0.52, "VAPO": 0.55}
    gains = {a: c / 4 for a, c in credit.items()} | {"NLL only": 0.2, "GRPO token-level": 0.1}
    for seed, noise in ((0, 0.0), (1, 0.004)):
        for label, folder, _ in lab_credit.runs("credit", [seed], str(tmp_path)):
            write_run(folder, 0.2, 0.2 + gains[label] + noise, credit[label])
    summary = lab_credit.report("credit", [0, 1], str(tmp_path))
    verdicts = dict(summary["verdicts"])
    assert verdicts["1. V* at lambda 0 (no NLL) gains more avg@2 than token-level GRPO"] == "confirmed"
    crossing = summary["mean_se"]["crossing|GRPO token-level"][0]
    assert crossing == pytest.approx(0.6)  # every oracle gains more than GRPO: the crossing is the lowest oracle's
    assert summary["mean_se"]["crossing|NLL only"][0] == pytest.approx(0.8, abs=0.02)  # gain 0.2 = 0.8 / 4
    assert (tmp_path / "credit.png").exists()


def test_the_calibration_at_smoke_size(tmp_path):
    """Every critic of the calibration is measured; V*'s own advantages at lambda 0 correlate 1 with A*; its detection
    lag is 0 and late 3's is 3."""
    args = SimpleNamespace(seeds=[0], report=False, prompts=4, group=2, pretrain_steps=1)
    summary = lab_credit.run_calibration(args, str(tmp_path))
    s = summary["mean_se"]
    assert all(f"{name}|corr" in s for name in lab_credit.CALIBRATION_CRITICS)
    assert s["V* lambda 0|corr"][0] == pytest.approx(1.0, abs=1e-6)
    if s["V* lambda 0|lag_median"][0] == s["V* lambda 0|lag_median"][0]:  # (a seed with a wrong response)
        assert s["V* lambda 0|lag_median"][0] == 0 and s["late 3|lag_median"][0] == 3
    assert "smoke run" in summary["note"] and (tmp_path / "credit-calibration.png").exists()
    assert lab.PREDICTIONS["credit-calibration"]


def test_one_seed_with_an_unfinished_arm_is_reported_without_verdicts(tmp_path):
    """A seed whose runs are partly finished: the finished arms measured, the unfinished named in the note, and no
    verdict (one seed has no standard error, so every difference would look separated)."""
    for label, folder, _ in lab_credit.runs("credit", [0], str(tmp_path)):
        if label != "V* lambda 1":
            write_run(folder, 0.2, 0.3, 0.5)
    summary = lab_credit.report("credit", [0], str(tmp_path))
    assert "V* lambda 1" in summary["note"] and "one seed" in summary["note"]
    assert "V* lambda 0|avg@2_gain" in summary["mean_se"] and "V* lambda 1|avg@2_gain" not in summary["mean_se"]
    assert {v for _, v in summary["verdicts"]} == {"one seed", "not judged"}
    assert lab_credit.report("credit", [1], str(tmp_path)) is None  # no run of seed 1 finished


def test_the_curves_oracle_run_is_made_from_the_pilots_where_only_the_evaluation_differs(tmp_path, monkeypatch):
    """from_pilot: the pilot's run at the picked lr (options equal but for the evaluation's size) gives the curve's
    V* lambda 0 run: the pilot's RL records, the start's evaluation from a finished sibling arm, the end's made from
    the pilot's final policy with the curve's config; a pilot with another option is trained instead."""
    import dataclasses
    out, pilot_out = tmp_path / "credit", tmp_path / "credit-pilot"
    (label, pilot, options), = [r for r in lab_credit.runs("credit-pilot", [0], str(pilot_out))
                                if r[0] == f"V* lambda 0, lr {lab_credit.ORACLE_LR}"]
    write_run(pilot, 0.2, 0.45, 1.0, steps=40)
    pilot_cfg, _, _ = vapo.config_from_args(options)
    with open(os.path.join(pilot, "config.json"), "w") as fh:
        json.dump(dataclasses.asdict(pilot_cfg), fh)
    grpo = next(f for arm, f, _ in lab_credit.runs("credit", [0], str(out)) if arm == "GRPO token-level")
    write_run(grpo, 0.25, 0.3, 0.4)
    seen = []
    monkeypatch.setattr(lab_credit, "evaluate_policy", lambda cfg, policy_dir: (
        seen.append((cfg.eval_prompts, cfg.eval_sampled_prompts, policy_dir)),
        {"eval/acc_avg@2": 0.5, "eval/acc_greedy": 0.6, "eval/pass@2": 0.7})[1])
    assert lab_credit.from_pilot(0, str(out))
    folder = next(f for arm, f, _ in lab_credit.runs("credit", [0], str(out)) if arm == "V* lambda 0")
    assert seen == [(400, 200, os.path.join(pilot, "checkpoint", "policy"))]  # the end only: the start is GRPO's
    records = common.read_records(folder)
    assert records[0] == {"step": 0, "eval/acc_avg@2": 0.25, "eval/acc_greedy": 0.25, "eval/pass@2": 0.25}
    assert records[-1] == {"step": 40, "eval/acc_avg@2": 0.5, "eval/acc_greedy": 0.6, "eval/pass@2": 0.7}
    assert [r["step"] for r in records[1:-1]] == list(range(1, 41)) and common.finished(folder)
    assert common.read_json(os.path.join(folder, "config.json"))["eval_prompts"] == 400
    assert common.read_json(os.path.join(folder, "provenance.json"))["made_from"] == pilot
    assert not lab_credit.from_pilot(0, str(out))  # made already
    with open(os.path.join(pilot, "config.json"), "w") as fh:
        json.dump(dataclasses.asdict(pilot_cfg) | {"actor_lr": 1e-3}, fh)
    assert not lab_credit.from_pilot(1, str(out))  # no pilot run of seed 1
    shutil.rmtree(folder)
    assert not lab_credit.from_pilot(0, str(out))  # another lr: trained instead


def test_a_kept_record_stands_for_run_folders_that_are_gone(tmp_path, monkeypatch):
    """Seed 0 kept as a record (its run folders gone), seed 1 with two arms run: the report measures both seeds, a
    difference measured on one seed only gets no verdict, and --run runs only what no record has measured."""
    kept, out = tmp_path / "kept", tmp_path / "out"
    gains = {"V* lambda 0": 0.30, "GRPO token-level": 0.10}
    for label, folder, _ in lab_credit.runs("credit", [0], str(tmp_path / "gone")):
        write_run(folder, 0.2, 0.2 + gains.get(label, 0.2), 0.5)
    lab_credit.measure("credit", 0, str(tmp_path / "gone"))  # writes gone/credit-s0.json
    kept.mkdir()
    shutil.copy(tmp_path / "gone" / "credit-s0.json", kept / "credit-s0.json")
    shutil.rmtree(tmp_path / "gone")
    for label, folder, _ in lab_credit.runs("credit", [1], str(out)):
        if label in gains:
            write_run(folder, 0.2, 0.2 + gains[label] + 0.01, 0.5)
    summary = lab_credit.report("credit", [0, 1], str(out), str(kept))
    assert summary["seeds"] == [0, 1]
    verdicts = dict(summary["verdicts"])
    assert verdicts["1. V* at lambda 0 (no NLL) gains more avg@2 than token-level GRPO"] == "confirmed"
    assert verdicts["2. ... and more than the NLL alone (self-imitation)"] == "one seed"  # NLL only: seed 0 only
    assert summary["mean_se"]["NLL only|avg@2_gain"] == [pytest.approx(0.2), 0.0]
    assert "crossing|GRPO token-level" in summary["mean_se"]  # seed 0 has every oracle; seed 1 has no curve
    record = json.loads((out / "credit-s0.json").read_text())  # the kept record, written where the runs go
    assert record["sources"]["NLL only"]["run"].endswith("nll-only-s0") and record["unfinished"] == []
    seed1 = json.loads((out / "credit-s1.json").read_text())
    assert set(seed1["curves"]) == set(gains) and len(seed1["unfinished"]) == len(lab_credit.CURVE_ARMS) - 2
    ran = []
    monkeypatch.setattr(common, "run_vapo", lambda label, args, folder: ran.append(folder))
    lab_credit.run("credit", [0, 1], str(out), 1, str(kept))
    assert len(ran) == len(lab_credit.CURVE_ARMS) - 2 and all(f.endswith("-s1") for f in ran)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "credit-s2.json").write_text(json.dumps({"seed": 3}))
    with pytest.raises(ValueError, match="not a per-seed record of seed 2"):
        lab_credit.measure("credit", 2, str(out), str(bad))


def test_the_table_gives_each_arm_over_the_seeds_that_ran_it():
    per_seed = [{"seed": s, "curves": {"V* lambda 0": {}, **({"NLL only": {}} if s == 0 else {})},
                 "measures": {"V* lambda 0|corr": 1.0, "V* lambda 0|avg@2_gain": g, "NLL only|avg@2_gain": 0.3}}
                for s, g in ((0, 0.2), (1, 0.3))]
    rows = lab_credit.table("credit", per_seed).splitlines()
    assert rows[2].startswith("| V\\* lambda 0 (0,1) | 1.000 +- 0.000 | - | - | +25.0 +- 5.0 |")
    assert rows[3].startswith("| NLL only (0) | - | - | - | +30.0 | -") and len(rows) == 4


def test_arms_runs_only_the_named_arms_and_names_an_unknown_one(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(common, "run_vapo", lambda label, args, folder: ran.append(folder))
    lab_credit.run("credit", [3, 4], str(tmp_path), 1, arms=["NLL only", "GRPO token-level"])
    assert sorted(os.path.basename(f) for f in ran) == ["grpo-token-level-s3", "grpo-token-level-s4",
                                                        "nll-only-s3", "nll-only-s4"]
    with pytest.raises(ValueError, match="credit-hard has no arm 'MC 4 lambda 0'; its arms: 'V\\* lambda 0'"):
        lab_credit.arm_labels("credit-hard", ["MC 4 lambda 0"])
    with pytest.raises(SystemExit):
        lab.main(["credit", "--arms", "NLL", "--seeds", "3"])
    assert "credit has no arm 'NLL'" in capsys.readouterr().err
    lab.main(["credit", "--arms", "V* lambda 1", "--seeds", "3", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert printed.count("python vapo.py") == 1 and "--lam-policy-fixed 1" in printed


def test_the_hard_rows_report_reads_the_kept_never_solved_set_and_each_runs_long_chain_errors(tmp_path, monkeypatch):
    """credit-hard on made-up runs: the never-solved set comes from the kept folder (no base model is sampled), each
    run's pass@8 and long-chain errors from its cached measures; the table has them as levels (no sign), the figure
    is drawn, and the pass@8 prediction is judged on them."""
    kept, out = tmp_path / "kept", tmp_path / "out"
    kept.mkdir()
    problems = [{"prompt": "Compute: 1 a+1\n", "answer": "2", "n_steps": 21}]
    (kept / "credit-hard-never-solved.json").write_text(json.dumps({"problems": problems}))
    monkeypatch.setattr(lab_credit, "load_policy", lambda *a, **k: pytest.fail("nothing is sampled here"))
    passes = {"V* lambda 0": 0.5, "GRPO token-level": 0.25, "NLL only": 0.3, "VAPO mu 0 (learned critic)": 0.3}
    for seed in (0, 1):
        for label, folder, _ in lab_credit.runs("credit-hard", [seed], str(out)):
            write_run(folder, 0.2, 0.3, 0.5)
            with open(os.path.join(folder, "pass8-never-solved.json"), "w") as fh:
                json.dump({"pass": passes[label] + 0.01 * seed}, fh)
            with open(os.path.join(folder, "long-chain-errors.json"), "w") as fh:
                json.dump({"accuracy": 0.4, "misreads": 0.012, "first_misread": 0.25, "habit": 0.1}, fh)
    summary = lab_credit.report("credit-hard", [0, 1], str(out), str(kept))
    assert lab_credit.never_solved(str(out)) == problems  # copied into out's cache
    verdicts = [v for text, v in summary["verdicts"] if text.startswith("3.")]
    assert verdicts == ["confirmed"]
    table = (out / "credit-hard.md").read_text().splitlines()
    assert "pass@8, never solved" in table[0] and "misreads, % of lines, 21-40" in table[0]
    assert "| 50.5 +- 0.5 | 40.0 +- 0.0 | 1.20 +- 0.00 | 25.0 +- 0.0 |" in table[2]  # V* lambda 0: levels, unsigned
    assert table[2].startswith("| V\\* lambda 0 (0,1) | 0.500 +- 0.000 | -1.00 +- 0.00 | 0.10 +- 0.00 | +10.0 +- 0.0")
    assert (out / "credit-hard.png").stat().st_size > 0


def test_long_chain_errors_reads_a_policy_once(tmp_path, monkeypatch):
    """A shipped long-chain policy as a run's checkpoint: accuracy and rates are shares, the count is the one asked
    for, and the second call reads the cache without loading the policy."""
    folder = tmp_path / "run"
    shutil.copytree(common.folder_of("builtin-long"), folder / "checkpoint" / "policy")
    first = lab_credit.long_chain_errors(str(folder), problems=2)
    assert first["problems"] == 2 and all(0 <= first[k] <= 1 for k in ("accuracy", "misreads", "first_misread", "habit"))
    monkeypatch.setattr(lab_credit, "load_policy", lambda *a, **k: pytest.fail("read from the cache"))
    assert lab_credit.long_chain_errors(str(folder), problems=2) == first
