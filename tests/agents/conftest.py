"""Fixtures of the agent tests."""


import pytest

from helpers import short_answer_model, tiny_model_path, vllm_model_path


@pytest.fixture(scope="session")
def eos_model(tmp_path_factory) -> str:
    """The tiny model after 40 SFT steps on short answers: its sampled turns end on EOS within a few tokens
    (a random model almost never samples EOS, so its every turn would be cut by max_new_tokens)."""
    return short_answer_model(tiny_model_path())


@pytest.fixture(scope="session")
def vllm_eos_model(tmp_path_factory) -> str:
    """The same for the vLLM-shaped tiny model (head_dim 32, which vLLM's CPU attention needs)."""
    return short_answer_model(vllm_model_path())
