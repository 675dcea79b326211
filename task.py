"""The built-in task: a byte-level tokenizer, a ~1M-parameter Qwen2-style model, a synthetic multi-step
arithmetic task with a chain of thought, the task's base models and the long chains' outcome reward model.
Everything is built locally: nothing is downloaded.

The task (one problem = a start value and 1 to MAX_STEPS labelled terms; one response line per step):

    prompt:    "Compute: 13 a-7 b-5 c+7\n"
    response:  "13 a-7=06\n06 b-5=01\n01 c+7=08\nAnswer: 8"            (then EOS)

Each line restates the running total, then the labelled term, then the new total: `<total> <label><op><term>=
<new total>`. Why this shape (each choice measured on the 1M model, see the build's docstring):
- the label makes finding the next term a copy (the term after "c" in the prompt), not a count of lines;
- totals are written in two digits, so every operand sits at the same offset from the `=`;
- restating the total puts both operands right before the `=`: with the total only at the end of the line
  before, the arithmetic was learned about 1.5x slower;
- the correct total stays in 0..MAX_VALUE (a sign that would leave it is flipped): few facts to learn.
The last line is `Answer: <integer>`, the form reward.arith_reward checks. Responses run from 20 tokens (one
step) to 111 (ten steps), mean about 65, EOS included.

Why this task makes VAPO's three problems real:
- heterogeneous lengths: 1 to 10 steps in one batch, 20 to 111 tokens;
- sparse terminal reward: only the final `Answer:` line is checked, a slip in any step makes it wrong;
- a value model that knows nothing: the critic starts from the warm-started policy's weights plus a zero head.

The base model is a supervised warm start on *imperfect* demonstrations. Besides random slips (ERROR_PROB
per step), the demonstrations have a systematic habit: when a subtraction from a two-digit total crosses a
multiple of ten (about 1 step in 5), they usually (HABIT_PROB) forget the borrow (12-5 -> 17). The warm start
is long enough for the model to be precise at everything else (no wrong ordinary step under greedy decoding):
greedy decoding follows the habit on nearly every borrow step, so base accuracy is low under greedy decoding as
well as under sampling, and falls with the number of steps; sampling at temperature 1 still takes the correct
path on about one borrow step in three, which is what RL must find and reinforce (`python task.py eval` prints
these rates, see step_errors). Each wrong step is carried into the next line, so the final answer is wrong.
The habit only ever adds 10, so two habit errors never cancel.

Held-out split: every expression belongs to exactly one split, "train" or "eval", by a hash of its text
(EVAL_FRACTION of all expressions are "eval"), so training prompts and held-out prompts never overlap, whatever
the seeds. The base model is trained on "train" expressions only.

The long chains (LONG, `--preset long`): the same task with 1 to 40 steps (labels a-z, then A-N), so responses run
from 10 tokens (a guess) or 20 (one step) to 411, with about 8 borrow decisions at 40 steps. Their base model
(<repo>/base-model-long, `python task.py build --chains long`) continues the demo's on demonstrations whose habit
is a minority (so each borrow step is a decision a sample gets right about 7 times in 10) and one in ten of which
skips the chain and guesses ("Answer: <n>" at once: the shortcut a policy can collapse to). Their outcome reward
model (<repo>/reward-model-long, `python task.py reward-model`) is trained, as reward models are, on the base
policy's own samples labelled by the verifier, on its score at the EOS token only; the long preset's critic starts
from it. docs/long.md has their figures.

The base model is shipped (SHIPPED_BASE, <repo>/base-model, 4 MB): the demo starts from the same weights on
every machine. Entry points: `python task.py build [--seed N] [--out DIR]` rebuilds it (into the cache,
<repo>/.cache/arith-base-v4 or $VAPO_CACHE/arith-base-v4, unless --out) and prints its accuracy table and
whether it is bit-identical to the shipped one; `python task.py eval [--model DIR]` prints accuracy by number
of steps and the step error rates. Other code calls `ensure_base_model()`, which returns the shipped folder.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass

import torch
from tokenizers.pre_tokenizers import ByteLevel
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

from models import replace_atomically
from reward import arith_reward

EOS = "<|endoftext|>"

# --- the task ---------------------------------------------------------------------------------------------
MIN_STEPS, MAX_STEPS = 1, 10  # steps per problem
# step labels: the response line for a step starts with the label the prompt gives its term (the demo uses a-j,
# the long chains a-z then A-N)
TAGS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"
MAX_VALUE = 19  # the correct running total stays in 0..MAX_VALUE, so there are few arithmetic facts to learn
PROMPT_PREFIX = "Compute: "
ANSWER_PREFIX = "Answer: "
EVAL_FRACTION = 0.2  # share of all expressions reserved for held-out evaluation (by hash, see split_of)
HABIT_PROB = 0.65  # P(forget the borrow | is_borrow_step), in demonstrations
ERROR_PROB = 0.03  # P(a random slip of +-1 or +-2) on any step of a demonstration
MAX_RESPONSE_TOKENS = 128  # generation budget: ten correct steps take 111 tokens with EOS


@dataclass(frozen=True)
class Chains:
    """One version of the task: how many steps its problems have, what its demonstrations do wrong, the budget
    it is generated with. DEMO is the demo's (the constants above); LONG is `--preset long`'s."""
    name: str
    min_steps: int
    max_steps: int
    habit_prob: float
    """P(the demonstration forgets the borrow | a borrow step)"""
    error_prob: float
    """P(a random slip of +-1 or +-2) on any step of a demonstration"""
    shortcut_prob: float
    """P(the demonstration skips the chain and writes "Answer: <gold>" at once): the guess a policy can take"""
    max_response_tokens: int
    eval_per_step: int
    """held-out problems per step count in the build's accuracy table"""


DEMO = Chains("demo", MIN_STEPS, MAX_STEPS, HABIT_PROB, ERROR_PROB, 0.0, MAX_RESPONSE_TOKENS, 30)
# The long chains (`--preset long`): 1 to 40 steps, so one batch holds responses of 10 to 411 tokens (about 8
# borrow steps at 40). The habit is a minority here (30%): each borrow step is a decision that a sample gets right
# 7 times in 10, and the chain is right only if all of them are, so the sampled accuracy falls from about 90% at one
# step to a few percent at 40 (0.7^8 = 6%, with the slips less). One demonstration in ten skips the chain and
# guesses (the shortcut): the base model's guess is right about 1 time in 20 at any length (measured: 3-10% by
# band), as often as a sampled chain at 21-40 steps, so a policy can collapse to short guesses. docs/long.md has
# the measured tables.
LONG = Chains("long", 1, 40, 0.3, 0.01, 0.1, 448, 10)
CHAINS = {c.name: c for c in (DEMO, LONG)}

