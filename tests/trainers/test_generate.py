"""Batch generation on the tiny model: output rows, parquet copy, metrics, resume, Ctrl-C."""

import json
from pathlib import Path

import pytest
from helpers import tiny_model_path

from rlhf.cli import main
from rlhf_configs.generate_eval import generation_experiment
from rlhf.data import DataError, arithmetic_rows, read_rows, write_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import run_experiment
from rlhf.trainers.context import StageContext
from rlhf.trainers.generate import GenerationStage, output_paths
from rlhf.workers.policy import PolicyWorker

ROWS = 6


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    return str(write_rows(arithmetic_rows(ROWS, split="test"), tmp_path_factory.mktemp("data") / "prompts.jsonl"))


@pytest.fixture(scope="module")
def worker() -> PolicyWorker:
    return PolicyWorker(tiny_model_path())  # inference only


def lines(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def generate(data, out, n=2, local=True, **kw):
    graph = generation_experiment(tiny_model_path(), data, str(out), n=n, max_new_tokens=4, batch_size=2,
                                  local=local, progress=False, **kw)
    return run_experiment(graph)["generate"]


def test_output_rows_are_the_input_rows_plus_responses_and_parquet_matches(tmp_path, data):
    result = generate(data, tmp_path / "gens.jsonl")
    rows = lines(result["generations"])
    inputs, _ = read_rows(data)
    assert [r["row_index"] for r in rows] == list(range(ROWS))
    for row, source in zip(rows, inputs):
        assert {k: row[k] for k in source} == source  # every input field kept as it was
        assert len(row["responses"]) == 2 and all(isinstance(t, str) for t in row["responses"])
        assert len(row["response_lengths"]) == 2 and all(1 <= x <= 4 for x in row["response_lengths"])
        assert row["prompt_length"] > 0
    parquet_rows, _ = read_rows(result["parquet"])
    assert parquet_rows == rows
    assert result["metrics"]["generate/prompts"] == ROWS and result["metrics"]["generate/prompts_resumed"] == 0


def test_resume_skips_finished_rows_drops_a_partial_line_and_keeps_row_order(tmp_path, data):
    out = tmp_path / "gens.jsonl"
    first = lines(generate(data, out)["generations"])
    # An interrupted job: rows 0, 3 and 5 were written (say by an earlier, differently batched
    # run), then a crash cut the next line short.
    kept = [first[0], first[3], first[5]]
    out.write_text("".join(json.dumps(r) + "\n" for r in kept) + json.dumps(first[1])[:25])
    with pytest.warns(UserWarning, match="partial last line"):
        result = generate(data, out)
    rows = lines(out)
    assert [r["row_index"] for r in rows] == list(range(ROWS))  # no duplicates, stable order
    for i in (0, 3, 5):
        assert rows[i] == first[i]  # finished rows were not generated again
    assert result["metrics"]["generate/prompts_resumed"] == 3
    assert read_rows(out.with_suffix(".parquet"))[0] == rows


def test_resume_refuses_an_output_of_another_job(tmp_path, data):
    out = tmp_path / "gens.jsonl"
    generate(data, out)
    with pytest.raises(DataError, match="n=3"):
        generate(data, out, n=3)
    other = write_rows(arithmetic_rows(ROWS, split="test", seed=5), tmp_path / "other.jsonl")
    with pytest.raises(DataError, match="differs from the dataset"):
        generate(str(other), out)


class OneWorkerGroup:
    """The worker behind a 1-worker group's interface; Ctrl-C arrives on call `stop_at`, if given."""

    def __init__(self, worker, stop_at=None):
        self.worker, self.stop_at, self.calls = worker, stop_at, 0
        self.world_size = 1

    def generate(self, prompts, sampling):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        return self.worker.generate(prompts, sampling)


@pytest.mark.parametrize("write_every", [1, 2])
def test_ctrl_c_keeps_every_finished_batch_and_a_rerun_completes(tmp_path, data, worker, write_every):
    dataset = PromptDataset(read_rows(data)[0], load_tokenizer(tiny_model_path()))
    sampling = SamplingParams(n=2, max_new_tokens=4)
    out = tmp_path / "gens.jsonl"
    stage = GenerationStage(OneWorkerGroup(worker, stop_at=3), dataset, sampling, str(out), prompts_per_call=2,
                            write_every=write_every)
    with pytest.raises(KeyboardInterrupt):
        stage.run(StageContext(out_dir=tmp_path, progress=False))
    assert [r["row_index"] for r in lines(out)] == [0, 1, 2, 3]  # two finished batches, also when buffered
    logged = []
    stage = GenerationStage(OneWorkerGroup(worker), dataset, sampling, str(out), prompts_per_call=2)
    result = stage.run(StageContext(out_dir=tmp_path, log=lambda m, step: logged.append((step, m)), progress=False))
    assert [r["row_index"] for r in lines(out)] == list(range(ROWS))
    assert result["metrics"]["generate/prompts_resumed"] == 4
    (step, metrics), = logged  # one batch was left; its step counts all prompts done
    assert step == ROWS
    for name in ("response_length/mean", "response_length/clip_ratio", "prompt_length/mean", "timing_s/gen",
                 "perf/throughput", "perf/gen_tokens_per_s"):
        assert name in metrics


def test_output_names_and_the_cli(tmp_path, data, capsys):
    assert output_paths("a/gens.parquet") == (Path("a/gens.jsonl"), Path("a/gens.parquet"))
    with pytest.raises(ValueError, match=".jsonl or .parquet"):
        output_paths("gens.csv")
    out = tmp_path / "cli.parquet"
    assert main(["generate", tiny_model_path(), "--data", data, "--out", str(out), "--n", "1",
                 "--max-new-tokens", "3", "--local", "--quiet"]) == 0
    assert "cli.jsonl" in capsys.readouterr().out
    assert len(read_rows(out)[0]) == ROWS and len(lines(tmp_path / "cli.jsonl")) == ROWS


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_generation_is_data_parallel_over_two_ray_workers(tmp_path, data):
    result = generate(data, tmp_path / "gens.jsonl", workers=2, local=False)
    rows = lines(result["generations"])
    assert [r["row_index"] for r in rows] == list(range(ROWS))
    assert all(len(r["responses"]) == 2 for r in rows)


def test_resume_refuses_another_model_temperature_or_length_limit(tmp_path, data):
    out = tmp_path / "gens.jsonl"
    rows = lines(generate(data, out)["generations"])
    settings = rows[0]["generation_settings"]
    assert settings["model"] == str(Path(tiny_model_path()).resolve()) and settings["temperature"] == 1.0
    assert settings["max_new_tokens"] == 4 and settings["n"] == 2 and len(settings["signature"]) == 16
    out.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))  # an interrupted job: 3 rows written
    with pytest.raises(DataError, match=r"temperature=1\.0.*this job has temperature=0\.5"):
        generate(data, out, temperature=0.5)
    graph = generation_experiment(tiny_model_path(), data, str(out), n=2, max_new_tokens=5, batch_size=2,
                                  local=True, progress=False)
    with pytest.raises(DataError, match=r"max_new_tokens=4.*this job has max_new_tokens=5"):
        run_experiment(graph)
    other = tiny_model_path(seed=1)  # another model: another folder
    with pytest.raises(DataError, match="model="):
        run_experiment(generation_experiment(other, data, str(out), n=2, max_new_tokens=4, batch_size=2,
                                             local=True, progress=False))
    assert len(lines(out)) == 3  # nothing was appended by the refused jobs
    old = [{k: v for k, v in r.items() if k != "generation_settings"} for r in rows[:3]]
    out.write_text("".join(json.dumps(r) + "\n" for r in old))  # written before settings were recorded
    with pytest.raises(DataError, match="does not record the model and sampling settings"):
        generate(data, out)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    assert lines(generate(data, out)["generations"])[:3] == rows[:3]  # the same settings resume


