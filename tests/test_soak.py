"""bench/soak.py's verdict, on hand-written RSS samples (the soak itself is a long script, not a test)."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import soak  # noqa: E402


def write(tmp_path, rss_of_step, exit_code=0, steps=200, non_finite=()):
    samples = [(0.5 * i, step, rss_of_step(step)) for i, step in enumerate(s for s in range(steps + 1) for _ in (0, 1))]
    path = tmp_path / "soak.json"
    path.write_text(json.dumps({"machine": "m", "date": "d", "exit_code": exit_code, "steps_logged": steps,
                                "wall_seconds": 1, "non_finite": list(non_finite), "samples": samples}))
    return str(path)


@pytest.mark.parametrize("rss, exit_code, non_finite, passes", [
    (lambda s: 600 + (60 if s % 7 == 0 else 0), 0, (), True),   # spikes, no growth
    (lambda s: 600 + s, 0, (), False),                            # a leak: 1 MiB per step
    (lambda s: 600, 1, (), False),                                # a crash
    (lambda s: 600, 0, ("line 3: policy_loss",), False),          # a NaN in the log
])
def test_verdict(tmp_path, capsys, rss, exit_code, non_finite, passes):
    with pytest.raises(SystemExit) as err:
        soak.report(write(tmp_path, rss, exit_code, non_finite=non_finite), warmup=50, steps=200)
    assert (err.value.code == 0) == passes
    assert ("PASS" if passes else "FAIL") in capsys.readouterr().out
    assert (tmp_path / "soak.png").exists()
