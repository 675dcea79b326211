"""Property tests (hypothesis) of reward.py on random and adversarial text.

For any text, extract_answer, math_equal, math_reward, arith_reward and reward_batch raise nothing (except the
documented ValueError for a malformed gold) and return only their defined values; reward_batch keeps its per-item
time bound on answers that would cost sympy minutes or forever; nothing in a response is ever executed.
Example counts keep the file well under a minute on 2 loaded cores (about 12 s). No example database is kept
(database=None); hypothesis's own caches go to .hypothesis/, which git ignores (hypothesis writes its .gitignore).
"""
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward import (CORRECT_REWARD, MAX_INTEGER_DIGITS, WRONG_REWARD, arith_reward, extract_answer, math_equal,
                    math_reward, reward_batch)

R, W = CORRECT_REWARD, WRONG_REWARD
FAST = settings(deadline=None, max_examples=150, database=None)
# Through a worker, where each pathological item costs a kill (timeout_s) and a replacement worker (~0.3 s idle).
SLOW = settings(deadline=None, max_examples=10, database=None, suppress_health_check=[HealthCheck.too_slow])
TIMEOUT_S = 0.5  # reward_batch's bound in the pool tests: far above a normal item (milliseconds, warm)
RESTART_S = 3.0  # per item: a killed worker's replacement starting on a loaded machine, generously

# Pieces that matter to the extractor and the LaTeX parser, mixed with arbitrary unicode: boxes, braces (plain
# and escaped), "Answer:" variants, markdown, periods, LaTeX commands, non-ASCII digits and minus, zero-width
# and control characters.
FRAGMENTS = [r"\boxed{", r"\fbox{", r"\boxed {", "{", "}", r"\{", r"\}", "\\", "\\\\", "Answer:", "answer :",
             "**Answer:**", "Final answer:", "\n", " ", "\t", ".", "..", "*", "**", "$", r"\frac{", r"\sqrt{",
             r"\text{", r"\infty", r"\,", "~", "1", "12", "-", "+", "0", ",", "=", "x", "[", ")", "%", "٣", "−", "é",
             "Ω", "\u200b", "\x00", "\r", "\U0001F642"]
adversarial = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=40).map("".join)
any_text = st.text(max_size=200) | adversarial
answer_lines = st.builds(lambda prefix, body: prefix + "Answer: " + body, st.text(max_size=20),
                         st.text(max_size=30) | adversarial)
