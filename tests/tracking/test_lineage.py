"""lineage: git state and the params every run records."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import fiddle as fdl
import pytest

from rlhf.graph import io as graph_io
from rlhf.tracking.lineage import git_info, lineage_params

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@dataclasses.dataclass
class ToyModel:
    hidden: int = 64


def git(cwd, *args):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@needs_git
def test_git_info_reads_commit_and_dirty_state(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "train.py").write_text("print(1)\n")
    git(tmp_path, "add", "train.py")
    git(tmp_path, "commit", "-q", "-m", "first")
    head = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "sub").mkdir()

    assert git_info(str(tmp_path)) == {"commit": head, "dirty": False}
    assert git_info(str(tmp_path / "sub")) == {"commit": head, "dirty": False}
    (tmp_path / "outputs.log").write_text("untracked files do not count\n")
    assert git_info(str(tmp_path))["dirty"] is False
    (tmp_path / "train.py").write_text("print(2)\n")
    assert git_info(str(tmp_path)) == {"commit": head, "dirty": True}


@needs_git
def test_git_info_in_a_repo_without_commits(tmp_path):
    git(tmp_path, "init", "-q")
    assert git_info(str(tmp_path)) == {"commit": None, "dirty": None}


def test_git_info_outside_a_checkout_or_a_missing_path(tmp_path):
    assert git_info(str(tmp_path)) == {"commit": None, "dirty": None}
    assert git_info(str(tmp_path / "does-not-exist")) == {"commit": None, "dirty": None}


def test_lineage_params_hold_graph_hash_json_and_provenance(tmp_path):
    graph = fdl.Config(ToyModel, hidden=8)
    params = lineage_params(
        graph=graph,
        overrides=("set:hidden=8",),
        fiddlers=("tiny",),
        parent_run="abc123",
        data_fingerprints={"train": "f1", "val": "f2"},
        plan_text="plan",
        git_path=str(tmp_path),
    )
    assert params == {
        "graph": {"__fn__": f"{__name__}.ToyModel", "hidden": 8},
        "graph_hash": graph_io.graph_hash(graph),
        "graph_json": graph_io.to_json(graph),
        "overrides": ["set:hidden=8"],
        "fiddlers": ["tiny"],
        "git": {"commit": None, "dirty": None},
        "data": {"train": "f1", "val": "f2"},
        "parent_run": "abc123",
        "plan": "plan",
    }
    assert graph_io.from_json(params["graph_json"]) == graph