# --- the base model (supervised warm start) ---------------------------------------------------------------
BASE_NAME = "arith-base-v4"  # bump when the task or the recipe changes, so stale caches are not reused
BUILD_INFO = "build_info.json"
ROOT = os.path.dirname(os.path.abspath(__file__))
# The base model the demo starts from, built once by `python task.py build --out base-model` and committed, so
# every machine starts from the same bits (a rebuild on another CPU gives another model: its kernels round
# differently). SHIPPED_SHA256 is its weights' checksum; tests check the files against it and their accuracy
# against build_info.json.
SHIPPED_BASE = os.path.join(ROOT, "base-model")
SHIPPED_SHA256 = "c3778d821c15ce7706fd6e96a3ae395aee6e17ed8589319f6825be3afcf64cd7"
SFT_STEPS = 2000  # about 8 minutes on one CPU core (fp32, 0.23 s/step); see warm_start and build_base_model
SFT_TOKENS_PER_BATCH = 2048  # batch size adapts to the sequence length of the step count drawn
SFT_LR = 3e-3
SFT_INIT_STD = 0.1  # init std of the warm start: with Qwen2's 0.02 finding the labelled terms took far longer
SFT_WARMUP = 20
SFT_SEED = 0
EVAL_SEED = 1  # seed of the held-out problems the build measures accuracy on
EVAL_PER_STEP = 30  # held-out problems per step count in the build's accuracy table

# The long chains' models, shipped beside base-model/: base-model-long/ (`python task.py build --chains long --out
# base-model-long`) and reward-model-long/ (`python task.py reward-model --out reward-model-long`).
SHIPPED_LONG_BASE = os.path.join(ROOT, "base-model-long")
SHIPPED_LONG_RM = os.path.join(ROOT, "reward-model-long")
# --model / --value-model names of the shipped models
BUILTIN_MODELS = {"builtin": SHIPPED_BASE, "builtin-long": SHIPPED_LONG_BASE, "builtin-long-rm": SHIPPED_LONG_RM}
# A recipe per version of the task: its stages, (optimizer steps, peak learning rate) each, one warmup-and-cosine
# schedule per stage, stage i drawing its batches with seed + i. The long base model continues from the demo's
# (init) in two stages: about 0.65 s a step of 4,096 tokens on one core, so its build takes about 50 minutes. One
# stage of 1,500 steps left the model misreading a term on many lines of a long prompt (it copies a neighbour's
# term); docs/long.md has the figures of each stage.
LONG_SFT_STAGES = ((2500, 1e-3), (2000, 1e-3))
LONG_SFT_STEPS = sum(s for s, _ in LONG_SFT_STAGES)
LONG_BASE_SHA256 = "915808c5ea0d71be64f2c55bd03cb0975853d6c44c8f2f786bb164dc7b77bdf3"  # base-model-long/'s weights
LONG_RM_SHA256 = "fff76502cd5d41fde2afa44321f437cd5f6c8429305655f6347f82503360682d"  # reward-model-long/'s
RECIPES = {
    "demo": dict(name=BASE_NAME, stages=((SFT_STEPS, SFT_LR),), tokens_per_batch=SFT_TOKENS_PER_BATCH, init=None),
    "long": dict(name="arith-long-base-v1", stages=LONG_SFT_STAGES, tokens_per_batch=4096, init="builtin"),
}


# --- tokenizer and model ----------------------------------------------------------------------------------
def build_tokenizer() -> Qwen2Tokenizer:
    """A byte-level tokenizer with no merges: one token per byte (256) plus EOS, which is also the pad token.

    Byte-level with an empty merge list round-trips any text exactly, also after save_pretrained /
    AutoTokenizer.from_pretrained (a character-level vocabulary would silently lose its spaces on reload: in
    transformers 5.x AutoTokenizer rebuilds a Qwen2 tokenizer from vocab and merges and drops the saved
    pre-tokenizer). Padding is on the left, as generation needs.
    """
    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}  # deterministic ids 0..255
    vocab[EOS] = len(vocab)
    return Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token=EOS, pad_token=EOS,
                          padding_side="left")  # a constructor argument, so save_pretrained keeps it


def tiny_config(tokenizer, **overrides) -> Qwen2Config:
    """Qwen2 shape of about 1M parameters (hidden 128, 4 layers, 4 heads, 2 KV heads, tied embeddings)."""
    kw = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=512, vocab_size=len(tokenizer), tie_word_embeddings=True,
              max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
              pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    kw.update(overrides)
    return Qwen2Config(**kw)


def build_tiny_policy(tokenizer, seed: int = 0, **overrides) -> Qwen2ForCausalLM:
    """A randomly initialised tiny policy (float32), for tests and as the starting point of the warm start."""
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_config(tokenizer, **overrides))


# --- problems -----------------------------------------------------------------------------------------------
def split_of(expr: str) -> str:
    """"eval" for a fixed EVAL_FRACTION of all expressions, "train" for the rest (stable across runs and seeds)."""
    h = int.from_bytes(hashlib.sha256(expr.encode()).digest()[:8], "big")
    return "eval" if h % 10_000 < EVAL_FRACTION * 10_000 else "train"


