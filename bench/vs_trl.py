"""Benchmark: this project's GRPO and VAPO steps against TRL's GRPOTrainer, on the same model, prompts and budget.

    python bench/vs_trl.py                                   # 3 repetitions of TRL, grpo, vapo, interleaved
    python bench/vs_trl.py --repeats 5 --steps 6 --threads 1
    python bench/vs_trl.py --contenders grpo vapo --tiny --repeats 1 --steps 1    # without TRL (the test)

TRL is a benchmark dependency only (not in requirements.txt). Install it into a virtual environment of its own,
so the project's stays as CI has it, and run this script from there (it runs `vapo.py` with the same interpreter,
so every contender gets the same torch and transformers):

    python3 -m venv .venv-trl && . .venv-trl/bin/activate && pip install torch==2.13.0 -r requirements.txt trl==1.16.0

(`torch==2.13.0` first as in README.md's two commands: the CPU build; check `python -c "import torch;
print(torch.__version__)"` says 2.13.0+cpu after the second install too.) Without TRL the script says so and
stops, unless `--contenders` leaves it out.

Contenders, each one run = one fresh process, `--steps` timed rollouts after one untimed warm-up rollout:
- `trl`: `trl.GRPOTrainer` on the CPU (`GRPOConfig(use_cpu=True, bf16=False, gradient_checkpointing=False,
  beta=0.0, loss_type="dapo")`: no reference model, the token-level loss), a Python reward function that calls
  this project's own verifier (`reward.score_batch(..., verifier=reward.arith_reward)`, what vapo.py's reward
  phase calls for the built-in task), generation by `model.generate` (TRL's path without vLLM);
- `grpo`: `python vapo.py --algo grpo` (the demo preset; no critic);
- `vapo`: `python vapo.py --algo vapo --no-value-pretraining` (the demo preset; the critic is scored and trained
  in every step; value pretraining, a one-off of at most 30 critic-only steps before the RL phase, is left out
  of the per-step figures);
- `grpo-recompute`, `vapo-recompute` (only when named in `--contenders`): the same with `--old-logprobs
  recompute`, the policy's scoring pass that TRL also makes, to show what taking the sampler's log-probs saves.

What is the same for all three: the shipped base model (task.ensure_base_model(), loaded in float32 by
models.load_policy), the demo's prompts in the same order (data.prompt_batch of RL step s: the TRL worker checks
that the prompts its reward function sees are those), 16 prompts x 8 samples per rollout, at most 128 new tokens,
temperature 1.0, top_p 1, no top-k, min-p or repetition penalty, two optimizer steps per rollout (mini-batches of
64 samples in micro-batches of 16: for TRL per_device_train_batch_size=16, gradient_accumulation_steps=4,
steps_per_generation=8, so the second optimizer step is off-policy and TRL computes the old log-probs in a scoring
pass; vapo.py takes them from its sampler, which drew from the same float32 weights at top_p 1: `--old-logprobs
auto`; the contenders grpo-recompute and vapo-recompute run `--old-logprobs recompute`, a scoring pass as TRL's),
the actor learning rate and warmup of the demo preset, gradient clipping at 1.0, AdamW (TRL: its default fused
AdamW; vapo.py: torch.optim.AdamW), the same torch threads (`--threads`; default: torch's default, one per core).
No evaluation, no checkpoints inside the timed steps (vapo.py runs with --eval-prompts 0; TRL with
save_strategy="no").

Timing: the wall time from the end of one rollout's last optimizer step to the end of the next one's, for
every contender alike (TRL: a TrainerCallback's on_step_end after every second optimizer step, so a rollout's
time holds its generation, reward, scoring, both updates and the trainer's own bookkeeping; vapo.py: the
difference of `time/elapsed` between consecutive step records of metrics.jsonl, i.e. `time/step` plus the
writing of the record). The first rollout of every run is the warm-up and is left out. Generated tokens are
counted per rollout (the EOS token included, as both count a response's length): ms per token corrects for
policies whose responses differ in length. Per repetition and contender: ms per generated sample = timed
seconds / timed samples, ms per token = timed seconds / timed tokens; reported: the medians over repetitions,
and the ratios TRL / ours as medians of each repetition's ratio (the contenders of a repetition run back to
back, so a burst of load on a shared machine hits neighbours alike). Targets (per sample): ours GRPO at least
2x faster than TRL's GRPO, ours VAPO at least 1.3x faster than TRL's GRPO.

Also recorded, for where the time goes: vapo.py's phases (time/rollout, time/reward, time/score, time/update)
and TRL's own profiling blocks (transformers.generate, the reward function, _prepare_inputs = generation +
reward + scoring, compute_loss = the training forward passes and the loss; the rest of the rollout's time,
backward passes, optimizer steps and the trainer's bookkeeping, as "backward, optimizer, other").
Prints the machine, the date and a markdown table; writes every raw timing to --out (JSON).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

CONTENDERS = ("trl", "grpo", "vapo", "grpo-recompute", "vapo-recompute")  # the last two: on request
INSTALL = ("python3 -m venv .venv-trl && . .venv-trl/bin/activate && "
           "pip install torch==2.13.0 -r requirements.txt trl==1.16.0")
TRL_VERSION = "1.16.0"  # the version measured and documented; others may run, with a note
TARGETS = {"grpo": 2.0, "vapo": 1.3}  # TRL's ms per sample / ours, at least
# --tiny: 2 prompts x 2 samples, 16 new tokens, mini-batches of 2 in micro-batches of 1 (still 2 optimizer steps
# per rollout): a check that everything runs, not a measurement
TINY = dict(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=16, mini_batch_size=2, micro_batch_size=1)
COMMANDS = {"trl": "trl.GRPOTrainer (loss_type=dapo, beta=0)", "grpo": "python vapo.py --algo grpo",
            "vapo": "python vapo.py --algo vapo --no-value-pretraining",
            "grpo-recompute": "python vapo.py --algo grpo --old-logprobs recompute",
            "vapo-recompute": "python vapo.py --algo vapo --no-value-pretraining --old-logprobs recompute"}


def shapes(tiny: bool) -> dict:
    """The batch shapes and sampling settings every contender uses: the demo preset's (or --tiny's)."""
    import config
    import vapo
    keys = ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "mini_batch_size", "micro_batch_size",
            "temperature", "top_p", "actor_lr", "warmup_steps", "max_grad_norm", "eps_low", "seed")
    cfg = vapo.Config(**{**config.PRESETS["demo"], **(TINY if tiny else {})}).validate()
    return {k: getattr(cfg, k) for k in keys}


def step_prompts(shape: dict, steps: int) -> list[list[dict]]:
    """The rows of RL steps 0 .. steps-1, as vapo.py draws them (data.load_data, data.prompt_batch)."""
    import data
    import task
    rows = task.make_dataset(20000, seed=shape["seed"], split="train")  # data.load_data's training rows
    return [data.prompt_batch(rows, s, shape["prompts_per_step"], shape["seed"]) for s in range(steps)]


def child_env(threads: int) -> dict:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if threads > 0:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def missing_trl() -> str | None:
    """None when TRL imports, else the message that says how to install it."""
    try:
        import trl  # noqa: F401
    except ImportError as err:
        return (f"vs_trl: TRL is not installed ({err}). It is a benchmark dependency only, not in requirements.txt; "
                f"install it into a virtual environment of its own and run this script from there:\n    {INSTALL}\n"
                f"or measure this project's contenders alone with --contenders grpo vapo")
    return None


# --- the contenders -------------------------------------------------------------------------------------------
def run_ours(name: str, shape: dict, args, workdir: str) -> dict:
    """`python vapo.py --algo ALGO` for 1 + args.steps RL steps, timed from its metrics.jsonl. name: ALGO, or
    ALGO-recompute for the same with a policy scoring pass for the old log-probs (--old-logprobs recompute)."""
    algo = name.split("-")[0]
    out = os.path.join(workdir, name)
    cmd = [sys.executable, os.path.join(ROOT, "vapo.py"), "--preset", "demo", "--algo", algo,
           "--steps", str(args.steps + 1), "--eval-prompts", "0", "--save-every", "0", "--output-dir", out,
           "--overwrite", "--seed", str(shape["seed"]), "--device", "cpu"]
    for k in ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "mini_batch_size", "micro_batch_size",
              "temperature", "top_p"):
        cmd += [f"--{k.replace('_', '-')}", str(shape[k])]
    if algo == "vapo":
        cmd.append("--no-value-pretraining")
    if name.endswith("-recompute"):
        cmd += ["--old-logprobs", "recompute"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(args.threads), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"vs_trl: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        records = [r for r in map(json.loads, filter(str.strip, fh)) if "step" in r and "time/step" in r]
    rollouts, previous = [], None
    for r in sorted(records, key=lambda r: r["step"]):
        seconds = r["time/elapsed"] - previous if previous is not None else r["time/step"]
        previous = r["time/elapsed"]
        phases = {k.split("/", 1)[1]: r[k] for k in ("time/rollout", "time/reward", "time/score", "time/advantages",
                                                     "time/update", "time/step") if k in r}
        rollouts.append({"rollout": r["step"] - 1, "warmup": r["step"] == 1, "seconds": seconds,
                         "samples": r["samples_generated"],
                         "tokens": int(round(r["response_len"] * r["samples_generated"])),
                         "train_acc": r["train_acc"], "phases": phases})
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return {"command": " ".join(cmd[1:]), "process_wall_s": wall, "rollouts": rollouts}


def run_trl(shape: dict, args, workdir: str) -> dict:
    """This script in --worker mode, in a process of its own."""
    result = os.path.join(workdir, "trl.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "trl", "--worker-out", result,
           "--steps", str(args.steps)] + (["--tiny"] if args.tiny else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(args.threads), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"vs_trl: the TRL run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(result) as fh:
        report = json.load(fh)
    return {"command": " ".join(cmd[1:]), "process_wall_s": wall, **report}


def trl_worker(args):
    """One TRL GRPOTrainer run of 1 + args.steps rollouts; writes {"rollouts", "trl", "threads", ...} as JSON."""
    message = missing_trl()
    if message:
        raise SystemExit(message)
    import datasets
    import torch
    import transformers
    import trl
    from trl.extras import profiling

    import reward
    import task
    from models import load_policy

    shape = shapes(args.tiny)
    P, G = shape["prompts_per_step"], shape["samples_per_prompt"]
    batch = P * G
    rollouts_n = args.steps + 1
    per_rollout = [[r for r in rows] for rows in step_prompts(shape, rollouts_n)]
    dataset = datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]}
                                          for rows in per_rollout for r in rows])
    policy, tokenizer = load_policy(task.ensure_base_model(), dtype=torch.float32, device=torch.device("cpu"))

    generations = []  # per reward call (one per rollout): the tokens, samples, prompts seen

    def arith(prompts, completions, completion_ids, answer, **kwargs):
        """The project's verifier on TRL's decoded completions, as vapo.py's reward phase calls it."""
        generations.append({"samples": len(completions), "tokens": sum(len(c) for c in completion_ids),
                            "prompts": list(dict.fromkeys(prompts))})
        return reward.score_batch(completions, answer, verifier=reward.arith_reward, num_workers=0)

    blocks: list[tuple[str, float]] = []  # TRL's own profiling blocks, in order

    def record(self, duration):
        blocks.append((self.name, duration))
    profiling.ProfilingContext._log_metrics = record

    ends: list[tuple[float, int]] = []  # (perf_counter, blocks so far) at each on_step_end

    class Timer(transformers.TrainerCallback):
        def on_train_begin(self, *a, **kw):
            ends.append((time.perf_counter(), 0))

        def on_step_end(self, *a, **kw):
            ends.append((time.perf_counter(), len(blocks)))

    mini, micro = shape["mini_batch_size"], shape["micro_batch_size"]
    out_dir = tempfile.mkdtemp(prefix="vs_trl-")
    config = trl.GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        beta=0.0, loss_type="dapo", num_iterations=1, epsilon=shape["eps_low"], scale_rewards="group",
        num_generations=G, per_device_train_batch_size=micro, gradient_accumulation_steps=mini // micro,
        steps_per_generation=batch // micro,  # one generation of P x G samples per batch // mini optimizer steps
        max_completion_length=shape["max_new_tokens"], temperature=shape["temperature"], top_p=shape["top_p"],
        top_k=0, min_p=None, repetition_penalty=1.0,
        learning_rate=shape["actor_lr"], lr_scheduler_type="constant_with_warmup", warmup_steps=shape["warmup_steps"],
        weight_decay=0.0, max_grad_norm=shape["max_grad_norm"],
        max_steps=rollouts_n * (batch // mini), shuffle_dataset=False, seed=shape["seed"],
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0)
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=[arith], args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[Timer()])
    try:
        trainer.train()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)

    per = batch // mini  # optimizer steps (trainer steps) per rollout
    if len(ends) != 1 + rollouts_n * per or len(generations) != rollouts_n:
        raise SystemExit(f"vs_trl: TRL ran {len(ends) - 1} optimizer steps and {len(generations)} generations, "
                         f"expected {rollouts_n * per} and {rollouts_n}")
    rollouts = []
    for i in range(rollouts_n):
        (t_start, b_start), (t_end, b_end) = ends[i * per], ends[(i + 1) * per]
        expected = [r["prompt"] for r in per_rollout[i]]
        if generations[i]["prompts"] != expected:
            raise SystemExit(f"vs_trl: TRL's rollout {i} sampled other prompts than vapo.py's step {i + 1}")
        phases: dict[str, float] = {}
        for name, seconds in blocks[b_start:b_end]:
            name = name.split(".", 1)[1] if name.startswith("GRPOTrainer.") else name
            phases[name] = phases.get(name, 0.0) + seconds
        if "_prepare_inputs" in phases and "compute_loss" in phases:  # what the profiling blocks leave out
            phases["backward, optimizer, other"] = t_end - t_start - phases["_prepare_inputs"] - phases["compute_loss"]
        if generations[i]["samples"] != batch:
            raise SystemExit(f"vs_trl: TRL's rollout {i} had {generations[i]['samples']} samples, expected {batch}")
        rollouts.append({"rollout": i, "warmup": i == 0, "seconds": t_end - t_start,
                         "samples": generations[i]["samples"], "tokens": generations[i]["tokens"], "phases": phases})
    logged = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    report = {"rollouts": rollouts, "trl": trl.__version__, "threads": torch.get_num_threads(),
              "optimizer_steps_per_rollout": per,
              "trl_logged_mean_length": [h["completions/mean_length"] for h in logged]}
    with open(args.worker_out, "w") as fh:
        json.dump(report, fh)


