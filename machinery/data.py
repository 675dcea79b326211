"""Prompts with gold answers: from a local JSONL or Parquet file, or a Hugging Face dataset name when online.

    load_prompts("openai/gsm8k")                        -> [{"prompt", "question", "answer"}, ...]
    load_prompts("my.jsonl", question_field="q", answer_field="a", template="raw")
    load_data(cfg, tokenizer)                           -> (training rows, held-out rows) of a run
    reasoning_gym_rows("reasoning-gym:chain_sum?min_terms=2", n, seed)  -> n problems of a reasoning-gym generator
    prompt_batch(rows, step, n, seed)                   -> the n prompts of a step, a pure function of the step

Each row becomes {"question": the problem text, "answer": the gold answer as a string, "prompt": the exact text fed
to the model}; a row whose verifier needs more than the answer also has "gold", what the verifier is handed
(gold_of): for reasoning-gym, the generator's name, settings and whole entry as JSON. The prompt template is one of
  - "base": DAPO's instruction around the question (the model is asked to end with a line "Answer: ..."), for base
    models, which continue text rather than follow a chat;
  - "chat": the same instruction as a user message inside the tokenizer's chat template, for instruct models;
  - "chat-brief": the question and one line, "End your reply with a line 'Answer: <your answer>'.", as the user
    message in the chat template: a little over half of "chat"'s tokens for a short question (52 against 94 with
    SmolLM2's template and its default system prompt), for a CPU, where the update's cost grows with the prompt;
  - "raw": the question as it is (the built-in task writes its own prompts).

A field is a key, or a dotted path into nested rows ("reward_model.ground_truth", "prompt.0.content"). A malformed
row (not JSON or not UTF-8, a missing field, an empty question, an answer that is not a string or a number, an
empty or non-finite answer: NaN, Infinity, "nan", "-inf") raises ValueError naming the file and the row (1-based;
for JSONL the line number): nothing is skipped silently.

GSM8K-form answers in any source: a gold answer that is a worked solution with a final-answer line "#### 1,234"
(GSM8K's format) becomes what follows the last such line ("1234", as gsm8k_answer cleans it). This holds for local
files and for any dataset name whose preset does not clean its answers itself, and also with an explicit
answer_field (the field still holds a worked solution, which no verifier can compare with an answer). Otherwise
every sample of that prompt would score as wrong. How many rows were read in GSM8K form is logged (INFO) once per
load; a "####" line with nothing after it is a data error.
"""
from __future__ import annotations

import ast
import difflib
import json
import logging
import os
import re
import urllib.parse

import torch

from machinery import task
from config import stream
from reward import CORRECT_REWARD, Verifier, arith_reward, math_reward, reasoning_gym_reward

log = logging.getLogger(__name__)

# DAPO's prompt (Yu et al. 2025, also used by VAPO's training set DAPO-Math-17k), split around the question.
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the form "
               "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = "\n\nRemember to put your answer on its own line after \"Answer:\"."
BRIEF_INSTRUCTION = "\nEnd your reply with a line 'Answer: <your answer>'."  # "chat-brief" (our choice)
TEMPLATES = ("base", "chat", "chat-brief", "raw")


def gsm8k_answer(solution: str) -> str:
    """GSM8K's answer field is a worked solution ending in `#### 1,234`: the gold answer is what follows ####,
    without thousands separators."""
    if "####" not in solution:
        raise ValueError("no '####' in the GSM8K answer field")
    return solution.split("####")[-1].strip().replace(",", "")


# GSM8K's final-answer marker: a line that starts with ####. The last one is the final answer.
_GSM8K_MARKER = re.compile(r"^####[ \t]*(.*?)[ \t\r]*$", re.MULTILINE)
# Gold answers that are a float's non-finite value written as text (pandas and json.dumps write these).
_NON_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)


