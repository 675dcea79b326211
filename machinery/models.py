"""The two networks of VAPO: the policy (a causal LM) and the value model (the same backbone, a scalar per token).

Both are stock Hugging Face classes and save with `save_pretrained` in the standard format, so stock
transformers loads either of them and vLLM loads the policy:

- policy: `AutoModelForCausalLM`;
- value model: `AutoModelForTokenClassification` with `num_labels=1` (for Qwen2, `Qwen2ForTokenClassification`):
  the backbone's last hidden state at each position goes through a linear head `score` to one number, V(s_t).

The value model starts from the policy's weights (paper section 3: the critic is initialised from the policy, or
from a reward model, then value-pretrained). Its head starts at zero, so V = 0 everywhere before any training: a
critic that knows nothing predicts 0, the mean of a +-1 reward. Our choice; the paper does not say how the head is
initialised. Its dropout is set to 0 (the stock class defaults to 0.1), so a value computed while scoring equals
the value computed in the update on the same weights.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import shutil

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer,
                          PreTrainedModel)

log = logging.getLogger(__name__)

# The built-in task's models, shipped in the repository so that runs start from the same bits on every machine (a
# rebuild on another CPU gives another model: its kernels round differently): --model / --value-model name them.
# machinery/builds.py has their recipes; each entry is (folder, the command that builds it).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, above machinery/
BUILTIN_MODELS = {
    "builtin": (os.path.join(ROOT, "base-model"), "python -m machinery.builds build --out base-model"),
    "builtin-long": (os.path.join(ROOT, "base-model-long"),
                     "python -m machinery.builds build --chains long --out base-model-long"),
    "builtin-long-rm": (os.path.join(ROOT, "reward-model-long"),
                        "python -m machinery.builds reward-model --out reward-model-long"),
}


def shipped_model(name: str) -> str:
    """The folder of a built-in model (BUILTIN_MODELS), or SystemExit in one line naming the command that builds it."""
    folder, command = BUILTIN_MODELS[name]
    if not os.path.exists(os.path.join(folder, "build_info.json")):  # written last by a build
        raise SystemExit(f"vapo: {name}: no model in {folder}; build it with: {command}")
    return folder

# Short names accepted by --model; anything else (a local folder, "org/name") is passed through unchanged.
KNOWN_MODELS = {
    f"Qwen2.5-{size}{kind}": f"Qwen/Qwen2.5-{size}{kind}"
    for size in ("0.5B", "1.5B", "7B", "32B")
    for kind in ("", "-Instruct")
}


def resolve_model_name(name: str) -> str:
    """`Qwen2.5-0.5B` -> `Qwen/Qwen2.5-0.5B` (case-insensitive, see KNOWN_MODELS); an existing local folder, a full
    `org/name`, a GGUF file or any other name is returned unchanged for `from_pretrained` to judge."""
    if os.path.isdir(name) or "/" in name or is_gguf(name):
        return name
    by_lower = {short.lower(): full for short, full in KNOWN_MODELS.items()}
    return by_lower.get(name.lower(), name)


def is_gguf(name: str | None) -> bool:
    """True for a GGUF checkpoint file (llama.cpp's format: one file holding the weights, quantised or not, the
    config and the tokenizer), which --model takes as it takes a folder."""
    return bool(name) and name.lower().endswith(".gguf")


def gguf_location(path: str) -> dict:
    """from_pretrained's arguments for a GGUF file: {"pretrained_model_name_or_path": its folder, "gguf_file": its
    name}. SystemExit in one line when the file is absent or the gguf package (transformers' reader) is missing."""
    if not os.path.isfile(path):
        raise SystemExit(f"vapo: --model {path}: no such GGUF file")
    try:
        import gguf  # noqa: F401  optional: only GGUF checkpoints need it (transformers reads them through it)
    except ImportError:
        raise SystemExit(f"vapo: --model {path}: reading a GGUF file needs the gguf package (pip install gguf)"
                         ) from None
    folder, file = os.path.split(os.path.abspath(path))
    return {"pretrained_model_name_or_path": folder, "gguf_file": file}


def load_gguf_policy(path: str, dtype: torch.dtype | str | None = None) -> PreTrainedModel:
    """The causal LM of a GGUF file, dequantised to dtype (None: float32), as a plain model of its class.

    transformers dequantises the file's tensors (Q4_1, Q8_0, ...) to float as it loads them, but the model it
    returns keeps a GGUF quantiser and refuses save_pretrained. So the same class is built again from the config
    without its quantization_config (on the meta device, no random init) and the dequantised weights are moved
    into it: a model like any other, whose checkpoints are safetensors folders that stock transformers loads.
    The trainer loads it in float32, its master weights on any device (models.load_models); on a GPU, --bf16
    computes in bfloat16 under autocast, as for any other model."""
    dtype = torch.float32 if dtype in (None, "auto") else _dtype(dtype)
    loaded = AutoModelForCausalLM.from_pretrained(**gguf_location(path), dtype=dtype)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = path
    model = empty_model(AutoModelForCausalLM, config, dtype=dtype)
    _, unexpected = model.load_state_dict(loaded.state_dict(), strict=False, assign=True)
    model.tie_weights()  # assign=True replaced the tied tensors one by one: tie them again
    meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if meta or unexpected:
        raise RuntimeError(f"{path}: the GGUF's weights do not fill its model (missing {meta}, unexpected "
                           f"{unexpected})")
    model.generation_config = loaded.generation_config
    return model


def _dtype(dtype: torch.dtype | str | None) -> torch.dtype | str:
    """None -> "auto" (the dtype the checkpoint was saved in); "bfloat16" -> torch.bfloat16."""
    if dtype is None or dtype == "auto":
        return "auto"
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def set_gradient_checkpointing(model: PreTrainedModel, enabled: bool = True) -> PreTrainedModel:
    """Switch gradient (activation) checkpointing on or off: recompute each layer's activations in the backward
    pass instead of storing them, trading about a third more compute for much less memory on long responses.
    Non-reentrant, so the inputs need not require grad. It acts only in train mode; generation runs in eval mode."""
    # transformers >= 5.x calls it "activation checkpointing"; older versions only have the gradient_* names.
    if enabled:
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()
    return model


def load_tokenizer(name_or_folder: str):
    """The model's tokenizer, padding on the left (generation appends on the right), with a pad token. A GGUF file
    holds its tokenizer (and chat template) itself."""
    where = gguf_location(name_or_folder) if is_gguf(name_or_folder) else {
        "pretrained_model_name_or_path": resolve_model_name(name_or_folder)}
    tokenizer = AutoTokenizer.from_pretrained(**where)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        log.info("tokenizer of %s has no pad token: using its EOS token %r as pad", name_or_folder,
                 tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(name_or_folder: str, dtype: torch.dtype | str | None = None, device: torch.device | str | None = None,
                gradient_checkpointing: bool = False):
    """Load the policy and its tokenizer: `(model, tokenizer)`.

    name_or_folder: a short name (`Qwen2.5-0.5B`), a hub name (`Qwen/Qwen2.5-0.5B`), a local folder or a GGUF file
    (dequantised: load_gguf_policy). dtype: torch dtype or its name; None keeps the checkpoint's own dtype (a GGUF
    file's: float32). device: where to put the model.
    """
    name = resolve_model_name(name_or_folder)
    if is_gguf(name):
        model = load_gguf_policy(name, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=_dtype(dtype))
    if device is not None:
        model.to(device)
    if gradient_checkpointing:
        set_gradient_checkpointing(model, True)
    return model, load_tokenizer(name)


def model_folder(name_or_folder: str) -> str:
    """The local folder of a model: a folder as it is, or a hub model's snapshot (downloaded once into the hub's
    cache; with HF_HUB_OFFLINE=1 read from it), configs, tokenizer and safetensors weights only. What a sharded
    run reads its weights from, tensor by tensor (scale/sharded.py)."""
    name = resolve_model_name(name_or_folder)
    if os.path.isdir(name):
        return name
    from huggingface_hub import snapshot_download
    return snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"])


def safetensors_files(folder: str) -> list[str]:
    """The .safetensors files of a model folder, sorted (a large model's are sharded into several)."""
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")) if os.path.isdir(folder) else []
    return [os.path.join(folder, f) for f in files]


def empty_model(auto_class, config, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The model of `config` (an Auto class: AutoModelForCausalLM, AutoModelForTokenClassification) with its
    parameters on the meta device (no memory, no random initialisation) and its buffers real: rotary frequencies
    are computed at construction, not stored in checkpoints. Tied weights tied. What a sharded run builds before
    each process allocates its own shard of every parameter (FSDP2's meta-device initialisation)."""
    from accelerate import init_empty_weights
    with init_empty_weights(include_buffers=False):
        model = auto_class.from_config(config, dtype=dtype)
    model.tie_weights()
    return model


def value_config(config):
    """A copy of a backbone's config for the value model: one output per token, no dropout on the head."""
    config = copy.deepcopy(config)
    config.num_labels = 1  # also resets id2label/label2id to one label
    config.classifier_dropout = 0.0
    config.architectures = None  # save_pretrained fills in the value model's class
    return config


def zero_head(value: PreTrainedModel) -> PreTrainedModel:
    """value with its scalar head (`score`) set to zero, so that V(s_t) = 0 for every state until it is trained."""
    nn.init.zeros_(value.score.weight)
    if value.score.bias is not None:
        nn.init.zeros_(value.score.bias)
    return value


def value_model_from_policy(policy: PreTrainedModel, gradient_checkpointing: bool = False) -> PreTrainedModel:
    """A value model whose backbone is a copy of the policy's backbone (same values, separate tensors, same dtype
    and device) and whose scalar head is zero, so V(s_t) = 0 for every state until it is trained.

    No disk round trip: the skeleton is built on the meta device (no memory, no random init of a large backbone),
    then the policy's backbone is deep-copied into it.
    """
    with torch.device("meta"):
        value = AutoModelForTokenClassification.from_config(value_config(policy.config), dtype=policy.dtype)
    prefix = value.base_model_prefix  # "model" for Qwen2: value.model is the backbone
    setattr(value, prefix, copy.deepcopy(policy.base_model))
    hidden = value.score.in_features
    value.score = nn.Linear(hidden, 1, bias=value.score.bias is not None, device=policy.device, dtype=policy.dtype)
    zero_head(value)
    meta = [n for n, t in list(value.named_parameters()) + list(value.named_buffers()) if t.is_meta]
    if meta:  # a model class with parts outside backbone and head would land here
        raise RuntimeError(f"value model has tensors left on the meta device: {meta}")
    value.train(policy.training)
    if gradient_checkpointing:
        set_gradient_checkpointing(value, True)
    return value


def load_value_model(name_or_folder: str, dtype: torch.dtype | str | None = None,
                     device: torch.device | str | None = None, gradient_checkpointing: bool = False
                     ) -> PreTrainedModel:
    """Load a value model from a folder or hub name: a value model saved by us (head kept), a reward model with a
    one-output `score` head (head kept), or a policy / base LM (no head there: the head is set to zero).

    Fails if any backbone weight is missing from the checkpoint (it would be silently random otherwise).
    """
    name = resolve_model_name(name_or_folder)
    config = value_config(AutoConfig.from_pretrained(name))
    value, info = AutoModelForTokenClassification.from_pretrained(
        name, config=config, dtype=_dtype(dtype), output_loading_info=True)
    missing = set(info["missing_keys"])
    head = {n for n, _ in value.named_parameters() if n.startswith("score.")}
    if missing - head:
        raise ValueError(f"{name_or_folder}: backbone weights missing from the checkpoint: {sorted(missing - head)}")
    for n, p in value.named_parameters():
        if n in missing:  # a freshly created head: start at V = 0 (see module docstring)
            nn.init.zeros_(p)
    if missing:
        log.info("%s has no value head (%s): initialised to zero", name_or_folder, sorted(missing))
    if device is not None:
        value.to(device)
    if gradient_checkpointing:
        set_gradient_checkpointing(value, True)
    return value


# --- a run's models -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def found_or_exit(option: str, name: str):
    """A model or tokenizer that transformers cannot find (OSError: not a folder here, not on the hub, or the hub
    unreachable) becomes one line naming the option, not a traceback. Offline, set HF_HUB_OFFLINE=1: the hub
    client then fails at once instead of retrying for a minute."""
    try:
        yield
    except OSError as err:
        offline = "" if os.environ.get("HF_HUB_OFFLINE") else "; offline? set HF_HUB_OFFLINE=1 to fail at once"
        raise SystemExit(f"vapo: {option} {name}: neither a model folder here nor a model the Hugging Face hub "
                         f"gave ({str(err).splitlines()[0][:300]}){offline}") from None


def pick_device(name: str) -> torch.device:
    """--device: "auto" (CUDA if available), "cpu", "cuda" or "cuda:N"; SystemExit if CUDA is asked for and absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: CUDA is not available on this machine")
    return torch.device(name)


def load_models(cfg, device: torch.device, name: str | None = None):
    """(policy, critic, tokenizer) of a run (a config.Config), in float32 on device: the policy from name (default
    cfg.model; for a built-in name the caller passes its folder, shipped_model(name)), the critic from
    --value-model or else from the policy's weights with a zero head; critic None with --group-advantage (GRPO and
    DAPO have none: nothing is built) and --critic-oracle (a constructed critic without weights: run.Hooks builds
    it). A model that cannot be found is one message (SystemExit), not a traceback."""
    name = name or cfg.model
    if name.startswith("builtin"):
        raise ValueError(f"load_models: pass the built-in model's folder as name (models.shipped_model({name!r}))")
    with found_or_exit("--model", cfg.model):
        policy, tokenizer = load_policy(name, dtype=torch.float32, device=device,
                                        gradient_checkpointing=cfg.gradient_checkpointing)
    if cfg.fp32_lm_head:
        float32_head(policy)
    if cfg.group_advantage or cfg.critic_oracle:
        critic = None
    elif cfg.value_model:
        critic = load_value_model(cfg.value_model, dtype=torch.float32, device=device,
                                  gradient_checkpointing=cfg.gradient_checkpointing)
    else:
        critic = value_model_from_policy(policy, gradient_checkpointing=cfg.gradient_checkpointing)
    return policy, critic, tokenizer


# --- writing so that a kill leaves the old or the new, never a mix ------------------------------------------
def _fsync_tree(path: str):
    """fsync a file, or every file under a folder, so that it is on disk before it is swapped in."""
    files = [path] if os.path.isfile(path) else [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]
    for f in files:
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())


def replace_atomically(tmp: str, final: str, previous: str | None = None, between=None):
    """Swap a completely written tmp (a model folder, a checkpoint, a small file) in as final: tmp is synced to
    disk, the old final folder is kept as `previous` (or moved aside and deleted), then tmp is renamed to final.
    A kill at any moment leaves final, or previous, whole. between: called between the two renames (the kill
    harness's fault point)."""
    _fsync_tree(tmp)
    if os.path.isdir(final):  # rename cannot replace a folder: move the old one aside first
        aside = previous or final + ".old"
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
        if between is not None:
            between()
        os.replace(tmp, final)
        if previous is None:
            shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(tmp, final)


def trains(critic) -> bool:
    """A critic the trainer trains: a value network, not a constructed critic without weights (or none at all)."""
    return critic is not None and any(p.requires_grad for p in critic.parameters())


def frozen_copy(model):
    """A copy of model with no gradients, in eval mode: the reference policy of --kl-coef."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


class Float32Head(nn.Linear):
    """An LM head (nn.Linear) that computes the logits in float32 whatever autocast says (--fp32-lm-head): its input
    and weight are cast up and autocast is off inside. Under bf16 autocast the head otherwise runs in bf16, whose
    spacing near a trained model's chosen logits of 15-30 is 0.06-0.125: the sampler's decode step and the trainer's
    full-sequence pass, other kernels on other shapes, then round the same logits differently (MiniMax-M1 traced
    its train/inference log-prob mismatch to the head's precision). Same parameters, same names: checkpoints and
    engines see the model as it was."""

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return nn.functional.linear(x.float(), self.weight.float(), bias)


def float32_head(model: PreTrainedModel) -> PreTrainedModel:
    """model with its output embeddings (the LM head, an nn.Linear) computing in float32 (Float32Head)."""
    head = model.get_output_embeddings()
    if type(head) not in (nn.Linear, Float32Head):
        raise ValueError(f"--fp32-lm-head: {type(model).__name__}'s head is a {type(head).__name__}, not a Linear")
    head.__class__ = Float32Head  # a subclass without state of its own: the parameters stay where they are
    return model


def autocast(cfg, device: torch.device):
    """bfloat16 autocast around forward passes (sampling, scoring, the update's forwards) when --bf16; weights,
    gradients and optimizer states stay float32, so an lr of 1e-6 still moves them."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if cfg.bf16 else contextlib.nullcontext()


class SingleProcess:
    """How a run holds its models when one process holds them whole: loaded, wrapped for training (unchanged here),
    read one weight at a time (an engine's weight sync), saved and loaded. scale/sharded.py's Sharded has the same
    methods over the processes of a torch.distributed world, with FSDP2-sharded models; vapo.train takes either
    (its `layout`), and the run folder and the engines reach the weights only through it."""

    def wrap(self, model):
        """The model as it is trained: here, unchanged; sharded, FSDP2 `fully_shard` per decoder layer."""
        return model

    def named_full_tensors(self, model, dtype: torch.dtype | None = None):
        """(name, full tensor) of every weight, one at a time (sharded: gathered one at a time, never the whole
        model at once, cast to dtype before the gather), in the names of the model's Hugging Face checkpoint.
        dtype: the engine's (None: as they are). A tied weight is given under each of its names."""
        for name, tensor in model.state_dict().items():
            yield name, tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor

    def save_pretrained(self, model, folder: str):
        """A Hugging Face folder of the model's full weights that stock transformers and vLLM load."""
        model.save_pretrained(folder)

    def load_models(self, cfg, device: torch.device, name: str):
        """(policy, critic or None, tokenizer) of the run, whole, in float32 on device (load_models);
        sharded: each process builds, shards and fills its own shards, never a whole model."""
        return load_models(cfg, device, name)

    def load_weights(self, model, folder: str) -> tuple[list, list]:
        """The weights of a Hugging Face folder's safetensors files into the model -> (missing keys, unexpected
        keys); sharded: each process reads only its own rows of each tensor."""
        state = {}
        for file in safetensors_files(folder):
            state.update(load_file(file))
        return model.load_state_dict(state, strict=False)

    def save_optimizers(self, optimizers: dict, folder: str) -> dict:
        """The optimizers' and schedulers' state, for state.pt (sharded: the optimizers' shards are written under
        folder by torch.distributed.checkpoint, and only the schedulers go into state.pt)."""
        return {k: (o.state_dict(), s.state_dict()) for k, (o, s) in optimizers.items()}

    def load_optimizers(self, optimizers: dict, saved: dict, folder: str):
        """The inverse of save_optimizers."""
        for k, (opt_state, sched_state) in saved.items():
            optimizers[k][0].load_state_dict(opt_state)
            optimizers[k][1].load_state_dict(sched_state)
