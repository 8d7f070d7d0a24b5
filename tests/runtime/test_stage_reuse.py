"""A finished upstream stage with the same graph and data is reused, not run again: by the members of a sweep
over a later stage's setting, and by a later run in the same output folder; its lineage points at the reused run."""

from __future__ import annotations

from pathlib import Path

import pytest
import sweep_toy_experiment as toy
from helpers import load_file

import rlhf
import rlhf_configs.common as common
from rlhf.runtime.experiment import run_experiment
from rlhf.tracking.query import find_runs


def checkpoints(folder: Path, stage: str, name: str) -> list[Path]:
    """The files stage `stage` wrote, one per time it ran."""
    return sorted(p for p in folder.rglob(name) if p.parent.name == stage)


def test_a_sweep_over_the_downstream_stage_runs_the_upstream_stage_once(tmp_path, capsys):
    repo, out = str(tmp_path / "aim"), tmp_path / "out"
    results = rlhf.sweep(toy.base(repo=repo, output_dir=str(out)),
                         [{"stages.read.scale": 2.0}, {"stages.read.scale": 3.0}, {"stages.train.lr": 0.5}])
    assert len(checkpoints(out, "train", "ckpt.txt")) == 2  # member 0's, reused by member 1; member 2's own
    first, second, third = results
    assert "reused_from" not in first["train"] and "reused_from" not in third["train"]
    assert second["train"]["reused_from"] == str(Path(first["train"]["checkpoint"]).parent)
    assert second["train"]["run_hash"] == first["train"]["run_hash"]
    assert second["read"]["parent_run"] == first["train"]["run_hash"]  # lineage: the reused run
    assert [r["read"]["metrics"]["toy/read"] for r in results] == pytest.approx([0.2, 0.3, 0.5])
    assert "stage 'train': reusing the finished run in" in capsys.readouterr().out
    runs = {(r["params"]["sweep"]["index"], r["stage"]): r for r in find_runs(repo, experiment="toy_sweep")}
    assert sorted(runs) == [(0, "read"), (0, "train"), (1, "read"), (2, "read"), (2, "train")]
    assert runs[1, "read"]["params"]["reused_stages"] == {"train": second["train"]["reused_from"]}


def test_a_later_run_in_the_same_folder_reuses_it_when_asked_and_the_last_stage_always_runs(tmp_path):
    graph = toy.base(output_dir=str(tmp_path / "out"))
    graph.tracker = None
    run_experiment(graph)
    assert "reused_from" not in run_experiment(graph)["train"]  # a single run: off unless asked
    assert len(checkpoints(tmp_path / "out", "train", "ckpt.txt")) == 2
    graph.reuse_upstream = True
    assert "reused_from" not in run_experiment(graph)["train"]  # runs with reuse on index what they finish
    again = run_experiment(graph)
    assert "reused_from" in again["train"] and again["read"]["metrics"]["toy/read"] == pytest.approx(0.1)
    assert len(checkpoints(tmp_path / "out", "train", "ckpt.txt")) == 3
    graph.reuse_upstream = False  # off: it runs again
    assert "reused_from" not in run_experiment(graph)["train"]
    assert len(checkpoints(tmp_path / "out", "train", "ckpt.txt")) == 4


def test_a_reused_stage_whose_folder_was_deleted_runs_again(tmp_path):
    graph = toy.base(output_dir=str(tmp_path / "out"))
    graph.tracker = None
    graph.reuse_upstream = True
    first = run_experiment(graph)
    for path in Path(first["train"]["checkpoint"]).parent.iterdir():
        path.unlink()
    Path(first["train"]["checkpoint"]).parent.rmdir()
    assert "reused_from" not in run_experiment(graph)["train"]


def test_a_sweep_over_a_grpo_setting_trains_sft_once_on_the_tiny_model(tmp_path):
    """arithmetic_tiny (SFT -> GRPO -> eval), its smoke size cut further: two members differ in GRPO's learning
    rate only and share one SFT; a third changes SFT's and trains its own (12 s)."""
    module = load_file("experiments/arithmetic_tiny.py")
    graph = module.base()
    module.smoke(graph)
    for fiddler in (common.quiet, common.local, common.no_tracking):
        fiddler(graph)
    graph.stages["sft"].total_steps = 2
    graph.output_dir = str(tmp_path / "out")
    lr = "stages.grpo.policy.worker.optimizer.lr"
    results = rlhf.sweep(graph, [{lr: 1e-4}, {lr: 2e-4}, {"stages.sft.policy.worker.optimizer.lr": 1e-3}],
                         stages=["sft", "grpo"])
    assert len(checkpoints(tmp_path / "out", "sft", "final")) == 2  # SFT ran for members 0 and 2 only
    assert results[1]["sft"]["checkpoint"] == results[0]["sft"]["checkpoint"]
    assert results[2]["sft"]["checkpoint"] != results[0]["sft"]["checkpoint"]
    assert all("grpo" in r and "reused_from" not in r["grpo"] for r in results)
