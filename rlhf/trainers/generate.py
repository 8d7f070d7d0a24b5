"""Batch generation: `n` responses for every prompt of a dataset, written as they are made.

The output is JSON Lines: each input row (verl's schema) plus

    row_index         the row's position in the dataset (its line/row in the input file when
                      no prompt was filtered for length)
    responses         list of n response texts (special tokens such as EOS dropped)
    response_lengths  list of n response lengths in tokens (EOS included)
    prompt_length     the prompt's length in tokens, after the chat template

Rows are appended one batch at a time, flushed and fsynced, so an interrupted job loses at
most the batch in flight. Run it again with the same output and it resumes: the rows already
in the file are checked (same prompt at that row_index, n responses) and skipped; a partial
last line left by a crash is cut off first. When every row is done the JSON Lines file is put
in row_index order (rewritten atomically only if a resume left it out of order) and a parquet
copy is written next to it, atomically (temporary file + rename).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from rlhf.batch import Batch
from rlhf.data.files import write_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.schema import DataError
from rlhf.rollout.sampling import SamplingParams
from rlhf.trainers.context import StageContext
from rlhf.trainers.scoring import decode_responses

GENERATED_FIELDS = ("row_index", "responses", "response_lengths", "prompt_length")
"""The fields generation adds to each input row."""


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


def read_output(path: Path, dataset: PromptDataset, n: int) -> list[dict]:
    """The rows already generated in `path`, in file order, checked against this job.

    A last line without its newline (a write cut short) is removed from the file. Raises
    `DataError` when the file does not belong to this job: a row whose prompt differs from the
    dataset's prompt at its row_index, or with a number of responses other than `n`.
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
                f"was written for other data. {fix}"
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
        rows.append(row)
    return rows


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
    second, all workers).
    """

    def __init__(
        self,
        policy,  # WorkerGroup of PolicyWorker (inference only is enough)
        dataset: PromptDataset,
        sampling: SamplingParams = SamplingParams(),
        output: str | None = None,  # .jsonl (or .parquet) path; None: <stage out_dir>/generations.jsonl
        prompts_per_call: int = 64,  # prompts per generate call (x n responses), over all workers
        write_every: int = 1,  # batches per append + fsync: a crash loses at most this many batches
        parent_run: str | None = None,  # the Aim run that trained the model, recorded as this run's parent
    ):
        if prompts_per_call < 1 or write_every < 1:
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

    def output_path(self, ctx: StageContext) -> Path:
        return output_paths(self.output or ctx.out_dir / "generations.jsonl")[0]

    def run(self, ctx: StageContext) -> dict:
        path = self.output_path(ctx)
        path.parent.mkdir(parents=True, exist_ok=True)
        done = completed_rows(read_output(path, self.dataset, self.sampling.n))
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
                for number, indices in enumerate(_chunks(pending, self.prompts_per_call), start=1):
                    start = time.perf_counter()
                    out = self.policy.generate(self.dataset.collate(indices), self.sampling)
                    seconds = time.perf_counter() - start
                    buffered.extend(self._rows(indices, out))
                    if number % self.write_every == 0:
                        _append(f, buffered)
                        buffered = []
                    metrics = self._metrics(out, seconds)
                    totals["gen_tokens"] += float(out["response_mask"].sum())
                    totals["seconds"] += seconds
                    totals["prompts"] += len(indices)
                    ctx.log(metrics, len(done) + totals["prompts"])
                    bar.update(len(indices))
                    bar.set_postfix(tok_s=f"{metrics['perf/gen_tokens_per_s']:.0f}", refresh=False)
        finally:
            if buffered:  # whole rows of finished batches: keep them, also on Ctrl-C
                with open(path, "a", encoding="utf-8") as f:
                    _append(f, buffered)
            bar.close()
        parquet = finalize_output(path, self.dataset, self.sampling.n)
        summary = {
            "generate/prompts": float(len(self.dataset)),
            "generate/prompts_resumed": float(len(done)),
            "perf/gen_tokens_per_s": totals["gen_tokens"] / totals["seconds"] if totals["seconds"] else 0.0,
        }
        return {"generations": str(path), "parquet": str(parquet), "metrics": summary}

    def _rows(self, indices: list[int], out: Batch) -> list[dict]:
        n = self.sampling.n
        if len(out) != n * len(indices):
            raise RuntimeError(f"the policy returned {len(out)} responses for {len(indices)} prompts x n={n}")
        texts = decode_responses(out, self.dataset.tokenizer)
        lengths = out["response_mask"].sum(dim=1).tolist()
        rows = []
        for j, index in enumerate(indices):  # the n responses of a prompt are adjacent
            rows.append({
                **self.dataset.rows[index],
                "row_index": index,
                "responses": texts[j * n : (j + 1) * n],
                "response_lengths": [int(x) for x in lengths[j * n : (j + 1) * n]],
                "prompt_length": len(self.dataset.ids[index]),
            })
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


def finalize_output(path: Path, dataset: PromptDataset, n: int) -> Path:
    """Check that every row is in `path`, put it in row_index order, write the parquet copy."""
    rows_in_file = read_output(path, dataset, n)
    done = completed_rows(rows_in_file)
    missing = [i for i in range(len(dataset)) if i not in done]
    if missing:
        raise RuntimeError(f"{path}: rows {missing[:10]} were not generated ({len(missing)} missing)")
    rows = [done[i] for i in range(len(dataset))]
    if [r["row_index"] for r in rows_in_file] != list(range(len(dataset))):
        write_rows(rows, path)  # a resume left it out of order (or a row twice): rewrite it sorted
    parquet = path.with_suffix(".parquet")
    write_rows(rows, parquet)
    return parquet
