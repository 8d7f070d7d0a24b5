"""`PromptDataset`: verl-schema rows, chat-templated and tokenised once (cached on disk), served as `Batch`es.

The rows live in Arrow (`datasets`, memory-mapped): a validated rows dataset
(`rlhf.data.arrow`) joined column-wise with the cached output of one batched map that
templates, tokenises and applies the overlong policy. Nothing is held per row in Python, so a
million-row prompt set costs its Arrow files on disk, and a second start reads them back.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.data.arrow import as_rows, cache_key, cached_map, data_sources, rows_fingerprint, source_name, tokenizer_key
from rlhf.data.schema import DataError, ground_truth, has_ground_truth
from rlhf.data.tokenize import chat_prompt_ids_batch, left_pad, position_ids, shuffled_batches
from rlhf.signatures import with_defaults

Overlong = Literal["filter", "error", "truncate_left", "truncate_right", "truncate_middle"]
OVERLONG = ("filter", "error", "truncate_left", "truncate_right", "truncate_middle")


def truncate_ids(ids: Sequence[int], max_length: int, side: Literal["left", "right", "middle"]) -> list[int]:
    """`ids` cut to `max_length` tokens by removing tokens on `side` (verl's `data.truncation`):
    "left" keeps the last max_length, "right" the first max_length, "middle" both ends
    (the first ceil(max_length/2) and the last floor(max_length/2))."""
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    if side == "left":
        return ids[len(ids) - max_length :]
    if side == "right":
        return ids[:max_length]
    head = (max_length + 1) // 2
    tail = max_length - head
    return ids[:head] + (ids[len(ids) - tail :] if tail else [])


FITS, TRUNCATED, TOO_LONG = 0, 1, 2  # `status` of a prompt after the overlong policy

PROMPT_FEATURES = datasets.Features(
    {"input_ids": datasets.List(datasets.Value("int32")), "length": datasets.Value("int32"),
     "status": datasets.Value("int8")}
)


def prompt_tokens(
    batch: dict[str, list], *, tokenizer: PreTrainedTokenizerBase, max_prompt_length: int, overlong: Overlong
) -> dict[str, list]:
    """The tokenising map: canonical rows -> `input_ids` (after the overlong policy), the untruncated
    `length`, and `status` (FITS / TRUNCATED / TOO_LONG; a too-long prompt that is not truncated keeps no ids)."""
    rows = [json.loads(text) for text in batch["row"]]
    out: dict[str, list] = {"input_ids": [], "length": [], "status": []}
    for ids in chat_prompt_ids_batch(tokenizer, [row["prompt"] for row in rows]):
        status = FITS
        if len(ids) > max_prompt_length:
            status = TRUNCATED if overlong.startswith("truncate_") else TOO_LONG
        out["length"].append(len(ids))
        if status == TRUNCATED:
            ids = truncate_ids(ids, max_prompt_length, overlong.removeprefix("truncate_"))  # type: ignore[arg-type]
        out["input_ids"].append(ids if status != TOO_LONG else [])
        out["status"].append(status)
    return out


class ArrowRows(Sequence):
    """A read-only list view of one column of a dataset, decoded per item (no copy of the column in Python)."""

    def __init__(self, data: datasets.Dataset, column: str, decode=lambda value: value):
        self._data, self._column, self._decode = data, column, decode

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = int(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} rows")
        return self._decode(self._data[index][self._column])

    def __iter__(self) -> Iterator:
        for start in range(0, len(self), 1000):
            yield from map(self._decode, self._data[start : start + 1000][self._column])


class PromptDataset:
    """Prompts for generation: `input_ids`/`attention_mask` left-padded, plus verl's non-tensor columns.

    rows: a validated dataset from `rlhf.data.sources.load_rows` / `rlhf.data.hf_datasets.load_hf_rows`,
      any `datasets.Dataset` in verl's schema, or a list of row dicts (a generator's output).
    Rows longer than `max_prompt_length` tokens (after the chat template), as `overlong` says:
    "filter" drops them (counted in `num_filtered`), "error" refuses the dataset, and
    "truncate_left" / "truncate_right" / "truncate_middle" cut the token ids to
    `max_prompt_length` keeping the right end / the left end / both ends (as verl's
    `data.truncation` "left" / "right" / "middle"; counted in `num_truncated`). Truncation
    may cut the chat template's own tokens: "truncate_left" keeps the assistant header the
    model continues from, so it is the usual choice. `fingerprint` identifies the rows for
    run lineage (the same rows give the same fingerprint from any file format or a list).
    Tokenising is cached under `cache_dir` (see `rlhf.data.arrow.cache_root`) by the rows'
    fingerprint, the tokenizer and these settings.
    """

    def __init__(
        self,
        rows: Any,
        tokenizer: PreTrainedTokenizerBase,
        max_prompt_length: int = 512,  # in tokens, after the chat template
        overlong: Overlong = "filter",  # what to do with longer prompts (see the class docstring)
        name: str = "prompts",  # shown in errors and metrics
        raw_prompt: bool = False,  # add the chat messages as a non-tensor `raw_prompt` column (for a reward model)
        cache_dir: str | None = None,  # None: $HF_DATASETS_CACHE/rlhf (see rlhf.data.arrow.cache_root)
        num_proc: int | None = None,  # processes for tokenising; None: one per core from 50k rows
    ):
        _check_settings(max_prompt_length, overlong)
        self.name = name
        self.tokenizer = tokenizer
        self.raw_prompt = raw_prompt
        self.source = source_name(rows, name)
        data = as_rows(rows, source=name, kind="prompt", cache_dir=cache_dir, num_proc=num_proc)
        if len(data) == 0:
            raise DataError(f"{self.source}: dataset {name!r} has no rows. Fix: check the data file or the "
                            "generator arguments.", source=self.source)
        self.fingerprint = rows_fingerprint(data, cache_dir=cache_dir)
        self.data_sources = data_sources(data)  # of every row read (filtered ones too)
        key = cache_key("prompts", self.fingerprint, tokenizer_key(tokenizer), max_prompt_length, overlong)
        tokens = cached_map(
            data, prompt_tokens, name="prompts", key=key, cache_dir=cache_dir, num_proc=num_proc,
            features=PROMPT_FEATURES,
            fn_kwargs={"tokenizer": tokenizer, "max_prompt_length": max_prompt_length, "overlong": overlong},
        )
        status = tokens.data.column("status").to_numpy()
        too_long = status == TOO_LONG
        if overlong == "error" and too_long.any():
            i = int(np.argmax(too_long))
            raise DataError(
                f"{self.source}: row {i} has a prompt of {tokens[i]['length']} tokens, over max_prompt_length="
                f"{max_prompt_length}. Raise max_prompt_length or set overlong='filter' "
                "(drop such rows) or 'truncate_left' (keep their last tokens).",
                source=self.source, index=i, field="prompt",
            )
        self.num_filtered = int(too_long.sum())
        self.num_truncated = int((status == TRUNCATED).sum())
        if self.num_filtered == len(data):
            shortest = int(tokens.data.column("length").to_numpy().min())
            raise DataError(
                f"{self.source}: every prompt is longer than max_prompt_length={max_prompt_length} tokens (the "
                f"shortest has {shortest}), so dataset {name!r} would be empty. Fix: raise max_prompt_length to at "
                "least that, or set overlong='truncate_left'.",
                source=self.source, field="prompt",
            )
        self.data = datasets.concatenate_datasets([data, tokens.select_columns(["input_ids"])], axis=1)
        if self.num_filtered:
            self.data = self.data.select(np.flatnonzero(~too_long))
            warnings.warn(f"{name}: filtered {self.num_filtered} prompts longer than {max_prompt_length} tokens")
        if self.num_truncated:
            warnings.warn(
                f"{name}: truncated {self.num_truncated} prompts longer than {max_prompt_length} tokens ({overlong})"
            )
        self.rows: Sequence[dict] = ArrowRows(self.data, "row", json.loads)  # the kept rows, as dicts
        self.ids: Sequence[list[int]] = ArrowRows(self.data, "input_ids")  # their prompt token ids

    @staticmethod
    def preflight(arguments: dict) -> None:
        """Before any stage runs: check the settings, and build the dataset when its rows are a loaded dataset
        (a file, a `datasets` folder) and its tokenizer builds (`wants_values`), so an empty file or one whose
        every prompt is too long stops the run there, naming the file. The tokenised rows are cached, so the
        run's own build is a cache hit. Rows from a generator (a list) are checked when the dataset is built."""
        settings = with_defaults(PromptDataset, arguments)
        _check_settings(settings["max_prompt_length"], settings["overlong"])
        rows, tokenizer = arguments.get("rows"), arguments.get("tokenizer")
        if isinstance(tokenizer, PreTrainedTokenizerBase) and isinstance(rows, datasets.Dataset):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the run's own build warns
                PromptDataset(**arguments)

    def __len__(self) -> int:
        return len(self.data)

    def collate(self, indices: Sequence[int]) -> Batch:
        indices = [int(i) for i in indices]
        part = self.data[indices]
        rows = [json.loads(text) for text in part["row"]]
        return collate_prompts([f"{self.name}-{i}" for i in indices], rows, part["input_ids"],
                               self.tokenizer.pad_token_id, self.raw_prompt)

    def in_order(self, batch_size: int) -> Iterator[Batch]:
        """Every row once, in file order (validation)."""
        for start in range(0, len(self), batch_size):
            yield self.collate(range(start, min(start + batch_size, len(self))))

    def shuffled(self, batch_size: int, seed: int, start_step: int = 0) -> Iterator[Batch]:
        """Endless full batches, reshuffled each epoch from `seed`; resumable at `start_step`."""
        for indices in shuffled_batches(len(self), batch_size, seed, start_step):
            yield self.collate(indices)


