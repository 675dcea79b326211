"""The vLLM engine's weight sync, checked in a process of its own (vLLM sets up global state): run by
scale/tests/test_scale.py as `python scale/tests/vllm_check.py OUT.json`.

The shipped base model as policy and as a vLLM engine; greedy tokens of both on 8 held-out prompts; one optimizer
step of the policy (vapo.update on its own rollout, a large learning rate so that greedy outputs move); the sync
(VLLMEngine.load_weights, streamed from SingleProcess.named_full_tensors); greedy tokens again, and the sampled
log-probs of vLLM against the policy's recomputed ones (rollout.response_logprobs) on 4 samples per prompt.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, ROOT)


def main(out_path: str):
    import torch

    import vapo
    from reward import arith_reward, reward_batch
    from rollout import response_logprobs, score_rollout
    from machinery import models
    from machinery.engines import HFEngine, eos_token_ids
    from machinery.task import make_dataset
    from scale.vllm_engine import VLLMEngine
    torch.manual_seed(0)
    cfg = vapo.Config(model="builtin", dataset="builtin", prompts_per_step=8, samples_per_prompt=4,
                      mini_batch_size=32, micro_batch_size=8, max_new_tokens=48, actor_lr=1e-2, warmup_steps=0,
                      group_advantage=True, value_pretraining=False, engine="vllm").validate()
    policy, _, tokenizer = models.load_models(cfg, torch.device("cpu"), models.shipped_model("builtin"))
    prompts = [r["prompt"] for r in make_dataset(8, seed=5, split="eval")]
    hf = HFEngine(policy, tokenizer, max_new_tokens=cfg.max_new_tokens)
    engine = VLLMEngine(models.shipped_model("builtin"), tokenizer, eos_ids=eos_token_ids(policy, tokenizer),
                        max_new_tokens=cfg.max_new_tokens, seed=0, max_model_len=256)

    def greedy_equal(a, b) -> bool:
        return a.response_ids.shape == b.response_ids.shape and bool(torch.equal(a.response_ids, b.response_ids))

    hf_before = hf.generate(prompts, n=1, temperature=0.0)
    vllm_before = engine.generate(prompts, n=1, temperature=0.0)

    # one update of the policy (GRPO's, no critic: the sync concerns the policy only)
    rows = make_dataset(cfg.prompts_per_step, seed=6, split="train")
    rollout = hf.generate([r["prompt"] for r in rows], n=cfg.group_size, seed=1)
    scores = torch.tensor(reward_batch(rollout.texts, [rows[int(i)]["answer"] for i in rollout.prompt_index],
                                      verifier=arith_reward, num_workers=0))
    advantages, _, _ = vapo.advantages_and_returns(rollout, scores.float(), None, cfg)
    old = score_rollout(policy, None, rollout, cfg.micro_batch_size)["old_logprobs"]
    optimizers = {"policy": vapo.make_optimizer(policy, cfg.actor_lr, cfg)}
    vapo.update(policy, None, optimizers, rollout, {"old_logprobs": old, "advantages": advantages,
                                                     "positive": scores > 0}, cfg)
    hf_after = hf.generate(prompts, n=1, temperature=0.0)
    vllm_stale = engine.generate(prompts, n=1, temperature=0.0)

    engine.load_weights(models.SingleProcess().named_full_tensors(policy))
    vllm_after = engine.generate(prompts, n=1, temperature=0.0)
    sampled = engine.generate(prompts, n=4, temperature=1.0, seed=3)
    with torch.no_grad():
        recomputed, _ = response_logprobs(policy.eval(), sampled)
    mask = sampled.response_mask.bool()
    gap = (recomputed - sampled.sampler_logprobs).abs()[mask]
    result = {
        "greedy_equal_before_update": greedy_equal(hf_before, vllm_before),
        "update_changed_hf_greedy": not greedy_equal(hf_before, hf_after),
        "stale_engine_differs": not greedy_equal(hf_after, vllm_stale),
        "greedy_equal_after_sync": greedy_equal(hf_after, vllm_after),
        "sampled_tokens": int(mask.sum()),
        "logprob_gap_max": gap.max().item(),
        "logprob_gap_mean": gap.mean().item(),
        "texts_equal_after_sync": hf_after.texts == vllm_after.texts,
    }
    engine.close()
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
