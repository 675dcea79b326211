"""Shared fixtures: everything is built locally (no downloads), small enough to run in seconds on a CPU."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # the modules live at the repository's top level
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session")
def tokenizer():
    from task import build_tokenizer
    return build_tokenizer()


@pytest.fixture()
def tiny_policy(tokenizer):
    """A fresh randomly initialised ~1M-parameter Qwen2 policy (float32, eval mode)."""
    from task import build_tiny_policy
    return build_tiny_policy(tokenizer, seed=0).eval()
