"""Toy stages for experiment-runner tests: real objects with the trainer interface."""

from pathlib import Path


class WriteStage:
    """Writes `text` to a file in its output dir and returns it as its checkpoint."""

    def __init__(self, text: str, group=None):
        self.text, self.group = text, group

    def run(self, ctx):
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        path = ctx.out_dir / "ckpt.txt"
        path.write_text(self.text)
        ctx.log({"val-core/toy/reward/mean@1": float(len(self.text))}, 1)
        return {"checkpoint": str(path), "metrics": {"val-core/toy/reward/mean@1": float(len(self.text))}}


class ReadStage:
    def __init__(self, checkpoint: str):
        self.checkpoint = checkpoint

    def run(self, ctx):
        return {"metrics": {"read": float(len(Path(self.checkpoint).read_text()))}}


class InterruptStage:
    def run(self, ctx):
        ctx.log({"x": 1.0}, 1)
        raise KeyboardInterrupt


def checked(path: str) -> str:
    return path


def _fail(arguments):
    raise FileNotFoundError(f"no such thing: {arguments['path']}")


checked.preflight = _fail
