"""reward.py: answer extraction, equivalence, the two verifiers, overlong shaping, and bounded parallel scoring.

The worker-pool tests share one persistent pool of 2 workers (the machine has 2 cores); each bounds its wall
time generously (a loaded CI machine), but far below what an unbounded verifier would take.
"""
import functools
import logging
import os
import subprocess
import sys
import threading
import time
import weakref

import pytest
from math_verify import LatexExtractionConfig, parse, verify

import bounds
import reward
from reward import (CORRECT_REWARD, WRONG_REWARD, arith_reward, check_golds, extract_answer, math_equal,
                    math_reward, overlong_penalty, reward_batch)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLACK_S = 4.0  # start-up of a replacement worker and a busy machine; a hang would take minutes


def _fragile_verifier(response: str, gold: str) -> float:
    """A verifier that misbehaves on request, to test the pool (module-level, so workers can import it)."""
    if response == "hang":
        time.sleep(600)  # no signal.alarm here: only a kill ends it
    if response == "crash":
        os._exit(3)
    if response == "raise":
        raise RuntimeError("boom")
    if response == "nan":
        return float("nan")
    return CORRECT_REWARD if response == gold else WRONG_REWARD


def _recording_verifier(response: str, gold: str) -> float:
    """Appends "item" to the file named by VAPO_TEST_WARM_LOG (module-level, so workers can import it)."""
    with open(os.environ["VAPO_TEST_WARM_LOG"], "a") as fh:
        fh.write("item\n")
    return CORRECT_REWARD


def _record_warm_up() -> None:
    with open(os.environ["VAPO_TEST_WARM_LOG"], "a") as fh:
        fh.write("warm\n")


_recording_verifier.warm_up = _record_warm_up


def _worker_pid(response: str, gold: str) -> float:
    """A verifier that scores every item with the pid of the worker it ran in (after a pause, so that a batch
    spreads over every worker)."""
    time.sleep(0.05)
    return float(os.getpid())


def _pool_pids() -> set[int]:
    """The pids of the 2-worker pool's workers, as seen by batches that keep both busy: repeated until a batch
    sees two, since pebble starts a replaced worker's successor in the background (a second or two)."""
    deadline = time.monotonic() + 2 * SLACK_S
    pids = set()
    while len(pids) < 2 and time.monotonic() < deadline:
        pids = set(map(int, reward_batch(["x"] * 4, ["x"] * 4, _worker_pid, num_workers=2)))
    return pids


