"""How a worker-group call spreads over data-parallel ranks, declared on the worker method.

`@shard`: the first argument (a `Batch`) is padded to a multiple of the world size by
repeating rows, split into contiguous shards (rank r gets shard r), and the Batch results are
concatenated and unpadded; right for generation and scoring, where a repeated row is wasted
work but changes nothing. `@shard_exact`: the same without padding: the batch must divide
evenly (a repeated row would train twice), and non-Batch results come back as a per-rank list.
`@on_all_ranks`: every rank gets the same arguments; the call returns the per-rank results.
Methods without a mark are `on_all_ranks`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

F = TypeVar("F", bound=Callable)
Mode = Literal["shard", "shard_exact", "all"]


def shard(fn: F) -> F:
    fn.__rlhf_dispatch__ = "shard"  # type: ignore[attr-defined]
    return fn


def shard_exact(fn: F) -> F:
    fn.__rlhf_dispatch__ = "shard_exact"  # type: ignore[attr-defined]
    return fn


def on_all_ranks(fn: F) -> F:
    fn.__rlhf_dispatch__ = "all"  # type: ignore[attr-defined]
    return fn


def dispatch_mode(worker_cls: type, method: str) -> Mode:
    fn = getattr(worker_cls, method, None)
    if fn is None or not callable(fn):
        public = sorted(m for m in dir(worker_cls) if not m.startswith("_") and callable(getattr(worker_cls, m)))
        raise AttributeError(f"{worker_cls.__name__} has no method {method!r}; methods: {public}")
    return getattr(fn, "__rlhf_dispatch__", "all")
