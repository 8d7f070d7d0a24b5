"""Code written in an experiment file (a reward, a stage) survives the process that ran it: `rlhf rerun` and
`rlhf diff` of the run work from another directory, where the file is on no import path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rlhf.cli import main
from rlhf.tracking.query import find_runs

EXPERIMENT = '''
"""An experiment whose reward and stage are defined in this very file."""
import sys

import fiddle as fdl

from rlhf.runtime.experiment import Experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.tracking.aim_tracker import AimTracker


def shouted_reward(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    return 1.0 if solution_str.upper() == ground_truth else 0.0


class ScoreStage:
    def __init__(self, reward, answers: tuple = ("YES", "yes", "no")):
        self.reward, self.answers = reward, answers

    def run(self, ctx):
        score = sum(self.reward(a, "YES") for a in self.answers) / len(self.answers)
        ctx.log({"val-core/toy/score/mean@1": score}, 1)
        return {"metrics": {"val-core/toy/score/mean@1": score}}


def base(repo: str = ".aim", out: str = "outputs") -> fdl.Config:
    return fdl.Config(Experiment, name="user_code", stages={"score": fdl.Config(ScoreStage, reward=shouted_reward)},
                      runtime=fdl.Config(LocalRuntime), tracker=fdl.Config(AimTracker, repo=repo, experiment="user_code"),
                      output_dir=out, progress=False)


def fewer(cfg):
    """Score two answers only."""
    cfg.stages["score"].answers = ("YES", "no")


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of an experiment file outside the project: `python FILE` (the file is `__main__` there) from
    its own folder, and `rlhf run FILE --config fiddler:fewer` in this process."""
    root = tmp_path_factory.mktemp("user_code")
    folder = root / "my_experiments"
    folder.mkdir()
    file = folder / "user_code_experiment.py"
    file.write_text(textwrap.dedent(EXPERIMENT))
    repo = str(root / "aim")
    base = f'config:base(repo="{repo}", out="{root}/out")'
    subprocess.run([sys.executable, file.name, "--config", base], cwd=folder, check=True, capture_output=True)
    main(["run", str(file), "--config", base, "--config", "fiddler:fewer"])
    hashes = [r["hash"] for r in sorted(find_runs(repo), key=lambda r: r["created"])]
    yield repo, hashes, root, file
    sys.modules.pop("user_code_experiment", None)


def test_the_stored_graph_names_the_file_not_main(runs):
    repo, hashes, _, file = runs
    (run,) = [r for r in find_runs(repo) if r["hash"] == hashes[0]]
    stored = json.loads(run["params"]["graph_json"])
    assert "__main__" not in json.dumps(stored["objects"])
    assert stored["rlhf_sources"] == {"user_code_experiment": str(file.resolve())}


def test_rerun_and_diff_load_the_reward_from_the_experiment_file(runs, capsys, monkeypatch):
    repo, (first, second), root, _ = runs
    monkeypatch.chdir(root)  # not the experiment's folder: only the recorded file can bring it back
    sys.modules.pop("user_code_experiment", None)
    assert main(["diff", first, second, "--repo", repo]) == 0
    assert "~ answers: ['YES', 'yes', 'no'] -> ['YES', 'no']" in capsys.readouterr().out
    assert main(["rerun", first, "--repo", repo, "--local", "--output_dir", str(root / "again")]) == 0
    assert "0.667" in capsys.readouterr().out  # the reward ran: 2 of 3 answers are YES in capitals
    reruns = [r for r in find_runs(repo) if r["params"].get("rerun_of") == first]
    assert len(reruns) == 1


def test_a_moved_experiment_file_is_named_in_the_error(runs, tmp_path, monkeypatch):
    repo, (first, _), root, file = runs
    moved = tmp_path / "elsewhere.py"
    monkeypatch.chdir(tmp_path)
    os.replace(file, moved)
    sys.modules.pop("user_code_experiment", None)
    try:
        with pytest.raises(SystemExit, match="user_code_experiment"):
            main(["rerun", first, "--repo", repo, "--local", "--output_dir", str(root / "gone")])
    finally:
        os.replace(moved, file)
