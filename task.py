"""The built-in task: a byte-level tokenizer, a ~1M-parameter Qwen2-style model, and (to come) the synthetic
multi-step arithmetic task and its base model. Everything here is built locally: nothing is downloaded."""
from __future__ import annotations

from tokenizers.pre_tokenizers import ByteLevel
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

EOS = "<|endoftext|>"


def build_tokenizer() -> Qwen2Tokenizer:
    """A byte-level tokenizer with no merges: one token per byte (256) plus EOS, which is also the pad token.

    Byte-level with an empty merge list round-trips any text exactly, also after save_pretrained /
    AutoTokenizer.from_pretrained (a character-level vocabulary would silently lose its spaces on reload, see
    ENVIRONMENT.md). Padding is on the left, as generation needs.
    """
    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}  # deterministic ids 0..255
    vocab[EOS] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token=EOS, pad_token=EOS)
    tok.padding_side = "left"
    return tok


def tiny_config(tokenizer, **overrides) -> Qwen2Config:
    """Qwen2 shape of about 1M parameters (hidden 128, 4 layers, 4 heads, 2 KV heads, tied embeddings)."""
    kw = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=512, vocab_size=len(tokenizer), tie_word_embeddings=True,
              max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
              pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    kw.update(overrides)
    return Qwen2Config(**kw)


def build_tiny_policy(tokenizer, seed: int = 0, **overrides) -> Qwen2ForCausalLM:
    """A randomly initialised tiny policy (float32), for tests and as the starting point of the warm start."""
    import torch
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_config(tokenizer, **overrides))
