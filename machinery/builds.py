"""The builds of the built-in task's models: the base models (a supervised warm start of task.py's tiny model on
the task's imperfect demonstrations) and the long chains' outcome reward model; where they are shipped, and the
command that rebuilds them.

The demo's base model (build_base_model) warm-starts a random tiny model on demonstrations of the "train" split
only. The warm start is long enough for the model to be precise at everything else (no wrong ordinary step under
greedy decoding): greedy decoding follows the habit on nearly every borrow step, so base accuracy is low under
greedy decoding as well as under sampling, and falls with the number of steps; sampling at temperature 1 still
takes the correct path on about one borrow step in three, which is what RL must find and reinforce (`python
builds.py eval` prints these rates, see task.step_errors). The long chains' base model (RECIPES["long"]) continues
the demo's on the long chains' demonstrations (task.LONG). Their outcome reward model (build_reward_model) is
trained, as reward models are, on the base policy's own samples labelled by the verifier, on its score at the EOS
token only; the long preset's critic starts from it. docs/demo.md and docs/long.md at commit 758a9d0 have their figures.

The models are shipped, 4 MB each, so that runs start from the same bits on every machine (a rebuild on another
CPU gives another model: its kernels round differently): <repo>/base-model (SHIPPED_BASE), <repo>/base-model-long
(SHIPPED_LONG_BASE) and <repo>/reward-model-long (SHIPPED_LONG_RM); BUILTIN_MODELS names them for --model and
--value-model. Rebuilding them:

    python -m machinery.builds build --out base-model                          # the demo's, about 8 minutes on one core
    python -m machinery.builds build --chains long --out base-model-long       # about 50 minutes, from base-model/
    python -m machinery.builds reward-model --out reward-model-long            # about 7 minutes, from base-model-long/

Without --out a build goes to the cache (<repo>/.cache/<name>, or $VAPO_CACHE/<name>); `build --seed N` builds
another base model. `build` prints the model's accuracy table and whether it is bit-identical to the shipped one;
`python -m machinery.builds eval [--chains long] [--model DIR]` prints a model's accuracy by number of steps and the step
error rates. The trainer finds the shipped folders through models.shipped_model(name), which names the command
above when a checkout lacks one.
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
import shutil
import tempfile
import time

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from machinery.models import BUILTIN_MODELS, replace_atomically, shipped_model, value_model_from_policy
from machinery.task import (CHAINS, DEMO, EVAL_FRACTION, LONG, MAX_VALUE, Chains, _problem_in_split, build_tiny_policy,
                  build_tokenizer, evaluate_accuracy, format_table, generate_responses, is_correct, make_dataset,
                  make_demonstration, solve, tiny_config)

# --- the base model (supervised warm start) ---------------------------------------------------------------
BASE_NAME = "arith-base-v4"  # bump when the task or the recipe changes, so stale caches are not reused
BUILD_INFO = "build_info.json"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, above machinery/
# The base model the demo starts from, built once by `python -m machinery.builds build --out base-model` and committed, so
# every machine starts from the same bits (a rebuild on another CPU gives another model: its kernels round
# differently). SHIPPED_SHA256 is its weights' checksum; tests check the files against it and their accuracy
# against build_info.json.
SHIPPED_BASE = BUILTIN_MODELS["builtin"][0]
SHIPPED_SHA256 = "c3778d821c15ce7706fd6e96a3ae395aee6e17ed8589319f6825be3afcf64cd7"
SFT_STEPS = 2000  # about 8 minutes on one CPU core (fp32, 0.23 s/step); see warm_start and build_base_model
SFT_TOKENS_PER_BATCH = 2048  # batch size adapts to the sequence length of the step count drawn
SFT_LR = 3e-3
SFT_INIT_STD = 0.1  # init std of the warm start: with Qwen2's 0.02 finding the labelled terms took far longer
SFT_WARMUP = 20
SFT_SEED = 0
EVAL_SEED = 1  # seed of the held-out problems the build measures accuracy on
EVAL_PER_STEP = 30  # held-out problems per step count in the build's accuracy table

# The long chains' models, shipped beside base-model/: base-model-long/ (`python -m machinery.builds build --chains long --out
# base-model-long`) and reward-model-long/ (`python -m machinery.builds reward-model --out reward-model-long`).
SHIPPED_LONG_BASE, SHIPPED_LONG_RM = BUILTIN_MODELS["builtin-long"][0], BUILTIN_MODELS["builtin-long-rm"][0]
# A recipe per version of the task: its stages, (optimizer steps, peak learning rate) each, one warmup-and-cosine
# schedule per stage, stage i drawing its batches with seed + i. The long base model continues from the demo's
# (init) in two stages: about 0.65 s a step of 4,096 tokens on one core, so its build takes about 50 minutes. One
# stage of 1,500 steps left the model misreading a term on many lines of a long prompt (it copies a neighbour's
# term); docs/long.md at commit 758a9d0 has the figures of each stage.
LONG_SFT_STAGES = ((2500, 1e-3), (2000, 1e-3))
LONG_SFT_STEPS = sum(s for s, _ in LONG_SFT_STAGES)
LONG_BASE_SHA256 = "915808c5ea0d71be64f2c55bd03cb0975853d6c44c8f2f786bb164dc7b77bdf3"  # base-model-long/'s weights
LONG_RM_SHA256 = "fff76502cd5d41fde2afa44321f437cd5f6c8429305655f6347f82503360682d"  # reward-model-long/'s
RECIPES = {
    "demo": dict(name=BASE_NAME, stages=((SFT_STEPS, SFT_LR),), tokens_per_batch=SFT_TOKENS_PER_BATCH, init=None),
    "long": dict(name="arith-long-base-v1", stages=LONG_SFT_STAGES, tokens_per_batch=4096, init="builtin"),
}


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
    docs/demo.md at commit 758a9d0, "The base model". chains=LONG continues from the shipped demo base model instead of a random
    initialisation (RECIPES["long"]: it already knows the format, the arithmetic and labels a-j).
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
    """$VAPO_CACHE/<name>, or <repo>/.cache/<name>: where `python -m machinery.builds build` writes by default."""
    root = os.environ.get("VAPO_CACHE") or os.path.join(ROOT, ".cache")
    return os.path.join(root, name)


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
    """`python -m machinery.builds build [--chains long] [--out DIR] [--steps N]`, `python -m machinery.builds reward-model [--out
    DIR]` or `python -m machinery.builds eval [--chains long] [--model DIR] [--per-step N]`."""
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
