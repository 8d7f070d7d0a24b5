"""`check_template` / `rlhf models check-template`: the builder's ids equal one render of the conversation
where the template is append-only, and differ exactly where the checker says it is not."""

import json
import shutil

import pytest

from helpers import tiny_model_path
from rlhf.agents.template_check import check_template, sample_conversation
from rlhf.cli import main
from rlhf.models.loading import load_tokenizer
from chat_templates import DROPS_REASONING_TEMPLATE, QWEN25_TEMPLATE, SMOLLM2_TEMPLATE


def tokenizer(template=None):
    tok = load_tokenizer(tiny_model_path())
    if template is not None:
        tok.chat_template = template
    return tok


@pytest.mark.parametrize("template", [None, QWEN25_TEMPLATE, SMOLLM2_TEMPLATE], ids=["tiny-chatml", "qwen2.5", "smollm2"])
def test_append_only_templates_give_the_single_render(template):
    report = check_template(tokenizer(template))
    assert report.ok, report.format()
    assert report.builder_ids == report.render_ids and report.first_difference is None
    assert any("writes '\\n'" in note for note in report.notes)  # ChatML's newline after <|im_end|>


def test_a_template_that_rewrites_earlier_turns_differs_only_there():
    conversation = sample_conversation()
    reasoning = "<think>\nadd them</think>\n"
    conversation[7]["content"] = reasoning + conversation[7]["content"]  # the answer before the user follow-up
    tok = tokenizer(DROPS_REASONING_TEMPLATE)
    report = check_template(tok, conversation)
    assert not report.ok
    # the checker names the boundary (the user follow-up, message 8) and the text it rewrites
    assert report.problems[0].startswith("messages 8..8 (user) are not appended")
    assert "<think>" in report.problems[0]
    # the builder keeps what was sampled: its ids are the single render's with the reasoning put back,
    # and the first difference is where that reasoning starts
    at = report.first_difference
    dropped = tok(reasoning, add_special_tokens=False)["input_ids"]
    assert report.builder_ids[:at] == report.render_ids[:at]
    assert report.builder_ids[at: at + len(dropped)] == dropped
    assert report.builder_ids[at + len(dropped):] == report.render_ids[at:]


def test_a_template_that_cannot_render_tool_messages_is_a_problem():
    tok = tokenizer("{% for m in messages %}{% if m.role not in ['user', 'assistant', 'system'] %}"
                    "{{ raise_exception('unknown role ' + m.role) }}{% endif %}{{ m.content }}{% endfor %}")
    report = check_template(tok)
    assert not report.ok and "unknown role tool" in report.problems[0]


def test_command_line(tmp_path, capsys):
    assert main(["models", "check-template", tiny_model_path()]) == 0
    assert "append-only: yes" in capsys.readouterr().out
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path(), folder)
    tokenizer(DROPS_REASONING_TEMPLATE).save_pretrained(folder)
    conversation = sample_conversation()
    conversation[7]["content"] = "<think>x</think>" + conversation[7]["content"]
    (tmp_path / "conv.json").write_text(json.dumps(conversation))
    assert main(["models", "check-template", str(folder), "--conversation", str(tmp_path / "conv.json")]) == 1
    assert "append-only: NO" in capsys.readouterr().out


@pytest.mark.real_model
def test_smollm2_template_is_append_only(smollm2_path):
    """SmolLM2's ChatML (with its default system prompt) needs no fallback: the builder's ids are one render's."""
    report = check_template(load_tokenizer(smollm2_path))
    assert report.ok, report.format()
    assert report.builder_ids == report.render_ids
