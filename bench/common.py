"""What the scripts of bench/ share: the machine and date they print, running `python vapo.py` and reading
its run folder back, summaries over runs, time and peak memory on a device, the judges of a model on held-out long
chains, and the Qwen2.5-0.5B-shaped stand-in. Each script imports it first (`import common`): it puts the
repository's root on the path, so the project's modules import by name after it. No script imports another.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # the project's modules live at the repository's top level
    sys.path.insert(0, ROOT)
from gae import gae, group_advantage, length_adaptive_lambda, terminal_rewards  # noqa: E402
from losses import explained_variance, first_tenth_mask  # noqa: E402
from machinery import builds, exact_values, models, task  # noqa: E402
from machinery.engines import HFEngine  # noqa: E402
from machinery.models import load_policy  # noqa: E402
from machinery.plots import read_jsonl  # noqa: E402  (complete lines only: a line cut by a kill is left out)


# --- the machine, the date, files -----------------------------------------------------------------------------
def machine(device: torch.device | str | None = None) -> str:
    """The CPU (its model name), cores, torch and its CPU capability, Python and the OS; "; GPU: <name>" after it
    when device is a CUDA device."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    out = (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} (CPU capability "
           f"{torch.backends.cpu.get_cpu_capability()}), Python {platform.python_version()}, {platform.system()}")
    if device is not None and torch.device(device).type == "cuda":
        out += f"; GPU: {torch.cuda.get_device_name(device)}"
    return out


def now() -> str:
    """The date and time a benchmark started, as every script prints it: "2026-12-03 14:05"."""
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M")


def write_json(path: str, obj, indent: int | None = 1) -> str:
    """obj as JSON in path (its folder made if missing); returns path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=indent)
    return path


def read_json(path: str):
    with open(path) as fh:
        return json.load(fh)


def thread_env(threads: int = 1) -> dict:
    """This process's environment for a child process with `threads` torch (OpenMP/MKL) threads (0: torch's
    default, one per core), and no tokenizer threads."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if threads > 0:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


# --- runs of vapo.py, and what their folders hold -------------------------------------------------------------
RUNNING = "running.pid"  # in a run folder while a process runs it: the vapo.py process's id


def running(run_dir: str) -> int | None:
    """The id of a live process that runs run_dir now (its RUNNING file), else None."""
    try:
        with open(os.path.join(run_dir, RUNNING)) as fh:
            pid = int(fh.read())
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
        return pid
    except (OSError, ValueError):
        return None


def read_records(run_dir: str) -> list[dict]:
    """The records of run_dir's metrics.jsonl, in order (none if there is none yet)."""
    return read_jsonl(os.path.join(run_dir, "metrics.jsonl"))


def rl_steps(records: list[dict]) -> list[dict]:
    """The records of RL steps (not value pretraining's, not evaluations)."""
    return [r for r in records if "step" in r and "train_acc" in r]


def evaluations(records: list[dict]) -> list[dict]:
    """The records of held-out evaluations, step 0's (the base model) first."""
    return [r for r in records if "eval/acc_greedy" in r]


def sampled_measure(evaluation: dict) -> str:
    """The name of an evaluation's sampled accuracy, "avg@k" (its key eval/acc_avg@k)."""
    key = next(k for k in evaluation if k.startswith("eval/acc_avg@") and not k.endswith("_se"))
    return key.removeprefix("eval/acc_")


def finished(run_dir: str) -> bool:
    """A run is finished when its metrics hold the evaluation vapo.py makes at the end: at --steps, or at the
    step where --max-samples was reached."""
    try:
        cfg = read_json(os.path.join(run_dir, "config.json"))
    except (OSError, ValueError):
        return False
    records = read_records(run_dir)
    if any(r.get("step") == cfg.get("steps") and "eval/acc_greedy" in r for r in records):
        return True
    budget, generated = cfg.get("max_samples"), sum(r.get("samples_generated", 0) for r in records)
    return budget is not None and generated >= budget and bool(records) and "eval/acc_greedy" in records[-1]


