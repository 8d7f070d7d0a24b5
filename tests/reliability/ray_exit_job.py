"""A driver on a local Ray cluster it starts, for test_driver_exit.py.

usage: python ray_exit_job.py AIM_REPO MODE   (MODE: wait | raise | finish)

It ends as the command line does (`rlhf.cli.errors.one_line_errors`): an interrupt is one line.
"""

import sys

import fiddle as fdl

from ray_toys import ReportThenStage, SleepWorker
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.runtime.remote import Remote
from rlhf.tracking.aim_tracker import AimTracker

if __name__ == "__main__":
    from rlhf.cli.errors import one_line_errors
    from rlhf.cli.signals import honour_interrupts

    honour_interrupts()
    aim, mode = sys.argv[1:3]
    group = fdl.Config(Remote, worker=fdl.Config(SleepWorker), name="sleeper", num_workers=1)
    with one_line_errors():  # as the command line ends: one line
        run_experiment(fdl.Config(
            Experiment, name="exit", stages={"wait": fdl.Config(ReportThenStage, group=group, mode=mode)},
            runtime=fdl.Config(RayRuntime, num_cpus=1), tracker=fdl.Config(AimTracker, repo=aim, experiment="exit"),
            output_dir=aim + "-out", progress=False,
        ))
