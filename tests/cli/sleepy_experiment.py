"""An experiment whose one stage says it is running, then waits: for the Ctrl-C test of the command line."""

import time

import fiddle as fdl

from rlhf.runtime.experiment import Experiment


class SleepStage:
    def run(self, ctx):
        print("running", flush=True)
        time.sleep(60)
        return {"metrics": {}}


def base(out: str = "outputs") -> fdl.Config:
    return fdl.Config(Experiment, name="sleepy", stages={"wait": fdl.Config(SleepStage)}, output_dir=out,
                      run_name="job", progress=False)
