"""How a worker-group call spreads over data-parallel ranks, declared on the worker method.

`@shard`: the first argument (a `Batch`) is padded to a multiple of the world size by
repeating rows, split into contiguous shards (rank r gets shard r), and the Batch results are
concatenated and unpadded; right for generation and scoring, where a repeated row is wasted
work but changes nothing. `@shard_exact`: the same without padding: the batch must divide
evenly (a repeated row would train twice), and non-Batch results come back as a per-rank list.
`@on_all_ranks`: every rank gets the same arguments; the call returns the per-rank results.
Methods without a mark are `on_all_ranks`.

Sharded calls balance tokens by default: when the Batch has an `attention_mask`, rows go to
ranks by Karmarkar-Karp on their token counts (rlhf.workers.balance) instead of contiguously,
so no rank waits on another's long rows; results still come back in the original row order.
`@shard(balance=False)` / `@shard_exact(balance=False)` keeps contiguous shards for a method,
`group.balance = False` for a whole worker group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

F = TypeVar("F", bound=Callable)
Mode = Literal["shard", "shard_exact", "all"]


def _mark(mode: Mode, fn: F | None, balance: bool) -> F | Callable[[F], F]:
    def mark(f: F) -> F:
        f.__rlhf_dispatch__ = mode  # type: ignore[attr-defined]
        f.__rlhf_balance__ = balance  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


def shard(fn: F | None = None, *, balance: bool = True) -> F | Callable[[F], F]:
    """`@shard` or `@shard(balance=False)`: padded, sharded, results concatenated in row order."""
    return _mark("shard", fn, balance)


def shard_exact(fn: F | None = None, *, balance: bool = True) -> F | Callable[[F], F]:
    """`@shard_exact` or `@shard_exact(balance=False)`: sharded without padding (training)."""
    return _mark("shard_exact", fn, balance)


def on_all_ranks(fn: F) -> F:
    fn.__rlhf_dispatch__ = "all"  # type: ignore[attr-defined]
    return fn


def dispatch_mode(worker_cls: type, method: str) -> Mode:
    fn = getattr(worker_cls, method, None)
    if fn is None or not callable(fn):
        public = sorted(m for m in dir(worker_cls) if not m.startswith("_") and callable(getattr(worker_cls, m)))
        raise AttributeError(f"{worker_cls.__name__} has no method {method!r}; methods: {public}")
    return getattr(fn, "__rlhf_dispatch__", "all")


def dispatch_balance(worker_cls: type, method: str) -> bool:
    """Whether a sharded `method` balances rows across ranks by token count (see `shard`)."""
    return getattr(getattr(worker_cls, method), "__rlhf_balance__", True)
