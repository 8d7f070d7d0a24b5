"""Rollout with a Hugging Face model in the worker's process: the CPU default engine.

Left-padded prompts, KV cache, `n` samples per prompt. By default it decodes with
`rlhf.rollout.decode.sample`, which prefills each prompt once for its n samples and skips
`generate`'s per-step machinery (same greedy outputs and sampling distribution as
`generate`; several times faster for RL rollouts, see docs/performance.md);
`use_generate=True` calls transformers' `generate` instead. Returns the engine's own
log-probs of the sampled tokens (at the sampling temperature, before top-p/top-k
truncation, as verl does) so trainers can measure and correct the rollout/trainer mismatch.

Memory: `max_rows_per_call` decodes the batch in chunks of whole prompt groups (a prompt's
n samples stay in one call), each chunk trimmed to its own longest prompt, so the KV cache
and logits of one call bound the rollout's memory; the chunks' responses are padded to the
longest and concatenated in order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GenerationConfig, PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.rollout.decode import sample
from rlhf.rollout.sampling import SamplingParams, response_mask_from_eos


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only (left padding gets position 0)."""
    return (torch.cumsum(attention_mask, dim=1) - 1).clamp(min=0)


class HFEngine:
    """Generates with a (possibly shared) Hugging Face model; weights are the trainer's own."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        use_generate: bool = False,  # True: transformers' `generate` (slower; the reference the loop is tested against)
        lean: bool = True,  # decoding steps through rlhf.rollout.lean_decoder where the model supports it
        max_rows_per_call: int | None = None,  # responses per decode call, whole prompt groups (at least one); None: all
        check_every: int | None = None,  # decoding steps between host checks for EOS; None: decode.default_check_every
    ):
        if max_rows_per_call is not None and max_rows_per_call < 1:
            raise ValueError(f"HFEngine: max_rows_per_call must be >= 1 or None (no limit), got {max_rows_per_call}")
        self.model = model
        self.use_generate = use_generate
        self.lean = lean
        self.max_rows_per_call = max_rows_per_call
        self.check_every = check_every
        self.tokenizer = tokenizer
        eos = model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_token_ids = sorted({i for i in [*eos, tokenizer.eos_token_id] if i is not None})
        self.pad_token_id = tokenizer.pad_token_id

    def load_weights(self, model: torch.nn.Module) -> None:
        """Point the engine at the trained model (hybrid engine: same process, no copy)."""
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """Sample `sampling.n` responses for every prompt row; rows of one prompt stay adjacent.

        With `max_rows_per_call`, prompts are decoded max(1, max_rows_per_call // n) at a time.
        Greedy outputs equal one call's (log-probs within float rounding: the chunks' shapes
        differ); sampled outputs follow the same distribution, but a seed gives other samples
        than one call would, since the chunks draw their random numbers one after another.
        """
        batch = prompts.repeat(sampling.n, interleave=True) if sampling.n > 1 else prompts
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        per_call = len(prompts)
        if self.max_rows_per_call is not None:
            per_call = max(1, self.max_rows_per_call // sampling.n)
        was_training = self.model.training
        self.model.eval()
        try:
            chunks = [
                self._decode(prompts["input_ids"][i : i + per_call], prompts["attention_mask"][i : i + per_call],
                             sampling)
                for i in range(0, len(prompts), per_call)
            ]
        finally:
            self.model.train(was_training)
        responses, rollout_log_probs = self._concat(chunks)
        response_mask = response_mask_from_eos(responses, self.eos_token_ids)
        responses = responses.masked_fill(response_mask == 0, self.pad_token_id)
        full_mask = torch.cat([attention_mask, response_mask], dim=1)
        batch["prompts"] = input_ids
        batch["responses"] = responses
        batch["response_mask"] = response_mask
        batch["rollout_log_probs"] = rollout_log_probs * response_mask
        batch["input_ids"] = torch.cat([input_ids, responses], dim=1)
        batch["attention_mask"] = full_mask
        batch["position_ids"] = position_ids_from_mask(full_mask)
        batch.meta["temperature"] = sampling.logit_temperature
        return batch

    def _decode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(responses (U*n,R), log-probs (U*n,R)) for U left-padded prompts, trimmed to their longest prompt."""
        keep = attention_mask.any(dim=0)
        start = int(keep.int().argmax()) if bool(keep.any()) else 0  # columns before it pad every prompt
        input_ids, attention_mask = input_ids[:, start:], attention_mask[:, start:]
        if self.use_generate:  # `generate` takes every sample's row: repeat the prompts
            if sampling.n > 1:
                input_ids = input_ids.repeat_interleave(sampling.n, dim=0)
                attention_mask = attention_mask.repeat_interleave(sampling.n, dim=0)
            return self._generate(input_ids, attention_mask, sampling)
        return sample(
            self.model, input_ids, attention_mask, n=sampling.n, max_new_tokens=sampling.max_new_tokens,
            eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id, temperature=sampling.temperature,
            top_k=sampling.top_k, top_p=sampling.top_p, logprob_temperature=sampling.logit_temperature,
            min_new_tokens=sampling.min_new_tokens, lean=self.lean, check_every=self.check_every,
        )

    def _concat(self, chunks: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Chunks' (responses, log-probs) stacked in order, right-padded to the longest (pad token, log-prob 0)."""
        if len(chunks) == 1:
            return chunks[0]
        r = max(tokens.shape[1] for tokens, _ in chunks)
        responses = torch.cat([F.pad(tokens, (0, r - tokens.shape[1]), value=self.pad_token_id) for tokens, _ in chunks])
        log_probs = torch.cat([F.pad(lp, (0, r - lp.shape[1]), value=0.0) for _, lp in chunks])
        return responses, log_probs

    def _generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(responses, log-probs) from transformers' `generate` on the already repeated prompts."""
        config = GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            min_new_tokens=sampling.min_new_tokens or None,
            do_sample=not sampling.greedy,
            temperature=None if sampling.greedy else sampling.temperature,
            top_p=None if sampling.greedy else sampling.top_p,
            top_k=None if sampling.greedy else sampling.top_k,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_logits=True,
            use_cache=True,
        )
        out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        responses = out.sequences[:, input_ids.shape[1]:]
        logits = torch.stack(out.logits, dim=1).float() / sampling.logit_temperature  # (B,R,V)
        return responses, torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