# --------------------------------------------------------------------------------------------------------
# extract_answer
# --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    (r"so \boxed{42}.", "42"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
    (r"\boxed{ {a}^{ {b} } }", "{a}^{ {b} }"),
    (r"\fbox{7}", "7"),
    (r"\boxed {7}", "7"),
    (r"first \boxed{1}, then \boxed{2}", "2"),  # the last box wins
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are text, not groups
    (r"\boxed{3} and finally \boxed{4", "3"),  # a box cut off by truncation is not an answer
    (r"\boxed{\boxed{5}}", r"\boxed{5}"),  # the box that closes last
    (r"\boxed{}", None),
    (r"\boxed{  }", None),
    ("reasoning\nAnswer: 13", "13"),
    ("Answer: -12", "-12"),
    ("Answer: 1\nmore text\nAnswer:   7  \n", "7"),  # the last one, the rest of its line only
    ("Final answer: 5", "5"),
    ("**Answer:** 12", "12"),  # markdown bold
    ("Answer: **12**", "12"),
    ("Answer: 12.", "12"),  # the sentence's full stop
    ("Answer: 3.5", "3.5"),
    (r"Answer: $\frac{1}{2}$", r"$\frac{1}{2}$"),
    (r"Answer: 9 but \boxed{8}", "8"),  # the statement made last wins: here the box
    ("First guess \\boxed{3}. Wait...\nAnswer: 5", "5"),  # ... here the Answer: line (#31: it was read as 3)
    (r"Answer: \boxed{5}", "5"),  # a box on the Answer: line is that line's answer
    ("\\boxed{2}\nAnswer: 4\nso \\boxed{6}", "6"),
    ("Answer: 7\n\\boxed{}", None),  # an empty final box commits to nothing
    ("Answer:", None),
    ("Answer:\n5", None),  # the rest of that line is empty
    ("the result is 5", None),
    ("", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_is_linear_on_adversarial_text():
    start = time.perf_counter()
    assert extract_answer(r"\boxed{" * 100_000) is None  # 100k unclosed boxes
    assert extract_answer("{" * 50_000 + r"\boxed{1}" + "}" * 50_000) == "1"
    assert extract_answer("Answer" * 100_000 + ":" + " " * 100_000) is None
    assert time.perf_counter() - start < 2.0


def test_extract_answer_rejects_non_strings():
    with pytest.raises(TypeError, match="str"):
        extract_answer(None)


# --------------------------------------------------------------------------------------------------------
# math_reward / math_equal
# --------------------------------------------------------------------------------------------------------

R, W = CORRECT_REWARD, WRONG_REWARD
MATH_TABLE = [
    # forms
    (r"so \boxed{42}", "42", R),
    ("Answer: 42", "42", R),
    ("**Answer:** 42.", "42", R),
    (r"\fbox{42}", "42", R),
    # fractions, decimals, LaTeX variants
    (r"\boxed{1/2}", "0.5", R),
    (r"\boxed{\frac{1}{2}}", "0.5", R),
    (r"\boxed{\dfrac{1}{2}}", r"\frac12", R),
    (r"\boxed{\tfrac{3}{4}}", "0.75", R),
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"1/\sqrt{2}", R),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", R),
    (r"\boxed{3.0}", "3", R),
    (r"\boxed{.5}", r"\frac{1}{2}", R),
    (r"Answer: $\frac{7}{2}$", r"3\frac{1}{2}", R),
    (r"\boxed{x = 3}", "3", R),
    (r"\boxed{50\%}", "50", R),
    # negatives
    (r"\boxed{-12}", "-12", R),
    ("Answer: -12", "-12", R),
    (r"\boxed{−12}", "-12", R),  # unicode minus
    (r"\boxed{-\frac{1}{2}}", "-0.5", R),
    # sets and intervals
    (r"\boxed{\{3, 1, 2\}}", r"\{1, 2, 3\}", R),
    (r"\boxed{[1, 3)}", "[1,3)", R),
    (r"\boxed{(-\infty, 2]}", r"(-\infty,2]", R),
    # thousands separators
    (r"\boxed{1,000}", "1000", R),
    (r"\boxed{10{,}000}", "10000", R),
    (r"\boxed{10,\!000}", "10000", R),
    (r"\boxed{1\,000}", "1000", R),  # our addition, see test_latex_space_thousands_separator
    # several boxes: the last wins
    (r"\boxed{2} no wait \boxed{3}", "3", R),
    (r"\boxed{3} no wait \boxed{2}", "3", W),
    # no answer, empty
    ("the answer is clearly three", "3", W),
    ("", "3", W),
    (r"\boxed{}", "3", W),
    # near misses that must be wrong
    (r"\boxed{1/2}", "1/3", W),
    (r"\boxed{[1,3)}", "[1,3]", W),
    (r"\boxed{(1,3)}", "[1,3)", W),
    (r"\boxed{12}", "-12", W),
    (r"\boxed{0.333}", "1/3", W),
    (r"\boxed{\{1, 2\}}", r"\{1, 2, 3\}", W),
    (r"\boxed{12.0001}", "12", W),
    (r"\boxed{\sqrt{2}}", "2", W),
    (r"\boxed{0}", r"1\,000", W),  # math-verify alone says equal (it reads 1\,000 as 1*0)
    (r"\boxed{5}}", "5", R),  # the stray brace is outside the box
    ("Answer: 5}", "5", W),  # unbalanced braces are not a well-formed answer
]


