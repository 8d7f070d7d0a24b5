"""Validation and evaluation: generate on held-out prompts, score, report per data source."""

from __future__ import annotations

from collections import defaultdict

from rlhf.data.prompts import PromptDataset
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.trainers.context import StageContext
from rlhf.trainers.scoring import score_rollout


class Evaluator:
    """Scores a policy on a held-out dataset.

    Metrics: `val-core/<data_source>/reward/mean@<n>` for the main reward, and
    `val-aux/<data_source>/<name>/mean@<n>` for each auxiliary reward (e.g. GSM8K's flexible
    last-number scoring beside the strict `#### N` one), all from the same generations.
    """

    def __init__(
        self,
        dataset: PromptDataset,
        reward: RewardManager,
        sampling: SamplingParams = SamplingParams(temperature=0.0, max_new_tokens=32),  # greedy
        batch_size: int = 512,  # prompts per generate call
        aux_rewards: dict[str, RewardManager] | None = None,  # name -> another scoring of the same responses
    ):
        sources = set(r["data_source"] for r in dataset.rows)
        for manager in [reward, *(aux_rewards or {}).values()]:
            manager.check_sources(sources)
        self.dataset = dataset
        self.reward = reward
        self.sampling = sampling
        self.batch_size = batch_size
        self.aux_rewards = dict(aux_rewards or {})

    def __call__(self, policy) -> dict[str, float]:
        values: dict[str, list[float]] = defaultdict(list)
        n = self.sampling.n
        for prompts in self.dataset.in_order(self.batch_size):
            rollout = policy.generate(prompts, self.sampling)
            scorings = {("val-core", "reward"): self.reward, **{("val-aux", k): m for k, m in self.aux_rewards.items()}}
            for (prefix, name), manager in scorings.items():
                scores, _ = score_rollout(rollout, self.dataset.tokenizer, manager)
                for source, score in zip(rollout["data_source"], scores["scores"].tolist()):
                    values[f"{prefix}/{source}/{name}/mean@{n}"].append(score)
        return {k: sum(v) / len(v) for k, v in sorted(values.items())}


class EvalStage:
    """An evaluation stage: one policy (e.g. a checkpoint from an earlier stage), one evaluator."""

    def __init__(self, policy, evaluator: Evaluator):
        self.policy = policy
        self.evaluator = evaluator

    def run(self, ctx: StageContext) -> dict:
        ctx.record({"data": {"eval": self.evaluator.dataset.fingerprint}})
        metrics = self.evaluator(self.policy)
        ctx.log(metrics, 0)
        return {"metrics": metrics}
