"""The tiny local model and its byte-level Qwen2 tokenizer survive a save/load round trip."""

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
    assert tiny_qwen2(a, hidden_size=999) == a  # an existing folder is reused as is
    ma, mb = (AutoModelForCausalLM.from_pretrained(p) for p in (a, b))
    for (ka, va), (kb, vb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
