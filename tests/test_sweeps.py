"""Sweeps: members applied to copies of a graph, each run as its own tagged Aim run set."""

from __future__ import annotations

import functools

import fiddle as fdl
import pytest
import sweep_toy_experiment as toy

import rlhf
from rlhf.cli.experiment import run_cli
from rlhf.config.overrides import OverrideError
from rlhf.config.provenance import format_provenance
from rlhf.sweeps import SweepError, expand, sweep_members
from rlhf.runtime.preflight import PreflightError
from rlhf.tracking.query import find_runs, metric_values


def test_expand_applies_each_member_to_its_own_copy():
    base = toy.base()
    members = expand(base, [{"stages.train.lr": 0.2}, {"stages['train'].lr": 0.3, "stages.read.scale": 2.0}],
                     name="s", sweep_id="s-1")
    assert base.stages["train"].__arguments__.get("lr") is None  # the base graph is untouched
    assert [m.graph.stages["train"].lr for m in members] == [0.2, 0.3]
    assert [m.label for m in members] == ["lr=0.2", "lr=0.3, scale=2.0"]
    assert members[1].params == {"sweep": {
        "id": "s-1", "name": "s", "index": 1, "size": 2, "label": "lr=0.3, scale=2.0",
        "overrides": {"stages": {"train": {"lr": 0.3}, "read": {"scale": 2.0}}},
    }}
    assert [m.graph.output_dir for m in members] == ["outputs/sweeps/s-1/0", "outputs/sweeps/s-1/1"]
    shown = [line for line in format_provenance(members[0].graph).splitlines() if line.startswith("stages['train'].lr")]
    assert [line.split("  # ")[1] for line in shown] == ["sweep:s[0]"]


def test_members_may_be_fiddlers_and_hold_any_graph_value():
    members = expand(toy.base(), [functools.partial(toy.longer, steps=3),
                                  {"stages.train.lr": fdl.Config(toy.needs_value, 1.0)}])
    assert members[0].graph.stages["train"].steps == 3
    assert members[0].overrides == {"fiddler": "longer(steps=3)"} and members[0].label == "longer(steps=3)"
    assert members[1].params["sweep"]["overrides"] == {"stages": {"train": {"lr": "needs_value(value=1.0)"}}}


def test_bad_members_fail_with_the_fix():
    with pytest.raises(OverrideError, match="has no field 'lrr'. Did you mean 'lr'"):
        expand(toy.base(), [{"stages.train.lrr": 1}])
    with pytest.raises(OverrideError, match="member 0 is a int"):
        expand(toy.base(), [3])
    with pytest.raises(OverrideError, match="has no members"):
        expand(toy.base(), [])
    with pytest.raises(OverrideError, match="no sweep function 'lr_swep'. Did you mean 'lr_sweep'"):
        sweep_members([toy], "sweep:lr_swep")
    with pytest.raises(OverrideError, match="returned a dict"):
        sweep_members([toy], "not_a_list_sweep")
    assert sweep_members([toy], "lr_sweep(values=(1.0,))") == ("lr_sweep", [{"stages.train.lr": 1.0}])


def test_a_sweep_runs_every_member_as_tagged_aim_runs(toy_sweep):
    results, repo, _ = toy_sweep
    assert len(results) == 2 and results.sweep_id.startswith("lr_sweep-")
    assert [r["train"]["metrics"]["val-core/toy/acc/mean@1"] for r in results] == pytest.approx(
        [1 - 2.718281828459045 ** (-0.1 * 4), 1 - 2.718281828459045 ** (-0.5 * 4)])
    runs = find_runs(repo, experiment="toy_sweep")
    assert len(runs) == 4
    for run in runs:
        sweep = run["params"]["sweep"]
        assert run["tags"] == [results.sweep_id] and sweep["id"] == results.sweep_id and sweep["name"] == "lr_sweep"
        assert sweep["overrides"] == {"stages": {"train": {"lr": [0.1, 0.5][sweep["index"]]}}}
        experiment, folder, stage = run["name"].split("/")  # runs of one stage tell apart in Aim's tables
        assert (experiment, stage) == ("toy_sweep", run["stage"]) and folder
    assert len({run["name"] for run in runs}) == 4
    train_run = results[1]["train"]["run_hash"]
    assert [s for s, _ in metric_values(repo, train_run, "toy/loss")] == [1, 2, 3, 4]
    assert results[1]["read"]["parent_run"] == train_run  # lineage inside a member still holds


