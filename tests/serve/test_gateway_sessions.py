"""The gateway's sessions as an outside agent sees them (issue 34, item 7): a refused request records nothing,
a retry replaces the turn its client never received, the agent's own messages are followed (an edited reply
forks, flagged, keeping the recorded ids before it), a stop string's text never reaches the record, rewards
must be finite, and a shutdown says how many sessions (held in memory only) it loses."""

import json
import logging
from types import SimpleNamespace

import httpx
import pytest

from rlhf.agents import Trajectory, trajectory_batch
from rlhf.batch import Batch
from rlhf.serve import BackgroundServer, build_app
from rlhf.serve.gateway import SessionStore
from test_tool_calls import ScriptedEngine

openai = pytest.importorskip("openai")

MODEL = "tiny"


@pytest.fixture
def gateway(engine):
    """A session gateway around a scripted engine with the tiny model's tokenizer; `gateway(replies)`."""
    servers = []

    def start(replies, max_model_len: int = 512, **store):
        scripted = ScriptedEngine(engine, replies, max_model_len)
        server = BackgroundServer(build_app(scripted, MODEL, sessions=SessionStore(
            engine.tokenizer, engine.eos_token_ids, **store))).__enter__()
        servers.append(server)
        return server, scripted

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def chat(server, session: str, messages: list, **kwargs):
    client = openai.OpenAI(base_url=f"{server.url}/sessions/{session}/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(model=MODEL, messages=messages, **kwargs).choices[0]


def record(server, session: str) -> list[Trajectory]:
    return [Trajectory.from_dict(t) for t in httpx.get(f"{server.url}/sessions/{session}").json()["trajectories"]]


def test_a_refused_request_records_nothing_and_its_resend_continues_the_same_trajectory(engine):
    """max_tokens beyond the context, then an observation the context cannot hold (a 655-id conversation on a
    512-token model): each is a 400 that leaves the record as it was; the request sent again afterwards
    continues the one trajectory token-exactly. A session whose only request was refused is not kept."""
    with BackgroundServer(build_app(engine, MODEL, sessions=SessionStore(engine.tokenizer,
                                                                         engine.eos_token_ids))) as server:
        messages = [{"role": "user", "content": "Name a city."}]
        reply = chat(server, "s", messages, max_tokens=4, seed=0).message.content
        before = httpx.get(f"{server.url}/sessions/s").json()
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Another."}]
        with pytest.raises(openai.BadRequestError, match="above this server's limit"):
            chat(server, "s", messages, max_tokens=5000)
        with pytest.raises(openai.BadRequestError, match="maximum context length is 512"):
            chat(server, "s", messages, max_tokens=500)
        with pytest.raises(openai.BadRequestError, match="context"):
            chat(server, "s", [*messages[:-1], {"role": "tool", "content": "x" * 600}], max_tokens=4)
        assert httpx.get(f"{server.url}/sessions/s").json() == before
        chat(server, "s", messages, max_tokens=4, seed=1)
        (t,) = record(server, "s")
        first = Trajectory.from_dict(before["trajectories"][0])
        assert len(t.turns) == 2 and t.all_ids[: len(first.all_ids)] == first.all_ids
        assert len(t.all_ids) <= 512 and t.max_response_tokens == 512 - len(t.prompt_ids)
        with pytest.raises(openai.BadRequestError):
            chat(server, "refused", [{"role": "user", "content": "x" * 600}], max_tokens=4)
        assert httpx.get(f"{server.url}/sessions/refused").status_code == 404


def test_a_retry_of_the_same_messages_replaces_the_turn_the_client_never_received(gateway, engine):
    """Identical messages after a reply mean the reply did not arrive (a timeout, a client retry): the new
    reply takes its place in the same trajectory, and the lost one is never trained; the reward lands on it."""
    server, scripted = gateway(["Lost.", "Paris.", "Lost too.", "Lyon."])
    messages = [{"role": "user", "content": "Name a city."}]
    chat(server, "r", messages)  # "Lost.": the client never saw it
    messages.append({"role": "assistant", "content": chat(server, "r", messages).message.content})
    messages.append({"role": "user", "content": "Another."})
    chat(server, "r", messages)  # "Lost too."
    assert chat(server, "r", messages).message.content == "Lyon."
    assert scripted.prompts[0] == scripted.prompts[1] and scripted.prompts[2] == scripted.prompts[3]
    httpx.post(f"{server.url}/sessions/r/reward", json={"reward": 1.0})
    (t,) = record(server, "r")
    assert [m["content"] for m in t.messages] == ["Name a city.", "Paris.", "Another.", "Lyon."]
    assert "Lost" not in engine.tokenizer.decode(t.all_ids) and t.info["retried_turns"] == 2 and t.rewards == [1.0]
    assert len(t.turns) == 2 and t.temperatures == [1.0, 1.0]


def test_an_edited_reply_is_followed_from_the_last_reply_that_still_matches_and_flagged(gateway, engine):
    """The agent rewrites its second reply: the recorded trajectory stays as it was; a new one keeps the
    recorded ids through the first reply (token-exact) and renders the agent's messages from there (mask 0).
    Sampling again from an earlier request forks from that request's own prompt ids."""
    server, scripted = gateway(["One.", "Two.", "Three.", "Again."])
    messages = [{"role": "user", "content": "Count."}]
    messages.append({"role": "assistant", "content": chat(server, "e", messages).message.content})
    messages.append({"role": "user", "content": "Next."})
    chat(server, "e", messages)  # "Two."
    edited = [*messages, {"role": "assistant", "content": "TWO!"}, {"role": "user", "content": "Next."}]
    chat(server, "e", edited)  # "Three."
    chat(server, "e", messages[:1])  # the first request again: a fork from its prompt, not a retry of the last
    original, diverged, forked = record(server, "e")
    assert [m["content"] for m in original.messages] == ["Count.", "One.", "Next.", "Two."]
    end_of_one = len(original.prompt_ids) + original.turns[0][1]
    assert diverged.prompt_ids == original.all_ids[:end_of_one] and diverged.info == {"diverged": 1}
    assert scripted.prompts[2] == diverged.prompt_ids + diverged.response_ids[: diverged.turns[0][0]]
    rendered = engine.tokenizer.decode(diverged.all_ids)
    assert "TWO!" in rendered and "Two." not in rendered and set(diverged.loss_mask[: diverged.turns[0][0]]) == {0}
    assert forked.prompt_ids == original.prompt_ids and forked.info == {"forked": 1}


def test_a_reply_cut_by_a_stop_string_is_recorded_as_the_text_the_client_received(gateway, engine):
    server, _ = gateway(["It is 42. STOP and then more", "Sure."])
    messages = [{"role": "user", "content": "Answer?"}]
    reply = chat(server, "stop", messages, stop=["STOP"]).message.content
    assert reply == "It is 42. "
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Sure?"}]
    chat(server, "stop", messages)
    (t,) = record(server, "stop")
    tok = engine.tokenizer
    start, end = t.turns[0]
    assert tok.decode(t.response_ids[start:end]) == "It is 42. " and t.messages[1]["content"] == reply
    # what the model is shown next is one render of the conversation the agent holds
    assert tok.decode(t.all_ids[: len(t.prompt_ids) + t.turns[1][0]]) == tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)


