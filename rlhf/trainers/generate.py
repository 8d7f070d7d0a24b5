"""Batch generation: `n` responses for every prompt of a dataset, written as they are made.

The output is JSON Lines: each input row (verl's schema) plus

    row_index            the row's position in the dataset (its line/row in the input file when
                         no prompt was filtered for length)
    responses            list of n response texts (special tokens such as EOS dropped)
    response_lengths     list of n response lengths in tokens (EOS included)
    prompt_length        the prompt's length in tokens, after the chat template
    generation_settings  the model (folder and a signature of its files), the dtype it computed
                         in and the sampling settings that wrote the row
    scores               list of n scores, when the stage was given a reward (a scorer)

Rows are appended one batch at a time, flushed and fsynced, so an interrupted job loses at
most the batch in flight. Run it again with the same output and it resumes: the rows already
in the file are checked (same prompt at that row_index, n responses, the same model and
dtype and sampling settings) and skipped; a partial last line left by a crash is cut off first. When
every row is done the JSON Lines file is put in row_index order (rewritten atomically only if
a resume left it out of order, or rows written without a scorer get their scores) and a parquet
copy is written next to it, atomically (temporary file + rename).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from rlhf.batch import Batch
from rlhf.data.files import write_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.schema import DataError, ground_truth, has_ground_truth
from rlhf.ranges import PositiveInt
from rlhf.rewards.manager import Reward
from rlhf.rollout.sampling import SamplingParams
from rlhf.trainers.context import StageContext
from rlhf.trainers.scoring import decode_responses, score_rollout

GENERATED_FIELDS = ("row_index", "responses", "response_lengths", "prompt_length", "generation_settings", "scores")
"""The fields generation adds to each input row (`scores` only with a reward)."""

RESPONSES_PER_CALL = 64
"""Responses per generate call and worker when `prompts_per_call` is None: progress and appends come
once per call, so calls stay short, and 64 rows keep a CPU's matmuls efficient."""


def model_signature(model: str | None) -> dict[str, Any] | None:
    """What identifies a model folder's weights cheaply: its absolute path, and a hash of its configs (an
    adapter's too) and of each weights file's name, size and last MiB (a retrained folder changes them); a
    hub id as given."""
    if model is None:
        return None
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return {"model": model}
    digest = hashlib.sha256()
    for file in sorted(folder.iterdir()):
        if file.name.endswith("config.json"):  # config.json, adapter_config.json
            digest.update(file.name.encode() + file.read_bytes())
        elif file.suffix in (".safetensors", ".bin", ".pt"):
            size = file.stat().st_size
            digest.update(f"{file.name}:{size}".encode())
            with open(file, "rb") as f:
                f.seek(max(0, size - 2**20))
                digest.update(f.read())
    return {"model": str(folder.resolve()), "signature": digest.hexdigest()[:16]}


def output_paths(output: str | Path) -> tuple[Path, Path]:
    """(JSON Lines file written incrementally, parquet copy written at the end) for `output`.

    `output` may name either one: "gens.jsonl" and "gens.parquet" both mean the pair
    (gens.jsonl, gens.parquet).
    """
    path = Path(output)
    if path.suffix not in (".jsonl", ".parquet"):
        raise ValueError(
            f"generation output {str(path)!r} must end in .jsonl or .parquet (both are written: JSON Lines "
            "as the job runs, parquet when it is done)"
        )
    return path.with_suffix(".jsonl"), path.with_suffix(".parquet")


