"""Rollout with a Hugging Face model in the worker's process: the CPU default engine.

Left-padded prompts, KV cache, `n` samples per prompt. By default it decodes with
`rlhf.rollout.decode.sample`, which prefills each prompt once for its n samples and skips
`generate`'s per-step machinery (same greedy outputs and sampling distribution as
`generate`; several times faster for RL rollouts, see docs/performance.md);
`use_generate=True` calls transformers' `generate` instead. Returns the engine's own
log-probs of the sampled tokens (at the sampling temperature, before top-p/top-k
truncation, as verl does) so trainers can measure and correct the rollout/trainer mismatch.

Built from a model folder like every engine (`HFEngine(path)`, rlhf.rollout.engine); the
policy worker instead shares the actor's module on its device (`HFEngine.sharing`): the
weights are the trainer's own, so `update_weights` has nothing to do there.

Rows leave the batch as they finish, KV cache included, so a long tail costs only the rows in
it (continuous batching, `rlhf.rollout.decode`). Memory: `max_rows_per_call` caps the rows
decoding at once (whole prompt groups: a prompt's n samples decode together); the KV cache is
allocated for that many rows, and pending prompt groups take the slots of finished rows as they
free up. `continuous_batching=False` is the static batch (every row of a wave decodes until its
slowest row ends), kept for comparison.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import GenerationConfig, PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rollout.decode import sample
from rlhf.rollout.engine import NamedTensors, WeightDigest, position_ids_from_mask, rollout_batch
from rlhf.rollout.sampling import SamplingParams

__all__ = ["HFEngine", "position_ids_from_mask"]


class HFEngine:
    """Generates with a Hugging Face model: its own copy (`HFEngine(path)`) or a shared module (`sharing`)."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "float32",  # storage of the engine's own copy of the weights
        device: torch.device | str = "cpu",
        use_generate: bool = False,  # True: transformers' `generate` (slower; the reference the loop is tested against)
        lean: bool = True,  # decoding steps through rlhf.rollout.lean_decoder where the model supports it
        max_rows_per_call: int | None = None,  # rows decoding at once, whole prompt groups (at least one); None: all
        check_every: int | None = None,  # decoding steps between host checks for EOS; None: decode.default_check_every
        continuous_batching: bool = True,  # finished rows leave (and free their slot); False: the static batch
    ):
        model = load_causal_lm(model_path, dtype=dtype).to(device).eval()
        self._setup(model, load_tokenizer(model_path), use_generate, lean, max_rows_per_call, check_every,
                    continuous_batching)
        self.shares_weights = False

    @classmethod
    def sharing(
        cls,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        use_generate: bool = False,
        lean: bool = True,
        max_rows_per_call: int | None = None,
        check_every: int | None = None,
        continuous_batching: bool = True,
    ) -> HFEngine:
        """An engine generating with `model` itself (the policy worker's actor, or a model already
        loaded): no copy, and `update_weights` does nothing because the weights are the caller's."""
        engine = cls.__new__(cls)
        engine._setup(model, tokenizer, use_generate, lean, max_rows_per_call, check_every, continuous_batching)
        engine.shares_weights = True
        return engine

    def _setup(self, model, tokenizer, use_generate, lean, max_rows_per_call, check_every,
               continuous_batching) -> None:
        if max_rows_per_call is not None and max_rows_per_call < 1:
            raise ValueError(f"HFEngine: max_rows_per_call must be >= 1 or None (no limit), got {max_rows_per_call}")
        self.model = model
        self.use_generate = use_generate
        self.lean = lean
        self.max_rows_per_call = max_rows_per_call
        self.check_every = check_every
        self.continuous_batching = continuous_batching
        self.tokenizer = tokenizer
        eos = model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_token_ids = sorted({i for i in [*eos, tokenizer.eos_token_id] if i is not None})
        self.pad_token_id = tokenizer.pad_token_id
        self.max_model_len = int(getattr(model.config, "max_position_embeddings", None) or 2048)

    # ------------------------------------------------------------- protocol
    @torch.no_grad()
    def update_weights(self, weights: NamedTensors) -> None:
        """Copy new values into the engine's own weights; a sharing engine already has them (the
        stream is then not consumed, so an FSDP actor gathers nothing)."""
        if self.shares_weights:
            return
        params = dict(self.model.state_dict(keep_vars=True))
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"HFEngine.update_weights: the engine's model has no parameter {name!r}")
            params[name].data.copy_(tensor)

    def weight_digests(self, names: Sequence[str]) -> dict[str, WeightDigest]:
        """Digests of the named parameters of the model it generates with (see RolloutEngine)."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        return {name: WeightDigest.of(params[name]) for name in names if name in params}

    def sleep(self) -> None:
        """Nothing to free: the transformers engine keeps no cache between calls."""

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Nothing to re-allocate (see `sleep`)."""

    @torch.no_grad()
    def generate(self, prompts: Batch, sampling: SamplingParams, seed: int | None = None) -> Batch:
        """Sample `sampling.n` responses for every prompt row; rows of one prompt stay adjacent.

        `seed`: a private RNG stream (the same seed gives the same samples whatever ran before);
        None: torch's global RNG. Greedy outputs do not depend on `max_rows_per_call` or on
        continuous batching (log-probs within float rounding); sampled outputs follow the same
        distribution, but a seed gives other samples under other settings (rows decoding together
        share each step's random draw call).
        """
        if seed is None:
            return self._generate_all(prompts, sampling)
        devices = [self.model.device] if getattr(self.model, "device", torch.device("cpu")).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return self._generate_all(prompts, sampling)

    def _generate_all(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        was_training = self.model.training
        self.model.eval()
        try:
            if self.use_generate:
                responses, rollout_log_probs = self._generate_in_chunks(prompts, sampling)
            else:
                responses, rollout_log_probs = sample(
                    self.model, prompts["input_ids"], prompts["attention_mask"], n=sampling.n,
                    max_new_tokens=sampling.max_new_tokens, eos_token_ids=self.eos_token_ids,
                    pad_token_id=self.pad_token_id, temperature=sampling.temperature, top_k=sampling.top_k,
                    top_p=sampling.top_p, logprob_temperature=sampling.logit_temperature,
                    min_new_tokens=sampling.min_new_tokens, lean=self.lean, check_every=self.check_every,
                    max_rows=self.max_rows_per_call, continuous=self.continuous_batching,
                )
        finally:
            self.model.train(was_training)
        return rollout_batch(prompts, responses, rollout_log_probs, sampling, self.eos_token_ids, self.pad_token_id)

    def _generate_in_chunks(self, prompts: Batch, sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' `generate` over chunks of max(1, max_rows_per_call // n) prompts (a static batch
        each), their responses right-padded to the longest (pad token, log-prob 0) and stacked in order."""
        per_call = len(prompts) if self.max_rows_per_call is None else max(1, self.max_rows_per_call // sampling.n)
        chunks = []
        for i in range(0, len(prompts), per_call):
            input_ids, attention_mask = prompts["input_ids"][i : i + per_call], prompts["attention_mask"][i : i + per_call]
            keep = attention_mask.any(dim=0)
            start = int(keep.int().argmax()) if bool(keep.any()) else 0  # columns before it pad every prompt
            input_ids, attention_mask = input_ids[:, start:], attention_mask[:, start:]
            if sampling.n > 1:  # `generate` takes every sample's row: repeat the prompts
                input_ids = input_ids.repeat_interleave(sampling.n, dim=0)
                attention_mask = attention_mask.repeat_interleave(sampling.n, dim=0)
            chunks.append(self._generate(input_ids, attention_mask, sampling))
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
