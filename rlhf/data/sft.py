"""`SFTDataset`: prompt/response pairs in the same layout as RL rollouts.

A batch holds `input_ids` = [left-padded prompt | right-padded response + EOS] with
`responses` and `response_mask`, exactly like a rollout, so the policy worker computes
response log-probs the same way for SFT and RL, and the loss covers response tokens only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.data.files import fingerprint_rows
from rlhf.data.schema import DataError, ground_truth, validate_row
from rlhf.data.tokenize import chat_prompt_ids, left_pad, position_ids, shuffled_batches, right_pad


def answer_from_ground_truth(row: Mapping) -> str:
    """The response is the bare ground truth (arithmetic: "68")."""
    return ground_truth(row)


def answer_from_extra_info(row: Mapping, key: str = "answer") -> str:
    """The response is a worked solution stored in `extra_info[key]` (GSM8K: "... #### 72")."""
    return row["extra_info"][key]


class SFTDataset:
    """Single-turn SFT examples built from verl-schema rows and a response function."""

    def __init__(
        self,
        rows: Sequence[dict],
        tokenizer: PreTrainedTokenizerBase,
        response: Callable[[Mapping], str] = answer_from_ground_truth,  # row -> target text
        max_length: int = 1024,  # prompt + response tokens; longer examples are dropped
        name: str = "sft",
    ):
        if not rows:
            raise DataError(f"SFT dataset {name!r} has no rows")
        self.name = name
        self.tokenizer = tokenizer
        self.fingerprint = fingerprint_rows(rows)
        eos = tokenizer.eos_token_id
        self.examples: list[tuple[list[int], list[int]]] = []
        self.num_filtered = 0
        for i, row in enumerate(rows):
            validate_row(row, source=name, index=i)
            try:
                text = response(row)
            except (KeyError, TypeError) as err:
                raise DataError(
                    f"{name}: row {i} has no response text ({type(err).__name__}: {err}); "
                    "check the rows or the `response` function of the SFT dataset",
                    source=name, index=i,
                ) from err
            prompt = chat_prompt_ids(tokenizer, row["prompt"])
            target = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
            if len(prompt) + len(target) > max_length:
                self.num_filtered += 1
                continue
            self.examples.append((prompt, target))

    def __len__(self) -> int:
        return len(self.examples)

    def collate(self, indices: Sequence[int]) -> Batch:
        pad = self.tokenizer.pad_token_id
        prompts, prompt_mask = left_pad([self.examples[i][0] for i in indices], pad)
        responses, response_mask = right_pad([self.examples[i][1] for i in indices], pad)
        mask = torch.cat([prompt_mask, response_mask], dim=1)
        return Batch(
            {
                "input_ids": torch.cat([prompts, responses], dim=1),
                "attention_mask": mask,
                "position_ids": position_ids(mask),
                "responses": responses,
                "response_mask": response_mask,
            }
        )

    def shuffled(self, batch_size: int, seed: int, start_step: int = 0) -> Iterator[Batch]:
        """Endless full batches, reshuffled each epoch from `seed`; resumable at `start_step`."""
        for indices in shuffled_batches(len(self), batch_size, seed, start_step):
            yield self.collate(indices)