def make_problem(rng: random.Random, n_steps: int) -> dict:
    """A random start value and n_steps labelled terms (+b or -b, b in 1..9).

    The correct running total stays in 0..MAX_VALUE: a sign that would leave the range is flipped. Returns
    {"prompt", "answer", "n_steps", "expr"}: prompt is the exact model input ("Compute: 7 a+5 b-3\n"),
    answer the gold integer as a string, expr the plain expression ("7+5-3").
    """
    if not 1 <= n_steps <= len(TAGS):
        raise ValueError(f"n_steps must be in 1..{len(TAGS)}, got {n_steps}")
    value = rng.randint(1, MAX_VALUE)
    expr, prompt = str(value), str(value)
    for tag in TAGS[:n_steps]:
        b, op = rng.randint(1, 9), rng.choice("+-")
        if not 0 <= _apply(value, op, b) <= MAX_VALUE:
            op = "-" if op == "+" else "+"
        value = _apply(value, op, b)
        expr += f"{op}{b}"
        prompt += f" {tag}{op}{b}"
    return {"prompt": f"{PROMPT_PREFIX}{prompt}\n", "answer": str(value), "n_steps": n_steps, "expr": expr}


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def make_dataset(n: int, seed: int, min_steps: int = MIN_STEPS, max_steps: int = MAX_STEPS,
                 split: str = "train") -> list[dict]:
    """n problems of the given split, deterministic for (seed, split, step range).

    Step counts cycle through min_steps..max_steps, so every count is equally represented, then the list is
    shuffled. Problems are drawn until one falls in the requested split (see split_of): training and held-out
    sets never share a prompt. The trainer uses split="train", seed 0; evaluation uses split="eval".
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    rng = random.Random(f"{split}/{seed}/{min_steps}/{max_steps}")
    span = max_steps - min_steps + 1
    problems = [_problem_in_split(rng, min_steps + i % span, split) for i in range(n)]
    rng.shuffle(problems)
    return problems


def _problem_in_split(rng: random.Random, n_steps: int, split: str) -> dict:
    while True:
        p = make_problem(rng, n_steps)
        if split_of(p["expr"]) == split:
            return p


def parse_expr(problem: dict) -> tuple[int, list[tuple[str, int]]]:
    """(start value, [(op, term), ...]) of a problem, read from its prompt."""
    first, *terms = problem["prompt"].removeprefix(PROMPT_PREFIX).split()
    return int(first), [(t[1], int(t[2:])) for t in terms]


def is_borrow_step(a: int, op: str, b: int) -> bool:
    """The habit's trigger: a subtraction from a two-digit total that crosses a multiple of ten (12-5, 31-4)."""
    return op == "-" and a >= 10 and a % 10 < b


def habit_value(a: int, op: str, b: int) -> int:
    """What the habit writes on a borrow step: the borrow is forgotten, the tens digit stays (12-5 -> 17).

    The habit only ever adds 10, so habit errors never cancel and wrong chains never go negative.
    """
    return a - b + 10


def _chain(problem: dict, step) -> tuple[str, list]:
    """One line per step, "<total> <label><op><term>=<new total>" (totals in two digits), then "Answer: ".

    step(a, op, b) -> (new total, note) computes each step. The total written on a line is what the next line
    starts from, so a wrong step carries into the answer.
    """
    value, terms = parse_expr(problem)
    lines, notes = [], []
    for tag, (op, b) in zip(TAGS, terms):
        new, note = step(value, op, b)
        notes.append(note)
        lines.append(f"{value:02d} {tag}{op}{b}={new:02d}")
        value = new
    return "\n".join(lines + [f"{ANSWER_PREFIX}{value}"]), notes


def solve(problem: dict) -> str:
    """The correct chain-of-thought response (without EOS); its last line is `Answer: <gold>`."""
    return _chain(problem, lambda a, op, b: (_apply(a, op, b), None))[0]


def make_demonstration(problem: dict, rng: random.Random, habit_prob: float = HABIT_PROB,
                       error_prob: float = ERROR_PROB, shortcut_prob: float = 0.0) -> dict:
    """An imperfect demonstration of the problem, the base model's training text.

    On a borrow step (is_borrow_step) the borrow is forgotten with probability habit_prob (habit_value:
    12-5 -> 17); then, on any step, a random slip of +-1 or +-2 with probability error_prob. The chain
    continues from the written total, so any wrong step makes the answer wrong. With probability shortcut_prob
    the demonstration has no chain at all: "Answer: <gold>" at once (a model trained on it learns to guess).
    Returns {"response", "borrow_steps" (steps that could trigger the habit), "habit_steps", "slips", "correct",
    "shortcut"}.
    """
    if shortcut_prob > 0 and rng.random() < shortcut_prob:  # no draw without it: the demo's recipe is unchanged
        return {"response": f"{ANSWER_PREFIX}{problem['answer']}", "borrow_steps": 0, "habit_steps": 0,
                "slips": 0, "correct": True, "shortcut": True}

    def step(a, op, b):
        borrow = is_borrow_step(a, op, b)
        habit = borrow and rng.random() < habit_prob
        value = habit_value(a, op, b) if habit else _apply(a, op, b)
        slip = rng.random() < error_prob
        if slip:
            value += rng.choice((-2, -1, 1, 2))
        return value, (borrow, habit, slip)

    response, notes = _chain(problem, step)
    return {"response": response, "borrow_steps": sum(n[0] for n in notes),
            "habit_steps": sum(n[1] for n in notes), "slips": sum(n[2] for n in notes),
            "correct": is_correct(response, problem["answer"]), "shortcut": False}


# --- checking answers ---------------------------------------------------------------------------------------
def is_correct(response: str, gold: str) -> bool:
    """Whether a response's final answer equals gold: reward.arith_reward, the RL reward's own check."""
    return arith_reward(response, gold) > 0


_LINE = re.compile(r"(\d+) ([a-zA-Z])([+-])(\d)=(\d+)")


def step_errors(response: str, problem: dict) -> dict[str, int]:
    """What a response did on each step it wrote, judged against the line's own start total (so an early error
    is not counted again on every later line). Counts: "borrow" steps (is_borrow_step) and on them "habit"
    (habit_value written) and "borrow_ok" (the correct total); "other" steps and "other_wrong" among them;
    "lookup_wrong" (a line whose label, sign or term is not the prompt's). Stops at the first line that is not
    a step line. Tells a base model that only has the habit (what RL is meant to fix) from one that is also
    imprecise at the arithmetic itself (which RL must then teach, far more slowly)."""
    counts = dict(borrow=0, habit=0, borrow_ok=0, other=0, other_wrong=0, lookup_wrong=0)
    _, terms = parse_expr(problem)
    for line, tag, (op, b) in zip(response.split("\n"), TAGS, terms):
        m = _LINE.fullmatch(line)
        if m is None:
            break
        a, written_op, written_b, new = int(m[1]), m[3], int(m[4]), int(m[5])
        counts["lookup_wrong"] += (m[2], written_op, written_b) != (tag, op, b)
        right = _apply(a, written_op, written_b)
        if is_borrow_step(a, written_op, written_b):
            counts["borrow"] += 1
            counts["habit"] += new == habit_value(a, written_op, written_b)
            counts["borrow_ok"] += new == right
        else:
            counts["other"] += 1
            counts["other_wrong"] += new != right
    return counts


