"""The demo learns: `python vapo.py` (the demo preset, from the shipped base model) run as a user runs it, for its
first 8 RL steps, then its held-out accuracy compared with the base model's. Slow (a couple of minutes); CI runs it.
bench/seeds.py demo measures the whole run over several seeds and base models."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# docs/results.md's claim, the same bar as bench/seeds.py demo: runs differ between machines and thread counts (not
# bit-identical), so this is one draw from the distribution that the benchmark measured (docs/results.md), whose
# smallest gain sat far above it; a demo that only drifts moves +-3 points.
LEARNING_MIN_GAIN = 0.25  # held-out accuracy at the last evaluation minus the base model's, avg@k and greedy
LENGTH_MIN_RATIO = 0.8  # the mean response length may not fall below this share of the base model's (collapse)


@pytest.mark.slow
def test_demo_learns(tmp_path):
    """The demo as users run it (`python vapo.py`, on one thread: the suite runs a test per core), its 30 steps of
    value pretraining and its first 8 RL steps of 60 (the learning rate is constant after warmup, so they are the
    whole run's first 8), evaluated on 100 held-out prompts at steps 0 and 8: the base model's borrow habit is gone
    by then (measured on one thread, 100 held-out prompts, greedy / avg@4: 25 / 36% at step 0 -> 95-100 / 79-92% at
    step 8 on seeds 0-2, docs/results.md), so the gain must already clear the bar by far; the whole run's figures over
    10 seeds are bench/seeds.py demo's. Without the teaching views (they sample with a generator of their own and
    never touch the run's random streams; tests/test_views.py checks them). Measured on seeds 0 / 1 / 2 (one thread,
    under load, 2026-12-05): greedy 25 -> 95 / 100 / 99%, avg@4 36 -> 86 / 79 / 92%, the smallest gain 44 points.
    Most of the time is the 30 steps of value pretraining (about 60% of the run)."""
    run_dir = tmp_path / "demo"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two threads beside the other worker's test ran 3x slower
    proc = subprocess.run([sys.executable, "vapo.py", "--steps", "8", "--eval-every", "8", "--eval-prompts", "100",
                           "--no-token-views", "--output-dir", str(run_dir)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(run_dir / "metrics.jsonl") as fh:
        evals = [r for r in map(json.loads, fh) if "eval/acc_greedy" in r]
    first, last = evals[0], evals[-1]
    assert first["step"] == 0 and last["step"] > 0
    sampled = next(k for k in first if k.startswith("eval/acc_avg@"))
    gains = {k: round(last[k] - first[k], 4) for k in (sampled, "eval/acc_greedy")}
    assert all(g >= LEARNING_MIN_GAIN for g in gains.values()), (gains, first, last)
    for k in ("eval/response_len_greedy", sampled.replace("acc", "response_len")):
        assert last[k] >= LENGTH_MIN_RATIO * first[k], (k, first[k], last[k])
    assert (run_dir / "curves.png").exists()
