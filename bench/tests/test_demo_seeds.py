"""bench/seeds.py demo reads run folders (with bench/common.py, which every sweep shares) and counts what
learned: checked on run folders written here by hand (the benchmark itself runs the demo for minutes per seed; see
docs/results.md for its figures)."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, os.path.join(ROOT, "bench"))
import common  # noqa: E402
import seeds  # noqa: E402


def fake_run(folder, steps, base, final, ev=0.2, finished=True):
    """A run folder as vapo.py writes it: config.json, and metrics.jsonl with value pretraining, RL steps and
    evaluations at step 0 and (if finished) at the last step. base/final: (avg@4, greedy) accuracy."""
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({"steps": steps}, fh)
    evals = [(0, base)] + ([(steps, final)] if finished else [])
    records = [{"value_pretrain_step": 1, "explained_variance": ev, "value_loss": 0.1}]
    records += [{"step": s, "train_acc": 0.5, "explained_variance": ev, "clip_frac": 0.01, "approx_kl": 1e-3,
                 "entropy": 0.05} for s in range(1, steps + 1)]
    for step, (avg, greedy) in evals:
        records.append({"step": step, "eval/acc_avg@4": avg, "eval/acc_greedy": greedy, "time/elapsed": 10.0 * step,
                        "eval/response_len_avg@4": 60.0, "eval/response_len_greedy": 60.0 + step / 10})
    with open(os.path.join(folder, "metrics.jsonl"), "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)


def test_runs_are_summarised_and_counted(tmp_path):
    fake_run(tmp_path / "a", 4, (0.30, 0.20), (0.90, 0.95))  # learned
    fake_run(tmp_path / "b", 4, (0.30, 0.20), (0.50, 0.40))  # +20 points: short of the bar
    fake_run(tmp_path / "c", 4, (0.30, 0.20), (0.70, 0.10))  # greedy ends below its base
    fake_run(tmp_path / "d", 4, (0.30, 0.20), None, finished=False)  # killed before its last evaluation
    assert [common.finished(str(tmp_path / n)) for n in "abcd"] == [True, True, True, False]
    fake_run(tmp_path / "e", 4, (0.3, 0.2), (0.5, 0.5), finished=False)  # stopped by --max-samples at step 4
    with open(tmp_path / "e" / "config.json", "w") as fh:
        json.dump({"steps": 10, "max_samples": 4}, fh)
    with open(tmp_path / "e" / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 4, "eval/acc_greedy": 0.5, "samples_generated": 0}) + "\n")
    assert not common.finished(str(tmp_path / "e"))  # no samples counted: the budget is not reached
    with open(tmp_path / "e" / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 4, "samples_generated": 4}) + "\n")
        fh.write(json.dumps({"step": 4, "eval/acc_greedy": 0.5}) + "\n")
    assert common.finished(str(tmp_path / "e"))
    a = common.summarise_run(str(tmp_path / "a"))
    assert abs(a["avg_gain"] - 0.60) < 1e-9 and abs(a["greedy_gain"] - 0.75) < 1e-9 and a["k"] == "avg@4"
    assert abs(a["len_ratio"] - 60.4 / 60.0) < 1e-9 and a["ev"] == 0.2 and a["run_seconds"] == 40.0
    assert common.summarise_run(str(tmp_path / "d")) is None
    rows = [{"base": "x", "seed": i, "summary": common.summarise_run(str(tmp_path / n))}
            for i, n in enumerate("abcd")]
    v = seeds.demo_verdict(rows)
    assert (v["runs"], v["finished"], v["gained_both_25"], v["ended_below_base"]) == (4, 3, 1, 1)
    table = seeds.demo_table(rows)
    assert "+60.0" in table and "did not finish" in table and len(table.splitlines()) == 6


def test_a_run_another_invocation_is_running_is_left_to_it(tmp_path):
    """Two sweeps over the same folder never run one run twice: a run folder whose running.pid names a live
    process is skipped (None, nothing started); a stale one (its process gone) is not in the way."""
    import subprocess
    import sys
    folder = tmp_path / "run"
    fake_run(folder, 4, (0.3, 0.2), (0.5, 0.5), finished=False)
    (folder / common.RUNNING).write_text(f"{os.getpid()}\n")  # this test's own process: alive
    assert common.running(str(folder)) == os.getpid()
    before = (folder / "metrics.jsonl").read_text()
    assert common.run_vapo("x", ["--steps", "1"], str(folder)) is None
    assert (folder / "metrics.jsonl").read_text() == before and not (folder / "stdout.log").exists()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (folder / common.RUNNING).write_text(f"{gone.pid}\n")
    assert common.running(str(folder)) is None
    (folder / common.RUNNING).write_text("not a number\n")
    assert common.running(str(folder)) is None
