"""Length-bucketed SFT batches: less padding than random batches, same determinism and resume."""

import numpy as np
import pytest

from rlhf.data.generators import arithmetic_rows, gsm8k_like_rows
from rlhf.data.sft import SFTDataset, answer_from_extra_info, length_bucketed_batches, padding_fraction
from rlhf.data.tokenize import shuffled_batches
from rlhf.models.loading import load_tokenizer
from helpers import tiny_model_path


@pytest.fixture(scope="module")
def data():
    tok = load_tokenizer(tiny_model_path())
    rows = arithmetic_rows(64, seed=1) + gsm8k_like_rows(64, seed=1)  # ~20 and ~150-400 tokens
    for row in rows:
        row["extra_info"].setdefault("answer", row["reward_model"]["ground_truth"])
    return SFTDataset(rows, tok, response=answer_from_extra_info)


def test_padding_fraction_counts_padded_tokens(data):
    batch = data.collate([0, 1])
    mask = batch["attention_mask"]
    # hand count: padded positions / all positions
    assert padding_fraction(batch) == pytest.approx(float((mask == 0).sum()) / mask.numel())


def test_bucketing_cuts_padding_on_mixed_lengths(data):
    def mean_padding(bucketed):
        batches = data.shuffled(8, seed=3, bucketed=bucketed)
        return np.mean([padding_fraction(next(batches)) for _ in range(32)])  # 2 epochs

    random, bucketed = mean_padding(False), mean_padding(True)
    assert random > 0.4 and bucketed < random / 3, (random, bucketed)


def test_bucketed_order_is_an_epoch_permutation_and_resumes(data):
    lengths = data.lengths
    full = [b for b, _ in zip(length_bucketed_batches(lengths, 8, seed=5), range(40))]
    resumed = [b for b, _ in zip(length_bucketed_batches(lengths, 8, seed=5, start_step=23), range(17))]
    assert resumed == full[23:]
    assert sorted(i for batch in full[:16] for i in batch) == list(range(len(data)))  # each row once per epoch
    assert full[:16] != full[16:32]  # reshuffled each epoch
    assert full != [b for b, _ in zip(length_bucketed_batches(lengths, 8, seed=6), range(40))]


def test_unbucketed_order_is_unchanged(data):
    got = [b["input_ids"].tolist() for b, _ in zip(data.shuffled(8, seed=2, bucketed=False), range(3))]
    want = [data.collate(ix)["input_ids"].tolist() for ix, _ in zip(shuffled_batches(len(data), 8, 2), range(3))]
    assert got == want