@pytest.mark.parametrize("response, gold, expected", MATH_TABLE)
def test_math_reward_table(response, gold, expected):
    assert math_reward(response, gold) == expected


def test_math_reward_through_the_pool_keeps_order():
    responses, golds, expected = zip(*MATH_TABLE)
    assert reward_batch(list(responses), list(golds), num_workers=2) == list(expected)


def test_math_reward_custom_values_and_bad_gold():
    assert math_reward(r"\boxed{2}", "2", correct=5.0, wrong=0.0) == 5.0
    assert math_reward(r"\boxed{3}", "2", correct=5.0, wrong=0.0) == 0.0
    with pytest.raises(ValueError, match="gold"):
        math_reward(r"\boxed{3}", "  ")


def test_math_equal_edge_cases():
    assert math_equal(" 7 ", "7")  # exact match after strip, no parsing
    assert not math_equal("", "")  # blank commits to nothing
    assert not math_equal("1" * 2000, "1" * 1999)  # too long to parse
    assert math_equal("1" * 2000, "1" * 2000)  # but an exact match is cheap and still counts


def test_latex_space_thousands_separator():
    """Why _join_digit_groups exists: math-verify reads LaTeX spaces between digit groups as products."""
    latex_only = [LatexExtractionConfig()]
    assert verify(parse(r"\boxed{1\,000}", latex_only), parse(r"\boxed{0}", latex_only))  # 1*0 == 0
    assert not verify(parse(r"\boxed{1\,000}", latex_only), parse(r"\boxed{1000}", latex_only))
    assert math_equal("1000", r"1\,000") and not math_equal("0", r"1\,000")
    assert math_equal(r"1\,000\,000", "10^6")
    assert math_equal(r"1~000", "1000") and math_equal(r"12\ 345", "12345")
    assert not math_equal("0.12", r"0.1\,2")  # not three-digit groups: left to math-verify


def test_answer_line_punctuation():
    """Why extract_answer drops "**" and a final period on the Answer: line: math-verify cannot parse them."""
    latex_only = [LatexExtractionConfig()]
    assert not verify(parse(r"\boxed{12}", latex_only), parse(r"\boxed{12.}", latex_only))
    assert not verify(parse(r"\boxed{12}", latex_only), parse(r"\boxed{** 12}", latex_only))
    assert math_reward("Answer: 12.", "12") == CORRECT_REWARD
    assert math_reward("**Answer:** 12", "12") == CORRECT_REWARD


def test_math_equal_never_reaches_parse_expr(monkeypatch):
    """Model text must not reach sympy's parse_expr (it runs eval): we use math-verify's LaTeX parser only."""
    import latex2sympy2_extended.latex2sympy2 as l2s
    import math_verify.parser

    def forbidden(*args, **kwargs):
        raise AssertionError("parse_expr called")

    monkeypatch.setattr(math_verify.parser, "parse_expr", forbidden)
    monkeypatch.setattr(l2s, "parse_expr", forbidden)
    for response, gold, expected in MATH_TABLE[:20]:
        assert math_reward(response, gold) == expected
    assert not math_equal("2**3", "8") and not math_equal("2*4", "9")


# --------------------------------------------------------------------------------------------------------
# injection
# --------------------------------------------------------------------------------------------------------

def _injections(marker):
    payload = f"__import__('os').system('touch {marker}')"
    return [
        rf"\boxed{{{payload}}}",
        f"Answer: {payload}",
        rf"""\boxed{{exec("open('{marker}', 'w').write('x')")}}""",
        rf"""\boxed{{eval("__import__('pathlib').Path('{marker}').touch()")}}""",
        rf"\boxed{{().__class__.__bases__[0].__subclasses__()}} \boxed{{{payload}}}",
        f"The final answer is {payload}",
        payload,
    ]