PromptDataset.preflight.wants_values = True  # type: ignore[attr-defined]  (see rlhf.runtime.preflight_hooks)


def collate_prompts(
    uids: Sequence[str], rows: Sequence[dict], ids: Sequence[Sequence[int]], pad_id: int, raw_prompt: bool = False
) -> Batch:
    """A generation batch: left-padded `input_ids`/`attention_mask`/`position_ids` and verl's non-tensor columns."""
    input_ids, mask = left_pad(ids, pad_id)
    columns = {
        "uid": list(uids),
        "data_source": [r["data_source"] for r in rows],
        "ground_truth": [ground_truth(r) if has_ground_truth(r) else None for r in rows],  # None: generation only
        "extra_info": [r.get("extra_info") or {} for r in rows],
    }
    if raw_prompt:  # verl's `raw_prompt` (data.return_raw_chat): the untruncated messages
        columns["raw_prompt"] = [list(r["prompt"]) for r in rows]
    return Batch({"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids(mask)}, columns)


def _check_settings(max_prompt_length: Any, overlong: Any) -> None:
    if overlong not in OVERLONG:
        raise ValueError(
            f"PromptDataset: overlong must be one of {', '.join(map(repr, OVERLONG))}, got {overlong!r}"
        )
    if not isinstance(max_prompt_length, int) or max_prompt_length < 1:
        raise ValueError(f"PromptDataset: max_prompt_length must be >= 1, got {max_prompt_length!r}")
