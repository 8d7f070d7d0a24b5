"""A toy sweep with real Aim runs, run once and shared by the sweep, rerun, diff and UI tests."""

from __future__ import annotations

import pytest
import sweep_toy_experiment as toy


@pytest.fixture(scope="session")
def toy_sweep(tmp_path_factory):
    """`lr_sweep` of the toy experiment, two members x two stages = four Aim runs.

    Returns (results, repo path, output folder).
    """
    import rlhf

    root = tmp_path_factory.mktemp("toy_sweep")
    repo, out = str(root / "aim"), str(root / "out")
    results = rlhf.sweep(toy.base(repo=repo, output_dir=out), toy.lr_sweep(), name="lr_sweep")
    return results, repo, out
