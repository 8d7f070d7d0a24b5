"""Probe a model before training: greedy answers to held-out rows, how right they are, and how long.

A recipe's response budget (`max_new_tokens`) must leave room for the model's own way of answering:
a budget that cuts off the base model's right answers teaches it nothing but to guess. `ProbeJob`
generates greedily (one response per row, `GenerationStage`), scores every response with the reward,
and reports

    strict_accuracy    share of responses with score >= 1 (right, in the asked-for format)
    lenient_accuracy   share with the scorer's "lenient" >= 1 (right, format aside), where the scorer
                       reports one (`FinalAnswerScorer`, reasoning-gym); else the strict accuracy
    format_rate        share with "format" = 1, where the scorer reports it; else None
    length             response tokens (EOS included, as `response_lengths`): median, p90, max, mean
    budgets            for each budget B, the share of responses longer than B tokens (cut, as the
                       metric `response_length/clip_ratio` counts them)
    recommended_budget the smallest budget that cuts at most `max_cut` (5%) of the responses

Responses that reached the probe's own `max_new_tokens` have an unknown true length: a budget at or
above it is then only a lower bound on what it cuts (`lower_bound`), and it is never recommended.

With `samples` = K > 0 it also samples K responses per row at the training temperature and reports
what GRPO could learn from (`samples_report`): GRPO learns only from a group whose samples score
differently, and by reweighting what the model already samples, so

    accuracy           share of sampled responses with score >= 1
    pass_at_k          share of rows with at least one of the K right: what sampling reaches
    signal_share       share of rows whose K samples do not all score alike (a group with a signal)
    right_and_wrong    share of rows with at least one right and one wrong sample

A task where few rows have a signal gives a GRPO step of P prompts about P x signal_share groups
to learn from; one whose pass@K is near the greedy accuracy has little for it to reweight.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlhf.data.files import read_rows
from rlhf.rewards.manager import Reward
from rlhf.trainers.context import StageContext
from rlhf.ranges import NonNegativeInt, PositiveFloat, PositiveInt
from rlhf.trainers.eval_job import per_row, reward_generations, write_json
from rlhf.trainers.generate import GenerationStage

REPORT_FILE = "probe.json"


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    """median, p90 (numpy's linear interpolation), max and mean of `lengths` (tokens)."""
    values = np.asarray(lengths, dtype=np.float64)
    return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90)),
            "max": int(values.max()), "mean": float(values.mean())}


def budget_cuts(lengths: Sequence[int], budgets: Sequence[int], max_new_tokens: int) -> list[dict[str, Any]]:
    """For each budget B: the share of `lengths` above B, and whether that is only a lower bound (B is at or
    above the probe's limit, which some responses reached: their true length is unknown)."""
    at_limit = any(n >= max_new_tokens for n in lengths)
    return [{"budget": int(b), "cut": sum(n > b for n in lengths) / len(lengths),
             "lower_bound": at_limit and b >= max_new_tokens} for b in sorted(budgets)]


def recommendation(cuts: Sequence[Mapping[str, Any]], max_cut: float, max_new_tokens: int) -> tuple[int | None, str]:
    """(the smallest budget cutting at most `max_cut` of the responses, or None; the one line that says so)."""
    for row in cuts:
        if row["cut"] <= max_cut and not row["lower_bound"]:
            return row["budget"], (f"max_new_tokens={row['budget']}: the smallest budget that cuts <= {max_cut:.0%} of "
                                   f"the responses ({row['cut']:.1%})")
    return None, (f"no budget in {[row['budget'] for row in cuts]} cuts <= {max_cut:.0%} of the responses; probe "
                  f"again with larger --budgets (and --max-new-tokens above them; now {max_new_tokens})")


def _share(values: Sequence[float]) -> float:
    return sum(v >= 1.0 for v in values) / len(values)


def lenient_scores(scores: Sequence[float], extras: Mapping[str, Sequence[Any]]) -> list[float]:
    """Each response's lenient score (right, format aside), where its scorer reports one; else its score."""
    return [s if v is None else float(v) for s, v in zip(scores, extras.get("lenient") or [None] * len(scores))]