def test_injection_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    responses = _injections(marker)
    for response in responses:
        assert math_reward(response, "0") == WRONG_REWARD
        assert arith_reward(response, "0") == WRONG_REWARD
        answer = extract_answer(response)
        assert answer is None or not math_equal(answer, "0")
    assert reward_batch(responses, ["0"] * len(responses), num_workers=2) == [WRONG_REWARD] * len(responses)
    assert not marker.exists()


# --------------------------------------------------------------------------------------------------------
# arith_reward
# --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("response, gold, expected", [
    ("3+4=7 7*2=14\nAnswer: 14", "14", R),
    ("Answer: -12", "-12", R),
    ("Answer: +12", "12", R),
    ("Answer: 012", "12", R),
    ("  Answer:   7  ", "7", R),
    ("Answer: 12.", "12", R),  # one sentence-final period is dropped by extract_answer
    (r"so \boxed{7}", "7", R),
    ("Answer: 13\nAnswer: 14", "14", R),
    ("Answer: " + "9" * 30, "9" * 30, R),
    ("Answer: 14", "-14", W),
    ("Answer: 12.0", "12", W),
    ("Answer: $12$", "12", W),
    ("Answer: 12 apples", "12", W),
    ("Answer: 1e1", "10", W),
    ("Answer: 1_000", "1000", W),  # int() would accept it
    ("Answer: ٣", "3", W),  # a non-ASCII digit; int() would accept it
    ("Answer: --3", "3", W),
    ("Answer: " + "9" * 31, "9" * 30, W),  # too many digits: never converted
    ("Answer: 7 + 7", "14", W),
    ("14", "14", W),  # no answer line
    ("", "14", W),
])
def test_arith_reward(response, gold, expected):
    assert arith_reward(response, gold) == expected


@pytest.mark.parametrize("gold", ["x", "1.5", "", "9" * 31, " "])
def test_arith_reward_rejects_malformed_gold(gold):
    with pytest.raises(ValueError, match="gold"):
        arith_reward("Answer: 1", gold)


def test_arith_reward_in_process_is_fast_and_matches():
    responses = [f"2+2=4\nAnswer: {i - 50}" for i in range(10_000)]
    golds = [str(i % 100 - 50) for i in range(10_000)]
    start = time.perf_counter()
    scores = reward_batch(responses, golds, verifier=arith_reward, num_workers=0)
    assert time.perf_counter() - start < 1.0
    assert scores == [arith_reward(r, g) for r, g in zip(responses, golds)]
    assert scores.count(CORRECT_REWARD) == 100


# --------------------------------------------------------------------------------------------------------
# overlong_penalty (DAPO Eq. 13)
# --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("length, max_length, cache_length, expected", [
    (0, 20, 4, 0.0), (16, 20, 4, 0.0), (17, 20, 4, -0.25), (18, 20, 4, -0.5), (19, 20, 4, -0.75),
    (20, 20, 4, -1.0), (21, 20, 4, -1.0), (10**6, 20, 4, -1.0),
    (16384, 20480, 4096, 0.0), (18432, 20480, 4096, -0.5), (20480, 20480, 4096, -1.0),  # DAPO's setting
    (20, 20, 0, 0.0), (21, 20, 0, -1.0),  # no cache: a hard cut
    (0, 20, 20, 0.0), (10, 20, 20, -0.5),
])
def test_overlong_penalty(length, max_length, cache_length, expected):
    assert overlong_penalty(length, max_length, cache_length) == pytest.approx(expected)


@pytest.mark.parametrize("args, name", [
    ((-1, 20, 4), "length"), ((3.5, 20, 4), "length"), (("5", 20, 4), "length"),
    ((5, 0, 0), "max_length"), ((5, 20.0, 4), "max_length"),
    ((5, 20, -1), "cache_length"), ((5, 20, 21), "cache_length"),
])
def test_overlong_penalty_validates(args, name):
    with pytest.raises(ValueError, match=f"^{name} "):
        overlong_penalty(*args)


# --------------------------------------------------------------------------------------------------------
# reward_batch
# --------------------------------------------------------------------------------------------------------

