"""The built-in task's exact values V*(s_t): a constructed reference for measuring critics, and the instruments built
on it.

    ExactValues     V* of a sampling policy, from its measured per-character success rates (task.py's chains)
    ExactReference  an observer (run.Hooks): V* of the current policy, refitted from the last batches; the critic
                    judge (ev_exact, ev_floor, ...) and the credit meter (credit/...) of each RL step
    OracleCritic    --critic-oracle: constructed critics of known quality built on V* (exact, noisy, late, MC)

Datasets have no exact values: these work on the built-in tasks only (run.Hooks.with_builtin decides when).
"""
from __future__ import annotations

import random
import zlib

import torch

from config import parse_oracle, stream
from gae import gae, terminal_rewards
from losses import explained_variance, masked_mean
from rollout import score_rollout
from machinery.data import gold_of, prompt_batch
from machinery.models import autocast
from machinery.task import ANSWER_PREFIX, _apply, first_error, is_borrow_step, parse_expr, problem_of, solve

LINE_CHARS = 10  # a step line "NN a-7=NN" and its newline: the correct chain's line j covers characters 10j..10j+9


class ExactValues:
    """V*(s_t) of a sampling policy on the built-in task: the value a perfect critic of that policy would give each
    state, from the policy's measured per-character success rates. A constructed reference for measuring critics
    (explained variance, credit at the first error), not a technique of the paper, and never a training target.

    With gamma = 1 and a reward of +1 (right) or -1 (wrong) at the end, V*(s) = 2 P(right | s) - 1. The model of the
    policy: a prefix that has left the correct chain (solve(problem), then EOS) is wrong for good, V* = -1 (a later
    slip could cancel an earlier one, rarely: the habit only ever adds 10); a prefix that follows it is right with

        P(right | first i characters right) = prod_{j >= i} p(key(j)),   j over the rest of the chain and its EOS

    where p(key) is the share of sampled responses that wrote character j right, among those that had every
    character before j right, pooled over characters of the same key: (borrow step or other step, band of ten
    lines, offset in the line), the answer line's offset, EOS. A response may instead guess at once ("Answer: N",
    the shortcut): the state before the first character mixes both, P(guess) P(right | guess) + (1 - P(guess))
    P(chain right); a guess in progress is worth 2 P(right | guess) - 1 until it departs from the gold answer.

    observe() counts a batch of sampled responses; values() gives V* of another batch's states; floor_values() the
    step-count floor, E[R | the prompt's number of steps]: what a lookup that knows only the prompt explains.
    window: count only the last `window` observed batches (a policy that changes during RL), none = all."""

    def __init__(self, window: int | None = None):
        self.window = window
        self.batches: list[dict] = []  # one Counter-like dict per observed batch

    # --- counting ------------------------------------------------------------------------------------------
    def observe(self, texts: list[str], problems: list[dict], rewards) -> None:
        """Count one batch: each response's characters against its problem's correct chain, its reward by step count.
        texts [B] (EOS left out), problems [B] (the built-in task's rows), rewards [B] (+1 / -1)."""
        counts: dict = {}

        def add(key, right):
            tries, hits = counts.get(key, (0, 0))
            counts[key] = (tries + 1, hits + right)
        rewards = rewards.tolist() if torch.is_tensor(rewards) else [float(r) for r in rewards]  # one host copy
        for text, problem, reward in zip(texts, problems, rewards):
            tries, hits = counts.get(("floor", problem["n_steps"]), (0, 0.0))
            counts[("floor", problem["n_steps"])] = (tries + 1, hits + reward)
            add(("start",), text.startswith(ANSWER_PREFIX))
            if text.startswith(ANSWER_PREFIX):
                add(("guess",), reward > 0)
                continue
            chain, keys = self._chain(problem)
            k = _common_prefix(text, chain)
            for j in range(min(k + 1, len(chain))):  # right up to k, then (if it departed) wrong at k
                add(keys[j], j < k)
            if k == len(chain):  # the whole chain written: then EOS, or more text (wrong)
                add(("eos",), len(text) == len(chain))
        self.batches.append(counts)
        if self.window is not None:
            self.batches = self.batches[-self.window:]

    def _total(self) -> dict:
        total: dict = {}
        for counts in self.batches:
            for key, (tries, hits) in counts.items():
                t, h = total.get(key, (0, 0))
                total[key] = (t + tries, h + hits)
        return total

    def rate(self, key: tuple, total: dict | None = None) -> float:
        """p(key): the measured success share, falling back to coarser keys with fewer than 20 tries (the same kind
        and offset over all bands; then 1)."""
        total = self._total() if total is None else total
        for k in (key, (key[0], None, key[2]) if len(key) == 3 else None):
            if k is None:
                continue
            if len(k) == 3 and k[1] is None:  # pooled over bands
                tries = sum(t for kk, (t, _) in total.items() if len(kk) == 3 and kk[0] == k[0] and kk[2] == k[2])
                hits = sum(h for kk, (_, h) in total.items() if len(kk) == 3 and kk[0] == k[0] and kk[2] == k[2])
            else:
                tries, hits = total.get(k, (0, 0))
            if tries >= 20:
                return hits / tries
        return 1.0

    @staticmethod
    def _chain(problem: dict) -> tuple[str, list[tuple]]:
        """The correct chain (solve) and each character's key: ("borrow" | "other", band of ten lines, offset in the
        line) on step lines, ("answer", offset) on the answer line."""
        chain = solve(problem)
        value, terms = parse_expr(problem)
        keys = []
        for j, (op, b) in enumerate(terms):
            kind = "borrow" if is_borrow_step(value, op, b) else "other"
            keys += [(kind, j // 10, i) for i in range(LINE_CHARS)]
            value = _apply(value, op, b)
        keys = keys[:len(chain) - len(chain.split("\n")[-1])]
        keys += [("answer", i) for i in range(len(chain) - len(keys))]
        return chain, keys

    # --- the values ------------------------------------------------------------------------------------------
    def _tail(self, chain: str, keys: list[tuple], total: dict) -> list[float]:
        """[len(chain) + 1] P(right | the first i characters right, then the chain and its EOS)."""
        tail = [1.0] * (len(chain) + 1)
        tail[len(chain)] = self.rate(("eos",), total)
        for j in range(len(chain) - 1, -1, -1):
            tail[j] = self.rate(keys[j], total) * tail[j + 1]
        return tail

    def _guess(self, total: dict) -> tuple[float, float]:
        """(P(guess at once), P(right | guess))."""
        share = self.rate(("start",), total) if total.get(("start",), (0, 0))[0] >= 20 else 0.0
        tries, hits = total.get(("guess",), (0, 0))
        return share, hits / tries if tries else 0.0

    def char_values(self, text: str, problem: dict, total: dict | None = None) -> list[float]:
        """[len(text) + 1] V* of the state before each character of text and before its EOS (the last entry)."""
        total = self._total() if total is None else total
        chain, keys = self._chain(problem)
        tail = self._tail(chain, keys, total)  # tail[i] = P(right | first i characters right), EOS included
        guess_share, guess_right = self._guess(total)
        out = [2 * (guess_share * guess_right + (1 - guess_share) * tail[0]) - 1]
        if is_guess(text, chain):
            gold = f"{ANSWER_PREFIX}{problem['answer']}"
            for i in range(1, len(text) + 1):
                on = text[:i] == gold[:i]
                out.append(-1.0 if not on else 1.0 if i >= len(gold) else 2 * guess_right - 1)
            return out
        k = _common_prefix(text, chain)
        for i in range(1, len(text) + 1):
            out.append(2 * tail[i] - 1 if i <= k else -1.0)
        return out

    def late_char_values(self, text: str, problem: dict, delay: int, total: dict | None = None) -> list[float]:
        """char_values of a critic that learns of an error `delay` characters after it: before character i it knows
        the first i - delay characters and takes the rest for the correct chain's (V* of the state where they are),
        so a departure at character e is seen from e + delay on (-1 there, as V*'s). A guess is valued as V* does."""
        total = self._total() if total is None else total
        chain, keys = self._chain(problem)
        exact = self.char_values(text, problem, total)
        if is_guess(text, chain):
            return exact
        tail, k = self._tail(chain, keys, total), _common_prefix(text, chain)
        out = exact[:1]
        for i in range(1, len(text) + 1):
            out.append(2 * tail[min(i, len(chain))] - 1 if i - delay <= k else -1.0)
        return out

    def values(self, rollout, problems: list[dict], tokenizer, chars=None) -> torch.Tensor:
        """[B, T] V*(s_t) of every response token of rollout (problems[b]: row b's problem), 0 under the mask: the
        state before token t is the text of the tokens before it. chars(text, problem, total): another per-character
        value (late_char_values, ...) in place of char_values."""
        total, chars = self._total(), chars or self.char_values
        out = torch.zeros(rollout.response_mask.shape)
        ids, lengths = rollout.response_ids.tolist(), rollout.lengths.tolist()  # one copy to the host, not one a token
        for b in range(rollout.B):
            pieces = [tokenizer.decode([i], skip_special_tokens=True) for i in ids[b][:lengths[b]]]
            values = chars("".join(pieces), problems[b], total)
            at = 0
            for t, piece in enumerate(pieces):
                out[b, t] = values[at]
                at += len(piece)
        return out.to(rollout.response_mask.device)

    def floor_values(self, rollout, problems: list[dict]) -> torch.Tensor:
        """[B, T] the step-count floor on every response token: the mean reward of the observed responses to prompts
        of the same number of steps where at least 20 were seen, else of the same band of ten step counts (at least
        5), else of all; 0 under the mask."""
        total = self._total()
        seen = {k[1]: v for k, v in total.items() if k[0] == "floor"}
        overall = sum(h for _, h in seen.values()) / max(sum(t for t, _ in seen.values()), 1)
        per = []
        for p in problems:
            tries, hits = seen.get(p["n_steps"], (0, 0.0))
            band = [v for n, v in seen.items() if (n - 1) // 10 == (p["n_steps"] - 1) // 10]
            band_tries, band_hits = sum(t for t, _ in band), sum(h for _, h in band)
            per.append(hits / tries if tries >= 20 else band_hits / band_tries if band_tries >= 5 else overall)
        return torch.tensor(per, device=rollout.response_mask.device)[:, None] * rollout.response_mask

    def summary(self) -> dict:
        """The measured rates a reader checks V* against: P(guess), P(right | guess), and per kind the success of a
        whole step line (the product of its characters' rates), pooled over bands."""
        total = self._total()
        out = {"guess": self.rate(("start",), total), "eos": self.rate(("eos",), total)}
        for kind in ("borrow", "other"):
            line = 1.0
            for i in range(LINE_CHARS):
                line *= self.rate((kind, None, i), total)
            out[f"{kind}_line"] = line
        return out


class ExactReference:
    """An observer (run.Hooks) of every run on the built-in task in one process: V* of the current policy (`exact`, an
    ExactValues over the last `window` observed batches, so never fitted on the batch it judges; value pretraining's
    batches count), the reference the teaching views draw beside V and the oracle critics read; and two instruments:

    the critic judge, each RL step's critic against V* and a step-count floor (with a critic):
        ev_floor        explained variance of the return by the step-count floor (a lookup of the prompt's steps)
        ev_exact        by V*, the exact values of the current policy (what no critic beats in expectation)
        ev_critic_exact 1 - Var(V* - V) / Var(V*): the share of V*'s variance the critic explains
        ev_critic_within the same inside responses (within_response: each response's own mean taken from V* and V):
                        whether V moves where V* moves along a response, which is what credit is made of, apart from
                        the response's level (its prompt's difficulty, which the floor and a group's mean also know)
    the credit meter, each RL step's advantages against V*'s exact ones, critic or not (credit_figures: credit/...),
    and the step's KL from the policy that sampled it (credit/step_kl, after the update).

    Nothing is returned before a batch has been counted, nor during value pretraining. Its state (the counts of the
    window) goes into the run's checkpoints."""

    def __init__(self, tokenizer, window: int = 8):
        self.tokenizer, self.exact = tokenizer, ExactValues(window=window)

    def observe(self, batch) -> dict:
        """batch: run.Observed -> the figures above (RL steps), then the batch counted."""
        rollout, mask, out = batch.rollout, batch.rollout.response_mask, {}
        if batch.stage == "rl" and self.exact.batches:
            star = self.exact.values(rollout, batch.problems, self.tokenizer)  # [B, T]
            if batch.values is not None:
                floor = self.exact.floor_values(rollout, batch.problems)
                out = {"ev_floor": explained_variance(floor, batch.returns, mask),
                       "ev_exact": explained_variance(star, batch.returns, mask),
                       "ev_critic_exact": explained_variance(batch.values, star, mask),
                       "ev_critic_within": explained_variance(within_response(batch.values, mask),
                                                              within_response(star, mask), mask)}
            out |= credit_figures(batch, star, first_error_tokens(rollout, batch.problems, self.tokenizer))
        self.exact.observe(rollout.texts, batch.problems, batch.rewards)
        return out

    def updated(self, batch) -> dict:
        """After the update: credit/step_kl, the k3 estimate of KL(pi_old || pi_new) over the batch's tokens."""
        if batch.stage != "rl" or batch.old_logprobs is None:
            return {}
        cfg, rollout = batch.cfg, batch.rollout
        with autocast(cfg, rollout.response_mask.device):
            new = score_rollout(batch.policy, None, rollout, cfg.micro_batch_size, cfg.temperature)["old_logprobs"]
        log_ratio = (new - batch.old_logprobs).clamp(-20, 20)
        return {"credit/step_kl": masked_mean(log_ratio.exp() - 1 - log_ratio, rollout.response_mask).item()}

    def state_dict(self) -> dict:
        return {"batches": self.exact.batches}

    def load_state_dict(self, state: dict):
        self.exact.batches = state["batches"]


def within_response(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] x less each response's own mean over its tokens (0 under the mask): what varies along a response."""
    mask = mask.to(x.dtype)
    mean = (x * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)  # [B, 1]
    return (x - mean) * mask


# --- the credit meter ---------------------------------------------------------------------------------------------
LENGTH_BANDS = ((1, 50), (50, 100), (100, 200), (200, 300), (300, 1 << 30))  # response length in tokens, [lo, hi)


def band_name(lo: int, hi: int) -> str:
    return f"{lo}+" if hi >= 1 << 30 else f"{lo}-{hi - 1}"


def exact_advantages(star: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0):
    """[B, T] V*'s own advantage of each sampled token, A*_t = r_t + gamma V*(s_{t+1}) - V*(s_t) (GAE at lambda 0 on
    V*): with deterministic transitions, Q*(s_t, a_t) - V*(s_t) exactly, the credit a perfect critic gives."""
    return gae(terminal_rewards(rewards, mask), star, mask, gamma=gamma, lam=0.0)[0]


def effective_advantages(batch) -> torch.Tensor:
    """[B, T] the weight of each token's grad log pi in the policy loss: the advantage the loss uses (with
    --policy-gradient), plus the positive NLL's weight mu N / N+ on correct samples' tokens (with --positive-nll;
    the batch's token counts, where the update uses each mini-batch's)."""
    cfg, mask = batch.cfg, batch.rollout.response_mask.float()
    out = batch.advantages * mask if cfg.policy_gradient else torch.zeros_like(mask)
    positive = (batch.verdicts > 0).float()[:, None] * mask  # [B, T]
    if cfg.positive_nll and positive.sum() > 0:
        out = out + cfg.mu * mask.sum() / positive.sum() * positive
    return out


def weighted_corr(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> float:
    """Pearson's correlation of x and y weighted by w (all [B, T]; w 0 where nothing counts); NaN where either has
    no variance (GRPO's advantages in a batch of equal rewards, say)."""
    w = w.double()
    total = w.sum()
    if total <= 0:
        return float("nan")
    mx, my = (w * x).sum() / total, (w * y).sum() / total
    cov = (w * (x - mx) * (y - my)).sum()
    vx, vy = (w * (x - mx) ** 2).sum(), (w * (y - my) ** 2).sum()
    return float(cov / (vx * vy).sqrt()) if vx > 0 and vy > 0 else float("nan")


def credit_figures(batch, star: torch.Tensor, first_errors: list[tuple[int, int]]) -> dict:
    """The credit meter of one RL batch (run.Observed), against V*'s exact advantages A* (exact_advantages of star,
    [B, T]); not explained variance, which a critic that sees an error late can score high with credit of the wrong
    sign. first_errors: (row, token) of each wrong response's first wrong token (first_error_tokens).

        credit/corr             corr(A_eff, A*), each token weighted by its gradient's size, 1 - pi_old(token):
                                A_eff the effective advantage (effective_advantages: PG advantage + NLL weight)
        credit/corr_pg          the same for the policy gradient's advantage alone (with both terms)
        credit/first_error      mean A_eff on first wrong tokens / the std of A_eff over all tokens (negative: the
                                error is blamed; positive: it is rewarded); credit/first_error_exact: A*'s
        credit/fail_share       the share of sum |A_eff| on samples of all-fail groups (where GRPO has none)
        credit/corr|LO-HI       credit/corr on the responses of each length band (LENGTH_BANDS, tokens)"""
    cfg, rollout = batch.cfg, batch.rollout
    mask = rollout.response_mask.float()
    exact = exact_advantages(star, batch.rewards, mask, cfg.gamma)  # [B, T]
    effective = effective_advantages(batch)  # [B, T]
    weight = (1 - batch.old_logprobs.exp()).clamp(min=0) * mask  # [B, T]
    out = {"credit/corr": weighted_corr(effective, exact, weight)}
    if cfg.policy_gradient and cfg.positive_nll:
        out["credit/corr_pg"] = weighted_corr(batch.advantages * mask, exact, weight)
    real = mask.bool()
    rows, cols = (torch.tensor([b for b, _ in first_errors], dtype=torch.long),
                  torch.tensor([t for _, t in first_errors], dtype=torch.long))
    for name, x in (("credit/first_error", effective), ("credit/first_error_exact", exact)):
        at = x[rows.to(x.device), cols.to(x.device)].cpu()  # [errors], one gather
        sd = x[real].std() if real.sum() > 1 else torch.tensor(0.0)
        out[name] = float(at.mean() / sd) if len(at) and sd > 0 else float("nan")
    G = cfg.group_size
    fails = (batch.verdicts.view(-1, G) <= 0).all(1).repeat_interleave(G) if G > 1 else batch.verdicts <= 0  # [B]
    size = (effective.abs() * mask).sum(1)  # [B]
    out["credit/fail_share"] = float(size[fails].sum() / size.sum()) if size.sum() > 0 else float("nan")
    for lo, hi in LENGTH_BANDS:
        rows = ((rollout.lengths >= lo) & (rollout.lengths < hi)).float()[:, None]  # [B, 1]
        if (rows * mask).sum() > 0:
            out[f"credit/corr|{band_name(lo, hi)}"] = weighted_corr(effective, exact, weight * rows)
    return out


def first_error_tokens(rollout, problems: list[dict], tokenizer) -> list[tuple[int, int]]:
    """(row, token) of the token at which each wrong response of rollout first departs from its problem's correct
    chain (task.first_error), from the response's own tokens."""
    out = []
    ids, lengths = rollout.response_ids.tolist(), rollout.lengths.tolist()
    for b in range(rollout.B):
        pieces = [tokenizer.decode([i], skip_special_tokens=True) for i in ids[b][:lengths[b]]]
        char = first_error("".join(pieces), problems[b])
        if char is None or not pieces:
            continue
        ends, t = 0, len(pieces) - 1
        for k, piece in enumerate(pieces):
            ends += len(piece)
            if ends > char:
                t = k
                break
        out.append((b, t))
    return out


# --- the oracle critics -------------------------------------------------------------------------------------------
class OracleCritic(torch.nn.Module):
    """--critic-oracle SPEC: a constructed reference critic of known quality, not a technique of the paper. It reads
    the rollout's prompt and response tokens as a value network would, and gives V* of the current sampling policy
    (`exact`, the ExactReference observer's window of the last batches, never the batch it scores) degraded a known
    way; it has no weights, so it is neither value-pretrained nor trained:

        exact           V*(s_t)
        exact+noise:S   V*(s_t) + S * N(0, 1), independent across tokens, the same for a response scored again
        late:D          V* of a critic that learns of an error D tokens after it (ExactValues.late_char_values)
        mc:K            Monte-Carlo estimates of V* from K simulated continuations (draws of right / wrong from V*'s
                        own success probability) at each line start and at the end of the text, interpolated between
                        them, so that at lambda 0 each token of a line gets the line's advantage divided by its
                        length (10 tokens a line here): VinePPO's per-step advantage (arXiv 2410.01679), its noise K's

    seed: the run's (--seed): the noise and the draws are a fixed function of the seed and the tokens."""

    def __init__(self, spec: str, exact: ExactValues, tokenizer, seed: int):
        super().__init__()
        self.spec, (self.kind, self.number) = spec, parse_oracle(spec)
        self.exact, self.tokenizer, self.seed = exact, tokenizer, seed

    def values_of(self, rollout) -> torch.Tensor:
        """[B, T] the oracle's V(s_t) of the rollout's response tokens, 0 under the mask."""
        problems = problems_of(rollout, self.tokenizer)
        if self.kind == "late":
            return self.exact.values(rollout, problems, self.tokenizer, chars=lambda text, problem, total:
                                     self.exact.late_char_values(text, problem, int(self.number), total))
        if self.kind == "mc":
            return self.exact.values(rollout, problems, self.tokenizer, chars=self._mc_chars)
        star = self.exact.values(rollout, problems, self.tokenizer)  # [B, T]
        if self.kind == "noise":
            noise = torch.stack([torch.randn(rollout.T, generator=torch.Generator().manual_seed(self._row_seed(
                rollout, b))) for b in range(rollout.B)]) if rollout.B else star
            star = (star + self.number * noise.to(star.device)) * rollout.response_mask
        return star

    def _row_seed(self, rollout, b: int) -> int:
        n, p = int(rollout.lengths[b]), rollout.prompt_ids[b][rollout.prompt_mask[b].bool()]
        return zlib.crc32(bytes(str((p.tolist(), rollout.response_ids[b, :n].tolist())), "ascii")) ^ self.seed

    def _mc_chars(self, text: str, problem: dict, total: dict) -> list[float]:
        exact = self.exact.char_values(text, problem, total)  # [len(text) + 1]
        rng = random.Random(zlib.crc32(bytes(problem["prompt"] + text, "utf-8")) ^ self.seed)
        starts = sorted({0, len(text)} | {i + 1 for i, ch in enumerate(text[:-1]) if ch == "\n"})
        K = int(self.number)
        estimate = {i: 2 * sum(rng.random() < (exact[i] + 1) / 2 for _ in range(K)) / K - 1 for i in starts}
        out = []
        for a, b in zip(starts, starts[1:] + [len(text) + 1]):
            for i in range(a, b):
                out.append(estimate[a] if b > len(text) else estimate[a] + (i - a) / (b - a) * (estimate[b] - estimate[a]))
        return out


def oracle_critic(spec: str, reference: ExactReference, setup) -> OracleCritic:
    """The Hooks.critic of --critic-oracle: an OracleCritic reading reference's window, that window first counting one
    batch of the initial policy (cfg.batch_size responses to prompts of value pretraining's stream, as value
    pretraining's rollouts would; a resumed run counts it again, then its checkpoint restores the window)."""
    cfg, engine = setup.cfg, setup.engine
    prompts = prompt_batch(setup.rows, 0, cfg.batch_size, stream(cfg.seed, "pretrain_prompts"))
    with autocast(cfg, engine.device):
        rollout = engine.generate([r["prompt"] for r in prompts], n=1, seed=stream(cfg.seed, "oracle"),
                                  batch_size=cfg.batch_size)
    problems = [prompts[int(i)] for i in rollout.prompt_index]
    rewards = setup.verifier.rewards(rollout.texts, [gold_of(p) for p in problems])
    reference.exact.observe(rollout.texts, problems, rewards)
    return OracleCritic(spec, reference.exact, setup.tokenizer, stream(cfg.seed, "oracle"))


def is_guess(text: str, chain: str) -> bool:
    """A response that answers at once ("Answer: N") where the correct chain has steps: the shortcut."""
    return text.startswith(ANSWER_PREFIX[0]) and not chain.startswith(ANSWER_PREFIX[0])


def problems_of(rollout, tokenizer) -> list[dict]:
    """[B] the problem of each row's prompt (task.problem_of), read from its prompt tokens: what a constructed critic
    that sees only the rollout, as a value network does, knows of the task."""
    return [problem_of(tokenizer.decode(ids[mask.bool()])) for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask)]


def _common_prefix(a: str, b: str) -> int:
    """The number of leading characters a and b share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
