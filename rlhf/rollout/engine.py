"""The one rollout-engine protocol, shared by the policy worker, `rlhf generate`/`eval` and `rlhf serve`.

An engine is built from a model folder (`HFEngine(path)`, `VLLMEngine(path)`), not from a live
module: every engine loads its own weights the same way, and the trainer's weights reach it
through `update_weights`. The one exception is the transformers engine in the policy worker on
one device, which shares the actor's module (`HFEngine.sharing`, see `for_policy`): its sync
is free, so its `update_weights` does nothing.

Lifecycle in the policy worker (the hybrid engine, docs/rollout_engines.md):
    wake_up(["weights"]) -> update_weights(actor weights) -> wake_up(["kv_cache"]) -> generate -> sleep()
After `sleep()` an engine's weights are undefined until the next `update_weights` (vLLM's level-2
sleep discards them); engines that cannot sleep make `sleep`/`wake_up` no-ops.

A sync that silently does nothing is the classic hybrid-engine bug (TRL's sleep mode, verl's lost
LoRA adapter: rollouts keep coming from old weights and nothing fails). So after every sync the
policy worker compares what the engine holds with what it was sent (`weight_digests`,
`SyncCheck`) and raises `WeightSyncError` on a difference.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from transformers import PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.rollout.sampling import SamplingParams, response_mask_from_eos
from rlhf.signatures import with_defaults

NamedTensors = Iterable[tuple[str, torch.Tensor]]  # (Hugging Face parameter name, full tensor), streamed


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples responses for a Batch of left-padded prompts; takes new weights; sleeps between rollouts."""

    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: list[int]  # a response ends at the first of these (kept in the response)
    pad_token_id: int
    max_model_len: int  # prompt + response tokens the engine accepts

    def generate(self, prompts: Batch, sampling: SamplingParams, seed: int | None = None) -> Batch:
        """`sampling.n` responses per prompt row (rows of one prompt adjacent); see `rollout_batch` for the keys.

        `seed`: the same seed gives the same responses whatever ran before (row i draws from its
        own stream seeded from it where the engine can); None: the engine's own random state.
        """
        ...

    def update_weights(self, weights: NamedTensors) -> None:
        """Load new values for (some of) the model's parameters, by Hugging Face name, then drop
        every cache computed with the old ones. `weights` is consumed lazily (bucket by bucket)."""
        ...

    def sleep(self) -> None:
        """Free the engine's device memory (KV cache, weights) while the trainer runs."""
        ...

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Re-allocate what `sleep` freed: `["weights"]`, `["kv_cache"]`, or everything (None)."""
        ...

    def weight_digests(self, names: Sequence[str]) -> dict[str, WeightDigest]:
        """`WeightDigest.of` each named parameter the engine holds under that Hugging Face name
        (names it holds otherwise, e.g. fused by vLLM, are left out)."""
        ...


EngineFactory = Callable[..., RolloutEngine]  # called as factory(model_path, dtype=..., device=...)

DIGEST_SAMPLE = 4096  # elements of a tensor that its digest reads (evenly strided over the whole tensor)
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def digest_sample(tensor: torch.Tensor) -> torch.Tensor:
    """At most `DIGEST_SAMPLE` elements of `tensor`, evenly strided (a copy; the same positions for
    every tensor of this shape)."""
    flat = tensor.detach().reshape(-1)
    stride = max(1, math.ceil(flat.numel() / DIGEST_SAMPLE))
    return flat[::stride].clone()


def sample_digest(sample: torch.Tensor) -> int:
    """An exact fingerprint of a sample's bits: sum_i bits_i * (i mod 251 + 1) in wrapping int64
    arithmetic, so any changed element or moved position changes it, and it is the same on every
    device and in every summation order (integer addition is associative)."""
    bits = sample.contiguous().view(_BITS[sample.element_size()]).to(torch.int64)
    position = torch.arange(bits.numel(), device=bits.device) % 251 + 1
    return int((bits * position).sum())


@dataclasses.dataclass(frozen=True)
class WeightDigest:
    """What an engine holds under one parameter name: its shape, its dtype, and the digest of a
    strided sample of its values in that dtype (`sample_digest`)."""

    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "bfloat16"
    value: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> WeightDigest:
        return cls(tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."),
                   sample_digest(digest_sample(tensor)))


class WeightSyncError(RuntimeError):
    """After a weight sync the rollout engine does not hold what it was sent: rollouts would come
    from stale weights."""


class SyncCheck:
    """Verifies one sync: taps the stream of weights going to the engine (keeping a small strided
    sample of each), then compares the engine's digests with those samples cast to the engine's dtype.

        check = SyncCheck()
        engine.update_weights(check.tap(named_weights(actor)))
        check.verify(engine)   # raises WeightSyncError if a tensor the engine holds differs
    """

    def __init__(self) -> None:
        self.sent: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {}

    def tap(self, weights: NamedTensors) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            self.sent[name] = (tuple(tensor.shape), digest_sample(tensor))
            yield name, tensor

    def verify(self, engine: RolloutEngine) -> int:
        """Raise `WeightSyncError` where the engine's copy differs from what was sent; returns the
        number of tensors compared (0: the engine holds none of them under their names)."""
        held = engine.weight_digests(list(self.sent))
        stale = []
        compared = 0
        for name, digest in held.items():
            shape, sample = self.sent[name]
            if digest.shape != shape:
                continue  # stored in another layout (padded vocabulary): not comparable
            compared += 1
            if digest.value != sample_digest(sample.to(getattr(torch, digest.dtype))):
                stale.append(name)
        if stale:
            shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
            raise WeightSyncError(
                f"the rollout engine ({type(engine).__name__}) did not take the actor's weights: after the sync, "
                f"{len(stale)} of the {compared} tensors checked still differ from what was sent ({shown}). "
                "Rollouts would come from stale weights while training goes on. This is a bug in the engine's "
                "update_weights or in its sleep/wake-up order (weights must be loaded after wake_up(['weights']) "
                "and survive wake_up(['kv_cache'])); see docs/rollout_engines.md, 'Weight sync'."
            )
        return compared


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    """The policy worker's engine, decided once from its factory (`choose_engine`): `for_policy` builds it,
    and the memory planner and the plan line count it, so what is built is what is counted."""

    factory: EngineFactory  # a class or a functools.partial of one; an AutoEngine is already resolved
    shares_actor: bool  # generates with the actor's own module (`sharing`): no second copy, a free sync
    dtype: str  # the weights it generates with: its own copy's storage dtype, or the compute dtype (sharing)
    options: Mapping[str, Any]  # every keyword of the engine class: the factory's over the signature's defaults

    @property
    def engine_class(self) -> type:
        return self.factory.func if isinstance(self.factory, functools.partial) else self.factory

    @property
    def decodes_in_process(self) -> bool:
        """A transformers engine (it can share a module): it decodes in this process with a model's forward,
        so its memory is the decoding's; another (vLLM) reserves a share of the device instead."""
        return getattr(self.engine_class, "sharing", None) is not None

    @property
    def keywords(self) -> dict[str, Any]:
        """The keywords set on the factory (the graph's engine node), without the signature's defaults."""
        return dict(self.factory.keywords) if isinstance(self.factory, functools.partial) else {}