def borrow_digits(response: str) -> list[int]:
    """Character offsets in response of the tens digit that each borrow step's line writes ("12 b-5=07": the 0,
    where the habit writes 1): the decisive tokens of a chain, where a sample keeps or forgets the borrow. Borrow
    steps by the line's own operands; stops at the first line that is not a step line."""
    out, offset = [], 0
    for line in response.split("\n"):
        m = _LINE.fullmatch(line)
        if m is None:
            break
        if is_borrow_step(int(m[1]), m[3], int(m[4])):
            out.append(offset + m.start(5))
        offset += len(line) + 1
    return out


def first_error(response: str, problem: dict) -> int | None:
    """Character offset in response where a wrong response first departs from the correct chain (solve(problem)):
    the first character of its first wrong step (a forgotten borrow writes its tens digit there, a misread term
    its label, sign or term), or of a guess that skips the chain; None when the response's answer is right."""
    if is_correct(response, problem["answer"]):
        return None
    correct = solve(problem)
    return next((i for i, (a, b) in enumerate(zip(response, correct)) if a != b), min(len(response), len(correct)))


def first_error_kind(response: str, problem: dict) -> str | None:
    """What a wrong response's first wrong line did, against the correct chain (solve(problem)): "misread" (its
    label, sign or term is not the prompt's: a lookup), "habit" (a borrow step writing habit_value), "slip" (any
    other wrong total on a line whose term is right), "early" (an answer line before the chain's end, a shortcut
    included) or "other" (a line that is not a step line, or a wrong answer after a right chain); None when the
    answer is right. One kind per response, where step_errors counts every line (a skipped term misaligns all
    the lines after it)."""
    if is_correct(response, problem["answer"]):
        return None
    for line, want in zip(response.split("\n"), solve(problem).split("\n")[:-1]):
        if line == want:
            continue
        m, w = _LINE.fullmatch(line), _LINE.fullmatch(want)
        if m is None:
            return "early" if line.startswith(ANSWER_PREFIX) else "other"
        if m.group(2, 3, 4) != w.group(2, 3, 4):
            return "misread"
        a, op, b = int(m[1]), m[3], int(m[4])
        return "habit" if is_borrow_step(a, op, b) and int(m[5]) == habit_value(a, op, b) else "slip"
    return "other"


FIRST_ERROR_KINDS = ("misread", "habit", "slip", "early", "other")


# --- evaluation ---------------------------------------------------------------------------------------------
def generate_responses(model, tokenizer, problems: list[dict], temperature: float, top_p: float = 1.0,
                       samples: int = 1, max_new_tokens: int = MAX_RESPONSE_TOKENS, batch_size: int = 128,
                       progress: bool = False):
    """[(problem, response text, response tokens with EOS)] of plain `model.generate`, `samples` per problem
    (temperature 0: greedy), in batches of one step count (one prompt length, similar response lengths)."""
    jobs = sorted((p for p in problems for _ in range(samples)), key=lambda p: (p["n_steps"], p["prompt"]))
    # top_k=0: plain temperature / nucleus sampling, not generate's habit of a top-50 cut when it has a default
    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else \
        dict(do_sample=False)
    model.eval()
    out = []
    for i in tqdm(range(0, len(jobs), batch_size), desc="sampling", disable=not progress, mininterval=2):
        batch = jobs[i:i + batch_size]
        enc = tokenizer([p["prompt"] for p in batch], return_tensors="pt", padding=True)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, **sampling,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        new = ids[:, enc["input_ids"].shape[1]:]  # [b, t]
        real = (new != tokenizer.pad_token_id).cumsum(-1) == torch.arange(1, new.shape[1] + 1)  # up to 1st EOS
        lengths = torch.minimum(real.sum(-1) + 1, torch.tensor(new.shape[1])).tolist()
        out += zip(batch, tokenizer.batch_decode(new, skip_special_tokens=True), lengths)
    return out


def evaluate_accuracy(model, tokenizer, problems: list[dict], temperature: float, top_p: float = 1.0,
                      samples: int = 1, max_new_tokens: int = MAX_RESPONSE_TOKENS, batch_size: int = 128) -> dict:
    """Accuracy of model on problems with plain `model.generate` (left-padded prompts).

    temperature 0 means greedy decoding (then samples > 1 only repeats the same answer). Each problem is
    sampled `samples` times. Returns {"accuracy", "by_steps": {n_steps: accuracy}, "count" (responses
    scored), "mean_tokens" (mean response length in tokens, EOS included), "steps": step_errors summed, with
    the rates "habit_rate" and "borrow_ok_rate" (per borrow step), "other_error_rate" (per other step) and
    "lookup_rate" (per step), "shortcut_rate" (responses that answer at once, without a chain), "first_errors":
    {kind: share of all responses whose first error is of that kind} (first_error_kind)}.
    """
    hits, tokens, steps, shortcuts = {}, 0, {}, 0
    first = dict.fromkeys(FIRST_ERROR_KINDS, 0)
    for p, text, length in generate_responses(model, tokenizer, problems, temperature, top_p, samples,
                                              max_new_tokens, batch_size):
        tokens += length
        hits.setdefault(p["n_steps"], []).append(is_correct(text, p["answer"]))
        shortcuts += text.startswith(ANSWER_PREFIX)
        kind = first_error_kind(text, p)
        if kind is not None:
            first[kind] += 1
        for k, v in step_errors(text, p).items():
            steps[k] = steps.get(k, 0) + v
    flat = [h for v in hits.values() for h in v]
    steps.update(habit_rate=steps["habit"] / max(steps["borrow"], 1),
                 borrow_ok_rate=steps["borrow_ok"] / max(steps["borrow"], 1),
                 other_error_rate=steps["other_wrong"] / max(steps["other"], 1),
                 lookup_rate=steps["lookup_wrong"] / max(steps["borrow"] + steps["other"], 1))
    return {"accuracy": sum(flat) / max(len(flat), 1),
            "by_steps": {n: sum(v) / len(v) for n, v in sorted(hits.items())},
            "count": len(flat), "mean_tokens": tokens / max(len(flat), 1), "steps": steps,
            "shortcut_rate": shortcuts / max(len(flat), 1),
            "first_errors": {k: v / max(len(flat), 1) for k, v in first.items()}}


