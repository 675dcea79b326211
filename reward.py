"""Verifiers: the sparse reward that VAPO learns from, made safe and bounded in time.

VAPO (arXiv 2504.05118) scores a whole response with one rule-based reward at its last token, as DAPO
(arXiv 2503.14476, "rule-based reward modeling") does: +1 if the final answer is right, -1 if not.
Everything RL can reach is capped by this verifier, so it must be

- right: answers are compared for mathematical equivalence by math-verify (1/2 == 0.5, sets in any order,
  intervals, \\dfrac, thousands separators), with only the fixes it lacks added here, each one tested;
- bounded: the trainer scores a few hundred samples per step, and one pathological answer (9^{9^{9^9}}, a
  100k-character number, thousands of nested braces) must cost at most a fixed time and score as wrong;
- safe: responses are untrusted text. Nothing here passes them to eval, exec, sympify or parse_expr; LaTeX is
  parsed by math-verify's grammar-based LaTeX parser only.

Public functions:
    extract_answer(text)                      the answer a response commits to (last \\boxed{}, else "Answer:")
    math_equal(prediction, gold)              equivalence through math-verify
    math_reward(response, gold)               +1 / -1 for math datasets (the VAPO/DAPO reward)
    arith_reward(response, gold)              +1 / -1 for the built-in arithmetic task (pure string work)
    reasoning_gym_reward(response, gold)      +1 / -1 from a reasoning-gym generator's own score_answer
    overlong_penalty(length, max_length, cache_length)   DAPO's soft overlong punishment
    reward_batch(responses, golds, verifier)   parallel, time-bounded scoring in persistent worker processes
    check_golds(golds, verifier)              indices of gold answers the verifier cannot read (data errors)
    Verifier(fn, workers)                     a verifier and where it runs: what the trainer passes around

The machinery that bounds these rules in time is bounds.py: the soft SIGALRM bound that math_equal and
reasoning_gym_reward compare under, and reward_batch's process pool (pebble) with its hard bound per item.

Differences from the papers: neither paper specifies its verifier's code. Ours follows DAPO's prompt format
("Answer: ..." on the last line) and the common \\boxed{} convention; see each function for edge cases.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import operator
import os
import re
from typing import Callable, Sequence

import bounds

try:  # optional: only math datasets need it (_math_verify says so when it is missing)
    import math_verify
except ImportError:
    math_verify = None


logger = logging.getLogger(__name__)

CORRECT_REWARD = 1.0
"""Reward of a response whose final answer equals the gold answer (VAPO / DAPO rule-based reward)."""
WRONG_REWARD = -1.0
"""Reward of a wrong, missing, unparsable, timed-out or oversized answer."""

ITEM_TIMEOUT_S = 5.0
"""reward_batch's hard wall-clock bound per item, enforced by killing the worker that exceeds it."""
MATH_VERIFY_TIMEOUT_S = 2
"""math_equal's soft bound (seconds) per comparison, parsing included. It lets a worker give up on most
pathological answers without being killed; the hard bound above catches the rest (time in C code)."""
MAX_ANSWER_CHARS = 1_000
"""Extracted answers longer than this are wrong without parsing: no final answer to a math problem is that
long, and parsing a 100k-digit number alone takes most of a second."""
MAX_RESPONSE_CHARS = 1_000_000
"""reward_batch scores longer responses as wrong without calling the verifier or sending them to a worker.
About 50 characters per token at 20k tokens: far beyond any real generation, so only garbage is cut."""
MAX_INTEGER_DIGITS = 30
"""arith_reward treats answers with more digits as wrong, so nothing large is ever converted."""
DEFAULT_MAX_WORKERS = 8
"""Cap on reward_batch's default worker count: each worker holds sympy (about 60 MB), and a few hundred
samples per step need no more."""
# ---------------------------------------------------------------------------------------------------------
# Answer extraction
# ---------------------------------------------------------------------------------------------------------

# One pass over the text finds every brace and box opening. "\\." consumes escaped characters (\{, \}, \\),
# so that "\{1, 2\}" is a set, not a group, and "\\{" is a line break followed by a group.
_LATEX_TOKEN = re.compile(r"(?P<box>\\(?:boxed|fbox)\s*\{)|(?P<escaped>\\.)|(?P<open>\{)|(?P<close>\})",
                          re.DOTALL)
