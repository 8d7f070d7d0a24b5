"""OpenAI function calling through the real `openai` client: tools rendered by the chat template, the model's
calls returned as `tool_calls`, tool results sent back, and the gateway's trajectories token-exact throughout."""

import json

import httpx
import pytest
import torch

from rlhf.agents import Trajectory
from rlhf.agents.parsers import HermesParser, PythonCallParser
from rlhf.batch import Batch
from rlhf.rollout import HFEngine
from rlhf.serve import BackgroundServer, build_app
from rlhf.serve.gateway import SessionStore
from rlhf.serve.protocol import ApiError, ChatCompletionRequest, ChatMessage
from rlhf.serve.tool_calls import assistant_message, request_tools
from chat_templates import QWEN25_TEMPLATE

openai = pytest.importorskip("openai")

MODEL = "tiny"
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


class ScriptedEngine:
    """An engine (its tokenizer, pad and EOS ids taken from `engine`) whose replies are given: texts, tokenised
    and ended with EOS (the tiny model cannot write a tool call), or exact token ids (a sampled, possibly
    non-canonical tokenisation). The server's own path (template, parser, reply, gateway) runs for real around
    it. It records every prompt."""

    def __init__(self, engine: HFEngine, replies: list[str | list[int]], max_model_len: int = 4096):
        self.inner, self.replies, self.prompts = engine, list(replies), []
        self.tokenizer, self.max_model_len = engine.tokenizer, max_model_len  # Qwen's tool prompt is ~700 bytes
        self.pad_token_id, self.eos_token_ids = engine.pad_token_id, engine.eos_token_ids

    def generate(self, batch: Batch, sampling, seed=None) -> Batch:
        rows = []
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
            self.prompts.append(ids[mask.bool()].tolist())
            reply = self.replies.pop(0)
            rows.append(list(reply) if isinstance(reply, list) else
                        self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.eos_token_ids[0]])
        width = max(len(r) for r in rows)
        responses = torch.full((len(rows), width), self.pad_token_id)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            responses[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        return Batch({"responses": responses, "response_mask": mask, "rollout_log_probs": -0.25 * mask.float()})


@pytest.fixture(scope="module")
def qwen_engine() -> HFEngine:
    """The tiny model with Qwen2.5's chat template, which renders `tools`."""
    from helpers import tiny_model_path

    engine = HFEngine(tiny_model_path())
    engine.tokenizer.chat_template = QWEN25_TEMPLATE
    return engine


def client_for(url: str):
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def test_a_call_comes_back_as_tool_calls_and_its_result_goes_into_the_next_prompt(qwen_engine):
    engine = ScriptedEngine(qwen_engine, [f"Let me add.\n{CALL}", "2 + 3 = 5."])
    with BackgroundServer(build_app(engine, MODEL, tool_parser=HermesParser())) as server:
        client = client_for(server.url + "/v1")
        messages = [{"role": "user", "content": "What is 2+3?"}]
        first = client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD])
        (choice,) = first.choices
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me add."
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "add" and call.id.startswith("call_")
        assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
        # the tools reached the model through its template
        assert '"name": "add"' in engine.tokenizer.decode(engine.prompts[0]) and "<tools>" in engine.tokenizer.decode(
            engine.prompts[0])
        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        second = client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD])
        assert second.choices[0].message.content == "2 + 3 = 5." and second.choices[0].finish_reason == "stop"
        assert second.choices[0].message.tool_calls is None
        prompt = engine.tokenizer.decode(engine.prompts[1])
        assert prompt.endswith('"arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>\n<|im_start|>user\n'
                               "<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_streamed_tool_calls_assemble_like_openais(qwen_engine):
    engine = ScriptedEngine(qwen_engine, [CALL + "\n" + CALL.replace('"b": 3', '"b": 4')])
    with BackgroundServer(build_app(engine, MODEL, tool_parser=HermesParser())) as server:
        stream = client_for(server.url + "/v1").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "2+3 and 2+4?"}], tools=[ADD], stream=True)
        calls, finish = {}, None
        for chunk in stream:
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or []:
                    calls.setdefault(delta.index, {"name": "", "arguments": ""})
                    calls[delta.index]["name"] += delta.function.name or ""
                    calls[delta.index]["arguments"] += delta.function.arguments or ""
                finish = choice.finish_reason or finish
        assert finish == "tool_calls"
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
            ("add", {"a": 2, "b": 3}), ("add", {"a": 2, "b": 4})]


def test_the_gateway_records_tool_turns_token_exact(qwen_engine):
    engine = ScriptedEngine(qwen_engine, [CALL, "It is 5."])
    sessions = SessionStore(engine.tokenizer, engine.eos_token_ids)
    with BackgroundServer(build_app(engine, MODEL, sessions=sessions, tool_parser=HermesParser())) as server:
        client = client_for(f"{server.url}/sessions/a1/v1")
        messages = [{"role": "user", "content": "What is 2+3?"}]
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD]).choices[0].message
        messages += [reply.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "5"}]
        client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD])
        (record,) = httpx.get(f"{server.url}/sessions/a1").json()["trajectories"]
    t = Trajectory.from_dict(record)
    # the second prompt is the first one, the sampled call verbatim, then the tool result: one trajectory
    assert engine.prompts[1] == t.all_ids[: len(engine.prompts[1])]
    call_ids = engine.tokenizer(CALL, add_special_tokens=False)["input_ids"] + [engine.eos_token_ids[0]]
    (start, end), _ = t.turns
    assert t.response_ids[start:end] == call_ids and t.loss_mask[start:end] == [1] * len(call_ids)
    assert t.log_probs[start:end] == [-0.25] * len(call_ids)
    observation = t.loss_mask[end: t.turns[1][0]]
    assert observation and set(observation) == {0}
    assert "<tool_response>\n5\n</tool_response>" in engine.tokenizer.decode(t.response_ids[end: t.turns[1][0]])


