"""Validation and evaluation: generate on held-out prompts, score, report per data source."""

from __future__ import annotations

from collections import defaultdict

from rlhf.ranges import PositiveInt
from rlhf.data.prompts import PromptDataset
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.trainers.answer_spread import answer_spread
from rlhf.trainers.context import StageContext
from rlhf.trainers.eval_job import evaluate_scores, metric_names
from rlhf.trainers.metrics import response_lengths
from rlhf.trainers.rollout_producer import RolloutProducer, SingleTurn
from rlhf.trainers.scoring import score_rollout


class Evaluator:
    """Scores a policy on a held-out dataset: greedy (n=1) or sampled (n>1) validation.

    Per data source, with bootstrap intervals over prompts (same math and names as `rlhf eval`):
    `val-core/<source>/reward/mean@<n>`, and for n > 1 `pass@<k>` (unbiased), `maj@<k>/mean`,
    `best@<k>/mean` for k = 1, 2, 4, ... <= n; `val-aux/<source>/<name>/mean@<n>` for each
    auxiliary reward (e.g. GSM8K's flexible last-number scoring beside the strict one), all
    from the same generations. The reward's own metrics go under `val-aux/`, as training logs
    them under their plain names: counts summed over the validation set (`val-aux/reward/errors`,
    the rows a `strict=False` manager gave its fallback score, `.../errors/<source>`,
    `val-aux/reward/extra_nonfinite`, NaN/inf extra values), other values averaged over rows; an
    auxiliary reward's the same under its name (`val-aux/<name>/reward/errors`). How spread out the answers
    are, `val-aux/<source>/answers/top_share`, `.../distinct` and `.../truth_top_share`
    (rlhf.trainers.answer_spread): a policy that learnt to guess gives a few answers to every question. For
    single-turn rollouts, the share of each source's responses that reached the response budget
    (`val-aux/<source>/response_length/clip_ratio`, length >= `sampling.max_new_tokens`): an answer cut there
    loses its end, where the final answer is written.
    """

    def __init__(
        self,
        dataset: PromptDataset,
        reward: RewardManager,
        sampling: SamplingParams = SamplingParams(temperature=0.0, max_new_tokens=32),  # greedy
        prompts_per_call: PositiveInt = 512,  # prompts per generate call (x sampling.n rows), over all workers
        aux_rewards: dict[str, RewardManager] | None = None,  # name -> another scoring of the same responses
        n_boot: int = 200,  # bootstrap resamples for the intervals (0: no intervals)
        rollout: RolloutProducer = SingleTurn(),  # one generate, or rlhf.agents.AgentRollout (multi-turn, with tools)
    ):
        sources = dataset.data_sources
        for manager in [reward, *(aux_rewards or {}).values()]:
            manager.check_sources(sources)
            manager.check_generation_limit(sampling.max_new_tokens)
        self.dataset = dataset
        self.reward = reward
        self.sampling = sampling
        self.prompts_per_call = prompts_per_call
        self.aux_rewards = dict(aux_rewards or {})
        self.n_boot = n_boot
        self.rollout = rollout
        self.ks = [2**i for i in range(sampling.n.bit_length()) if 2**i <= sampling.n]

    @property
    def main_metric(self) -> str | None:
        """The main reward mean, `val-core/<source>/reward/mean@<n>`, when the held-out rows have one data
        source (what RL ranks its evaluations by); None with several (the trainer must be told which)."""
        sources = sorted(self.dataset.data_sources)
        return f"val-core/{sources[0]}/reward/mean@{self.sampling.n}" if len(sources) == 1 else None

    def __call__(self, policy) -> dict[str, float]:
        n = self.sampling.n
        rows: list[dict] = []
        scores: list[list[float]] = []
        aux: dict[str, list[float]] = defaultdict(list)
        produced: dict[str, list[float]] = defaultdict(list)
        at_budget: dict[str, list[bool]] = defaultdict(list)
        reward_metrics: list[tuple[dict[str, float], int]] = []
        aux_metrics: dict[str, list[tuple[dict[str, float], int]]] = defaultdict(list)
        for prompts in self.dataset.in_order(self.prompts_per_call):
            rollout, rollout_metrics = self.rollout(policy, prompts, self.sampling)  # a prompt's n samples adjacent
            for name, value in rollout_metrics.items():
                produced[name].append(value)
            if isinstance(self.rollout, SingleTurn):  # a trajectory's length is not one turn's budget
                for source, reached in budget_reached(rollout, self.sampling.max_new_tokens):
                    at_budget[source].append(reached)
            scored, call_metrics = score_rollout(rollout, self.dataset.tokenizer, self.reward)
            reward_metrics.append((call_metrics, len(rollout)))
            flat, texts = scored["scores"].tolist(), list(scored["response_text"])
            for p, source in enumerate(prompts["data_source"]):
                rows.append({"data_source": source, "responses": texts[p * n : (p + 1) * n],
                             "truth": prompts["ground_truth"][p] if "ground_truth" in prompts else None})
                scores.append(flat[p * n : (p + 1) * n])
            for name, manager in self.aux_rewards.items():
                extra, extra_metrics = score_rollout(rollout, self.dataset.tokenizer, manager)
                aux_metrics[name].append((extra_metrics, len(rollout)))
                for source, score in zip(rollout["data_source"], extra["scores"].tolist()):
                    aux[f"val-aux/{source}/{name}/mean@{n}"].append(score)
        results = evaluate_scores(rows, scores, ks=self.ks, n_boot=max(self.n_boot, 1))
        metrics = metric_names(results)
        if not self.n_boot:
            metrics = {k: v for k, v in metrics.items() if not k.endswith(("/ci_low", "/ci_high"))}
        metrics.update({k: sum(v) / len(v) for k, v in sorted(aux.items())})
        metrics.update(spread_metrics(rows))
        metrics.update({f"val-aux/{source}/response_length/clip_ratio": sum(flags) / len(flags)
                        for source, flags in sorted(at_budget.items())})
        metrics.update({f"val-aux/{k}": v for k, v in combine_reward_metrics(reward_metrics).items()})
        for name, calls in sorted(aux_metrics.items()):  # an auxiliary reward's failures count as the main one's
            metrics.update({f"val-aux/{name}/{k}": v for k, v in combine_reward_metrics(calls).items()})
        # the producer's own metrics (multi-turn: turns, tool calls), averaged over the calls
        metrics.update({f"val-aux/{k}": sum(v) / len(v) for k, v in sorted(produced.items()) if not k.startswith("timing")})
        return metrics