def run_vapo(label: str, args: list[str], run_dir: str, program: tuple[str, ...] = ("vapo.py",)) -> float | None:
    """`python vapo.py ARGS` (program: what takes vapo.py's arguments) on one torch thread, its output in
    run_dir/stdout.log; an interrupted run is resumed; None (nothing run) if run_dir holds a finished run or another
    process runs it. Returns the wall seconds, also written to run_dir/wall_seconds."""
    if finished(run_dir):
        return None
    owner = running(run_dir)
    if owner is not None:  # another sweep's process is running it now: left to that one
        print(f"  {label}: being run by process {owner} (another invocation), skipped here", flush=True)
        return None
    cmd = [sys.executable, *program, *args]
    if os.path.exists(os.path.join(run_dir, "config.json")):
        cmd = [sys.executable, *program, "--resume", run_dir]  # an interrupted run continues (or restarts)
    t0 = time.perf_counter()
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "stdout.log"), "a") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=thread_env(1), stdout=log, stderr=subprocess.STDOUT)
        with open(os.path.join(run_dir, RUNNING), "w") as fh:
            fh.write(f"{proc.pid}\n")
        proc.wait()
    os.remove(os.path.join(run_dir, RUNNING))
    wall = time.perf_counter() - t0
    status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}, see {run_dir}/stdout.log)"
    print(f"  {label}: {status} in {wall:.0f} s", flush=True)
    with open(os.path.join(run_dir, "wall_seconds"), "w") as fh:
        fh.write(f"{wall:.1f}\n")
    return wall


def evaluate_again(run_dir: str) -> dict:
    """The final held-out evaluation of a finished run, made again from its checkpoint's policy with the
    run's options: its sampling seed is fixed, so on the same machine it draws the same responses."""
    import vapo
    cfg = vapo.Config(**read_json(os.path.join(run_dir, "config.json")))
    return evaluate_policy(cfg, os.path.join(run_dir, "checkpoint", "policy"))


def evaluate_policy(cfg, policy_dir: str) -> dict:
    """vapo.evaluate of the policy in policy_dir on cfg's held-out problems, as a run of cfg evaluates."""
    import vapo
    from machinery.data import load_data
    from machinery.engines import make_engine
    from machinery.models import SingleProcess
    from machinery.run import verifier_for
    policy, tokenizer = load_policy(policy_dir, dtype=torch.float32)
    _, held_out = load_data(cfg, tokenizer)
    engine = make_engine(cfg, policy, tokenizer, SingleProcess())
    return vapo.evaluate(engine, held_out, cfg, verifier_for(cfg))


def learn_times(steps: list[dict]) -> dict:
    """Where a run's training time went, from its RL steps' records (vapo.py's, or bench/vs_trl.py's),
    evaluations left out: steps, generated samples and tokens, seconds in all, per sample and per 1,000 tokens, the
    median step, and each phase's seconds in all (where the records have them)."""
    seconds = sum(r["time/step"] for r in steps)
    samples = sum(r["samples_generated"] for r in steps)
    tokens = sum(r.get("response_len", 0.0) * r["samples_generated"] for r in steps)
    phases = {p: sum(r.get(f"time/{p}", 0.0) for r in steps)
              for p in ("rollout", "reward", "score", "advantages", "update") if any(f"time/{p}" in r for r in steps)}
    return {"steps": len(steps), "samples": samples, "tokens": round(tokens), "seconds": seconds,
            "s_per_sample": seconds / samples, "s_per_1k_tokens": 1e3 * seconds / tokens if tokens else None,
            "median_s_per_step": statistics.median(r["time/step"] for r in steps), "phases_s": phases}


def mean_of(rows: list[dict], key: str, default=None):
    """The mean of rows' numbers under key (NaN and missing ones left out); default when there are none."""
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and r[key] == r[key]]
    return statistics.mean(vals) if vals else default


