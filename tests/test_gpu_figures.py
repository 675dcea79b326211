"""What the trainer records for a GPU run's reader (bench/gpu_check.py reads it, replacing none of the trainer's
functions) and what it offers against bf16's rounding: each checkpoint's bytes and seconds in the run's log, and the
time its resume took; state.pt read memory-mapped; the LM head in float32 (--fp32-lm-head); the critic judge's host
syncs, one per batch and never one per token."""
import dataclasses
import logging
import os

import pytest
import torch
from torch.overrides import TorchFunctionMode

import vapo
from machinery import checkpoints, exact_values
from machinery.models import Float32Head, float32_head, load_models
from machinery.run import Observed
from rollout import rollout_from_tokens
from test_vapo import NO_VIEWS, tiny_config

# a two-step problem whose first step is a borrow, its right chain and the habit's (test_critic.py's)
PROBLEM = {"prompt": "Compute: 12 a-5 b+3\n", "answer": "10", "n_steps": 2}
RIGHT = "12 a-5=07\n07 b+3=10\nAnswer: 10"
HABIT = "12 a-5=17\n17 b+3=20\nAnswer: 20"


def test_each_checkpoint_is_logged_with_its_bytes_and_seconds_and_a_resume_with_its_time(tiny_model_dir, tmp_path,
                                                                                          caplog):
    """Run.save logs every checkpoint with its figures as the record's `checkpoint` attribute (what a reader of the
    log takes without parsing text): the bytes of the checkpoint folder as written, and the seconds of writing,
    reading back, and syncing and renaming; Run.restore logs the time a resume took to read one back."""
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", steps=1, eval_prompts=0, **NO_VIEWS)
    with caplog.at_level(logging.INFO, logger="vapo"):
        vapo.train(cfg)
    saves = [r.checkpoint for r in caplog.records if hasattr(r, "checkpoint")]
    assert [s["step"] for s in saves] == [0, 1]  # after value pretraining, and at the end
    folder = tmp_path / "run" / "checkpoint"
    assert saves[-1]["bytes"] == sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) > 0
    assert all(s["seconds"] >= s["write_s"] > 0 and s["verify_s"] >= 0 and s["swap_s"] >= 0 for s in saves)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vapo"):
        vapo.train(dataclasses.replace(cfg, steps=2), resume=True)
    (loaded,) = [r.checkpoint_loaded for r in caplog.records if hasattr(r, "checkpoint_loaded")]
    assert loaded["step"] == 1 and loaded["seconds"] > 0


def test_the_checkpoint_read_back_maps_state_pt_instead_of_reading_it(tmp_path):
    """read_checkpoint (the verification after every save, and a resume) loads state.pt memory-mapped: its tensors
    (AdamW's moments: about 8 GB at 0.5B) stay in the file until something reads them, no copy in memory."""
    from safetensors.torch import save_file
    for name in ("policy", "critic"):
        os.makedirs(tmp_path / name)
        save_file({"w": torch.ones(2)}, str(tmp_path / name / "model.safetensors"))
    moment = torch.randn(1000)
    torch.save({"step": 3, "optimizers": {"policy": moment}, "rng": {}}, tmp_path / "state.pt")
    state = checkpoints.read_checkpoint(str(tmp_path), with_critic=True)["state"]
    with open("/proc/self/maps") as fh:  # this process's mappings: the file is one of them while its tensors live
        assert str(tmp_path / "state.pt") in fh.read()
    assert torch.equal(state["optimizers"]["policy"], moment)


