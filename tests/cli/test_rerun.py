"""A run's stored graph is the exact graph: `rlhf rerun` rebuilds it (same hash), `rlhf diff` compares runs."""

from __future__ import annotations

import pytest
import sweep_toy_experiment as toy

from rlhf.cli import main
from rlhf.cli.rerun import load_run_graph, rerun, rerun_graph
from rlhf.graph.io import graph_hash
from rlhf.runtime.experiment import run_experiment
from rlhf.tracking.query import find_runs


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerun")
    repo = str(root / "aim")
    graph = toy.base(repo=repo, output_dir=str(root / "out"))
    graph.stages["train"].lr = 0.25
    results = run_experiment(graph)
    return results, repo, root


def test_rerun_rebuilds_the_stored_graph_with_the_same_hash(original):
    results, repo, root = original
    read_hash = results["read"]["run_hash"]
    (stored,) = [r for r in find_runs(repo) if r["hash"] == read_hash]
    graph, _ = load_run_graph(repo, read_hash[:8])  # a prefix is enough
    assert graph_hash(graph) == stored["graph_hash"]
    # The read stage stored its StageOutput resolved: the checkpoint path of the train stage.
    assert graph.checkpoint == results["train"]["checkpoint"]

    again = rerun(read_hash, repo, local=True, output_dir=str(root / "again"))
    (new_run,) = [r for r in find_runs(repo) if r["hash"] == again["read"]["run_hash"]]
    assert new_run["graph_hash"] == stored["graph_hash"]
    assert new_run["params"]["rerun_of"] == read_hash and new_run["experiment"] == "toy_sweep"
    assert again["read"]["metrics"] == results["read"]["metrics"]


def test_rerun_with_a_change_and_from_the_command_line(original, capsys):
    results, repo, root = original
    train_hash = results["train"]["run_hash"]
    root_graph, _ = rerun_graph(repo, train_hash, local=True, commands=["set:stages.train.steps=2"])
    assert root_graph.stages["train"].steps == 2 and root_graph.stages["train"].lr == 0.25
    assert main(["rerun", train_hash, "--repo", repo, "--local", "--output_dir", str(root / "cli")]) == 0
    out = capsys.readouterr().out
    runs = [r for r in find_runs(repo) if r["params"].get("rerun_of") == train_hash]
    assert len(runs) == 1 and runs[0]["hash"] in out
    assert runs[0]["graph_hash"] == next(r["graph_hash"] for r in find_runs(repo) if r["hash"] == train_hash)


def test_rerun_of_an_unknown_run_says_how_to_find_runs(original):
    _, repo, _ = original
    with pytest.raises(SystemExit, match="no run 'ffffff' in the Aim repo"):
        main(["rerun", "ffffff", "--repo", repo])
    with pytest.raises(SystemExit, match="no Aim repo"):
        main(["rerun", "ffffff", "--repo", repo + "-missing"])


def test_diff_of_two_runs_of_a_sweep(toy_sweep, capsys):
    results, repo, _ = toy_sweep
    a, b = results[0]["train"]["run_hash"], results[1]["train"]["run_hash"]
    main(["diff", a, b, "--repo", repo])
    out = capsys.readouterr().out
    assert f"--- run {a} (toy_sweep, stage train)" in out
    assert out.strip().splitlines()[2:] == ["~ lr: 0.1 -> 0.5"]
    main(["diff", a, a, "--repo", repo])
    assert "no differences" in capsys.readouterr().out


def test_diff_of_a_run_and_its_experiment_file(toy_sweep, capsys, monkeypatch):
    import sys

    # `rlhf diff FILE.py` loads the file as module `sweep_toy_experiment`: keep the one the other tests use.
    monkeypatch.setitem(sys.modules, "sweep_toy_experiment", toy)
    monkeypatch.setattr(sys, "path", list(sys.path))
    results, repo, _ = toy_sweep
    run = results[1]["train"]["run_hash"]
    main(["diff", toy.__file__, run, "--repo", repo])
    out = capsys.readouterr().out
    assert "[stage train]" in out and "~ lr: 0.1 -> 0.5" in out
