"""Memory per GPU of a sharded VAPO run, by arithmetic (no GPU needed): what docs/scaling.md's table shows.

    python scale/memory.py                         # the paper's Qwen2.5-32B policy and critic, 64 and 128 GPUs
    python scale/memory.py --gpus 256 --tokens 20480 --micro 1
    python scale/memory.py --config path/to/config.json   # another model's shape

What a process of scale/train.py holds (FSDP2, float32 master weights, bf16 compute via --bf16):
  sharded, all the time: weights 4 B + gradients 4 B + AdamW moments 8 B per parameter, divided by the GPU count,
      for the policy and for the critic (the same backbone, a one-output head instead of the LM head);
  during the update: two decoder layers' bf16 weights gathered (the one running and the one prefetched), one
      layer's float32 gradient before its reduce-scatter, the embeddings and LM head gathered for the whole pass,
      checkpointed layer inputs (--gradient-checkpointing) and the logits of one micro-batch: the bf16 logits
      and four float32 logit-sized tensors at the backward's peak (the float32 copy, logsumexp's and the
      log-softmax's temporaries, their gradient: measured at Qwen2.5-0.5B's shape, docs/scaling.md), 18 B a
      logit;
  the vLLM engine: a full bf16 copy of the policy plus its KV cache (one engine per process), or 1 / K of both
  with tensor-parallel engines of K processes (--vllm-tp K); both must fit the share of the GPU it is given
  (--vllm-memory, vLLM's gpu_memory_utilization: vLLM refuses to start when its weights leave no room for KV
  blocks), so the tables give the share each engine needs;
  a weight sync: torch's cache emptied (engines.VLLMEngine.load_weights does it before each wake-up), the engine's
  weights woken, and one full tensor at a time gathered in the engine's bf16 (cast on each shard first);
  at setup, only the float32 shards (each process reads its own rows of the weights' files) and then the engine.
Estimates, not measurements: allocator slack, NCCL buffers and CUDA context (1-3 GB) come on top.
"""
from __future__ import annotations

import argparse
import json

# Qwen2.5-32B (config.json of Qwen/Qwen2.5-32B)
QWEN25_32B = dict(hidden_size=5120, num_hidden_layers=64, intermediate_size=27648, num_attention_heads=40,
                  num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False)
GB = 1e9
LOGIT_BYTES = 2 + 4 * 4  # per logit of a micro-batch at the update's peak: bf16 logits + 4 float32 logit-sized tensors


def counts(c: dict) -> dict:
    """Parameter counts of a Qwen2-style decoder: per layer, embeddings, LM head, policy and critic totals."""
    h, f, layers, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * f + 2 * h  # q, k, v (biased), o, MLP, 2 norms
    embed = v * h
    head = 0 if c.get("tie_word_embeddings") else v * h
    policy = layers * layer + embed + head + h
    critic = layers * layer + embed + h + h  # the value head: hidden -> 1
    return dict(layer=layer, embed=embed, head=head, policy=policy, critic=critic, kv_per_token=2 * layers * kv)


def per_gpu(c: dict, gpus: int, tokens: int, micro: int, kv_tokens: int) -> list[tuple[str, str, float]]:
    n = counts(c)
    h, layers, v = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    rows = [
        ("policy: weights + gradients + AdamW, sharded", f"{n['policy'] / 1e9:.2f}B x 16 B / {gpus}",
         n["policy"] * 16 / gpus),
        ("critic: the same", f"{n['critic'] / 1e9:.2f}B x 16 B / {gpus}", n["critic"] * 16 / gpus),
        ("update: 2 layers' bf16 weights gathered + 1 layer's fp32 gradient",
         f"{n['layer'] / 1e6:.0f}M x (2 x 2 + 4) B", n["layer"] * 8),
        ("update: embeddings + LM head gathered (bf16) and their fp32 gradients",
         f"{(n['embed'] + n['head']) / 1e9:.2f}B x (2 + 4) B", (n["embed"] + n["head"]) * 6),
        ("update: checkpointed layer inputs, one micro-batch", f"{layers} x {micro} x {tokens:,} x {h} x 2 B",
         layers * micro * tokens * h * 2),
        ("update: logits of one micro-batch (bf16 + 4 fp32 copies)", f"{micro} x {tokens:,} x {v:,} x (2 + 4 x 4) B",
         LOGIT_BYTES * micro * tokens * v),
        ("vLLM: the policy's bf16 weights (TP = 1)", f"{n['policy'] / 1e9:.2f}B x 2 B", n["policy"] * 2),
        ("vLLM: KV cache", f"{n['kv_per_token']:,} values x 2 B x {kv_tokens:,} tokens",
         n["kv_per_token"] * 2 * kv_tokens),
    ]
    return rows


