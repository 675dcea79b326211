"""models.py: name resolution, the value model built from the policy, save/load round trips in stock HF format."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from machinery.models import (load_policy, load_tokenizer, load_value_model, resolve_model_name, set_gradient_checkpointing,
                    value_model_from_policy)
from machinery.task import build_tokenizer

IDS = torch.tensor([[5, 17, 99, 3, 250, 42], [7, 7, 8, 200, 1, 0]])


def test_resolve_model_name(tmp_path):
    assert resolve_model_name("Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert resolve_model_name("qwen2.5-7b-instruct") == "Qwen/Qwen2.5-7B-Instruct"
    assert resolve_model_name("Qwen2.5-32B") == "Qwen/Qwen2.5-32B"
    assert resolve_model_name("Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
    assert resolve_model_name("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert resolve_model_name("someone/some-model") == "someone/some-model"
    folder = tmp_path / "Qwen2.5-0.5B"  # a local folder wins over the table, even with a known name
    folder.mkdir()
    assert resolve_model_name(str(folder)) == str(folder)
    assert resolve_model_name("gpt2") == "gpt2"  # unknown: left for from_pretrained to judge


def test_value_model_from_policy(tiny_policy):
    value = value_model_from_policy(tiny_policy)
    assert isinstance(value, AutoModelForTokenClassification._model_mapping[type(tiny_policy.config)])
    policy_backbone, value_backbone = tiny_policy.model.state_dict(), value.model.state_dict()
    assert policy_backbone.keys() == value_backbone.keys()
    for k in policy_backbone:
        assert torch.equal(policy_backbone[k], value_backbone[k]), k
        assert policy_backbone[k].data_ptr() != value_backbone[k].data_ptr(), k  # a copy, not shared storage
    assert (value(input_ids=IDS).logits == 0).all()  # zero head: V = 0 everywhere
    assert value(input_ids=IDS).logits.shape == (*IDS.shape, 1)
    assert value.dropout.p == 0.0 and value.training == tiny_policy.training
    bf16 = value_model_from_policy(tiny_policy.to(torch.bfloat16))
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())


def test_policy_round_trip(tiny_policy, tokenizer, tmp_path):
    tiny_policy.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    policy, tok = load_policy(str(tmp_path))
    assert tok.padding_side == "left" and tok.pad_token_id == tokenizer.pad_token_id
    assert tok("a b\nc")["input_ids"] == tokenizer("a b\nc")["input_ids"]
    with torch.no_grad():
        assert torch.equal(policy.eval()(input_ids=IDS).logits, tiny_policy(input_ids=IDS).logits)
    stock = AutoModelForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(stock.eval()(input_ids=IDS).logits, tiny_policy(input_ids=IDS).logits)
    bf16, _ = load_policy(str(tmp_path), dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16


def test_tokenizer_without_pad_gets_eos(tmp_path):
    tok = build_tokenizer()
    tok.pad_token = None
    tok.padding_side = "right"
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token == loaded.eos_token and loaded.padding_side == "left"


def test_value_model_round_trip_and_stock_loading(tiny_policy, tmp_path):
    value = value_model_from_policy(tiny_policy)
    with torch.no_grad():  # a trained-looking head, so the check covers it
        value.score.weight.normal_()
        value.score.bias.fill_(0.3)
        expected = value(input_ids=IDS).logits
    value.save_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(load_value_model(str(tmp_path)).eval()(input_ids=IDS).logits, expected)
        stock = AutoModelForTokenClassification.from_pretrained(tmp_path)
        assert stock.config.num_labels == 1
        assert torch.equal(stock.eval()(input_ids=IDS).logits, expected)


def test_value_model_from_a_policy_checkpoint(tiny_policy, tmp_path):
    tiny_policy.save_pretrained(tmp_path)
    value = load_value_model(str(tmp_path))
    assert (value.score.weight == 0).all() and (value.score.bias == 0).all()
    for k, v in tiny_policy.model.state_dict().items():
        assert torch.equal(value.model.state_dict()[k], v), k


def test_value_model_missing_backbone_weight_fails(tiny_policy, tmp_path):
    from safetensors.torch import load_file, save_file
    value_model_from_policy(tiny_policy).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.0.mlp.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="up_proj"):
        load_value_model(str(tmp_path))


def test_gradient_checkpointing_switch(tiny_policy):
    value = value_model_from_policy(tiny_policy, gradient_checkpointing=True).train()
    tiny_policy.train()

    def grads(model):
        model.zero_grad()
        out = model(input_ids=IDS).logits
        out.float().pow(2).mean().backward()
        return model.model.layers[0].mlp.up_proj.weight.grad.clone()

    with torch.no_grad():
        value.score.weight.normal_()
    with_ckpt = grads(value)
    set_gradient_checkpointing(value, False)
    assert torch.allclose(grads(value), with_ckpt, atol=1e-6)
    set_gradient_checkpointing(tiny_policy, True)
    assert any(getattr(m, "gradient_checkpointing", False) for m in tiny_policy.modules())
    assert grads(tiny_policy).abs().sum() > 0


def test_the_transformers_floor_is_one_the_code_runs_on():
    """requirements.txt's transformers floor is a release this code runs on: task.build_tokenizer's
    Qwen2Tokenizer(vocab=..., merges=...) is transformers 5's constructor, and the suite is run under 5.17 (the
    floor), 5.19 and 5.24; the installed release is never below the floor."""
    import os
    import re

    import transformers
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    floor = re.search(r"^transformers>=([\d.]+)", open(os.path.join(root, "requirements.txt")).read(), re.M)[1]
    version = lambda text: tuple(int(x) for x in re.findall(r"\d+", text)[:2])  # noqa: E731
    assert version(floor) >= (5, 0)
    assert version(transformers.__version__) >= version(floor)
    assert len(build_tokenizer()) == 257
