"""The machinery a learner may skip: everything around the algorithm of vapo.py.

    run.py           the run folder, resume, signals, metrics, the after-step decision; the model plumbing
    world.py         the statistics over the processes of a sharded run, as plain functions
    checkpoints.py   checkpoints a kill leaves whole
    models.py        the policy and the critic (same backbone, scalar head): loading, building, dtypes
    data.py          prompts, templates, datasets
    engines.py       the HF sampling engine, and the run's engine made and kept in step with the policy
    decoding.py      the sampler's GPU fast path: a KV cache allocated once, decode attention without K/V copies
    task.py          the built-in task: synthetic arithmetic, its tokenizer, the tiny model
    exact_values.py  its exact values V*, the critic judge and the credit meter (observers), the oracle critics
    builds.py        how the shipped models were built (python -m machinery.builds)
    views.py         the per-token teaching views' record; plots.py draws them and the run's curves
"""
