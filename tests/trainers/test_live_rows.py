"""GRPO with rows that scored alike: their old log-probs are not computed and the update leaves them out
(`PolicyObjective.skips_inert_rows`), and the run trains exactly as one that runs every row."""

import fiddle as fdl
import torch

from rlhf.algos import GRPO, PPOClipLoss
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import policy_group
from helpers import run_capturing, tiny_model_path


def even_length(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1 for a response of an even number of characters whose first one is a digit: some groups of the tiny model's
    samples score alike (a 0 advantage), others do not."""
    return float(len(solution_str) % 2 == 0 and solution_str[:1].isdigit())


def run(tmp_path, monkeypatch, skip: bool) -> dict[int, tuple[dict, object]]:
    model = tiny_model_path()
    tok = fdl.Config(load_tokenizer, model)
    objective = fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss), skip_inert_rows=skip)
    stage = fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=model, objective=objective,
                            optimizer=fdl.Partial(torch.optim.SGD, lr=0.5, momentum=0.9),
                            training=fdl.Config(TrainingSetup, micro_batch_size=4, mini_batches=2)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=32), tokenizer=tok),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": even_length}),
        advantage=fdl.Config(GRPO, norm_by_std=False),
        sampling=fdl.Config(SamplingParams, n=4, max_new_tokens=6, temperature=1.0),
        prompts_per_step=6,
        total_steps=3,
        records=None,
    )
    graph = fdl.Config(Experiment, name="live", stages={"rl": stage}, runtime=fdl.Config(LocalRuntime),
                       output_dir=str(tmp_path / ("skip" if skip else "every")), progress=False)
    with monkeypatch.context() as patch:
        return run_capturing(patch, graph)


def test_rows_that_scored_alike_skip_the_old_log_probs_and_the_update_and_train_the_same(tmp_path, monkeypatch):
    skipped, every = run(tmp_path, monkeypatch, skip=True), run(tmp_path, monkeypatch, skip=False)
    assert sorted(skipped) == sorted(every) == [1, 2, 3]
    for step in skipped:
        (a, batch), (b, full) = skipped[step], every[step]
        assert 0 < a["actor/inert_rows_left_out"] < 1  # some groups scored alike, some did not
        assert "actor/inert_rows_left_out" not in b
        assert torch.equal(batch["responses"], full["responses"])  # the same samples: the weights were the same
        live = batch["advantages"].ne(0).any(-1)
        mask = batch["response_mask"].bool()
        # the old log-probs of the rows trained on, as the full pass gives them; none for the others
        torch.testing.assert_close(batch["old_log_probs"][live][mask[live]], full["old_log_probs"][live][mask[live]],
                                   rtol=1e-5, atol=1e-5)
        assert (batch["old_log_probs"][~live] == 0).all()
        # the engine-vs-trainer gap is read over the rows trained on: rounding noise, not the left-out rows' 0s
        assert a["rollout_corr/log_prob_abs_diff_max"] < 1e-4
        assert abs(a["rollout_corr/log_prob_abs_diff"] - b["rollout_corr/log_prob_abs_diff"]) < 1e-5
    import safetensors.torch

    final = [safetensors.torch.load_file(next((tmp_path / d).glob("live/*/rl/final/model.safetensors")))
             for d in ("skip", "every")]
    for k in final[0]:
        torch.testing.assert_close(final[0][k], final[1][k], rtol=1e-5, atol=1e-6)
    import safetensors.torch

    final = [safetensors.torch.load_file(next((tmp_path / d).glob("live/*/rl/final/model.safetensors")))
             for d in ("skip", "every")]
    for k in final[0]:  # and the same steps
        torch.testing.assert_close(final[0][k], final[1][k], rtol=1e-5, atol=1e-6)
