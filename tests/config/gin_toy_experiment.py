"""A toy experiment module with a `gin` fiddler, as an experiment's command line sees it."""

from __future__ import annotations

import fiddle as fdl

from gin_toy_components import toy_graph
from rlhf.config.gin_overrides import apply_gin


def base() -> fdl.Config:
    return toy_graph()


def gin(cfg: fdl.Config, path: str | None = None, text: str | None = None) -> None:
    """Apply a gin file's bindings."""
    apply_gin(cfg, path, text)