def band_of(n_steps: int, width: int = 10) -> str:
    """The band of step counts a problem belongs to, as the long preset's evaluation reports it: "1-10", ..."""
    lo = (n_steps - 1) // width * width + 1
    return f"{lo}-{lo + width - 1}"


def by_band(by_steps: dict, width: int) -> dict[str, float]:
    """Accuracy by step count (equal numbers of problems per count) averaged over bands of `width` counts:
    {"1-5": ..., "6-10": ...}; width 1 gives {"1": ..., "2": ...}."""
    steps = sorted(int(n) for n in by_steps)
    bands = {}
    for n in steps:
        lo = (n - 1) // width * width + 1
        bands.setdefault(f"{lo}" if width == 1 else f"{lo}-{lo + width - 1}", []).append(by_steps[n] if n in by_steps
                                                                                         else by_steps[str(n)])
    return {k: sum(v) / len(v) for k, v in bands.items()}


def format_table(results: dict[str, dict]) -> str:
    """A text table of accuracy by number of steps (in bands of 5 above 10 steps), one column per entry of results
    (e.g. greedy, sampled), then what the responses did on borrow steps and on the other steps (see step_errors)."""
    names = list(results)
    width = 5 if max(int(n) for r in results.values() for n in r["by_steps"]) > MAX_STEPS else 1
    bands = {k: by_band(r["by_steps"], width) for k, r in results.items()}
    row = lambda label, cells: f"{label:<22}" + "".join(f"{c:>10}" for c in cells)  # noqa: E731
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    rows = [row("steps", names)]
    rows += [row(f"{b:>5}", [pct(bands[k].get(b, float("nan"))) for k in names]) for b in bands[names[0]]]
    rows.append(row("  all", [pct(results[k]["accuracy"]) for k in names]))
    if all("steps" in r for r in results.values()):
        for label, key in (("borrow steps: habit", "habit_rate"), ("borrow steps: correct", "borrow_ok_rate"),
                           ("other steps: wrong", "other_error_rate"), ("steps: term misread", "lookup_rate")):
            rows.append(row(label, [pct(results[k]["steps"][key]) for k in names]))
    if all("shortcut_rate" in r for r in results.values()):
        rows.append(row("answered at once", [pct(results[k]["shortcut_rate"]) for k in names]))
    return "\n".join(rows)


