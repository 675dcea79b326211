"""The built-in task's exact values V*(s_t): a constructed reference for measuring critics, and the instruments built
on it.

    ExactValues     V* of a sampling policy, from its measured per-character success rates (task.py's chains)
    ExactReference  an observer (run.Hooks): V* of the current policy, refitted from the last batches, and each RL
                    step's critic measured against it and against a step-count floor (ev_exact, ev_floor, ...)

Datasets have no exact values: these work on the built-in tasks only (run.Hooks.with_builtin decides when).
"""
from __future__ import annotations

import torch

from losses import explained_variance
from machinery.task import ANSWER_PREFIX, _apply, is_borrow_step, parse_expr, problem_of, solve

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
        for text, problem, reward in zip(texts, problems, [float(r) for r in rewards]):
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
    def char_values(self, text: str, problem: dict, total: dict | None = None) -> list[float]:
        """[len(text) + 1] V* of the state before each character of text and before its EOS (the last entry)."""
        total = self._total() if total is None else total
        chain, keys = self._chain(problem)
        tail = [1.0] * (len(chain) + 1)  # tail[i] = P(right | first i characters right), EOS included
        tail[len(chain)] = self.rate(("eos",), total)
        for j in range(len(chain) - 1, -1, -1):
            tail[j] = self.rate(keys[j], total) * tail[j + 1]
        guess_share = self.rate(("start",), total) if total.get(("start",), (0, 0))[0] >= 20 else 0.0
        guess_right = total.get(("guess",), (0, 0))
        guess_right = guess_right[1] / guess_right[0] if guess_right[0] else 0.0
        out = [2 * (guess_share * guess_right + (1 - guess_share) * tail[0]) - 1]
        if text.startswith(ANSWER_PREFIX[0]) and not chain.startswith(ANSWER_PREFIX[0]):  # a guess
            gold = f"{ANSWER_PREFIX}{problem['answer']}"
            for i in range(1, len(text) + 1):
                on = text[:i] == gold[:i]
                out.append(-1.0 if not on else 1.0 if i >= len(gold) else 2 * guess_right - 1)
            return out
        k = _common_prefix(text, chain)
        for i in range(1, len(text) + 1):
            out.append(2 * tail[i] - 1 if i <= k else -1.0)
        return out

    def values(self, rollout, problems: list[dict], tokenizer) -> torch.Tensor:
        """[B, T] V*(s_t) of every response token of rollout (problems[b]: row b's problem), 0 under the mask: the
        state before token t is the text of the tokens before it."""
        total = self._total()
        out = torch.zeros(rollout.response_mask.shape)
        ids, lengths = rollout.response_ids.tolist(), rollout.lengths.tolist()  # one copy to the host, not one a token
        for b in range(rollout.B):
            pieces = [tokenizer.decode([i], skip_special_tokens=True) for i in ids[b][:lengths[b]]]
            text = "".join(pieces)
            chars = self.char_values(text, problems[b], total)
            at = 0
            for t, piece in enumerate(pieces):
                out[b, t] = chars[at]
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
    """An observer (run.Hooks) of a run on the built-in task with a learned critic: V* of the current policy
    (`exact`, an ExactValues over the last `window` observed batches, so never fitted on the batch it judges; value
    pretraining's batches count), the reference the teaching views draw beside V, and each RL step's critic against it:

        ev_floor        explained variance of the return by the step-count floor (a lookup of the prompt's steps)
        ev_exact        by V*, the exact values of the current policy (what no critic beats in expectation)
        ev_critic_exact 1 - Var(V* - V) / Var(V*): the share of V*'s variance the critic explains

    Nothing is returned before a batch has been counted, nor during value pretraining. Its state (the counts of the
    window) goes into the run's checkpoints."""

    def __init__(self, tokenizer, window: int = 8):
        self.tokenizer, self.exact = tokenizer, ExactValues(window=window)

    def observe(self, batch) -> dict:
        """batch: run.Observed -> the figures above (RL steps), then the batch counted."""
        rollout, mask, out = batch.rollout, batch.rollout.response_mask, {}
        if batch.stage == "rl" and self.exact.batches and batch.values is not None:
            star = self.exact.values(rollout, batch.problems, self.tokenizer)  # [B, T]
            out = {"ev_floor": explained_variance(self.exact.floor_values(rollout, batch.problems), batch.returns,
                                                  mask),
                   "ev_exact": explained_variance(star, batch.returns, mask),
                   "ev_critic_exact": explained_variance(batch.values, star, mask)}
        self.exact.observe(rollout.texts, batch.problems, batch.rewards)
        return out

    def state_dict(self) -> dict:
        return {"batches": self.exact.batches}

    def load_state_dict(self, state: dict):
        self.exact.batches = state["batches"]


def problems_of(rollout, tokenizer) -> list[dict]:
    """[B] the problem of each row's prompt (task.problem_of), read from its prompt tokens: what a constructed critic
    that sees only the rollout, as a value network does, knows of the task."""
    return [problem_of(tokenizer.decode(ids[mask.bool()])) for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask)]


def _common_prefix(a: str, b: str) -> int:
    """The number of leading characters a and b share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