def test_the_float32_head_computes_the_logits_in_float32_under_bf16_autocast(tiny_model_dir, tmp_path):
    """--fp32-lm-head (an option under --bf16 only): the policy's LM head is a Float32Head, the same parameters
    under the same names (checkpoints and engines see the model as it was), and under bf16 autocast its logits are
    float32 and equal the float32 product of the hidden state and the head's weight, where the plain head gives
    bf16 logits off by bf16's rounding."""
    with pytest.raises(ValueError, match="--fp32-lm-head: acts under --bf16"):
        tiny_config(tiny_model_dir, tmp_path, fp32_lm_head=True)
    cfg = tiny_config(tiny_model_dir, tmp_path, fp32_lm_head=True, bf16=True, device="cpu")
    policy, _, _ = load_models(cfg, torch.device("cpu"), tiny_model_dir)
    plain, _, _ = load_models(dataclasses.replace(cfg, fp32_lm_head=False), torch.device("cpu"), tiny_model_dir)
    assert type(policy.lm_head) is Float32Head and type(plain.lm_head) is torch.nn.Linear
    assert policy.state_dict().keys() == plain.state_dict().keys()
    assert policy.lm_head.weight is policy.model.embed_tokens.weight  # still tied
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = policy(input_ids=ids, output_hidden_states=True)
        bf16_logits = plain(input_ids=ids).logits
    exact = out.hidden_states[-1].float() @ policy.lm_head.weight.float().T
    assert out.logits.dtype == torch.float32 and bf16_logits.dtype == torch.bfloat16
    torch.testing.assert_close(out.logits, exact, atol=1e-5, rtol=1e-5)
    assert (bf16_logits.float() - exact).abs().max() > 1e-4
    assert float32_head(policy) is policy  # again: harmless


class HostSyncs(TorchFunctionMode):
    """Counts the calls that copy a tensor's value to the host (int(t), float(t), bool(t), t.item(), t.tolist(),
    t as an index): each waits for the GPU when the tensor lives there."""
    NAMES = {"__int__", "__float__", "__bool__", "__index__", "item", "tolist"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in self.NAMES
        return func(*args, **(kwargs or {}))


def judged_batch(tokenizer, extra: int):
    """An RL step's scored batch of 8 responses to PROBLEM (right chains and the habit's), each with `extra`
    characters after it (longer responses, same rows), as the critic judge (exact_values.ExactReference) sees it."""
    texts = [RIGHT + " " * extra, HABIT + " " * extra] * 4
    ids = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    prompt = tokenizer(PROBLEM["prompt"])["input_ids"]
    rollout = rollout_from_tokens([prompt] * len(ids), ids, [[0.0] * len(i) for i in ids], 1,
                                  [tokenizer.eos_token_id], tokenizer.pad_token_id, tokenizer, "cpu")
    rewards, mask = torch.tensor([1.0, -1.0] * 4), rollout.response_mask  # [8], [8, T]
    return Observed("rl", 2, rollout, [PROBLEM] * 8, rewards, rewards, None, vapo.Config(),
                    values=torch.zeros(mask.shape), returns=rewards[:, None] * mask,
                    advantages=rewards[:, None] * mask, old_logprobs=-torch.ones(mask.shape) * mask)


def test_the_critic_judge_reads_the_batch_from_the_device_once_not_once_a_token(tokenizer):
    """ExactReference.observe (the critic judge and the credit meter, every RL step on the built-in task) copies each
    tensor it reads to the host whole: the count of host syncs is the same for responses of 31 and of 91 tokens, and
    a small share of the batch's tokens (a few a row remain: 55 for these 8 rows). Before, ExactValues.values read
    every token with int(): one GPU sync per token, 15-25 s a step at --preset gpu-0.5b's shapes."""
    counts = {}
    for extra in (0, 60):
        judge = exact_values.ExactReference(tokenizer)
        judge.observe(judged_batch(tokenizer, extra))  # counted: the next batch is judged against it
        batch = judged_batch(tokenizer, extra)
        with HostSyncs() as syncs:
            figures = judge.observe(batch)
        assert {"ev_floor", "ev_exact", "ev_critic_exact"} <= figures.keys()
        counts[batch.rollout.T] = syncs.count
    (short, long_), (few, same) = counts, counts.values()
    assert long_ >= short + 50 and few == same, counts
    assert few < int(batch.rollout.response_mask.sum()) / 10, counts  # a few per row at most, never per token
