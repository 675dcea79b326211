"""Benchmark: one VAPO training step, phase by phase, against the floors of its two heavy phases.

    python bench/bench_step.py                                  # the demo and the 13M setting, 3 repetitions
    python bench/bench_step.py --settings demo --repeats 5
    python bench/bench_step.py --device cuda --bf16 --out runs/bench_step-gpu.json
    python bench/bench_step.py --tiny --repeats 1 --warmup 0     # 2 prompts x 2 samples, 16 tokens (the test)

On a small CPU a repetition of the 13m setting (step and floors) takes minutes: the default run is long there.

Settings (`--settings`), both `--preset demo` (16 prompts x 8 samples, 128 new tokens, mini-batches of 64,
micro-batches of 16, one PPO epoch) on the built-in arithmetic prompts:
- `demo`: the shipped base model (builds.ensure_base_model(), 1M parameters), loaded as `python vapo.py` loads it;
- `13m`: a Qwen2 model of 12.7M parameters built here from the built-in tokenizer (hidden 256, 12 layers, 4
  attention and 4 KV heads, intermediate 1024; MODEL_13M), randomly initialised: its samples are noise, EOS
  comes at random (about 1 in 257 tokens), so most responses run to max_new_tokens and each row costs about
  the same. The critic is a copy of the policy's backbone with a zero head (models.value_model_from_policy).

Each repetition is one real training step: `vapo.rl_step` itself (what vapo.train calls each step), as step r of
a run, sampling with the engine vapo.train makes (vapo.make_engine: the HF engine, over the policy itself). Its
phases are timed by rl_step's own clock, the `time/<phase>` figures of the record it returns (vapo.timed, which
synchronises a CUDA device around each phase): rollout (`HFEngine.generate`, G samples per prompt, finished rows
dropped from the batch), reward (`vapo.verify`: the verifier on each response), scoring (`vapo.score`, no grad:
the critic's values, and the policy's old log-probs and entropy unless vapo.old_logprobs_from_sampler takes them
from the sampler, as it does for the HF engine at top_p 1 in float32; the policy's scoring pass is then timed
apart, on the same rollout, as what `--old-logprobs recompute` would add), advantages
(`vapo.advantages_and_returns`) and update (`vapo.update`: losses, backward, gradient clipping, AdamW and
scheduler steps). `step` is the sum of the five; rl_step's own time/step (which also counts drawing the prompts
and what runs between the phases) is reported beside it as `rl_step`. Nothing of the step is copied here: what
the floors replay (the rollout the update trained on, and the random state it drew its mini-batch order from)
is noted by a wrapper around vapo.update as rl_step calls it (watching_update). Then, in the same repetition,
on the same tokens:

- the update's floor: the bare forward and backward passes of the same policy and critic (train mode, the same
  autocast and gradient checkpointing) over the same rows in the same micro-batches (the update's own
  mini-batch order, replayed from its random state, each mini-batch sorted by rollout.by_length and split into
  micro_batch_size rows, each trimmed by Rollout.select), with no loss logic: the loss is the sum of the
  policy's logits gathered at the response tokens (no log-softmax), then, separately as the update does, the
  sum of the critic's values, each times the response mask, and backward. No gradient clipping, no scheduler,
  no .item(). Reported as `floor fwd+bwd`; the AdamW steps the update makes (one per model per mini-batch,
  with zero_grad) are timed on their own (`floor AdamW`), on the real optimizers. The update's ratio is
  update / (fwd+bwd + AdamW): what the update spends beyond the work it cannot avoid (target <= 1.15).
- the sampling floor: a bare KV-cached decode loop over the rollout's own prompt tokens (left-padded, the
  same B rows): one prefill of the N distinct prompts (last position's logits only) whose KV cache is repeated
  G times, as the rollout's own, then one token per step for every row,
  model(input_ids, attention_mask, position_ids, past_key_values=cache, use_cache=True), multinomial
  sampling from softmax(logits / temperature), for as many tokens as the rollout's longest response (its
  number of sampling steps), with no EOS bookkeeping, no log-probs and no row compaction (target: rollout /
  floor <= 1.5). Because the floor keeps every row to the end, a rollout with ragged lengths (the demo's)
  can beat it: finished rows leave the rollout's batch (sampler.COMPACT_FRACTION).

A repetition advances the models, the AdamW states and the schedulers by one real step (and the floors' AdamW
steps on their dummy gradients move the weights again), so before each repetition the weights are put back as
loaded, and the AdamW states and schedulers as the first update left them (--warmup untimed repetitions run
first, default 1, so the timed ones find the AdamW states allocated, as every step of a run but the first does):
every repetition starts from the same state, and the floors change nothing that is measured. Prompts differ
between repetitions (vapo.step_prompts of step r), the random state is seeded per repetition. Figures are medians
over the repetitions; the ratios are medians of each repetition's ratio (phases and floors of a repetition
run back to back, so a burst of load on a shared machine hits both). Peak memory of a step (the rl_step call): on
CUDA torch.cuda.max_memory_allocated (reset before the step), on a CPU the peak resident set (VmHWM, reset
before the step through /proc/self/clear_refs; where that is refused, ru_maxrss, a high-water mark over the
process's whole life), both with the memory in use before the step. Prints a markdown table and the machine
and date; writes everything to --out (JSON).
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from contextlib import contextmanager

import torch
import transformers
from transformers import Qwen2ForCausalLM

import common  # (puts the repository on the path)
import builds
import config
import data
import models
import rollout as rollout_mod
import run
import sampler
import task
import vapo
from common import PeakMemory, clocked, n_params

SETTINGS = ("demo", "13m")
MODEL_13M = dict(hidden_size=256, num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=1024)  # 12.7M parameters with the built-in 257-token vocabulary
TINY = dict(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=16, mini_batch_size=2, micro_batch_size=1)
TARGETS = {"update/floor": 1.15, "sampling/floor": 1.5}
PHASES = {"rollout": "time/rollout", "reward": "time/reward", "scoring": "time/score",
          "advantages": "time/advantages", "update": "time/update"}  # reported name: vapo.rl_step's record key


# --- setting up -----------------------------------------------------------------------------------------------
def setting_config(args) -> vapo.Config:
    """The demo preset, with --tiny's shapes and the command line's overrides."""
    over = dict(device=args.device, bf16=args.bf16, seed=args.seed)
    if args.tiny:
        over |= TINY
    if args.max_new_tokens is not None:
        over["max_new_tokens"] = args.max_new_tokens
    return vapo.Config(**{**config.PRESETS["demo"], **over}).validate()


def build_models(setting: str, cfg: vapo.Config, device: torch.device):
    """(policy, critic, tokenizer, description) of a setting."""
    if setting == "demo":
        # the shipped base model, as the demo loads it
        policy, critic, tokenizer = models.load_models(cfg, device, builds.ensure_base_model(log=lambda *a: None))
        return policy, critic, tokenizer, "the shipped base model (builds.ensure_base_model())"
    tokenizer = task.build_tokenizer()
    torch.manual_seed(cfg.seed)
    policy = Qwen2ForCausalLM(task.tiny_config(tokenizer, **MODEL_13M)).to(device)
    if cfg.gradient_checkpointing:
        models.set_gradient_checkpointing(policy, True)
    critic = models.value_model_from_policy(policy, gradient_checkpointing=cfg.gradient_checkpointing)
    return policy, critic, tokenizer, f"random init, Qwen2 {MODEL_13M}"


def _to_cpu(obj):
    """A copy of a (nested) state dict with every tensor on the CPU (so snapshots take no GPU memory)."""
    if torch.is_tensor(obj):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


class Snapshot:
    """The weights of both models and the optimizers' and schedulers' states, kept on the CPU and put back
    before each repetition."""

    def __init__(self, models: dict, optimizers: dict):
        self.models, self.optimizers = models, optimizers
        self.weights = {k: _to_cpu(m.state_dict()) for k, m in models.items()}
        self.states = None

    def take_optimizer_states(self):
        self.states = {k: (_to_cpu(o.state_dict()), dict(s.state_dict())) for k, (o, s) in self.optimizers.items()}

    def restore(self):
        for k, m in self.models.items():
            m.load_state_dict(self.weights[k])
        if self.states is not None:
            for k, (opt_state, sched_state) in self.states.items():
                self.optimizers[k][0].load_state_dict(_to_cpu(opt_state))  # a fresh copy: moved to the params
                self.optimizers[k][1].load_state_dict(dict(sched_state))
        for o, _ in self.optimizers.values():
            o.zero_grad(set_to_none=True)


# --- the step and its floors ----------------------------------------------------------------------------------
@contextmanager
def watching_update():
    """Inside the block, vapo.update (which rl_step calls by its module-level name) first notes what the floors
    replay, then runs unchanged: the rollout it trains on, and the CPU random state at its start (it draws its
    mini-batch order from that generator). Yields the dict it notes them in."""
    seen = {}
    update = vapo.update

    @functools.wraps(update)
    def noting(policy, critic, optimizers, rollout, *args, **kwargs):
        seen.update(rollout=rollout, rng=torch.get_rng_state())
        return update(policy, critic, optimizers, rollout, *args, **kwargs)

    vapo.update = noting
    try:
        yield seen
    finally:
        vapo.update = update


def one_step(ctx: dict, rep: int) -> dict:
    """vapo.rl_step itself, as step `rep` of a run (its prompts); -> {"times": its phase timings from its record
    (time/<phase>, the device synchronised around each phase) and "step" their sum, "rl_step": its own time/step,
    "memory", "shape", "rollout" and "rng" (what vapo.update trained on and drew its order from: watching_update)}.
    """
    memory = PeakMemory(ctx["device"])
    memory.start()
    with watching_update() as seen:
        record = vapo.rl_step(rep, ctx["policy"], ctx["critic"], ctx["optimizers"], ctx["engine"], ctx["rows"],
                              ctx["cfg"], ctx["verifier"])
    mem = memory.stop()
    if "rollout" not in seen:  # only dynamic sampling leaves a step without samples, and the demo preset has none
        raise SystemExit(f"bench_step: rl_step skipped its update (record: {record})")
    times = {name: record[key] for name, key in PHASES.items()}
    times["step"] = sum(times.values())
    rollout = seen["rollout"]
    shape = {"B": rollout.B, "prompt_width": rollout.P, "response_width": rollout.T,
             "mean_prompt_tokens": round(rollout.prompt_mask.sum(1).float().mean().item(), 1),
             "mean_response_tokens": round(rollout.lengths.float().mean().item(), 1),
             "truncated_frac": round(rollout.truncated.float().mean().item(), 3),
             "response_tokens": int(rollout.lengths.sum())}
    return {"times": times, "rl_step": record["time/step"], "memory": mem, "rollout": rollout, "shape": shape,
            "rng": seen["rng"]}


@torch.no_grad()
def sampling_floor(model, rollout, steps: int, cfg: vapo.Config, device: torch.device) -> float:
    """Seconds of a bare KV-cached decode loop: the rollout's B left-padded prompt rows, one prefill per prompt,
    then `steps` sampled tokens for every row (steps - 1 decode forwards), no EOS check, no compaction."""
    cache_kw = sampler._cache_kwarg(model)
    was_training = model.training
    model.eval()

    G = cfg.group_size  # rows i * G + g share prompt i: one prefill per prompt, its cache repeated, as HFEngine

    def loop():
        attention_mask = rollout.prompt_mask[::G].long()  # [N, P]
        positions = rollout_mod.position_ids(attention_mask)
        out = model(input_ids=rollout.prompt_ids[::G], attention_mask=attention_mask, position_ids=positions,
                    use_cache=True, logits_to_keep=1)
        cache = sampler._output_cache(out)
        cache.batch_repeat_interleave(G)
        logits = out.logits[:, -1].repeat_interleave(G, 0)  # [B, V]
        attention_mask, positions = attention_mask.repeat_interleave(G, 0), positions.repeat_interleave(G, 0)
        next_position = positions[:, -1:] + 1  # [B, 1]
        ones = attention_mask.new_ones(attention_mask.shape[0], 1)
        for t in range(steps):
            probs = (logits.float() / cfg.temperature).softmax(-1)  # [B, V]
            token = torch.multinomial(probs, 1)  # [B, 1]
            if t == steps - 1:
                break
            attention_mask = torch.cat([attention_mask, ones], 1)
            out = model(input_ids=token, attention_mask=attention_mask, position_ids=next_position, use_cache=True,
                        **{cache_kw: cache})
            cache = sampler._output_cache(out)
            logits = out.logits[:, -1]
            next_position = next_position + 1

    try:
        with vapo.autocast(cfg, device):
            _, seconds = clocked(loop, device)
    finally:
        model.train(was_training)
    return seconds


def update_floor(ctx: dict, rollout, rng: torch.Tensor) -> dict:
    """Seconds of the update's bare forward and backward passes (same rows, same micro-batches, no loss logic)
    and, apart, of its AdamW steps; see the module docstring."""
    cfg, device = ctx["cfg"], ctx["device"]
    models = {"critic": ctx["critic"], "policy": ctx["policy"]}  # vapo.update's order
    optimizers = ctx["optimizers"]
    for m in models.values():
        m.train()
    amp = vapo.autocast(cfg, device)
    torch.set_rng_state(rng)  # the update's own mini-batch order
    fwd_bwd = adamw = 0.0
    opt_steps = 0
    for _ in range(cfg.ppo_epochs):
        for mb in torch.randperm(rollout.B).to(rollout.lengths.device).split(cfg.mini_batch_size):
            if int(rollout.response_mask[mb].sum()) == 0:  # the update skips it too
                continue
            micros = [rollout.select(micro) for micro in rollout_mod.by_length(rollout, mb).split(cfg.micro_batch_size)]
            micros = [sub for sub in micros if int(sub.lengths.sum()) > 0]  # the update skips these

            def passes():
                for sub in micros:
                    input_ids, attention_mask, positions = rollout_mod._inputs(sub)
                    mask = sub.response_mask
                    with amp:
                        logits = models["policy"](input_ids=input_ids, attention_mask=attention_mask,
                                                  position_ids=positions, use_cache=False,
                                                  logits_to_keep=sub.T).logits  # [b, T, V]
                    chosen = logits.gather(-1, sub.response_ids[..., None]).squeeze(-1)  # [b, T]
                    (chosen.float() * mask).sum().backward()
                    with amp:
                        values = models["critic"](input_ids=input_ids, attention_mask=attention_mask,
                                                  position_ids=positions, use_cache=False).logits[:, -sub.T:, 0]
                    (values.float() * mask).sum().backward()

            def steps():
                for name in models:
                    optimizers[name][0].step()
                    optimizers[name][0].zero_grad(set_to_none=True)

            fwd_bwd += clocked(passes, device)[1]
            adamw += clocked(steps, device)[1]
            opt_steps += len(models)
    return {"fwd_bwd": fwd_bwd, "adamw": adamw, "optimizer_steps": opt_steps}


def repetition(ctx: dict, rep: int) -> dict:
    """One step, then its floors on the same rollout."""
    ctx["snapshot"].restore()
    torch.manual_seed(ctx["cfg"].seed * 1000 + rep)
    step = one_step(ctx, rep)
    if ctx["snapshot"].states is None:  # the first update created the AdamW states: keep them for the others
        ctx["snapshot"].take_optimizer_states()
    rollout = step.pop("rollout")
    sampling = sampling_floor(ctx["policy"], rollout, max(rollout.T, 1), ctx["cfg"], ctx["device"])
    with vapo.autocast(ctx["cfg"], ctx["device"]):  # what --old-logprobs recompute would add to the scoring phase
        _, policy_scoring = clocked(lambda: rollout_mod.score_rollout(
            ctx["policy"], None, rollout, ctx["cfg"].micro_batch_size, ctx["cfg"].temperature), ctx["device"])
    upd = update_floor(ctx, rollout, step.pop("rng"))
    times = step["times"]
    floors = {"sampling": sampling, "update_fwd_bwd": upd["fwd_bwd"], "update_adamw": upd["adamw"],
              "update": upd["fwd_bwd"] + upd["adamw"]}
    ratios = {"update/floor": times["update"] / floors["update"],
              "update/fwd_bwd": times["update"] / floors["update_fwd_bwd"],
              "sampling/floor": times["rollout"] / floors["sampling"]}
    return {**step, "floors": floors, "ratios": ratios, "optimizer_steps": upd["optimizer_steps"],
            "policy_scoring": policy_scoring}


def run_setting(setting: str, args) -> dict:
    cfg = setting_config(args)
    device = models.pick_device(cfg.device)
    policy, critic, tokenizer, source = build_models(setting, cfg, device)
    rows = data.load_data(cfg, tokenizer)[0]
    verifier = run.verifier_for(cfg)
    engine = vapo.make_engine(cfg, policy, tokenizer, vapo.parallel, critic)  # vapo.train's: the HF engine
    optimizers = {"policy": vapo.make_optimizer(policy, cfg.actor_lr, cfg),
                  "critic": vapo.make_optimizer(critic, cfg.critic_lr, cfg)}
    ctx = dict(cfg=cfg, device=device, rows=rows, verifier=verifier, engine=engine,
               policy=policy, critic=critic, optimizers=optimizers,
               snapshot=Snapshot({"policy": policy, "critic": critic}, optimizers))
    for w in range(args.warmup):  # untimed: lazy initialisations, kernel selection, the AdamW states
        repetition(ctx, args.repeats + w)
    reps = [repetition(ctx, r) for r in range(args.repeats)]

    def summary(values):
        return {"median_s": statistics.median(values), "runs_s": [round(v, 5) for v in values]}

    phases = {p: summary([r["times"][p] for r in reps]) for p in (*PHASES, "step")}
    floors = {f: summary([r["floors"][f] for r in reps]) for f in reps[0]["floors"]}
    ratios = {k: statistics.median(r["ratios"][k] for r in reps) for k in reps[0]["ratios"]}
    policy_scoring = summary([r["policy_scoring"] for r in reps])
    whole = summary([r["rl_step"] for r in reps])
    peaks = [r["memory"] for r in reps]
    worst = max(peaks, key=lambda m: m["peak_mb"])
    return {
        "setting": setting, "model": {"source": source, "policy_params": n_params(policy),
                                      "critic_params": n_params(critic),
                                      "hidden_size": policy.config.hidden_size,
                                      "layers": policy.config.num_hidden_layers,
                                      "vocab_size": policy.config.vocab_size},
        "config": {k: getattr(cfg, k) for k in ("prompts_per_step", "samples_per_prompt", "max_new_tokens",
                                                 "mini_batch_size", "micro_batch_size", "ppo_epochs", "bf16",
                                                 "gradient_checkpointing", "temperature", "top_p")},
        "device": str(device), "rollouts": [r["shape"] for r in reps],
        "optimizer_steps_per_update": reps[0]["optimizer_steps"],
        "old_logprobs": "sampler" if vapo.old_logprobs_from_sampler(cfg, engine) else "recompute",
        "policy_scoring_pass": policy_scoring, "rl_step": whole,
        "phases": phases, "floors": floors, "ratios": ratios,
        "targets": TARGETS, "meets_targets": {k: ratios[k] <= v for k, v in TARGETS.items()},
        "memory": {**worst, "per_repetition": peaks},
    }


# --- report ---------------------------------------------------------------------------------------------------
def table(results: dict) -> str:
    """The settings side by side: one column each."""
    def cell(r, row):
        ph, fl, ra, ok, mem = r["phases"], r["floors"], r["ratios"], r["meets_targets"], r["memory"]
        mark = {k: "ok" if v else "MISSED" for k, v in ok.items()}
        if row in PHASES:
            return f"{ph[row]['median_s']:.3f} ({100 * ph[row]['median_s'] / ph['step']['median_s']:.0f}%)"
        return {
            "params": f"{r['model']['policy_params'] / 1e6:.2f}M + {r['model']['critic_params'] / 1e6:.2f}M",
            "batch": f"{r['rollouts'][0]['B']} x {r['config']['max_new_tokens']}",
            "lengths": f"{statistics.mean(s['mean_response_tokens'] for s in r['rollouts']):.1f} / "
                       f"{statistics.mean(s['mean_prompt_tokens'] for s in r['rollouts']):.1f}",
            "step": f"{ph['step']['median_s']:.3f}",
            "sampling": f"{fl['sampling']['median_s']:.3f}",
            "update_fwd_bwd": f"{fl['update_fwd_bwd']['median_s']:.3f}",
            "update_adamw": f"{fl['update_adamw']['median_s']:.3f}",
            "update/floor": f"{ra['update/floor']:.2f} {mark['update/floor']}",
            "update/fwd_bwd": f"{ra['update/fwd_bwd']:.2f}",
            "sampling/floor": f"{ra['sampling/floor']:.2f} {mark['sampling/floor']}",
            "memory": f"{mem['peak_mb']:.0f} (+{mem['delta_mb']:.0f} over {mem['before_mb']:.0f})",
            "old_logprobs": r["old_logprobs"],
            "policy_scoring": f"{r['policy_scoring_pass']['median_s']:.3f}",
        }[row]

    rows = [("params", "parameters (policy + critic)"), ("batch", "batch (rows x max new tokens)"),
            ("lengths", "mean response / prompt tokens"), ("old_logprobs", "old log-probs from"),
            *((p, f"{p} (s)") for p in PHASES),
            ("policy_scoring", "policy scoring pass, not in the step when from the sampler (s)"),
            ("step", "step (s)"), ("sampling", "floor: bare decode loop (s)"),
            ("update_fwd_bwd", "floor: update fwd+bwd (s)"), ("update_adamw", "floor: AdamW steps (s)"),
            ("update/floor", f"update / (fwd+bwd + AdamW), target <= {TARGETS['update/floor']}"),
            ("update/fwd_bwd", "update / fwd+bwd"),
            ("sampling/floor", f"rollout / decode floor, target <= {TARGETS['sampling/floor']}"),
            ("memory", "peak memory of a step (MB)")]
    names = list(results)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {label} | " + " | ".join(cell(results[n], row) for n in names) + " |" for row, label in rows]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed repetitions first")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast (vapo's --bf16; the demo preset is "
                                                            "float32)")
    parser.add_argument("--tiny", action="store_true",
                        help="2 prompts x 2 samples, 16 new tokens, mini-batches of 2, micro-batches of 1 (a check "
                             "that it runs, not a measurement)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the preset's 128 (16 with --tiny)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join("runs", "bench_step.json"))
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")

    started = common.now()
    machine = common.machine("cuda" if torch.cuda.is_available() and args.device != "cpu" else None)
    t0 = time.perf_counter()
    results = {s: run_setting(s, args) for s in args.settings}
    print(f"machine: {machine}, {torch.get_num_threads()} torch threads\ndate: {started}; "
          f"{time.perf_counter() - t0:.0f} s in all\n"
          f"median of {args.repeats} repetitions after {args.warmup} untimed; ratios are medians of each "
          f"repetition's ratio{'; --tiny: a smoke run, not a measurement' if args.tiny else ''}\n")
    print(table(results))
    report = {"machine": machine, "date": started, "torch": torch.__version__,
              "transformers": transformers.__version__, "threads": torch.get_num_threads(), "args": vars(args),
              "settings": results}
    common.write_json(args.out, report)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
