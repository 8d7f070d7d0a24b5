"""Streaming prompts: rows read lazily from an `IterableDataset`, for prompt sets too large to cache.

`stream_file(path)` (what `load_rows(path, streaming=True)` returns) validates rows as they
are read; nothing is written to disk. `StreamingPromptDataset` shuffles them with a buffer
(`IterableDataset.shuffle`, reseeded each epoch), templates and tokenises them a chunk at a time,
applies the overlong policy, and serves full batches.

Resume is step-exact: the iterator's `position` (epoch, rows read in that epoch) goes into the
checkpoint, and a resumed iterator re-reads that epoch's shuffled stream and skips that many
rows without tokenising them, so it yields exactly the batches an uninterrupted run would have
(the shuffle buffer is refilled by the same reads; `IterableDataset.state_dict` would drop it).
Without a position, `shuffled(start_step=k)` replays the first k batches (slower, equally exact).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.choices import check_choice
from rlhf.data.arrow import BAD, BLANK, OK, OnError, RowKind, builder_for, canonical_json, normalize_row
from rlhf.data.files import _check_readable, parse_jsonl_line
from rlhf.data.prompts import Overlong, _check_settings, collate_prompts, truncate_ids
from rlhf.data.schema import DataError
from rlhf.data.tokenize import chat_prompt_ids_batch
from rlhf.signatures import with_defaults


def _validate_example(
    example: Mapping, index: int, *, source: str, kind: RowKind, jsonl: bool, on_error: str
) -> dict:
    """One streamed row -> `row` (canonical JSON), `data_source`, `index` (its position in the file), `status`."""
    out = {"row": "", "data_source": None, "index": index, "status": OK}
    if jsonl and not example["text"].strip():
        out["status"] = BLANK
        return out
    try:
        raw = parse_jsonl_line(example["text"].encode("utf-8"), source, index, index + 1) if jsonl else dict(example)
        row = normalize_row(raw, source=source, index=index, kind=kind, line=index + 1 if jsonl else None)
        out["row"], out["data_source"] = canonical_json(row, index, normalized=True), row.get("data_source")
    except DataError as err:
        if on_error == "raise":
            raise
        warnings.warn(f"skipped: {err}")
        out["status"] = BAD
    return out


def stream_file(
    path: str | Path, *, on_error: OnError = "raise", kind: RowKind = "prompt", check: bool = False
) -> datasets.IterableDataset:
    """A parquet or JSON Lines file as a lazily validated `IterableDataset` (`row`, `data_source`, `index`,
    `status`). Rows are numbered by their position in the file (for JSON Lines: line - 1, blank lines
    included). check: read up to the first row now, so an empty or unreadable file fails here."""
    check_choice("stream_file: on_error", on_error, OnError)
    check_choice("stream_file: kind", kind, RowKind)
    file = Path(path).expanduser()
    _check_readable(file)
    source = str(path)
    if file.suffix == ".json":
        raise DataError(f"{source}: a .json file is one JSON list and cannot be streamed. Fix: write it as .jsonl "
                        "or .parquet (rlhf.data.write_rows), or load it without streaming.", source=source)
    if file.stat().st_size == 0:
        raise DataError(f"{source}: the file is empty (0 bytes). Fix: write the rows again, or point at another file.",
                        source=source)
    raw = datasets.load_dataset(builder_for(file), data_files=str(file.resolve()), split="train", streaming=True)
    jsonl = file.suffix == ".jsonl"
    rows = raw.map(
        _validate_example, with_indices=True, remove_columns=["text"] if jsonl else raw.column_names,
        fn_kwargs={"source": source, "kind": kind, "jsonl": jsonl, "on_error": on_error},
    )
    rows.info.description = f"rlhf rows of {source}"
    if check and next((r for r in rows if r["status"] == OK), None) is None:
        raise DataError(f"{source}: the file has no rows. Fix: write the rows again, or point at another file.",
                        source=source)
    return rows


class StreamBatches:
    """The endless batches of `StreamingPromptDataset.shuffled`; `position` is where the last one ended."""

    def __init__(self, data: StreamingPromptDataset, batch_size: int, seed: int, epoch: int, consumed: int):
        self.position = {"epoch": epoch, "consumed": consumed}
        self._batches = data._batches(batch_size, seed, epoch, consumed, self.position)

    def __iter__(self) -> StreamBatches:
        return self

    def __next__(self) -> Batch:
        return next(self._batches)


class StreamingPromptDataset:
    """`PromptDataset`'s batches from a stream: same tokenisation, overlong policy and batch layout.

    rows: `load_rows(path, streaming=True)` (or `stream_file`). `uid`s are `<name>-<row in the file>`.
    `fingerprint` and `data_sources` cost one pass over the stream (no tokenising) the first time
    they are read. The overlong policy is applied as rows arrive: "error" stops at the first
    too-long prompt read, and a stream whose every prompt is too long fails at its first epoch.
    """

    def __init__(
        self,
        rows: datasets.IterableDataset,
        tokenizer: PreTrainedTokenizerBase,
        max_prompt_length: int = 512,  # in tokens, after the chat template
        overlong: Overlong = "filter",  # as PromptDataset
        name: str = "prompts",  # shown in errors and metrics
        raw_prompt: bool = False,  # as PromptDataset
        shuffle_buffer: int = 10_000,  # rows in the shuffle buffer (more: better mixing, more memory)
        chunk: int = 256,  # rows templated and tokenised per call
    ):
        _check_settings(max_prompt_length, overlong)
        if not isinstance(rows, datasets.IterableDataset):
            raise TypeError(f"StreamingPromptDataset: rows must be a datasets.IterableDataset (load_rows(path, "
                            f"streaming=True)), got {type(rows).__name__}; use PromptDataset for other rows")
        self.rows = rows
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.overlong = overlong
        self.name = name
        self.raw_prompt = raw_prompt
        self.shuffle_buffer = shuffle_buffer
        self.chunk = chunk
        description = rows.info.description or ""
        self.source = description.removeprefix("rlhf rows of ") if description.startswith("rlhf rows of ") else name
        self.num_filtered = 0
        self.num_truncated = 0
        self._scan: tuple[str, set[str]] | None = None

    @staticmethod
    def preflight(arguments: dict) -> None:
        """Before any stage runs: the settings (the stream itself is checked by `load_rows`' hook)."""
        settings = with_defaults(StreamingPromptDataset, arguments)
        _check_settings(settings["max_prompt_length"], settings["overlong"])

    # ----------------------------------------------------------- lineage
    def _scanned(self) -> tuple[str, set[str]]:
        if self._scan is None:
            digest, sources = hashlib.sha256(), set()
            for example in self.rows:
                if example["status"] == OK:
                    digest.update((example["row"] + "\n").encode("utf-8"))
                    sources.add(example["data_source"])
            self._scan = (digest.hexdigest(), {s for s in sources if s is not None})
        return self._scan

    @property
    def fingerprint(self) -> str:
        """`fingerprint_rows` of the stream's rows (in file order): equal to PromptDataset's for the same rows."""
        return self._scanned()[0]

    @property
    def data_sources(self) -> set[str]:
        return self._scanned()[1]

    # ----------------------------------------------------------- batches
    def _prompts(self, examples: Iterator[Mapping], start: int) -> Iterator[tuple[int, dict, list[int], int]]:
        """(position in the stream after this row, row, ids, row index) of each kept row, tokenised a chunk at a time."""
        position = start
        while True:
            chunk, read = [], 0
            for example in itertools.islice(examples, self.chunk):
                read += 1
                position += 1
                if example["status"] == OK:
                    chunk.append((position, json.loads(example["row"]), example["index"]))
            if read == 0:
                return
            conversations = [row["prompt"] for _, row, _ in chunk]
            for (where, row, index), ids in zip(chunk, chat_prompt_ids_batch(self.tokenizer, conversations)):
                if len(ids) > self.max_prompt_length:
                    if self.overlong == "error":
                        raise DataError(
                            f"{self.source}: row {index} has a prompt of {len(ids)} tokens, over max_prompt_length="
                            f"{self.max_prompt_length}. Raise max_prompt_length or set overlong='filter' "
                            "(drop such rows) or 'truncate_left' (keep their last tokens).",
                            source=self.source, index=index, field="prompt",
                        )
                    if self.overlong == "filter":
                        self.num_filtered += 1
                        continue
                    ids = truncate_ids(ids, self.max_prompt_length, self.overlong.removeprefix("truncate_"))
                    self.num_truncated += 1
                yield where, row, ids, index
            if read < self.chunk:
                return

    def _epoch(self, seed: int | None, epoch: int, skip: int) -> Iterator[tuple[int, dict, list[int], int]]:
        stream = self.rows
        if seed is not None:
            stream = stream.shuffle(seed=seed, buffer_size=self.shuffle_buffer)
            stream.set_epoch(epoch)
        return self._prompts(itertools.islice(iter(stream), skip, None), skip)

    def _batches(self, batch_size: int, seed: int, epoch: int, consumed: int, position: dict) -> Iterator[Batch]:
        while True:
            batch, yielded = [], False
            for where, row, ids, index in self._epoch(seed, epoch, consumed):
                batch.append((row, ids, index))
                if len(batch) == batch_size:
                    position.update(epoch=epoch, consumed=where)
                    yield self._collate(batch)
                    batch, yielded = [], True
            if not yielded and consumed == 0:
                if not batch:
                    raise DataError(
                        f"{self.source}: no prompt of the stream fits max_prompt_length={self.max_prompt_length} "
                        f"tokens, so dataset {self.name!r} is empty. Fix: raise max_prompt_length, or set "
                        "overlong='truncate_left'.", source=self.source, field="prompt",
                    )
                raise ValueError(f"batch size {batch_size} exceeds the {len(batch)} usable rows of the stream")
            epoch, consumed = epoch + 1, 0

    def shuffled(
        self, batch_size: int, seed: int, start_step: int = 0, position: Mapping[str, int] | None = None
    ) -> StreamBatches:
        """Endless full batches, reshuffled each epoch from (seed, epoch); the rows of an epoch that do not
        fill a batch are dropped (as PromptDataset). Resumes at `position` (from a checkpoint) or, without
        one, by replaying `start_step` batches."""
        if position is not None:
            return StreamBatches(self, batch_size, seed, int(position["epoch"]), int(position["consumed"]))
        batches = StreamBatches(self, batch_size, seed, 0, 0)
        for _ in range(start_step):
            next(batches)
        return batches

    def in_order(self, batch_size: int) -> Iterator[Batch]:
        """Every kept row once, in file order (validation); the last batch may be smaller."""
        batch = []
        for _, row, ids, index in self._epoch(None, 0, 0):
            batch.append((row, ids, index))
            if len(batch) == batch_size:
                yield self._collate(batch)
                batch = []
        if batch:
            yield self._collate(batch)

    def _collate(self, batch: list[tuple[dict, list[int], int]]) -> Batch:
        rows, ids, indices = zip(*batch)
        return collate_prompts([f"{self.name}-{i}" for i in indices], list(rows), list(ids),
                               self.tokenizer.pad_token_id, self.raw_prompt)