def read_output(path: Path, dataset: PromptDataset, n: int, settings: Mapping[str, Any] | None = None) -> list[dict]:
    """The rows already generated in `path`, in file order, checked against this job.

    A last line without its newline (a write cut short) is removed from the file. Raises
    `DataError` when the file does not belong to this job: a row whose prompt differs from the
    dataset's prompt at its row_index, with a number of responses other than `n`, or (when
    `settings` is given) written by another model or with other sampling settings.
    """
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        warnings.warn(f"{path}: removing a partial last line ({len(data) - end} bytes) left by an interrupted write")
        with open(path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    rows = []
    fix = "Fix: delete the file to start over, or choose another output path."
    for line, raw in enumerate(data[:end].splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{path}, line {line}"
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: not valid JSON ({err.msg}); the output file is damaged. {fix}") from err
        index = row.get("row_index") if isinstance(row, dict) else None
        if not isinstance(index, int) or not 0 <= index < len(dataset):
            raise DataError(
                f"{where}: row_index {index!r} is not a row of the dataset ({len(dataset)} rows); this output "
                f"was written for other data (or with a larger --limit). {fix}"
            )
        if row.get("prompt") != dataset.rows[index]["prompt"]:
            raise DataError(
                f"{where}: the prompt of row_index {index} differs from the dataset's; this output was "
                f"written for other data. {fix}"
            )
        if len(row.get("responses") or []) != n:
            raise DataError(
                f"{where}: {len(row.get('responses') or [])} responses, but this job samples n={n} per prompt. "
                f"Resume with the n the file was written with, or start a new file. {fix}"
            )
        if settings is not None and row.get("generation_settings") != settings:
            raise DataError(f"{where}: {_settings_difference(row.get('generation_settings'), settings)}. Resuming "
                            f"would mix responses of two setups in one file. {fix}")
        rows.append(row)
    return rows


def _settings_difference(written: Any, wanted: Mapping[str, Any]) -> str:
    """Which of the model and sampling settings differ between a row and this job, in words."""
    if not isinstance(written, Mapping):
        return "the row does not record the model and sampling settings that wrote it (an older file)"
    keys = [k for k in dict.fromkeys([*wanted, *written]) if written.get(k) != wanted.get(k)]
    return "written with " + ", ".join(f"{k}={written.get(k)!r}" for k in keys) + "; this job has " + ", ".join(
        f"{k}={wanted.get(k)!r}" for k in keys)


def completed_rows(rows: Sequence[dict]) -> dict[int, dict]:
    """row_index -> row; the first copy wins where a row appears twice."""
    done: dict[int, dict] = {}
    for row in rows:
        done.setdefault(row["row_index"], row)
    return done


def _chunks(items: Sequence[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _append(f, rows: list[dict]) -> None:
    """Append whole lines, then flush and fsync: a crash loses nothing already appended."""
    if not rows:
        return
    f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    f.flush()
    os.fsync(f.fileno())


class GenerationStage:
    """Generates `sampling.n` responses for every prompt of `dataset` with the policy group.

    The group call shards each batch over the data-parallel workers. Metrics per batch go to
    `ctx.log` at step = prompts done: `response_length/{mean,max,min,clip_ratio}`,
    `prompt_length/mean`, `timing_s/gen`, `perf/throughput` (prompt + response tokens per
    second per worker, as in the RL trainer) and `perf/gen_tokens_per_s` (response tokens per
    second, all workers); with a `reward`, `generate/score/mean` and the reward's own metrics
    (`reward/errors`...). Each row records the model and sampling settings that wrote it, so a
    resume with another model, temperature or length limit is refused.
    """

    def __init__(
        self,
        policy,  # WorkerGroup of PolicyWorker (inference only is enough)
        dataset: PromptDataset,
        sampling: SamplingParams = SamplingParams(),
        output: str | None = None,  # .jsonl (or .parquet) path; None: <stage out_dir>/generations.jsonl
        prompts_per_call: PositiveInt | None = None,  # over all workers; None: RESPONSES_PER_CALL responses per worker
        write_every: PositiveInt = 1,  # batches per append + fsync: a crash loses at most this many batches
        parent_run: str | None = None,  # the Aim run that trained the model, recorded as this run's parent
        reward: Reward | None = None,  # scores every response (a `scores` list per row); None: no scoring
        model: str | None = None,  # the model folder (or hub id) the policy generates with, recorded in each row
        dtype: str | None = None,  # the dtype the policy computes in, recorded in each row; None: not recorded
    ):
        if (prompts_per_call is not None and prompts_per_call < 1) or write_every < 1:
            raise ValueError(f"prompts_per_call and write_every must be >= 1, got {prompts_per_call} and {write_every}")
        if output is not None:
            output_paths(output)  # fail now on a bad suffix
        self.policy = policy
        self.dataset = dataset
        self.sampling = sampling
        self.output = output
        self.prompts_per_call = prompts_per_call
        self.write_every = write_every
        self.parent_run = parent_run
        self.reward = reward
        self.model = model
        self.dtype = dtype
        if reward is not None:
            reward.check_sources(dataset.data_sources)
            reward.check_generation_limit(sampling.max_new_tokens)

    def output_path(self, ctx: StageContext) -> Path:
        return output_paths(self.output or ctx.out_dir / "generations.jsonl")[0]

    def settings(self) -> dict[str, Any]:
        """What each row records about how it was made: the model, its dtype and the sampling settings."""
        dtype = {"dtype": self.dtype} if self.dtype is not None else {}
        return {**(model_signature(self.model) or {"model": None}), **dtype, **dataclasses.asdict(self.sampling)}

    def calls(self, pending: Sequence[int]) -> Iterator[list[int]]:
        """The prompt indices of each generate call."""
        per_call = self.prompts_per_call or max(1, RESPONSES_PER_CALL * self.policy.world_size // self.sampling.n)
        return _chunks(pending, per_call)

    def run(self, ctx: StageContext) -> dict:
        path = self.output_path(ctx)
        path.parent.mkdir(parents=True, exist_ok=True)
        settings = self.settings()
        done = completed_rows(read_output(path, self.dataset, self.sampling.n, settings))
        pending = [i for i in range(len(self.dataset)) if i not in done]
        ctx.record({"data": {"generate": self.dataset.fingerprint}, "generations": str(path)})
        if self.parent_run is not None:
            ctx.record({"parent_run": self.parent_run})
        bar = tqdm(total=len(self.dataset), initial=len(done), desc=ctx.name, unit="prompt",
                   disable=not ctx.progress, mininterval=1.0)
        totals = {"gen_tokens": 0.0, "seconds": 0.0, "prompts": 0}
        buffered: list[dict] = []
        try:
            with open(path, "a", encoding="utf-8") as f:
                for number, indices in enumerate(self.calls(pending), start=1):
                    start = time.perf_counter()
                    out = self.policy.generate(self.dataset.collate(indices), self.sampling)
                    seconds = time.perf_counter() - start
                    metrics = self._metrics(out, seconds)
                    scores = None
                    if self.reward is not None:
                        scored, reward_metrics = score_rollout(out, self.dataset.tokenizer, self.reward)
                        scores = scored["scores"].tolist()
                        metrics.update({**reward_metrics, "generate/score/mean": sum(scores) / len(scores)})
                    buffered.extend(self._rows(indices, out, settings, scores))
                    if number % self.write_every == 0:
                        _append(f, buffered)
                        buffered = []
                    totals["gen_tokens"] += float(out["response_mask"].sum())
                    totals["seconds"] += seconds
                    totals["prompts"] += len(indices)
                    ctx.log(metrics, len(done) + totals["prompts"])
                    bar.update(len(indices))
                    postfix = {"tok_s": f"{metrics['perf/gen_tokens_per_s']:.0f}"}
                    if scores is not None:
                        postfix["score"] = f"{metrics['generate/score/mean']:.3f}"
                    bar.set_postfix(postfix, refresh=False)
        finally:
            if buffered:  # whole rows of finished batches: keep them, also on Ctrl-C
                with open(path, "a", encoding="utf-8") as f:
                    _append(f, buffered)
            bar.close()
        parquet, rows = finalize_output(path, self.dataset, self.sampling.n, settings, self._score_rows)
        summary = {
            "generate/prompts": float(len(self.dataset)),
            "generate/prompts_resumed": float(len(done)),
            "perf/gen_tokens_per_s": totals["gen_tokens"] / totals["seconds"] if totals["seconds"] else 0.0,
        }
        if self.reward is not None:
            flat = [x for row in rows for x in row["scores"]]
            summary["generate/score/mean"] = sum(flat) / len(flat)
        return {"generations": str(path), "parquet": str(parquet), "metrics": summary}

    def _score_rows(self, rows: list[dict]) -> list[dict]:
        """`rows` with `scores`: those written without them (a resumed file begun without a scorer) are scored
        now; a stage without a reward leaves them as they are."""
        todo = [i for i, row in enumerate(rows) if "scores" not in row] if self.reward is not None else []
        if not todo:
            return rows
        flat = [(rows[i], text, length) for i in todo
                for text, length in zip(rows[i]["responses"], rows[i]["response_lengths"])]
        out = self.reward(
            [text for _, text, _ in flat], [row["data_source"] for row, _, _ in flat],
            [ground_truth(row) if has_ground_truth(row) else None for row, _, _ in flat],
            [row.get("extra_info") or {} for row, _, _ in flat],
            response_lengths=[length for _, _, length in flat], max_new_tokens=self.sampling.max_new_tokens,
        )
        rows = list(rows)
        n = self.sampling.n
        for j, i in enumerate(todo):
            rows[i] = {**rows[i], "scores": out.scores[j * n : (j + 1) * n]}
        return rows

    def _rows(self, indices: list[int], out: Batch, settings: dict, scores: list[float] | None) -> list[dict]:
        n = self.sampling.n
        if len(out) != n * len(indices):
            raise RuntimeError(f"the policy returned {len(out)} responses for {len(indices)} prompts x n={n}")
        texts = decode_responses(out, self.dataset.tokenizer)
        lengths = out["response_mask"].sum(dim=1).tolist()
        rows = []
        for j, index in enumerate(indices):  # the n responses of a prompt are adjacent
            row = {
                **self.dataset.rows[index],
                "row_index": index,
                "responses": texts[j * n : (j + 1) * n],
                "response_lengths": [int(x) for x in lengths[j * n : (j + 1) * n]],
                "prompt_length": len(self.dataset.ids[index]),
                "generation_settings": settings,
            }
            if scores is not None:
                row["scores"] = scores[j * n : (j + 1) * n]
            rows.append(row)
        return rows

    def _metrics(self, out: Batch, seconds: float) -> dict[str, float]:
        lengths = out["response_mask"].sum(dim=1).float()
        total_tokens = float(out["attention_mask"].sum())
        prompt_lengths = out["attention_mask"].sum(dim=1).float() - lengths
        seconds = max(seconds, 1e-9)
        return {
            "response_length/mean": float(lengths.mean()),
            "response_length/max": float(lengths.max()),
            "response_length/min": float(lengths.min()),
            "response_length/clip_ratio": float((lengths >= self.sampling.max_new_tokens).float().mean()),
            "prompt_length/mean": float(prompt_lengths.mean()),
            "timing_s/gen": seconds,
            "perf/throughput": total_tokens / seconds / self.policy.world_size,
            "perf/gen_tokens_per_s": float(lengths.sum()) / seconds,
        }


def finalize_output(
    path: Path, dataset: PromptDataset, n: int, settings: Mapping[str, Any] | None = None, complete=lambda rows: rows,
) -> tuple[Path, list[dict]]:
    """Check that every row is in `path`, put it in row_index order (with `complete(rows)` applied: the
    stage's scores), write the parquet copy; returns its path and the rows."""
    rows_in_file = read_output(path, dataset, n, settings)
    done = completed_rows(rows_in_file)
    missing = [i for i in range(len(dataset)) if i not in done]
    if missing:
        raise RuntimeError(f"{path}: rows {missing[:10]} were not generated ({len(missing)} missing)")
    rows = [done[i] for i in range(len(dataset))]
    completed = complete(rows)
    if completed is not rows or [r["row_index"] for r in rows_in_file] != list(range(len(dataset))):
        # a resume left it out of order (or a row twice), or rows got their scores: rewrite it sorted
        write_rows(completed, path, require_ground_truth=False)
    parquet = path.with_suffix(".parquet")
    write_rows(completed, parquet, require_ground_truth=False)
    return parquet, completed
