"""Shared test fixtures' building blocks: the tiny model, built once per session."""

import functools
import os
import tempfile

from rlhf.models.tiny import tiny_qwen2

_ROOT = os.environ.get("RLHF_TEST_MODELS", os.path.join(tempfile.gettempdir(), "rlhf-test-models"))


@functools.cache
def tiny_model_path(hidden_size: int = 32, num_layers: int = 2, seed: int = 0) -> str:
    """A tiny Qwen2 folder shared by tests (built on first use; identical for a given seed)."""
    return tiny_qwen2(
        os.path.join(_ROOT, f"h{hidden_size}-l{num_layers}-s{seed}"),
        hidden_size=hidden_size, num_layers=num_layers, intermediate_size=4 * hidden_size, seed=seed,
    )