# DAPO's format. The Minerva-style pattern (?i)Answer\s*:\s*([^\n]+) of verl's math_dapo.py, except that the
# answer must start on the same line.
_ANSWER_LINE = re.compile(r"answer\s*:[ \t]*([^\n]*)", re.IGNORECASE)


def _last_box(text: str) -> tuple[int, int] | None:
    """(start, end) of the content of the \\boxed{...} / \\fbox{...} that closes last, or None if no box is ever
    closed.

    Linear time: one left-to-right scan with a stack of open braces (a quadratic "find the matching brace for
    each \\boxed" would be exploitable by a response of 100k unclosed boxes). A truncated final box (never
    closed) is skipped, so an earlier complete box wins.
    """
    if "\\boxed" not in text and "\\fbox" not in text:  # fast path for almost every response
        return None
    stack: list[int] = []  # per open brace: where the box content starts, or -1 for a plain group
    last = None
    for m in _LATEX_TOKEN.finditer(text):
        if m.lastgroup == "open":
            stack.append(-1)
        elif m.lastgroup == "box":
            stack.append(m.end())
        elif m.lastgroup == "close" and stack and (start := stack.pop()) >= 0:
            last = (start, m.start())
    return last


def _braces_balanced(latex: str) -> bool:
    """True if every unescaped { has its }."""
    depth = 0
    for m in _LATEX_TOKEN.finditer(latex):
        if m.lastgroup in ("open", "box"):
            depth += 1
        elif m.lastgroup == "close":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _last_answer_line(text: str) -> re.Match | None:
    """The last "Answer:" line of text, or None."""
    last = None
    for last in _ANSWER_LINE.finditer(text):
        pass
    return last


def _answer_line(match: re.Match) -> str | None:
    """Rest of the line after an "Answer:", without markdown bold markers and a final period."""
    # "**Answer:** 12" and "Answer: 12." are how chat models write it; the stars and the sentence's full stop
    # are not part of the answer (math-verify reads "12." and "** 12" as unparsable strings).
    answer = match.group(1).strip().strip("*").strip()
    if answer.endswith(".") and not answer.endswith(".."):
        answer = answer[:-1].rstrip()
    return answer or None


