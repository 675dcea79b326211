"""The statistics of a batch split over the processes of a sharded run, as plain functions.

Each asks torch.distributed whether a process group is up (as nanochat's `if ddp:` does): in one process they are
the identity, so vapo.py reads the same either way and nothing is swapped at run time. scale/train.py starts the
process group; vapo.py calls these for every figure of the batch (the token counts that normalise the token-level
loss, whitening, explained variance, every logged mean) and every decision all processes take together (skip a
non-finite step, stop on a signal).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _up() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank (0 in one process)."""
    return dist.get_rank() if _up() else 0


def world_size() -> int:
    """The number of processes (1 in one process)."""
    return dist.get_world_size() if _up() else 1


def is_main() -> bool:
    """The process that writes the run folder (config, metrics, plots, checkpoint folders)."""
    return rank() == 0


def _reduced(x: torch.Tensor, op: str) -> torch.Tensor:
    if world_size() == 1:
        return x
    # NCCL reduces CUDA tensors only; gloo CPU ones
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    y = x.detach().to(device, copy=True)
    dist.all_reduce(y, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return y.to(x.device)


def all_sum(x: torch.Tensor) -> torch.Tensor:
    """x summed over all processes."""
    return _reduced(x, "sum")


def all_max(x: torch.Tensor) -> torch.Tensor:
    """x's elementwise maximum over all processes."""
    return _reduced(x, "max")


def any_process(flag: bool) -> bool:
    """True if flag is true in any process (a decision every process then takes)."""
    return flag if world_size() == 1 else bool(all_sum(torch.tensor(1.0 if flag else 0.0)).item() > 0)


def all_keys(keys) -> list[str]:
    """The union of every process's keys, sorted (so that reductions line up)."""
    if world_size() == 1:
        return sorted(keys)
    gathered: list = [None] * world_size()
    dist.all_gather_object(gathered, sorted(keys))
    return sorted(set().union(*gathered))


def shard(items: list) -> list:
    """This process's contiguous share of a list (prompts): ranks 0..W-1 in order hold the whole list, so a
    prompt's G samples stay on one process."""
    n, r, w = len(items), rank(), world_size()
    return items[r * n // w:(r + 1) * n // w]


def barrier():
    """Wait until every process is here."""
    if world_size() > 1:
        dist.barrier()


def mean(x: torch.Tensor) -> float:
    """The mean of every entry of x over the whole batch (all processes' x)."""
    n = torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device)
    total = all_sum(torch.stack([x.double().sum(), n]))
    return (total[0] / total[1].clamp(min=1)).item()


def total(x: torch.Tensor) -> float:
    """The sum of every entry of x over the whole batch (all processes' x)."""
    return all_sum(x.double().sum()).item()


def standard_error(per_prompt: torch.Tensor, prompts: int) -> float:
    """Standard error of an accuracy over prompts, sqrt(s^2 / P) with s^2 the sample variance of each prompt's mean
    score (its samples are not independent draws, so the prompt is the unit), over all processes' prompts."""
    m, square = mean(per_prompt), mean(per_prompt ** 2)
    return ((square - m ** 2) * prompts / max(prompts - 1, 1) / max(prompts, 1)) ** 0.5


class Mean:
    """Weighted running means of named floats (the update's figures, weighted by their token counts), reduced over
    every process by result()."""

    def __init__(self):
        self.sums, self.weights = {}, {}

    def add(self, stats: dict[str, float], weight: float = 1.0):
        for k, v in stats.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * weight
            self.weights[k] = self.weights.get(k, 0.0) + weight

    def merge(self, other: "Mean"):
        for k in other.sums:
            self.sums[k] = self.sums.get(k, 0.0) + other.sums[k]
            self.weights[k] = self.weights.get(k, 0.0) + other.weights[k]

    def result(self) -> dict[str, float]:
        """Each name's weighted mean over every process's sums; 0.0 for a name whose weights were all 0 (e.g. the
        NLL with no correct sample)."""
        keys = all_keys(self.sums)
        both = all_sum(torch.tensor([[self.sums.get(k, 0.0), self.weights.get(k, 0.0)] for k in keys],
                                    dtype=torch.float64).reshape(-1, 2)).tolist()
        return {k: s / w if w > 0 else 0.0 for k, (s, w) in zip(keys, both)}
