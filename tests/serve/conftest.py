"""Fixtures for the server tests: the tiny model behind the transformers engine, and running servers."""

import pytest
from helpers import tiny_model_path

from rlhf.rollout import HFEngine
from rlhf.serve import BackgroundServer, ServeLimits, build_app

MODEL = "tiny"  # the name the servers serve the tiny model under (the tests spell it out too)


@pytest.fixture(scope="session")
def engine() -> HFEngine:
    return HFEngine(tiny_model_path())


@pytest.fixture(scope="module")
def server(engine):
    """A server with small limits, so the limit tests need small requests."""
    limits = ServeLimits(max_request_bytes=64 * 1024, max_tokens_limit=64, max_batch_size=16)
    with BackgroundServer(build_app(engine, MODEL, limits)) as running:
        yield running


@pytest.fixture
def client(server):
    openai = pytest.importorskip("openai")

    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c
