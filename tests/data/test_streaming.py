"""StreamingPromptDataset: PromptDataset's ids and fingerprint from a stream, and step-exact resume."""

import itertools

import pytest
from helpers import tiny_model_path

from rlhf.data.files import write_rows
from rlhf.data.generators import arithmetic_rows, gsm8k_like_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.schema import DataError
from rlhf.data.sources import load_rows
from rlhf.data.streaming import StreamingPromptDataset
from rlhf.models.loading import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(tiny_model_path())


@pytest.fixture(params=[".parquet", ".jsonl"])
def path(request, tmp_path):
    rows = arithmetic_rows(17) + gsm8k_like_rows(3)  # the 3 long ones are filtered at max_prompt_length=60
    return write_rows(rows, tmp_path / f"train{request.param}")


def stream(path, tok, **kw):
    return StreamingPromptDataset(load_rows(str(path), streaming=True), tok, max_prompt_length=60,
                                  shuffle_buffer=8, chunk=5, **kw)


def uids(batches, n):
    return [list(b["uid"]) for b in itertools.islice(batches, n)]


def test_same_ids_and_fingerprint_as_the_map_style_dataset(path, tok):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = PromptDataset(load_rows(str(path)), tok, max_prompt_length=60)
    streamed = stream(path, tok)
    assert streamed.fingerprint == data.fingerprint and streamed.data_sources == data.data_sources
    batches = list(streamed.in_order(4))
    assert [len(b) for b in batches] == [4, 4, 4, 4, 1] and streamed.num_filtered == 3
    got = [row[mask.bool()].tolist() for b in batches for row, mask in zip(b["input_ids"], b["attention_mask"])]
    assert got == list(data.ids)  # 17 kept rows, in file order, same token ids


def test_resume_from_a_position_or_by_replay_is_step_exact(tmp_path, tok):
    # JSON Lines: `datasets` waits 5 s whenever a parquet stream is left before its end (apache/arrow#45214)
    path = write_rows(arithmetic_rows(17) + gsm8k_like_rows(3), tmp_path / "train.jsonl")
    data = stream(path, tok)
    full = uids(data.shuffled(4, seed=3), 10)  # 17 kept rows -> 4 batches per epoch: 2.5 epochs
    assert sorted(sum(full[:4], [])) == sorted(set(sum(full[:4], [])))  # no repeats within an epoch
    assert full[:4] != full[4:8]  # reshuffled each epoch
    for step in (1, 4, 6):  # mid-epoch, at the epoch boundary, in the second epoch
        batches = data.shuffled(4, seed=3)
        uids(batches, step)
        position = dict(batches.position)
        assert uids(stream(path, tok).shuffled(4, seed=3, position=position), 10 - step) == full[step:]
        assert uids(stream(path, tok).shuffled(4, seed=3, start_step=step), 10 - step) == full[step:]
    assert uids(data.shuffled(4, seed=4), 4) != full[:4]


def test_a_stream_with_no_fitting_prompt_names_the_file(tmp_path, tok):
    path = write_rows(gsm8k_like_rows(3), tmp_path / "long.jsonl")
    with pytest.raises(DataError, match=f"{path}: no prompt of the stream fits max_prompt_length=60"):
        next(stream(path, tok).shuffled(2, seed=0))
    with pytest.raises(DataError, match=f"{path}: row \\d+ has a prompt of .* tokens"):
        next(stream(path, tok, overlong="error").shuffled(2, seed=0))


def test_streaming_preflight_refuses_empty_files_and_bad_rows(tmp_path):
    (tmp_path / "blank.jsonl").write_text("\n")
    with pytest.raises(DataError, match="blank.jsonl: the file has no rows"):
        load_rows.preflight({"path": str(tmp_path / "blank.jsonl"), "streaming": True})
    (tmp_path / "bad.jsonl").write_text('{"data_source": "x"}\n')
    with pytest.raises(DataError, match="bad.jsonl, row 0 \\(line 1\\): field 'prompt' is missing"):
        load_rows.preflight({"path": str(tmp_path / "bad.jsonl"), "streaming": True})