def gsm8k_final_answer(answer: str) -> str | None:
    """The gold answer of a GSM8K-form answer field (a worked solution with a line "#### 1,234"), or None if
    `answer` has no line starting with ####. The last such line counts; its answer is cleaned as gsm8k_answer
    does ("1,234" -> "1234"). Raises ValueError if that line has nothing after ####."""
    markers = list(_GSM8K_MARKER.finditer(answer))
    if not markers:
        return None
    if not markers[-1].group(1):
        raise ValueError("GSM8K final-answer line '####' has no answer after it")
    return gsm8k_answer(markers[-1].group())


def gold_of(row: dict) -> str:
    """What the verifier is handed for a row: its "gold" when it has one (reasoning-gym's rows: the generator's
    entry, which its score_answer reads), else its gold answer."""
    return row.get("gold", row["answer"])


def strip_dapo_template(prompt: str) -> str:
    """DAPO-Math-17k stores the full DAPO prompt; recover the bare question so every template can be applied."""
    return prompt.removeprefix(DAPO_PREFIX).removesuffix(DAPO_SUFFIX)


# Known datasets: where the question and the gold answer are, and how to clean them. Splits, for reference:
# gsm8k train/test; MATH-500 test only; DAPO-Math-17k train only; both AIME 2024 sets train only (30 problems).
PRESETS = {
    "openai/gsm8k": dict(config="main", question="question", answer="answer", answer_fn=gsm8k_answer),
    "HuggingFaceH4/MATH-500": dict(question="problem", answer="answer"),
    # Rows are verl-style: prompt = [{"role": "user", "content": DAPO prompt}], reward_model = {"ground_truth": ..}.
    # The hub copy repeats each of its ~17k problems about 100 times (1.79M rows): keep the first of each.
    "BytedTsinghua-SIA/DAPO-Math-17k": dict(question="prompt.0.content", answer="reward_model.ground_truth",
                                            question_fn=strip_dapo_template, dedupe=True),
    "HuggingFaceH4/aime_2024": dict(question="problem", answer="answer"),
    "Maxwell-Jia/AIME_2024": dict(question="Problem", answer="Answer"),  # Answer is an integer there
}
DEFAULT_FIELDS = dict(question="question", answer="answer")


def format_prompt(question: str, template: str = "base", tokenizer=None) -> str:
    """The exact text fed to the model for one question (see the module docstring for the templates)."""
    if template == "raw":
        return question
    if template == "base":
        return DAPO_PREFIX + question + DAPO_SUFFIX
    if template in ("chat", "chat-brief"):
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"template {template!r} needs a tokenizer with a chat template (use 'base' for base "
                             "models)")
        messages = ([{"role": "user", "content": DAPO_PREFIX + question + DAPO_SUFFIX}] if template == "chat" else
                    [{"role": "user", "content": question + BRIEF_INSTRUCTION}])
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # The engines tokenise prompts with the tokenizer's special tokens, as a base prompt needs them. A chat
        # template that writes the BOS itself (Llama's) would then start with two: the text's BOS is dropped, so
        # the ids are those of the template tokenised without special tokens (verl's add_special_tokens=False).
        bos = tokenizer.bos_token
        if bos and text.startswith(bos) and adds_bos(tokenizer):
            text = text[len(bos):]
        return text
    raise ValueError(f"unknown template {template!r}: expected one of {TEMPLATES}")


def adds_bos(tokenizer) -> bool:
    """True if tokenizing a text with the tokenizer's special tokens puts its BOS first (Llama's do, Qwen's not)."""
    ids = tokenizer("x")["input_ids"]
    return tokenizer.bos_token_id is not None and bool(ids) and ids[0] == tokenizer.bos_token_id


def _field(row, path: str):
    """row["a"]["b"][0]... for path "a.b.0"; KeyError naming the path when any step is missing."""
    value = row
    for key in path.split("."):
        if isinstance(value, (list, tuple)) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            raise KeyError(f"missing field {path!r}")
    return value


