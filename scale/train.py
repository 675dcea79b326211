"""vapo.py's trainer, sharded: FSDP2 shards the policy and the critic over the processes of a torch.distributed
world, each process samples its share of the prompts, every statistic is over the whole batch.

    accelerate launch --config_file scale/configs/cpu.yaml scale/train.py --steps 4            # 2 processes, a CPU
    accelerate launch --config_file scale/configs/1node-8gpu.yaml scale/train.py \\
        --model Qwen2.5-32B --dataset ... --engine vllm --vllm-tp 4 --bf16 --gradient-checkpointing   # one node
    bash scale/launch_multinode.sh ...                                                         # several nodes

The options are vapo.py's (`python scale/train.py --help` lists them); the run folder, its checkpoints and its
metrics are the same, and `--resume RUN_DIR` continues a sharded run. This file only sets up the world: the
process group (accelerate's launcher gives rank and world size; machinery/world.py's statistics see it), this
process's device, and the models' layout (scale/sharded.py, FSDP2). Then it runs vapo.train: the same phases and
the same functions as `python vapo.py`, not a copy of them.

What the sharded run needs of the options, checked before anything loads: --prompts-per-step (prompts are dealt
to processes whole, with their G samples) and --mini-batch-size divisible by the number of processes, and no
--dynamic-sampling (its extra sampling rounds would differ between processes, and with them the number of
forward and backward passes that FSDP's collectives need to be equal).
"""
from __future__ import annotations

import datetime
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import config  # noqa: E402
import vapo  # noqa: E402
from scale.sharded import Sharded  # noqa: E402


# How long a collective may wait for the slowest process before NCCL's watchdog ends the run (its default is 10
# minutes). The longest wait is a checkpoint's: rank 0 writes the float32 policy and critic folders (about 260 GB at
# 32B: 9 minutes at 0.5 GB/s, longer on a network file system) while the others wait in its barrier. Float32,
# not the source model's bf16: updates at lr 1e-6 are far below bf16's resolution of the weights, so a bf16
# checkpoint would round away everything learnt since the one before it on --resume.
PROCESS_GROUP_TIMEOUT = datetime.timedelta(hours=2)


def init_world() -> torch.device:
    """Join the process group that the launcher describes (RANK, WORLD_SIZE, MASTER_ADDR, ...), with
    PROCESS_GROUP_TIMEOUT, and return this process's device. accelerate's PartialState does it; on a CPU it reports
    one process of one even when the group has two (its state says DistributedType.NO), so rank and world size are
    read from torch.distributed."""
    from accelerate import PartialState
    PartialState(timeout=PROCESS_GROUP_TIMEOUT)  # passed on to torch.distributed.init_process_group
    if not dist.is_initialized():  # started without a launcher: a world of one, so the same code path runs
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29512")
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1,
                                timeout=PROCESS_GROUP_TIMEOUT)
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def check_sharding(cfg: config.Config, world_size: int):
    """SystemExit naming the option when the run cannot be split over world_size processes."""
    if cfg.prompts_per_rollout % world_size:
        raise SystemExit(f"scale/train.py: --prompts-per-step {cfg.prompts_per_step} ({cfg.prompts_per_rollout} "
                         f"prompts per rollout) must be divisible by the {world_size} processes")
    if cfg.mini_batch_size % world_size:
        raise SystemExit(f"scale/train.py: --mini-batch-size {cfg.mini_batch_size} must be divisible by the "
                         f"{world_size} processes (each holds mini_batch_size / {world_size} samples of it)")
    if (cfg.mini_batch_size // world_size) % cfg.micro_batch_size:
        raise SystemExit(f"scale/train.py: --micro-batch-size {cfg.micro_batch_size} must divide each process's "
                         f"share of a mini-batch, {cfg.mini_batch_size} / {world_size}")
    if world_size % cfg.vllm_tp:
        raise SystemExit(f"scale/train.py: --vllm-tp {cfg.vllm_tp} must divide the {world_size} processes (each "
                         f"group of {cfg.vllm_tp} consecutive processes shares one engine)")
    if cfg.vllm_tp > 1 and 0 < cfg.eval_prompts < world_size:
        raise SystemExit(f"scale/train.py: --eval-prompts {cfg.eval_prompts} must be 0 or at least the "
                         f"{world_size} processes with --vllm-tp {cfg.vllm_tp} (every process of an engine samples)")
    if cfg.dynamic_sampling:
        raise SystemExit("scale/train.py: --dynamic-sampling is not supported when sharded (processes would run "
                         "different numbers of sampling rounds); use vapo.py, or --no-dynamic-sampling")


def main(argv=None, hooks=None):
    """scale/train.py ARGV in this process, every process of the world running it; hooks: vapo.train's (run.Hooks),
    for a caller that observes the run (bench/gpu_check.py's sharded part)."""
    device = init_world()
    layout = Sharded(device, timeout=PROCESS_GROUP_TIMEOUT)
    logging.basicConfig(level=logging.INFO if layout.rank == 0 else logging.WARNING,
                        format=f"%(asctime)s rank{layout.rank} %(name)s: %(message)s", datefmt="%H:%M:%S")
    cfg, resume, overwrite = vapo.config_from_args(argv)
    check_sharding(cfg, layout.world_size)
    layout.bf16 = cfg.bf16 and device.type == "cuda"  # FSDP2 mixed precision on GPUs; a CPU trains in float32
    if layout.rank == 0:
        logging.getLogger("vapo").info("sharded over %d processes (FSDP2), device %s, engine %s",
                                       layout.world_size, device.type, cfg.engine)
    try:
        run_dir = vapo.train(cfg, resume=resume is not None, overwrite=overwrite, hooks=hooks, layout=layout)
        if layout.rank == 0:
            print(f"done: {run_dir}")
    finally:
        if dist.is_initialized():  # a vLLM engine's shutdown has already destroyed it
            dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
