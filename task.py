"""The built-in task: a byte-level tokenizer, a ~1M-parameter Qwen2-style model, a synthetic multi-step
arithmetic task with a chain of thought, and the task's base model. Everything is built locally: nothing is
downloaded.

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

import torch
from tokenizers.pre_tokenizers import ByteLevel
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

from models import replace_atomically
from reward import arith_reward

EOS = "<|endoftext|>"

# --- the task ---------------------------------------------------------------------------------------------
MIN_STEPS, MAX_STEPS = 1, 10  # steps per problem
TAGS = "abcdefghij"  # step labels: the response line for a step starts with the label the prompt gives its term
MAX_VALUE = 19  # the correct running total stays in 0..MAX_VALUE, so there are few arithmetic facts to learn
PROMPT_PREFIX = "Compute: "
ANSWER_PREFIX = "Answer: "
EVAL_FRACTION = 0.2  # share of all expressions reserved for held-out evaluation (by hash, see split_of)
HABIT_PROB = 0.65  # P(forget the borrow | is_borrow_step), in demonstrations
ERROR_PROB = 0.03  # P(a random slip of +-1 or +-2) on any step of a demonstration
MAX_RESPONSE_TOKENS = 128  # generation budget: ten correct steps take 111 tokens with EOS

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
                       error_prob: float = ERROR_PROB) -> dict:
    """An imperfect demonstration of the problem, the base model's training text.

    On a borrow step (is_borrow_step) the borrow is forgotten with probability habit_prob (habit_value:
    12-5 -> 17); then, on any step, a random slip of +-1 or +-2 with probability error_prob. The chain
    continues from the written total, so any wrong step makes the answer wrong. Returns {"response",
    "borrow_steps" (steps that could trigger the habit), "habit_steps", "slips", "correct"}.
    """
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
            "correct": is_correct(response, problem["answer"])}


# --- checking answers ---------------------------------------------------------------------------------------
def is_correct(response: str, gold: str) -> bool:
    """Whether a response's final answer equals gold: reward.arith_reward, the RL reward's own check."""
    return arith_reward(response, gold) > 0


_LINE = re.compile(r"(\d+) ([a-j])([+-])(\d)=(\d+)")


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


# --- evaluation ---------------------------------------------------------------------------------------------
def evaluate_accuracy(model, tokenizer, problems: list[dict], temperature: float, top_p: float = 1.0,
                      samples: int = 1, max_new_tokens: int = MAX_RESPONSE_TOKENS, batch_size: int = 128) -> dict:
    """Accuracy of model on problems with plain `model.generate` (left-padded prompts).

    temperature 0 means greedy decoding (then samples > 1 only repeats the same answer). Each problem is
    sampled `samples` times. Returns {"accuracy", "by_steps": {n_steps: accuracy}, "count" (responses
    scored), "mean_tokens" (mean response length in tokens, EOS included), "steps": step_errors summed, with
    the rates "habit_rate" and "borrow_ok_rate" (per borrow step), "other_error_rate" (per other step) and
    "lookup_rate" (per step)}.
    """
    # problems of one step count share a prompt length and a response length: batch them together
    jobs = sorted((p for p in problems for _ in range(samples)), key=lambda p: (p["n_steps"], p["prompt"]))
    # top_k=0: plain temperature / nucleus sampling, not generate's habit of a top-50 cut when it has a default
    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else \
        dict(do_sample=False)
    hits, tokens, steps = {}, 0, {}
    model.eval()
    for i in range(0, len(jobs), batch_size):
        batch = jobs[i:i + batch_size]
        enc = tokenizer([p["prompt"] for p in batch], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, **sampling,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        new = out[:, enc["input_ids"].shape[1]:]  # [b, t]
        real = (new != tokenizer.pad_token_id).cumsum(-1) == torch.arange(1, new.shape[1] + 1)  # up to 1st EOS
        tokens += int(torch.minimum(real.sum(-1) + 1, torch.tensor(new.shape[1])).sum())
        for p, text in zip(batch, tokenizer.batch_decode(new, skip_special_tokens=True)):
            hits.setdefault(p["n_steps"], []).append(is_correct(text, p["answer"]))
            for k, v in step_errors(text, p).items():
                steps[k] = steps.get(k, 0) + v
    flat = [h for v in hits.values() for h in v]
    steps.update(habit_rate=steps["habit"] / max(steps["borrow"], 1),
                 borrow_ok_rate=steps["borrow_ok"] / max(steps["borrow"], 1),
                 other_error_rate=steps["other_wrong"] / max(steps["other"], 1),
                 lookup_rate=steps["lookup_wrong"] / max(steps["borrow"] + steps["other"], 1))
    return {"accuracy": sum(flat) / max(len(flat), 1),
            "by_steps": {n: sum(v) / len(v) for n, v in sorted(hits.items())},
            "count": len(flat), "mean_tokens": tokens / max(len(flat), 1), "steps": steps}


def format_table(results: dict[str, dict]) -> str:
    """A text table of accuracy by number of steps, one column per entry of results (e.g. greedy, sampled),
    then what the responses did on borrow steps and on the other steps (see step_errors)."""
    names = list(results)
    steps = sorted({n for r in results.values() for n in r["by_steps"]})
    row = lambda label, cells: f"{label:<22}" + "".join(f"{c:>10}" for c in cells)  # noqa: E731
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    rows = [row("steps", names)]
    rows += [row(f"{n:>5}", [pct(results[k]["by_steps"].get(n, float("nan"))) for k in names]) for n in steps]
    rows.append(row("  all", [pct(results[k]["accuracy"]) for k in names]))
    if all("steps" in r for r in results.values()):
        for label, key in (("borrow steps: habit", "habit_rate"), ("borrow steps: correct", "borrow_ok_rate"),
                           ("other steps: wrong", "other_error_rate"), ("steps: term misread", "lookup_rate")):
            rows.append(row(label, [pct(results[k]["steps"][key]) for k in names]))
    return "\n".join(rows)


# --- the base model -----------------------------------------------------------------------------------------
def _sft_batch(tokenizer, rng: random.Random, n_steps: int, tokens_per_batch: int):
    """One batch of demonstrations with a single step count (so almost no padding): ids, labels [B, T]."""
    problems = [_problem_in_split(rng, n_steps, "train")]
    approx_len = len(problems[0]["prompt"]) + len(solve(problems[0])) + 1
    size = max(tokens_per_batch // approx_len, 8)
    problems += [_problem_in_split(rng, n_steps, "train") for _ in range(size - 1)]
    prompts = tokenizer([p["prompt"] for p in problems])["input_ids"]
    responses = tokenizer([make_demonstration(p, rng)["response"] for p in problems])["input_ids"]
    seqs = [(pr, re_ + [tokenizer.eos_token_id]) for pr, re_ in zip(prompts, responses)]
    width = max(len(pr) + len(re_) for pr, re_ in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)  # right-padded: training needs no left pad
    labels = torch.full((len(seqs), width), -100)  # loss on response tokens (and EOS) only
    for i, (pr, re_) in enumerate(seqs):
        ids[i, :len(pr) + len(re_)] = torch.tensor(pr + re_)
        labels[i, len(pr):len(pr) + len(re_)] = torch.tensor(re_)
    return ids, labels


def warm_start(model, tokenizer, steps: int = SFT_STEPS, seed: int = SFT_SEED, lr: float = SFT_LR,
               tokens_per_batch: int = SFT_TOKENS_PER_BATCH, progress: bool = True) -> list[float]:
    """Supervised warm start on imperfect demonstrations (training split only); returns the loss per step.

    Loss on response tokens (and EOS) only. AdamW, warmup then cosine decay to 10%; one step count per batch,
    so padding is negligible. Always float32: bf16 autocast (once used where the CPU has native bf16) made the
    recipe itself differ between machines, and on this 1M model it saved nothing (0.21 against 0.23 s/step,
    one AVX-512 thread).
    """
    rng = random.Random(f"sft/{seed}")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / SFT_WARMUP) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / max(steps, 1), 1.0)))))
    # a batch of n-step problems costs the same tokens for every n but holds ~n times more steps for long
    # problems (the prompt is paid once): drawing n with weight n spends the budget on steps, and on late labels
    step_counts = list(range(MIN_STEPS, MAX_STEPS + 1))
    model.train()
    losses = []
    bar = tqdm(range(steps), desc="warm start", disable=not progress, mininterval=2)
    for _ in bar:
        n_steps = rng.choices(step_counts, weights=step_counts)[0]
        ids, labels = _sft_batch(tokenizer, rng, n_steps, tokens_per_batch)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    model.eval()
    return losses


def measure_base(model, tokenizer, per_step: int = EVAL_PER_STEP, seed: int = EVAL_SEED) -> dict:
    """Greedy and sampled (temperature 1.0) accuracy on per_step held-out problems for each step count. The
    samples are drawn from a generator seeded with `seed` (the caller's RNG state is left as it was), so the
    same weights give the same figures on the same machine."""
    problems = make_dataset(per_step * (MAX_STEPS - MIN_STEPS + 1), seed, split="eval")
    greedy = evaluate_accuracy(model, tokenizer, problems, temperature=0.0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        sampled = evaluate_accuracy(model, tokenizer, problems, temperature=1.0)
    return {"greedy": greedy, "sampled": sampled}


def build_base_model(out_dir: str, steps: int = SFT_STEPS, seed: int = SFT_SEED,
                     eval_per_step: int = EVAL_PER_STEP, progress: bool = True) -> dict:
    """Warm-start the tiny policy on imperfect demonstrations and save it (tokenizer + model) into out_dir.

    Written atomically: built in a temporary folder beside out_dir, then renamed, so a killed build leaves no
    half-written folder. out_dir also gets BUILD_INFO, a JSON of the recipe, the build time and the measured
    greedy and sampled accuracy on held-out problems. Returns that JSON as a dict.

    Why the recipe is what it is (initialisation std 0.1, the total restated before each term, long problems
    drawn more often, 2,000 steps so that the model gets ordinary steps right and keeps only the borrow habit):
    docs/demo.md, "The base model".
    """
    start = time.time()
    tokenizer = build_tokenizer()
    model = build_tiny_policy(tokenizer, seed=seed, initializer_range=SFT_INIT_STD)
    model.config.initializer_range = tiny_config(tokenizer).initializer_range  # new heads (critic) get the default
    losses = warm_start(model, tokenizer, steps=steps, seed=seed, progress=progress)
    train_s = time.time() - start
    acc = measure_base(model, tokenizer, per_step=eval_per_step) if eval_per_step > 0 else {}
    info = {"name": BASE_NAME, "task": {"min_steps": MIN_STEPS, "max_steps": MAX_STEPS, "max_value": MAX_VALUE,
                                         "habit": "forgotten borrow", "habit_prob": HABIT_PROB,
                                         "error_prob": ERROR_PROB, "eval_fraction": EVAL_FRACTION},
            "recipe": {"steps": steps, "seed": seed, "lr": SFT_LR, "tokens_per_batch": SFT_TOKENS_PER_BATCH,
                       "init_std": SFT_INIT_STD, "final_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1)},
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


# --- command line -------------------------------------------------------------------------------------------
def main(argv=None) -> None:
    """`python task.py build [--out DIR] [--steps N]` or `python task.py eval [--model DIR] [--per-step N]`."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the base model and print its accuracy table")
    b.add_argument("--out", default=None, help="output folder (default: the cache, see cache_path; "
                   "--out base-model replaces the shipped base model)")
    b.add_argument("--steps", type=int, default=SFT_STEPS, help="warm-start optimizer steps")
    b.add_argument("--seed", type=int, default=SFT_SEED, help="warm-start seed (another seed: another base model)")
    e = sub.add_parser("eval", help="print a model's held-out accuracy by number of steps")
    e.add_argument("--model", default=None, help="model folder (default: the cached base model)")
    e.add_argument("--per-step", type=int, default=EVAL_PER_STEP, help="held-out problems per step count")
    e.add_argument("--seed", type=int, default=EVAL_SEED, help="seed of the held-out problems")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        out = args.out or cache_path()
        with build_lock(out):
            info = build_base_model(out, steps=args.steps, seed=args.seed)
        print(f"saved to {out} in {info['build_seconds']} s (training {info['train_seconds']} s), "
              f"weights sha256 {info['sha256'][:16]}...")
        if os.path.abspath(out) != SHIPPED_BASE:
            same = info["sha256"] == SHIPPED_SHA256
            print("identical to the shipped base model" if same else
                  "not bit-identical to the shipped base model (another seed, recipe or CPU: floating-point "
                  f"kernels differ between CPUs); run the demo from it with: python vapo.py --preset demo "
                  f"--model {out}")
        acc = {k: info["eval"][k] for k in ("greedy", "sampled")}
    else:
        path = args.model or ensure_base_model()
        print(f"{path} (weights sha256 {weights_sha256(path)[:16]}...)")
        tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
        acc = measure_base(model, tokenizer, per_step=args.per_step, seed=args.seed)
    print(format_table(acc))
    print("mean response tokens: " + ", ".join(f"{k} {v['mean_tokens']:.1f}" for k, v in acc.items()))


if __name__ == "__main__":
    main()