def _rows_jsonl(path: str):
    """(row number = 1-based line number, row) for each non-blank line. Lines are split at newline bytes and decoded
    one by one, so a byte sequence that is not UTF-8 is reported with its line."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}, line {number}: not valid UTF-8 ({e.reason} at byte {e.start} of the "
                                 f"line)") from e
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {number}: not valid JSON ({e})") from e


def _rows_parquet(path: str):
    import pyarrow.parquet as pq  # optional: only Parquet files need it (datasets brings it)
    for number, row in enumerate(pq.read_table(path).to_pylist(), 1):
        yield number, row


def _rows_hub(name: str, config: str | None, split: str):
    try:
        import datasets  # optional: only dataset names need it, and it is slow to import
    except ImportError as e:
        raise ImportError("loading a dataset by name needs the `datasets` package (pip install datasets)") from e
    try:
        dataset = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # offline, unknown name or split, ...: say what to do instead, keep the cause
        raise RuntimeError(
            f"could not load dataset {name!r} (config {config!r}, split {split!r}) through the `datasets` library: "
            f"{type(e).__name__}: {e}. Offline, give a local .jsonl or .parquet file instead.") from e
    for number, row in enumerate(dataset, 1):
        yield number, row


def load_prompts(source: str, split: str = "train", question_field: str | None = None,
                 answer_field: str | None = None, template: str = "base", tokenizer=None,
                 limit: int | None = None) -> list[dict]:
    """Rows {"prompt", "question", "answer"} from `source`: a .jsonl / .parquet file, or a dataset name.

    Field names default to the preset for a known dataset name (PRESETS), else "question" / "answer"; explicit
    question_field / answer_field override them (and the preset's cleaning of that field). `limit` keeps the first
    rows only. Numbers as answers become strings (42 -> "42"). GSM8K-form answers ("...\\n#### 42") become "42"
    unless the preset cleans its answers itself (see the module docstring).

    A path ending in .jsonl or .parquet that does not exist raises FileNotFoundError "<path>: no such file"; a
    directory, or an existing file of another type, raises FileNotFoundError listing the accepted sources.
    """
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}: expected one of {TEMPLATES}")
    preset = PRESETS.get(source, {}) if not os.path.exists(source) else {}
    q_path = question_field or preset.get("question", DEFAULT_FIELDS["question"])
    a_path = answer_field or preset.get("answer", DEFAULT_FIELDS["answer"])
    question_fn = preset.get("question_fn", lambda q: q) if question_field is None else (lambda q: q)
    answer_fn = preset.get("answer_fn") if answer_field is None else None  # None: GSM8K form is detected

    extension = os.path.splitext(source)[1].lower()
    accepted = "expected a local .jsonl or .parquet file, or a Hugging Face dataset name"
    if os.path.isfile(source) and extension in (".jsonl", ".parquet"):
        rows = _rows_jsonl(source) if extension == ".jsonl" else _rows_parquet(source)
        where = source + (", line" if extension == ".jsonl" else ", row")
    elif os.path.isdir(source):
        raise FileNotFoundError(f"{source}: a directory, not a .jsonl or .parquet file ({accepted})")
    elif extension in (".jsonl", ".parquet") and not os.path.exists(source):
        raise FileNotFoundError(f"{source}: no such file")
    elif extension in (".json", ".csv") or os.path.exists(source):
        raise FileNotFoundError(f"{source}: not a .jsonl or .parquet file ({accepted})")
    else:
        rows = _rows_hub(source, preset.get("config"), split)
        where = f"dataset {source} ({split}), row"

    out, seen, gsm8k_rows = [], set(), 0
    for number, row in rows:
        if limit is not None and len(out) >= limit:
            break
        try:
            question, answer = _field(row, q_path), _field(row, a_path)
            if not isinstance(question, str):
                raise ValueError(f"question {q_path!r} is {type(question).__name__}, not a string")
            if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
                raise ValueError(f"answer {a_path!r} is {type(answer).__name__}, not a string or a number")
            question = question_fn(question)  # kept exactly: with template "raw" it is the prompt
            answer = answer if isinstance(answer, str) else str(answer)  # float NaN -> "nan": rejected below
            if answer_fn is not None:
                answer = answer_fn(answer)
            elif (final := gsm8k_final_answer(answer)) is not None:
                answer, gsm8k_rows = final, gsm8k_rows + 1
            answer = answer.strip()
            if not question.strip():
                raise ValueError(f"empty question {q_path!r}")
            if not answer:
                raise ValueError(f"empty answer {a_path!r}")
            if _NON_FINITE.fullmatch(answer):
                raise ValueError(f"gold answer {answer!r} is not a finite value")
        except (KeyError, ValueError) as e:
            raise ValueError(f"{where} {number}: {e.args[0] if e.args else e}") from e
        if preset.get("dedupe"):
            if (question, answer) in seen:
                continue
            seen.add((question, answer))
        out.append(dict(prompt=format_prompt(question, template, tokenizer), question=question, answer=answer))
    if gsm8k_rows:
        log.info("%s: %d rows read in GSM8K form (a worked solution ending in '#### <answer>'): their gold answer "
                 "is what follows the last ####", source, gsm8k_rows)
    if preset.get("dedupe"):
        log.info("%s: %d distinct problems kept (repeated rows dropped)", source, len(out))
    if not out:
        raise ValueError(f"{source}: no rows")
    return out


# --- reasoning-gym's generators ----------------------------------------------------------------------------
REASONING_GYM = "reasoning-gym:"
"""--dataset reasoning-gym:NAME?key=value&...: problems drawn from one of reasoning-gym's procedural generators
(pip install reasoning-gym), with the generator's settings (its config's fields: min_terms=2&max_terms=3)."""
RG_TRAIN_ROWS = 5000
"""Training problems drawn for a run unless the settings say size=N (a pass over them is an epoch)."""
RG_SEED_BLOCK = 1_000_000
"""reasoning-gym draws item i of a dataset of seed s from random.Random(s + i): held-out items use s = 0 (i below
--eval-prompts), the training items of --seed k use s = (k + 1) x RG_SEED_BLOCK, so no seed is shared between the
held-out problems and any run's training problems, nor between the training problems of two seeds."""


