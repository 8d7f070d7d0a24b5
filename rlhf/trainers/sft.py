"""The SFT trainer: supervised fine-tuning of the policy group on response tokens only."""

from __future__ import annotations

import time

from tqdm.auto import tqdm

from rlhf.data.sft import SFTDataset
from rlhf.trainers.context import StageContext
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.metrics import mean_over_ranks


class SFTTrainer:
    """Trains the policy group (built with an SFTObjective) for `total_steps` batches."""

    def __init__(
        self,
        policy,  # WorkerGroup of PolicyWorker with objective=SFTObjective()
        data: SFTDataset,
        batch_size: int = 128,  # examples per optimizer step, over all data-parallel workers
        total_steps: int = 500,
        evaluator: Evaluator | None = None,
        test_freq: int = 0,  # validate every k steps (0: only at the end); always at the end
        seed: int = 0,
    ):
        self.policy = policy
        self.data = data
        self.batch_size = batch_size
        self.total_steps = total_steps
        self.evaluator = evaluator
        self.test_freq = test_freq
        self.seed = seed

    def run(self, ctx: StageContext) -> dict:
        ctx.record({"data": {"train": self.data.fingerprint}})
        batches = self.data.shuffled(self.batch_size, self.seed)
        bar = tqdm(range(1, self.total_steps + 1), desc=ctx.name, disable=not ctx.progress, mininterval=1.0)
        metrics: dict[str, float] = {}
        for step in bar:
            start = time.perf_counter()
            metrics = mean_over_ranks(self.policy.update(next(batches)))
            metrics["timing_s/step"] = time.perf_counter() - start
            if self.evaluator is not None and (step == self.total_steps or (self.test_freq and step % self.test_freq == 0)):
                metrics.update(self.evaluator(self.policy))
            ctx.log(metrics, step)
            bar.set_postfix(loss=f"{metrics['sft/loss']:.3f}", refresh=False)
        checkpoint = self.policy.save(str(ctx.out_dir / "final"))[0]
        return {"checkpoint": checkpoint, "metrics": metrics}