def test_a_retrained_model_in_the_same_folder_is_another_model(tmp_path):
    from rlhf.models.tiny import tiny_qwen2
    from rlhf.trainers.generate import model_signature

    folder = tiny_qwen2(str(tmp_path / "m"), hidden_size=32, num_layers=1, intermediate_size=64, seed=0)
    before = model_signature(folder)
    import shutil

    shutil.rmtree(folder)
    tiny_qwen2(str(tmp_path / "m"), hidden_size=32, num_layers=1, intermediate_size=64, seed=1)
    assert model_signature(folder)["model"] == before["model"]
    assert model_signature(folder)["signature"] != before["signature"]
    assert model_signature("org/some-hub-id") == {"model": "org/some-hub-id"}


def last_digit_scorer(response, ground_truth, extra_info=None):
    """A custom scorer: whether the response ends with the answer's last digit (None: no answer given)."""
    if ground_truth is None:
        return {"score": 0.5, "no_truth": 1}
    return float(response.strip().endswith(ground_truth[-1:]))


def test_prompts_without_ground_truth_generate_and_a_scorer_scores_them(tmp_path):
    rows = arithmetic_rows(4, split="test")
    bare = [{"data_source": "my/task", "prompt": r["prompt"]} for r in rows[:2]] + rows[2:]
    path = str(write_rows(bare, tmp_path / "bare.jsonl", require_ground_truth=False))
    plain = generate(path, tmp_path / "plain.jsonl")
    assert [("scores" in r) for r in lines(plain["generations"])] == [False] * 4
    scored = generate(path, tmp_path / "scored.jsonl", scorer=last_digit_scorer)
    out = lines(scored["generations"])
    assert [r["scores"][:1] for r in out[:2]] == [[0.5], [0.5]] and all(len(r["scores"]) == 2 for r in out)
    assert all(s in (0.0, 1.0) for r in out[2:] for s in r["scores"])
    assert scored["metrics"]["generate/score/mean"] == pytest.approx(sum(sum(r["scores"]) for r in out) / 8)
    parquet = read_rows(scored["parquet"], require_ground_truth=False)[0]  # columns absent in a row come back None
    assert [{k: v for k, v in r.items() if v is not None} for r in parquet] == out