def test_reward_batch_validates():
    with pytest.raises(ValueError, match="2 responses but 1 golds"):
        reward_batch(["a", "b"], ["a"])
    with pytest.raises(TypeError, match=r"golds\[1\]"):
        reward_batch(["a", "b"], ["a", None])
    with pytest.raises(ValueError, match="num_workers"):
        reward_batch(["a"], ["a"], num_workers=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        reward_batch(["a"], ["a"], timeout_s=0)
    with pytest.raises(TypeError, match="picklable"):
        reward_batch(["a"], ["a"], verifier=lambda r, g: 1.0, num_workers=2)
    assert reward_batch([], []) == []


def test_pool_is_persistent_across_calls():
    reward_batch(["1", "2"], ["1", "2"], _fragile_verifier, num_workers=2)
    pids = _pool_pids()
    assert len(pids) == 2
    assert reward_batch(["1", "2", "3"], ["1", "0", "3"], _fragile_verifier, num_workers=2) == [R, W, R]
    assert _pool_pids() == pids  # the same processes: start-up (seconds) is paid once


def test_pathological_items_are_bounded_and_the_rest_scored(caplog):
    # warm (start-up and math-verify's first call are not what is measured)
    reward_batch([r"\boxed{1/2}"] * 4, ["0.5"] * 4, num_workers=2)
    cases = [
        (r"\boxed{1/2}", "0.5", R),
        (r"\boxed{9^{9^{9^9}}}", "5", W),
        (r"\boxed{" + "1" * 100_000 + "}", "1", W),
        (r"\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}", "1", W),
        (r"\boxed{" * 100_000, "1", W),
        ("Answer: 7", "7", R),
        (r"\boxed{\{2, 1\}}", r"\{1, 2\}", R),
    ]
    responses, golds, expected = map(list, zip(*cases))
    timeout_s = 1.5  # below math_equal's soft 2 s, so the power tower is killed by the hard bound
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="reward"):
        scores = reward_batch(responses, golds, num_workers=2, timeout_s=timeout_s)
    assert time.perf_counter() - start < timeout_s + SLACK_S
    assert scores == expected
    assert "1 timed out" in caplog.text


def test_stuck_and_crashed_workers_lose_no_other_result(caplog):
    responses = ["1", "hang", "2", "crash", "3", "raise", "4", "nan", "5", "6"]
    golds = ["1", "x", "2", "x", "0", "x", "4", "x", "5", "6"]
    expected = [R, W, R, W, W, W, R, W, R, R]
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="reward"):
        scores = reward_batch(responses, golds, _fragile_verifier, num_workers=2, timeout_s=2.0)
    assert time.perf_counter() - start < 2.0 + 2 * SLACK_S  # the hang is killed at 2 s; two replacements
    assert scores == expected
    assert "1 timed out" in caplog.text and "3 failed" in caplog.text
    assert "boom" in caplog.text and "exit code 3" in caplog.text and "non-finite" in caplog.text
    # the pool is whole again and still works
    assert reward_batch(["7", "8"], ["7", "8"], _fragile_verifier, num_workers=2) == [R, R]
    assert len(_pool_pids()) == 2


def test_a_new_worker_warms_its_verifier_up_before_its_first_item(tmp_path, monkeypatch):
    """A verifier's warm_up (reward.py's built-ins name one) runs in each new worker before its first item, outside
    the item's bound: where site-packages has no byte-compiled files, the lazy imports of a first call are compiled
    there, not inside the first items' bounds. A partial of such a verifier is warmed up too; the built-in ones run
    in this process without error and leave the verdicts as they are."""
    log = tmp_path / "order.log"
    monkeypatch.setenv("VAPO_TEST_WARM_LOG", str(log))  # a spawned worker takes the environment as it is now
    for verifier in (_recording_verifier, functools.partial(_recording_verifier)):
        stale = bounds._pools.pop((1, os.getpid()), None)  # a pool of one worker made by another test's verifier
        if stale is not None:
            stale.stop()
            stale.join()
        log.write_text("")
        assert reward_batch(["a", "b"], ["x", "y"], verifier, num_workers=1) == [R, R]
        assert log.read_text().split() == ["warm", "item", "item"], verifier
    reward.math_reward.warm_up()
    reward.reasoning_gym_reward.warm_up()
    assert math_reward("Answer: 1/2", "0.5") == R and math_reward("Answer: 2", "0.5") == W


