"""Shared fixtures of the three suites (tests/, scale/tests/, bench/tests/): everything is built locally (no downloads),
small enough to run in seconds on a CPU."""
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:  # the modules live at the repository's top level
    sys.path.insert(0, ROOT)


def pytest_collection_modifyitems(items):
    """The slow tests first (in file order), then the rest: with two workers (pytest.ini's -n auto) the last
    minutes are then short tests that fill in, not one worker running a 4-minute test while the other waits."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order within each part


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """One torch thread for the whole suite: the tiny models here run faster on one thread, and much faster on a
    shared, loaded 2-core machine, where 2 threads made each forward pass 20-40x slower through contention.
    Subprocesses started by tests get OMP_NUM_THREADS=1 for the same reason."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer():
    from machinery.task import build_tokenizer
    return build_tokenizer()


@pytest.fixture()
def tiny_policy(tokenizer):
    """A fresh randomly initialised ~1M-parameter Qwen2 policy (float32, eval mode)."""
    from machinery.task import build_tiny_policy
    return build_tiny_policy(tokenizer, seed=0).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A folder holding a fresh random ~1M-parameter policy and the built-in tokenizer (what --model takes)."""
    from machinery.task import build_tiny_policy, build_tokenizer
    path = str(tmp_path_factory.mktemp("tiny"))
    tok = build_tokenizer()
    build_tiny_policy(tok, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path


# ---- a tiny GGUF model (tests/test_real_model.py, bench/tests/test_real_model_bench.py) ----------------------------
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(path, embedding_type: str = "F32"):
    """A tiny llama (2 layers, hidden 32, GQA 4/2 heads) with a byte-level BPE tokenizer (256 bytes, 2 merges, the
    ChatML tokens), written to path as GGUF the way llama.cpp's convert_hf_to_gguf writes a llama: its tensor names,
    q/k rows permuted for its rotary layout, no output.weight when the embedding is tied, the embedding stored as
    embedding_type ("F32" or "Q8_0"). Returns the LlamaForCausalLM whose weights were written (eval mode)."""
    import gguf
    import numpy as np
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens = sorted(ByteLevel.alphabet()) + ["An", "Ans", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    start, end = len(tokens) - 3, len(tokens) - 2  # <|im_start|>, <|im_end|>; <|endoftext|> is last
    heads, kv_heads = 4, 2
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokens), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                         tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=10000.0,
                                         max_position_embeddings=512, bos_token_id=start, eos_token_id=end)).eval()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2), w.add_context_length(512), w.add_embedding_length(32), w.add_feed_forward_length(64)
    w.add_head_count(heads), w.add_head_count_kv(kv_heads), w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0), w.add_rope_dimension_count(32 // heads), w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("default"), w.add_token_list(tokens)
    w.add_token_types([1] * start + [3, 3, 3]), w.add_token_merges(["A n", "An s"])  # 1 normal, 3 control
    w.add_bos_token_id(start), w.add_eos_token_id(end), w.add_pad_token_id(end), w.add_chat_template(CHATML)

    def permute(t, n_head):  # llama.cpp's: each head's rotary halves interleaved
        return t.reshape(n_head, 2, t.shape[0] // n_head // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    leaves = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for key, tensor in model.state_dict().items():
        t = tensor.numpy().astype(np.float32)
        if key == "lm_head.weight":
            continue  # tied: the embedding is the output projection
        if key == "model.embed_tokens.weight":
            kind = gguf.GGMLQuantizationType[embedding_type]
            w.add_tensor("token_embd.weight", gguf.quants.quantize(t, kind), raw_dtype=kind)
            continue
        if key == "model.norm.weight":
            w.add_tensor("output_norm.weight", t)
            continue
        _, _, layer, rest = key.split(".", 3)
        module, leaf = rest.rsplit(".", 1)
        if module in ("self_attn.q_proj", "self_attn.k_proj"):
            t = permute(t, heads if module == "self_attn.q_proj" else kv_heads)
        w.add_tensor(f"blk.{layer}.{leaves[module]}.{leaf}", t)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return model


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """(path of a tiny float32 GGUF llama, the model written into it)."""
    pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf"
    return str(path), write_tiny_gguf(path)
