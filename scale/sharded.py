"""The sharded layout of vapo.py's models: the policy and the critic sharded with PyTorch FSDP2 over the ranks of a
torch.distributed world (models.SingleProcess holds them whole in one process; vapo.train takes either).

    wrap(model)           fully_shard(layer) for each decoder layer, then fully_shard(model): every parameter is a
                          DTensor holding 1 / W of its rows on each rank
    load_models           each model built on the meta device, sharded, and filled from its safetensors files
                          with this rank's rows only: no rank holds a whole model, at setup or at resume
    named_full_tensors    one parameter gathered at a time (DTensor.full_tensor()), for the engine's weight sync
    save_pretrained       the full weights gathered one tensor at a time, written by rank 0 as a Hugging Face
                          folder in files of at most SAVE_FILE_BYTES
    save_optimizers       each rank's optimizer shards, written by torch.distributed.checkpoint (DCP)

The batch's statistics over the ranks (the token counts of the token-level loss, whitening, explained variance,
every logged mean) are machinery/world.py's plain functions, which see the process group themselves; each rank
samples its share of the prompts (world.shard: whole groups stay on one rank).

accelerate launches the processes and sets up the process group; it applies no FSDP on a CPU (it falls back to
DDP silently), so this file calls `fully_shard` itself, the same call on CPU and GPU.
"""
from __future__ import annotations

import json
import logging
import os
import warnings

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, GenerationConfig

from machinery.models import (empty_model, found_or_exit, is_gguf, load_tokenizer, model_folder, safetensors_files,
                    set_gradient_checkpointing, value_config)
from machinery.models import SingleProcess, float32_head