def test_a_hanging_verifier_is_cut_at_the_timeout_and_the_pool_scores_the_next_batch():
    """A response whose scoring never ends costs timeout_s: its worker is killed, the item scores as wrong and is
    counted, the other items keep their scores, and the next batch is scored by the replaced pool as usual."""
    pids = _pool_pids()
    stats = {}
    start = time.perf_counter()
    scores = reward_batch(["hang", "1", "2"], ["x", "1", "0"], _fragile_verifier, num_workers=2, timeout_s=1.0,
                         wrong=-3.0, stats=stats)
    assert time.perf_counter() - start < 1.0 + SLACK_S  # not the 600 s the verifier sleeps
    assert scores == [-3.0, R, W]
    assert stats == {"reward/timeouts": 1, "reward/errors": 0, "reward/oversized": 0}
    assert reward_batch(["3", "4"], ["3", "4"], _fragile_verifier, num_workers=2, stats=stats) == [R, R]
    assert stats["reward/timeouts"] == 0
    after = _pool_pids()
    assert len(after) == 2 and len(after & pids) == 1  # the hung worker, and only it, was replaced


def test_oversized_responses_are_wrong_without_parsing(caplog):
    def must_not_run(response, gold):
        assert len(response) <= 100, "the verifier saw an oversized response"
        return CORRECT_REWARD

    with caplog.at_level(logging.WARNING, logger="reward"):
        scores = reward_batch(["a" * 101, "b"], ["x", "x"], must_not_run, num_workers=0, max_response_chars=100)
    assert scores == [WRONG_REWARD, CORRECT_REWARD]
    assert "1 longer than 100 chars" in caplog.text


def test_stats_count_what_went_wrong_and_quiet_the_log(caplog):
    responses = ["1", "hang", "raise", "x" * 101, "crash", "2"]
    golds = ["1", "x", "x", "x", "x", "0"]
    stats = {"reward/timeouts": 99, "other": 1}  # the call's counts replace earlier ones; other keys stay
    with caplog.at_level(logging.DEBUG, logger="reward"):
        scores = reward_batch(responses, golds, _fragile_verifier, num_workers=2, timeout_s=1.0,
                             max_response_chars=100, stats=stats)
    assert scores == [R, W, W, W, W, W]
    assert stats == {"reward/timeouts": 1, "reward/errors": 2, "reward/oversized": 1, "other": 1}
    assert all(type(v) is int for v in stats.values())
    summary = [r for r in caplog.records if r.name == "reward" and r.getMessage().startswith("reward_batch")]
    assert len(summary) == 1 and summary[0].levelno == logging.DEBUG  # the caller logs the counts itself
    assert "1 timed out" in summary[0].getMessage() and "2 failed" in summary[0].getMessage()
    stats = {}
    assert reward_batch(["1"], ["1"], _fragile_verifier, num_workers=2, stats=stats) == [R]
    assert stats == {"reward/timeouts": 0, "reward/errors": 0, "reward/oversized": 0}


def test_math_verify_timeouts_are_counted_and_kept_off_the_log(caplog):
    """math_equal's soft bound (2 s) cuts the comparison short and returns "not equal": counted, in this process
    as in workers, with no math-verify log record; the logger's settings are restored afterwards."""
    math_verify_log = logging.getLogger("math_verify")
    settings = math_verify_log.level, math_verify_log.propagate, list(math_verify_log.handlers)
    stats = {}
    with caplog.at_level(logging.DEBUG):
        scores = reward_batch([r"\boxed{(x+1)^{10000}}", "Answer: 5"], ["5", "5"], num_workers=0, stats=stats)
    assert scores == [W, R]
    assert stats["reward/timeouts"] == 1 and stats["reward/errors"] == 0
    assert not [r for r in caplog.records if r.name.startswith("math_verify")]
    assert "1 cut short by the 2 s soft bound" in caplog.text
    assert (math_verify_log.level, math_verify_log.propagate, math_verify_log.handlers) == settings


