"""Model paths that cannot be found fail at once with a message that says how to fix them."""

import time

import pytest

from rlhf.models.loading import ModelNotFoundError, load_causal_lm, load_tokenizer, resolve_model_path
from helpers import tiny_model_path


def test_local_folder_loads():
    path = tiny_model_path()
    assert resolve_model_path(path) == path
    assert load_tokenizer(path).padding_side == "left"
    assert sum(p.numel() for p in load_causal_lm(path).parameters()) > 0


def test_missing_folder_names_the_path(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope" / "deeper"))


def test_folder_without_config_is_explained(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def test_offline_hub_id_fails_fast_with_offline_instructions(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match="fiddler:tiny"):
        resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct")
    assert time.perf_counter() - start < 10


def test_a_tokenizer_without_chat_template_is_refused_with_the_fix(tmp_path):
    """The one tokenizer loader (a policy's and a reward model's) refuses a tokenizer that cannot render
    chat rows, naming the folder and the fix."""
    import shutil

    from rlhf.models.tiny import byte_level_qwen2_tokenizer

    tokenizer = byte_level_qwen2_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path)
    shutil.copy(f"{tiny_model_path()}/config.json", tmp_path)
    with pytest.raises(ValueError, match=rf"tokenizer at {tmp_path} has no chat template.*Fix: .*chat_template"):
        load_tokenizer(str(tmp_path))