# A short tool-aware ChatML template: Qwen's tool prompt alone is longer than the tiny model's 512 positions.
SHORT_TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_real_tiny_model_answers_a_tools_request():
    from helpers import tiny_model_path

    engine = HFEngine(tiny_model_path())
    engine.tokenizer.chat_template = SHORT_TOOLS_TEMPLATE
    with BackgroundServer(build_app(engine, MODEL, tool_parser=HermesParser())) as server:
        client = client_for(server.url + "/v1")
        hello = [{"role": "user", "content": "hi"}]
        with_tools = client.chat.completions.create(model=MODEL, messages=hello, tools=[ADD], max_tokens=4)
        plain = client.chat.completions.create(model=MODEL, messages=hello, max_tokens=4)
    system = "<|im_start|>system\nTools: add<|im_end|>\n"
    assert with_tools.usage.prompt_tokens == plain.usage.prompt_tokens + len(engine.tokenizer(system)["input_ids"])
    assert with_tools.choices[0].message.role == "assistant" and with_tools.choices[0].finish_reason in ("stop", "length")


def test_requests_with_tools_the_server_cannot_serve_are_refused_with_the_fix(engine, qwen_engine):
    hello = [{"role": "user", "content": "hi"}]
    with BackgroundServer(build_app(engine, MODEL)) as server:  # no parser
        with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):
            client_for(server.url + "/v1").chat.completions.create(model=MODEL, messages=hello, tools=[ADD])
        # tool_choice "none": tools are not in play, the request is served
        client_for(server.url + "/v1").chat.completions.create(model=MODEL, messages=hello, tools=[ADD],
                                                               tool_choice="none", max_tokens=2)
    with BackgroundServer(build_app(engine, MODEL, tool_parser=HermesParser())) as server:
        # the tiny model's own ChatML template (like SmolLM2's) never writes the tools
        with pytest.raises(openai.BadRequestError, match="ignores `tools`"):
            client_for(server.url + "/v1").chat.completions.create(model=MODEL, messages=hello, tools=[ADD])
    with BackgroundServer(build_app(qwen_engine, MODEL, tool_parser=HermesParser())) as server:
        client = client_for(server.url + "/v1")
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            client.chat.completions.create(model=MODEL, messages=hello, tools=[ADD], tool_choice="required")
        with pytest.raises(openai.BadRequestError, match=r"tools\[0\]"):
            client.chat.completions.create(model=MODEL, messages=hello, tools=[{"type": "function"}])
        bad_args = [*hello, {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{a: 1"}}]}]
        with pytest.raises(openai.BadRequestError, match="not valid JSON"):
            client.chat.completions.create(model=MODEL, messages=bad_args, tools=[ADD])


@pytest.mark.parametrize(
    ("parser", "text", "parallel", "content", "calls"),
    [
        (HermesParser(), "plain answer", True, "plain answer", None),
        (HermesParser(), CALL, True, None, [("add", {"a": 2, "b": 3})]),
        (HermesParser(), f"x{CALL}{CALL}", False, "x", [("add", {"a": 2, "b": 3})]),  # parallel_tool_calls=False
        (HermesParser(), "<tool_call>{not json}</tool_call>", True, "<tool_call>{not json}</tool_call>", None),
        (HermesParser(), CALL + "<tool_call>{bad", True, CALL + "<tool_call>{bad", None),  # any malformed: text
        (PythonCallParser(), "add(2, b=3)", True, None, [("add", {"a": 2, "b": 3})]),  # positional by schema
        (PythonCallParser(), "add(1, 2, 3)", True, "add(1, 2, 3)", None),  # more positionals than parameters
        (PythonCallParser(), "mul(2, 3)", True, "mul(2, 3)", None),  # unknown tool, positional: unmappable
    ],
)
def test_assistant_message_from_a_completion(parser, text, parallel, content, calls):
    message = assistant_message(text, parser, [ADD], parallel)
    assert message.content == content
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.tool_calls or []]
    assert got == (calls or [])
    assert message.finish_reason_override == ("tool_calls" if calls else None)
    assert assistant_message(text, parser, None).content == text  # no tools offered: never parsed


def test_tool_calls_sent_back_reach_the_template_with_object_arguments():
    message = ChatMessage(role="assistant", content=None, tool_calls=[
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}])
    assert message.template_dict()["tool_calls"][0]["function"]["arguments"] == {"a": 1, "b": 2}
    tool = ChatMessage(role="tool", content="3", tool_call_id="c1").template_dict()
    assert tool == {"role": "tool", "content": "3", "tool_call_id": "c1"}
    req = ChatCompletionRequest(model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[ADD])
    assert request_tools(req, HermesParser()) == [ADD]
    with pytest.raises(ApiError, match="--tool-call-parser"):
        request_tools(req, None)
