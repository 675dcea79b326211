"""Peak memory of --preset gpu-0.5b's phases at Qwen2.5-0.5B's real shape (24 layers, vocabulary 151,936), measured
without a GPU: the policy and the critic are built under torch's FakeTensorMode (tensors with shapes and dtypes but
no storage, ops that compute no numbers) and torch.distributed._tools.mem_tracker.MemTracker counts every tensor a
phase holds, as it would on a device. bf16 autocast (CPU's op policy), gradient checkpointing, float32 weights.

    python bench/memory_measured.py [--layers 24] [--check]

Phases, each with the standing state a real run has then (both models' weights and AdamW states; gradients
during the update):
- update: one micro-batch of 4 x 2,300 tokens (a 252-token prompt and a 2,048-token response), the policy's
  forward and backward through rollout.response_logprobs (float32 logits of the response positions) with a
  token-mean loss, then the critic's through rollout.response_values with a squared error; the larger peak.
- sampling: the last decode step of 512 rows (64 prompts x 8) whose KV cache holds 2,299 tokens, in the sampler's
  own cache (sampler.PreallocatedLayer: every column allocated at the start, bf16 under --bf16).
- evaluation: the same for one pass of an evaluation (vapo.evaluate: 64 prompts x 8 = 512 rows, the bound), and
  for all 200 held-out prompts x 8 in one pass (1,600 rows: what evaluation held before it was bounded).
What this leaves out: the allocator's fragmentation and caching, kernels' workspaces (a fused attention's), CUDA
context and NCCL buffers, and CUDA's autocast op policy (CPU's is used; both run linear layers in bf16).
--check: the same update at 2 layers and 256 tokens with real tensors, whose tracked peak must equal the fake one.
"""
from __future__ import annotations

import argparse
import json

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from transformers import AutoModelForTokenClassification, Qwen2ForCausalLM

import common  # (puts the repository on the path)
from models import set_gradient_checkpointing
from rollout import Rollout, response_logprobs, response_values
from sampler import preallocated_cache

GB = 1e9
AMP = dict(device_type="cpu", dtype=torch.bfloat16)


def models(layers: int):
    """(policy, critic, their AdamW optimizers): float32, gradient checkpointing, train mode."""
    config = common.qwen_config(layers)
    policy = set_gradient_checkpointing(Qwen2ForCausalLM(config), True).train()
    value_config = common.qwen_config(layers, num_labels=1, classifier_dropout=0.0)
    critic = set_gradient_checkpointing(AutoModelForTokenClassification.from_config(value_config), True).train()
    return policy, critic, [torch.optim.AdamW(m.parameters(), lr=1e-6) for m in (policy, critic)]


def rollout(rows: int, prompt: int, response: int) -> Rollout:
    ones = lambda t: torch.ones((rows, t), dtype=torch.long)  # noqa: E731
    return Rollout(prompt_ids=ones(prompt), prompt_mask=ones(prompt), response_ids=ones(response),
                   response_mask=ones(response), lengths=torch.full((rows,), response),
                   truncated=torch.zeros(rows, dtype=torch.bool), sampler_logprobs=torch.zeros(rows, response),
                   prompt_index=torch.arange(rows), texts=[""] * rows)


def policy_loss(policy, batch: Rollout):
    with torch.autocast(**AMP):
        logprobs, _ = response_logprobs(policy, batch)  # [b, T]
    return -(logprobs * batch.response_mask).sum() / batch.response_mask.sum()


def critic_loss(critic, batch: Rollout):
    with torch.autocast(**AMP):
        values = response_values(critic, batch)  # [b, T]
    return ((values - 1.0) ** 2 * batch.response_mask).sum() / batch.response_mask.sum()