# --- the base model -----------------------------------------------------------------------------------------
def _sft_batch(tokenizer, rng: random.Random, n_steps: int, tokens_per_batch: int, chains: Chains = DEMO):
    """One batch of demonstrations with a single step count (so almost no padding): ids, labels [B, T]."""
    problems = [_problem_in_split(rng, n_steps, "train")]
    approx_len = len(problems[0]["prompt"]) + len(solve(problems[0])) + 1
    size = max(tokens_per_batch // approx_len, 8)
    problems += [_problem_in_split(rng, n_steps, "train") for _ in range(size - 1)]
    prompts = tokenizer([p["prompt"] for p in problems])["input_ids"]
    responses = tokenizer([make_demonstration(p, rng, chains.habit_prob, chains.error_prob, chains.shortcut_prob)
                           ["response"] for p in problems])["input_ids"]
    seqs = [(pr, re_ + [tokenizer.eos_token_id]) for pr, re_ in zip(prompts, responses)]
    width = max(len(pr) + len(re_) for pr, re_ in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)  # right-padded: training needs no left pad
    labels = torch.full((len(seqs), width), -100)  # loss on response tokens (and EOS) only
    for i, (pr, re_) in enumerate(seqs):
        ids[i, :len(pr) + len(re_)] = torch.tensor(pr + re_)
        labels[i, len(pr):len(pr) + len(re_)] = torch.tensor(re_)
    return ids, labels


def warm_start(model, tokenizer, steps: int = SFT_STEPS, seed: int = SFT_SEED, lr: float = SFT_LR,
               tokens_per_batch: int = SFT_TOKENS_PER_BATCH, progress: bool = True, chains: Chains = DEMO
               ) -> list[float]:
    """Supervised warm start on imperfect demonstrations (training split only); returns the loss per step.

    Loss on response tokens (and EOS) only. AdamW, warmup then cosine decay to 10%; one step count per batch,
    so padding is negligible. Always float32: bf16 autocast (once used where the CPU has native bf16) made the
    recipe itself differ between machines, and on this 1M model it saved nothing (0.21 against 0.23 s/step,
    one AVX-512 thread).
    """
    rng = random.Random(f"sft/{seed}")
    opt, sched = _optimizer(model, lr, steps)
    # a batch of n-step problems costs the same tokens for every n but holds ~n times more steps for long
    # problems (the prompt is paid once): drawing n with weight n spends the budget on steps, and on late labels
    step_counts = list(range(chains.min_steps, chains.max_steps + 1))
    model.train()
    losses = []
    bar = tqdm(range(steps), desc="warm start", disable=not progress, mininterval=2)
    for _ in bar:
        n_steps = rng.choices(step_counts, weights=step_counts)[0]
        ids, labels = _sft_batch(tokenizer, rng, n_steps, tokens_per_batch, chains)
        losses.append(_step(model, model(input_ids=ids, labels=labels).loss, opt, sched))
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    model.eval()
    return losses


def _optimizer(model, lr: float, steps: int):
    """AdamW and its schedule (SFT_WARMUP steps of linear warmup, then cosine decay to 10% at `steps`): the
    builds' optimizer."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / SFT_WARMUP) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / max(steps, 1), 1.0)))))
    return opt, sched


def _step(model, loss, opt, sched) -> float:
    """One optimizer step on loss, gradients clipped to norm 1; returns the loss."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return loss.item()


def measure_base(model, tokenizer, per_step: int = EVAL_PER_STEP, seed: int = EVAL_SEED, chains: Chains = DEMO
                 ) -> dict:
    """Greedy and sampled (temperature 1.0) accuracy on per_step held-out problems for each step count. The
    samples are drawn from a generator seeded with `seed` (the caller's RNG state is left as it was), so the
    same weights give the same figures on the same machine."""
    problems = make_dataset(per_step * (chains.max_steps - chains.min_steps + 1), seed, chains.min_steps,
                            chains.max_steps, split="eval")
    greedy = evaluate_accuracy(model, tokenizer, problems, temperature=0.0, max_new_tokens=chains.max_response_tokens)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        sampled = evaluate_accuracy(model, tokenizer, problems, temperature=1.0,
                                    max_new_tokens=chains.max_response_tokens)
    return {"greedy": greedy, "sampled": sampled}


def build_base_model(out_dir: str, steps: int | None = None, seed: int = SFT_SEED,
                     eval_per_step: int | None = None, progress: bool = True, chains: Chains = DEMO,
                     resume: tuple[str, int] | None = None) -> dict:
    """Warm-start the tiny policy on imperfect demonstrations and save it (tokenizer + model) into out_dir.

    Written atomically: built in a temporary folder beside out_dir, then renamed, so a killed build leaves no
    half-written folder. out_dir also gets BUILD_INFO, a JSON of the recipe, the build time and the measured
    greedy and sampled accuracy on held-out problems. Returns that JSON as a dict.

    Why the recipe is what it is (initialisation std 0.1, the total restated before each term, long problems
    drawn more often, 2,000 steps so that the model gets ordinary steps right and keeps only the borrow habit):
    docs/demo.md, "The base model". chains=LONG continues from the shipped demo base model instead of a random
    initialisation (RECIPES["long"]: it already knows the format, the arithmetic and labels a-j; docs/long.md).
    resume=(folder, k): start from the model in folder, the output of the recipe's first k stages, and run the
    rest (the same weights as one uninterrupted build: each stage starts a fresh optimizer and draws its batches
    from its own seed).
    """
    start = time.time()
    recipe = RECIPES[chains.name]
    stages = recipe["stages"] if steps is None else ((steps, recipe["stages"][0][1]),)  # --steps: one stage
    eval_per_step = chains.eval_per_step if eval_per_step is None else eval_per_step
    tokenizer = build_tokenizer()
    done = 0
    if resume is not None:
        model, done = AutoModelForCausalLM.from_pretrained(resume[0], dtype=torch.float32), resume[1]
    elif recipe["init"] is None:
        model = build_tiny_policy(tokenizer, seed=seed, initializer_range=SFT_INIT_STD)
        model.config.initializer_range = tiny_config(tokenizer).initializer_range  # new heads get the default
    else:
        model = AutoModelForCausalLM.from_pretrained(shipped_model(recipe["init"]), dtype=torch.float32)
    losses = []
    for i, (stage_steps, lr) in list(enumerate(stages))[done:]:
        losses += warm_start(model, tokenizer, steps=stage_steps, seed=seed + i, lr=lr,
                             tokens_per_batch=recipe["tokens_per_batch"], progress=progress, chains=chains)
    train_s = time.time() - start
    acc = measure_base(model, tokenizer, per_step=eval_per_step, chains=chains) if eval_per_step > 0 else {}
    info = {"name": recipe["name"], "task": {"chains": chains.name, "min_steps": chains.min_steps,
                                             "max_steps": chains.max_steps, "max_value": MAX_VALUE,
                                             "habit": "forgotten borrow", "habit_prob": chains.habit_prob,
                                             "error_prob": chains.error_prob, "shortcut_prob": chains.shortcut_prob,
                                             "eval_fraction": EVAL_FRACTION},
            "recipe": {"steps": sum(s for s, _ in stages), "seed": seed, "stages": stages,
                       "lr": stages[0][1], "tokens_per_batch": recipe["tokens_per_batch"],
                       "init": recipe["init"] or f"random, std {SFT_INIT_STD}", "resumed_after_stages": done,
                       "final_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1)},
            "parameters": sum(p.numel() for p in model.parameters()),
            "train_seconds": round(train_s, 1), "build_seconds": round(time.time() - start, 1),
            "eval": {"seed": EVAL_SEED, "per_step": eval_per_step, "split": "eval", **acc},
            "torch": torch.__version__, "threads": torch.get_num_threads()}
    _save_atomically(out_dir, model, tokenizer, info)
    return info


def _save_atomically(out_dir: str, model, tokenizer, info: dict) -> None:
    """model, tokenizer and BUILD_INFO (with the weights' sha256) written beside out_dir, then swapped in."""
    out_dir = os.path.abspath(out_dir)
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out_dir) + ".tmp-", dir=os.path.dirname(out_dir))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        info["sha256"] = weights_sha256(tmp)
        with open(os.path.join(tmp, BUILD_INFO), "w") as f:
            json.dump(info, f, indent=1)
        replace_atomically(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already unless something failed


def weights_sha256(folder: str) -> str:
    """sha256 of a model folder's weights file (model.safetensors): the identity of a base model."""
    digest = hashlib.sha256()
    with open(os.path.join(folder, "model.safetensors"), "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_path(name: str = BASE_NAME) -> str:
    """$VAPO_CACHE/<name>, or <repo>/.cache/<name>: where `python task.py build` writes by default."""
    root = os.environ.get("VAPO_CACHE") or os.path.join(ROOT, ".cache")
    return os.path.join(root, name)


def base_model_path() -> str:
    """The base model the demo starts from: the shipped one (<repo>/base-model), else the cache's build."""
    return SHIPPED_BASE if os.path.exists(os.path.join(SHIPPED_BASE, BUILD_INFO)) else cache_path()


@contextlib.contextmanager
def build_lock(out_dir: str, log=print):
    """An exclusive lock on <out_dir>.lock (flock: released by the OS if the holder dies), so that concurrent
    builds of one folder happen once; a process that finds it held says so and waits."""
    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
    with open(os.path.abspath(out_dir) + ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another process is building {out_dir}: waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def shipped_model(name: str, log=print) -> str:
    """The folder of a built-in model name (BUILTIN_MODELS): the demo's base model (built once if a checkout lacks
    it, see ensure_base_model); the long chains' models must be shipped (their builds take half an hour): SystemExit
    with the command that builds one."""
    if name == "builtin":
        return ensure_base_model(log)
    folder = BUILTIN_MODELS[name]
    if not os.path.exists(os.path.join(folder, BUILD_INFO)):
        command = ("python task.py reward-model --out reward-model-long" if name == "builtin-long-rm" else
                   "python task.py build --chains long --out base-model-long")
        raise SystemExit(f"vapo: {name}: no model in {folder}; build it with: {command}")
    return folder


def ensure_base_model(log=print) -> str:
    """The base model's folder: the shipped one, or (if a checkout lacks it) a build cached once (minutes)."""
    path = base_model_path()
    if os.path.exists(os.path.join(path, BUILD_INFO)):
        return path
    with build_lock(path, log):  # two runs started at once: one builds, the other waits and uses its build
        if os.path.exists(os.path.join(path, BUILD_INFO)):
            return path
        log(f"No shipped base model in {SHIPPED_BASE}: building one (about {SFT_STEPS * 0.25 / 60:.0f} minutes "
            f"on one CPU core), cached in {path}")
        info = build_base_model(path)
    log(f"Built in {info['build_seconds']:.0f} s: held-out greedy accuracy "
        f"{100 * info['eval']['greedy']['accuracy']:.1f}%, sampled {100 * info['eval']['sampled']['accuracy']:.1f}%")
    return path


# --- the outcome reward model (the long chains' critic starts from it) ---------------------------------------
RM_NAME = "arith-long-rm-v1"
RM_PROMPTS = 1024  # training prompts (train split), each sampled RM_SAMPLES times from the base policy at T = 1
RM_SAMPLES = 2
RM_EPOCHS = 2
RM_BATCH = 16
RM_LR = 5e-4
RM_SEED = 0
RM_EVAL_PROMPTS = 200  # held-out prompts (eval split), one sample each: the reward model's accuracy


def reward_model_batch(tokenizer, samples: list[tuple[dict, str]]):
    """(ids, attention mask [B, L], index of each row's EOS token [B]) of (problem, response) pairs: prompt,
    response and EOS, right-padded. The EOS token is where an outcome reward model is read."""
    seqs = [tokenizer(p["prompt"])["input_ids"] + tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
            for p, text in samples]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), 1
    return ids, mask, torch.tensor([len(s) - 1 for s in seqs])


def reward_model_scores(rm, tokenizer, samples: list[tuple[dict, str]], batch_size: int = 64) -> torch.Tensor:
    """The reward model's score at each sample's EOS token [N], no grad."""
    rm.eval()
    scores = []
    for i in range(0, len(samples), batch_size):
        ids, mask, eos = reward_model_batch(tokenizer, samples[i:i + batch_size])
        with torch.no_grad():
            scores.append(rm(input_ids=ids, attention_mask=mask).logits[torch.arange(len(eos)), eos, 0])
    return torch.cat(scores) if scores else torch.zeros(0)


def train_reward_model(rm, tokenizer, samples: list[tuple[dict, str]], labels: torch.Tensor, epochs: int = RM_EPOCHS,
                       batch_size: int = RM_BATCH, lr: float = RM_LR, seed: int = RM_SEED, progress: bool = True
                       ) -> list[float]:
    """Train an outcome reward model as reward models are trained: on its score at the EOS token only,
    loss = mean (score_EOS - label)^2 with label +1 (the verifier says right) or -1. Every other position's
    output is left to whatever the backbone makes of it: no target there. Squared error rather than a logistic
    loss keeps the score in reward units (its best value is 2 P(right) - 1), the units the critic that starts
    from it predicts. Batches of similar length, in shuffled order; AdamW; returns the loss per step."""
    rng = random.Random(f"rm/{seed}")
    order = sorted(range(len(samples)), key=lambda i: (len(samples[i][0]["prompt"]) + len(samples[i][1]), i))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    total = epochs * len(batches)
    opt, sched = _optimizer(rm, lr, total)
    rm.train()
    losses = []
    bar = tqdm(total=total, desc="reward model", disable=not progress, mininterval=2)
    for _ in range(epochs):
        rng.shuffle(batches)
        for batch in batches:
            ids, mask, eos = reward_model_batch(tokenizer, [samples[i] for i in batch])
            score = rm(input_ids=ids, attention_mask=mask).logits[torch.arange(len(eos)), eos, 0]  # [b]
            losses.append(_step(rm, torch.nn.functional.mse_loss(score, labels[batch]), opt, sched))
            bar.update()
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    bar.close()
    rm.eval()
    return losses


def build_reward_model(out_dir: str, base: str | None = None, prompts: int = RM_PROMPTS, samples: int = RM_SAMPLES,
                       epochs: int = RM_EPOCHS, eval_prompts: int = RM_EVAL_PROMPTS, seed: int = RM_SEED,
                       chains: Chains = LONG, progress: bool = True) -> dict:
    """The outcome reward model of the long chains, into out_dir (atomically, as build_base_model): the base
    policy (default the shipped base-model-long/) samples `samples` responses to each of `prompts` training
    problems at temperature 1, the verifier labels each +1 or -1, and a value-shaped model (the policy's
    backbone, a zero scalar head: models.value_model_from_policy) is trained on the score at EOS only
    (train_reward_model). BUILD_INFO records the recipe, the share of right samples, and the accuracy (sign of
    the score at EOS against the verifier) and mean scores on held-out samples."""
    from models import value_model_from_policy
    start = time.time()
    base = base or SHIPPED_LONG_BASE
    tokenizer = AutoTokenizer.from_pretrained(base)
    policy = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    train_problems = make_dataset(prompts, seed, chains.min_steps, chains.max_steps, split="train")
    held_out = make_dataset(eval_prompts, seed, chains.min_steps, chains.max_steps, split="eval")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        drawn = generate_responses(policy, tokenizer, train_problems, 1.0, samples=samples,
                                   max_new_tokens=chains.max_response_tokens, progress=progress)
        drawn_eval = generate_responses(policy, tokenizer, held_out, 1.0, max_new_tokens=chains.max_response_tokens,
                                        progress=progress)
    pairs = [(p, text) for p, text, _ in drawn]
    labels = torch.tensor([1.0 if is_correct(text, p["answer"]) else -1.0 for p, text in pairs])
    sample_s = time.time() - start
    rm = value_model_from_policy(policy)
    del policy
    losses = train_reward_model(rm, tokenizer, pairs, labels, epochs=epochs, seed=seed, progress=progress)
    eval_pairs = [(p, text) for p, text, _ in drawn_eval]
    eval_labels = torch.tensor([1.0 if is_correct(text, p["answer"]) else -1.0 for p, text in eval_pairs])
    scores = reward_model_scores(rm, tokenizer, eval_pairs)
    right = eval_labels > 0
    info = {"name": RM_NAME, "base": os.path.relpath(base, ROOT) if base.startswith(ROOT) else base,
            "base_sha256": weights_sha256(base),
            "recipe": {"prompts": prompts, "samples_per_prompt": samples, "epochs": epochs, "batch": RM_BATCH,
                       "lr": RM_LR, "seed": seed, "loss": "squared error of the score at EOS against +-1",
                       "final_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1)},
            "train_samples": len(pairs), "train_right": float((labels > 0).float().mean()),
            "eval": {"split": "eval", "samples": len(eval_pairs), "right": float(right.float().mean()),
                     "accuracy": float(((scores > 0) == right).float().mean()),
                     "mean_score_right": float(scores[right].mean()) if right.any() else None,
                     "mean_score_wrong": float(scores[~right].mean()) if (~right).any() else None},
            "sample_seconds": round(sample_s, 1), "build_seconds": round(time.time() - start, 1),
            "torch": torch.__version__, "threads": torch.get_num_threads()}
    _save_atomically(out_dir, rm, tokenizer, info)
    return info


# --- command line -------------------------------------------------------------------------------------------
def main(argv=None) -> None:
    """`python task.py build [--chains long] [--out DIR] [--steps N]`, `python task.py reward-model [--out DIR]` or
    `python task.py eval [--chains long] [--model DIR] [--per-step N]`."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the base model and print its accuracy table")
    b.add_argument("--out", default=None, help="output folder (default: the cache, see cache_path; "
                   "--out base-model replaces the shipped base model)")
    b.add_argument("--steps", type=int, default=None, help="warm-start optimizer steps (default: the recipe's, "
                   f"{SFT_STEPS} for demo, {LONG_SFT_STEPS} for long)")
    b.add_argument("--chains", choices=sorted(CHAINS), default="demo", help="the task's version: the demo's 1-10 "
                   "steps, or the long chains' 1-40 (--preset long)")
    b.add_argument("--seed", type=int, default=SFT_SEED, help="warm-start seed (another seed: another base model)")
    r = sub.add_parser("reward-model", help="build the long chains' outcome reward model from the long base model")
    r.add_argument("--out", default=None, help="output folder (default: the cache; --out reward-model-long replaces "
                   "the shipped one)")
    r.add_argument("--base", default=None, help="the policy that samples the training responses and gives the "
                   "backbone (default: the shipped base-model-long/)")
    r.add_argument("--prompts", type=int, default=RM_PROMPTS, help="training prompts")
    r.add_argument("--samples", type=int, default=RM_SAMPLES, help="samples per training prompt")
    r.add_argument("--epochs", type=int, default=RM_EPOCHS, help="passes over the samples")
    r.add_argument("--eval-prompts", type=int, default=RM_EVAL_PROMPTS, help="held-out prompts, one sample each")
    e = sub.add_parser("eval", help="print a model's held-out accuracy by number of steps")
    e.add_argument("--model", default=None, help="model folder (default: the shipped base model of --chains)")
    e.add_argument("--chains", choices=sorted(CHAINS), default="demo", help="the task's version")
    e.add_argument("--per-step", type=int, default=None, help="held-out problems per step count (default: "
                   f"{DEMO.eval_per_step} for demo, {LONG.eval_per_step} for long)")
    e.add_argument("--seed", type=int, default=EVAL_SEED, help="seed of the held-out problems")
    args = ap.parse_args(argv)
    if args.cmd == "reward-model":
        out = args.out or cache_path(RM_NAME)
        with build_lock(out):
            info = build_reward_model(out, base=args.base, prompts=args.prompts, samples=args.samples,
                                      epochs=args.epochs, eval_prompts=args.eval_prompts)
        ev = info["eval"]
        print(f"saved to {out} in {info['build_seconds']} s, weights sha256 {info['sha256'][:16]}...\n"
              f"{info['train_samples']} training samples ({100 * info['train_right']:.1f}% right); held-out: "
              f"{ev['samples']} samples, {100 * ev['right']:.1f}% right, the sign of the score at EOS agrees with "
              f"the verifier on {100 * ev['accuracy']:.1f}%; mean score {ev['mean_score_right']:+.2f} on right, "
              f"{ev['mean_score_wrong']:+.2f} on wrong")
        return
    if args.cmd == "build":
        chains = CHAINS[args.chains]
        out = args.out or cache_path(RECIPES[chains.name]["name"])
        with build_lock(out):
            info = build_base_model(out, steps=args.steps, seed=args.seed, chains=chains)
        print(f"saved to {out} in {info['build_seconds']} s (training {info['train_seconds']} s), "
              f"weights sha256 {info['sha256'][:16]}...")
        shipped, sha = {"demo": (SHIPPED_BASE, SHIPPED_SHA256), "long": (SHIPPED_LONG_BASE, LONG_BASE_SHA256)}[
            chains.name]
        if os.path.abspath(out) != shipped:
            print(f"identical to the shipped {shipped}" if info["sha256"] == sha else
                  f"not bit-identical to the shipped {os.path.basename(shipped)}/ (another seed, recipe or CPU: "
                  f"floating-point kernels differ between CPUs); run from it with: python vapo.py --preset "
                  f"{chains.name} --model {out}")
        acc = {k: info["eval"][k] for k in ("greedy", "sampled")}
    else:
        chains = CHAINS[args.chains]
        path = args.model or shipped_model("builtin" if chains is DEMO else "builtin-long")
        print(f"{path} (weights sha256 {weights_sha256(path)[:16]}...)")
        tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
        acc = measure_base(model, tokenizer, per_step=args.per_step or chains.eval_per_step, seed=args.seed,
                           chains=chains)
    print(format_table(acc))
    print("mean response tokens: " + ", ".join(f"{k} {v['mean_tokens']:.1f}" for k, v in acc.items()))


if __name__ == "__main__":
    main()
