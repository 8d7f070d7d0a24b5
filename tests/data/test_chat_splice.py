"""Spliced chat templating and tokenising (rlhf.data.chat_splice) gives exactly the per-row ids:
`apply_chat_template` then the tokenizer, one row at a time, on tricky contents and templates."""

import copy

import pytest
from chat_templates import DROPS_REASONING_TEMPLATE, QWEN25_TEMPLATE
from helpers import tiny_model_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhf.data.chat_splice import MARK_OPEN, ChatSplicer, content_transparent, content_use
from rlhf.data.generators import countdown_rows, gsm8k_like_rows
from rlhf.data.tokenize import chat_prompt_ids, chat_prompt_ids_batch
from rlhf.models.loading import load_tokenizer

TRICKY = [
    "", " ", "\n", "  padded  ", "\n\nstarts with newlines", "ends with newlines\n\n", "Réponds en français — 答えて 🙂",
    "<|im_end|>", "<|im_start|>assistant\nfake turn<|im_end|>", "a<|im_end|>b", "ends with <|im_end", "im_end|> starts",
    "<", ">", "x < y and y > z", "<|", "|>", "<|endoftext|>", "{{ not a template }} {% if %}", "<think>r</think>answer",
    f"marker {MARK_OPEN}0 in text", "tab\tand\r\ncrlf", "\u200bzero width", "user\n", "    indented code\n\tmore",
]


def conversations() -> list[list[dict]]:
    rows = [r["prompt"] for r in gsm8k_like_rows(40, seed=1) + countdown_rows(20)]
    rows += [[{"role": "user", "content": c}] for c in TRICKY]
    rows += [[{"role": "system", "content": s}, {"role": "user", "content": c}]
             for s, c in zip(TRICKY, reversed(TRICKY))]
    rows += [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": c}, {"role": "user", "content": "And?"}]
             for c in TRICKY[:8]]
    rows += [[{"role": "user", "content": "named", "name": "ann"}]]  # a key the splice does not model: per row
    return rows


@pytest.fixture(scope="module")
def tiny_tok():
    return load_tokenizer(tiny_model_path())


def test_spliced_ids_equal_the_per_row_ids(tiny_tok):
    rows = conversations()
    before = copy.deepcopy(rows)
    assert chat_prompt_ids_batch(tiny_tok, rows) == [chat_prompt_ids(tiny_tok, r) for r in rows]
    assert rows == before  # the messages are not modified
    assert chat_prompt_ids_batch(tiny_tok, []) == []


def test_the_splice_is_taken_for_plain_chat_templates(tiny_tok):
    splicer = ChatSplicer(tiny_tok)
    splicer.ids(conversations())
    assert splicer.plans[("user",)] is not None and splicer.plans[("user",)].pieces is not None
    assert splicer.plans[("system", "user")].pieces is not None


@pytest.mark.parametrize("content", ["{{ message['content'] | trim }}", "{{ message['content'][:40] }}",
                                     "{% if 'secret' in message['content'] %}[hidden]{% else %}{{ message['content'] }}"
                                     "{% endif %}", "{{ message['content'] | replace('\\n', ' ') }}"])
def test_templates_that_change_contents_fall_back_to_rendering_each_row(tiny_tok, content):
    tok = copy.deepcopy(tiny_tok)
    tok.chat_template = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n" + content +
                         "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    rows = conversations() + [[{"role": "user", "content": "a secret " + "x" * 60}]]
    assert chat_prompt_ids_batch(tok, rows) == [chat_prompt_ids(tok, r) for r in rows]
    splicer = ChatSplicer(tok)
    splicer.ids(rows)
    assert splicer.plans[("user",)] is None


@pytest.mark.parametrize("template, spliced", [(QWEN25_TEMPLATE, True), (DROPS_REASONING_TEMPLATE, False)])
def test_published_templates_give_the_per_row_ids(tiny_tok, template, spliced):
    """Qwen2.5's tests a content for emptiness (rows with an empty content go per row); the Qwen3-like
    one rewrites contents (every row goes per row)."""
    tok = copy.deepcopy(tiny_tok)
    tok.chat_template = template
    rows = conversations()
    assert chat_prompt_ids_batch(tok, rows) == [chat_prompt_ids(tok, r) for r in rows]
    splicer = ChatSplicer(tok)
    splicer.ids(rows)
    assert (splicer.plans.get(("user",)) is not None) == spliced
    assert content_use(template) == ((True, True) if spliced else (False, False))


def test_content_transparent_reads_the_template():
    assert content_transparent("{% for m in messages %}{{ '<s>' + m['role'] + m['content'] ~ '</s>' }}{% endfor %}")
    assert content_transparent("{% if m.content is string %}{{ m.content }}{% endif %}")
    for template in ["{{ m.content | trim }}", "{% if 'x' in m.content %}x{% endif %}", "{% set c = m.content %}{{ c }}",
                     "{% filter upper %}{{ m.content }}{% endfilter %}", "{{ m['content'].strip() }}",
                     "{{ m.content[1:] }}", "{% for ch in m.content %}{{ ch }}{% endfor %}", "{{ unclosed"]:
        assert not content_transparent(template), template


TEXT = st.lists(st.sampled_from(list("ab \n\t<|>_/é答🙂") + ["<|im_end|>", "<|im_start|>", "<|endoftext|>",
                                                               "im_end", "assistant", "user\n"]), max_size=12).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), TEXT), min_size=1, max_size=3))
def test_any_contents_give_the_per_row_ids(tiny_tok, messages):
    rows = [[{"role": r, "content": c} for r, c in messages], [{"role": "user", "content": "plain"}]]
    assert chat_prompt_ids_batch(tiny_tok, rows) == [chat_prompt_ids(tiny_tok, r) for r in rows]


@pytest.mark.real_model
def test_smollm2_spliced_ids_equal_the_per_row_ids(smollm2_path):
    """SmolLM2's template adds a default system prompt when a conversation has none."""
    tok = load_tokenizer(smollm2_path)
    rows = conversations()
    assert chat_prompt_ids_batch(tok, rows) == [chat_prompt_ids(tok, r) for r in rows]
    splicer = ChatSplicer(tok)
    splicer.ids(rows)
    assert splicer.plans[("user",)].pieces is not None


def test_a_content_that_would_join_an_added_token_across_its_edge_is_tokenised_whole(tiny_tok):
    from tokenizers import AddedToken

    tok = copy.deepcopy(tiny_tok)
    tok.add_tokens([AddedToken("Q<|im_end|>", normalized=False, special=True)])  # straddles "...Q" + "<|im_end|>"
    rows = [[{"role": "user", "content": "ends with Q"}], [{"role": "user", "content": "plain"}]]
    expected = [chat_prompt_ids(tok, r) for r in rows]
    assert tok.convert_tokens_to_ids("Q<|im_end|>") in expected[0]
    assert chat_prompt_ids_batch(tok, rows) == expected
    splicer = ChatSplicer(tok)
    splicer.ids(rows)
    assert splicer.plans[("user",)].pieces is not None  # the other rows still go in pieces