def peak(track, work) -> dict:
    """Peak GB of what MemTracker sees while work() runs, by kind (parameters, gradients, optimizer states,
    activations, temporaries), the modules and optimizers in track counted from their existing tensors."""
    tracker = MemTracker()
    tracker.track_external(*track)
    with tracker:
        work()
    snapshot = tracker.get_tracker_snapshot("peak")
    by_kind = next(iter(snapshot.values()))
    return {str(getattr(k, "value", k)).lower(): round(v / GB, 2) for k, v in by_kind.items() if v}


def measure_update(layers: int, rows: int, prompt: int, response: int) -> dict:
    policy, critic, optimizers = models(layers)
    warm = rollout(rows, 4, 4)  # one tiny step each: AdamW states exist, and gradients as during accumulation
    for model, loss in ((policy, policy_loss), (critic, critic_loss)):
        loss(model, warm).backward()
    for opt in optimizers:
        opt.step()
    for model, loss in ((policy, policy_loss), (critic, critic_loss)):
        loss(model, warm).backward()
    batch = rollout(rows, prompt, response)
    return {name: peak((policy, critic, *optimizers), lambda: loss(model, batch).backward())
            for name, model, loss in (("policy", policy, policy_loss), ("critic", critic, critic_loss))}


def measure_decode(layers: int, rows: int, cached: int) -> dict:
    policy, critic, optimizers = models(layers)
    for model, loss in ((policy, policy_loss), (critic, critic_loss)):  # AdamW states exist; no gradients then
        loss(model, rollout(1, 2, 2)).backward()
    for opt in optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    policy.eval()
    config = policy.config
    head_dim = config.hidden_size // config.num_attention_heads

    def step():
        with torch.no_grad(), torch.autocast(**AMP):
            # the sampler's cache (sampler.sample): preallocated for every column, in the autocast dtype
            cache = preallocated_cache(policy, cached + 1, AMP["dtype"])
            for layer in range(config.num_hidden_layers):
                kv = torch.zeros(rows, config.num_key_value_heads, cached, head_dim, dtype=AMP["dtype"])
                cache.update(kv, kv.clone(), layer)
            ids = torch.ones((rows, 1), dtype=torch.long)
            mask = torch.ones((rows, cached + 1), dtype=torch.long)
            policy(input_ids=ids, attention_mask=mask, position_ids=torch.full((rows, 1), cached),
                   past_key_values=cache, use_cache=True)
    return peak((policy, critic, *optimizers), step)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--check", action="store_true", help="also: fake against real tensors at 2 layers")
    parser.add_argument("--out", default="memory_measured.json")
    args = parser.parse_args(argv)
    report = {"machine": common.machine(), "date": common.now(),
              "layers": args.layers, "torch": torch.__version__}
    with FakeTensorMode():
        report["update_4x2300"] = measure_update(args.layers, 4, 252, 2048)
        report["sampling_512x2300"] = measure_decode(args.layers, 512, 2299)
        report["evaluation_pass_512x2300"] = report["sampling_512x2300"]  # the same shape: 64 prompts x 8
        report["evaluation_unbounded_1600x2300"] = measure_decode(args.layers, 1600, 2299)
    if args.check:
        with FakeTensorMode():
            fake = measure_update(2, 2, 64, 192)
        torch.manual_seed(0)
        real = measure_update(2, 2, 64, 192)
        report["check_2_layers_2x256"] = {"fake": fake, "real": real, "equal": fake == real}
    common.write_json(args.out, report)
    print(f"machine: {report['machine']}\ndate: {report['date']}\nQwen2.5-0.5B shape at {args.layers} layers, "
          f"bf16 autocast, gradient checkpointing, float32 weights; GB = 1e9 bytes, peak of tracked tensors")
    for name in ("update_4x2300", "sampling_512x2300", "evaluation_unbounded_1600x2300"):
        parts = report[name] if "update" not in name else report[name]
        print(f"{name}: {json.dumps(parts)}")
    if args.check:
        print(f"check (2 layers, 2 x 256 tokens): fake {report['check_2_layers_2x256']['fake']}, real "
              f"{report['check_2_layers_2x256']['real']}, equal: {report['check_2_layers_2x256']['equal']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
