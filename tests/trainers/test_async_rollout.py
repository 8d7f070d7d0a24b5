"""Asynchronous rollout through RLTrainer on the tiny model (in-process runtime): every sample carries the
version that generated it, one step off trains batch k on the weights of version k-2, the decoupled
correction uses exactly those behaviour log-probs, and the plan says how the groups are placed."""

import fiddle as fdl
import pytest
import torch

from rlhf.algos import GRPO, DecoupledPPO, PPOClipLoss, RolloutCorrection, TokenTIS
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rewards.arithmetic import digit_match_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.preflight import PreflightError
from rlhf.trainers.export import export_checkpoint
from rlhf.trainers.records import RolloutRecorder, read_records
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import response_log_probs
from rlhf.workers.training import TrainingSetup
from rlhf_configs import common
from rlhf_configs.async_rollout import use_async_rollout
from rlhf_configs.pieces import policy_group
from helpers import run_capturing, tiny_model_path

CAP = 5.0  # DecoupledPPO's default behaviour-weight cap


def graph(out, steps=3, **trainer) -> fdl.Config[Experiment]:
    model = tiny_model_path()
    tok = fdl.Config(load_tokenizer, model)
    stage = fdl.Config(
        RLTrainer,
        # an entropy bonus moves the weights every step even where an untrained model's rewards are all equal,
        # and big steps make the versions differ clearly
        policy=policy_group(model_path=model, objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss),
                                                                   entropy_coef=0.5),
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=3e-2),
                            training=fdl.Config(TrainingSetup, micro_batch_size=8)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=16), tokenizer=tok),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": digit_match_score}),
        advantage=fdl.Config(GRPO),
        sampling=fdl.Config(SamplingParams, n=4, max_new_tokens=6),
        prompts_per_step=4,
        total_steps=steps,
        save_freq=1,
        keep_checkpoints=steps,
        records=fdl.Partial(RolloutRecorder),
        **trainer,
    )
    return fdl.Config(Experiment, name="async", stages={"rl": stage}, runtime=fdl.Config(LocalRuntime),
                      output_dir=str(out), run_name="run", progress=False)


def log_probs_under(folder: str, batch) -> torch.Tensor:
    model = load_causal_lm(folder).eval()
    with torch.no_grad():
        return response_log_probs(model, batch, batch.meta["temperature"])[0]


def version_weights(out, tmp_path, version: int, base: str | None = None) -> str:
    """The policy's weights of `version` as a model folder: the starting model `base` (default the tiny
    model), or checkpoint `version`."""
    if version == 0:
        return base or tiny_model_path()
    ckpt = out / "async" / "run" / "rl" / "checkpoints" / f"step_{version:08d}"
    return export_checkpoint(str(ckpt), str(tmp_path / f"v{version}"))


@pytest.mark.parametrize("correction", ["bypass", "decoupled"])
def test_one_step_off_trains_on_the_behaviour_log_probs_of_two_versions_back(tmp_path, monkeypatch, correction):
    """The lag is known: step k trains (at version k-1) on batch k, generated with version max(0, k-2). Its
    rollout log-probs are those of that version's weights (read back from the checkpoints), and the loss
    corrects with them: bypass takes them as the old log-probs (the logged `ppo_kl`, the token mean of
    log pi_old - log pi_theta, is that of versions k-2 and k-1), the decoupled objective weighs each token by
    pi_{k-1} / pi_{k-2}, dropping tokens above the cap (the logged token means match)."""
    g = graph(tmp_path / "out", steps=4)
    common.one_step_off(g, correction=correction)
    seen = run_capturing(monkeypatch, g)

    rows = read_records(tmp_path / "out" / "async" / "run" / "rl")
    assert {(r["step"], r["policy_version"]) for r in rows} == {(1, 0), (2, 0), (3, 1), (4, 2)}  # versions recorded
    for k, (metrics, batch) in seen.items():
        behaviour = max(0, k - 2)
        assert batch["policy_version"].tolist() == [behaviour] * len(batch)
        assert metrics["async/staleness/mean"] == metrics["async/staleness/max"] == k - 1 - behaviour

    lags = []
    for k in (1, 2, 3, 4):
        metrics, batch = seen[k]
        mask = batch["response_mask"].bool()
        behaviour_lp = log_probs_under(version_weights(tmp_path / "out", tmp_path, max(0, k - 2)), batch)
        proximal_lp = log_probs_under(version_weights(tmp_path / "out", tmp_path, k - 1), batch)
        torch.testing.assert_close(batch["rollout_log_probs"][mask], behaviour_lp[mask], atol=2e-5, rtol=0)
        if correction == "bypass":  # no old-log-prob pass: the old policy is the behaviour policy
            assert torch.equal(batch["old_log_probs"], batch["rollout_log_probs"])
            expected = float((behaviour_lp - proximal_lp)[mask].mean())
            assert metrics["actor/ppo_kl"] == pytest.approx(expected, abs=1e-5)
        else:  # one epoch, one mini-batch: the proximal policy is the current one, no old-log-prob pass
            assert "old_log_probs" not in batch
            ratio = torch.exp(proximal_lp - behaviour_lp)[mask]  # pi_prox / pi_behaviour
            assert metrics["actor/behaviour_weight_mean"] == pytest.approx(float(ratio.mean()), abs=1e-4)
            assert metrics["actor/behaviour_capped_fraction"] == pytest.approx(float((ratio > CAP).float().mean()),
                                                                               abs=1e-6)
        lags.append(float((proximal_lp - behaviour_lp)[mask].abs().mean()))
    assert lags[0] < 1e-5 and lags[1] > 1e-3 and lags[2] > 1e-3  # step 1 is on-policy; later steps really lag