def budget_reached(rollout, max_new_tokens: int) -> list[tuple[str, bool]]:
    """(data source, whether the response reached `max_new_tokens`) per row of a single-turn rollout; a response's
    length is the response part of its attention mask (EOS included)."""
    lengths = response_lengths(rollout).tolist()
    return [(source, length >= max_new_tokens) for source, length in zip(rollout["data_source"], lengths)]


def spread_metrics(rows: list[dict]) -> dict[str, float]:
    """`val-aux/<source>/answers/{top_share,distinct,truth_top_share}` over each source's responses
    (rlhf.trainers.answer_spread): answers collapsing onto a few values show a policy that learnt to guess."""
    by_source: dict[str, tuple[list[str], list]] = defaultdict(lambda: ([], []))
    for row in rows:
        responses, truths = by_source[row["data_source"]]
        responses.extend(row["responses"])
        truths.append(row["truth"])
    return {f"val-aux/{source}/answers/{name}": value for source, (responses, truths) in sorted(by_source.items())
            for name, value in answer_spread(responses, truths).items()}


COUNTS = ("errors", "timeouts", "extra_nonfinite")
"""Reward metrics that count rows (summed over calls); the others are per-row values (averaged)."""


def combine_reward_metrics(calls: list[tuple[dict[str, float], int]]) -> dict[str, float]:
    """One set of reward metrics from several reward calls, given as (metrics, rows scored): counts
    (`reward/errors`, `.../errors/<source>`, `reward/timeouts`, `reward/extra_nonfinite`...) summed,
    other values averaged weighted by rows. A count a call did not report counts 0 there."""
    total = sum(rows for _, rows in calls) or 1
    combined: dict[str, float] = {}
    for metrics, rows in calls:
        for key, value in metrics.items():
            count = any(part in COUNTS for part in key.split("/"))
            combined[key] = combined.get(key, 0.0) + (value if count else value * rows / total)
    return combined


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