def phases(c: dict, gpus: int, tokens: int, micro: int, kv_tokens: int, tp: int = 1) -> list[tuple[str, str, float]]:
    """What one GPU of a colocated run holds at each phase, setup included (scale/sharded.py's load_models: each
    process allocates only its shards and reads only its rows; AdamW's moments and the gradients appear at the
    first update). The largest transient of setup is one tensor's rows; of a sync, one whole float32 tensor."""
    n = counts(c)
    weights = (n["policy"] + n["critic"]) * 4 / gpus  # float32 shards of both models
    states = (n["policy"] + n["critic"]) * 16 / gpus  # + gradients + AdamW moments (the update)
    kept = (n["policy"] + n["critic"]) * 12 / gpus  # weights + AdamW: gradients are freed after each step
    # a tensor-parallel engine (--vllm-tp) splits its weights and its KV heads over tp GPUs, each holding 1 / tp
    engine_weights, kv = n["policy"] * 2 / tp, n["kv_per_token"] * 2 * kv_tokens / tp
    largest = max(n["embed"], n["head"], n["layer"] // 3) * 4  # the embeddings (or LM head) in float32
    gathered = largest // 2  # a sync gathers it cast to bf16 (scale.sharded.Sharded.named_full_tensors)
    update = sum(size for name, _, size in per_gpu(c, gpus, tokens, micro, kv_tokens) if name.startswith("update"))
    return [
        ("setup: models loaded", "float32 shards of both models, one tensor's rows in flight", weights + largest / gpus),
        ("setup: engine started", "the shards + the engine's bf16 weights + its KV cache", weights + engine_weights + kv),
        ("rollout", "shards and AdamW moments of both + the engine awake", kept + engine_weights + kv),
        ("update", "shards, gradients, AdamW + the update's transients (engine asleep, level 2)", states + update),
        ("sync", "shards and AdamW + the engine's weights woken + one full tensor gathered (bf16); torch's cache "
         "emptied first", kept + engine_weights + gathered),
    ]


def engine_share(c: dict, tp: int, kv_tokens: int, gpu_gb: float) -> float:
    """The --vllm-memory (vLLM's gpu_memory_utilization) an engine needs on a GPU of gpu_gb: its weights and KV
    cache, per GPU of a tensor-parallel group of tp, as a share of the GPU (over 1: it cannot fit)."""
    n = counts(c)
    return (n["policy"] * 2 + n["kv_per_token"] * 2 * kv_tokens) / tp / (gpu_gb * GB)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="a model's config.json (default: Qwen2.5-32B's shape)")
    p.add_argument("--gpus", type=int, nargs="+", default=[64, 128], help="GPUs the models are sharded over")
    p.add_argument("--tokens", type=int, default=9216, help="prompt + response tokens of one sequence "
                   "(default: 1,024 + the trainer's 8,192)")
    p.add_argument("--micro", type=int, default=1, help="sequences per micro-batch")
    p.add_argument("--kv-tokens", type=int, default=8 * 9216, help="tokens of KV cache per engine "
                   "(default: 8 sequences of 9,216 tokens at once)")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 4], help="tensor-parallel sizes of the engine "
                   "(--vllm-tp) for the per-phase tables")
    args = p.parse_args(argv)
    c = QWEN25_32B if args.config is None else json.load(open(args.config))
    n = counts(c)
    print(f"policy {n['policy'] / 1e9:.2f}B parameters, critic {n['critic'] / 1e9:.2f}B; one layer "
          f"{n['layer'] / 1e6:.1f}M; KV cache {n['kv_per_token'] * 2 / 1e3:.0f} KB per token (bf16)")
    for gpus in args.gpus:
        rows = per_gpu(c, gpus, args.tokens, args.micro, args.kv_tokens)
        print(f"\n| {gpus} GPUs: item | arithmetic | GB |\n|---|---|---|")
        for name, how, size in rows:
            print(f"| {name} | {how} | {size / GB:.1f} |")
        train = sum(s for name, _, s in rows if not name.startswith("vLLM"))
        engine = sum(s for name, _, s in rows if name.startswith("vLLM"))
        sharded = rows[0][2] + rows[1][2]
        print(f"| **training peak** (sharded states + update transients) | | **{train / GB:.1f}** |")
        print(f"| **colocated, sampling** (sharded states + awake engine) | | **{(sharded + engine) / GB:.1f}** |")
        print(f"| **colocated, updating** (engine asleep at level 2: nothing of it on the GPU) | | "
              f"**{train / GB:.1f}** |")
        print(f"| **separate rollout GPUs**: training GPUs / each engine GPU | | **{train / GB:.1f} / "
              f"{engine / GB:.1f}** |")
        for tp in args.tp:
            print(f"\n| {gpus} GPUs, colocated, --vllm-tp {tp}: phase | what the GPU holds | GB |\n|---|---|---|")
            for phase, what, size in phases(c, gpus, args.tokens, args.micro, args.kv_tokens, tp):
                print(f"| {phase} | {what} | {size / GB:.1f} |")
            print("\n" + "; ".join(
                f"{gpu_gb:g} GB GPUs: the engine needs --vllm-memory {share:.2f}"
                + (" (cannot fit)" if share >= 1 else " (the default 0.4 is enough)" if share <= 0.4 else
                   " (the default 0.4 is not enough: vLLM would refuse to start)")
                for gpu_gb in (80, 141) for share in [engine_share(c, tp, args.kv_tokens, gpu_gb)]))


if __name__ == "__main__":
    main()
