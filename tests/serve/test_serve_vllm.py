"""`rlhf serve` on VLLMEngine (real vLLM: the CPU build): the OpenAI API answers with vLLM's
greedy text, equal to the transformers engine's for the same chat prompts."""

import pytest

from helpers import chat_batch, vllm_model_path
from rlhf.rollout import HFEngine, SamplingParams
from rlhf.rollout.vllm_engine import VLLMEngine
from rlhf.serve import BackgroundServer, ServeLimits, build_app
from rlhf.serve.server import load_engine, parse_args

pytestmark = pytest.mark.vllm


def test_serve_with_the_vllm_engine_answers_as_transformers_does():
    openai = pytest.importorskip("openai")
    args = parse_args([vllm_model_path(), "--engine", "vllm", "--max-model-len", "256"])
    engine = load_engine(args)  # what `rlhf serve MODEL --engine vllm` builds
    assert isinstance(engine, VLLMEngine) and engine.max_model_len == 256
    questions = ["What is 2+3?", "Name a colour.", "a much longer question than the others"]
    hf = HFEngine(vllm_model_path())
    out = hf.generate(chat_batch(hf.tokenizer, questions), SamplingParams(temperature=0.0, max_new_tokens=12))
    expected = [hf.tokenizer.decode(r[: int(m.sum())], skip_special_tokens=True)
                for r, m in zip(out["responses"], out["response_mask"])]
    limits = ServeLimits(max_tokens_limit=64, max_batch_size=16)
    with BackgroundServer(build_app(engine, "tiny", limits)) as server:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
            texts = [client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": q}],
                                                    max_tokens=12, temperature=0).choices[0].message.content
                     for q in questions]
            sampled = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                     n=3, max_tokens=6, temperature=1.0, seed=7, logprobs=True)
            again = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                   n=3, max_tokens=6, temperature=1.0, seed=7)
    assert texts == expected
    assert [c.message.content for c in sampled.choices] == [c.message.content for c in again.choices]
    assert all(t.logprob <= 0 for c in sampled.choices for t in c.logprobs.content)