log = logging.getLogger(__name__)
SAVE_FILE_BYTES = 2e9  # the largest weights file a sharded checkpoint writes (rank 0 gathers one file at a time)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local shard, a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def local_rows(tensor: torch.Tensor) -> tuple[int, int]:
    """[start, end) of the rows (dimension 0) of the full tensor that this rank holds. FSDP2 shards dimension 0
    the way torch.chunk does: chunks of ceil(n / W) rows, the last ones short or empty."""
    if not isinstance(tensor, DTensor):
        return 0, tensor.shape[0] if tensor.dim() else 0
    (placement,) = tensor.placements
    n = tensor.shape[0]
    if placement.is_replicate():
        return 0, n
    if not (placement.is_shard() and placement.dim == 0):
        raise ValueError(f"local_rows: a DTensor placed {placement} (only Shard(0) and Replicate are read here)")
    chunk = -(-n // tensor.device_mesh.size())
    start = min(tensor.device_mesh.get_local_rank() * chunk, n)
    end = min(start + chunk, n)
    if end - start != tensor.to_local().shape[0]:
        raise ValueError(f"local_rows: rows {start}:{end} do not match the local shard {tuple(tensor.to_local().shape)}")
    return start, end


def decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks of a Hugging Face model (model.model.layers for Qwen2 / Llama, their value models
    too): the unit of sharding, of prefetching and of activation checkpointing."""
    backbone = getattr(model, model.base_model_prefix, model)
    layers = getattr(backbone, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no `layers` in its backbone to shard; scale/sharded.py knows "
                         f"decoder-only models laid out as Qwen2 and Llama are")
    return list(layers)


class Sharded(SingleProcess):
    """The models' layout over the ranks of the default process group (see the module docstring).

    device: this rank's device (cuda:LOCAL_RANK, or cpu); reductions run there (NCCL needs CUDA tensors).
    bf16: FSDP2 mixed precision, parameters cast to bfloat16 for forward and backward, gradients reduced in float32,
    the sharded master weights and optimizer states float32 (GPU runs: --bf16). timeout: the default process
    group's, which make_engine passes on to a vLLM engine's groups (None: torch's defaults)."""

    def __init__(self, device: torch.device, bf16: bool = False, timeout=None):
        from torch.distributed.device_mesh import init_device_mesh
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.timeout = timeout  # the process group's (a timedelta): an engine's groups get it too
        self.device = device
        self.mesh = init_device_mesh(device.type, (self.world_size,))
        self.bf16 = bf16
        self.models: list[torch.nn.Module] = []

    # --- models ---------------------------------------------------------------------------------------------
    def wrap(self, model):
        """FSDP2: fully_shard each decoder layer (its parameters gathered just before its forward and backward, and
        freed after), then the whole model (embeddings, final norm, head). Activation checkpointing, if the model
        has it on (--gradient-checkpointing), stays as transformers set it, inside each layer. A model that is
        sharded already (load_models shards as it loads) is returned as it is."""
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
        if isinstance(model, FSDPModule):
            return model
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

    def named_full_tensors(self, model, dtype: torch.dtype | None = None):
        """One parameter gathered at a time, cast to `dtype` (the engine's: bfloat16 under --bf16) on each rank's
        shard before the gather, so that the all-gather moves and every rank holds 2 bytes a value, not float32's
        4 (a sync of a 32B policy: 65 GB per rank instead of 131). A weight tied to another (the embeddings and a
        tied LM head) is gathered once and given under both names (vLLM's reload needs both: measured, its greedy
        tokens then differ from the policy's), its full tensor kept until the second name. Every rank gathers
        every tensor: each holds a whole engine (--vllm-tp 1), or a tensor-parallel engine whose reload_weights
        takes full tensors and slices them itself."""
        state = model.state_dict(keep_vars=True)
        names_of: dict[int, list[str]] = {}
        for name, tensor in state.items():
            names_of.setdefault(id(tensor), []).append(name)
        kept: dict[int, torch.Tensor] = {}  # a tied weight's full tensor, until its last name is given
        for name, tensor in state.items():
            key = id(tensor)
            if key not in kept:
                tensor = tensor.detach()
                if dtype is not None and tensor.is_floating_point():
                    tensor = tensor.to(dtype)  # a DTensor casts its local shard: nothing gathered yet
                kept[key] = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            full = kept[key] if name != names_of[key][-1] else kept.pop(key)
            yield name, full

    def save_pretrained(self, model, folder: str):
        """A Hugging Face folder of the model's full weights that stock transformers and vLLM load, gathered one
        tensor at a time (every rank takes part in each gather) and written by rank 0 in files of at most
        SAVE_FILE_BYTES, with the index transformers reads for a checkpoint in several files: rank 0 holds at most
        one file's tensors beyond its own shards, never the whole model. A weight tied to another is written
        once. The config names the model's own class (FSDP2 renames it FSDP<Class>)."""
        from safetensors.torch import save_file
        tensors, seen = [], set()
        for name, tensor in model.state_dict(keep_vars=True).items():
            if id(tensor) not in seen:  # tied weights share one parameter: keep its first name (the embeddings)
                seen.add(id(tensor))
                tensors.append((name, tensor))
        files, size = [[]], 0  # a plan from the shapes alone, so that every file's name is known beforehand
        for name, tensor in tensors:
            nbytes = tensor.numel() * tensor.element_size()
            if files[-1] and size + nbytes > SAVE_FILE_BYTES:
                files.append([])
                size = 0
            files[-1].append((name, tensor))
            size += nbytes
        names = (["model.safetensors"] if len(files) == 1 else
                 [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))])
        if self.rank == 0:
            os.makedirs(folder, exist_ok=True)
        weight_map = {}
        for file, part in zip(names, files):
            gathered = {}
            for name, tensor in part:
                full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
                if self.rank == 0:
                    gathered[name] = full.detach().to("cpu", copy=True).contiguous()
                    weight_map[name] = file
                del full
            if self.rank == 0:
                save_file(gathered, os.path.join(folder, file), metadata={"format": "pt"})
            del gathered
        if self.rank == 0:
            total = sum(t.numel() * t.element_size() for _, t in tensors)
            if len(files) > 1:
                with open(os.path.join(folder, "model.safetensors.index.json"), "w") as fh:
                    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
            model.config.architectures = [type(model).__name__.removeprefix("FSDP")]
            model.config.save_pretrained(folder)
            if getattr(model, "generation_config", None) is not None and model.can_generate():
                model.generation_config.save_pretrained(folder)

    def load_models(self, cfg, device: torch.device, name: str):
        """(policy, critic or None, tokenizer), sharded as they load (FSDP2's meta-device initialisation): each
        model is built with its parameters on the meta device (models.empty_model), sharded (wrap), its shards
        allocated on this rank's device, and filled from the safetensors files with this rank's rows only
        (load_weights). No rank ever holds a whole model, in any dtype; the largest transient is one tensor's
        rows. The critic the same way: from --value-model, else from the policy's folder (its backbone) with a
        zero head, as models.value_model_from_policy makes it in one process."""
        if is_gguf(name):  # a whole GGUF file would be read and dequantised by every rank: convert it once
            raise SystemExit(f"vapo: --model {name}: a sharded run reads a model folder's safetensors rank by rank; "
                             f"save the GGUF's dequantised model as a folder first (models.load_policy, then "
                             f"save_pretrained with its tokenizer) and give that folder")
        with found_or_exit("--model", name):
            folder = model_folder(name)
            tokenizer, config = load_tokenizer(folder), AutoConfig.from_pretrained(folder)
        policy = self._load_sharded(AutoModelForCausalLM, config, folder, cfg.gradient_checkpointing)
        if cfg.fp32_lm_head:  # the head's matmul in float32 (its inputs come bf16 under FSDP2's mixed precision)
            float32_head(policy)
        if os.path.exists(os.path.join(folder, "generation_config.json")):  # from_config never reads it
            # the stop tokens of an instruct model (<|im_end|> and <|endoftext|>): what engines.eos_token_ids reads
            # and save_pretrained writes back, as from_pretrained gives them in one process
            policy.generation_config = GenerationConfig.from_pretrained(folder)
        critic = None
        if not (cfg.group_advantage or cfg.critic_oracle):
            source = folder
            if cfg.value_model:
                with found_or_exit("--value-model", cfg.value_model):
                    source = model_folder(cfg.value_model)
                    config = AutoConfig.from_pretrained(source)
            critic = self._load_sharded(AutoModelForTokenClassification, value_config(config), source,
                                        cfg.gradient_checkpointing, head="score.")
        return policy, critic, tokenizer

    def _load_sharded(self, auto_class, config, folder: str, gradient_checkpointing: bool, head: str | None = None):
        """One model: meta skeleton -> fully_shard -> this rank's shards on its device -> filled from folder. head:
        the prefix of weights that may be absent from folder (a value head on a policy's weights): zero then."""
        model = empty_model(auto_class, config)
        buffers = {n: b.detach().clone() for n, b in model.named_buffers()}  # computed, not in the checkpoint
        if gradient_checkpointing:
            set_gradient_checkpointing(model, True)
        self.wrap(model)
        model.to_empty(device=self.device)  # allocates this rank's shards only; buffers too (refilled below)
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(buffers[n])
        missing, unexpected = self.load_weights(model, folder)
        absent = [k for k in missing if not (head and k.startswith(head))]
        if absent:
            raise SystemExit(f"{folder}: weights missing from its safetensors files: {absent[:8]}"
                             f"{' ...' if len(absent) > 8 else ''}")
        with torch.no_grad():
            for k in missing:  # the value head of a critic made from a policy: V = 0 until it is trained
                local_tensor(model.get_parameter(k)).zero_()
        if unexpected and head is None:
            log.info("%s: weights the model does not use, not read: %s", folder, unexpected[:8])
        model.eval()  # as from_pretrained leaves a model (the trainer sets the mode it needs)
        return model

    def load_weights(self, model, folder: str) -> tuple[list, list]:
        """Each weight of folder's safetensors files, this rank's rows only (a safetensors slice: read from disk
        straight into the local shard, cast to the model's dtype), -> (missing, unexpected) names. A weight
        tied to another (an LM head tied to the embeddings) counts as present when the other is read. Used at
        setup and at resume, so that no rank ever reads the full states."""
        targets = dict(model.state_dict(keep_vars=True))
        filled, unexpected, values = set(), [], 0
        for file in safetensors_files(folder):
            with safe_open(file, "pt", device="cpu") as fh:
                for key in fh.keys():
                    target = targets.get(key)
                    if target is None:
                        unexpected.append(key)
                        continue
                    local = local_tensor(target)
                    start, end = local_rows(target)
                    piece = fh.get_slice(key)[start:end] if local.dim() else fh.get_tensor(key)
                    with torch.no_grad():
                        local.copy_(piece)
                    filled.add(id(target))
                    values += piece.numel()
        self.read_values = getattr(self, "read_values", 0) + values  # what this rank read (tests, benchmarks)
        log.debug("rank %d read %d values of %s", self.rank, values, folder)
        return [k for k, t in targets.items() if id(t) not in filled], unexpected

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
        out = {}
        for name, (optimizer, scheduler) in optimizers.items():
            if not optimizer.state:  # no step yet (a checkpoint before the first): nothing to write, and
                out[name] = ("no step yet", scheduler.state_dict())  # get_optimizer_state_dict would allocate it
                continue
            state = get_optimizer_state_dict(self._model_of(optimizer), optimizer)
            dcp.save({"optimizer": state}, checkpoint_id=os.path.join(folder, "optimizer", name))
            out[name] = (None, scheduler.state_dict())
        return out

    def load_optimizers(self, optimizers: dict, saved: dict, folder: str):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
        for name, (optimizer, scheduler) in optimizers.items():
            if saved[name][0] == "no step yet":  # saved before its first step: it starts fresh, as it was
                scheduler.load_state_dict(saved[name][1])
                continue
            model = self._model_of(optimizer)
            state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the layout, filled in by load
            path = os.path.join(folder, "optimizer", name)
            if not os.path.isdir(path):
                raise SystemExit(f"checkpoint {folder}: no optimizer/{name}/ (was it written by a single-process "
                                 f"run? a sharded run resumes from a sharded checkpoint)")
            dcp.load(state, checkpoint_id=path)
            set_optimizer_state_dict(model, optimizer, state["optimizer"])
            scheduler.load_state_dict(saved[name][1])
