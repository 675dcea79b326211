"""The sharded `parallel` hook of vapo.py: the batch split over the ranks of a torch.distributed world, the policy
and the critic sharded with PyTorch FSDP2.

vapo.py reads the whole batch through one object, `vapo.parallel` (see run.SingleProcess: the identity in one
process). `Sharded` has the same methods over every rank:

    all_sum(x)            dist.all_reduce(x, SUM): token counts of the token-level loss, whitening, explained
                          variance, every logged mean (sum over ranks / count over ranks)
    shard(prompts)        rank r of W takes prompts[r * n / W : (r + 1) * n / W]: whole groups stay on one rank
    wrap(model)           fully_shard(layer) for each decoder layer, then fully_shard(model): every parameter is a
                          DTensor holding 1 / W of its rows on each rank
    named_full_tensors    one parameter gathered at a time (DTensor.full_tensor()), for the engine's weight sync
    save_pretrained       the full state dict gathered to rank 0's CPU, written as a Hugging Face folder
    save_optimizers       each rank's optimizer shards, written by torch.distributed.checkpoint (DCP)

accelerate launches the processes and sets up the process group; it applies no FSDP on a CPU (it falls back to
DDP silently), so this file calls `fully_shard` itself, the same call on CPU and GPU.
"""
from __future__ import annotations

import json
import os
import warnings

import torch
import torch.distributed as dist

from run import SingleProcess


def decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks of a Hugging Face model (model.model.layers for Qwen2 / Llama, their value models
    too): the unit of sharding, of prefetching and of activation checkpointing."""
    backbone = getattr(model, model.base_model_prefix, model)
    layers = getattr(backbone, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no `layers` in its backbone to shard; scale/parallel.py knows "
                         f"decoder-only models laid out as Qwen2 and Llama are")
    return list(layers)


class Sharded(SingleProcess):
    """vapo.parallel across the ranks of the default process group (see the module docstring).

    device: this rank's device (cuda:LOCAL_RANK, or cpu); reductions run there (NCCL needs CUDA tensors).
    bf16: FSDP2 mixed precision, parameters cast to bfloat16 for forward and backward, gradients reduced in float32,
    the sharded master weights and optimizer states float32 (GPU runs: --bf16)."""

    def __init__(self, device: torch.device, bf16: bool = False):
        from torch.distributed.device_mesh import init_device_mesh
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = device
        self.mesh = init_device_mesh(device.type, (self.world_size,))
        self.bf16 = bf16
        self.models: list[torch.nn.Module] = []

    # --- the batch over all ranks ---------------------------------------------------------------------------
    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        y = x.detach().to(self.device, copy=True)
        dist.all_reduce(y, op=dist.ReduceOp.SUM)
        return y.to(x.device)

    def all_max(self, x: torch.Tensor) -> torch.Tensor:
        y = x.detach().to(self.device, copy=True)
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        return y.to(x.device)

    def any(self, flag: bool) -> bool:
        return bool(self.all_sum(torch.tensor(1.0 if flag else 0.0)).item() > 0)

    def all_keys(self, keys) -> list[str]:
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, sorted(keys))
        return sorted(set().union(*gathered))

    def shard(self, items: list) -> list:
        n = len(items)
        return items[self.rank * n // self.world_size:(self.rank + 1) * n // self.world_size]

    def barrier(self):
        dist.barrier()

    # --- models ---------------------------------------------------------------------------------------------
    def wrap(self, model):
        """FSDP2: fully_shard each decoder layer (its parameters gathered just before its forward and backward, and
        freed after), then the whole model (embeddings, final norm, head). Activation checkpointing, if the model
        has it on (--gradient-checkpointing), stays as transformers set it, inside each layer."""
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.bf16 else None
        kwargs = {"mesh": self.mesh} | ({"mp_policy": mp} if mp is not None else {})
        # FSDP2 warns that a module returning a view (the value model's logits) would lose its backward hook to an
        # in-place op on that view; the trainer makes none (rollout.response_values slices and copies)
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        for layer in decoder_layers(model):
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        # FSDP averages gradients over ranks by default; each rank's loss here is already divided by the token count
        # of the whole mini-batch (vapo.update), so the gradient of the batch is the SUM of the ranks' gradients
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
        self.models.append(model)
        return model

    def named_full_tensors(self, model):
        for name, tensor in model.state_dict().items():
            yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor

    def save_pretrained(self, model, folder: str):
        """Every rank takes part in gathering; rank 0 holds the full state dict on its CPU and writes it. The
        folder's config names the model's own class (FSDP2 renames it FSDP<Class>), so stock transformers and
        vLLM load it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.is_main:
            model.save_pretrained(folder, state_dict=state)
            config_path = os.path.join(folder, "config.json")
            with open(config_path) as fh:
                config = json.load(fh)
            config["architectures"] = [a[len("FSDP"):] if a.startswith("FSDP") else a
                                       for a in config.get("architectures") or []]
            with open(config_path, "w") as fh:
                json.dump(config, fh, indent=2)

    def load_state_dict(self, model, state_dict: dict) -> tuple[list, list]:
        """Full weights (every rank has read them) into the sharded model: each rank keeps its own rows."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        result = set_model_state_dict(model, state_dict, options=StateDictOptions(full_state_dict=True, strict=False))
        return list(result.missing_keys), list(result.unexpected_keys)

    def _model_of(self, optimizer) -> torch.nn.Module:
        first = optimizer.param_groups[0]["params"][0]
        for model in self.models:
            if any(p is first for p in model.parameters()):
                return model
        raise ValueError("an optimizer of parameters that no wrapped model holds")

    def save_optimizers(self, optimizers: dict, folder: str) -> dict:
        """Each optimizer's state as its shards, under folder/optimizer/<name>/ (DCP: every rank writes its own);
        the schedulers' state (the same on every rank) is returned for state.pt."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
        for name, (optimizer, _) in optimizers.items():
            state = get_optimizer_state_dict(self._model_of(optimizer), optimizer)
            dcp.save({"optimizer": state}, checkpoint_id=os.path.join(folder, "optimizer", name))
        return {name: (None, scheduler.state_dict()) for name, (_, scheduler) in optimizers.items()}

    def load_optimizers(self, optimizers: dict, saved: dict, folder: str):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
        for name, (optimizer, scheduler) in optimizers.items():
            model = self._model_of(optimizer)
            state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the layout, filled in by load
            path = os.path.join(folder, "optimizer", name)
            if not os.path.isdir(path):
                raise SystemExit(f"checkpoint {folder}: no optimizer/{name}/ (was it written by a single-process "
                                 f"run? a sharded run resumes from a sharded checkpoint)")
            dcp.load(state, checkpoint_id=path)
            set_optimizer_state_dict(model, optimizer, state["optimizer"])
            scheduler.load_state_dict(saved[name][1])
