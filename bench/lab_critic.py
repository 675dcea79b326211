"""The lab's experiment 9 (docs/lab.md, "The learned critic on the curve"): why VAPO's learned critic does not localise
errors on the long chains, by critic-only fits on frozen rollouts of the base, each scored on held-out responses by
the credit meter (experiment 8's) against V*; and the constructed critics those fits and the RL levers use, which the
trainer calls through its critic hook (`bench/lab.py record -- --critic-solution | --critic-shape SHAPE ...`).

    python bench/lab.py critic-fits [--seeds 0 1 2] [--report]     # the critic-only table

A row is an initialisation, a shape, an input and a target: the shipped reward model (the preset's critic) or a fresh
network; the policy's shape, 4x wider or 4x deeper; the response alone or the reference solution before it (the
critic is used only in training, where the gold answer is known: asymmetric actor-critic); Monte-Carlo returns (the
trainer's targets) or V* itself (distillation: can this network represent error detection at all). Every fit uses the
preset's critic settings (lab_analyses.fit_critic's: mini-batches of 16, lr 3e-4, one pass a batch).
"""
from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import torch
from transformers import AutoModelForTokenClassification

import common  # noqa: F401  (puts the repository on the path)
import config
import vapo
from common import fitted_exact, folder_of, held_out, sample_set
from gae import gae, length_adaptive_lambda, terminal_rewards
from lab import draw, publish_seeds
from losses import explained_variance, masked_whiten
from machinery import exact_values, task
from machinery.exact_values import credit_figures, first_error_tokens
from machinery.models import load_tokenizer, load_value_model, value_config, zero_head
from rollout import Rollout, response_values, score_rollout

POLICY, CRITIC = "builtin-long", "builtin-long-rm"
ALPHA = config.PRESETS["long"]["alpha"]


# --- the constructed critics: one that reads the reference solution, and other shapes --------------------------------
class SolutionCritic(torch.nn.Module):
    """A critic that reads the problem's reference solution before the response (asymmetric actor-critic: the critic
    is used only in training, where the gold answer is known; the policy never sees it): V(s_t) of the input prompt,
    "Solution:" and the correct chain (task.solve), then the response so far. Detection of an error becomes a
    comparison with the line above it. Its weights are the network's (state_dict, config, save_pretrained)."""

    def __init__(self, net, tokenizer):
        super().__init__()
        self.net, self.tokenizer = net, tokenizer

    def values_of(self, rollout: Rollout) -> torch.Tensor:
        """[B, T] the network's values of the rollout's responses, read after prompt + reference solution."""
        return response_values(self.net, with_solutions(rollout, self.tokenizer))

    def state_dict(self, *args, **kwargs):
        return self.net.state_dict(*args, **kwargs)

    def load_state_dict(self, state, strict: bool = True, assign: bool = False):
        return self.net.load_state_dict(state, strict=strict, assign=assign)

    def save_pretrained(self, folder: str):
        self.net.save_pretrained(folder)

    @property
    def config(self):
        return self.net.config


def with_solutions(rollout: Rollout, tokenizer) -> Rollout:
    """rollout with each prompt followed by "Solution:\\n<the correct chain>\\n\\n" (left-padded again)."""
    prompts = []
    for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask):
        text = tokenizer.decode(ids[mask.bool()])
        solution = task.solve(task.problem_of(text))
        prompts.append(ids[mask.bool()].tolist() + tokenizer.encode(f"Solution:\n{solution}\n\n",
                                                                    add_special_tokens=False))
    P = max(len(p) for p in prompts)
    ids = torch.full((rollout.B, P), rollout.pad_id, dtype=torch.long)
    mask = torch.zeros((rollout.B, P), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):], mask[b, P - len(p):] = torch.tensor(p), 1
    device = rollout.response_ids.device
    return Rollout(prompt_ids=ids.to(device), prompt_mask=mask.to(device), response_ids=rollout.response_ids,
                   response_mask=rollout.response_mask, lengths=rollout.lengths, truncated=rollout.truncated,
                   sampler_logprobs=rollout.sampler_logprobs, prompt_index=rollout.prompt_index, texts=rollout.texts,
                   pad_id=rollout.pad_id, entropy=rollout.entropy)


SHAPES = {"policy": {}, "wide4": {"hidden_size": 4, "intermediate_size": 4, "num_attention_heads": 4,
                                  "num_key_value_heads": 4},
          "deep4": {"num_hidden_layers": 4}}


