#!/usr/bin/env bash
# Start scale/train.py on one node of a multi-node run: run this same line on every node (a SLURM job step runs it
# once per node; elsewhere, start it on each node by hand with NODE_RANK set).
#
#   srun --nodes 4 --ntasks-per-node 1 bash scale/launch_multinode.sh --model Qwen2.5-32B --engine vllm --bf16 ...
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 bash scale/launch_multinode.sh ...        # without SLURM
#
# NNODES, NODE_RANK and MASTER_ADDR default to SLURM's values; GPUS_PER_NODE to 8; MASTER_PORT to 29500. The run
# folder (--output-dir) must be on storage every node sees: rank 0 writes the Hugging Face folders, every rank its
# optimizer shards.
set -euo pipefail
cd "$(dirname "$0")/.."
NNODES=${NNODES:-${SLURM_NNODES:-1}}
NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-0}}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "${SLURM_JOB_NODELIST:?set MASTER_ADDR or run under SLURM}" | head -n 1)}
MASTER_PORT=${MASTER_PORT:-29500}
exec accelerate launch --config_file scale/configs/multinode.yaml \
  --num_machines "$NNODES" --num_processes $((NNODES * GPUS_PER_NODE)) --machine_rank "$NODE_RANK" \
  --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT" \
  scale/train.py "$@"