def extract_answer(text: str) -> str | None:
    """The final answer a response commits to, as a string, or None if it commits to none.

    The answer is read where the response ends: of the two forms an answer is stated in, the statement made
    last wins, so a response that guesses, reconsiders and answers again is held to its final answer.
    1. a box: the content of the last complete \\boxed{...} or \\fbox{...} (nested braces handled; escaped
       braces \\{ \\} are text; the box that closes last, so in \\boxed{\\boxed{1}} it is the outer one; a box
       left open by truncation is ignored); an empty box commits to nothing -> None;
    2. an "Answer:" line: the rest of the line after the last "Answer:" (DAPO's prompt format, arXiv 2503.14476;
       matched case-insensitively, so "Final answer:" counts), stripped of whitespace, of markdown bold ("**")
       at its ends, and of one final period ("Answer: 12." -> "12"); an empty rest of line -> None;
    3. when both are present, the one that starts later: "\\boxed{3} ... Answer: 5" is 5, "Answer: 9 but
       \\boxed{8}" is 8, and "Answer: \\boxed{5}" is the box's 5 (the box starts after the "Answer:");
    4. neither -> None.
    Text after the final statement is not read: what a response earns when it never ends (cut at the length
    limit with its answer stated early) is the trainer's decision (vapo.py, --truncated-reward). DAPO's scorer
    (verl's math_dapo.compute_score) reads the last "Answer:" in the response's last 300 characters only.
    Runs in time linear in len(text).
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer: text must be str, got {type(text).__name__}")
    box, line = _last_box(text), _last_answer_line(text)
    if box is not None and (line is None or line.start() < box[0]):
        return text[box[0]:box[1]].strip() or None
    return None if line is None else _answer_line(line)


_NUMBER = re.compile(r"(?<![\w.])[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w])")


def last_number(text: str) -> str | None:
    """The last number written in text ("-12", "3.5", "1,200" read as "1200"), or None: the lenient reading of a
    reply, which grades the skill apart from the answer format (vapo.evaluate's eval/lenient_*)."""
    found = _NUMBER.findall(text[-MAX_ANSWER_CHARS:])
    return found[-1].replace(",", "") if found else None


# ---------------------------------------------------------------------------------------------------------
# Mathematical equivalence
# ---------------------------------------------------------------------------------------------------------

# LaTeX spaces between digit groups ("1\,000", "10\ 000", "1~000") are thousands separators, but math-verify
# reads them as multiplication: "1\,000" parses as 1*0 = 0, so gold "1\,000" would accept the answer "0".
# Removed only inside a run of groups of exactly three digits, so "0.1\,2" or "2\,x" are left alone.
_LATEX_SPACE = r"(?:\\[,;: ]|~)"
_SPACED_THOUSANDS = re.compile(rf"(?<![\d.])\d{{1,3}}(?:{_LATEX_SPACE}\d{{3}})+(?!\d)")


def _join_digit_groups(latex: str) -> str:
    return _SPACED_THOUSANDS.sub(lambda m: re.sub(_LATEX_SPACE, "", m.group()), latex)


def _math_verify():
    """math-verify's module, or ImportError saying that it is missing: the built-in task scores with arith_reward
    alone, so its whole path (and bench/gpu_check.py on a machine without math-verify) runs without it."""
    if math_verify is None:
        raise ImportError("math datasets are scored with math-verify, which is not installed: "
                          "pip install 'math-verify>=0.7' (the built-in task does not need it)")
    return math_verify


def _parse_answer(answer: str) -> list:
    mv = _math_verify()
    # Wrapping in \boxed{} tells math-verify that the whole string is the answer. LaTeX extraction only:
    # math-verify's plain-expression extractor hands text to sympy's parse_expr, which runs eval.
    latex = "\\boxed{" + _join_digit_groups(answer) + "}"
    return mv.parse(latex, extraction_config=[mv.LatexExtractionConfig()], parsing_timeout=None)


def math_equal(prediction: str, gold: str, *, timeout_s: float | None = MATH_VERIFY_TIMEOUT_S,
               max_chars: int = MAX_ANSWER_CHARS) -> bool:
    """True if the answer `prediction` is mathematically equal to the answer `gold`.

    Both are bare answers (what extract_answer returns), LaTeX or plain: "1/2", "\\frac{1}{2}", "0.5",
    "\\{1, 2\\}", "[1, 3)". The comparison is math-verify's `verify(gold, prediction)` on both strings parsed as
    LaTeX; it handles fractions vs decimals, \\dfrac, radicals, sets in any order, intervals (open vs closed
    ends differ), "x = 3" vs "3", percentages, units and "1,000" / "1{,}000". Added here: LaTeX-space
    thousands separators ("1\\,000"), which math-verify reads as a product.

    Edge cases: identical strings are equal without parsing; blank strings equal nothing; a prediction longer
    than max_chars or with unbalanced braces is not equal to anything; a comparison (parsing included) that
    runs past timeout_s seconds is cut short and not equal. The bound uses SIGALRM, so call this from a
    process's main thread (as reward_batch's workers do), or pass timeout_s=None and bound the time yourself.
    """
    prediction, gold = prediction.strip(), gold.strip()
    if not prediction or not gold:
        return False
    if prediction == gold:
        return True
    if len(prediction) > max_chars or not (_braces_balanced(prediction) and _braces_balanced(gold)):
        return False
    mv = _math_verify()

    def compare() -> bool:
        # math-verify's own timeouts stay off (None): each is one signal.alarm, and an alarm that fires inside
        # a weakref callback (sympy's caches have many) is printed and lost, leaving the comparison unbounded.
        return mv.verify(_parse_answer(gold), _parse_answer(prediction), timeout_seconds=None)

    if timeout_s is None:
        return compare()
    equal = bounds.soft_bounded(compare, timeout_s)
    return bool(equal)  # None, cut short at the bound, is not equal


def math_reward(response: str, gold: str, *, correct: float = CORRECT_REWARD,
                wrong: float = WRONG_REWARD) -> float:
    """VAPO's rule-based reward (arXiv 2504.05118; defined as in DAPO, arXiv 2503.14476): `correct` if the
    answer extracted from the response is mathematically equal to gold (math_equal), else `wrong`.

    A response with no answer, or an answer that does not parse, is wrong. A blank gold answer is a data error
    and raises ValueError (otherwise every sample of that prompt would be silently wrong).
    """
    if not gold.strip():
        raise ValueError("math_reward: gold answer is empty")
    answer = extract_answer(response)
    if answer is None:
        return wrong
    return correct if math_equal(answer, gold) else wrong


def _warm_up_math() -> None:
    """math_reward on one fixed item that math-verify parses and compares at once: a scoring worker calls it before
    its first item (bounds._start_worker), so the modules math-verify and sympy import on a first call are loaded,
    and compiled where no byte-compiled files exist, outside any item's bound."""
    math_reward("Answer: 1/2", "0.5")


math_reward.warm_up = _warm_up_math


_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)  # ASCII digits only: int() would also accept "٣" or "1_000"