def fresh_critic(shape: str = "policy", seed: int = 0):
    """A value network of the policy's config, scaled by SHAPES[shape] (4x the width, heads of the same size; or 4x
    the layers), randomly initialised (transformers' init, seeded), its head at zero."""
    base = load_value_model(folder_of(CRITIC), dtype=torch.float32).config
    cfg = value_config(base)
    for key, factor in SHAPES[shape].items():
        setattr(cfg, key, getattr(cfg, key) * factor)
    if getattr(cfg, "layer_types", None) is not None:  # one entry a layer (transformers 5): as many as the layers
        cfg.layer_types = [cfg.layer_types[0]] * cfg.num_hidden_layers
    torch.manual_seed(seed)
    return zero_head(AutoModelForTokenClassification.from_config(cfg).float())


def critic_for(row: dict, seed: int, tokenizer):
    """The critic a row starts from: the shipped reward model or a fresh network of its shape; reading the solution
    or not."""
    net = load_value_model(folder_of(CRITIC), dtype=torch.float32) if row["init"] == "rm" else \
        fresh_critic(row["shape"], seed)
    return SolutionCritic(net, tokenizer) if row["solution"] else net


# --- the rows, fixed before the runs ---------------------------------------------------------------------------------
ROWS = {  # name: init, shape, input, target, the batch counts scored (the last one the fit's length)
    "MC, reward model": dict(init="rm", shape="policy", solution=False, target="mc", at=(20, 50, 100, 200)),
    "V*, reward model": dict(init="rm", shape="policy", solution=False, target="exact", at=(20, 100)),
    "MC, fresh": dict(init="fresh", shape="policy", solution=False, target="mc", at=(20, 50, 100)),
    "MC, fresh 4x wider": dict(init="fresh", shape="wide4", solution=False, target="mc", at=(20, 50)),
    "MC, fresh 4x deeper": dict(init="fresh", shape="deep4", solution=False, target="mc", at=(20, 50)),
    "MC, reads the solution": dict(init="rm", shape="policy", solution=True, target="mc", at=(20, 100)),
}
SIZES = {"batches": (200, "training batches of 8 prompts x 8 samples (the most a row uses)"),
         "prompts": (100, "held-out problems scored"), "group": (8, "samples a held-out problem")}


def fit(critic, parts: list[dict], targets: str, at: tuple, look) -> dict:
    """Critic-only updates with --preset long's critic settings on parts (frozen rollouts of the base): per batch the
    targets are the Monte-Carlo return ("mc") or V* ("exact", part["star"]), stepped by the trainer's own critic
    step (vapo.update, train_policy False); look(critic) at each batch count in `at`."""
    cfg = vapo.Config(**{**config.PRESETS["long"], "value_model": None}).validate()
    optimizers = {"critic": vapo.make_optimizer(critic, cfg.critic_lr, cfg)}
    out = {}
    for i, part in enumerate(parts[:max(at)]):
        rollout, mask = part["rollout"], part["rollout"].response_mask
        values = score_rollout(None, critic, rollout, cfg.micro_batch_size)["values"]  # [B, T]
        if targets == "mc":
            _, goal = gae(terminal_rewards(part["rewards"], mask), values, mask, lam=1.0)
        else:
            goal = part["star"]
        vapo.update(None, critic, optimizers, rollout, {"values": values, "returns": goal}, cfg, train_policy=False)
        if i + 1 in at:
            out[i + 1] = look(critic)
    return out


