"""The `rlhf` command dispatches to experiments and prints plans and graphs."""

import pytest

from rlhf.cli import main


def test_plan_prints_groups(capsys):
    assert main(["plan", "experiments/arithmetic_tiny.py", "--config", "fiddler:workers(n=2)"]) == 0
    out = capsys.readouterr().out
    assert "[grpo]" in out and "group policy: 2 x PolicyWorker" in out


def test_show_prints_the_graph_after_overrides(capsys):
    main(["show", "experiments/arithmetic_tiny.py", "--config", "set:stages.grpo.total_steps=7"])
    assert "stages['grpo'].total_steps: int > 0 = 7" in capsys.readouterr().out  # the type with its range


def test_unknown_command_and_missing_file():
    with pytest.raises(SystemExit, match="unknown command"):
        main(["frobnicate"])
    with pytest.raises(SystemExit, match="no experiment file"):
        main(["run", "experiments/nope.py"])