def is_reasoning_gym(source: str | None) -> bool:
    """True for a --dataset of the form reasoning-gym:NAME[?settings]."""
    return bool(source) and source.startswith(REASONING_GYM)


def _setting(text: str):
    """A setting's value: a Python literal when it is one (3, 0.5, True, [1, 2]), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_reasoning_gym(source: str) -> tuple[str, dict]:
    """"reasoning-gym:chain_sum?min_terms=2&max_terms=3" -> ("chain_sum", {"min_terms": 2, "max_terms": 3}).
    ValueError for a missing name or a setting without "=" or given twice; seeds are the trainer's (RG_SEED_BLOCK)."""
    name, _, query = source.removeprefix(REASONING_GYM).partition("?")
    if not name:
        raise ValueError("no generator named: write reasoning-gym:NAME, e.g. reasoning-gym:chain_sum")
    settings = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if not eq or not key or key in settings:
            raise ValueError(f"setting {part!r}: expected key=value, each key once (e.g. ?min_terms=2&max_terms=3)")
        settings[key] = _setting(urllib.parse.unquote(value))  # "+" stays "+" (an operator), %xx decoded
    if "seed" in settings:
        raise ValueError("seed is not a setting here: held-out and training problems get disjoint seeds (--seed "
                         "chooses the training problems)")
    return name, settings


def reasoning_gym():
    """The reasoning_gym module, or ImportError saying how to install it."""
    try:
        import reasoning_gym as rg  # optional: only --dataset reasoning-gym:NAME needs it (about 1 s to import)
    except ImportError:
        raise ImportError("the reasoning-gym package is not installed (pip install reasoning-gym)") from None
    return rg


