"""Time bounds for reward.py's verifiers: the machinery, apart from the rules it bounds.

- soft_bounded(fn, seconds): fn() or None past `seconds`, by SIGALRM in the process that runs it. math_equal and
  reasoning_gym_reward compare under it, so they are bounded in any process, the trainer's own included
  (reward_batch with num_workers=0), and a worker that gives up at it carries on, where one killed at the hard
  bound costs a new worker's start (about a second).
- score_in_pool(...): reward_batch's worker processes, a pebble.ProcessPool per process, each item under a hard
  wall-clock bound: a worker past it is killed and replaced (time in C code cannot be interrupted otherwise).
  pebble is imported there, on first use: the built-in task scores in process and never needs it.

A module of its own so that reward.py reads as the rules; reward.py imports it, never the other way round.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import math
import multiprocessing
import os
import pickle
import signal
import sys
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

SOFT_BOUND_REPEAT_S = 0.1
"""After the soft bound expires, its alarm repeats at this interval until the comparison has stopped: one
interrupt can be lost (raised inside a garbage-collection callback, Python prints it and carries on)."""
_EXIT_UNGUARDED_MAIN = 86
"""Exit code of a worker that found the main script calling reward_batch while the worker imported it."""
_UNGUARDED_MAIN_MESSAGE = (
    "reward_batch: the scoring workers could not start (a traceback they printed says why). The usual cause: the "
    "main script calls reward_batch as soon as it is imported. The workers are started with the 'spawn' method, "
    "which imports the main script again in each worker (as \"__mp_main__\"), so each worker would try to start "
    "workers of its own. Fix: put the script's entry code under `if __name__ == \"__main__\":`, or pass "
    "num_workers=0 to score in this process (no time bound, only for cheap verifiers such as arith_reward).")


# ---------------------------------------------------------------------------------------------------------
# The soft bound
# ---------------------------------------------------------------------------------------------------------

class SoftBoundExpired(BaseException):
    """Raised by soft_bounded's alarm. A BaseException, as math-verify's own TimeoutException, so that the
    `except Exception` blocks of math-verify and sympy let it through."""


expiries = 0
"""How many soft_bounded calls in this process were cut short: reward_batch counts its items' from this."""


# math-verify warns once per process that its timeouts are off and that the caller must bound the time itself:
# math_equal does (soft_bounded), so that warning is dropped; every other record passes.
for _name in ("math_verify.grader", "math_verify.parser"):
    logging.getLogger(_name).addFilter(lambda record: not record.getMessage().startswith("Timeout is disabled"))


def soft_bounded(fn: Callable[[], bool], seconds: float) -> bool | None:
    """fn(), or None if it ran past `seconds` of wall-clock time: SIGALRM (signal.setitimer) then raises
    SoftBoundExpired in the code running, and again every SOFT_BOUND_REPEAT_S until fn has stopped, so that an
    interrupt lost in a garbage-collection callback is followed by another. Main thread only: ValueError elsewhere.

    Where the alarm must not raise: in this function's own frame (its bookkeeping), and anywhere below an
    unraisable hook. An interrupt raised in a weakref callback or __del__ cannot propagate; Python hands it to
    sys.unraisablehook, which here is `lost` (it drops our own interrupts without formatting them, and passes
    any other to the hook that was installed before). A repeat that fired while a hook formats a traceback
    (pytest's reads source files) would break the hook itself: so no frame under `lost` is interrupted.
    """
    global expiries
    this_frame = soft_bounded.__code__
    previous_hook = sys.unraisablehook

    def lost(unraisable):
        if not isinstance(unraisable.exc_value, SoftBoundExpired):
            previous_hook(unraisable)

    def under_a_hook(frame) -> bool:
        while frame is not None:
            if frame.f_code is lost.__code__:
                return True
            frame = frame.f_back
        return False

    def alarm(signum, frame):
        if frame is not None and frame.f_code is not this_frame and not under_a_hook(frame):
            raise SoftBoundExpired

    try:
        previous = signal.signal(signal.SIGALRM, alarm)
    except ValueError:
        raise ValueError("math_equal's timeout uses SIGALRM, which only the main thread can handle: call it from "
                         "the main thread (as reward_batch's workers do), or pass timeout_s=None and bound the "
                         "time yourself") from None
    sys.unraisablehook = lost
    expired = False
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds, SOFT_BOUND_REPEAT_S)
        result = fn()
    except SoftBoundExpired:
        expired = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.unraisablehook = previous_hook
    if expired:
        expiries += 1
        return None
    return result


# ---------------------------------------------------------------------------------------------------------
# The worker pool
# ---------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def quiet_math_verify():
    """Inside: math-verify's log records go nowhere (unconfigured logging prints WARNINGs to stderr, some quoting
    the answer however long); reward_batch counts what they report. The logger's settings are restored on exit."""
    log = logging.getLogger("math_verify")
    level, propagate = log.level, log.propagate
    log.setLevel(logging.ERROR)
    log.propagate = False
    try:
        yield
    finally:
        log.setLevel(level)
        log.propagate = propagate


