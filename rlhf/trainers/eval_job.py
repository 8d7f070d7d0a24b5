"""Evaluation job: score n responses per prompt and report mean@n, pass@k, maj@k, best@k per data source.

Input is a generations file (what `rlhf generate` writes: verl-schema rows with a `responses`
list), or a `GenerationStage` that writes one first. Every response is scored by the reward
manager (dispatching on `data_source`); the per-prompt metrics of `rlhf.trainers.eval_metrics`
are averaged over the prompts of each data source, with percentile-bootstrap confidence
intervals over prompts. The report goes to the terminal (a rich table), to
`<out_dir>/eval_results.json`, to the stage's tracking run (`ctx.log`, verl's metric names), and
to a plot `<out_dir>/accuracy_vs_k.png`.

Metric names (verl's `val-core`/`val-aux` split: the headline numbers at the full sample
count are "core", the rest "aux"; pass@k is not in verl and is "core" at every k):

    val-core/<ds>/reward/mean@<n>        mean score over all n responses
    val-core/<ds>/reward/pass@<k>        unbiased pass@k (a response is correct if score >= correct_score)
    val-core/<ds>/reward/maj@<n>/mean    majority vote over all n responses (needs an answer extractor)
    val-core/<ds>/reward/best@<n>/mean   the best of all n scores
    val-aux/<ds>/reward/maj@<k>/mean     expected majority vote of k < n responses
    val-aux/<ds>/reward/best@<k>/mean    expected best score of k < n responses
    val-aux/<ds>/reward/std@<n>          per-prompt standard deviation of the n scores, averaged
    val-aux/<ds>/reward/<metric>/ci_low, .../ci_high   bootstrap interval of each metric above
                                         (<metric> without "/mean": pass@4, maj@4, mean@8)
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlhf.data.files import fingerprint_rows, read_rows
from rlhf.data.schema import ground_truth
from rlhf.rewards.manager import Reward, RewardOutput
from rlhf.rewards.registry import EXTRACTORS, Extractor, rule_key
from rlhf.trainers.context import StageContext
from rlhf.trainers.eval_metrics import best_at_k, bootstrap_ci, maj_at_k, mean_at_n, pass_at_k
from rlhf.trainers.generate import GenerationStage

RESULTS_FILE = "eval_results.json"
PLOT_FILE = "accuracy_vs_k.png"


# ------------------------------------------------------------------------------ the report


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A metric over prompts and its bootstrap interval."""

    value: float
    ci_low: float
    ci_high: float


@dataclasses.dataclass
class SourceResult:
    """The metrics of one data source, keyed by verl's short names ("mean@8", "pass@4", "maj@4/mean")."""

    data_source: str
    num_prompts: int
    n: int
    metrics: dict[str, Estimate]
    notes: list[str] = dataclasses.field(default_factory=list)


def reward_generations(rows: Sequence[Mapping], reward: Reward, max_new_tokens: int | None = None) -> RewardOutput:
    """The reward of every response of `rows` (flat, row after row), in one reward call, with its extras.

    max_new_tokens: the generation limit of the responses, for overlong shaping; a generations
    file does not record it, so it is known only when this job generated them.
    """
    flat = [(row, text) for row in rows for text in row["responses"]]
    lengths = None
    if all(len(row.get("response_lengths") or []) == len(row["responses"]) for row in rows):
        lengths = [n for row in rows for n in row["response_lengths"]]  # for overlong shaping
    return reward(
        [text for _, text in flat],
        [row["data_source"] for row, _ in flat],
        [ground_truth(row) for row, _ in flat],
        [row.get("extra_info") or {} for row, _ in flat],
        response_lengths=lengths,
        max_new_tokens=max_new_tokens,
    )


def score_generations(
    rows: Sequence[Mapping], reward: Reward, max_new_tokens: int | None = None
) -> tuple[list[list[float]], dict[str, float]]:
    """Each row's response scores (scored in one reward call, by data_source), and the reward's metrics
    (`reward_generations`)."""
    out = reward_generations(rows, reward, max_new_tokens)
    return per_row(rows, out.scores), dict(out.metrics)


