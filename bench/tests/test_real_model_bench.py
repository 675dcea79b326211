"""The real-model benchmarks (bench/real_model_cpu.py, bench/vs_trl.py) on a tiny GGUF llama and reasoning-gym's
tasks: the base model's figures, TRL's trainer beside vapo.py (where TRL is installed), and the report that reads both
trainers' run folders."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
CHAIN_SUM = "reasoning-gym:chain_sum?min_terms=2&max_terms=3&max_digits=2"


def test_the_real_model_benchmark_measures_the_base_model(tiny_gguf, tmp_path, capsys):
    """bench/real_model_cpu.py base, on the tiny GGUF: the machine line, then vapo.evaluate's figures (strict, lenient
    and pass@k, greedy and sampled) with what it does not return (the share of responses that state an answer, their
    lengths, the seconds), on held-out problems or on the run's training ones."""
    pytest.importorskip("reasoning_gym")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import real_model_cpu
    from machinery.data import load_data
    from machinery.models import load_policy
    import vapo
    path, _ = tiny_gguf
    out = tmp_path / "base.json"
    real_model_cpu.main(["base", "--gguf", path, "--task", CHAIN_SUM, "--prompts", "3", "--samples", "2",
                         "--max-new-tokens", "4", "--out", str(out)])
    text = capsys.readouterr().out
    assert text.startswith("machine: ") and "| greedy strict / lenient % |" in text
    figures = json.load(open(out))
    assert (figures["prompts"], figures["samples_per_prompt"], figures["task"]) == (3, 2, CHAIN_SUM)
    assert figures["split"] == "held-out" and figures["template"] == "chat" and figures["machine"] and figures["date"]
    greedy, sampled = figures["greedy"], figures["avg@2"]
    assert greedy["responses"] == 3 and sampled["responses"] == 6 and sampled["tokens"] <= 6 * 4
    for part in (greedy, sampled):  # a random model states nothing; lenient is never below strict
        assert part["strict"] == 0.0 and part["strict"] <= part["lenient"] <= 1 and 0 <= part["stated_share"] <= 1
        assert 0 < part["mean_response_tokens"] <= 4 and part["seconds"] >= 0
    assert sampled["pass@2"] == figures["figures"]["eval/pass@2"] and sampled["lenient_pass@2"] >= sampled["lenient"]
    assert greedy["lenient"] == figures["figures"]["eval/lenient_greedy"]  # vapo.evaluate's own figure, not a copy
    held_out = [e["question"] for e in figures["examples"]]

    # --split train: the run's training problems (seed 0's), none of them held out; --line goes into every prompt
    real_model_cpu.main(["base", "--gguf", path, "--task", CHAIN_SUM, "--template", "chat", "--split", "train",
                         "--held-out", "3", "--prompts", "2", "--samples", "1", "--max-new-tokens", "2",
                         "--line", "Show your working.", "--out", str(out)])
    figures = json.load(open(out))
    assert figures["split"] == "train" and figures["prompts"] == 2 and figures["line"] == "Show your working."
    cfg = vapo.Config(model=path, dataset=CHAIN_SUM, template="chat", eval_prompts=3)
    train, _ = load_data(cfg, load_policy(path)[1])
    assert [e["question"] for e in figures["examples"]] == [r["question"] for r in train[:2]]
    assert not set(held_out) & {e["question"] for e in figures["examples"]}
    for argv in (["--samples", "0"], ["--temperature", "0"], ["--no-bf16"]):  # vapo.py's options are not base's
        with pytest.raises(SystemExit):
            real_model_cpu.main(["base", "--gguf", path, *argv])


