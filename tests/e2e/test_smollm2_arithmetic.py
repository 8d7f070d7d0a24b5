"""The real-model recipe end to end: two tiny GRPO steps of experiments/smollm2_arithmetic.py on SmolLM2,
through the experiment runner with Aim, and its user-written reward read back from the stored run."""

import time
from pathlib import Path

import pytest

import rlhf_configs.common as common
from rlhf.cli import main
from rlhf.cli.experiment import build_graph
from rlhf.cli.rerun import load_run_graph
from rlhf.runtime.experiment import run_experiment
from helpers import load_file

EXACT, LENIENT = "val-core/arithmetic/reward/mean@1", "val-aux/arithmetic/last_number/mean@1"


@pytest.mark.real_model
def test_smoke_trains_and_validates_smollm2(smollm2_path, tmp_path, capsys):
    recipe = load_file("experiments/smollm2_arithmetic.py")
    graph, _ = build_graph(recipe, [f'config:base(model="{smollm2_path}")', "fiddler:smoke", "fiddler:local"])
    common.quiet(graph)
    graph.output_dir, graph.tracker.repo = str(tmp_path / "out"), str(tmp_path / "aim")
    start = time.perf_counter()
    result = run_experiment(graph)["grpo"]
    seconds = time.perf_counter() - start
    assert 0.0 <= result["metrics"][EXACT] <= result["metrics"][LENIENT] <= 1.0  # a bare right number is also last
    assert result["metrics"]["response_length/mean"] <= 4  # the smoke fiddler's limit
    assert (Path(result["checkpoint"]) / "model.safetensors").is_file()
    # the stored graph names the recipe's own reward, and reads back in this process and in `rlhf diff`
    stage, _ = load_run_graph(str(tmp_path / "aim"), result["run_hash"])
    assert stage.reward.scorers["arithmetic"] is recipe.number_reward
    main(["diff", result["run_hash"], "experiments/smollm2_arithmetic.py", "--repo", str(tmp_path / "aim"),
          "--config", "fiddler:smoke"])
    diff = capsys.readouterr().out
    # only the model folder differs (one node, shared by the policy and the tokenizer); the reward does not
    changes = [line for line in diff.splitlines() if line.startswith(("~ ", "+ ", "- "))]
    assert changes and all(line.split(":")[0].endswith(("model_path.source", "name_or_path.source"))
                           for line in changes), diff
    print(f"smollm2 smoke: {seconds:.1f} s")