def test_a_scorer_added_on_resume_scores_the_rows_written_without_it(tmp_path, data):
    out = tmp_path / "gens.jsonl"
    rows = lines(generate(data, out)["generations"])
    out.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    result = generate(data, out, scorers={"arithmetic": last_digit_scorer})  # built-ins elsewhere
    resumed = lines(result["generations"])
    assert [r["row_index"] for r in resumed] == list(range(ROWS)) and all(len(r["scores"]) == 2 for r in resumed)
    assert resumed[0]["scores"] == [last_digit_scorer(t, rows[0]["reward_model"]["ground_truth"])
                                    for t in rows[0]["responses"]]


def test_limit_generates_the_first_prompts_and_a_larger_limit_resumes(tmp_path, data):
    out = tmp_path / "gens.jsonl"
    assert [r["row_index"] for r in lines(generate(data, out, limit=2)["generations"])] == [0, 1]
    result = generate(data, out, limit=4)
    assert [r["row_index"] for r in lines(out)] == [0, 1, 2, 3]
    assert result["metrics"]["generate/prompts_resumed"] == 2
    with pytest.raises(DataError, match="larger --limit"):
        generate(data, out, limit=1)


def test_calls_hold_64_responses_per_worker_by_default(data, worker):
    dataset = PromptDataset(read_rows(data)[0], load_tokenizer(tiny_model_path()))

    def calls(n, world_size=1, **kw):
        group = OneWorkerGroup(worker)
        group.world_size = world_size
        stage = GenerationStage(group, dataset, SamplingParams(n=n, max_new_tokens=4), **kw)
        return [len(c) for c in stage.calls(list(range(200)))]

    assert calls(8) == [8] * 25 and calls(1)[:3] == [64, 64, 64] and calls(128) == [1] * 200
    assert calls(8, world_size=2) == [16] * 12 + [8]
    assert calls(8, prompts_per_call=50) == [50] * 4


def test_bad_numbers_in_a_graph_stop_at_preflight_before_any_model_loads(tmp_path, data):
    from rlhf.runtime.preflight import PreflightError

    graph = generation_experiment("/nonexistent/model", data, str(tmp_path / "g.jsonl"), batch_size=0, limit=0,
                                  local=True, progress=False)
    with pytest.raises(PreflightError) as err:
        run_experiment(graph)
    assert "prompts_per_call = 0: GenerationStage.prompts_per_call expects int > 0 | None" in str(err.value)
    assert "limit = 0: load_rows.limit expects int > 0 | None" in str(err.value)