def probe_report(
    rows: Sequence[Mapping], scores: Sequence[float], extras: Mapping[str, Sequence[Any]],
    budgets: Sequence[int], max_new_tokens: int, max_cut: float = 0.05,
) -> dict[str, Any]:
    """The probe's numbers (module docstring) from generation rows (one response each), their scores and the
    reward's extra columns (`RewardOutput.extras`; a row whose scorer did not report a column has None)."""
    lenient = lenient_scores(scores, extras)
    formats = [v for v in extras.get("format") or [] if v is not None]
    lengths = [int(row["response_lengths"][0]) for row in rows]
    cuts = budget_cuts(lengths, budgets, max_new_tokens)
    budget, line = recommendation(cuts, max_cut, max_new_tokens)
    by_source: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_source.setdefault(row["data_source"], []).append(i)
    return {
        "rows": len(rows), "max_new_tokens": max_new_tokens,
        "strict_accuracy": _share(scores), "lenient_accuracy": _share(lenient),
        "lenient_reported": "lenient" in extras, "format_rate": sum(formats) / len(formats) if formats else None,
        "length": length_stats(lengths), "at_limit": sum(n >= max_new_tokens for n in lengths) / len(lengths),
        "budgets": cuts, "max_cut": max_cut, "recommended_budget": budget, "recommendation": line,
        "by_source": {source: {"rows": len(ix), "strict_accuracy": _share([scores[i] for i in ix]),
                               "lenient_accuracy": _share([lenient[i] for i in ix])}
                      for source, ix in sorted(by_source.items())},
    }


def samples_report(scores: Sequence[Sequence[float]], temperature: float, max_new_tokens: int,
                   lenient: Sequence[Sequence[float]] | None = None) -> dict[str, Any]:
    """What GRPO could learn from (module docstring), from each row's K sample scores (right: score >= 1) and,
    where the scorer reports them, their lenient scores (right format aside: `lenient_pass_at_k`,
    `lenient_right_and_wrong`, for a reward that pays something for a right answer in another form)."""
    if not scores or not all(scores):
        raise ValueError("samples_report: every row needs at least one sampled score")
    right = [[s >= 1.0 for s in row] for row in scores]
    report = {
        "k": len(scores[0]), "temperature": temperature, "max_new_tokens": max_new_tokens, "rows": len(scores),
        "accuracy": sum(map(sum, right)) / sum(map(len, right)),
        "pass_at_k": sum(any(r) for r in right) / len(right),
        "signal_share": sum(max(row) != min(row) for row in scores) / len(scores),
        "right_and_wrong": sum(any(r) and not all(r) for r in right) / len(right),
    }
    if lenient is not None:
        loose = [[s >= 1.0 for s in row] for row in lenient]
        report["lenient_pass_at_k"] = sum(any(r) for r in loose) / len(loose)
        report["lenient_right_and_wrong"] = sum(any(r) and not all(r) for r in loose) / len(loose)
    return report


def format_report(report: Mapping[str, Any]) -> str:
    """The report as a few lines for the terminal."""
    length, fmt = report["length"], report["format_rate"]
    lines = [
        f"probe: {report['rows']} rows, greedy, max_new_tokens {report['max_new_tokens']}",
        f"accuracy: strict {report['strict_accuracy']:.1%}, lenient {report['lenient_accuracy']:.1%}"
        + ("" if report["lenient_reported"] else " (the scorer reports no lenient score: strict)")
        + (f", answer format followed {fmt:.1%}" if fmt is not None else ""),
        f"response tokens: median {length['median']:g}, p90 {length['p90']:g}, max {length['max']} "
        f"({report['at_limit']:.1%} reached max_new_tokens)",
        "budget  cut",
        *(f"{row['budget']:>6}  {row['cut']:.1%}{' or more' if row['lower_bound'] else ''}" for row in report["budgets"]),
        f"recommendation: {report['recommendation']}",
    ]
    sampled = report.get("samples")
    if sampled:
        lines += [
            f"sampled: {sampled['k']} per row at temperature {sampled['temperature']:g}, max_new_tokens "
            f"{sampled['max_new_tokens']}: accuracy {sampled['accuracy']:.1%}, pass@{sampled['k']} "
            f"{sampled['pass_at_k']:.1%}",
            f"GRPO signal: {sampled['signal_share']:.1%} of rows have samples that score differently "
            f"({sampled['right_and_wrong']:.1%} both right and wrong); a step of 8 prompts has about "
            f"{8 * sampled['signal_share']:.1f} groups to learn from",
        ]
        if "lenient_pass_at_k" in sampled:
            lines.append(f"format aside: pass@{sampled['k']} {sampled['lenient_pass_at_k']:.1%}, "
                         f"{sampled['lenient_right_and_wrong']:.1%} of rows both right and wrong")
    return "\n".join(lines)