def _small_integer(text: str) -> int | None:
    """The integer `text` spells exactly (optional sign, ASCII digits), or None; None above 30 digits."""
    text = text.strip()
    if not _INTEGER.fullmatch(text) or len(text.lstrip("+-")) > MAX_INTEGER_DIGITS:
        return None
    return int(text)


def arith_reward(response: str, gold: str, *, correct: float = CORRECT_REWARD,
                 wrong: float = WRONG_REWARD) -> float:
    """Reward of the built-in arithmetic task: `correct` if the response's answer is the integer gold.

    The task's responses end with the line "Answer: <integer>" (e.g. "Answer: -12"). Correct iff
    extract_answer gives a string that is exactly an optionally signed integer in ASCII digits (surrounding
    whitespace ignored; leading zeros allowed) whose value equals int(gold). Because extract_answer drops one
    sentence-final period on the "Answer:" line, "Answer: 12." counts as 12; anything else ("12.0", "$12$",
    "twelve", "1e1", "12 apples") is wrong. Answers of more than MAX_INTEGER_DIGITS digits are wrong without
    conversion. Pure string work, microseconds per call: safe for reward_batch(..., num_workers=0).
    Raises ValueError if gold is not such an integer (a malformed data row).
    """
    target = _small_integer(gold)
    if target is None:
        raise ValueError(f"arith_reward: gold {gold[:50]!r} is not an integer of at most "
                         f"{MAX_INTEGER_DIGITS} digits")
    answer = extract_answer(response)
    value = None if answer is None else _small_integer(answer)
    return correct if value == target else wrong


@functools.lru_cache(maxsize=64)
def _reasoning_gym_dataset(name: str, settings: str):
    """A reasoning-gym dataset of the generator `name` with `settings` (JSON), for its score_answer: made once per
    process (the scoring workers keep it)."""
    try:
        import reasoning_gym  # optional and slow to import (about 1 s): only reasoning-gym datasets need it
    except ImportError:
        raise ImportError("reasoning-gym datasets are scored by the reasoning-gym package, which is not installed: "
                          "pip install reasoning-gym") from None
    return reasoning_gym.create_dataset(name, size=1, seed=0, **json.loads(settings))


def reasoning_gym_reward(response: str, gold: str, *, correct: float = CORRECT_REWARD,
                         wrong: float = WRONG_REWARD) -> float:
    """Reward of a reasoning-gym problem: `correct` if the generator's own verifier, score_answer(answer, entry),
    gives full marks (1.0) to the final answer the response states (extract_answer), else `wrong`.

    gold: JSON {"dataset": generator name, "settings": its settings, "entry": the problem as the generator made it,
    with its metadata} (data.reasoning_gym_rows). score_answer is handed the extracted answer, never the response:
    given the whole text it grants partial credit to any text that contains the answer (chain_sum scores
    "Answer: -4" 0.2 against -4). A partial score (0 < s < 1) is wrong here: VAPO's reward is +1 / -1 (our choice).
    Bounded like math_reward: no stated answer, or one longer than MAX_ANSWER_CHARS, is wrong unread; score_answer
    runs under math_equal's soft bound (MATH_VERIFY_TIMEOUT_S; cut short: wrong), and reward_batch's workers under
    their hard bound. ValueError for a gold that is not such JSON (a data error); ImportError without reasoning-gym.
    """
    try:
        gold_dict = json.loads(gold)
        name, settings, entry = gold_dict["dataset"], gold_dict["settings"], gold_dict["entry"]
    except (ValueError, TypeError, KeyError):
        raise ValueError(f"reasoning_gym_reward: gold {gold[:60]!r} is not a reasoning-gym problem's JSON "
                         "(data.reasoning_gym_rows writes it)") from None
    dataset = _reasoning_gym_dataset(name, json.dumps(settings, sort_keys=True))
    answer = extract_answer(response)
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return wrong
    score = bounds.soft_bounded(lambda: dataset.score_answer(answer, entry), MATH_VERIFY_TIMEOUT_S)
    return correct if score is not None and float(score) >= 1.0 else wrong