def test_the_cli_runs_a_sweep_of_the_experiment(tmp_path, capsys):
    repo = str(tmp_path / "aim")
    results = run_cli(toy, ["--config", f"config:base(repo='{repo}', output_dir='{tmp_path / 'out'}')",
                            "--sweep", "steps_sweep", "--stages", "train"])
    assert [r["train"]["metrics"]["val-core/toy/acc/mean@1"] for r in results] == pytest.approx(
        [1 - 2.718281828459045 ** (-0.1 * 2), 1 - 2.718281828459045 ** (-0.1 * 6)])
    runs = find_runs(repo)
    assert sorted(r["params"]["sweep"]["label"] for r in runs) == ["longer(steps=2)", "longer(steps=6)"]
    assert all(r["params"]["overrides"][-1] == "sweep:steps_sweep" for r in runs)
    out = capsys.readouterr().out
    assert "longer(steps=2)" in out and "steps_sweep-" in out


def test_every_member_is_checked_before_any_runs(tmp_path):
    graph = toy.base(repo=str(tmp_path / "aim"), output_dir=str(tmp_path / "out"))
    message = r"member 1 \(lr=needs_value\(\)\): stages.train.lr.value: needs_value needs `value`"
    with pytest.raises(PreflightError, match=message):
        rlhf.sweep(graph, toy.broken_sweep())
    assert not (tmp_path / "out").exists() and not (tmp_path / "aim").exists()
    with pytest.raises(SystemExit, match="member 1"):
        run_cli(toy, ["--config", f"config:base(repo='{tmp_path / 'aim'}')", "--sweep", "broken_sweep"])


def test_a_failing_member_does_not_stop_the_others(tmp_path):
    graph = toy.base(output_dir=str(tmp_path / "out"))
    graph.tracker = None
    # A failure only running shows (a well-typed value: the sweep's preflight would refuse a mistyped one).
    missing = str(tmp_path / "no-such-checkpoint")
    with pytest.raises(SweepError, match=r"1 of 2 members failed: \[0\] checkpoint=") as err:
        rlhf.sweep(graph, [{"stages.read.checkpoint": missing}, {"stages.read.scale": 2.0}], stages=["train", "read"])
    assert err.value.results[0] is None and err.value.results[1]["read"]["metrics"]["toy/read"] == pytest.approx(0.2)


def test_dry_run_prints_the_members(capsys):
    members = run_cli(toy, ["--sweep", "lr_sweep(values=(0.1, 0.2, 0.3))", "--print_plan"])
    assert [m.label for m in members] == ["lr=0.1", "lr=0.2", "lr=0.3"]
    assert "[2] lr=0.3" in capsys.readouterr().out


@pytest.mark.slow
def test_members_run_in_parallel_processes(tmp_path):
    repo = str(tmp_path / "aim")
    graph = toy.base(repo=repo, output_dir=str(tmp_path / "out"))
    results = rlhf.sweep(graph, toy.lr_sweep((0.1, 0.2, 0.3)), parallel=2, name="par")
    assert [round(r["read"]["metrics"]["toy/read"], 6) for r in results] == [0.1, 0.2, 0.3]
    runs = find_runs(repo, experiment="toy_sweep")
    assert len(runs) == 6 and all(r["params"]["status"] == "finished" for r in runs)
    assert {r["params"]["sweep"]["id"] for r in runs} == {results.sweep_id}
    logs = sorted((tmp_path / "out" / "sweeps" / results.sweep_id).glob("*/member.log"))
    assert len(logs) == 3
