"""rlhf: RL post-training of language models; experiments are fiddle graphs (see docs/).

`rlhf.sweep(graph, members, parallel=1)` runs one experiment per sweep member
(`rlhf.sweeps`). It is imported on first use, so `import rlhf` stays light for
components and workers.
"""


def __getattr__(name: str):
    if name == "sweep":
        from rlhf.sweeps import sweep

        return sweep
    raise AttributeError(f"module 'rlhf' has no attribute {name!r}")
