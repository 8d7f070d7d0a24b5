"""The tiny local model and its byte-level Qwen2 tokenizer survive a save/load round trip."""

import re

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf.models.tiny import tiny_qwen2
from helpers import tiny_model_path


def test_tokenizer_round_trips_any_text_exactly():
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    assert type(tok).__name__ == "Qwen2Tokenizer"
    for text in ["What is 23+45?", "  two  spaces\nand newline\t", "héllo 世界 ✓", "#### 1,234."]:
        assert tok.decode(tok(text)["input_ids"]) == text


def test_tokenizer_specials_padding_and_chat_template():
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    assert tok.padding_side == "left"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_build_is_idempotent_and_deterministic(tmp_path):
    a = tiny_qwen2(str(tmp_path / "a"), hidden_size=16, num_layers=1, intermediate_size=32, seed=3)
    b = tiny_qwen2(str(tmp_path / "b"), hidden_size=16, num_layers=1, intermediate_size=32, seed=3)
    assert tiny_qwen2(a, hidden_size=16, num_layers=1, intermediate_size=32, seed=3) == a  # reused as is
    ma, mb = (AutoModelForCausalLM.from_pretrained(p) for p in (a, b))
    for (ka, va), (kb, vb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


def test_an_existing_folder_built_with_other_settings_is_refused(tmp_path):
    """The graph would say one model while another trains: refused (also before anything starts), never reused."""
    import pytest

    path = tiny_qwen2(str(tmp_path / "m"), hidden_size=16, num_layers=1, intermediate_size=32)
    for kwargs, named in [({"hidden_size": 32}, "hidden_size=16 (asked: 32)"), ({"seed": 1}, "seed=0 (asked: 1)")]:
        settings = {"hidden_size": 16, "num_layers": 1, "intermediate_size": 32, **kwargs}
        with pytest.raises(ValueError, match=re.escape(named)):
            tiny_qwen2(path, **settings)
        with pytest.raises(ValueError, match="delete the folder to rebuild it"):
            tiny_qwen2.preflight({**dict(num_heads=4, num_kv_heads=2, max_position_embeddings=512, seed=0,
                                         vocab_size=None), **settings, "path": path})
    assert AutoModelForCausalLM.from_pretrained(path).config.hidden_size == 16  # untouched


def test_a_folder_from_before_settings_were_recorded_is_checked_against_its_config(tmp_path):
    import pytest

    path = tiny_qwen2(str(tmp_path / "m"), hidden_size=16, num_layers=1, intermediate_size=32)
    (tmp_path / "m" / "rlhf_tiny.json").unlink()
    assert tiny_qwen2(path, hidden_size=16, num_layers=1, intermediate_size=32) == path
    with pytest.raises(ValueError, match=re.escape("num_layers=1 (asked: 2)")):
        tiny_qwen2(path, hidden_size=16, num_layers=2, intermediate_size=32)
