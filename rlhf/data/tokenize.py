"""Chat-template tokenisation and padding shared by the prompt and SFT datasets."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from rlhf.batch import pad_rows
from rlhf.data.chat_splice import ChatSplicer


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict]) -> list[int]:
    """Token ids of `messages` rendered by the tokenizer's chat template, ready for the assistant turn."""
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_prompt_ids_batch(tokenizer: PreTrainedTokenizerBase, conversations: Sequence[Sequence[dict]]) -> list[list[int]]:
    """`chat_prompt_ids` of many conversations, the same ids several times faster: the template is rendered
    once per conversation shape and the contents spliced in, the constant text tokenised once, the rest in
    one batched call of the Rust tokenizer (`rlhf.data.chat_splice`, which checks where that is exact)."""
    return ChatSplicer(tokenizer).ids(conversations)


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (B, max_len), padded on the left (generation continues on the right)."""
    return pad_rows(seqs, pad_id, "left"), pad_rows([[1] * len(s) for s in seqs], 0, "left")


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (B, max_len), padded on the right."""
    return pad_rows(seqs, pad_id, "right"), pad_rows([[1] * len(s) for s in seqs], 0, "right")


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only (left padding gets position 0)."""
    return (torch.cumsum(attention_mask, dim=1) - 1).clamp(min=0)


def shuffled_batches(num_rows: int, batch_size: int, seed: int, start_step: int = 0) -> Iterator[list[int]]:
    """Endless lists of row indices: full batches, reshuffled each epoch from (seed, epoch).

    Step k's batch depends only on (seed, k), so a run resumed at `start_step` sees exactly
    the batches an uninterrupted run would have seen.
    """
    if batch_size > num_rows:
        raise ValueError(f"batch size {batch_size} exceeds the {num_rows} rows of the dataset")
    per_epoch = num_rows // batch_size
    step = start_step
    while True:
        epoch, offset = divmod(step, per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(num_rows)
        yield order[offset * batch_size : (offset + 1) * batch_size].tolist()
        step += 1