def reasoning_gym_rows(source: str, n: int | None, seed: int, template: str = "base", tokenizer=None) -> list[dict]:
    """n problems (None: the settings' size, else RG_TRAIN_ROWS) of the generator that source names, item i drawn
    from seed + i: rows {"prompt", "question", "answer", "gold"}, gold the JSON of {"dataset", "settings",
    "entry"} that reward.reasoning_gym_reward scores a response against. ValueError for an unknown generator or a
    setting it refuses (the message lists what exists / what reasoning-gym said); ImportError without the package."""
    name, settings = parse_reasoning_gym(source)
    rg = reasoning_gym()
    if name not in rg.factory.DATASETS:
        close = difflib.get_close_matches(name, rg.factory.DATASETS, 3)
        raise ValueError(f"reasoning-gym has no generator {name!r} (" + (
            f"did you mean {' or '.join(close)}?" if close else
            f"it has {len(rg.factory.DATASETS)}: {', '.join(sorted(rg.factory.DATASETS))}") + ")")
    size = settings.pop("size", RG_TRAIN_ROWS)  # how many to draw is ours to say, not the generator's setting
    size = size if n is None else n
    if size == 0:  # --eval-prompts 0: no evaluation (reasoning-gym refuses an empty dataset)
        return []
    try:
        dataset = rg.create_dataset(name, size=size, seed=seed, **settings)
    except (TypeError, ValueError, AssertionError) as e:  # an unknown or invalid setting
        raise ValueError(f"reasoning-gym refused the settings {settings} of {name!r}: {type(e).__name__}: {e}"
                         ) from None
    rows = []
    for entry in dataset:
        try:
            gold = json.dumps({"dataset": name, "settings": settings, "entry": entry})
        except TypeError as e:  # the verifier's workers are handed text: an entry must survive JSON
            raise ValueError(f"{name}'s problems do not convert to JSON ({e}): not supported") from None
        rows.append(dict(prompt=format_prompt(entry["question"], template, tokenizer), question=entry["question"],
                         answer=str(entry["answer"]), gold=gold))
    return rows


def _reasoning_gym_data(cfg, tokenizer) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows) of a run whose --dataset is a reasoning-gym generator: held-out problems from
    seed 0, training problems from the seeds of cfg.seed (RG_SEED_BLOCK); a training problem whose question is
    also held out (a small problem space repeats itself) is dropped, and how many were is logged."""
    eval_source = cfg.eval_dataset or cfg.dataset
    if not is_reasoning_gym(eval_source):
        raise ValueError(f"--eval-dataset {eval_source}: a reasoning-gym --dataset is scored by its generator, so "
                         f"the held-out problems must be one too (reasoning-gym:NAME), or leave --eval-dataset out")
    held_out = reasoning_gym_rows(eval_source, cfg.eval_prompts, 0, cfg.template, tokenizer)
    train = reasoning_gym_rows(cfg.dataset, None, stream(cfg.seed, "reasoning_gym_train") * RG_SEED_BLOCK, cfg.template,
                               tokenizer)
    seen = {r["question"] for r in held_out}
    kept = [r for r in train if r["question"] not in seen]
    if len(kept) < len(train):
        log.info("%s: %d of %d training problems are also held out (same question): dropped from training",
                 cfg.dataset, len(train) - len(kept), len(train))
    if not kept:
        raise ValueError("every training problem is also a held-out one: the settings leave too few problems")
    return kept, held_out


# --- a run's data -------------------------------------------------------------------------------------------
def load_data(cfg, tokenizer) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows) of a run (a config.Config): the built-in task's splits, a reasoning-gym
    generator's problems from disjoint seeds (_reasoning_gym_data), or --dataset and --eval-dataset (or the last
    --eval-prompts rows of --dataset). A bad file or row is the user's to fix:
    SystemExit naming the option, the file and the row."""
    if cfg.builtin:
        chains = task.LONG if cfg.dataset == "builtin-long" else task.DEMO
        steps = chains.min_steps, chains.max_steps
        held_out = task.make_dataset(cfg.eval_prompts, 0, *steps, split="eval")
        if chains is task.LONG:  # evaluation also reports accuracy by band of step counts (1-10, 11-20, ...)
            held_out = [{**r, "band": task.band_of(r["n_steps"])} for r in held_out]
        train_steps = cfg.train_step_range or steps  # --train-steps LO-HI: training problems of those steps only
        return task.make_dataset(20000, stream(cfg.seed, "builtin_rows"), *train_steps, split="train"), held_out
    if is_reasoning_gym(cfg.dataset) or is_reasoning_gym(cfg.eval_dataset):
        if not is_reasoning_gym(cfg.dataset):
            raise SystemExit(f"vapo: --eval-dataset {cfg.eval_dataset}: a reasoning-gym generator scores only its own "
                             f"problems; use it as --dataset too, or give a file")
        try:
            return _reasoning_gym_data(cfg, tokenizer)
        except (ValueError, ImportError) as err:
            raise SystemExit(f"vapo: --dataset {cfg.dataset}: {err}") from None
    kw = dict(question_field=cfg.question_field, answer_field=cfg.answer_field, template=cfg.template,
              tokenizer=tokenizer)

    def load(option, source, split):
        try:
            return load_prompts(source, split=split, **kw)
        except (ValueError, OSError, RuntimeError, ImportError) as err:
            raise SystemExit(f"vapo: {option} {source}: {err}") from None
    train = load("--dataset", cfg.dataset, cfg.train_split)
    if cfg.eval_dataset:
        return train, load("--eval-dataset", cfg.eval_dataset, cfg.eval_split)[:cfg.eval_prompts]
    if len(train) <= cfg.eval_prompts:
        raise SystemExit(f"--dataset {cfg.dataset}: {len(train)} rows, too few to hold out --eval-prompts "
                         f"{cfg.eval_prompts}; give --eval-dataset or a smaller --eval-prompts")
    train, held_out = train[:-cfg.eval_prompts or None], train[len(train) - cfg.eval_prompts:]
    log.info("held out the last %d rows of %s for evaluation", len(held_out), cfg.dataset)
    return train, held_out


