"""Gateway mode of `rlhf serve`: an agent written against the real `openai` client, changed only in its
base URL, yields token-exact trajectories that train through the same builder and batch."""

import httpx
import pytest
import torch
from openai import OpenAI

from rlhf.agents import Trajectory, trajectory_batch
from rlhf.algos import KLLoss, PPOClipLoss, kl_k3
from rlhf.batch import Batch
from rlhf.models.loading import load_tokenizer
from rlhf.rollout.hf_engine import HFEngine
from rlhf.serve.app import build_app
from rlhf.serve.gateway import SessionStore
from rlhf.serve.server import BackgroundServer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker


def calculator_agent(client: OpenAI, question: str, turns: int = 3) -> list[dict]:
    """A plain OpenAI-client agent: ask, read the reply, send back a tool result, ask again."""
    messages = [{"role": "user", "content": question}]
    for turn in range(turns):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=1.0,
                                               seed=turn)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        messages.append({"role": "tool", "content": f"result {turn}"} if turn % 2 == 0 else
                        {"role": "user", "content": "Are you sure?"})
    return messages


@pytest.fixture(scope="module")
def gateway(eos_model):
    engine = HFEngine(eos_model)
    sessions = SessionStore(engine.tokenizer, engine.eos_token_ids)
    with BackgroundServer(build_app(engine, "tiny", sessions=sessions)) as server:
        yield server


def test_an_openai_client_agent_trains_through_the_builder(gateway, eos_model):
    tok = load_tokenizer(eos_model)
    conversations = {}
    for sid, question in (("s1", "What is 12+30?"), ("s2", "What is 7+8?")):
        client = OpenAI(base_url=f"{gateway.url}/sessions/{sid}/v1", api_key="unused", max_retries=0)
        conversations[sid] = calculator_agent(client, question)
    records = {sid: httpx.get(f"{gateway.url}/sessions/{sid}").json() for sid in conversations}
    assert httpx.post(f"{gateway.url}/sessions/s1/reward", json={"reward": 1.0}).json()["rewards"] == [1.0]
    trajectories = []
    for sid, record in records.items():
        (data,) = record["trajectories"]  # three requests, one conversation: one trajectory
        t = Trajectory.from_dict(data)
        assert len(t.turns) == 3 and data["temperatures"] == [1.0, 1.0, 1.0]
        # the builder's ids are one render of the conversation the agent holds (ChatML is append-only),
        # up to the last observation the agent added after its final request
        rendered = tok.apply_chat_template(conversations[sid][:-1], tokenize=False)
        assert tok.decode(t.all_ids) + "\n" == rendered
        trajectories.append(t)
    rows = Batch({}, {"uid": list(records), "extra_info": [{}, {}]})
    batch = trajectory_batch(trajectories, rows, tok.pad_token_id, temperature=1.0, max_new_tokens=256)
    # the recorded log-probs are the trainer's, recomputed over each whole conversation
    worker = PolicyWorker(eos_model, objective=PolicyObjective(policy_loss=PPOClipLoss(),
                                                             kl_loss=KLLoss(estimator=kl_k3, coef=0.01)),
                          ref_model_path=eos_model)
    old = worker.compute_log_probs(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    assert (old - batch["rollout_log_probs"]).abs()[mask].max() < 1e-4
    batch["advantages"] = torch.tensor([[1.0], [-1.0]]) * batch["response_mask"]
    metrics = worker.update(batch)
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
    assert metrics["rollout_corr/log_prob_abs_diff_max"] < 1e-4


def test_a_session_that_starts_over_gets_a_new_trajectory_and_errors_are_openai_errors(gateway):
    client = OpenAI(base_url=f"{gateway.url}/sessions/s3/v1", api_key="unused", max_retries=0)
    for question in ("What is 1+1?", "What is 2+2?"):  # the second request does not extend the first
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": question}], max_tokens=4)
    record = httpx.get(f"{gateway.url}/sessions/s3").json()
    assert [t["messages"][0]["content"] for t in record["trajectories"]] == ["What is 1+1?", "What is 2+2?"]
    import openai

    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2)
    assert httpx.get(f"{gateway.url}/sessions/nope").status_code == 404
    assert httpx.delete(f"{gateway.url}/sessions/s3").json()["deleted"] is True