# Long inputs the extractor must handle in linear time.
huge = st.one_of(
    st.integers(1_000, 200_000).map(lambda n: "Answer: " + "9" * n),
    st.integers(1_000, 100_000).map(lambda n: r"\boxed{" + "1" * n + "}"),
    st.integers(1, 20_000).map(lambda n: r"\boxed{" + "{" * n + "1" + "}" * n + "}"),
    st.integers(1, 100_000).map(lambda n: r"\boxed{" * n),  # never closed
    st.integers(1, 50_000).map(lambda n: "{" * n + r"\boxed{7}" + "}" * (n // 2)),
    st.integers(1, 100_000).map(lambda n: "Answer:" * n),
)
golds = st.sampled_from(["5", "-12", "0.5", r"\frac{1}{2}", r"\{1, 2\}", "[1, 3)", "x = 3", "1000", r"\sqrt{2}",
                         r"\text{Monday}"]) | any_text.filter(str.strip)
# Answers sympy would take minutes, or forever, to evaluate or compare, and Python-syntax power towers.
DANGEROUS = [r"\boxed{9^{9^{9^9}}}", "Answer: 9^9^9^9", "Answer: 10**10**10**10", r"\boxed{10**10**10**10}",
             r"\boxed{10^{10^{10^{10}}}}", r"\boxed{2^{2^{2^{2^{2^{2}}}}}}", r"\boxed{(10^{100})!}",
             r"\boxed{\prod_{i=1}^{10^{10}} i}", "Answer: 99999999999^99999999999",
             "Answer: " + "(" * 40 + "1" + ")" * 40]  # nested parentheses: exponential in the LaTeX parser


@pytest.fixture(scope="module")
def marker(tmp_path_factory):
    """A path that exists only if some response was executed as code (module scope: hypothesis reruns the test
    function, and a function-scoped fixture would not be reset between its examples)."""
    return tmp_path_factory.mktemp("injection") / "pwned"


INJECTION_PAYLOADS = ["__import__('os').system('touch {marker}')",
                      "open('{marker}', 'w').write('x')",
                      "__import__('pathlib').Path('{marker}').touch()",
                      """exec("open('{marker}', 'w').write('x')")""",
                      """eval("__import__('os').system('touch {marker}')")""",
                      "().__class__.__bases__[0].__subclasses__() or __import__('os').system('touch {marker}')"]
INJECTION_WRAPPERS = ["{}", "Answer: {}", r"\boxed{{{}}}", "Answer: ${}$", r"\boxed{{\text{{{}}}}}", "x = {}"]


def injections(marker):
    """Every response that creates `marker` if anything hands it to eval, exec, sympify or parse_expr."""
    return [wrapper.format(payload.format(marker=marker)) for wrapper in INJECTION_WRAPPERS
            for payload in INJECTION_PAYLOADS]


@pytest.fixture(scope="module")
def warm_pool():
    """The 1-worker pool started (and math-verify's first call made) before anything is timed."""
    reward_batch([r"\boxed{1/2}"], ["0.5"], num_workers=1)


# --------------------------------------------------------------------------------------------------------
# extract_answer
# --------------------------------------------------------------------------------------------------------

@FAST
@given(text=any_text | answer_lines | huge)
def test_extract_answer_is_total_and_linear(text):
    start = time.perf_counter()
    answer = extract_answer(text)
    assert time.perf_counter() - start < 2.0  # 200k characters take milliseconds; quadratic would take minutes
    if answer is not None:  # a non-empty piece of the text, stripped
        assert isinstance(answer, str) and answer and answer == answer.strip() and answer in text


# --------------------------------------------------------------------------------------------------------
# math_equal / math_reward (in this process: the inputs here stay far from math-verify's time limit)
# --------------------------------------------------------------------------------------------------------

@FAST
@given(response=any_text | answer_lines, gold=golds, values=st.sampled_from([(R, W), (1.0, 0.0), (0.5, -0.25)]))
def test_math_reward_gives_only_its_two_values(response, gold, values):
    correct, wrong = values
    assert math_reward(response, gold, correct=correct, wrong=wrong) in (correct, wrong)
    assert math_equal(response, gold) in (True, False)


@FAST
@given(answer=any_text | huge)
def test_math_equal_on_itself_and_on_blank(answer):
    assert math_equal(answer, answer) is bool(answer.strip())  # identical strings: equal without parsing
    assert math_equal(answer, " \t\n") is False and math_equal("", answer) is False


@FAST
@given(gold=st.text(max_size=3).filter(lambda g: not g.strip()), response=any_text)
def test_math_reward_rejects_a_blank_gold(gold, response):
    with pytest.raises(ValueError, match="gold"):
        math_reward(response, gold)


# --------------------------------------------------------------------------------------------------------
# arith_reward
# --------------------------------------------------------------------------------------------------------

_ASCII_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
integers = st.integers(-(10 ** MAX_INTEGER_DIGITS) + 1, 10 ** MAX_INTEGER_DIGITS - 1)


def spellings(n: int) -> list[str]:
    """Responses stating n, or nearly: forms the specification accepts and forms that int() or float() would
    accept but the specification does not (non-ASCII digits, underscores, decimals, exponents, too many digits)."""
    digits = str(abs(n))
    sign = "-" if n < 0 else ""
    return [f"Answer: {n}", f"Answer: +{n}" if n >= 0 else f"Answer: {n}", f"Answer: {sign}00{digits}",
            f"Answer:\t {n} ", f"Answer: {n}.", f"\\boxed{{{n}}}", f"**Answer:** {n}", f"Answer: {n}.0",
            f"Answer: {n:_}", f"Answer: {n:,}", f"Answer: {float(n)}", f"Answer: {sign}{digits}e0",
            f"Answer: {sign}" + digits.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")),
            f"Answer: {sign}" + digits.translate(str.maketrans("0123456789", "０１２３４５６７８９")),
            f"Answer: {sign}" + "0" * (MAX_INTEGER_DIGITS + 1 - len(digits)) + digits,
            f"Answer: −{digits}", f"Answer: ${n}$", f"Answer: {n} apples", f"Answer: {n + 1}"]


@FAST
@given(gold=integers, response=any_text | answer_lines | huge)
def test_arith_reward_matches_its_specification(gold, response):
    """Correct iff the extracted answer is an optionally signed ASCII integer of at most 30 digits equal to gold."""
    for text in [response] + spellings(gold):
        answer = extract_answer(text)
        right = (answer is not None and _ASCII_INTEGER.fullmatch(answer) is not None
                 and len(answer.lstrip("+-")) <= MAX_INTEGER_DIGITS and int(answer) == gold)
        assert arith_reward(text, str(gold)) == (R if right else W), text


@FAST
@given(response=any_text, gold=any_text | st.integers(0, 400).map(lambda n: "9" * n))
def test_arith_reward_on_any_gold_scores_or_rejects_it(response, gold):
    try:
        score = arith_reward(response, gold)
    except ValueError as exc:
        assert "gold" in str(exc)
    else:
        assert score in (R, W) and _ASCII_INTEGER.fullmatch(gold.strip())


# --------------------------------------------------------------------------------------------------------
# reward_batch
# --------------------------------------------------------------------------------------------------------

@FAST
@given(items=st.lists(st.tuples(any_text | answer_lines | huge, integers.map(str)), max_size=20),
       max_chars=st.integers(0, 300_000))
def test_reward_batch_in_process_is_the_verifier_in_order(items, max_chars):
    responses, gold_list = [r for r, _ in items], [g for _, g in items]
    stats = {}
    scores = reward_batch(responses, gold_list, arith_reward, num_workers=0, max_response_chars=max_chars,
                         stats=stats)
    assert scores == [arith_reward(r, g) if len(r) <= max_chars else W for r, g in items]
    assert stats == {"reward/timeouts": 0, "reward/errors": 0,
                     "reward/oversized": sum(len(r) > max_chars for r in responses)}


@settings(deadline=None, max_examples=30, database=None)
@given(items=st.lists(st.tuples(any_text | answer_lines, integers.map(str)), min_size=1, max_size=10))
def test_reward_batch_through_a_worker_is_the_verifier_in_order(warm_pool, items):
    responses, gold_list = [r for r, _ in items], [g for _, g in items]
    assert reward_batch(responses, gold_list, arith_reward, num_workers=1) == [arith_reward(r, g) for r, g in items]


def _bounded(responses, gold_list):
    """reward_batch with math_reward in 1 worker: only defined values, counted failures, and the time bound."""
    stats = {}
    start = time.perf_counter()
    scores = reward_batch(responses, gold_list, num_workers=1, timeout_s=TIMEOUT_S, stats=stats)
    elapsed = time.perf_counter() - start
    assert elapsed < len(responses) * (TIMEOUT_S + RESTART_S), f"{elapsed:.1f} s for {len(responses)} items"
    assert len(scores) == len(responses) and set(scores) <= {R, W}
    assert all(type(v) is int and v >= 0 for v in stats.values())
    assert stats["reward/timeouts"] + stats["reward/errors"] + stats["reward/oversized"] <= len(responses)
    return scores, stats


def test_reward_batch_bounds_dangerous_answers(warm_pool, marker):
    responses = DANGEROUS + [r"\boxed{1/2}", "Answer: 5"]
    scores, stats = _bounded(responses, ["5"] * len(DANGEROUS) + ["0.5", "5"])
    assert scores == [W] * len(DANGEROUS) + [R, R]
    assert stats["reward/timeouts"] >= 1  # 9^{9^{9^9}} at least cannot finish in TIMEOUT_S


@SLOW
@given(data=st.data())
def test_reward_batch_bounds_random_batches(warm_pool, marker, data):
    pick = st.sampled_from(DANGEROUS) | any_text | answer_lines | huge | st.sampled_from(injections(marker))
    responses = data.draw(st.lists(pick, min_size=1, max_size=3), label="responses")
    gold_list = data.draw(st.lists(golds, min_size=len(responses), max_size=len(responses)), label="golds")
    _bounded(responses, gold_list)
    assert not marker.exists()


# --------------------------------------------------------------------------------------------------------
# nothing is executed
# --------------------------------------------------------------------------------------------------------

@FAST
@given(data=st.data())
def test_injections_are_never_executed(marker, data):
    response = data.draw(st.sampled_from(injections(marker)) | st.builds(str.__add__, any_text,
                                                                         st.sampled_from(injections(marker))))
    gold = data.draw(golds)
    assert math_reward(response, gold) in (R, W)
    assert arith_reward(response, "0") == W
    answer = extract_answer(response)
    assert answer is None or math_equal(answer, "0") is False
    assert not marker.exists()


def test_injections_through_a_worker_are_never_executed(warm_pool, marker):
    responses = injections(marker)
    assert reward_batch(responses, ["0"] * len(responses), num_workers=1) == [W] * len(responses)
    assert not marker.exists()