def prompt_batch(rows: list[dict], step: int, n: int, seed: int) -> list[dict]:
    """The n prompts of a step: a pass over the data in a seeded random order per epoch, a pure function of the
    step so that a resumed run sees the same prompts as one that ran through."""
    picked = []
    for i in range(step * n, (step + 1) * n):
        epoch, pos = divmod(i, len(rows))
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        picked.append(rows[int(order[pos])])
    return picked


def check_gold_answers(rows: list[dict], verifier: Verifier, max_bad_share: float = 0.05):
    """Score each held-out gold answer, stated as a response, against itself before training: a gold the verifier
    cannot read would score every sample -1 and train on noise. Stops with the rows named when more than
    max_bad_share of them fail; a smaller share is logged with the rows (they can only ever score -1)."""
    if not rows or verifier.fn not in (arith_reward, math_reward, reasoning_gym_reward):  # others judge otherwise
        return
    if verifier.fn is reasoning_gym_reward:  # its gold is the generator's entry: the answer line must earn +1
        scores = verifier.rewards([f"Answer: {r['answer']}" for r in rows], [gold_of(r) for r in rows], stats={})
        bad = [i for i, score in enumerate(scores) if score != CORRECT_REWARD]
    else:
        bad = verifier.unreadable_golds([r["answer"] for r in rows])
    if not bad:
        return
    shown = "; ".join(f"row {i + 1}: {rows[i]['answer'][:60]!r}" for i in bad[:5])
    message = (f"{len(bad)} of {len(rows)} held-out gold answers do not verify against themselves ({shown}"
               f"{' ...' if len(bad) > 5 else ''}): the verifier cannot read them")
    if len(bad) > max_bad_share * len(rows):
        hint = ("this generator's answers do not fit the one 'Answer:' line the prompt asks for"
                if verifier.fn is reasoning_gym_reward else "Check --answer-field and the answer format (GSM8K's "
                "'#### 42' is read; a worked solution is not an answer)")
        raise SystemExit(f"vapo: {message}. {hint}.")
    log.warning("%s; they are kept and will score -1", message)
