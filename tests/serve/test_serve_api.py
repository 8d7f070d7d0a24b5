"""The server through the official `openai` client and raw HTTP: schema, streaming, n, errors, limits."""

import asyncio
import threading
import time

import pytest

from rlhf.batch import Batch
from rlhf.data.tokenize import chat_prompt_ids, left_pad, position_ids
from rlhf.rollout import SamplingParams
from rlhf.serve import BackgroundServer, ServeLimits, build_app

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

MODEL = "tiny"
HELLO = [{"role": "user", "content": "What is 2+3?"}]


def test_models_lists_the_served_model(client, engine):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].object == "model" and models[0].max_model_len == engine.max_model_len
    assert client.models.retrieve(MODEL).id == MODEL


def test_plain_completion(client):
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0)
    assert out.object == "text_completion" and out.id.startswith("cmpl-") and out.model == MODEL
    (choice,) = out.choices
    assert choice.index == 0 and isinstance(choice.text, str) and choice.finish_reason in ("stop", "length")
    assert out.usage.prompt_tokens == 5  # five bytes, one token each (byte-level tokenizer)
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert 1 <= out.usage.completion_tokens <= 6


def test_completion_with_several_prompts_and_token_ids(client, engine):
    out = client.completions.create(model=MODEL, prompt=["ab", "cde"], n=2, max_tokens=3, temperature=0)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.choices[0].text == out.choices[1].text  # greedy: the samples of one prompt agree
    token_ids = engine.tokenizer("ab")["input_ids"]
    ids = client.completions.create(model=MODEL, prompt=token_ids, max_tokens=3, temperature=0)
    text = client.completions.create(model=MODEL, prompt="ab", max_tokens=3, temperature=0)
    assert ids.choices[0].text == text.choices[0].text == out.choices[0].text
    echo = client.completions.create(model=MODEL, prompt="ab", max_tokens=3, temperature=0, echo=True)
    assert echo.choices[0].text == "ab" + text.choices[0].text


def test_chat_completion(client):
    out = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    (choice,) = out.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert out.usage.completion_tokens <= 8 and out.usage.prompt_tokens > 0


def test_n_samples(client):
    out = client.chat.completions.create(model=MODEL, messages=HELLO, n=3, max_tokens=5, temperature=1.0, seed=None)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.completion_tokens <= 15


def test_the_clients_usual_fields_are_accepted(client):
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, *HELLO], max_completion_tokens=4,
        temperature=0.7, top_p=0.9, user="u1", metadata={"k": "v"}, store=False, logprobs=True, top_logprobs=0,
        stream=False, service_tier="auto", seed=3, stop=None,
    )
    choice = out.choices[0]
    assert len(choice.logprobs.content) == out.usage.completion_tokens
    assert all(t.logprob <= 0 for t in choice.logprobs.content)


def test_greedy_output_equals_the_hf_engines(client, engine):
    """The server's greedy text is what HFEngine.generate gives for the same chat prompt, batched or not."""
    questions = ["What is 2+3?", "Name a colour.", "a much longer question than the others, to force left padding"]
    tok = engine.tokenizer
    expected = []
    for q in questions:
        ids, mask = left_pad([chat_prompt_ids(tok, [{"role": "user", "content": q}])], tok.pad_token_id)
        prompt = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)})
        out = engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=12))
        n = int(out["response_mask"][0].sum())
        expected.append(tok.decode(out["responses"][0, :n], skip_special_tokens=True))

    def ask(q):
        messages = [{"role": "user", "content": q}]
        return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)

    results = [None] * len(questions)  # concurrently, so the server batches them in one generate

    def worker(i):
        results[i] = ask(questions[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [r.choices[0].message.content for r in results] == expected
    assert ask(questions[0]).choices[0].message.content == expected[0]


def test_streaming_chat_assembles_to_the_same_text(client):
    full = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=10, temperature=0)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True}
    ))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    last_choice = [c for c in chunks if c.choices][-1].choices[0]
    assert last_choice.finish_reason == full.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_streaming_n_and_completions(client, server):
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, n=2, max_tokens=4, stream=True))
    by_index = {}
    for c in chunks:
        for ch in c.choices:
            by_index.setdefault(ch.index, []).append(ch)
    assert sorted(by_index) == [0, 1]
    assert all(parts[-1].finish_reason in ("stop", "length") for parts in by_index.values())
    stream = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0, stream=True)
    text = "".join(c.choices[0].text for c in stream)
    assert text == client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0).choices[0].text
    with httpx.stream("POST", server.url + "/v1/completions",
                      json={"model": MODEL, "prompt": "x", "max_tokens": 2, "stream": True}) as raw:
        assert raw.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in raw.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_stop_strings_cut_the_text(client):
    free = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
    text = free.choices[0].message.content
    stop = text[3:5]
    out = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0, stop=[stop, "\x00"])
    assert out.choices[0].message.content == text[: text.find(stop)]
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens < free.usage.completion_tokens