def _warm_up_reasoning_gym() -> None:
    """reasoning_gym_reward on one fixed chain_sum problem (its package and a generator's score_answer loaded before
    a worker's first item, as _warm_up_math does for math-verify); nothing where reasoning-gym is not installed."""
    with contextlib.suppress(ImportError):
        entry = _reasoning_gym_dataset("chain_sum", "{}")[0]
        reasoning_gym_reward(f"Answer: {entry['answer']}", json.dumps({"dataset": "chain_sum", "settings": {},
                                                                         "entry": entry}))


reasoning_gym_reward.warm_up = _warm_up_reasoning_gym


# ---------------------------------------------------------------------------------------------------------
# Length shaping
# ---------------------------------------------------------------------------------------------------------

TRUNCATED_REWARDS = ("wrong", "graded")
"""What a response cut at the length limit (no EOS) earns: "wrong" (it never ended, so it committed to no final
answer, whatever it stated on the way) or "graded" (its text scored as if it had ended, as verl's reward
functions do). DAPO grades it and then adds its overlong penalty, -1 at the limit."""


def truncation_rule(scores: Sequence[float], truncated: Sequence[bool], rule: str = "wrong",
                    wrong: float = WRONG_REWARD) -> list[float]:
    """The rewards of a batch under a TRUNCATED_REWARDS rule: `wrong` for each truncated response under "wrong",
    its score under "graded". ValueError for another rule or lengths that differ."""
    if rule not in TRUNCATED_REWARDS:
        raise ValueError(f"truncated reward must be one of {TRUNCATED_REWARDS}, got {rule!r}")
    if len(scores) != len(truncated):
        raise ValueError(f"{len(scores)} scores for {len(truncated)} responses")
    return [wrong if cut and rule == "wrong" else float(s) for s, cut in zip(scores, truncated)]


