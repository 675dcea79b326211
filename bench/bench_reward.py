"""Throughput and worst case of reward.score_batch, with the machine it ran on.

    python bench/bench_reward.py [--n 2000] [--workers 2]

Prints: worker pool start-up; steady-state throughput of math_reward through the persistent pool (samples/s)
beside math_reward in this process (one core, no bound) and arith_reward in this process; the per-call cost
of the pool on a trainer-sized batch; and the wall time of single pathological items under the default bound,
including a verifier stuck beyond the reach of signals, which only the hard bound (a kill) ends.
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import time

FILLER = ("We expand the expression and collect like terms. Substituting the values gives the next line, "
          "and checking the boundary cases shows that no other solution exists. ")


def _problem(kind: int, a: int, b: int, n: int) -> tuple[str, list[str]]:
    """A gold answer of one of five kinds and several equivalent ways a model might write it."""
    if kind == 0:
        return str(n), [str(n), f"{n}.0", f"x = {n}"]
    if kind == 1:
        return f"\\frac{{{a}}}{{{b}}}", [f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}", f"\\dfrac{{{a}}}{{{b}}}"]
    if kind == 2:
        return f"{a / 4:g}", [f"{a / 4:g}", f"\\frac{{{a}}}{{4}}", f"{a}/4"]
    if kind == 3:
        return f"{a}\\sqrt{{2}}", [f"{a}\\sqrt{{2}}", f"\\sqrt{{{2 * a * a}}}", f"{a}\\sqrt2"]
    return f"\\{{{a}, {b}\\}}", [f"\\{{{b}, {a}\\}}", f"\\{{{a},{b}\\}}", f"{a}, {b}"]


def typical_batch(n: int, seed: int = 0) -> tuple[list[str], list[str], list[bool]]:
    """n responses of 300-1500 characters of reasoning ending in a boxed (70%) or "Answer:" final answer;
    about half are right (in some equivalent form), half wrong (the same kind of answer, one number off)."""
    rng = random.Random(seed)
    responses, golds, right = [], [], []
    for _ in range(n):
        kind, a, b, k = rng.randrange(5), rng.randint(1, 99), rng.randint(2, 12), rng.randint(-999, 9999)
        gold, forms = _problem(kind, a, b, k)
        is_right = rng.random() < 0.5
        answer = rng.choice(forms) if is_right else _problem(kind, a + 1, b, k + 1)[1][0]
        final = f"\\boxed{{{answer}}}" if rng.random() < 0.7 else f"\nAnswer: {answer}"
        responses.append(FILLER * rng.randint(2, 10) + "So the result is " + final)
        golds.append(gold)
        right.append(is_right)
    return responses, golds, right


def stuck_verifier(response: str, gold: str) -> float:
    """Stands in for a verifier stuck where no signal reaches it (inside C code): only a kill ends it."""
    time.sleep(3600)
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="samples in the throughput batch")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    args = parser.parse_args()
    # here, not at the top: the pool's workers (spawn) import this script again, so what it imports at the top is
    # part of the start-up measured below (common brings torch and transformers; each worker imports reward)
    import common  # (puts the repository on the path)
    import reward
    timed = common.clocked
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {common.machine()}, {cpus} CPUs available, load average {os.getloadavg()[0]:.2f}\n"
          f"date: {common.now()}")

    responses, golds, right = typical_batch(args.n)
    _, startup = timed(lambda: reward.score_batch(responses[:args.workers], golds[:args.workers],
                       num_workers=args.workers))
    print(f"pool start-up ({args.workers} workers, first call of {args.workers} items): {startup:.2f} s")

    scores, pooled = timed(lambda: reward.score_batch(responses, golds, num_workers=args.workers))
    agree = sum((s == reward.CORRECT_REWARD) == r for s, r in zip(scores, right))
    print(f"math_reward, pool of {args.workers}: {args.n} samples in {pooled:.2f} s = {args.n / pooled:.0f} "
          f"samples/s ({agree}/{args.n} scores as constructed)")

    k = min(args.n, 500)
    local, in_process = timed(lambda: reward.score_batch(responses[:k], golds[:k], num_workers=0))
    assert local == scores[:k], "in-process and pooled scores differ"
    print(f"math_reward, in process (1 core, no bound): {k} samples in {in_process:.2f} s = "
          f"{k / in_process:.0f} samples/s")

    arith_responses = [f"1+2=3 3*4=12\nAnswer: {i % 97 - 40}" for i in range(args.n)]
    arith_golds = [str(i % 89 - 40) for i in range(args.n)]
    _, arith = timed(lambda: reward.score_batch(arith_responses, arith_golds, reward.arith_reward, num_workers=0))
    print(f"arith_reward, in process: {args.n} samples in {arith * 1e3:.1f} ms = {args.n / arith:.0f} samples/s")

    _, step = timed(lambda: reward.score_batch(responses[:256], golds[:256], num_workers=args.workers))
    print(f"trainer-sized call (256 samples, warm pool): {step:.2f} s")

    print(f"pathological items, alone, default bound timeout_s = {reward.ITEM_TIMEOUT_S} s "
          f"(math_equal's soft bound, {reward.MATH_VERIFY_TIMEOUT_S} s):")
    cases = {"9^{9^{9^9}}": "\\boxed{9^{9^{9^9}}}", "(10^{8})!": "\\boxed{(10^{8})!}",
             "100k-digit number": "\\boxed{" + "1" * 100_000 + "}",
             "5000 nested braces": "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
             "300 nested braces": "\\boxed{" + "{" * 300 + "1" + "}" * 300 + "}",
             "100k unclosed \\boxed{": "\\boxed{" * 100_000}
    worst = 0.0
    for name, response in cases.items():
        score, wall = timed(lambda: reward.score_batch([response], ["5"], num_workers=args.workers))
        worst = max(worst, wall)
        print(f"  {name:24s} score {score[0]:+.0f}  wall {wall:.2f} s")
    _, stuck = timed(lambda: reward.score_batch(["x"], ["x"], stuck_verifier, num_workers=args.workers))
    worst = max(worst, stuck)
    print(f"  {'stuck verifier (killed)':24s} score -1  wall {stuck:.2f} s")
    _, after = timed(lambda: reward.score_batch(responses[:args.workers], golds[:args.workers],
                                                num_workers=args.workers))
    print(f"  next call of {args.workers} items, while the killed worker's replacement starts: {after:.2f} s")
    print(f"worst case of one pathological item: {worst:.2f} s (bound {reward.ITEM_TIMEOUT_S} s)")


if __name__ == "__main__":
    main()