def test_seed_makes_sampling_repeatable(client):
    def sample(seed, n=1):
        out = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=1.0, seed=seed, n=n)
        return tuple(c.message.content for c in out.choices)

    first = sample(7)
    unseeded = {sample(None) for _ in range(3)}  # the server's own random state moves on in between
    assert sample(7) == first  # the same seed, the same draw, whatever ran before
    assert len(unseeded) > 1  # 8 tokens at temperature 1 from 259 nearly uniform ones: unseeded draws differ
    assert len({first, *(sample(seed) for seed in (8, 9, 10))}) > 1  # the seed chooses the draw: not one fixed stream
    assert len(set(sample(7, n=3))) == 3  # the n samples of a seeded request are different draws


# ------------------------------------------------------------------------------------ errors


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_malformed_json_and_unknown_fields_are_400(server):
    url = server.url + "/v1/chat/completions"
    bad = httpx.post(url, content=b'{"model": "tiny", "messages": [', headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "JSON" in error_of(bad)["message"]
    unknown = httpx.post(url, json={"model": MODEL, "messages": HELLO, "temprature": 0.5})
    assert unknown.status_code == 400 and error_of(unknown)["param"] == "temprature"
    wrong_type = httpx.post(url, json={"model": MODEL, "messages": HELLO, "n": "two"})
    assert wrong_type.status_code == 400 and error_of(wrong_type)["param"] == "n"
    missing = httpx.post(url, json={"model": MODEL})
    assert missing.status_code == 400 and error_of(missing)["param"] == "messages"
    not_object = httpx.post(url, json=[1, 2])
    assert not_object.status_code == 400
    tools = httpx.post(url, json={"model": MODEL, "messages": HELLO, "tools": [{"type": "function"}]})
    assert tools.status_code == 400 and error_of(tools)["code"] == "unsupported_parameter"


def test_unknown_model_and_path(server):
    r = httpx.post(server.url + "/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"
    assert httpx.get(server.url + "/v1/nothing").status_code == 404


def test_oversized_request_is_413(server, client):
    huge = "x" * (80 * 1024)  # the fixture's limit is 64 KiB
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": huge})
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(model=MODEL, prompt=huge)
    assert err.value.status_code == 413


def test_max_tokens_over_the_limit_is_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=65)  # limit 64
    assert err.value.body["param"] == "max_tokens" and err.value.body["code"] == "max_tokens_too_large"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=10, n=17)  # 17 rows > batch size 16


def test_context_length_is_checked(client, engine):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="y" * engine.max_model_len, max_tokens=1)
    assert err.value.body["code"] == "context_length_exceeded"


def test_api_key_is_required_and_accepted(engine):
    app = build_app(engine, MODEL, ServeLimits(), api_key="s3cret")
    with BackgroundServer(app) as server:
        base = server.url + "/v1"
        with pytest.raises(openai.AuthenticationError) as err:
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
        assert err.value.status_code == 401 and err.value.body["code"] == "invalid_api_key"
        assert httpx.post(base + "/completions", json={"model": MODEL, "prompt": "x"}).status_code == 401
        good = openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0)
        assert good.completions.create(model=MODEL, prompt="x", max_tokens=2).choices
        assert httpx.get(server.url + "/health").status_code == 200  # health needs no key


class SlowEngine:
    """The real engine, slowed down: a batch takes at least `delay` seconds."""

    def __init__(self, engine, delay: float):
        self.inner, self.delay = engine, delay
        self.tokenizer, self.max_model_len = engine.tokenizer, engine.max_model_len
        self.pad_token_id, self.eos_token_ids = engine.pad_token_id, engine.eos_token_ids

    def generate(self, prompts, sampling, seed=None):
        time.sleep(self.delay)
        return self.inner.generate(prompts, sampling, seed=seed)


def test_full_queue_answers_429_and_the_server_stays_up(engine):
    limits = ServeLimits(max_queue=1, max_batch_size=1, batch_wait_ms=0)
    with BackgroundServer(build_app(SlowEngine(engine, 1.0), MODEL, limits)) as server:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}

        async def burst():
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                return await asyncio.gather(*[http.post("/v1/completions", json=body) for _ in range(6)])

        # one request runs (1 s), one waits, the other four find the queue full
        responses = asyncio.run(burst())
        statuses = sorted(r.status_code for r in responses)
        assert set(statuses) == {200, 429} and 1 <= statuses.count(200) <= 2
        rejected = next(r for r in responses if r.status_code == 429)
        assert error_of(rejected)["code"] == "queue_full" and rejected.headers["retry-after"] == "1"
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200


def test_an_engine_failure_is_a_500_and_the_server_keeps_serving(engine):
    class Flaky(SlowEngine):
        def generate(self, prompts, sampling, seed=None):
            if sampling.temperature == 0.3:
                raise RuntimeError("out of memory")
            return super().generate(prompts, sampling, seed)

    with BackgroundServer(build_app(Flaky(engine, 0.0), MODEL, ServeLimits())) as server:
        url = server.url + "/v1/completions"
        failed = httpx.post(url, json={"model": MODEL, "prompt": "x", "max_tokens": 2, "temperature": 0.3}, timeout=30)
        assert failed.status_code == 500 and "out of memory" in error_of(failed)["message"]
        assert httpx.post(url, json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30).status_code == 200
