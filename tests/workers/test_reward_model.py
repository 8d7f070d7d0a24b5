"""RewardModelWorker: (B,) scores from its own tokenizer and chat template, deterministic, padding-free."""

import pytest
import torch
from helpers import tiny_model_path, tiny_reward_model

from rlhf.batch import Batch
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.workers.reward_model import RewardModelWorker, conversation_ids
from rlhf.workers.training import TrainingSetup


@pytest.fixture(scope="module")
def worker():
    torch.set_num_threads(1)
    return RewardModelWorker(tiny_reward_model(), training=TrainingSetup(micro_batch_size=3), max_length=256)


@pytest.fixture(scope="module")
def batch():
    """A policy-side batch: ChatML prompt ids plus the raw messages and decoded responses."""
    data = PromptDataset(arithmetic_rows(5), load_tokenizer(tiny_model_path()), raw_prompt=True)
    prompts = data.collate(range(5))
    prompts["response_text"] = ["4", "The answer is 12.", "", "no idea", "7 + 8 = 15"]
    return prompts


def test_scores_have_one_value_per_row(worker, batch):
    scores = worker.score(batch)["rm_scores"]
    assert scores.shape == (5,) and scores.dtype == torch.float32
    assert torch.isfinite(scores).all() and len(set(scores.tolist())) == 5


def test_rows_are_rendered_with_the_reward_models_template(worker, batch):
    ids = conversation_ids(worker.tokenizer, batch["raw_prompt"][1], "The answer is 12.", 256)
    text = worker.tokenizer.decode(ids)
    question = batch["raw_prompt"][1][0]["content"]
    assert text == f"[USER] {question}\n[ASSISTANT] The answer is 12.\n<|endoftext|>"
    assert "<|im_start|>" not in text  # nothing of the policy's ChatML
    assert worker.score(batch)["rm_scores"][1] == pytest.approx(float(worker.score_ids([ids])[0]), abs=1e-5)


def test_scores_are_deterministic_and_independent_of_batching(worker, batch):
    first = worker.score(batch)["rm_scores"]
    again = worker.score(batch)["rm_scores"]
    assert torch.equal(first, again)
    alone = torch.cat([worker.score(batch.index([i]))["rm_scores"] for i in range(5)])
    torch.testing.assert_close(alone, first, atol=1e-5, rtol=1e-5)  # left padding does not move the score
    reloaded = RewardModelWorker(tiny_reward_model(), training=TrainingSetup(micro_batch_size=5), max_length=256)
    torch.testing.assert_close(reloaded.score(batch)["rm_scores"], first, atol=1e-5, rtol=1e-5)


def test_missing_columns_say_what_to_do(worker, batch):
    with pytest.raises(KeyError, match="raw_prompt=True"):
        worker.score(Batch({"x": torch.zeros(2)}, {"response_text": ["a", "b"]}))
    with pytest.raises(KeyError, match="response_text"):
        worker.score(Batch({"x": torch.zeros(2)}, {"raw_prompt": [batch["raw_prompt"][0]] * 2}))


def test_long_conversations_keep_their_end(worker, batch):
    ids = conversation_ids(worker.tokenizer, batch["raw_prompt"][0], "x" * 300, max_length=16)
    assert len(ids) == 16 and worker.tokenizer.decode(ids).endswith("xxx\n<|endoftext|>")


def test_worker_in_a_local_group_colocated_with_the_policy(batch):
    import fiddle as fdl

    from rlhf.runtime.local import LocalRuntime
    from rlhf.runtime.plan import compile_graph
    from rlhf.runtime.remote import Remote
    from rlhf_configs.pieces import policy_group

    graph = fdl.Config(
        dict,
        policy=policy_group(model_path=tiny_model_path()),
        reward_model=fdl.Config(
            Remote, name="reward_model", colocate_with="policy",
            worker=fdl.Config(RewardModelWorker, model_path=tiny_reward_model(), max_length=256),
        ),
    )
    plan = compile_graph(graph)
    assert plan.groups["reward_model"].colocate_with == "policy"
    runtime = LocalRuntime()
    try:
        group = runtime.start_groups(plan)["reward_model"]
        scores = group.score(batch)["rm_scores"]
    finally:
        runtime.shutdown()
    assert scores.shape == (5,)
