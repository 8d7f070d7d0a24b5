"""The KV-cache argument of a transformers forward, across the rename `past_key_values` -> `cache`.

transformers 5.2x renamed it (and the output field); the old name still works there but warns on
every call, and older releases (vLLM's CPU build pins < 5.20) only know the old one. Decoding
loops pass the cache through `cache_kwargs` and read it back with `output_cache`, so they run
quietly on both.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

__all__ = ["cache_kwargs", "output_cache"]


@functools.cache
def _cache_argument(forward_owner: type) -> str:
    params = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """`{name: cache}` with the name `model`'s forward takes (wrappers such as DDP or PEFT: their module's)."""
    inner = model
    while not _has_cache_argument(type(inner)) and hasattr(inner, "module"):
        inner = inner.module
    owner = type(inner)
    if not _has_cache_argument(owner):
        base = getattr(inner, "get_base_model", None)
        owner = type(base()) if callable(base) else owner
    return {_cache_argument(owner): cache}


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned, under either name."""
    cache = getattr(output, "cache", None) if "cache" in getattr(output, "__dataclass_fields__", {}) else None
    return cache if cache is not None else output.past_key_values


def _has_cache_argument(cls: type) -> bool:
    params = inspect.signature(cls.forward).parameters
    return "cache" in params or "past_key_values" in params
