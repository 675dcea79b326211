"""bench/ablation.py --quick: every row of the paper's ablation table still runs (2 steps each, one seed), and
the sweep writes its table, JSON and plot. Slow (about 2-3 minutes on 2 cores); CI runs it."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_every_row_runs(tmp_path):
    out = tmp_path / "ablation"
    proc = subprocess.run([sys.executable, "bench/ablation.py", "--quick", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.load(open(out / "ablation.json"))
    rows = {r["row"]: r for r in result["rows"]}
    assert len(rows) == 11 and all(r["seeds"] == 1 for r in rows.values())
    assert all(r["samples"] >= result["budget"] for r in rows.values())  # each stopped at the same budget
    assert not os.path.exists(out / "grpo-s0" / "checkpoint" / "critic")  # GRPO has no critic
    shared = json.load(open(out / "w-o-clip-higher-s0" / "config.json"))
    assert shared["value_model"].endswith(os.path.join("vapo-s0", "critic_pretrained"))
    # two tables (results, diagnostics), each a header, a separator and the 11 rows
    assert (out / "ablation.md").read_text().count("\n|") == 26 and (out / "ablation.png").exists()
    assert rows["VAPO"]["diagnostics"]["lam_policy"] is not None and rows["GRPO"]["diagnostics"]["ev"] is None