class ProbeJob:
    """Generate greedily with a model on rows, score, and report accuracy, lengths and what budgets cut."""

    def __init__(
        self,
        generation: GenerationStage,  # greedy, n=1; its max_new_tokens should exceed the largest budget
        reward: Reward,  # scores every response; "lenient"/"format" extras are reported where it gives them
        budgets: Sequence[int] = (16, 32, 64, 128, 256),  # the max_new_tokens values to judge
        out: str | None = None,  # the JSON report; None: <stage out_dir>/probe.json
        max_cut: float = 0.05,  # the share of cut responses the recommended budget may leave
        samples: NonNegativeInt = 0,  # K responses per row sampled at `temperature` as well (samples_report); 0: none
        temperature: PositiveFloat = 0.7,  # the sampled responses' temperature: the one training will sample at
        samples_max_new_tokens: PositiveInt | None = None,  # their limit (training's budget); None: the greedy one's
    ):
        if generation.sampling.n != 1:
            raise ValueError(f"ProbeJob: the generation must give one response per row, got n={generation.sampling.n}")
        if not budgets or min(budgets) < 1:
            raise ValueError(f"ProbeJob: budgets must be positive integers, got {list(budgets)}")
        self.generation = generation
        self.reward = reward
        self.budgets = tuple(sorted({int(b) for b in budgets}))
        self.out = out
        self.max_cut = max_cut
        self.samples = samples
        self.temperature = temperature
        self.samples_max_new_tokens = samples_max_new_tokens

    def sampled(self, report_path: Path) -> GenerationStage:
        """The greedy generation's twin (the same workers and rows) that samples `samples` per row, into
        `<report>.samples.jsonl` (resumable, like the greedy one)."""
        stage = copy.copy(self.generation)
        stage.sampling = dataclasses.replace(
            self.generation.sampling, n=self.samples, temperature=self.temperature,
            max_new_tokens=self.samples_max_new_tokens or self.generation.sampling.max_new_tokens)
        stage.output = str(report_path.with_suffix("")) + ".samples.jsonl"
        return stage

    def run(self, ctx: StageContext) -> dict:
        report_path = Path(self.out) if self.out is not None else ctx.out_dir / REPORT_FILE
        self.reward.check_sources(self.generation.dataset.data_sources)
        generated = self.generation.run(dataclasses.replace(ctx, out_dir=report_path.parent))
        rows, _ = read_rows(generated["generations"])
        limit = self.generation.sampling.max_new_tokens
        out = reward_generations(rows, self.reward, max_new_tokens=limit)
        report = {"model": self.generation.model, "generations": generated["generations"],
                  **probe_report(rows, out.scores, out.extras, self.budgets, limit, self.max_cut)}
        metrics = {f"probe/{key}": float(report[key]) for key in ("strict_accuracy", "lenient_accuracy", "at_limit")}
        metrics.update({f"probe/length/{key}": float(v) for key, v in report["length"].items()})
        if self.samples:
            stage = self.sampled(report_path)
            sampled = stage.run(dataclasses.replace(  # its metrics and records apart from the greedy pass's
                ctx, out_dir=report_path.parent, name=f"{ctx.name} samples",
                log=lambda m, step: ctx.log({f"samples/{k}": v for k, v in m.items()}, step),
                record=lambda params: ctx.record({"samples": dict(params)})))
            sampled_rows = read_rows(sampled["generations"])[0]
            scored = reward_generations(sampled_rows, self.reward, max_new_tokens=stage.sampling.max_new_tokens)
            lenient = per_row(sampled_rows, lenient_scores(scored.scores, scored.extras)) \
                if "lenient" in scored.extras else None
            report["samples"] = {"generations": sampled["generations"],
                                 **samples_report(per_row(sampled_rows, scored.scores), self.temperature,
                                                  stage.sampling.max_new_tokens, lenient)}
            metrics.update({f"probe/samples/{key}": float(report["samples"][key])
                            for key in ("accuracy", "pass_at_k", "signal_share", "right_and_wrong")})
        write_json(report_path, report)
        ctx.log(metrics, 0)
        print(format_report(report) + f"\nreport: {report_path}")
        return {"report": str(report_path), "metrics": metrics, "generations": generated["generations"]}
