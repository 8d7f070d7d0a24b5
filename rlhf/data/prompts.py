"""`PromptDataset`: verl-schema rows, chat-templated and tokenised once, served as `Batch`es."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Literal

from transformers import PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.data.files import fingerprint_rows
from rlhf.data.schema import DataError, ground_truth, validate_row
from rlhf.data.tokenize import chat_prompt_ids, left_pad, position_ids, shuffled_batches

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


class PromptDataset:
    """Prompts for generation: `input_ids`/`attention_mask` left-padded, plus verl's non-tensor columns.

    Rows longer than `max_prompt_length` tokens (after the chat template), as `overlong` says:
    "filter" drops them (counted in `num_filtered`), "error" refuses the dataset, and
    "truncate_left" / "truncate_right" / "truncate_middle" cut the token ids to
    `max_prompt_length` keeping the right end / the left end / both ends (as verl's
    `data.truncation` "left" / "right" / "middle"; counted in `num_truncated`). Truncation
    may cut the chat template's own tokens: "truncate_left" keeps the assistant header the
    model continues from, so it is the usual choice. `fingerprint` identifies the rows for
    run lineage.
    """

    def __init__(
        self,
        rows: Sequence[dict],
        tokenizer: PreTrainedTokenizerBase,
        max_prompt_length: int = 512,  # in tokens, after the chat template
        overlong: Overlong = "filter",  # what to do with longer prompts (see the class docstring)
        name: str = "prompts",  # shown in errors and metrics
        raw_prompt: bool = False,  # add the chat messages as a non-tensor `raw_prompt` column (for a reward model)
    ):
        if overlong not in OVERLONG:
            raise ValueError(
                f"PromptDataset: overlong must be one of {', '.join(map(repr, OVERLONG))}, got {overlong!r}"
            )
        if max_prompt_length < 1:
            raise ValueError(f"PromptDataset: max_prompt_length must be >= 1, got {max_prompt_length!r}")
        if not rows:
            raise DataError(f"dataset {name!r} has no rows; check the data file or generator arguments")
        for i, row in enumerate(rows):
            validate_row(row, source=name, index=i)
        self.name = name
        self.tokenizer = tokenizer
        self.raw_prompt = raw_prompt
        self.fingerprint = fingerprint_rows(rows)
        self.rows: list[dict] = []
        self.ids: list[list[int]] = []
        self.num_filtered = 0
        self.num_truncated = 0
        for i, row in enumerate(rows):
            ids = chat_prompt_ids(tokenizer, row["prompt"])
            if len(ids) > max_prompt_length:
                if overlong == "error":
                    raise DataError(
                        f"{name}: row {i} has a prompt of {len(ids)} tokens, over max_prompt_length="
                        f"{max_prompt_length}. Raise max_prompt_length or set overlong='filter' "
                        "(drop such rows) or 'truncate_left' (keep their last tokens).",
                        source=name, index=i, field="prompt",
                    )
                if overlong == "filter":
                    self.num_filtered += 1
                    continue
                ids = truncate_ids(ids, max_prompt_length, overlong.removeprefix("truncate_"))  # type: ignore[arg-type]
                self.num_truncated += 1
            self.rows.append(row)
            self.ids.append(ids)
        if self.num_filtered:
            warnings.warn(f"{name}: filtered {self.num_filtered} prompts longer than {max_prompt_length} tokens")
        if self.num_truncated:
            warnings.warn(
                f"{name}: truncated {self.num_truncated} prompts longer than {max_prompt_length} tokens ({overlong})"
            )
        if not self.rows:
            raise DataError(f"{name}: every prompt is longer than max_prompt_length={max_prompt_length}")

    def __len__(self) -> int:
        return len(self.rows)

    def collate(self, indices: Sequence[int]) -> Batch:
        ids, mask = left_pad([self.ids[i] for i in indices], self.tokenizer.pad_token_id)
        rows = [self.rows[i] for i in indices]
        columns = {
            "uid": [f"{self.name}-{i}" for i in indices],
            "data_source": [r["data_source"] for r in rows],
            "ground_truth": [ground_truth(r) for r in rows],
            "extra_info": [r.get("extra_info") or {} for r in rows],
        }
        if self.raw_prompt:  # verl's `raw_prompt` (data.return_raw_chat): the untruncated messages
            columns["raw_prompt"] = [list(r["prompt"]) for r in rows]
        return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)}, columns)

    def in_order(self, batch_size: int) -> Iterator[Batch]:
        """Every row once, in file order (validation)."""
        for start in range(0, len(self), batch_size):
            yield self.collate(range(start, min(start + batch_size, len(self))))

    def shuffled(self, batch_size: int, seed: int, start_step: int = 0) -> Iterator[Batch]:
        """Endless full batches, reshuffled each epoch from `seed`; resumable at `start_step`."""
        for indices in shuffled_batches(len(self), batch_size, seed, start_step):
            yield self.collate(indices)
