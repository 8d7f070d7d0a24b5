"""`rlhf data prepare preferences`: the tiny model samples, a scorer ranks, (best, worst) pairs are written."""

import json

import pytest
from helpers import tiny_model_path

from rlhf.cli import main
from rlhf.data import arithmetic_rows, write_rows
from rlhf.data.preferences import PreferenceDataset, load_preference_rows, longer_chosen_share
from rlhf.models.loading import load_tokenizer

PROMPTS = 10
SCORER = '''
def digits(response, ground_truth, extra_info):
    """How many digits the answer has: random tiny-model answers differ in it."""
    return float(sum(c.isdigit() for c in response))
'''


def test_pairs_are_the_best_and_worst_samples_and_a_rescore_relabels(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pref_scorer.py").write_text(SCORER)
    data = str(write_rows(arithmetic_rows(PROMPTS, seed=1), tmp_path / "prompts.jsonl"))
    out = tmp_path / "pairs"
    argv = ["data", "prepare", "preferences", "--model", tiny_model_path(), "--data", data, "--samples", "4",
            "--out", str(out), "--max-new-tokens", "6", "--local", "--quiet", "--test-fraction", "0.3",
            "--with-margin"]
    assert main([*argv, "--scorer", "pref_scorer:digits"]) == 0
    printed = capsys.readouterr().out
    train, test = (load_preference_rows(str(out / f"{split}.parquet")) for split in ("train", "test"))
    generated = {tuple(json.dumps(m) for m in g["prompt"]): g
                 for g in map(json.loads, (out / "generations.jsonl").read_text().splitlines())}
    pairs = train + test
    ties = PROMPTS - len(pairs)
    assert f"{len(pairs)} pairs, {ties} prompts dropped" in printed and len(pairs) >= 5
    assert len(test) == round(0.3 * len(pairs))
    for pair in pairs:
        samples = generated[tuple(json.dumps(m) for m in pair["prompt"])]["responses"]
        digits = [sum(c.isdigit() for c in s) for s in samples]
        info = pair["extra_info"]
        assert info["chosen_score"] == max(digits) > info["rejected_score"] == min(digits)
        assert pair["chosen"][0]["content"] in samples and pair["rejected"][0]["content"] in samples
        assert pair["margin"] == info["chosen_score"] - info["rejected_score"]
        assert pair["data_source"] == "arithmetic" and "ground_truth" in pair["reward_model"]
    assert len(PreferenceDataset(train, load_tokenizer(tiny_model_path()))) == len(train)
    assert f"the chosen one in {longer_chosen_share(pairs):.1%} of the pairs" in printed

    # the same samples, pairs balanced for length: the same prompts and labels, chosen among the ties
    assert main([*argv, "--scorer", "pref_scorer:digits", "--length-balanced"]) == 0
    balanced = [*(load_preference_rows(str(out / f"{split}.parquet")) for split in ("train", "test"))]
    balanced = balanced[0] + balanced[1]
    assert f"the chosen one in {longer_chosen_share(balanced):.1%} of the pairs" in capsys.readouterr().out
    assert sorted(p["extra_info"]["chosen_score"] for p in balanced) == sorted(
        p["extra_info"]["chosen_score"] for p in pairs)

    # the same samples, relabelled by a built-in rule: a random model is never right, so every prompt ties
    with pytest.raises(SystemExit, match="every prompt's 4 answers scored the same"):
        main([*argv, "--scorer", "arithmetic"])
    with pytest.raises(SystemExit, match="2"):
        main(["data", "prepare", "preferences", "--model", "m", "--data", data, "--out", str(out),
              "--scorer", "no_such_rule"])
    assert "no built-in rule of that name" in capsys.readouterr().err
