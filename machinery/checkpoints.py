"""A run's checkpoints, written so that a kill at any moment leaves a complete one, and read back with a fallback.

    checkpoint/         the latest verified checkpoint: policy/ and critic/ (Hugging Face folders; GRPO and DAPO
                        have no critic), state.pt (optimizers, schedulers, RNG states, step, value pretraining's
                        progress); sharded runs add optimizer/ and rng/ (one file per process)
    checkpoint.prev/    the one before it: the fallback when checkpoint/ is found damaged
    checkpoint.tmp/     the one being written, read back whole before it is swapped in (models.replace_atomically)

write_atomically (config.json, probes.json, metrics.jsonl and tokens.jsonl cut back on resume) and
save_pretrained_atomic (critic_pretrained/) write a small file or a model folder the same way: the old or the new,
never a mix. fault_point is where the kill tests (tests/test_faults.py) stop the process, with VAPO_FAULT_POINT=name
in the environment: checkpoint:policy-written, checkpoint:state-written and checkpoint:between-renames here,
step-logged and pretrained-critic-written in run.py. run.Run calls this module; it never imports run.py or vapo.py
(the run, and through it the models' layout, is passed in).
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import time

import torch
from safetensors import safe_open

from machinery import world
from machinery.models import replace_atomically, safetensors_files

log = logging.getLogger("vapo")


# ==================================================================================================================
# Writing so that a kill leaves the old or the new, never a mix
# ==================================================================================================================

def fault_point(name: str):
    """Fault injection for the kill harness (tests/test_faults.py): with VAPO_FAULT_POINT=name in the environment,
    the process kills itself with SIGKILL here, as a scheduler or the OOM killer might. Nothing otherwise."""
    if os.environ.get("VAPO_FAULT_POINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def write_atomically(path: str, text: str):
    """A small text file, written so that a kill leaves either the old or the new content."""
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    replace_atomically(path + ".tmp", path)


def save_pretrained_atomic(model, folder: str, layout: "SingleProcess", tokenizer=None):
    """A Hugging Face folder of the model (and tokenizer) written to folder.tmp, then swapped in as folder."""
    tmp = folder + ".tmp"
    if world.is_main():
        shutil.rmtree(tmp, ignore_errors=True)
    world.barrier()
    layout.save_pretrained(model, tmp)  # sharded: every process takes part, the main one writes
    if world.is_main():
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        replace_atomically(tmp, folder)
    world.barrier()


# ==================================================================================================================
# Checkpoints
# ==================================================================================================================

def save_checkpoint(run: "Run", step: int, policy, critic, tokenizer, optimizers, value_pretrained: bool,
                    pretrain: dict | None = None, observers: list | None = None):
    """checkpoint/ = policy/ and critic/ (Hugging Face format; critic None: a run without a critic that trains),
    state.pt (optimizers, schedulers, RNG states, step; `pretrain` = {"step", "recent"} while value pretraining is
    unfinished; `observers`, the state_dict() of each of the run's observers (run.Hooks), so that a resumed run
    continues them as one that ran through).

    Written to checkpoint.tmp, synced, verified by reading every file back (read_checkpoint), and only then
    swapped in; the checkpoint it replaces becomes checkpoint.prev, the fallback if the new one is ever found
    damaged. A kill at any moment leaves at least one complete checkpoint (once the first has been written).
    Sharded (scale/): the policy and critic folders hold the full weights, gathered and written by the main process
    (stock transformers and vLLM load them); the optimizers' shards are written by every process under
    optimizer/ (torch.distributed.checkpoint), and each process's RNG state under rng/.

    Returns what the save cost, for the run's log: {"step", "bytes" (the checkpoint folder's files, every process's;
    0 outside the main process), "write_s", "verify_s" (the read-back), "swap_s" (fsync and renames), "seconds"}.
    """
    layout = run.layout
    t0 = time.perf_counter()
    final, tmp, prev = (os.path.join(run.dir, n) for n in ("checkpoint", "checkpoint.tmp", "checkpoint.prev"))
    if world.is_main():
        shutil.rmtree(tmp, ignore_errors=True)
    world.barrier()
    layout.save_pretrained(policy, os.path.join(tmp, "policy"))
    if world.is_main():
        tokenizer.save_pretrained(os.path.join(tmp, "policy"))
    fault_point("checkpoint:policy-written")
    if critic is not None:  # GRPO and DAPO have none
        layout.save_pretrained(critic, os.path.join(tmp, "critic"))
    rng = rng_state()
    state = {"step": step, "value_pretrained": value_pretrained, "pretrain": pretrain, "observers": observers,
             "optimizers": layout.save_optimizers(optimizers, tmp), "rng": rng}
    if world.world_size() > 1:
        os.makedirs(os.path.join(tmp, "rng"), exist_ok=True)
        torch.save(rng, os.path.join(tmp, "rng", f"{world.rank()}.pt"))
    if world.is_main():
        torch.save(state, os.path.join(tmp, "state.pt"))
    fault_point("checkpoint:state-written")
    world.barrier()
    t_written = t_verified = time.perf_counter()
    if world.is_main():
        read_checkpoint(tmp, critic is not None)  # raises if anything written cannot be read back
        t_verified = time.perf_counter()
        replace_atomically(tmp, final, previous=prev, between=lambda: fault_point("checkpoint:between-renames"))
    world.barrier()
    t_end = time.perf_counter()
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(final) for f in fs) if world.is_main() else 0
    return {"step": step, "bytes": size, "write_s": t_written - t0, "verify_s": t_verified - t_written,
            "swap_s": t_end - t_verified, "seconds": t_end - t0}


def rng_state() -> dict:
    """This process's random streams that the trainer draws from: torch's (CPU and every GPU) and Python's."""
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(rng: dict):
    """The streams of rng_state() put back as they were."""
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