def choose_engine(factory: EngineFactory, dtype: str, gpu: bool | None = None) -> EngineChoice:
    """How the policy worker's engine gets its weights: an engine class that can share the actor's module
    in this process (it defines `sharing(module, tokenizer, **options)`: HFEngine) shares it; any other is
    built from the model path and gets the actor's weights through `update_weights`.

    `factory` is the class or a `functools.partial` of it (what `fdl.Partial` builds to), or a factory that
    picks its engine on the machine that builds it (`resolve(gpu)`: `AutoEngine`; `gpu`: whether that
    machine has one, None: this one). `dtype` (the compute dtype) fills only what the factory leaves open:
    a `dtype` (or `device`) set on the engine's node is the engine's own (a sharing engine given one keeps
    its own copy there instead of sharing).
    """
    resolve = getattr(factory, "resolve", None)
    if callable(resolve):
        factory = resolve(gpu)
    keywords = dict(factory.keywords) if isinstance(factory, functools.partial) else {}
    cls = factory.func if isinstance(factory, functools.partial) else factory
    shares = getattr(cls, "sharing", None) is not None and not keywords.keys() & {"dtype", "device"}
    return EngineChoice(factory, shares, keywords.get("dtype", dtype), with_defaults(cls, keywords))


def for_policy(
    factory: EngineFactory | EngineChoice,
    model_path: str,
    actor: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    dtype: str,
    device: torch.device,
) -> RolloutEngine:
    """The policy worker's engine as `choose_engine` decides (a factory is chosen for here first): the
    actor's module shared, or a copy built from `model_path` on `device` in the choice's dtype."""
    choice = factory if isinstance(factory, EngineChoice) else choose_engine(factory, dtype)
    if choice.shares_actor:
        return choice.engine_class.sharing(actor, tokenizer, **choice.keywords)
    return choice.factory(model_path, **{"dtype": choice.dtype, "device": device} | choice.keywords)