# --- summary --------------------------------------------------------------------------------------------------
def per_repetition(run: dict) -> dict:
    """ms per sample and per token over a run's timed rollouts (the warm-up left out)."""
    timed = [r for r in run["rollouts"] if not r["warmup"]]
    seconds = sum(r["seconds"] for r in timed)
    samples = sum(r["samples"] for r in timed)
    tokens = sum(r["tokens"] for r in timed)
    return {"ms_per_sample": 1e3 * seconds / samples, "ms_per_token": 1e3 * seconds / tokens,
            "s_per_rollout": seconds / len(timed), "tokens_per_sample": tokens / samples, "rollouts": len(timed)}


def median_phases(runs: list[dict]) -> dict:
    """Each phase's median seconds per timed rollout, over every timed rollout of every repetition."""
    names = dict.fromkeys(k for run in runs for r in run["rollouts"] for k in r.get("phases", {}))
    return {k: statistics.median(r["phases"].get(k, 0.0) for run in runs for r in run["rollouts"]
                                 if not r["warmup"]) for k in names}


def summarise(runs: dict[str, list[dict]]) -> dict:
    out = {}
    for name, reps in runs.items():
        per = [per_repetition(run) for run in reps]
        out[name] = {"per_repetition": per,
                     **{k: statistics.median(p[k] for p in per) for k in
                        ("ms_per_sample", "ms_per_token", "s_per_rollout", "tokens_per_sample")},
                     "phases_median_s": median_phases(reps)}
    if "trl" in out:
        for name in (n for n in out if n != "trl"):
            ratios = {}
            for unit in ("ms_per_sample", "ms_per_token"):
                each = [t[unit] / o[unit] for t, o in zip(out["trl"]["per_repetition"], out[name]["per_repetition"])]
                ratios[unit] = {"median_of_repetitions": statistics.median(each), "per_repetition": each,
                                "of_medians": out["trl"][unit] / out[name][unit]}
            out[name]["trl_over_this"] = ratios
            if name in TARGETS:
                out[name]["target"] = {"per_sample_at_least": TARGETS[name],
                                       "met": ratios["ms_per_sample"]["median_of_repetitions"] >= TARGETS[name]}
    return out