@contextlib.contextmanager
def rng_kept():
    """The trainer's random streams as they were before the block, whatever it drew or seeded: vLLM seeds torch,
    Python's random and numpy in the process that makes an in-process engine, as its worker starts and again after
    its warm-up (vllm.utils.torch_utils.set_random_seed with the engine's seed), which would otherwise decide the
    trainer's mini-batch order from then on. (Its sampler, like the HF engine's, still draws from torch's stream
    during a rollout; a tensor-parallel engine's processes therefore seed it alike: run.seed_all.)"""
    kept = rng_state()
    try:
        yield
    finally:
        set_rng_state(kept)


class CheckpointError(Exception):
    """A checkpoint folder that cannot be read back; the message names the file."""


def read_checkpoint(path: str, with_critic: bool) -> dict:
    """A checkpoint folder, checked: {"policy": its weights' folder, "critic": the critic's or None, "state": the
    state.pt dict}. Every safetensors file is opened (its header read and its size checked against it: a truncated
    file fails here), but its tensors are left on disk for the layout's load_weights, which reads each process's own
    rows only. state.pt is read memory-mapped (its archive's records checked; its tensors, AdamW's moments, about
    8 GB at 0.5B, stay in the file until something reads them: the verification after a save copies nothing into
    memory, and a resume moves each tensor to its device from the mapped file). Raises CheckpointError naming the
    missing or unreadable file."""
    def weights(name):
        folder = os.path.join(path, name)
        files = safetensors_files(folder)
        if not files:
            raise CheckpointError(f"{folder}: no .safetensors weights")
        for file in files:
            try:
                with safe_open(file, "pt") as fh:
                    fh.keys()
            except Exception as err:  # noqa: BLE001 - safetensors raises several kinds for a damaged file
                raise CheckpointError(f"{file}: unreadable ({type(err).__name__}: {err})") from err
        return folder

    out = {"policy": weights("policy"), "critic": weights("critic") if with_critic else None}
    state_path = os.path.join(path, "state.pt")
    try:
        out["state"] = torch.load(state_path, map_location="cpu", weights_only=True, mmap=True)  # tensors, plain data
    except Exception as err:  # noqa: BLE001 - a truncated zip, a missing file, a pickle error
        raise CheckpointError(f"{state_path}: unreadable ({type(err).__name__}: {err})") from err
    if not isinstance(out["state"], dict) or not {"step", "optimizers", "rng"} <= out["state"].keys():
        raise CheckpointError(f"{state_path}: not a vapo training state")
    return out


def load_checkpoint(run: "Run", policy, critic, optimizers) -> dict | None:
    """Restore weights, optimizers and RNG from the run's newest readable checkpoint (checkpoint/, else
    checkpoint.prev/ with a warning naming what was wrong) -> its state dict ({"step", "value_pretrained",
    "pretrain"}), or None if the run has no complete checkpoint (killed before its first one finished)."""
    layout = run.layout
    candidates = [c for c in (os.path.join(run.dir, n) for n in ("checkpoint", "checkpoint.prev")) if os.path.exists(c)]
    for i, path in enumerate(candidates):
        try:
            saved = read_checkpoint(path, critic is not None)
        except CheckpointError as err:
            later = candidates[i + 1:]
            log.warning("checkpoint %s is damaged: %s; %s", path, err,
                        f"falling back to {later[0]}" if later else "no earlier checkpoint to fall back to")
            if not later:
                raise SystemExit(f"--resume {run.dir}: no readable checkpoint ({err})") from None
            continue
        for name, model in (("policy", policy), ("critic", critic)):
            if model is None:
                continue
            missing, unexpected = layout.load_weights(model, saved[name])
            missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
            if missing or unexpected:
                raise SystemExit(f"checkpoint {path}/{name} does not fit the model: missing {missing}, "
                                 f"unexpected {unexpected}")
        state = saved["state"]
        layout.load_optimizers(optimizers, state["optimizers"], path)
        rng = state["rng"]
        if world.world_size() > 1:  # each process's own (sharded runs write one per process)
            rng = torch.load(os.path.join(path, "rng", f"{world.rank()}.pt"), map_location="cpu", weights_only=True)
        set_rng_state(rng)
        log.info("resuming from %s (step %d)", path, state["step"])
        return {"step": state["step"], "value_pretrained": state["value_pretrained"],
                "pretrain": state.get("pretrain"), "observers": state.get("observers")}
    return None