def _start_worker(verifier: bytes) -> None:
    """Run by pebble in each new worker before its first item."""
    # pebble stops a timed-out worker with SIGTERM and waits 3 s before SIGKILL. Its SIGTERM handler is Python,
    # which cannot run while the worker computes in C (a huge integer power): the default action ends it at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    quiet_math_verify().__enter__()  # for the worker's whole life: its stderr is the console
    # Import the verifier's module (math-verify and sympy: about a second) here, where the item's clock is not yet
    # running, so a replacement worker's first item is not cut at the bound. An error is that item's to report.
    # A verifier of ours may also name a warm_up (reward.py's: one fixed, quick item), which makes here the imports
    # its first call makes lazily (reasoning-gym's package: 1.6 s where site-packages holds no byte-compiled files),
    # not inside the first item's bound. A user's verifier names none and is never called outside its bound.
    with contextlib.suppress(Exception):
        fn = pickle.loads(verifier)
        warm_up = getattr(getattr(fn, "func", fn), "warm_up", None)  # a functools.partial's function's too
        if warm_up is not None:
            warm_up()


def _score_item(verifier: bytes, response: str, gold: str) -> tuple[float, bool]:
    """In a worker: (verifier(response, gold), whether math_equal's soft bound cut it short).

    The verifier comes pickled and is unpickled here: pebble unpickles its tasks outside any task, where a
    verifier the worker cannot import would end the worker and leave the item waiting forever."""
    before = expiries
    score = float(pickle.loads(verifier)(response, gold))
    return score, expiries > before


class Tally:
    """What went wrong in one reward_batch call: items killed at the hard bound (timeouts), cut short by the soft
    bound (cut_short), failed (errors, with a few distinct messages, enough to tell causes apart)."""

    def __init__(self):
        self.timeouts = self.cut_short = self.errors = 0
        self.examples: list[str] = []

    def error(self, message: str) -> None:
        self.errors += 1
        if len(self.examples) < 3 and message not in self.examples:
            self.examples.append(message)


_pools: dict[tuple[int, int], "pebble.ProcessPool"] = {}
"""The persistent pools, by (workers, pid): the pid because a forked child must make its own."""


def _pebble():
    """The pebble package, imported on first use (optional: only worker pools need it), or one line naming it."""
    try:
        import pebble  # optional: the built-in task and num_workers=0 score in process without it
    except ImportError:
        raise ImportError("scoring in worker processes (datasets' verifiers, reward_workers > 0) needs the pebble "
                          "package: pip install pebble") from None
    return pebble


def _pool(num_workers: int, verifier: bytes) -> "pebble.ProcessPool":
    """This process's pool of num_workers workers, started by the first reward_batch that needs it (or again if
    it broke) and kept for later calls, so start-up is paid once. Its workers import `verifier`'s module."""
    key = (num_workers, os.getpid())
    if key not in _pools or not _pools[key].active:
        # spawn, not fork: forking a trainer that runs torch threads can deadlock the child.
        _pools[key] = _pebble().ProcessPool(num_workers, initializer=_start_worker, initargs=(verifier,),
                                          context=multiprocessing.get_context("spawn"))
    return _pools[key]


@atexit.register
def _stop_pools() -> None:
    for (_, pid), pool in list(_pools.items()):
        if pid == os.getpid():  # a forked copy must not stop its parent's workers
            pool.stop()
            pool.join()


def score_in_pool(verifier: Callable, jobs: dict[int, tuple[str, str]], num_workers: int, timeout_s: float,
                  scores: list[float], tally: Tally, retry: bool = True) -> None:
    """Write verifier(*jobs[i]) into scores[i] for every i, each item bounded by timeout_s (pebble kills the
    worker and starts another); failed items keep what scores holds and are counted in tally."""
    pebble = _pebble()
    process = multiprocessing.current_process()
    if getattr(process, "_inheriting", False):  # multiprocessing's own test for "still bootstrapping"
        # This process is a spawned child importing its parent's main script, which called reward_batch at
        # import time. Starting a pool here would fail with a long multiprocessing traceback. Our own
        # worker exits quietly and the parent raises one clear error; any other process raises it.
        if process.name == pebble.pool.process.WORKERS_NAME:
            sys.exit(_EXIT_UNGUARDED_MAIN)
        raise RuntimeError(_UNGUARDED_MAIN_MESSAGE)
    try:
        payload = pickle.dumps(verifier)
    except Exception as exc:  # PicklingError, AttributeError or TypeError depending on the object
        raise TypeError(f"reward_batch: the verifier must be picklable (a module-level function or a "
                        f"functools.partial of one) to run in worker processes: {exc}") from None
    pool = _pool(num_workers, payload)
    futures = {i: pool.schedule(_score_item, (payload, *job), timeout=timeout_s) for i, job in jobs.items()}
    lost = {}
    for i, future in futures.items():
        try:
            score, cut_short = future.result()
        except TimeoutError:
            tally.timeouts += 1
        except BrokenProcessPool:  # every worker died outside any item pebble knew to be running
            lost[i] = jobs[i]
        except pebble.ProcessExpired as exc:  # its worker died (pebble starts another)
            tally.error(f"worker died with exit code {exc.exitcode}")
        except Exception as exc:  # the verifier's own error, raised again here by pebble
            tally.error(f"{type(exc).__name__}: {exc}"[:300])
        else:
            tally.cut_short += cut_short
            if math.isfinite(score):
                scores[i] = score
            else:
                tally.error(f"non-finite score {score}")
    if not lost:
        return
    # A pool breaks when its workers cannot start, and (rarely) when a worker dies before pebble has seen it
    # take its item. A fresh pool scores the lost items once more; if it breaks too, before scoring any, the
    # workers cannot start.
    if retry:
        score_in_pool(verifier, lost, num_workers, timeout_s, scores, tally, retry=False)
    elif len(lost) == len(jobs):
        raise RuntimeError(_UNGUARDED_MAIN_MESSAGE)
    else:
        for _ in lost:
            tally.error("the worker pool broke")
