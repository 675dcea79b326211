"""The sharded load and weight sync of scale/sharded.py over 2 ranks (gloo, CPU), for scale/tests/test_scale.py:

    torchrun --nproc_per_node 2 scale/tests/sharded_paths_check.py MODEL_FOLDER OUT.json

MODEL_FOLDER holds a tiny policy whose generation_config.json lists a second stop token (as an instruct model's
<|im_end|> beside <|endoftext|>). Rank 0 writes OUT.json: the stop tokens the sharded policy ended up with and what
engines.eos_token_ids reads from it; what a sync to a bf16 engine gathered (the dtype of every DTensor gathered,
the names given, whether each equals the float32 weight cast to bf16); and what a sharded save_pretrained wrote
(the generation config's stop tokens, the weights' dtypes).
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from safetensors import safe_open  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

import vapo  # noqa: E402
from machinery import engines, world  # noqa: E402
from scale.sharded import Sharded  # noqa: E402


def main(folder: str, out: str):
    dist.init_process_group("gloo")
    parallel = Sharded(torch.device("cpu"))
    cfg = vapo.Config(model=folder, group_advantage=True, value_pretraining=False, device="cpu")
    policy, _, tokenizer = parallel.load_models(cfg, torch.device("cpu"), folder)
    report = {"generation_eos": policy.generation_config.eos_token_id,
              "eos_token_ids": engines.eos_token_ids(policy, tokenizer)}

    gathered_dtypes, original = [], DTensor.full_tensor
    DTensor.full_tensor = lambda self, **kw: gathered_dtypes.append(str(self.dtype)) or original(self, **kw)
    try:
        synced = list(parallel.named_full_tensors(policy, torch.bfloat16))
    finally:
        DTensor.full_tensor = original
    full = dict(parallel.named_full_tensors(policy))  # float32, as a checkpoint gathers them
    report |= {"gathered_dtypes": sorted(set(gathered_dtypes)), "gathers": len(gathered_dtypes),
               "synced_names": [name for name, _ in synced],
               "synced_dtypes": sorted({str(t.dtype) for _, t in synced}),
               "synced_equal_cast": all(torch.equal(t, full[name].to(torch.bfloat16)) for name, t in synced),
               "state_dict_names": list(policy.state_dict().keys())}

    saved = os.path.join(os.path.dirname(out), "saved")
    parallel.save_pretrained(policy, saved)
    dist.barrier()
    if world.is_main():
        with open(os.path.join(saved, "generation_config.json")) as fh:
            report["saved_generation_eos"] = json.load(fh).get("eos_token_id")
        dtypes = set()
        for file in sorted(f for f in os.listdir(saved) if f.endswith(".safetensors")):
            with safe_open(os.path.join(saved, file), "pt") as fh:
                dtypes |= {str(fh.get_tensor(k).dtype) for k in fh.keys()}
        report["saved_dtypes"] = sorted(dtypes)
        with open(out, "w") as fh:
            json.dump(report, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
