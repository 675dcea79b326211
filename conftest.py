"""Shared fixtures of the three suites (tests/, scale/tests/, bench/tests/): everything is built locally (no downloads),
small enough to run in seconds on a CPU."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:  # the modules live at the repository's top level
    sys.path.insert(0, ROOT)


def pytest_collection_modifyitems(items):
    """The slow tests first (in file order), then the rest: with two workers (pytest.ini's -n auto) the last
    minutes are then short tests that fill in, not one worker running a 4-minute test while the other waits."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order within each part


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """One torch thread for the whole suite: the tiny models here run faster on one thread, and much faster on a
    shared, loaded 2-core machine, where 2 threads made each forward pass 20-40x slower through contention.
    Subprocesses started by tests get OMP_NUM_THREADS=1 for the same reason."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer():
    from machinery.task import build_tokenizer
    return build_tokenizer()


@pytest.fixture()
def tiny_policy(tokenizer):
    """A fresh randomly initialised ~1M-parameter Qwen2 policy (float32, eval mode)."""
    from machinery.task import build_tiny_policy
    return build_tiny_policy(tokenizer, seed=0).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A folder holding a fresh random ~1M-parameter policy and the built-in tokenizer (what --model takes)."""
    from machinery.task import build_tiny_policy, build_tokenizer
    path = str(tmp_path_factory.mktemp("tiny"))
    tok = build_tokenizer()
    build_tiny_policy(tok, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path
