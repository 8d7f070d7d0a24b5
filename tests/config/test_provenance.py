"""Provenance: where each value was set (`rlhf show`), and that labelling it changes no hash."""

from __future__ import annotations

import re
from pathlib import Path

import fiddle as fdl
import pytest
import toy_experiment
from hypothesis import given
from hypothesis import strategies as st

import rlhf_configs.common as common
from rlhf.cli import main
from rlhf.graph.io import graph_hash
from rlhf.config.overrides import apply_overrides, apply_set
from rlhf.config.provenance import format_provenance

ARITHMETIC = "experiments/arithmetic_tiny.py"


def lines_by_path(text: str) -> dict[str, str]:
    """`path: type = value  # where` -> {path: where}."""
    out = {}
    for line in text.splitlines():
        left, _, where = line.partition("  # ")
        out[re.split(r"[:=]", left, maxsplit=1)[0].strip()] = where.strip()
    return out


def test_show_names_the_file_line_fiddler_gin_file_command_line_and_defaults(tmp_path):
    gin_file = tmp_path / "lr.gin"
    gin_file.write_text("# a comment\nTrainer.lr = 0.75\n")
    graph, _ = apply_overrides(
        ["fiddler:tiny", f"fiddler:gin(path='{gin_file}')", "set:stages.sft.name='x'"], [toy_experiment, common]
    )
    where = lines_by_path(format_provenance(graph))
    source = Path(toy_experiment.__file__).read_text().splitlines()
    base_line = next(i for i, line in enumerate(source, 1) if "def base" in line) + 1
    assert where["stages['sft'].total_steps"] == f"tests/config/toy_experiment.py:{base_line} (base)"
    tiny_line = next(i for i, line in enumerate(source, 1) if "def tiny" in line) + 1
    assert where["stages['grpo'].lr"] == f"{gin_file}:2"  # the gin file came after the fiddler
    assert where["stages['sft'].lr"] == f"{gin_file}:2"
    assert where["stages['sft'].name"] == "command line: set:stages.sft.name='x'"
    assert where["stages['grpo'].name"] == "default" and where["seed"] == "default"
    graph, _ = apply_overrides(["fiddler:tiny"], [toy_experiment])
    assert lines_by_path(format_provenance(graph))["stages['grpo'].lr"] == (
        f"fiddler:tiny (tests/config/toy_experiment.py:{tiny_line})"
    )


def test_show_lists_a_shared_node_once_and_points_to_it():
    shared = fdl.Config(toy_experiment.Trainer, lr=0.3)
    graph = fdl.Config(toy_experiment.Root, stages={"a": shared, "b": shared})
    text = format_provenance(graph)
    assert "stages['a'].lr: float = 0.3" in text
    assert "stages['b'] = <the node at stages['a']>" in text
    assert "stages['b'].lr" not in text


def test_rlhf_show_prints_each_value_with_where_it_was_set(capsys):
    main(["show", ARITHMETIC, "--config", "fiddler:smoke", "--config", "set:stages.grpo.total_steps=7"])
    where = lines_by_path(capsys.readouterr().out)
    assert where["stages['grpo'].total_steps"] == "command line: set:stages.grpo.total_steps=7"
    assert where["stages['grpo'].prompts_per_step"].startswith("fiddler:smoke (experiments/arithmetic_tiny.py:")
    assert where["stages['sft'].policy.worker.optimizer.lr"].startswith("experiments/arithmetic_tiny.py:")
    assert where["stages['grpo'].seed"] == "default"


@given(st.floats(1e-6, 1.0), st.integers(1, 100))
def test_labelled_history_does_not_change_the_hash(lr, steps):
    by_command_line = toy_experiment.base()
    apply_set(by_command_line, f"stages.grpo.lr={lr!r}")
    apply_set(by_command_line, f"stages.sft.total_steps={steps}")
    by_hand = toy_experiment.base()
    by_hand.stages["grpo"].lr = lr
    by_hand.stages["sft"].total_steps = steps
    assert graph_hash(by_command_line) == graph_hash(by_hand)
    assert by_command_line.stages["grpo"].__argument_history__["lr"][-1].location != (
        by_hand.stages["grpo"].__argument_history__["lr"][-1].location
    )


def test_set_and_fiddler_errors_still_name_the_valid_choices():
    with pytest.raises(Exception, match="Did you mean 'tiny'"):
        apply_overrides(["fiddler:tinny"], [toy_experiment])