def test_a_candidate_line_sits_between_the_question_and_the_instruction(tiny_gguf):
    """--line: the prompt of machinery/data.py's template with one line after the question, nothing else changed."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import real_model_cpu
    from machinery.data import BRIEF_INSTRUCTION, format_prompt
    from machinery.models import load_policy
    import vapo
    path, _ = tiny_gguf
    tokenizer = load_policy(path)[1]
    cfg = vapo.Config(template="chat-brief")
    row = {"question": "Calculate 2 + 3.", "answer": "5", "prompt": format_prompt("Calculate 2 + 3.", "chat-brief",
                                                                               tokenizer)}
    (changed,) = real_model_cpu.with_line([row], "Work it out first.", cfg, tokenizer)
    assert "Calculate 2 + 3.\nWork it out first." + BRIEF_INSTRUCTION in changed["prompt"]
    assert changed["prompt"].replace("\nWork it out first.", "") == row["prompt"]
    assert (changed["question"], changed["answer"]) == (row["question"], row["answer"])


def test_trl_learns_beside_vapo_py_on_a_gguf_and_a_reasoning_gym_task(tiny_gguf, tmp_path):
    """bench/vs_trl.py --model, at toy size: TRL's GRPOTrainer on the run `python vapo.py` makes of the same
    options (the GGUF, chain_sum's problems in the chat template, the generator's verifier), its records read by
    bench/ablation.py's and common.py's readers as one of our runs. TRL is a benchmark dependency that CI does not
    install: skipped where it is missing (python3 -m venv .venv-trl, bench/vs_trl.py's docstring)."""
    pytest.importorskip("trl")
    pytest.importorskip("reasoning_gym")
    path, _ = tiny_gguf
    out = tmp_path / "trl"
    proc = subprocess.run(
        [sys.executable, "bench/vs_trl.py", "--model", path, "--dataset", CHAIN_SUM, "--template", "chat",
         "--steps", "2", "--prompts-per-step", "2", "--samples-per-prompt", "2", "--mini-batch-size", "2",
         "--micro-batch-size", "1", "--max-new-tokens", "8", "--eval-prompts", "2", "--eval-samples", "2",
         "--eval-every", "1", "--no-bf16", "--no-gradient-checkpointing", "--device", "cpu", "--reward-workers", "1",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    evals = [r for r in records if "eval/acc_greedy" in r]
    steps = [r for r in records if "samples_generated" in r]
    assert [e["step"] for e in evals] == [0, 1, 2] and [e["samples_generated_total"] for e in evals] == [0, 4, 8]
    assert all({"eval/acc_avg@2_se", "eval/acc_greedy_se", "eval/pass@2"} <= e.keys() for e in evals)
    assert [r["samples_generated"] for r in steps] == [4, 4] and all(0 < r["response_len"] <= 8 for r in steps)
    for r in steps:  # the rollout's time, split into vapo.py's phases
        phases = [r[f"time/{p}"] for p in ("rollout", "reward", "score", "update")]
        assert all(p >= 0 for p in phases) and abs(sum(phases) - r["time/step"]) < 1e-6
    clipped = [h["completions/clipped_ratio"] for h in json.load(open(out / "trl_log_history.json"))
               if "completions/clipped_ratio" in h]
    assert clipped == [r["truncated_frac"] for r in steps]  # TRL stops at the tokens our engine stops at
    settings = json.load(open(out / "config.json"))
    assert settings["vapo_args"][:4] == ["--model", path, "--dataset", CHAIN_SUM] and settings["steps"] == 2
    assert settings["vapo_config"]["template"] == "chat" and settings["grpo_config"]["loss_type"] == "dapo"
    learn = json.load(open(out / "learn.json"))
    assert learn["times"]["samples"] == 8 and learn["times"]["s_per_sample"] > 0
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import ablation
    import common
    assert common.finished(str(out)) and common.summarise_run(str(out))["k"] == "avg@2"
    assert [e["samples"] for e in ablation.run_figures(str(out))["eval_curve"]] == [0, 4, 8]


def toy_run_options(path: str) -> list[str]:
    """vapo.py's options of a toy run of the GGUF at path (the timing mode's tests)."""
    return ["--model", path, "--dataset", CHAIN_SUM, "--template", "chat", "--prompts-per-step", "2",
            "--samples-per-prompt", "2", "--mini-batch-size", "2", "--micro-batch-size", "1", "--max-new-tokens", "8",
            "--no-bf16", "--no-gradient-checkpointing", "--device", "cpu", "--reward-workers", "1"]


def test_the_timing_benchmark_times_a_real_models_run(tiny_gguf, tmp_path):
    """bench/vs_trl.py --timing with --model: our contenders run `python vapo.py --model ... OPTIONS` with the typed
    shapes (TRL left out: CI does not install it), a warm-up and one timed rollout each, read back per rollout;
    --tiny (the demo's check) does not go with --model."""
    pytest.importorskip("reasoning_gym")
    path, _ = tiny_gguf
    out = tmp_path / "timing.json"
    proc = subprocess.run([sys.executable, "bench/vs_trl.py", "--timing", "--contenders", "grpo", "vapo", "--repeats",
                           "1", "--steps", "1", "--threads", "1", "--out", str(out), *toy_run_options(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.load(open(out))
    assert report["shape"]["prompts_per_step"] == 2 and report["shape"]["max_new_tokens"] == 8
    assert report["targets"] == {"grpo": 0.6, "vapo": 1.0}  # a model's run: the targets
    for name in ("grpo", "vapo"):
        run = report["runs"][name][0]
        assert f"--model {path}" in run["command"] and "--no-token-views" in run["command"]
        assert [r["warmup"] for r in run["rollouts"]] == [True, False] and run["rollouts"][1]["samples"] == 4
    proc = subprocess.run([sys.executable, "bench/vs_trl.py", "--timing", "--tiny", *toy_run_options(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--timing --tiny is the demo's check" in proc.stderr


def test_the_timing_benchmark_times_trl_beside_ours(tiny_gguf, tmp_path):
    """--timing with TRL (where it is installed): TRL's GRPOTrainer, our GRPO and VAPO on the same GGUF, prompts and
    shapes, interleaved; each rollout split into the same phases; this / TRL and the verdicts."""
    pytest.importorskip("trl")
    pytest.importorskip("reasoning_gym")
    path, _ = tiny_gguf
    out = tmp_path / "timing.json"
    proc = subprocess.run([sys.executable, "bench/vs_trl.py", "--timing", "--repeats", "1", "--steps", "1",
                           "--threads", "1", "--out", str(out), *toy_run_options(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.load(open(out))
    assert list(report["runs"]) == ["trl", "grpo", "vapo"] and "trl" in report["versions"]
    (trl_run,) = report["runs"]["trl"]
    assert [r["warmup"] for r in trl_run["rollouts"]] == [True, False] and trl_run["optimizer_steps_per_rollout"] == 2
    for r in trl_run["rollouts"]:
        assert r["samples"] == 4 and r["tokens"] <= 4 * 8 and abs(sum(r["phases"].values()) - r["seconds"]) < 1e-6
        assert r["phases"]["sampling"] > 0 and r["phases"]["scoring"] >= 0 and r["phases"]["update"] > 0
    for name in ("grpo", "vapo"):
        s = report["summary"][name]
        assert s["this_over_trl"]["s_per_sample"]["median_of_repetitions"] > 0
        assert s["target"]["per_sample_at_most"] == {"grpo": 0.6, "vapo": 1.0}[name]
    assert "this / TRL, per sample" in proc.stdout and ("met" in proc.stdout)


def fake_run(folder, seed: int, greedy: list[float], se: float, step_seconds: float, trl: bool = False):
    """A run folder as vapo.py (or bench/vs_trl.py, trl=True) writes it: 2 RL steps of 8 samples, evaluations
    at 0, 1 and 2 rollouts with the given greedy accuracies and standard error."""
    os.makedirs(folder)
    config = {"vapo_config": {"seed": seed}} if trl else {"seed": seed}
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    with open(os.path.join(folder, "metrics.jsonl"), "w") as fh:
        for step, acc in enumerate(greedy):
            if step:
                fh.write(json.dumps({"step": step, "samples_generated": 8, "train_acc": acc, "response_len": 5.0,
                                     "time/step": step_seconds, "time/rollout": step_seconds / 4,
                                     "time/update": step_seconds / 2}) + "\n")
            e = {"step": step, "eval/acc_greedy": acc, "eval/acc_greedy_se": se, "eval/acc_avg@1": acc / 2,
                 "eval/acc_avg@1_se": se}
            fh.write(json.dumps({**e, **({"samples_generated_total": 8 * step} if trl else {})}) + "\n")


def test_the_real_model_report_reads_both_trainers_folders(tmp_path, capsys):
    """report: per seed the greedy accuracy at each evaluation by generated samples, whether the last beats the
    base by more than twice its standard error, seconds per generated sample; per trainer the mean over seeds and
    its standard error; vapo.py's folders and TRL's read alike."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import real_model_cpu
    fake_run(tmp_path / "v0", 0, [0.02, 0.2, 0.5], 0.05, 4.0)
    fake_run(tmp_path / "v1", 1, [0.02, 0.1, 0.1], 0.05, 4.0)  # +8 points < 2 SE: not a win
    fake_run(tmp_path / "t0", 0, [0.02, 0.3, 0.4], 0.05, 8.0, trl=True)
    out = tmp_path / "report.json"
    real_model_cpu.main(["report", "--runs", f"vapo={tmp_path / 'v0'}", f"vapo={tmp_path / 'v1'}",
                         f"trl={tmp_path / 't0'}", "--figure", str(tmp_path / "f.png"), "--out", str(out)])
    text = capsys.readouterr().out
    assert "| greedy at 8 samples | greedy at 16 samples |" in text
    assert "| vapo | 0 | 2.0 | 20.0 ± 5.0 | 50.0 ± 5.0 | 1.0 -> 25.0 | yes | 0.50 |" in text
    assert "| vapo | 1 | 2.0 | 10.0 ± 5.0 | 10.0 ± 5.0 | 1.0 -> 5.0 | no |" in text
    assert "| **vapo** | mean of 2 | 2.0 | **15.0 ± 5.0** | **30.0 ± 20.0** | | 1 of 2 | 0.50 (median) |" in text
    assert "| trl | 0 | 2.0 | 30.0 ± 5.0 | 40.0 ± 5.0 | 1.0 -> 20.0 | yes | 1.00 |" in text
    figures = json.load(open(out))
    assert figures["vapo"]["beats_base"] == [True, False] and figures["trl"]["seeds"] == [0]
    assert (tmp_path / "f.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="NAME=FOLDER"):
        real_model_cpu.main(["report", "--runs", str(tmp_path / "v0")])