def test_a_reply_ends_where_the_sessions_budget_does_so_the_record_holds_all_the_client_got(gateway, engine):
    server, _ = gateway(["Hello there, friend."], max_response_tokens=12)
    choice = chat(server, "budget", [{"role": "user", "content": "Hi."}])
    assert choice.message.content == "Hello there," and choice.finish_reason == "length"
    (t,) = record(server, "budget")
    assert engine.tokenizer.decode(t.response_ids) == "Hello there," and t.finish_reason is None


@pytest.mark.parametrize("body", [b'{"reward": NaN}', b'{"reward": Infinity}', b'{"reward": -Infinity}',
                                  b'{"reward": 1e400}'])
def test_a_reward_that_is_not_a_finite_number_is_a_400(gateway, body):
    server, _ = gateway(["Hi."])
    chat(server, "w", [{"role": "user", "content": "Hello."}])
    response = httpx.post(f"{server.url}/sessions/w/reward", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "finite number" in response.json()["error"]["message"]
    assert record(server, "w")[0].rewards == []


def test_rlhf_serve_logs_the_sessions_a_shutdown_loses(caplog):
    """`rlhf serve MODEL --sessions` keeps sessions in memory only; stopping it (SIGTERM: uvicorn's shutdown, run
    here by the same `should_exit`) says how many sessions and trajectories are lost."""
    from helpers import tiny_model_path

    from rlhf.serve.server import app_from_args, parse_args

    app = app_from_args(parse_args([tiny_model_path(), "--served-model-name", MODEL, "--sessions"]))
    with caplog.at_level(logging.INFO, logger="rlhf.serve"):
        with BackgroundServer(app) as server:
            for session in ("a", "b"):
                chat(server, session, [{"role": "user", "content": "Hello."}], max_tokens=2)
    lost = [r.getMessage() for r in caplog.records if "lost at shutdown" in r.getMessage()]
    assert lost == ["gateway: 2 session(s) holding 2 trajectories lived in this server's memory only and are lost "
                    "at shutdown (fetch GET /sessions/ID before stopping the server)"]


@pytest.mark.real_model
def test_smollm2_sampled_tokenisation_survives_a_refused_request_and_a_stop_string_inside_a_token(smollm2_path):
    """SmolLM2's BPE: a turn sampled as 'Bas','il','is' (canonical: 'Bas','ilis'). After a refused request the
    resent one continues the recorded ids, never a re-tokenisation; a stop string that begins inside the token
    'il' leaves the sampled 'Bas' (trained) and the received 'i' (context), and nothing the client never saw."""
    from rlhf.models.loading import load_tokenizer

    tok = load_tokenizer(smollm2_path)
    bas, il, is_ = (tok(s, add_special_tokens=False)["input_ids"][0] for s in ("Bas", "il", "is"))
    smollm2 = SimpleNamespace(tokenizer=tok, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id])
    scripted = ScriptedEngine(smollm2, [[bas, il, is_, tok.eos_token_id], "Yes.", [bas, il, is_, tok.eos_token_id]],
                              max_model_len=8192)
    with BackgroundServer(build_app(scripted, "smollm2", sessions=SessionStore(tok, [tok.eos_token_id]))) as server:
        client = openai.OpenAI(base_url=f"{server.url}/sessions/b/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "A name?"}]
        reply = client.chat.completions.create(model="smollm2", messages=messages).choices[0].message.content
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Sure?"}]
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="smollm2", messages=messages, max_tokens=9000)
        client.chat.completions.create(model="smollm2", messages=messages)
        (t,) = record(server, "b")
        assert t.response_ids[t.turns[0][0]: t.turns[0][1]] == [bas, il, is_, tok.eos_token_id]
        assert scripted.prompts[1] == t.all_ids[: len(scripted.prompts[1])]

        client = openai.OpenAI(base_url=f"{server.url}/sessions/c/v1", api_key="unused", max_retries=0)
        cut = client.chat.completions.create(model="smollm2", messages=messages[:1], stop=["l"])
        assert cut.choices[0].message.content == "Basi"
        (t,) = record(server, "c")
        start, end = t.turns[0]
        assert t.response_ids[start:end] == [bas] and tok.decode(t.response_ids[start:]) == "Basi"
        assert t.loss_mask[start:] == [1] + [0] * (len(t.response_ids) - start - 1)
        batch = trajectory_batch([t], Batch({}, {"uid": ["c"], "extra_info": [{}]}), tok.pad_token_id, None, 64)
        assert batch["response_mask"].sum() == 1 and json.dumps(t.to_dict())
