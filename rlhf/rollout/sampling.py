"""Sampling parameters shared by every rollout engine, and response-mask helpers."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import torch

from rlhf.ranges import NonNegativeFloat, NonNegativeInt, OpenUnitInterval, PositiveInt
from rlhf.typefit import check_fields


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample responses; the same fields mean the same thing in every engine."""

    n: PositiveInt = 1  # responses per prompt (the group size for GRPO)
    temperature: NonNegativeFloat = 1.0  # 0 means greedy decoding
    top_p: Annotated[float, OpenUnitInterval] = 1.0  # nucleus sampling; 1.0 keeps the whole distribution
    top_k: NonNegativeInt = 0  # keep the k most likely tokens; 0 disables
    max_new_tokens: PositiveInt = 32  # responses are cut here (counted in response_length/clip_ratio)
    min_new_tokens: NonNegativeInt = 0  # EOS cannot be sampled before this many tokens (vLLM's min_tokens; benchmarks)

    def __post_init__(self) -> None:
        check_fields(self)  # each field against its annotation's range, as preflight checks a graph
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"SamplingParams.min_new_tokens = {self.min_new_tokens}: expects at most max_new_tokens = "
                f"{self.max_new_tokens} (EOS could never be sampled); lower it or raise max_new_tokens"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def logit_temperature(self) -> float:
        """The temperature log-probs are computed at (1 for greedy decoding)."""
        return 1.0 if self.greedy else self.temperature


def response_mask_from_eos(responses: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """(B, T) mask: 1 up to and including the first EOS token of each row, 0 after it."""
    is_eos = torch.isin(responses, torch.tensor(eos_token_ids, device=responses.device))
    eos_before = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()  # EOS tokens strictly before t
    return (eos_before == 0).to(torch.int64)
