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


class PromptDataset:
    """Prompts for generation: `input_ids`/`attention_mask` left-padded, plus verl's non-tensor columns.

    Rows longer than `max_prompt_length` tokens are filtered out (counted in `num_filtered`)
    or refused, as `overlong` says. `fingerprint` identifies the rows for run lineage.
    """

    def __init__(
        self,
        rows: Sequence[dict],
        tokenizer: PreTrainedTokenizerBase,
        max_prompt_length: int = 512,  # in tokens, after the chat template
        overlong: Literal["filter", "error"] = "filter",
        name: str = "prompts",  # shown in errors and metrics
    ):
        if not rows:
            raise DataError(f"dataset {name!r} has no rows; check the data file or generator arguments")
        for i, row in enumerate(rows):
            validate_row(row, source=name, index=i)
        self.name = name
        self.tokenizer = tokenizer
        self.fingerprint = fingerprint_rows(rows)
        self.rows: list[dict] = []
        self.ids: list[list[int]] = []
        self.num_filtered = 0
        for i, row in enumerate(rows):
            ids = chat_prompt_ids(tokenizer, row["prompt"])
            if len(ids) > max_prompt_length:
                if overlong == "error":
                    raise DataError(
                        f"{name}: row {i} has a prompt of {len(ids)} tokens, over max_prompt_length="
                        f"{max_prompt_length}. Raise max_prompt_length or set overlong='filter'.",
                        source=name, index=i, field="prompt",
                    )
                self.num_filtered += 1
                continue
            self.rows.append(row)
            self.ids.append(ids)
        if self.num_filtered:
            warnings.warn(f"{name}: filtered {self.num_filtered} prompts longer than {max_prompt_length} tokens")
        if not self.rows:
            raise DataError(f"{name}: every prompt is longer than max_prompt_length={max_prompt_length}")

    def __len__(self) -> int:
        return len(self.rows)

    def collate(self, indices: Sequence[int]) -> Batch:
        ids, mask = left_pad([self.ids[i] for i in indices], self.tokenizer.pad_token_id)
        rows = [self.rows[i] for i in indices]
        return Batch(
            {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)},
            {
                "uid": [f"{self.name}-{i}" for i in indices],
                "data_source": [r["data_source"] for r in rows],
                "ground_truth": [ground_truth(r) for r in rows],
                "extra_info": [r.get("extra_info") or {} for r in rows],
            },
        )

    def in_order(self, batch_size: int) -> Iterator[Batch]:
        """Every row once, in file order (validation)."""
        for start in range(0, len(self), batch_size):
            yield self.collate(range(start, min(start + batch_size, len(self))))

    def shuffled(self, batch_size: int, seed: int, start_step: int = 0) -> Iterator[Batch]:
        """Endless full batches, reshuffled each epoch from `seed`; resumable at `start_step`."""
        for indices in shuffled_batches(len(self), batch_size, seed, start_step):
            yield self.collate(indices)