def mean_sd(values) -> tuple[float, float] | None:
    """(mean, standard deviation) of the values that are not None, over seeds (SD 0 for one); None if none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return statistics.mean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def summarise_run(run_dir: str) -> dict | None:
    """The figures of one finished run folder (None if it did not finish): held-out avg@k, greedy and
    pass@k at the first and last evaluation, the final greedy length over the base's, the critic's explained variance
    (value pretraining's and the RL steps', beside the floor's and V*'s), means over the RL steps, the seconds."""
    if not finished(run_dir):
        return None
    records = read_records(run_dir)
    evals, rl = evaluations(records), rl_steps(records)
    pre = [r for r in records if "value_pretrain_step" in r]
    first, last = evals[0], evals[-1]
    k = sampled_measure(first)
    sampled = f"eval/acc_{k}"
    wall = None
    if os.path.exists(os.path.join(run_dir, "wall_seconds")):
        with open(os.path.join(run_dir, "wall_seconds")) as fh:
            wall = float(fh.read())
    nan = float("nan")
    return {
        "k": k,
        "avg_base": first[sampled], "avg_final": last[sampled], "avg_gain": last[sampled] - first[sampled],
        "pass_base": first.get(f"eval/pass@{k[4:]}", nan), "pass_final": last.get(f"eval/pass@{k[4:]}", nan),
        "greedy_base": first["eval/acc_greedy"], "greedy_final": last["eval/acc_greedy"],
        "greedy_gain": last["eval/acc_greedy"] - first["eval/acc_greedy"],
        "len_ratio": last["eval/response_len_greedy"] / first["eval/response_len_greedy"],
        "pretrain_ev_last3": statistics.mean(r["explained_variance"] for r in pre[-3:]) if pre else nan,
        "pretrain_steps": len(pre),
        "pretrain_reached": next((r["value_pretrain_reached"] for r in pre if "value_pretrain_reached" in r), None),
        "ev": mean_of(rl, "explained_variance", nan), "ev_floor": mean_of(rl, "ev_floor", nan),
        "ev_exact": mean_of(rl, "ev_exact", nan), "ev_critic_exact": mean_of(rl, "ev_critic_exact", nan),
        "clipped_critic": mean_of(rl, "grad_clipped/critic", nan), "nll_weight": mean_of(rl, "nll_weight", nan),
        "clip_frac": mean_of(rl, "clip_frac", nan),
        "approx_kl": mean_of(rl, "approx_kl", nan), "entropy": mean_of(rl, "entropy", nan),
        "run_seconds": last["time/elapsed"], "wall_seconds": wall,
    }


# --- the demo's base models -----------------------------------------------------------------------------------
WEAK_STEPS = 700  # warm-start steps of the `weak` base model (the full recipe has builds.SFT_STEPS)


def resolve_base(name: str) -> str:
    """A base model folder: `shipped` (base-model/), `seedN` (the recipe with warm-start seed N, in the cache),
    `weak` (the recipe stopped after WEAK_STEPS warm-start steps, in the cache) or a folder."""
    if name == "shipped":
        return builds.SHIPPED_BASE
    if name.startswith("seed") and name[4:].isdigit():
        return builds.cache_path(f"{builds.BASE_NAME}-{name}")
    if name == "weak":
        return builds.cache_path(f"{builds.BASE_NAME}-sft{WEAK_STEPS}")
    if os.path.isdir(name):
        return os.path.abspath(name)
    raise SystemExit(f"--bases: {name!r} is neither 'shipped', 'seedN', 'weak' nor a folder")


def build_missing(bases: dict[str, str], jobs: int) -> None:
    """Build the `seedN` and `weak` base models that are not in the cache yet, `jobs` builds at a time, one
    thread each."""
    todo = {n: p for n, p in bases.items() if (n.startswith("seed") or n == "weak") and not os.path.exists(
        os.path.join(p, builds.BUILD_INFO))}
    if not todo:
        return
    print(f"building {len(todo)} base model(s) ({', '.join(todo)}), about 8 minutes each on one thread ...",
          flush=True)

    def build(item):
        name, path = item
        recipe = ["--steps", str(WEAK_STEPS)] if name == "weak" else ["--seed", name[4:]]
        cmd = [sys.executable, "-m", "machinery.builds", "build", *recipe, "--out", path]
        proc = subprocess.run(cmd, cwd=ROOT, env=thread_env(1), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"building {name} failed:\n{proc.stderr[-3000:]}")
        print(f"built {name}: {proc.stdout.strip().splitlines()[0]}", flush=True)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(build, todo.items()))


# Per preset, bench/ablation.py's sweep (bench/vs_trl.py runs TRL on the same budget and schedule): the RL steps
# of a row without dynamic sampling (its budget is steps x the preset's batch), how many evaluations along the
# budget, the held-out sampling, and the algorithms' extra seeds.
SWEEPS = {"demo": dict(steps=24, evaluations=4, eval_prompts=100, eval_samples=2, algorithm_seeds=[]),
          "long": dict(steps=40, evaluations=2, eval_prompts=None, eval_samples=None, algorithm_seeds=[3, 4])}


# --- time and memory on a device ------------------------------------------------------------------------------
def sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def status_kb(field: str) -> int | None:
    """A field of /proc/self/status in kB (VmRSS, VmHWM), None where there is none."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def device_peaks(device: torch.device) -> tuple[float, float | None]:
    """(peak allocated, peak reserved) in bytes since the last reset_device_peaks: torch's allocator on a CUDA
    device; on a CPU the peak resident set (VmHWM, else ru_maxrss: the whole process's) and no reserved figure."""
    if device.type == "cuda":
        sync(device)
        return float(torch.cuda.max_memory_allocated(device)), float(torch.cuda.max_memory_reserved(device))
    hwm = status_kb("VmHWM")
    return (hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1e3, None


def reset_device_peaks(device: torch.device) -> bool:
    """Start the device's peak counters again from what is in use now; False where they cannot be reset (a CPU
    without /proc/self/clear_refs: the peak is then the process's since it started)."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets the peak resident set size (VmHWM) to the current one
        return True
    except OSError:
        return False


def in_use(device: torch.device) -> float:
    """Bytes in use now: torch's allocated tensors on a CUDA device, the resident set on a CPU."""
    if device.type == "cuda":
        return float(torch.cuda.memory_allocated(device))
    rss = status_kb("VmRSS")
    return (rss if rss is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1e3


class PeakMemory:
    """Peak memory over a stretch of code, in MB (1e6 bytes): start() ... stop() -> {"kind", "before_mb",
    "peak_mb", "peak_reserved_mb", "delta_mb"}. CUDA: allocated tensor memory, and what the caching allocator
    reserved (what runs out first); CPU: resident set size, no reserved figure (None).

    Counters nest: the device has one set of peak counters, which start() resets, so before any reset every
    counter still running folds the device's peak so far into its own (OPEN, the running ones). An outer counter
    around an inner one therefore keeps the larger of its own peaks, not the peak since the inner one started."""

    OPEN: list["PeakMemory"] = []  # the counters started and not yet stopped, in this process

    def __init__(self, device: torch.device):
        self.device = device
        self.before = 0.0
        self.peak = self.peak_reserved = None
        self.kind = "cuda max_memory_allocated / max_memory_reserved" if device.type == "cuda" else "rss"

    @classmethod
    def fold(cls, device: torch.device):
        """Every running counter on device takes the device's peaks so far into its own."""
        running = [m for m in cls.OPEN if m.device == device]
        if not running:
            return
        allocated, reserved = device_peaks(device)
        for m in running:
            m.peak = max(m.peak or 0.0, allocated)
            if reserved is not None:
                m.peak_reserved = max(m.peak_reserved or 0.0, reserved)

    def start(self):
        PeakMemory.fold(self.device)  # before the reset below, so that no running counter loses its peak
        if not reset_device_peaks(self.device):
            self.kind = "rss (ru_maxrss, peak since the process started)"
        elif self.device.type != "cuda":
            self.kind = "rss (VmHWM reset per counter)"
        self.before = in_use(self.device) / 1e6
        self.peak = self.peak_reserved = None
        PeakMemory.OPEN.append(self)

    def stop(self) -> dict:
        PeakMemory.fold(self.device)
        if self in PeakMemory.OPEN:
            PeakMemory.OPEN.remove(self)
        peak = (self.peak or 0.0) / 1e6
        reserved = None if self.peak_reserved is None else round(self.peak_reserved / 1e6, 1)
        return {"kind": self.kind, "before_mb": round(self.before, 1), "peak_mb": round(peak, 1),
                "peak_reserved_mb": reserved, "delta_mb": round(peak - self.before, 1)}


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# --- judging models on held-out long chains -------------------------------------------------------------------
def folder_of(name: str) -> str:
    """A shipped model's folder for its name (models.BUILTIN_MODELS: "builtin-long", ...), else name itself."""
    return models.shipped_model(name) if name in models.BUILTIN_MODELS else name


POLICY_PROBLEMS = 200  # held-out long-chain problems of judge_policy (five per step count)


def judge_policy(folder: str, problems: int = POLICY_PROBLEMS) -> dict:
    """The policy in folder on the first `problems` held-out long chains, greedy and sampled at T 1
    (task.evaluate_accuracy): accuracy, the rates per step of the habit, of misreads and of other errors, the
    shortcut's share, and the shares whose first error is a misread or the habit."""
    model, tokenizer = load_policy(folder, dtype=torch.float32)
    rows = task.make_dataset(problems, 0, task.LONG.min_steps, task.LONG.max_steps, split="eval")
    torch.manual_seed(0)
    out = {}
    for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        acc = task.evaluate_accuracy(model, tokenizer, rows, temperature, max_new_tokens=task.LONG.max_response_tokens,
                                     batch_size=min(problems, 100))
        out[name] = {"accuracy": acc["accuracy"], "habit_rate": acc["steps"]["habit_rate"],
                     "lookup_rate": acc["steps"]["lookup_rate"], "other_error_rate": acc["steps"]["other_error_rate"],
                     "shortcut_rate": acc["shortcut_rate"], "first_misread": acc["first_errors"]["misread"],
                     "first_habit": acc["first_errors"]["habit"]}
    return out


FIFTHS = 5
ABSOLUTE = (0, 10, 50, 100, 200, 300, 450)  # bins of token positions


def held_out(prompts: int) -> list[dict]:
    """The first `prompts` held-out long-chain problems, the rows sample_set's responses answer (row
    rollout.prompt_index[b] is response b's problem)."""
    return task.make_dataset(prompts, 0, task.LONG.min_steps, task.LONG.max_steps, split="eval")


def sample_set(policy: str = "builtin-long", prompts: int = 100, samples: int = 2, seed: int = 0):
    """The responses every critic is judged on: `samples` per held-out long chain from `policy` at T 1.
    Returns (the policy model, rollout, rewards [B] of +1 / -1, decisive [B, T] bool: task.borrow_digits' tokens)."""
    torch.manual_seed(seed)
    model, tokenizer = load_policy(folder_of(policy), dtype=torch.float32)
    problems = held_out(prompts)
    engine = HFEngine(model, tokenizer, max_new_tokens=task.LONG.max_response_tokens, batch_size=64)
    with torch.no_grad():
        rollout = engine.generate([p["prompt"] for p in problems], n=samples, seed=seed)
    golds = [problems[int(i)]["answer"] for i in rollout.prompt_index]
    rewards = torch.tensor([1.0 if task.is_correct(t, g) else -1.0 for t, g in zip(rollout.texts, golds)])
    decisive = torch.zeros_like(rollout.response_mask, dtype=torch.bool)
    for b in range(rollout.B):
        ends = token_ends(tokenizer, rollout, b)
        for char in task.borrow_digits(rollout.texts[b]):  # the token whose text covers that character
            decisive[b, int((ends <= char).sum())] = True
    return model, rollout, rewards, decisive


def fitted_exact(policy: str, prompts: int, samples: int, seed: int) -> exact_values.ExactValues:
    """exact_values.ExactValues of `policy`, its rates counted on another sample set (seed + 1) than
    sample_set(policy, prompts, samples, seed), so that no response is judged by rates it helped measure."""
    problems = held_out(prompts)
    _, other, other_rewards, _ = sample_set(policy, prompts, samples, seed + 1)
    exact = exact_values.ExactValues()
    exact.observe(other.texts, [problems[int(i)] for i in other.prompt_index], other_rewards)
    return exact


def token_ends(tokenizer, rollout, b: int) -> torch.Tensor:
    """[n] the character offset in response b's text where each of its tokens' text ends."""
    return torch.tensor([len(tokenizer.decode([i])) for i in rollout.response_ids[b, :rollout.lengths[b]]]).cumsum(0)


def credit(advantages: torch.Tensor, mask: torch.Tensor, decisive: torch.Tensor) -> float:
    """(share of sum |A_t| on the decisive tokens) / (their share of the tokens): 1 = spread evenly."""
    weight = advantages.abs() * mask
    return float((weight[decisive].sum() / weight.sum().clamp(min=1e-12)) / (decisive.sum() / mask.sum()))


def group_credit(rewards: torch.Tensor, mask: torch.Tensor, decisive: torch.Tensor, group_size: int) -> float:
    """credit() of GRPO's group advantage on the same responses (consecutive groups of group_size)."""
    return credit(group_advantage(rewards, mask, group_size), mask, decisive)


def bias_table(values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, alpha: float,
               decisive: torch.Tensor | None = None, lam_fixed: float = 0.95, errors=None, kinds=None) -> dict:
    """A critic's bias by position. values, mask [B, T], rewards [B]; decisive [B, T] bool for the credit
    figures; lam_fixed: the fixed lambda beside the length-adaptive one. errors: (before, at) [B, T] bool, each wrong
    response's tokens before its first error and that error's token (task.first_error); kinds: each response's
    task.first_error_kind, for the credit at misreads and at the habit apart."""
    B, T = mask.shape
    lengths = mask.sum(-1)  # [B]
    returns = rewards[:, None].expand(B, T) * mask  # [B, T], gamma = 1: every token's return is the reward
    pos = torch.arange(T)[None, :].expand(B, T)
    rel = pos / lengths.clamp(min=1)[:, None]  # [B, T] relative position in [0, 1)
    real = mask.bool()
    out = {"by_fifth": [], "by_position": []}
    for k in range(FIFTHS):
        pick = real & (rel >= k / FIFTHS) & (rel < (k + 1) / FIFTHS)
        out["by_fifth"].append(_cell(f"{20 * k}-{20 * (k + 1)}%", values, returns, pick)
                               | {"explained_variance": explained_variance(values, returns, pick)})
    for lo, hi in zip(ABSOLUTE, ABSOLUTE[1:]):
        pick = real & (pos >= lo) & (pos < hi)
        if pick.any():
            out["by_position"].append(_cell(f"{lo}-{hi - 1}", values, returns, pick))
    out["explained_variance"] = explained_variance(values, returns, mask)
    terminal = terminal_rewards(rewards, mask)
    first = first_tenth_mask(mask).bool()
    for name, lam in ((f"{lam_fixed}", torch.full((B,), lam_fixed)), ("adaptive", length_adaptive_lambda(lengths,
                                                                                                         alpha)),
                      ("0 (TD error)", torch.zeros(B))):
        adv = gae(terminal, values, mask, lam=lam)[0]  # [B, T]
        if not name.startswith("0 "):
            out[f"advantage_first_tenth_lambda_{name}"] = float(adv[first].mean())
            out[f"advantage_rest_lambda_{name}"] = float(adv[real & ~first].mean())
        if decisive is not None and decisive.any():
            out[f"credit_lambda_{name}"] = credit(adv, mask, decisive)
        if errors is not None and errors[1].any():
            out[f"advantage_before_error_lambda_{name}"] = float(adv[errors[0]].mean())
            out[f"credit_at_error_lambda_{name}"] = credit(adv, mask, errors[1])
            for kind in ("misread", "habit") if kinds is not None else ():
                of_kind = errors[1] & torch.tensor([k == kind for k in kinds])[:, None]  # [B, T]
                if of_kind.any():
                    out[f"credit_at_{kind}_lambda_{name}"] = credit(adv, mask, of_kind)
    return out


def _cell(label, values, returns, pick) -> dict:
    v, r = float(values[pick].mean()), float(returns[pick].mean())
    return {"where": label, "tokens": int(pick.sum()), "mean_value": v, "mean_return": r, "bias": v - r}


# --- a Qwen2.5-0.5B-shaped stand-in, built without a download -------------------------------------------------
# What proves the one-GPU path at its real vocabulary and widths on a CPU (bench/gpu_check.py,
# tests/test_real_size.py). The tokenizer: byte-level BPE, no merges (text round-trips byte for byte), the 256 byte
# symbols, fillers up to id 151642 (never produced by encoding), then <|endoftext|>, <|im_start|>, <|im_end|>
# (151643-151645); eos = pad = <|endoftext|>, Qwen's chat template; generation ends at <|im_end|> or <|endoftext|>.
# Qwen2.5-0.5B's config.json (Qwen/Qwen2.5-0.5B, from its model card, cross-checked against copies in public code;
# never downloaded here): 0.49B parameters, 494,032,768 as built here.
QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6,
                  rms_norm_eps=1e-6, max_position_embeddings=32768, hidden_act="silu")
ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645  # Qwen2.5's special ids
# GSM8K-form rows (a worked solution ending in "#### answer"), for runs on a local file
GSM8K_ROWS = [("Tom has 3 apples and buys 4 more. How many apples does he have?", "He has 3 + 4 = 7.\n#### 7"),
              ("A box holds 12 pens. How many pens are in 2 boxes?", "2 * 12 = 24 pens.\n#### 24"),
              ("Sara reads 5 pages a day for 6 days. How many pages?", "5 * 6 = 30\n#### 30"),
              ("There are 1,200 seats and 450 are taken. How many are free?", "1200 - 450 = 750\n#### 750")]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def qwen_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer with Qwen2.5's special ids (see above)."""
    symbols = pre_tokenizers.ByteLevel.alphabet()  # the 256 byte symbols
    vocab = {s: i for i, s in enumerate(sorted(symbols))}
    vocab |= {f"<filler{i}>": i for i in range(len(vocab), ENDOFTEXT)}
    bpe = Tokenizer(BPE(vocab=vocab, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = CHAT_TEMPLATE
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [ENDOFTEXT, IM_START, IM_END], ids
    return tok


def qwen_config(layers: int = 24, **overrides) -> Qwen2Config:
    """Qwen2.5-0.5B's config, at `layers` decoder layers."""
    return Qwen2Config(**{**QWEN25_05B, "num_hidden_layers": layers, **overrides}, bos_token_id=None,
                       eos_token_id=ENDOFTEXT, pad_token_id=ENDOFTEXT, use_cache=True)


def build_qwen_folder(folder: str, layers: int = 24, seed: int = 0, device: torch.device | str = "cpu",
                      dtype: torch.dtype = torch.float32) -> int:
    """A model folder --model takes: random weights of Qwen2.5-0.5B's shape at `layers` layers, the tokenizer,
    the instruct model's generation config. Returns the parameter count (494,032,768 at 24 layers)."""
    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it will run: seconds on a GPU at full depth
        model = Qwen2ForCausalLM(qwen_config(layers)).to(dtype)
    model.generation_config = GenerationConfig(eos_token_id=[IM_END, ENDOFTEXT], pad_token_id=ENDOFTEXT)
    params = n_params(model)
    model.save_pretrained(folder)
    qwen_tokenizer().save_pretrained(folder)
    return params
