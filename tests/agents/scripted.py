"""A scripted policy for golden trajectories: each conversation's assistant turns are fixed texts.

It is the engine's output side only (`rollout_batch`, the function every engine ends with), so the
loop, the builder and the batch around it are the product's own. Log-probs are distinct known
numbers (-(k+1)/100 for the k-th token a conversation samples), so a test can check that each one
stays on its token through truncation and padding.
"""

from __future__ import annotations

import torch

from rlhf.batch import Batch
from rlhf.rollout.engine import rollout_batch
from rlhf.rollout.sampling import SamplingParams


class ScriptedPolicy:
    """`generate(prompts, sampling)`: the next scripted turn of each row's conversation, chosen by its prompt.

    `scripts` maps a marker found in the decoded prompt (e.g. the question) to the assistant
    texts of that conversation; the turn index is how many assistant turns the prompt already has.
    `stop`: end each turn with the EOS token (False: as if cut by max_new_tokens).
    """

    def __init__(self, tokenizer, scripts: dict[str, list[str]], stop: bool = True):
        self.tokenizer, self.scripts, self.stop = tokenizer, scripts, stop
        self.calls = 0
        self.sampled: dict[str, int] = {}

    def _paused_part(self, ids: list[int]) -> list[int]:
        """The ids after the last assistant header: the part of a turn already sampled (empty at a turn's start)."""
        header = self.tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        starts = [i for i in range(len(ids) - len(header) + 1) if ids[i:i + len(header)] == header]
        return ids[starts[-1] + len(header):] if starts else []

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        self.calls += 1
        rows, log_probs = [], []
        for ids, mask in zip(prompts["input_ids"], prompts["attention_mask"]):
            text = self.tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=False)
            marker = next(m for m in self.scripts if m in text)
            turn = text.count("<|im_start|>assistant") - 1
            reply = self.tokenizer(self.scripts[marker][turn], add_special_tokens=False)["input_ids"]
            reply = reply + ([self.tokenizer.eos_token_id] if self.stop else [])
            sampled = self._paused_part(ids[mask.bool()].tolist())  # a turn sampled in chunks goes on from there
            assert reply[: len(sampled)] == sampled, "the prompt's paused turn is not this script's"
            reply = reply[len(sampled):][: sampling.max_new_tokens]
            start = self.sampled.get(marker, 0)
            self.sampled[marker] = start + len(reply)
            rows.append(reply)
            log_probs.append([-(start + k + 1) / 100 for k in range(len(reply))])
        width = max(len(r) for r in rows)
        responses = torch.full((len(rows), width), self.tokenizer.pad_token_id)
        lps = torch.zeros(len(rows), width)
        for i, (r, lp) in enumerate(zip(rows, log_probs)):
            responses[i, : len(r)] = torch.tensor(r)
            lps[i, : len(lp)] = torch.tensor(lp)
        eos = [self.tokenizer.eos_token_id] if self.stop else [-1]
        return rollout_batch(prompts, responses, lps, sampling, eos, self.tokenizer.pad_token_id)
