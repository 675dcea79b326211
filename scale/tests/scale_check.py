"""Step 0 of the trainer on one fixed rollout, written out for scale/tests/test_scale.py to compare.

    python scale/tests/scale_check.py OUT_PREFIX MICRO [MICRO ...]                         # one process
    torchrun --nproc_per_node 2 scale/tests/scale_check.py OUT_PREFIX MICRO [MICRO ...]    # 2 ranks, FSDP2 (scale/)

For each micro-batch size: the shipped base model as policy and critic, loaded the run's way (whole in one
process, sharded as they load over 2 ranks: scale/sharded.py's load_models), their weights right after setup
recorded; one rollout of 4 prompts x 4 samples
sampled with a fixed seed before any sharding (the same tokens in every process), each process keeping its share
of the prompts (whole groups, as scale/train.py deals them); then vapo.py's own step-0 functions: score_rollout,
advantages_and_returns (whitened over the whole batch), update (one mini-batch of all 16 samples, one optimizer
step per model). Rank 0 writes OUT_PREFIX-<micro>.pt: old log-probs, values, advantages and returns of all 16
samples [16, T], the update's logged figures, both models' gradients as applied (after clipping) and weights
after the step (full tensors), and the local and full sizes of one sharded parameter.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import vapo  # noqa: E402
from machinery import models, world  # noqa: E402
from scale.sharded import local_rows, local_tensor  # noqa: E402


def gather_rows(x: torch.Tensor, T: int) -> torch.Tensor:
    """Every process's rows [b, t] padded to T columns, stacked in rank order -> [B, T]."""
    x = torch.nn.functional.pad(x, (0, T - x.shape[1])) if x.dim() == 2 else x
    if world.world_size() == 1:
        return x
    parts = [torch.zeros_like(x) for _ in range(world.world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def step_zero(micro: int, P) -> dict:
    """P: the models' layout (models.SingleProcess, or scale's Sharded over the ranks)."""
    from machinery.engines import HFEngine
    from reward import arith_reward, reward_batch
    from rollout import score_rollout
    from machinery.task import make_dataset
    cfg = vapo.Config(model="builtin", dataset="builtin", prompts_per_step=4, samples_per_prompt=4,
                      mini_batch_size=16, micro_batch_size=micro, max_new_tokens=32, actor_lr=1e-3, critic_lr=1e-3,
                      warmup_steps=0, alpha=0.5, whiten_advantages=True).validate()
    torch.manual_seed(0)
    base = models.shipped_model("builtin")
    # the run's own loading: whole models in one process; sharded as they load over 2 ranks (scale/sharded.py)
    P.read_values = 0  # what this process reads of the weights' files (scale/sharded.py counts it)
    policy, critic, tokenizer = P.load_models(cfg, torch.device("cpu"), base)
    setup = {k: {n: t.clone() for n, t in P.named_full_tensors(m)} for k, m in (("policy", policy), ("critic", critic))}
    head = torch.empty(critic.score.weight.shape).normal_(std=0.05, generator=torch.Generator().manual_seed(1))
    start, end = local_rows(critic.score.weight)
    with torch.no_grad():
        local_tensor(critic.score.weight).copy_(head[start:end])  # V != 0, the same head in every process
    rows = make_dataset(cfg.prompts_per_step, seed=3, split="eval")
    whole, _ = models.load_policy(base, dtype=torch.float32)  # samples the same rollout in every process
    full = HFEngine(whole, tokenizer, max_new_tokens=cfg.max_new_tokens).generate(
        [r["prompt"] for r in rows], n=cfg.group_size, seed=123)
    del whole
    share = cfg.batch_size // world.world_size()
    rollout = full.select(slice(world.rank() * share, (world.rank() + 1) * share))  # this process's prompts, whole groups
    golds = [rows[int(i)]["answer"] for i in rollout.prompt_index]
    scores = torch.tensor(reward_batch(rollout.texts, golds, verifier=arith_reward, num_workers=0))

    policy, critic = P.wrap(policy), P.wrap(critic)
    name = "model.layers.0.mlp.up_proj.weight"
    param = dict(policy.named_parameters())[name]
    local = param.to_local() if hasattr(param, "to_local") else param
    optimizers = {"policy": vapo.make_optimizer(policy, cfg.actor_lr, cfg),
                  "critic": vapo.make_optimizer(critic, cfg.critic_lr, cfg)}
    grads = {}
    for key, model in (("policy", policy), ("critic", critic)):
        optimizer = optimizers[key][0]
        step = optimizer.step

        def recording_step(*args, _step=step, _model=model, _key=key, **kwargs):
            grads[_key] = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
                           for n, p in _model.named_parameters() if p.grad is not None}
            return _step(*args, **kwargs)
        optimizer.step = recording_step

    scored = score_rollout(policy, critic, rollout, cfg.micro_batch_size, cfg.temperature)
    advantages, returns, _ = vapo.advantages_and_returns(rollout, scores.float(), scored["values"], cfg)
    batch = {"old_logprobs": scored["old_logprobs"], "advantages": advantages, "positive": scores > 0,
             "values": scored["values"], "returns": returns}
    stats = vapo.update(policy, critic, optimizers, rollout, batch, cfg)
    out = {k: gather_rows(v, full.T) for k, v in (("old_logprobs", scored["old_logprobs"]),
                                                   ("values", scored["values"]), ("advantages", advantages),
                                                   ("returns", returns), ("mask", rollout.response_mask))}
    out |= {"stats": stats, "grads": grads, "world_size": world.world_size(), "shard": (local.numel(), param.numel()),
            "setup_weights": setup, "read_values": P.read_values,
            "weights": {k: {n: t.clone() for n, t in P.named_full_tensors(m)}
                        for k, m in (("policy", policy), ("critic", critic))},
            "full_mask": full.response_mask}
    return out


def main(prefix: str, micros: list[int]):
    layout = models.SingleProcess()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from scale.sharded import Sharded
        dist.init_process_group("gloo")
        layout = Sharded(torch.device("cpu"))
    for micro in micros:
        result = step_zero(micro, layout)
        if world.is_main():
            torch.save(result, f"{prefix}-{micro}.pt")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], [int(m) for m in sys.argv[2:]])
