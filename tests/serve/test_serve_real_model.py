"""`rlhf serve` on SmolLM2-135M-Instruct through the `openai` client: the chat template (ChatML, with its
default system prompt) is applied, and the answer stops at `<|im_end|>`, which is not in the text."""

import pytest

from helpers import chat_batch
from rlhf.rollout import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.serve import BackgroundServer, ServeLimits, build_app
from rlhf.serve.server import load_engine, parse_args

pytestmark = pytest.mark.real_model
openai = pytest.importorskip("openai")

QUESTION = [{"role": "user", "content": "What is 2+3? Answer with the number only."}]


def test_a_chat_completion_applies_the_template_and_stops_at_im_end(smollm2_path):
    engine = load_engine(parse_args([smollm2_path]))  # what `rlhf serve MODEL` builds
    assert isinstance(engine, HFEngine)
    tokenizer = engine.tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    templated = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert templated.startswith("<|im_start|>system\n") and templated.endswith("<|im_start|>assistant\n")
    direct = engine.generate(chat_batch(tokenizer, [QUESTION[0]["content"]]),
                             SamplingParams(temperature=0.0, max_new_tokens=48))
    tokens = direct["responses"][0][direct["response_mask"][0].bool()].tolist()
    assert tokens[-1] == end and len(tokens) < 48  # the model itself ends its turn

    with BackgroundServer(build_app(engine, "smollm2", ServeLimits(max_tokens_limit=64))) as server:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
            reply = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=48, temperature=0)
    (choice,) = reply.choices
    assert choice.finish_reason == "stop"
    assert reply.usage.prompt_tokens == len(tokenizer(templated, add_special_tokens=False)["input_ids"])
    assert reply.usage.completion_tokens == len(tokens)  # the end-of-turn token counted, not shown
    assert choice.message.content == tokenizer.decode(tokens[:-1])
    assert "<|im_end|>" not in choice.message.content and "<|im_start|>" not in choice.message.content
    assert "5" in choice.message.content


def test_function_calling_with_a_tools_template(smollm2_path, tmp_path):
    """`--chat-template` (one that renders tools; SmolLM2's own ignores them) with `--tool-call-parser hermes`:
    the tool list reaches SmolLM2's prompt. The 135M model writes no well-formed call (measured: it answers in
    prose), and such a reply comes back as plain content."""
    from chat_templates import QWEN25_TEMPLATE

    from rlhf.serve.server import app_from_args

    template = tmp_path / "tools.jinja"
    template.write_text(QWEN25_TEMPLATE)
    add = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
    args = parse_args([smollm2_path, "--served-model-name", "smollm2", "--chat-template", str(template),
                       "--tool-call-parser", "hermes"])
    with BackgroundServer(app_from_args(args)) as server:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
            asked = dict(model="smollm2", messages=QUESTION, max_tokens=16, temperature=0)
            with_tools = client.chat.completions.create(**asked, tools=[add])
            plain = client.chat.completions.create(**asked)
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 100  # the tools and how to call them
    (choice,) = with_tools.choices
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
    assert isinstance(choice.message.content, str) and choice.message.content