def _whole(name: str, value) -> int:
    try:
        return operator.index(value)  # accepts int, numpy and 0-d torch integers; rejects floats and strings
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def overlong_penalty(length: int, max_length: int, cache_length: int) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, section 3.4 "Overlong Reward Shaping"), added to the
    verifier's reward.

        0                                              if length <= max_length - cache_length
        ((max_length - cache_length) - length) / cache_length   if it is within the last cache_length tokens
        -1                                             if length > max_length

    so the penalty falls linearly from 0 to -1 over the last cache_length tokens before max_length (DAPO:
    max_length 20480, cache_length 4096). cache_length = 0 is a hard cut: 0 up to max_length, -1 beyond.
    Raises ValueError, naming the argument, if any is not an integer, length or cache_length is negative,
    max_length is not positive, or cache_length exceeds max_length.
    """
    length, max_length, cache_length = (_whole("length", length), _whole("max_length", max_length),
                                        _whole("cache_length", cache_length))
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if max_length <= 0:
        raise ValueError(f"max_length must be > 0, got {max_length}")
    if not 0 <= cache_length <= max_length:
        raise ValueError(f"cache_length must be in [0, max_length={max_length}], got {cache_length}")
    soft_limit = max_length - cache_length
    if length <= soft_limit:
        return 0.0
    if length > max_length:
        return -1.0
    return (soft_limit - length) / cache_length


def _default_num_workers() -> int:
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(available, DEFAULT_MAX_WORKERS))


def _validate_batch(responses: Sequence[str], golds: Sequence[str], num_workers, timeout_s) -> None:
    if len(responses) != len(golds):
        raise ValueError(f"reward_batch: {len(responses)} responses but {len(golds)} golds")
    for name, items in (("responses", responses), ("golds", golds)):
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise TypeError(f"reward_batch: {name}[{i}] must be str, got {type(item).__name__}")
    if num_workers is not None and num_workers < 0:
        raise ValueError(f"reward_batch: num_workers must be >= 0 or None, got {num_workers}")
    if not timeout_s > 0:
        raise ValueError(f"reward_batch: timeout_s must be > 0, got {timeout_s}")


def reward_batch(responses: Sequence[str], golds: Sequence[str],
                verifier: Callable[[str, str], float] = math_reward, *, num_workers: int | None = None,
                timeout_s: float = ITEM_TIMEOUT_S, max_response_chars: int = MAX_RESPONSE_CHARS,
                wrong: float = WRONG_REWARD, stats: dict | None = None) -> list[float]:
    """verifier(responses[i], golds[i]) for every i, in input order, each bounded in time.

    The trainer's reward phase (VAPO, arXiv 2504.05118: one reward per sample, placed at its last token).
    Items are scored in a pebble.ProcessPool of `num_workers` worker processes (default: the CPUs available to
    this process, at most DEFAULT_MAX_WORKERS), one item at a time per worker, each under a hard wall-clock
    bound of timeout_s seconds from when a worker takes it. The pool is started on first use and kept for later
    calls (one per num_workers), so start-up (about 1-2 s, more if the main script has heavy imports, since
    spawn re-imports it) is paid once per process; it is stopped at interpreter exit. Processes, not threads:
    math_equal's soft bound uses SIGALRM, and only a process can be killed when it hangs in C code.

    Scored as `wrong` without a verdict, and counted, never silently: an item that exceeds timeout_s (its
    worker is killed and replaced), a verifier that raises or returns a non-finite number, a worker that dies
    (replaced; no other item is lost). Responses longer than max_response_chars are scored as `wrong` without
    being parsed or sent to a worker. Also counted: items during which math_equal's soft bound
    (MATH_VERIFY_TIMEOUT_S) cut a comparison short; the verifier's score stands (math_equal counts a
    cut-short comparison as not equal). math-verify's own log lines are kept off the console.

    The counts of one call go to `stats`, when given, as ints:
        stats["reward/timeouts"]   items killed at timeout_s + items cut short by math_equal's soft bound
        stats["reward/errors"]     verifier exceptions, non-finite scores, dead workers
        stats["reward/oversized"]  responses longer than max_response_chars
    and the call's summary line is logged at DEBUG (the caller logs the counts with its metrics); without
    `stats` it is one WARNING per call with any of them.

    num_workers=0 scores in this process with no pool, no hard time bound and no isolation (exceptions
    propagate): only for verifiers known to be cheap and safe, like arith_reward.

    The verifier must be picklable: a module-level function (response: str, gold: str) -> float, or a
    functools.partial of one (e.g. to change math_reward's correct/wrong values). Spawned workers import
    the main script as "__mp_main__", so a script that calls this needs an `if __name__ == "__main__":` guard;
    without one, the workers' start fails with a RuntimeError that says so (not multiprocessing's traceback
    about the "bootstrapping phase").
    Raises ValueError if the lengths differ or an argument is out of range, TypeError for a non-str item.
    """
    _validate_batch(responses, golds, num_workers, timeout_s)
    scores = [wrong] * len(responses)
    jobs = {i: (r, g) for i, (r, g) in enumerate(zip(responses, golds)) if len(r) <= max_response_chars}
    oversized = len(responses) - len(jobs)
    tally = bounds.Tally()
    if num_workers == 0:
        with bounds.quiet_math_verify():
            for i, (response, gold) in jobs.items():
                before = bounds.expiries
                scores[i] = float(verifier(response, gold))
                tally.cut_short += bounds.expiries > before
    elif jobs:
        bounds.score_in_pool(verifier, jobs, num_workers or _default_num_workers(), timeout_s, scores, tally)
    timeouts = tally.timeouts + tally.cut_short
    if stats is not None:
        stats.update({"reward/timeouts": timeouts, "reward/errors": tally.errors, "reward/oversized": oversized})
    if timeouts or tally.errors or oversized:
        logger.log(logging.WARNING if stats is None else logging.DEBUG,
                   "reward_batch: %d of %d items without a verdict: %d timed out (%d killed after %g s and scored "
                   "%s, %d cut short by the %g s soft bound), %d failed%s and scored %s, %d longer "
                   "than %d chars and scored %s", timeouts + tally.errors + oversized, len(responses), timeouts,
                   tally.timeouts, timeout_s, wrong, tally.cut_short, MATH_VERIFY_TIMEOUT_S, tally.errors,
                   f" ({'; '.join(tally.examples)})" if tally.errors else "", wrong, oversized,
                   max_response_chars, wrong)
    return scores


def _score_or_nan(verifier: Callable[[str, str], float], response: str, gold: str) -> float:
    """verifier(response, gold), or NaN if it raises: check_golds's in-process scoring, where reward_batch lets
    exceptions propagate."""
    try:
        return float(verifier(response, gold))
    except Exception:
        return math.nan


def check_golds(golds: Sequence[str], verifier: Callable[[str, str], float], num_workers: int | None = None, *,
                correct: float | None = None) -> list[int]:
    """Indices (sorted) of the gold answers that `verifier` cannot read.

    A gold answer the verifier cannot parse (a worked solution instead of its final answer, a truncated
    "\\frac{", a stray "12.") does not make a prompt hard: it makes every sample of that prompt score as wrong,
    so the prompt teaches nothing and looks like one the policy has not learnt yet. That is a data error, to be
    reported before training, not a -1 for every sample.

    Each distinct gold is scored through reward_batch (worker processes, each item bounded in time; num_workers
    as there) against the two responses that state it in the forms extract_answer reads, which are the forms
    math_reward and arith_reward accept:
        "Answer: <gold>"       DAPO's answer line: the gold must fit on one line (no line break) and not end
                               in a period, since extract_answer drops one;
        "\\boxed{<gold>}"       the \\boxed{} convention: the gold's braces must balance.
    A gold is readable iff both score `correct` (default: the verifier's own `correct` keyword when it is a
    functools.partial that sets one, else CORRECT_REWARD). A verifier that raises on a gold (arith_reward on a
    non-integer), times out or fails counts as not reading it.

    Limit: math_equal accepts an answer identical to the gold without parsing either, so a one-line gold that
    math-verify cannot parse but that a model could copy verbatim ("She has 5 apples") passes this check.
    Raises TypeError for a gold that is not a str.
    """
    for i, gold in enumerate(golds):
        if not isinstance(gold, str):
            raise TypeError(f"check_golds: golds[{i}] must be str, got {type(gold).__name__}")
    if correct is None:
        keywords = verifier.keywords if isinstance(verifier, functools.partial) else {}
        correct = keywords.get("correct", CORRECT_REWARD)
    distinct = list(dict.fromkeys(golds))
    forms = [(f"Answer: {gold}", gold) for gold in distinct] + [(f"\\boxed{{{gold}}}", gold) for gold in distinct]
    if num_workers == 0:
        verifier = functools.partial(_score_or_nan, verifier)
    scores = reward_batch([response for response, _ in forms], [gold for _, gold in forms], verifier,
                         num_workers=num_workers, stats={})
    unreadable = {gold for (_, gold), score in zip(forms, scores) if score != correct}
    return [i for i, gold in enumerate(golds) if gold in unreadable]


@dataclasses.dataclass(frozen=True)
class Verifier:
    """A verifier function and where it runs, passed around the trainer as one object.

    fn: (response, gold) -> reward, picklable (math_reward, arith_reward, or a functools.partial of one).
    workers: worker processes for reward_batch (None = one per CPU core, at most DEFAULT_MAX_WORKERS; 0 = in this
    process, for cheap and safe verifiers like arith_reward)."""
    fn: Callable[[str, str], float] = math_reward
    workers: int | None = None

    def rewards(self, responses: Sequence[str], golds: Sequence[str], stats: dict | None = None) -> list[float]:
        """reward_batch with this verifier: one reward per response, in order (stats: its counts)."""
        return reward_batch(responses, golds, verifier=self.fn, num_workers=self.workers, stats=stats)

    def unreadable_golds(self, golds: Sequence[str]) -> list[int]:
        """check_golds with this verifier: indices of the gold answers it cannot read."""
        return check_golds(golds, self.fn, num_workers=self.workers)
