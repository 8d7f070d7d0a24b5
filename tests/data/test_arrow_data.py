"""The Arrow data layer: same token ids as the per-row path, one fingerprint through every route,
caches that are reused, row errors as good as read_rows', and empty / all-too-long files refused at preflight."""

import json
import warnings

import fiddle as fdl
import pytest
from helpers import tiny_model_path

from rlhf.runtime.preflight_hooks import hook_problems
from rlhf.data.arrow import rows_fingerprint, to_rows
from rlhf.data.files import fingerprint_rows, read_rows, write_rows
from rlhf.data.generators import arithmetic_rows, countdown_rows, gsm8k_like_rows
from rlhf.data.hf_datasets import load_hf_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.schema import DataError
from rlhf.data.sft import SFTDataset, answer_from_extra_info, load_sft_rows
from rlhf.data.sources import load_rows
from rlhf.data.tokenize import chat_prompt_ids, chat_prompt_ids_batch
from rlhf.models.loading import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(tiny_model_path())


def mixed_rows():
    rows = arithmetic_rows(5) + gsm8k_like_rows(5)
    rows[1] = {**rows[1], "prompt": [{"role": "system", "content": "Réponds en français — 答えて"},
                                     *rows[1]["prompt"]]}  # non-ASCII, two messages
    return rows


def test_batched_template_and_tokenizer_give_the_per_row_ids(tok):
    rows = mixed_rows() + countdown_rows(3)
    assert chat_prompt_ids_batch(tok, [r["prompt"] for r in rows]) == [chat_prompt_ids(tok, r["prompt"]) for r in rows]
    assert chat_prompt_ids_batch(tok, []) == []


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json"])
def test_prompt_ids_and_fingerprint_equal_the_per_row_path_from_every_route(tok, tmp_path, suffix):
    rows = mixed_rows()
    path = write_rows(rows, tmp_path / f"train{suffix}")
    expected_ids = [chat_prompt_ids(tok, r["prompt"]) for r in rows]  # what PromptDataset computed per row before
    for source in (rows, load_rows(str(path), cache_dir=str(tmp_path / "c"))):
        data = PromptDataset(source, tok, cache_dir=str(tmp_path / "c"))
        assert list(data.ids) == expected_ids
        assert list(data.rows) == rows and data.fingerprint == fingerprint_rows(rows)
        batch = data.collate([1, 7])
        assert batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist() == expected_ids[1]
        assert list(batch["ground_truth"]) == [rows[1]["reward_model"]["ground_truth"],
                                               rows[7]["reward_model"]["ground_truth"]]


def test_missing_keys_and_none_give_one_fingerprint(tmp_path):
    rows = arithmetic_rows(3)
    rows[0] = {**rows[0], "extra_info": {"index": 0, "note": "only here"}}  # parquet fills `note` with None elsewhere
    del rows[2]["extra_info"]
    via = {s: load_rows(str(write_rows(rows, tmp_path / f"r{s}")), cache_dir=str(tmp_path / "c"))
           for s in (".parquet", ".jsonl", ".json")}
    hub = load_hf_rows("parquet", data_files=str(tmp_path / "r.parquet"), cache_dir=str(tmp_path / "c"))
    prints = {rows_fingerprint(d) for d in [*via.values(), hub]}
    assert prints == {fingerprint_rows(to_rows(via[".jsonl"]))}
    assert fingerprint_rows([{"a": 1, "b": None}]) == fingerprint_rows([{"a": 1}])  # None == absent
    assert to_rows(via[".parquet"])[1]["extra_info"] == rows[1]["extra_info"]  # no None keys come back


def test_tokenising_is_cached_by_content_and_settings(tok, tmp_path):
    cache = tmp_path / "cache"
    jsonl = write_rows(gsm8k_like_rows(20), tmp_path / "a.jsonl")
    parquet = write_rows(gsm8k_like_rows(20), tmp_path / "a.parquet")
    first = PromptDataset(load_rows(str(jsonl), cache_dir=str(cache)), tok, cache_dir=str(cache))
    files = {p: p.stat().st_mtime_ns for p in (cache / "rlhf").glob("prompts-*.arrow")}
    assert len(files) == 1
    again = PromptDataset(load_rows(str(parquet), cache_dir=str(cache)), tok, cache_dir=str(cache))  # same rows
    assert {p: p.stat().st_mtime_ns for p in (cache / "rlhf").glob("prompts-*.arrow")} == files  # reused, not rewritten
    assert again.fingerprint == first.fingerprint and list(again.ids) == list(first.ids)
    PromptDataset(load_rows(str(parquet), cache_dir=str(cache)), tok, max_prompt_length=300, cache_dir=str(cache))
    assert len(list((cache / "rlhf").glob("prompts-*.arrow"))) == 2  # another setting, another cache file


def test_parallel_map_gives_the_same_dataset(tok, tmp_path):
    rows = mixed_rows() * 3
    one = PromptDataset(rows, tok, cache_dir=str(tmp_path / "a"))
    two = PromptDataset(rows, tok, cache_dir=str(tmp_path / "b"), num_proc=2)
    assert list(two.ids) == list(one.ids) and two.fingerprint == one.fingerprint
    assert len(list((tmp_path / "b" / "rlhf").glob("prompts-*_of_00002.arrow"))) == 2