def test_the_soft_bound_repeats_after_a_lost_interrupt_and_only_in_the_main_thread():
    """One interrupt may be lost (raised in a weakref callback, Python prints it and carries on, as sympy's caches
    did in CI under math-verify's one-shot alarm): the bound's alarm repeats until the work has stopped."""
    lost = []

    def swallows_the_first_interrupt():
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                while time.monotonic() < end:
                    pass
            except bounds.SoftBoundExpired:
                if lost:
                    raise
                lost.append(time.monotonic())  # as if raised inside a callback: printed, and the work goes on
        return True

    before = bounds.expiries
    start = time.monotonic()
    assert bounds.soft_bounded(swallows_the_first_interrupt, 0.5) is None
    assert len(lost) == 1 and time.monotonic() - start < 0.5 + SLACK_S
    assert bounds.expiries == before + 1
    assert bounds.soft_bounded(lambda: True, 0.5) is True and bounds.expiries == before + 1
    time.sleep(0.7)  # the alarm of a call that finished in time is off: nothing is raised here
    errors = []
    thread = threading.Thread(target=lambda: _catch(errors, lambda: math_equal("(x+1)^2", "x^2+2x+1")))
    thread.start()
    thread.join()
    assert len(errors) == 1 and "main thread" in str(errors[0]) and "timeout_s=None" in str(errors[0])
    assert math_equal("(x+1)^2", "x^2+2*x+1", timeout_s=None)


def _spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_an_interrupt_lost_in_a_callback_stays_off_the_unraisable_hook_and_no_hook_is_interrupted(monkeypatch):
    """CI's failure, made deterministic: the bound's alarm fired inside a weakref callback (its exception cannot
    propagate and goes to sys.unraisablehook), then a repeat fired inside pytest's hook while it formatted that
    traceback, and the hook failed. Our own lost interrupts must never reach the installed hook, another
    exception must reach it whole (no repeat fires under it), and the hook is restored afterwards."""
    seen, finished = [], []

    def slow_hook(unraisable):  # pytest's formats a traceback from source files: spans several repeats
        seen.append(unraisable.exc_type)
        _spin(0.35)
        finished.append(unraisable.exc_type)

    monkeypatch.setattr(sys, "unraisablehook", slow_hook)

    class Box:
        pass

    def raising_callback(ref):
        raise ValueError("not ours")

    def work():
        box = Box()
        ref_a = weakref.ref(box, lambda ref: _spin(1.0))  # the first alarm (0.1 s) lands in here and is lost
        ref_b = weakref.ref(box, raising_callback)  # then a foreign error goes to the slow hook
        del box
        _spin(30)
        return ref_a, ref_b

    start = time.monotonic()
    assert bounds.soft_bounded(work, 0.1) is None
    assert time.monotonic() - start < 1.0 + 0.35 + SLACK_S
    assert seen == [ValueError] and finished == [ValueError]
    assert sys.unraisablehook is slow_hook


def _catch(errors, fn):
    try:
        fn()
    except ValueError as exc:
        errors.append(exc)