def per_row(rows: Sequence[Mapping], flat: Sequence[Any]) -> list[list[Any]]:
    """`flat` values (one per response, row after row, as `reward_generations` scores them), one list per row."""
    out, start = [], 0
    for row in rows:
        out.append(list(flat[start : start + len(row["responses"])]))
        start += len(row["responses"])
    return out


def evaluate_scores(
    rows: Sequence[Mapping],
    scores: Sequence[Sequence[float]],
    ks: Sequence[int] = (1, 2, 4, 8),
    extractors: Mapping[str, Extractor] = EXTRACTORS,
    correct_score: float = 1.0,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, SourceResult]:
    """Per data source: mean@n, std@n, pass@k, best@k/mean, maj@k/mean (k in `ks`, k <= n), each
    the mean over prompts of the per-prompt value, with a bootstrap interval over prompts."""
    by_source: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        by_source[row["data_source"]].append(i)
    results = {}
    for source, indices in sorted(by_source.items()):
        sizes = {len(scores[i]) for i in indices}
        if len(sizes) != 1:
            raise ValueError(
                f"data_source {source!r}: prompts have different numbers of responses {sorted(sizes)}; "
                "pass@k and maj@k need the same n for every prompt"
            )
        n = sizes.pop()
        notes = [f"k={k} skipped: only n={n} responses per prompt" for k in ks if k > n]
        use_ks = sorted({k for k in ks if k <= n})
        per_prompt: dict[str, list[float]] = defaultdict(list)
        key = rule_key(extractors, source)
        extract = extractors[key] if key is not None else None
        if extract is None and use_ks:
            notes.append(f"no maj@k: no answer extractor for data_source {source!r}")
        for i in indices:
            s = [float(x) for x in scores[i]]
            correct = sum(x >= correct_score for x in s)
            per_prompt[f"mean@{n}"].append(mean_at_n(s))
            for k in use_ks:
                per_prompt[f"pass@{k}"].append(pass_at_k(n, correct, k))
            if extract is not None:
                answers = [extract(text) for text in rows[i]["responses"]]
                for k in use_ks:
                    per_prompt[f"maj@{k}/mean"].append(maj_at_k(answers, s, k, seed=seed))
            for k in use_ks:
                per_prompt[f"best@{k}/mean"].append(best_at_k(s, k))
            per_prompt[f"std@{n}"].append(float(np.std(s)))
        metrics = {}
        for name, values in per_prompt.items():
            low, high = bootstrap_ci(values, np.mean, n_boot=n_boot, alpha=alpha, seed=seed)
            metrics[name] = Estimate(float(np.mean(values)), low, high)
        results[source] = SourceResult(source, len(indices), n, metrics, notes)
    return results


def metric_names(results: Mapping[str, SourceResult]) -> dict[str, float]:
    """The flat `val-core/...`, `val-aux/...` metrics (see the module docstring)."""
    flat: dict[str, float] = {}
    for source, result in results.items():
        n = result.n
        core = {f"mean@{n}", f"maj@{n}/mean", f"best@{n}/mean"}
        for short, est in result.metrics.items():
            section = "val-core" if short in core or short.startswith("pass@") else "val-aux"
            flat[f"{section}/{source}/reward/{short}"] = est.value
            if not short.startswith("std@"):
                base = short.removesuffix("/mean")
                flat[f"val-aux/{source}/reward/{base}/ci_low"] = est.ci_low
                flat[f"val-aux/{source}/reward/{base}/ci_high"] = est.ci_high
    return flat


def _order(short: str) -> tuple[int, int]:
    family, _, k = short.partition("@")
    rank = {"mean": 0, "pass": 1, "maj": 2, "best": 3, "std": 4}.get(family, 5)
    return rank, int(k.split("/")[0]) if k.split("/")[0].isdigit() else 0