def table(summary: dict) -> str:
    lines = ["| contender | command | ms / sample | ms / token | tokens / sample | s / rollout "
             "| TRL / this, per sample | TRL / this, per token | target (per sample) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        ratio = s.get("trl_over_this")
        per_sample = f"{ratio['ms_per_sample']['median_of_repetitions']:.2f}x" if ratio else "-"
        per_token = f"{ratio['ms_per_token']['median_of_repetitions']:.2f}x" if ratio else "-"
        target = (f">= {s['target']['per_sample_at_least']}x: {'met' if s['target']['met'] else 'NOT met'}"
                  if "target" in s else "-")
        lines.append(f"| {name} | `{COMMANDS[name]}` | {s['ms_per_sample']:.1f} | {s['ms_per_token']:.2f} | "
                     f"{s['tokens_per_sample']:.1f} | {s['s_per_rollout']:.2f} | {per_sample} | {per_token} | "
                     f"{target} |")
    return "\n".join(lines)


def phase_lines(summary: dict) -> list[str]:
    lines = []
    for name, s in summary.items():
        ph = s["phases_median_s"]
        if not ph:
            continue
        lines.append(f"{name}: " + ", ".join(f"{k} {v:.2f} s" for k, v in ph.items()))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="repetitions, each one run of every contender in turn")
    ap.add_argument("--steps", type=int, default=4, help="timed rollouts per run, after one untimed warm-up rollout")
    ap.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS[:3]),
                    help="which to run, in this order within each repetition (default: trl grpo vapo; "
                         "grpo-recompute and vapo-recompute add the policy's scoring pass for the old log-probs, "
                         "as before --old-logprobs existed)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads of every contender (OMP_NUM_THREADS); 0 = torch's default, one per core")
    ap.add_argument("--tiny", action="store_true", help="2 prompts x 2 samples, 16 new tokens, mini-batches of 2 "
                                                        "in micro-batches of 1: a check that it runs")
    ap.add_argument("--keep", action="store_true", help="keep vapo.py's run folders (in a temporary folder)")
    ap.add_argument("--out", default=os.path.join("runs", "vs_trl.json"), help="the JSON of all raw timings")
    ap.add_argument("--worker", choices=("trl",), help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.steps < 1 or args.threads < 0:
        ap.error("--repeats and --steps must be >= 1, --threads >= 0")
    if args.worker:
        return trl_worker(args)
    if "trl" in args.contenders:
        message = missing_trl()
        if message:
            raise SystemExit(message)
    contenders = list(dict.fromkeys(args.contenders))

    import demo_seeds
    import task
    import torch
    import transformers
    started = datetime.datetime.now().isoformat(timespec="seconds")
    machine = demo_seeds.machine()
    threads = args.threads or torch.get_num_threads()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    if "trl" in contenders:
        import trl
        versions["trl"] = trl.__version__
        if trl.__version__ != TRL_VERSION:
            print(f"note: TRL {trl.__version__}; the documented measurement is TRL {TRL_VERSION}", flush=True)
    print(f"machine: {machine}\ndate: {started}; {threads} torch threads per contender "
          f"({'--threads' if args.threads else 'torch default'}); "
          + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    task.ensure_base_model()  # built (if a checkout lacks it) once, before the runs
    shape = shapes(args.tiny)
    print(f"{args.repeats} repetitions of {' '.join(contenders)}, each run 1 warm-up + {args.steps} timed rollouts of "
          f"{shape['prompts_per_step']} prompts x {shape['samples_per_prompt']} samples, <= "
          f"{shape['max_new_tokens']} new tokens, {shape['mini_batch_size']}-sample mini-batches "
          f"(2 optimizer steps per rollout)", flush=True)

    t0 = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="vs_trl-")
    runs: dict[str, list[dict]] = {c: [] for c in contenders}
    try:
        for rep in range(args.repeats):
            for name in contenders:  # A B C A B C ...: each repetition runs every contender once, in turn
                run = run_trl(shape, args, workdir) if name == "trl" else run_ours(name, shape, args, workdir)
                run["repetition"] = rep
                runs[name].append(run)
                p = per_repetition(run)
                print(f"repetition {rep + 1}/{args.repeats} {name}: {p['ms_per_sample']:.1f} ms/sample, "
                      f"{p['ms_per_token']:.2f} ms/token, {p['tokens_per_sample']:.1f} tokens/sample "
                      f"({run['process_wall_s']:.0f} s process)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = summarise(runs)
    print(f"\nmachine: {machine}\ndate: {started}; {time.perf_counter() - t0:.0f} s in all; {threads} torch threads "
          f"per contender; " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"medians over {args.repeats} repetitions of {args.steps} timed rollouts each (warm-up rollout left out); "
          f"ratios: medians of each repetition's TRL / this"
          f"{'; --tiny: a smoke run, not a measurement' if args.tiny else ''}\n")
    print(table(summary))
    if any(s["phases_median_s"] for s in summary.values()):
        print("\nmedian seconds per timed rollout, by phase (vapo.py: its logged time/*; TRL: its profiling blocks):")
        print("\n".join(phase_lines(summary)))
    report = {"machine": machine, "date": started, "threads": threads, "versions": versions, "args": vars(args),
              "shape": shape, "commands": {c: COMMANDS[c] for c in contenders}, "targets": TARGETS,
              "summary": summary, "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