def _bad_files(tmp_path):
    rows = arithmetic_rows(4)
    del rows[2]["reward_model"]
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n{not json\n" + json.dumps(rows[2]) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "extra_info"} for r in rows[:2]]
                                        + [{"data_source": "x", "prompt": [], "reward_model": {"ground_truth": "1"}}]),
                   parquet)
    return jsonl, parquet


def test_row_errors_are_those_of_read_rows(tmp_path):
    for path in _bad_files(tmp_path):
        with pytest.raises(DataError) as want:
            read_rows(path)
        with pytest.raises(DataError) as got:
            load_rows(str(path), cache_dir=str(tmp_path / "c"))
        assert str(got.value) == str(want.value) and str(path) in str(got.value)
        assert "row 2" in str(got.value)
        _, report = read_rows(path, on_error="skip")
        with pytest.warns(UserWarning) as caught:
            kept = load_rows(str(path), on_error="skip", cache_dir=str(tmp_path / "c"))
        assert str(caught[0].message) == str(report) and len(kept) == report.rows_kept
        if path.suffix == ".jsonl":  # blank lines are not rows, but count as lines
            assert "row 2 (line 4): invalid JSON" in str(report) and "row 3 (line 5)" in str(report)


def test_empty_files_fail_at_preflight_naming_the_file(tok, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "zero.jsonl").write_bytes(b"")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    pq.write_table(pa.table({"data_source": pa.array([], pa.string())}), tmp_path / "none.parquet")
    for name in ("zero.jsonl", "blank.jsonl", "none.parquet"):
        path = str(tmp_path / name)
        with pytest.raises(DataError, match=f"{path}: the file (is empty|has no rows)"):
            load_rows.preflight({"path": path})
        with pytest.raises(DataError, match=f"{path}: the file"):
            load_sft_rows.preflight({"path": path})


def test_every_prompt_too_long_fails_at_preflight_naming_the_file(tmp_path):
    path = write_rows(gsm8k_like_rows(4), tmp_path / "long.parquet")
    tokenizer = fdl.Config(load_tokenizer, tiny_model_path())
    graph = fdl.Config(PromptDataset, rows=fdl.Config(load_rows, path=str(path)), tokenizer=tokenizer,
                       max_prompt_length=20)
    (problem,) = hook_problems(graph)
    assert f"{path}: every prompt is longer than max_prompt_length=20 tokens" in problem
    assert "Fix: raise max_prompt_length" in problem and len(problem.splitlines()) == 1
    graph.max_prompt_length = 512
    assert hook_problems(graph) == []
    sft = fdl.Config(SFTDataset, rows=fdl.Config(load_sft_rows, path=str(path)), tokenizer=tokenizer,
                     response=answer_from_extra_info, max_length=30)
    (problem,) = hook_problems(sft)
    assert f"{path}: every row of SFT dataset 'sft' is longer than max_length=30" in problem


def test_sft_from_a_file_equals_sft_from_the_list(tok, tmp_path):
    rows = gsm8k_like_rows(6)
    path = write_rows(rows, tmp_path / "sft.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = SFTDataset(rows, tok, response=answer_from_extra_info, cache_dir=str(tmp_path / "c"))
        b = SFTDataset(load_sft_rows(str(path), cache_dir=str(tmp_path / "c")), tok, response=answer_from_extra_info,
                       cache_dir=str(tmp_path / "c"))
    assert a.fingerprint == b.fingerprint == fingerprint_rows(rows)
    assert a.collate(range(6)).tensors.keys() == b.collate(range(6)).tensors.keys()
    for key in ("input_ids", "response_mask"):
        assert a.collate(range(6))[key].tolist() == b.collate(range(6))[key].tolist()
    c = SFTDataset(rows, tok, cache_dir=str(tmp_path / "c"))  # another response function: another cache entry
    assert c.collate([0])["responses"].shape[1] < a.collate([0])["responses"].shape[1]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".json"])
def test_prompts_to_generate_for_need_no_ground_truth(tok, tmp_path, suffix):
    rows = arithmetic_rows(4)
    bare = [{"data_source": r["data_source"], "prompt": r["prompt"]} for r in rows[:2]] + rows[2:]
    path = write_rows(bare, tmp_path / f"bare{suffix}", require_ground_truth=False)
    with pytest.raises(DataError, match=r"row 0.*'reward_model' is missing"):
        load_rows(str(path))  # prompts for training or evaluation must carry the answer
    loaded = load_rows(str(path), kind="generation")
    assert to_rows(loaded) == [{"extra_info": {}, **r} for r in bare]
    batch = PromptDataset(loaded, tok).collate(range(4))
    assert list(batch["ground_truth"]) == [None, None, rows[2]["reward_model"]["ground_truth"],
                                     rows[3]["reward_model"]["ground_truth"]]
    with pytest.raises(DataError, match="reward_model"):
        write_rows(bare, tmp_path / f"strict{suffix}")


def test_a_limit_keeps_the_first_rows(tok, tmp_path):
    rows = arithmetic_rows(6)
    path = str(write_rows(rows, tmp_path / "six.jsonl"))
    limited = load_rows(path, limit=4)
    assert to_rows(limited) == to_rows(load_rows(path))[:4]
    dataset = PromptDataset(limited, tok)
    assert len(dataset) == 4 and dataset.fingerprint == fingerprint_rows(rows[:4])
    assert len(load_rows(path, limit=10)) == 6
    from rlhf.graph.typecheck import annotation_problems

    assert annotation_problems([(fdl.Config(load_rows, path=path, limit=0), "rows")]) == [
        "rows.limit = 0: load_rows.limit expects int > 0 | None"]
