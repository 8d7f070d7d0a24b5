"""A PEFT adapter folder is a model everywhere a model path goes: loading (merged into its base),
`rlhf export`, `rlhf serve`, `rlhf generate`, and a merged copy on disk for vLLM; an unreachable
base is one clear error."""

import json
import shutil

import pytest
import torch

from helpers import chat_batch, tiny_model_path
from rlhf.cli import main
from rlhf.data import arithmetic_rows, read_rows, write_rows
from rlhf.models.adapters import is_adapter_folder
from rlhf.models.loading import ModelNotFoundError, load_causal_lm, load_tokenizer, model_folder, resolve_model_path
from rlhf.rollout import HFEngine
from rlhf.rollout.sampling import SamplingParams

peft = pytest.importorskip("peft")

from rlhf.workers.lora import LoRA, merged, save_adapter  # noqa: E402


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """An adapter on the tiny model whose B matrices are not zero (so it changes what the model says)."""
    torch.manual_seed(0)
    model = LoRA(rank=4)(load_causal_lm(tiny_model_path()))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    folder = tmp_path_factory.mktemp("adapters") / "adapter"
    save_adapter(model, str(folder))  # no tokenizer: the base's is used
    return folder, merged(model)


def greedy(engine, texts, tokens=8):
    out = engine.generate(chat_batch(engine.tokenizer, texts), SamplingParams(temperature=0.0, max_new_tokens=tokens))
    return out["responses"].tolist()


def test_an_adapter_folder_loads_as_its_base_with_the_adapter_merged(adapter):
    folder, want = adapter
    assert is_adapter_folder(folder) and not is_adapter_folder(tiny_model_path())
    assert resolve_model_path(str(folder)) == str(folder)
    got = load_causal_lm(str(folder)).state_dict()
    base = load_causal_lm(tiny_model_path()).state_dict()
    assert all(torch.allclose(got[k], v, atol=1e-6) for k, v in want.state_dict().items())
    assert any(not torch.equal(got[k], base[k]) for k in base)  # the adapter changed the weights
    assert load_tokenizer(str(folder)).get_vocab() == load_tokenizer(tiny_model_path()).get_vocab()


def test_serving_and_exporting_an_adapter_give_the_merged_model(adapter, tmp_path, capsys):
    folder, _ = adapter
    texts = ["What is 2+3?", "What is 17+25?"]
    served = greedy(HFEngine(str(folder)), texts)  # what `rlhf serve ADAPTER` runs (rlhf.serve.server.load_engine)
    assert main(["export", str(folder), str(tmp_path / "merged")]) == 0
    assert "adapter merged into" in capsys.readouterr().out
    assert (tmp_path / "merged" / "config.json").is_file() and not is_adapter_folder(tmp_path / "merged")
    assert greedy(HFEngine(str(tmp_path / "merged")), texts) == served
    assert served != greedy(HFEngine(tiny_model_path()), texts)


def test_rlhf_generate_takes_an_adapter_folder(adapter, tmp_path):
    folder, _ = adapter
    data = write_rows(arithmetic_rows(3, split="test"), tmp_path / "prompts.jsonl")
    out = tmp_path / "gens.jsonl"
    assert main(["generate", str(folder), "--data", str(data), "--out", str(out), "--n", "1", "--temperature", "0",
                 "--max-new-tokens", "4", "--local", "--quiet"]) == 0
    assert len(read_rows(out.with_suffix(".parquet"))[0]) == 3


def test_a_merged_copy_is_written_once_for_engines_that_read_files(adapter, tmp_path, monkeypatch):
    folder, want = adapter
    monkeypatch.setenv("RLHF_CACHE", str(tmp_path / "cache"))
    assert model_folder(tiny_model_path()) == tiny_model_path()  # a model folder is its own
    first = model_folder(str(folder))
    assert first.startswith(str(tmp_path / "cache" / "merged"))
    assert model_folder(str(folder)) == first
    got = load_causal_lm(first).state_dict()
    assert all(torch.allclose(got[k], v, atol=1e-6) for k, v in want.state_dict().items())
    assert load_tokenizer(first).chat_template


def test_an_adapter_whose_base_is_gone_says_where_to_point_it(adapter, tmp_path):
    folder, _ = adapter
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "no-such-base")
    (moved / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelNotFoundError, match="PEFT adapter whose base model .*no-such-base.*adapter_config.json"):
        load_causal_lm(str(moved))
    with pytest.raises(SystemExit, match="error: .*no-such-base"):
        main(["export", str(moved), str(tmp_path / "out")])
    assert main(["export", str(moved), str(tmp_path / "out"), "--base", tiny_model_path()]) == 0  # or say where it is


def test_a_relative_base_is_found_beside_the_adapter(adapter, tmp_path):
    folder, want = adapter
    shutil.copytree(tiny_model_path(), tmp_path / "base")
    shutil.copytree(folder, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "../base"
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    got = load_causal_lm(str(tmp_path / "adapter")).state_dict()
    assert all(torch.allclose(got[k], v, atol=1e-6) for k, v in want.state_dict().items())
