"""A model folder of the Qwen2.5-0.5B-shaped stand-in, built without a download (common.build_qwen_folder: its
config, a tokenizer whose special tokens sit at Qwen2.5's real ids, random weights at any depth, the instruct
model's generation config; common.py says what each is). A folder --model takes:

    python bench/qwen_proxy.py OUT_DIR [--layers 24]
"""
from __future__ import annotations

import argparse
import os

import common  # (puts the repository on the path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=24)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    print(f"{args.out}: {common.build_qwen_folder(args.out, args.layers):,} parameters, {args.layers} layers")


if __name__ == "__main__":
    main()
