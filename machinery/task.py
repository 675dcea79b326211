"""The built-in task: a byte-level tokenizer, a ~1M-parameter Qwen2-style model, a synthetic multi-step
arithmetic task with a chain of thought, its imperfect demonstrations, the checks of a response and the task's
own evaluation. Everything is generated locally: nothing is downloaded. The models trained on it (the base models,
the long chains' outcome reward model) are built by builds.py.

The task (one problem = a start value and 1 to MAX_STEPS labelled terms; one response line per step):

    prompt:    "Compute: 13 a-7 b-5 c+7\n"
    response:  "13 a-7=06\n06 b-5=01\n01 c+7=08\nAnswer: 8"            (then EOS)

Each line restates the running total, then the labelled term, then the new total: `<total> <label><op><term>=
<new total>`. Why this shape (each choice measured on the 1M model, see builds.build_base_model):
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

The base model is a supervised warm start on *imperfect* demonstrations (make_demonstration). Besides random
slips (ERROR_PROB per step), the demonstrations have a systematic habit: when a subtraction from a two-digit total
crosses a multiple of ten (about 1 step in 5), they usually (HABIT_PROB) forget the borrow (12-5 -> 17). The base
model keeps the habit on nearly every borrow step under greedy decoding and drops it on about one in three when
sampling, which is what RL must find and reinforce (step_errors counts these; builds.py has the figures). Each
wrong step is carried into the next line, so the final answer is wrong. The habit only ever adds 10, so two habit
errors never cancel.

Held-out split: every expression belongs to exactly one split, "train" or "eval", by a hash of its text
(EVAL_FRACTION of all expressions are "eval"), so training prompts and held-out prompts never overlap, whatever
the seeds. The base model is trained on "train" expressions only.

The long chains (LONG, `--preset long`): the same task with 1 to 40 steps (labels a-z, then A-N), so responses run
from 10 tokens (a guess) or 20 (one step) to 411, with about 8 borrow decisions at 40 steps. Their demonstrations'
habit is a minority (so each borrow step is a decision a sample of their base model gets right about 7 times in
10) and one in ten of them skips the chain and guesses ("Answer: <n>" at once: the shortcut a policy can collapse
to). docs/long.md at commit 758a9d0 has their figures.
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

import torch
from tokenizers.pre_tokenizers import ByteLevel
from tqdm.auto import tqdm
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

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
# band), as often as a sampled chain at 21-40 steps, so a policy can collapse to short guesses. docs/long.md at
# commit 758a9d0 has the measured tables.
LONG = Chains("long", 1, 40, 0.3, 0.01, 0.1, 448, 10)
CHAINS = {c.name: c for c in (DEMO, LONG)}


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


def problem_of(prompt: str) -> dict:
    """The problem of a built-in prompt ("Compute: 7 a+5 b-3\n"), as make_problem gives it ({"prompt", "answer",
    "n_steps", "expr"}): all that a critic reading the prompt can know of it."""
    value, terms = parse_expr({"prompt": prompt})
    expr = str(value) + "".join(f"{op}{b}" for op, b in terms)
    for op, b in terms:
        value = _apply(value, op, b)
    return {"prompt": prompt, "answer": str(value), "n_steps": len(terms), "expr": expr}


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
    return [offset for offset, _ in borrow_decisions(response)]


def borrow_decisions(response: str) -> list[tuple[int, str]]:
    """(offset, right) for each borrow_digits offset: right is the tens digit the line's own operands call for
    ("12 b-5=" -> "0"; the habit writes "1"), whatever the response wrote there."""
    out, offset = [], 0
    for line in response.split("\n"):
        m = _LINE.fullmatch(line)
        if m is None:
            break
        a, op, b = int(m[1]), m[3], int(m[4])
        if is_borrow_step(a, op, b):
            out.append((offset + m.start(5), f"{_apply(a, op, b):02d}"[0]))
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