def scores(critic, ref: dict) -> dict:
    """A critic on the held-out reference set: EV of the return, of V* and of V* inside responses (their levels
    taken out: exact_values.within_response); the meter (whitened advantages) at lambda 0 and at the preset's lambda;
    its detection lag (lab_credit.detection_lags)."""
    from lab_credit import detection_lags
    rollout, rewards, mask = ref["rollout"], ref["rewards"], ref["rollout"].response_mask
    with torch.no_grad():
        values = score_rollout(None, critic, rollout, 8)["values"]
    returns = terminal_rewards(rewards, mask).flip(1).cumsum(1).flip(1)  # the Monte-Carlo return at each token
    out = {"ev": explained_variance(values, returns, mask),
           "ev_of_star": explained_variance(values, ref["star"], mask),
           "ev_of_star_within": explained_variance(exact_values.within_response(values, mask),
                                                   exact_values.within_response(ref["star"], mask), mask)}
    for name, lam in (("lambda0", 0.0), ("preset", length_adaptive_lambda(rollout.lengths, ALPHA))):
        advantages, _ = gae(terminal_rewards(rewards, mask), values, mask, lam=lam)
        batch = SimpleNamespace(cfg=ref["cfg"], rollout=rollout, advantages=masked_whiten(advantages, mask),
                                verdicts=rewards, rewards=rewards, old_logprobs=rollout.sampler_logprobs)
        figures = credit_figures(batch, ref["star"], ref["errors"])
        out[f"corr|{name}"], out[f"first_error|{name}"] = figures["credit/corr"], figures["credit/first_error"]
    lags = detection_lags(values, ref["errors"], rollout.lengths)
    out["lag_median"] = statistics.median(lags) if lags else math.nan
    out["lag_never"] = sum(math.isinf(x) for x in lags) / len(lags) if lags else math.nan
    return out


def reference(args, seed: int) -> dict:
    """The held-out set every fit is scored on (experiment 8's calibration set): the base's responses, V* fitted on
    another sample set, the first wrong tokens."""
    _, rollout, rewards, _ = sample_set(POLICY, args.prompts, args.group, seed)
    exact = fitted_exact(POLICY, args.prompts, args.group, seed)
    problems = [held_out(args.prompts)[int(i)] for i in rollout.prompt_index]
    tokenizer = load_tokenizer(folder_of(POLICY))
    cfg = vapo.Config(**{**config.PRESETS["long"], "samples_per_prompt": args.group, "positive_nll": False})
    return {"rollout": rollout, "rewards": rewards, "cfg": cfg, "star": exact.values(rollout, problems, tokenizer),
            "errors": first_error_tokens(rollout, problems, tokenizer), "tokenizer": tokenizer}


def critic_fits(args, seed: int) -> dict:
    """One seed's table: every row fitted on the same frozen batches of the base (lab_analyses.training_batches, with
    V* of the base counted on all of them for the distillation targets), scored at its batch counts."""
    from lab_analyses import training_batches
    preset = config.PRESETS["long"]
    need = max(min(args.batches, max(row["at"])) for row in ROWS.values())
    parts = training_batches(SimpleNamespace(batches=need, batch_prompts=preset["prompts_per_step"],
                                             group=preset["samples_per_prompt"]), seed)
    ref = reference(args, seed)
    exact = exact_values.ExactValues()
    for part in parts:
        exact.observe(part["rollout"].texts, part["problems"], part["rewards"])
    for part in parts:
        part["star"] = exact.values(part["rollout"], part["problems"], ref["tokenizer"])
    m = {}
    for name, row in ROWS.items():
        at = tuple(n for n in row["at"] if n <= args.batches) or (args.batches,)
        critic = critic_for(row, seed, ref["tokenizer"])
        m |= {f"{name}|{n}|{k}": v for n, s in fit(critic, parts, row["target"], at, lambda c: scores(c, ref)).items()
              for k, v in s.items()}
        print(f"  {name}: fitted, seed {seed}", flush=True)
    return {"seed": seed, "measures": m, "curves": {}}


def run_critic_fits(args, out: str) -> dict | None:
    """critic-fits: each seed's table (out/critic-fits-sSEED.json), then judged over seeds."""
    return publish_seeds("critic-fits", args, out, critic_fits, SIZES, draw_fits)


def draw_fits(results: list[dict], path: str) -> None:
    """Each row's credit at lambda 0 and its EV against the batches it was fitted on (mean over seeds)."""
    panels = []
    for key, title in (("corr|lambda0", "credit/corr at lambda 0"), ("ev", "explained variance of the return"),
                       ("first_error|lambda0", "credit at the first error (SD), lambda 0")):
        lines = []
        for i, (name, row) in enumerate(ROWS.items()):
            xs = [n for n in row["at"] if f"{name}|{n}|{key}" in results[0]["measures"]]
            ys = [statistics.mean(r["measures"][f"{name}|{n}|{key}"] for r in results) for n in xs]
            lines.append((xs, ys, "o-", {"label": name, "color": f"C{i}"}))
        panels.append({"title": title, "xlabel": "training batches", "lines": lines})
    draw(path, "critic-only fits on the base's rollouts, scored on held-out responses", panels)