def results_table(results: Mapping[str, SourceResult], alpha: float = 0.05):
    """A rich Table: one row per (data source, metric), with its bootstrap interval."""
    from rich.table import Table

    table = Table(title="evaluation")
    for column, justify in [("data source", "left"), ("prompts", "right"), ("n", "right"), ("metric", "left"),
                            ("value", "right"), (f"{100 * (1 - alpha):g}% CI", "right")]:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for source, result in results.items():
        for j, short in enumerate(sorted(result.metrics, key=_order)):
            est = result.metrics[short]
            first = j == 0
            table.add_row(source if first else "", str(result.num_prompts) if first else "",
                          str(result.n) if first else "", short, f"{est.value:.4f}",
                          f"[{est.ci_low:.4f}, {est.ci_high:.4f}]")
        table.add_section()
    return table


def plot_accuracy_vs_k(results: Mapping[str, SourceResult], path: Path) -> Path:
    """pass@k and maj@k against k (log2 axis), one panel per data source, bootstrap bands shaded.

    Uses matplotlib's object API with the Agg canvas: no pyplot state, no display needed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.5 * len(results), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(results), squeeze=False)[0]
    for ax, (source, result) in zip(axes, results.items()):
        for family, name, marker in (("pass", "pass@{}", "o"), ("maj", "maj@{}/mean", "s")):
            ks = sorted(_order(s)[1] for s in result.metrics if s.startswith(f"{family}@"))
            if not ks:
                continue
            est = [result.metrics[name.format(k)] for k in ks]
            ax.plot(ks, [e.value for e in est], marker=marker, label=f"{family}@k")
            ax.fill_between(ks, [e.ci_low for e in est], [e.ci_high for e in est], alpha=0.2)
        mean = result.metrics[f"mean@{result.n}"]
        ax.axhline(mean.value, linestyle="--", color="gray", label=f"mean@{result.n}")
        ax.set_xscale("log", base=2)
        ticks = sorted(_order(s)[1] for s in result.metrics if s.startswith("pass@"))
        ax.set_xticks(ticks, labels=[str(k) for k in ticks])
        ax.minorticks_off()
        ax.set_xlabel("k")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{source} ({result.num_prompts} prompts, n={result.n})")
        ax.legend(loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    """`payload` as indented JSON at `path`, atomically (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# --------------------------------------------------------------------------------- lineage


# ------------------------------------------------------------------------------- the stage


class EvalJob:
    """Scores a generations file (or generates one first) and reports per-data-source metrics.

    Give exactly one of `generations` (a file from `rlhf generate`) and `generation` (a
    `GenerationStage` with its policy group; its output defaults to `<out_dir>/generations.jsonl`).
    """

    def __init__(
        self,
        reward: Reward,
        generations: str | None = None,  # .jsonl/.parquet rows with a `responses` list
        generation: GenerationStage | None = None,  # generate first, then score
        ks: Sequence[int] = (1, 2, 4, 8),  # the k of pass@k, maj@k, best@k (those above n are skipped)
        extractors: Mapping[str, Extractor] = EXTRACTORS,  # data_source -> answer for maj@k (rlhf.rewards.registry)
        out_dir: str | None = None,  # report, plot (and generations); None: the stage's output folder
        correct_score: float = 1.0,  # a response is correct (pass@k) when its score is at least this
        n_boot: int = 1000,  # bootstrap resamples of the prompts
        alpha: float = 0.05,  # intervals are (1 - alpha) percentile intervals
        seed: int = 0,  # bootstrap and maj@k subset sampling
        plot: bool = True,  # write accuracy_vs_k.png (needs matplotlib)
        parent_run: str | None = None,  # the Aim run that made the model or file (see producer_run)
    ):
        if (generations is None) == (generation is None):
            raise ValueError("EvalJob: give exactly one of `generations` (a file) and `generation` (generate first)")
        if not ks or min(ks) < 1:
            raise ValueError(f"EvalJob: ks must be positive integers, got {list(ks)}")
        self.reward = reward
        self.generations = generations
        self.generation = generation
        self.ks = tuple(sorted({int(k) for k in ks}))
        self.extractors = dict(extractors)
        self.out_dir = out_dir
        self.correct_score = correct_score
        self.n_boot = n_boot
        self.alpha = alpha
        self.seed = seed
        self.plot = plot
        self.parent_run = parent_run

    @staticmethod
    def preflight(arguments: dict) -> None:
        """Before any stage runs: a generations file given as a path must exist."""
        path = arguments.get("generations")
        if isinstance(path, str) and not Path(path).is_file():
            raise FileNotFoundError(f"no generations file {path!r} (write one with `rlhf generate`)")

    @staticmethod
    def input_files(arguments: dict) -> list[str]:
        """The generations file whose contents a named run records (rlhf.runtime.run_record)."""
        path = arguments.get("generations")
        return [path] if isinstance(path, str) else []

    def run(self, ctx: StageContext) -> dict:
        out_dir = Path(self.out_dir) if self.out_dir is not None else ctx.out_dir
        if self.parent_run is not None:
            ctx.record({"parent_run": self.parent_run})
        if self.generation is not None:
            self.reward.check_sources(self.generation.dataset.data_sources)
            generated = self.generation.run(dataclasses.replace(ctx, out_dir=out_dir))
            path = generated["generations"]
        else:
            path = self.generations
        rows = _read_generations(path)
        self.reward.check_sources({r["data_source"] for r in rows})
        ctx.record({"data": {"eval": fingerprint_rows(rows)}, "eval_generations": str(path)})
        limit = self.generation.sampling.max_new_tokens if self.generation is not None else None
        scores, reward_metrics = score_generations(rows, self.reward, max_new_tokens=limit)
        results = evaluate_scores(
            rows, scores, self.ks, self.extractors, self.correct_score, self.n_boot, self.alpha, self.seed
        )
        metrics = {**metric_names(results), **reward_metrics}
        ctx.log(metrics, 0)

        from rich.console import Console

        console = Console()
        console.print(results_table(results, self.alpha))
        for result in results.values():
            for note in result.notes:
                console.print(f"[yellow]{result.data_source}: {note}[/yellow]")
        for key, what in (("reward/errors", "responses could not be scored and got the fallback score"),
                          ("reward/extra_nonfinite", "extra values returned by the scorer were NaN or infinite")):
            if reward_metrics.get(key):
                console.print(f"[yellow]{int(reward_metrics[key])} {what} ({key})[/yellow]")
        plot = None
        if self.plot:
            try:
                plot = str(plot_accuracy_vs_k(results, out_dir / PLOT_FILE))
            except ImportError:
                warnings.warn("matplotlib is not installed: no accuracy_vs_k.png (pip install matplotlib)")
        report = out_dir / RESULTS_FILE
        write_json(report, {
            "generations": str(path),
            "ks": list(self.ks),
            "correct_score": self.correct_score,
            "bootstrap": {"n_boot": self.n_boot, "alpha": self.alpha, "seed": self.seed},
            "parent_run": self.parent_run,
            "sources": {
                source: {
                    "prompts": r.num_prompts,
                    "n": r.n,
                    "metrics": {k: dataclasses.asdict(v) for k, v in sorted(r.metrics.items(), key=lambda kv: _order(kv[0]))},
                    "notes": r.notes,
                }
                for source, r in results.items()
            },
            "metrics": metrics,
        })
        console.print(f"report: {report}" + (f"\nplot:   {plot}" if plot else ""))
        return {"metrics": metrics, "report": str(report), "plot": plot, "generations": str(path)}


def _read_generations(path: str | Path) -> list[dict]:
    rows, _ = read_rows(path)
    for i, row in enumerate(rows):
        responses = row.get("responses")
        if not isinstance(responses, list) or not responses or not all(isinstance(t, str) for t in responses):
            raise ValueError(
                f"{path}, row {i}: no `responses` list of strings; an eval input is the output of `rlhf generate` "
                "(the prompt rows plus the n responses of each)"
            )
    return rows

