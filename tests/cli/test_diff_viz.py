"""`rlhf diff` of two command lines and `rlhf viz` (rlhf.cli.diff, rlhf.cli.viz)."""

from __future__ import annotations

from rlhf.cli import main

ARITHMETIC = "experiments/arithmetic_tiny.py"


def test_rlhf_diff_of_two_command_lines(capsys):
    main(["diff", ARITHMETIC, ARITHMETIC, "--b_config", "fiddler:smoke", "--b_config", "set:stages.grpo.total_steps=7"])
    out = capsys.readouterr().out
    assert "~ stages.grpo.total_steps: 250 -> 7" in out
    assert "~ stages.grpo.prompts_per_step: 64 -> 4" in out
    assert "~ stages.sft.evaluator.dataset.rows.n: 500 -> 32" in out
    assert "~ stages.sft.total_steps: 250 -> 40" in out
    # smoke's changes (7 data/step sizes, the SFT schedule, the partial-credit reward of RL and of validation, two
    # nodes since validation has its own) and the set:
    assert "~ stages.grpo.reward.scorers.arithmetic:" in out and "~ stages.eval.evaluator.reward.scorers.arithmetic:" in out
    assert len([line for line in out.splitlines() if line.startswith("~")]) == 12


def test_rlhf_viz_writes_svg_dot_and_the_plan(tmp_path, capsys, monkeypatch):
    import shutil

    main(["viz", ARITHMETIC, "--out", str(tmp_path / "viz"), "--stages", "sft,grpo"])
    files = sorted(p.name for p in (tmp_path / "viz").iterdir())
    plan = (tmp_path / "viz" / "plan.txt").read_text()
    assert "group policy: 1 x PolicyWorker" in plan and "batch arithmetic per step" in plan
    assert (tmp_path / "viz" / "grpo.dot").read_text().startswith("graph {")
    if shutil.which("dot"):
        assert files == ["grpo.dot", "grpo.svg", "plan.txt", "sft.dot", "sft.svg"]
        assert (tmp_path / "viz" / "grpo.svg").read_text().lstrip().startswith("<?xml")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    main(["viz", ARITHMETIC, "--out", str(tmp_path / "nodot"), "--stages", "eval"])
    assert sorted(p.name for p in (tmp_path / "nodot").iterdir()) == ["eval.dot", "plan.txt"]
    assert "apt-get install -y graphviz" in capsys.readouterr().out
