"""EvalJob on hand-made generations with known correctness: exact table values, JSON, PNG, Aim, lineage."""

import json
import shutil

import pytest
from helpers import tiny_model_path

from rlhf.cli import main
from rlhf_configs.generate_eval import eval_experiment
from rlhf.data import arithmetic_rows, write_rows
from rlhf.rewards import RewardManager, UnknownDataSourceError, default_scorers
from rlhf.runtime.experiment import run_experiment
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.tracking.query import find_runs, metric_values
from rlhf.trainers.context import StageContext
from rlhf.rewards import arithmetic_answer, gsm8k_answer
from rlhf.trainers.eval_job import EvalJob
from rlhf.tracking.query import producer_run


def row(source, truth, responses):
    return {"data_source": source, "prompt": [{"role": "user", "content": f"q{truth}{responses}"}],
            "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {}, "responses": responses}


ROWS = [
    row("arithmetic", "5", ["5", "5", "4", "3"]),  # scores 1 1 0 0
    row("arithmetic", "5", ["1", "2", "2", "5"]),  # scores 0 0 0 1; the majority "2" is wrong
    row("arithmetic", "7", [" 7", "7<|im_end|>", "7", "7 "]),  # all correct, one answer "7"
    row("openai/gsm8k", "72", ["#### 72", "The answer is 72", "#### 70", "#### 72.0"]),  # strict: 1 0 0 1
]

# Per prompt (A, B, C) of "arithmetic", n = 4:
#   mean@4  = (2/4 + 1/4 + 1) / 3                                  = 7/12
#   pass@2  = (1 - C(2,2)/C(4,2) + 1 - C(3,2)/C(4,2) + 1) / 3
#           = (5/6 + 1/2 + 1) / 3                                  = 7/9
#   maj@4   = (1 + 0 + 1) / 3                                      = 2/3
#   maj@2   = A: of 6 pairs only (4,3) elects a wrong answer -> 5/6; B: "5" never wins a pair -> 0; C: 1
#           = (5/6 + 0 + 1) / 3                                    = 11/18
#   std@4   = (0.5 + sqrt(3/16) + 0) / 3
# "openai/gsm8k", one prompt: answers 72, none, 70, 72.
#   mean@4 = 1/2, pass@2 = 5/6, maj@4 = 1 ("72" twice),
#   maj@2 = pairs (72,-) (72,70) (72,72) (-,70) (-,72) (70,72) -> 1 1 1 0 1 0 = 4/6
EXPECTED = {
    "val-core/arithmetic/reward/mean@4": 7 / 12,
    "val-core/arithmetic/reward/pass@1": 7 / 12,
    "val-core/arithmetic/reward/pass@2": 7 / 9,
    "val-core/arithmetic/reward/pass@4": 1.0,
    "val-aux/arithmetic/reward/maj@1/mean": 7 / 12,
    "val-aux/arithmetic/reward/maj@2/mean": 11 / 18,
    "val-core/arithmetic/reward/maj@4/mean": 2 / 3,
    "val-aux/arithmetic/reward/best@2/mean": 7 / 9,
    "val-core/arithmetic/reward/best@4/mean": 1.0,
    "val-aux/arithmetic/reward/std@4": (0.5 + (3 / 16) ** 0.5) / 3,
    "val-core/openai/gsm8k/reward/mean@4": 0.5,
    "val-core/openai/gsm8k/reward/pass@2": 5 / 6,
    "val-aux/openai/gsm8k/reward/maj@2/mean": 4 / 6,
    "val-core/openai/gsm8k/reward/maj@4/mean": 1.0,
    # one prompt: every bootstrap resample is that prompt
    "val-aux/openai/gsm8k/reward/pass@2/ci_low": 5 / 6,
    "val-aux/openai/gsm8k/reward/pass@2/ci_high": 5 / 6,
}


@pytest.fixture
def generations(tmp_path):
    return str(write_rows(ROWS, tmp_path / "gens.jsonl"))


def reward():
    return RewardManager(default_scorers())


def test_answer_extractors_normalise_what_the_scorers_forgive():
    assert arithmetic_answer(" 68<|im_end|> ") == "68" and arithmetic_answer("  ") is None
    assert gsm8k_answer("so #### 1,234.0") == gsm8k_answer("#### 1234")
    assert gsm8k_answer("it is 12") is None and gsm8k_answer("it is 12", "flexible") == 12


def test_metrics_table_json_and_plot(tmp_path, generations, capsys):
    logged = []
    job = EvalJob(reward(), generations=generations, ks=(1, 2, 4, 8), out_dir=str(tmp_path / "eval"))
    result = job.run(StageContext(out_dir=tmp_path / "unused", log=lambda m, s: logged.append((s, m))))
    for name, value in EXPECTED.items():
        assert result["metrics"][name] == pytest.approx(value, abs=1e-12), name
    assert not any("@8" in name for name in result["metrics"])  # k=8 > n=4 is skipped...
    out = capsys.readouterr().out
    assert "k=8 skipped" in out  # ...and said so
    assert "pass@2" in out and "0.7778" in out and "95% CI" in out
    assert logged == [(0, result["metrics"])]

    report = json.loads((tmp_path / "eval" / "eval_results.json").read_text())
    assert report["sources"]["arithmetic"]["prompts"] == 3 and report["sources"]["arithmetic"]["n"] == 4
    pass2 = report["sources"]["arithmetic"]["metrics"]["pass@2"]
    assert pass2["value"] == pytest.approx(7 / 9) and pass2["ci_low"] <= 7 / 9 <= pass2["ci_high"]
    assert report["metrics"] == pytest.approx(result["metrics"])
    assert (tmp_path / "eval" / "accuracy_vs_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_inputs_fail_with_a_reason(tmp_path, generations):
    ctx = StageContext(out_dir=tmp_path)
    bare = write_rows([{k: v for k, v in r.items() if k != "responses"} for r in ROWS], tmp_path / "bare.jsonl")
    with pytest.raises(ValueError, match="no `responses` list"):
        EvalJob(reward(), generations=str(bare)).run(ctx)
    with pytest.raises(UnknownDataSourceError):
        EvalJob(RewardManager({"arithmetic": default_scorers()["arithmetic"]}), generations=generations).run(ctx)
    ragged = write_rows([ROWS[0], {**ROWS[1], "responses": ["5"]}], tmp_path / "ragged.jsonl")
    with pytest.raises(ValueError, match="different numbers of responses"):
        EvalJob(reward(), generations=str(ragged), plot=False).run(ctx)
    with pytest.raises(ValueError, match="exactly one"):
        EvalJob(reward())


def test_eval_run_in_aim_is_linked_to_the_run_that_wrote_the_generations(tmp_path, generations):
    repo = str(tmp_path / "aim")
    with AimTracker(repo=repo, experiment="generate").start_run("generate", params={"generations": generations}) as gen:
        pass
    graph = eval_experiment(generations=generations, out=str(tmp_path / "eval"), ks=(1, 2, 4), aim_repo=repo,
                            progress=False)
    result = run_experiment(graph)["eval"]
    run = {r["hash"]: r for r in find_runs(repo)}[result["run_hash"]]
    assert run["params"]["parent_run"] == gen.hash and run["params"]["status"] == "finished"
    assert metric_values(repo, result["run_hash"], "val-core/arithmetic/reward/pass@2") == [(0, pytest.approx(7 / 9))]
    assert metric_values(repo, result["run_hash"], "val-aux/arithmetic/reward/maj@2/mean") == [
        (0, pytest.approx(11 / 18))
    ]


def test_eval_of_an_rl_checkpoint_generates_and_links_to_the_rl_run(tmp_path):
    # A checkpoint folder as a trainer writes it: <output_dir>/<experiment>/<stamp>/<stage>/final.
    checkpoint = tmp_path / "outputs" / "arith" / "20250101-000000" / "grpo" / "final"
    shutil.copytree(tiny_model_path(), checkpoint)
    repo = str(tmp_path / "aim")
    tracker = AimTracker(repo=repo, experiment="arith")
    with tracker.start_run("sft", params={"checkpoint": "outputs/arith/20250101-000000/sft/final"}):
        pass
    # recorded relative to the directory the RL run started in, which is not this one
    with tracker.start_run("grpo", params={"checkpoint": "outputs/arith/20250101-000000/grpo/final"}) as rl:
        pass
    assert producer_run(repo, str(checkpoint)) == rl.hash
    assert producer_run(repo, str(tmp_path)) is None

    data = write_rows(arithmetic_rows(4, split="test"), tmp_path / "prompts.jsonl")
    graph = eval_experiment(model=str(checkpoint), data=str(data), out=str(tmp_path / "eval"), n=2, ks=(1, 2),
                            max_new_tokens=3, batch_size=2, local=True, aim_repo=repo, progress=False)
    result = run_experiment(graph)["eval"]
    run = {r["hash"]: r for r in find_runs(repo)}[result["run_hash"]]
    assert run["params"]["parent_run"] == rl.hash
    assert len((tmp_path / "eval" / "generations.jsonl").read_text().splitlines()) == 4
    assert "val-core/arithmetic/reward/pass@2" in result["metrics"]


def test_cli_eval_of_a_generations_file(tmp_path, generations, capsys):
    assert main(["eval", "--generations", generations, "--ks", "1,2", "--out", str(tmp_path / "e"), "--quiet"]) == 0
    assert "maj@2/mean" in capsys.readouterr().out
    assert json.loads((tmp_path / "e" / "eval_results.json").read_text())["ks"] == [1, 2]
    with pytest.raises(SystemExit):
        main(["eval", "--ks", "1,2"])  # neither a generations file nor a model
