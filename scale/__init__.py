"""The same trainer sharded: `accelerate launch --config_file scale/configs/<name>.yaml scale/train.py [options]`."""
