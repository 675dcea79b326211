"""Two runs' metrics.jsonl, compared record by record: every logged value except the measurements of the machine
(time/*, and memory/* on a GPU) must be identical, NaN equal to NaN. The check that a change which should not
change behaviour (a refactor) did not:

    python vapo.py --seed 0 --output-dir /tmp/before      # on the commit before the change
    python vapo.py --seed 0 --output-dir /tmp/after       # on the change, same machine and thread count
    python bench/same_metrics.py /tmp/before/metrics.jsonl /tmp/after/metrics.jsonl

Prints the records and values compared and each difference; exits 1 if there is any. Floating-point results of
the same code differ between CPUs and thread counts, so compare runs of one machine with one thread count.
"""
from __future__ import annotations

import argparse
import json
import math
import sys


def differences(a: list[dict], b: list[dict]) -> tuple[int, list[str]]:
    """(values compared, a line per difference) of two lists of records."""
    out, compared = [], 0
    if len(a) != len(b):
        out.append(f"{len(a)} records against {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        kx, ky = ({k for k in r if not k.startswith(("time/", "memory/"))} for r in (x, y))
        if kx != ky:
            out.append(f"record {i + 1}: keys only on one side: {sorted(kx ^ ky)}")
        for k in sorted(kx & ky):
            compared += 1
            vx, vy = x[k], y[k]
            nan = isinstance(vx, float) and isinstance(vy, float) and math.isnan(vx) and math.isnan(vy)
            if vx != vy and not nan:
                out.append(f"record {i + 1}, {k}: {vx!r} against {vy!r}")
    return compared, out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args(argv)
    a, b = ([json.loads(line) for line in open(p) if line.strip()] for p in (args.before, args.after))
    compared, diffs = differences(a, b)
    print("\n".join(diffs[:50]))
    print(f"{len(a)} records, {compared} values compared (timings and memory excluded), {len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