def test_staleness_zero_generates_with_the_trainers_own_weights(tmp_path, monkeypatch):
    """max_staleness=0: the rollout group gets every update before it generates again, so its log-probs equal
    the trainer's to float rounding at every step (a missed or wrong weight sync shows as an O(1) gap)."""
    g = graph(tmp_path / "out", steps=3)
    # decoupled: no old log-probs in the batch, so the gap is measured against the training forward's log-probs
    # (bypass would set old := rollout log-probs, and the gap would be 0 whatever the weights)
    use_async_rollout(g.stages["rl"], max_staleness=0, weights="fixed_lag", transport="object_store",
                      correction="decoupled")
    seen = run_capturing(monkeypatch, g)
    for k, (metrics, batch) in seen.items():
        assert batch["policy_version"].tolist() == [k - 1] * len(batch)
        assert metrics["rollout_corr/log_prob_abs_diff_max"] < 1e-4, k


def test_async_rollout_without_a_correction_is_a_preflight_error(tmp_path):
    g = graph(tmp_path / "out")
    common.one_step_off(g)
    g.stages["rl"].rollout_correction = None
    with pytest.raises(PreflightError, match="stages.rl.rollout_correction: async_rollout trains on "
                                             "samples up to max_staleness versions old"):
        run_experiment(g)


def test_a_correction_already_set_is_kept(tmp_path):
    g = graph(tmp_path / "out")
    g.stages["rl"].rollout_correction = fdl.Config(RolloutCorrection, is_weights=fdl.Config(TokenTIS))
    common.streaming(g, max_staleness=3)
    assert fdl.get_callable(g.stages["rl"].rollout_correction) is RolloutCorrection
    assert g.stages["rl"].policy.worker.objective.decoupled is None  # one correction, not two
    assert g.stages["rl"].async_rollout.max_staleness == 3
    g = graph(tmp_path / "out")
    common.one_step_off(g)  # the default: PPO's ratio against the behaviour policy
    assert g.stages["rl"].rollout_correction.bypass and g.stages["rl"].policy.worker.objective.decoupled is None
    g = graph(tmp_path / "out")
    common.one_step_off(g, correction="decoupled")
    assert fdl.get_callable(g.stages["rl"].policy.worker.objective.decoupled) is DecoupledPPO
    assert g.stages["rl"].rollout_correction is None


@pytest.mark.parametrize("placement, where", [
    ("separate", "group 'rollout' on its own resources: generation overlaps training"),
    ("colocated", "group 'rollout' colocated with 'policy': time-sliced"),
])
def test_the_plan_shows_the_mode_and_the_placement(tmp_path, placement, where):
    g = graph(tmp_path / "out")
    common.one_step_off(g, placement=placement)
    text = compile_graph(g.stages["rl"]).describe()
    assert "group rollout: 1 x RolloutWorker" in text and "rollout engine HFEngine (float32)" in text
    assert "async rollout: one step off: batch k+1 is generated with the weights of version k-1" in text
    assert where in text and "NCCL broadcast between GPUs of their own, else Ray's object store" in text
    assert ("colocated with policy" in text) == (placement == "colocated")
    g = graph(tmp_path / "out")
    common.streaming(g, max_staleness=4, on_stale="drop", transport="object_store")
    text = compile_graph(g.stages["rl"]).describe()
    assert "streaming with the newest weights, at most 4 versions stale (drop past the bound)" in text
    assert "Ray's object store" in text


# ------------------------------------------------------------------------------- through Ray
RAY_MODES = {
    "one_step_off_broadcast": (dict(max_staleness=1, weights="fixed_lag", transport="broadcast"), {}),
    "streaming_drop_object_store": (dict(max_staleness=2, on_stale="drop", transport="object_store"), {}),
    "one_step_off_colocated": (dict(max_staleness=1, weights="fixed_lag", placement="colocated"), {}),
    # staleness 0 with the decoupled objective: the engine/trainer gap then measures the synced weights
    "fsdp_2_ranks_staleness_0_broadcast": (dict(max_staleness=0, weights="fixed_lag", rollout_workers=1,
                                                transport="broadcast", correction="decoupled"), {"fsdp": True}),
    "staleness_0_object_store": (dict(max_staleness=0, weights="fixed_lag", transport="object_store",
                                      correction="decoupled"), {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(RAY_MODES))
def test_each_mode_runs_through_ray(tmp_path, monkeypatch, ray_cluster, mode):
    from rlhf.runtime.ray_runtime import RayRuntime

    settings, extra = RAY_MODES[mode]
    g = graph(tmp_path / "out", steps=3)
    g.runtime = fdl.Config(RayRuntime, num_cpus=3)  # joins the session's cluster (tests/conftest.py, 3 CPUs)
    if extra.get("fsdp"):
        common.workers(g, n=2)
        common.fsdp(g)
    use_async_rollout(g.stages["rl"], **settings)
    seen = run_capturing(monkeypatch, g)
    bound = settings["max_staleness"]
    assert sorted(seen) == [1, 2, 3]
    for k, (metrics, batch) in seen.items():
        assert 0 <= metrics["async/staleness/max"] <= bound
        assert set(batch["policy_version"].tolist()) <= set(range(max(0, k - 1 - bound), k))
        for key in ("async/trainer_idle_s", "async/rollout_idle_s", "async/queue_size", "async/dropped"):
            assert key in metrics
        if bound == 0:  # the rollout side got every update exactly (FSDP-gathered, broadcast or object store)
            assert metrics["rollout_corr/log_prob_abs_diff_max"] < 1e-4, (k, metrics["rollout_corr/log_prob_abs_diff_max"])
    rows = read_records(tmp_path / "out" / "async" / "run" / "rl")
    assert sorted({r["step"] for r in rows}) == [1, 2, 3] and all("policy_version" in r for r in rows)