def test_math_verify_timeouts_in_workers_stay_off_the_console():
    """A fresh worker's stderr is the console: math-verify's "Timeout during ..." lines must not reach it."""
    code = ("import reward\n"
            "if __name__ == '__main__':\n"
            "    stats = {}\n"
            "    print(reward.reward_batch([r'\\boxed{9^{9^{9^9}}}', 'Answer: 5'], ['5', '5'], num_workers=1,\n"
            "                             stats=stats), stats)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("[-1.0, 1.0] {'reward/timeouts': 1, 'reward/errors': 0, "
                                  "'reward/oversized': 0}")
    assert out.stderr == ""


def test_a_script_without_a_main_guard_gets_one_clear_error(tmp_path):
    """Under spawn, each worker imports the main script; one that calls reward_batch at import time would try to
    start workers of its own. That fails with one RuntimeError naming the fix, not multiprocessing's traceback
    about the "bootstrapping phase" from every worker."""
    script = tmp_path / "unguarded.py"
    script.write_text("import reward\n"
                      "print(reward.reward_batch(['Answer: 1'], ['1'], reward.arith_reward, num_workers=1))\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("Traceback") == 1, out.stderr  # the parent's only: the worker exits quietly
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: reward_batch: the scoring workers could not start")
    assert 'if __name__ == "__main__":' in last and "num_workers=0" in last
    assert "bootstrapping" not in out.stderr


# --------------------------------------------------------------------------------------------------------
# check_golds
# --------------------------------------------------------------------------------------------------------

READABLE_GOLDS = ["42", "-12", "0.5", r"\frac{1}{2}", r"\dfrac{9}{7}", r"\sqrt{51}", r"3\sqrt{2}", r"\{1, 2\}",
                  "[1, 3)", r"(0,9) \cup (36,\infty)", r"\left( 3, \frac{\pi}{2} \right)", "x = 3", "p - q",
                  "6 - 5i", r"\text{Evelyn}", r"\text{(C)}", r"5.4 \text{ cents}", r"1,\!008,\!016", r"1\,000",
                  r"\begin{pmatrix} -1/3 \\ 2/3 \end{pmatrix}", r"90^\circ", r"50\%", r"\pi", "1,000"]
GSM8K_SOLUTION = ("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
                  "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer's market.\n#### 18")


def test_check_golds_math():
    assert check_golds(READABLE_GOLDS, math_reward, num_workers=2) == []
    golds = ["42", r"\frac{", GSM8K_SOLUTION, "12.", " ", r"\boxed{3", "42", "7}"]
    assert check_golds(golds, math_reward, num_workers=2) == [1, 2, 3, 4, 5, 7]
    # a partial's own `correct` value is what a readable gold scores
    half = functools.partial(math_reward, correct=0.5, wrong=0.0)
    assert check_golds(["42", r"\frac{"], half, num_workers=2) == [1]
    assert check_golds(["42"], half, num_workers=2, correct=1.0) == [0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_check_golds_arith(num_workers):
    golds = ["14", "-3", "007", "x", "1.5", "", "9" * 31, " 5 "]
    assert check_golds(golds, arith_reward, num_workers=num_workers) == [3, 4, 5, 6]


def test_check_golds_validates():
    with pytest.raises(TypeError, match=r"golds\[1\]"):
        check_golds(["1", 2], arith_reward)
    assert check_golds([], math_reward) == []


def test_custom_values_through_partial():
    verifier = functools.partial(math_reward, correct=1.0, wrong=0.0)
    assert reward_batch([r"\boxed{2}", r"\boxed{3}"], ["2", "2"], verifier, num_workers=2, wrong=0.0) == [1.0, 0.0]


def _alive(pid: int) -> bool:
    """True while pid runs; an exited process that nobody has reaped yet (a zombie) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("ending", ["sys.exit(0)", "os.kill(os.getpid(), 9)"])
def test_workers_do_not_outlive_the_trainer(ending):
    """A normal exit closes the pool (atexit); a killed parent's workers see their pipe close and exit."""
    code = ("import multiprocessing, os, sys, reward\n"
            "reward.reward_batch(['Answer: 1'], ['1'], reward.arith_reward, num_workers=1)\n"
            "print(*[p.pid for p in multiprocessing.active_children() if p.name == 'pebble_pool_worker'],\n"
            "      flush=True)\n" + ending + "\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 1, out.stderr
    deadline = time.monotonic() + 10
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, pids))
