"""Fixtures of the agent tests."""

import functools
import itertools

import pytest
import torch

from helpers import tiny_model_path, vllm_model_path
from rlhf.data.generators import arithmetic_rows
from rlhf.data.sft import SFTDataset
from rlhf.models.loading import load_tokenizer
from rlhf.workers.objectives import SFTObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup


def _short_answers(path: str, out: str) -> str:
    """`path` after 40 SFT steps on short answers, saved to `out`."""
    torch.manual_seed(0)
    worker = PolicyWorker(path, objective=SFTObjective(), optimizer=functools.partial(torch.optim.AdamW, lr=1e-2),
                          training=TrainingSetup(micro_batch_size=64))
    data = SFTDataset(arithmetic_rows(256, seed=5), load_tokenizer(path))
    for batch in itertools.islice(data.shuffled(64, seed=0, bucketed=False), 40):
        worker.update(batch)
    return worker.save(out)


@pytest.fixture(scope="session")
def eos_model(tmp_path_factory) -> str:
    """The tiny model after 40 SFT steps on short answers: its sampled turns end on EOS within a few tokens
    (a random model almost never samples EOS, so its every turn would be cut by max_new_tokens)."""
    return _short_answers(tiny_model_path(), str(tmp_path_factory.mktemp("eos_model") / "model"))


@pytest.fixture(scope="session")
def vllm_eos_model(tmp_path_factory) -> str:
    """The same for the vLLM-shaped tiny model (head_dim 32, which vLLM's CPU attention needs)."""
    return _short_answers(vllm_model_path(), str(tmp_path_factory.mktemp("vllm_eos_model") / "model"))
