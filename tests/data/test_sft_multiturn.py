"""Multi-turn SFT: the loss mask covers exactly the assistant contents and their end-of-turn tokens."""

import pytest
import torch

from rlhf.data.generators import arithmetic_rows
from rlhf.data.schema import DataError
from rlhf.data.sft import SFTDataset, conversation_ids, load_sft_rows
from rlhf.models.loading import load_tokenizer
from helpers import tiny_model_path

EOT = "<|im_end|>"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(tiny_model_path())


def chat(turns: int, system: bool = True) -> list[dict]:
    """A conversation with `turns` user/assistant exchanges (assistant contents: 'answer k ...')."""
    messages = [{"role": "system", "content": "You are terse."}] if system else []
    for k in range(turns):
        messages.append({"role": "user", "content": f"question {k}: what is {k} + {k}?"})
        messages.append({"role": "assistant", "content": f"answer {k} is {2 * k}.\nDone."})
    return messages


@pytest.mark.parametrize("turns", [1, 2, 3])
def test_masked_tokens_decode_to_the_assistant_turns(tok, turns):
    messages = chat(turns)
    batch = SFTDataset([{"messages": messages}], tok).collate([0])
    trained = batch["responses"][0][batch["response_mask"][0].bool()]
    expected = "".join(m["content"] + EOT for m in messages if m["role"] == "assistant")
    assert tok.decode(trained) == expected
    # the untrained tokens inside the response are exactly the user turns and role headers
    r = batch["responses"].shape[1]
    untrained = (batch["attention_mask"][0, -r:] - batch["response_mask"][0]).bool()
    text = tok.decode(batch["responses"][0][untrained])
    assert "answer" not in text and (turns == 1 or "question 1" in text)
    # the whole example is the chat template's render of the conversation (minus its final newline)
    full = tok.decode(batch["input_ids"][0][batch["attention_mask"][0].bool()])
    assert full == tok.apply_chat_template(messages, tokenize=False).rstrip("\n")


def test_end_of_turn_is_found_when_eos_is_another_token():
    base_like = load_tokenizer(tiny_model_path())
    base_like.eos_token = "<|endoftext|>"  # as Qwen2.5 base: EOS is not the end-of-turn token
    messages = chat(2)
    batch = SFTDataset([{"messages": messages}], base_like).collate([0])
    trained = batch["responses"][0][batch["response_mask"][0].bool()]
    assert base_like.decode(trained) == "".join(m["content"] + EOT for m in messages if m["role"] == "assistant")


def test_prompt_is_the_context_before_the_first_assistant_turn(tok):
    messages = chat(2)
    prompt, response, mask = conversation_ids(tok, messages)
    assert tok.decode(prompt) == tok.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=False)
    assert len(response) == len(mask) and mask[-1] == 1 and response[-1] == tok.eos_token_id


def test_multi_and_single_turn_rows_batch_together(tok):
    rows = [{"messages": chat(2, system=False)}] + arithmetic_rows(2)
    batch = SFTDataset(rows, tok).collate([0, 1, 2])
    r = batch["responses"].shape[1]
    assert torch.equal(batch["input_ids"][:, -r:], batch["responses"])
    for i, row in enumerate(rows[1:], start=1):
        trained = batch["responses"][i][batch["response_mask"][i].bool()]
        assert tok.decode(trained) == row["reward_model"]["ground_truth"] + EOT
    # single turn as `messages` masks the same tokens as the prompt-row path
    answer = {"role": "assistant", "content": rows[1]["reward_model"]["ground_truth"]}
    as_chat = [{"messages": rows[1]["prompt"] + [answer]}]
    a, b = SFTDataset(as_chat, tok).collate([0]), SFTDataset(rows[1:2], tok).collate([0])
    for key in ("input_ids", "responses", "response_mask", "attention_mask"):
        assert torch.equal(a[key], b[key]), key


def test_conversation_without_assistant_turn_is_refused(tok):
    with pytest.raises(DataError, match="row 0.*at least one assistant turn"):
        SFTDataset([{"messages": [{"role": "user", "content": "hi"}]}], tok)


def test_non_incremental_template_is_refused(tok):
    class Rewriting:  # renders only the last message: the prefix property fails
        eos_token_id = tok.eos_token_id
        all_special_ids = tok.all_special_ids

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return (messages[-1]["content"] if messages else "") + ("<gen>" if add_generation_prompt else "")

        def __call__(self, text, add_special_tokens):
            return tok(text, add_special_tokens=add_special_tokens)

    with pytest.raises(DataError, match="incrementally"):
        conversation_ids(Rewriting(), chat(2))


def test_load_sft_rows_reads_chat_and_prompt_rows(tmp_path, tok):
    import json

    from rlhf.data.arrow import to_rows

    path = tmp_path / "mixed.jsonl"
    rows = [{"messages": chat(1)}, arithmetic_rows(1)[0]]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    loaded = load_sft_rows(str(path))
    back = to_rows(loaded)
    assert back[0] == rows[0] and back[1]["prompt"] == rows[1]["prompt"]
    assert len(SFTDataset(loaded, tok)) == 2
    first = load_sft_rows(str(path), limit=1)  # what a smoke run reads of a user's file (rlhf_configs.rows)
    assert to_rows(first) == back[:1] and len(load_sft_rows(str(path), limit=5)) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"data_source": "x"}))
    with pytest.raises(DataError, match="row 0"):
        load_sft_rows(str(bad))
