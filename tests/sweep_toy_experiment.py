"""A toy experiment with real Aim runs and no model, for sweep, rerun, diff and UI tests.

`train` logs a curve `toy/loss = exp(-lr * t)` for t = 1..steps and writes a checkpoint;
`read` starts from that checkpoint (a StageOutput), like RL starting from SFT.
"""

from __future__ import annotations

import functools
import math

import fiddle as fdl

from rlhf.runtime.experiment import Experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.remote import StageOutput
from rlhf.tracking.aim_tracker import AimTracker


class CurveStage:
    """Logs exp(-lr * t) as `toy/loss`; its checkpoint is a text file holding lr."""

    def __init__(self, lr: float = 0.1, steps: int = 4):
        self.lr, self.steps = lr, steps

    def run(self, ctx):
        for t in range(1, self.steps + 1):
            ctx.log({"toy/loss": math.exp(-self.lr * t)}, t)
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        path = ctx.out_dir / "ckpt.txt"
        path.write_text(repr(self.lr))
        return {"checkpoint": str(path), "metrics": {"val-core/toy/acc/mean@1": 1 - math.exp(-self.lr * self.steps)}}


class ReadStage:
    def __init__(self, checkpoint: str, scale: float = 1.0):
        self.checkpoint, self.scale = checkpoint, scale

    def run(self, ctx):
        from pathlib import Path

        value = float(Path(self.checkpoint).read_text()) * self.scale
        ctx.log({"toy/read": value}, 1)
        return {"metrics": {"toy/read": value}}


def needs_value(value: float) -> float:
    return value


def base(repo: str = ".aim", output_dir: str = "outputs") -> fdl.Config:
    return fdl.Config(
        Experiment,
        name="toy_sweep",
        stages={
            "train": fdl.Config(CurveStage),
            "read": fdl.Config(ReadStage, checkpoint=fdl.Config(StageOutput, stage="train")),
        },
        runtime=fdl.Config(LocalRuntime),
        tracker=fdl.Config(AimTracker, repo=repo, experiment="toy_sweep"),
        output_dir=output_dir,
        progress=False,
    )


def longer(cfg, steps: int = 8) -> None:
    """More steps of the curve."""
    cfg.stages["train"].steps = steps


def lr_sweep(values=(0.1, 0.5)):
    """Two learning rates."""
    return [{"stages.train.lr": v} for v in values]


def steps_sweep():
    """Members given as fiddlers."""
    return [functools.partial(longer, steps=2), functools.partial(longer, steps=6)]


def broken_sweep():
    """The second member leaves a required argument unset."""
    return [{"stages.train.lr": 0.1}, {"stages.train.lr": fdl.Config(needs_value)}]


def not_a_list_sweep():
    return {"stages.train.lr": 0.1}
