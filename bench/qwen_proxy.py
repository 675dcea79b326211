"""Qwen2.5-0.5B-shaped stand-ins, built without a download: its config, a tokenizer whose special tokens sit at
Qwen2.5's real ids, and a model folder of random weights at any depth. What tests and benchmarks use to prove the
one-GPU path at its real vocabulary and widths on a CPU (bench/gpu_check.py, tests/test_real_size.py).

    python bench/qwen_proxy.py OUT_DIR [--layers 24]      # a folder --model takes

The tokenizer: a byte-level BPE (the tokenizers library) whose vocabulary holds the 256 byte symbols, filler tokens
up to id 151642, then <|endoftext|> (151643), <|im_start|> (151644) and <|im_end|> (151645) as special tokens, in
a PreTrainedTokenizerFast with eos = pad = <|endoftext|> (the base model's) and Qwen's <|im_start|>role ...
<|im_end|> chat template; the model's generation config ends a response at <|im_end|> or <|endoftext|> (the
instruct model's). Text round-trips byte for byte (no merges: one token per byte); the fillers are never produced
by encoding, only by a model sampling them, and decode to odd text, as a real model's rare tokens may.
"""
from __future__ import annotations

import argparse
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

# Qwen2.5-0.5B's config.json (Qwen/Qwen2.5-0.5B): hidden_size 896, num_hidden_layers 24, num_attention_heads 14,
# num_key_value_heads 2 (head_dim 896 / 14 = 64), intermediate_size 4864, vocab_size 151936, tie_word_embeddings
# true, rope_theta 1e6, rms_norm_eps 1e-6, max_position_embeddings 32768, SiLU; 0.49B parameters (0.36B without
# the embedding). Figures from the model card and config as we know them, cross-checked against copies of that
# config in other public code; this file never downloads it. The count built here is 494,032,768.
QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6,
                  rms_norm_eps=1e-6, max_position_embeddings=32768, hidden_act="silu")
ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645  # Qwen2.5's special ids
# GSM8K-form rows (a worked solution ending in "#### answer"), for runs on a local file
GSM8K_ROWS = [("Tom has 3 apples and buys 4 more. How many apples does he have?", "He has 3 + 4 = 7.\n#### 7"),
              ("A box holds 12 pens. How many pens are in 2 boxes?", "2 * 12 = 24 pens.\n#### 24"),
              ("Sara reads 5 pages a day for 6 days. How many pages?", "5 * 6 = 30\n#### 30"),
              ("There are 1,200 seats and 450 are taken. How many are free?", "1200 - 450 = 750\n#### 750")]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer with Qwen2.5's special ids (see the module docstring)."""
    symbols = pre_tokenizers.ByteLevel.alphabet()  # the 256 byte symbols
    vocab = {s: i for i, s in enumerate(sorted(symbols))}
    vocab |= {f"<filler{i}>": i for i in range(len(vocab), ENDOFTEXT)}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = CHAT_TEMPLATE
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [ENDOFTEXT, IM_START, IM_END], ids
    return tok


def config(layers: int = 24, **overrides) -> Qwen2Config:
    """Qwen2.5-0.5B's config, at `layers` decoder layers."""
    return Qwen2Config(**{**QWEN25_05B, "num_hidden_layers": layers, **overrides}, bos_token_id=None,
                       eos_token_id=ENDOFTEXT, pad_token_id=ENDOFTEXT, use_cache=True)


def build_folder(folder: str, layers: int = 24, seed: int = 0, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> int:
    """A model folder --model takes: random weights of Qwen2.5-0.5B's shape at `layers` layers, the tokenizer,
    the instruct model's generation config. Returns the parameter count (494,032,768 at 24 layers)."""
    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it will run: seconds on a GPU at full depth
        model = Qwen2ForCausalLM(config(layers)).to(dtype)
    model.generation_config = GenerationConfig(eos_token_id=[IM_END, ENDOFTEXT], pad_token_id=ENDOFTEXT)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return params


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=24)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    print(f"{args.out}: {build_folder(args.out, args.layers):,} parameters, {args.layers} layers")


if __name__ == "__main__":
    main()