def rollout_batch(
    prompts: Batch, responses: torch.Tensor, log_probs: torch.Tensor, sampling: SamplingParams,
    eos_token_ids: list[int], pad_token_id: int,
) -> Batch:
    """The Batch every engine returns, from its raw (B*n, R) responses and their log-probs.

    Keys: `prompts` (B*n,P) the left-padded prompt ids; `responses` (B*n,R) cut after the first
    EOS and padded with the pad token; `response_mask` (B*n,R) 1 up to and including that EOS;
    `rollout_log_probs` (B*n,R) the engine's log-prob of each sampled token at
    `sampling.logit_temperature` (0 on padding); `input_ids`, `attention_mask`, `position_ids`
    over prompt + response; every other column of `prompts` repeated n times; meta `temperature`
    (`sampling.logit_temperature`) and `max_new_tokens` (the generation limit), see `rlhf.batch.ROLLOUT_META`.
    """
    batch = prompts.repeat(sampling.n, interleave=True) if sampling.n > 1 else prompts.select(prompts.keys())
    response_mask = response_mask_from_eos(responses, eos_token_ids)
    return set_rollout_columns(
        batch, prompt_ids=batch["input_ids"], prompt_mask=batch["attention_mask"],
        responses=responses.masked_fill(response_mask == 0, pad_token_id), response_mask=response_mask,
        response_attention=response_mask, log_probs=log_probs, temperature=sampling.logit_temperature,
        max_new_tokens=sampling.max_new_tokens,
    )


def set_rollout_columns(
    batch: Batch, *, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
    response_mask: torch.Tensor, response_attention: torch.Tensor, log_probs: torch.Tensor,
    temperature: float, max_new_tokens: int,
) -> Batch:
    """`batch` (its other columns kept) with the rollout columns every producer writes: single-turn engines
    (`rollout_batch`) and multi-turn trajectories (`rlhf.agents.batch`) alike.

    `prompt_ids`, `prompt_mask` (B,P) left-padded; `responses` (B,R) right-padded; `response_mask` (B,R) the
    tokens trained on; `response_attention` (B,R) the real response tokens (the same mask for one turn;
    for agents it also covers the observations the policy was shown); `log_probs` (B,R), kept where
    `response_mask` is 1; `temperature` and `max_new_tokens` go to meta (`rlhf.batch.ROLLOUT_META`).
    """
    attention_mask = torch.cat([prompt_mask, response_attention], dim=1)
    batch["prompts"] = prompt_ids
    batch["responses"] = responses
    batch["response_mask"] = response_mask
    batch["rollout_log_probs"] = log_probs * response_mask
    batch["input_ids"] = torch.cat([prompt_ids, responses], dim=1)
    batch["attention_mask"] = attention_mask
    batch["position_ids"] = position_ids_from_mask(attention_mask)
    batch.meta["temperature"] = temperature
    batch.meta["max_new_tokens"] = max_new_tokens
    return batch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only (left padding gets position 0)."""
    return (torch.cumsum(attention_mask, dim=1) - 1).clamp(min=0)


def prompt_token_lists(prompts: Batch) -> list[list[int]]:
    """Each left-padded prompt row's real token ids (what a token-id engine such as vLLM takes)."""
    ids, mask = prompts["input_ids"], prompts["attention_mask"].bool()
    return [row[keep].tolist() for row, keep in zip(ids, mask)]


def named_weights(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's full parameters by Hugging Face name, one at a time.

    An FSDP2-sharded tensor (DTensor) is gathered with `full_tensor()` just before it is
    yielded, so only one full tensor beyond the shards exists at a time; every rank must
    iterate (each gather is a collective). Tied weights come once, under their first name
    (`model.embed_tokens.weight`, not `lm_head.weight`): vLLM's loader refuses a tied head's
    name arriving without the embedding in the same call.
    """
    for name, tensor in module.named_parameters():
        full = getattr(tensor, "full_tensor", None)
        yield name, (full() if full is not None else tensor).detach()


def buckets(weights: NamedTensors, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a stream of named tensors into lists of about `bucket_bytes` (a bigger tensor goes alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
