"""A small resumable DPO job, run as a subprocess by test_dpo_trainer.py.

usage: python dpo_job.py MODEL_PATH TRAIN VAL OUTPUT_DIR

A named run (`run_name="job"`: a stable folder, so running it again resumes), a checkpoint every step.
With KILL_AT=K the job SIGKILLs itself in step K+1, after the update and before the step is logged or
saved (deterministic, so the test cannot race a fast machine).
"""

import os
import signal
import sys

import torch

from rlhf.runtime.experiment import run_experiment
from rlhf.trainers.dpo import DPOTrainer
from rlhf_configs.dpo import dpo_experiment

STEPS = 5


def install_kill_switch(kill_at: int) -> None:
    step = DPOTrainer.step
    done = []

    def step_then_die(self, batch):
        out = step(self, batch)
        done.append(1)
        if self.restored_step + len(done) == kill_at + 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    restore = DPOTrainer.restore

    def remember(self, checkpoints, ctx):
        self.restored_step = restore(self, checkpoints, ctx)
        return self.restored_step

    DPOTrainer.restored_step = 0
    DPOTrainer.step, DPOTrainer.restore = step_then_die, remember


if __name__ == "__main__":
    torch.set_num_threads(1)
    model, train, val, out = sys.argv[1:]
    if os.environ.get("KILL_AT"):
        install_kill_switch(int(os.environ["KILL_AT"]))
    graph = dpo_experiment(model, train, val, out=out, local=True, progress=False, steps=STEPS, batch_size=8,
                           micro_batch_size=2, lr=1e-3, warmup_steps=1, test_freq=2, save_freq=1)
    graph.run_name = "job"
    run_experiment(graph)
