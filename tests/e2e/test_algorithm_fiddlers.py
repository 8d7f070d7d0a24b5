"""Every algorithm fiddler of experiments/arithmetic_tiny.py runs, and does what it is for.

Each case is `--config fiddler:NAME --config fiddler:smoke --config fiddler:local` through the
in-process API, RL stage only: the SFT stage runs once for the module and its checkpoint is given
to every RL stage (`resolve_stage_outputs`, what the runner does between stages). The checks read
the last step's metrics and the recorded rollouts (scores and first-token advantages per sample),
and recompute what the feature must have done to them. For the policy losses they also read the
weights before and after step 1 (the SFT checkpoint, the step-1 checkpoint) and require the
update to have raised the log-probability of the samples with positive advantage relative to the
others, as every policy-gradient loss must; and SAPO, CISPO and GMPO must move the weights elsewhere
than PPO-clip does on the same samples with the same two mini-batches (their loss took effect).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import rlhf_configs.common as common
from rlhf.models.loading import load_tokenizer
from rlhf.runtime.experiment import resolve_stage_outputs, run_experiment
from rlhf.trainers.export import export_checkpoint
from rlhf.trainers.records import read_records

from helpers import load_file

MODULE = load_file("experiments/arithmetic_tiny.py")


def ppo_two_mini_batches(cfg) -> None:
    """The baseline of the SAPO, CISPO and GMPO runs: the recipe's PPO-clip loss with their two mini-batches."""
    cfg.stages["grpo"].policy.worker.training.mini_batches = 2


def graph_for(tmp_path: Path, *fiddlers):
    graph = MODULE.base()
    for name in fiddlers:
        (ppo_two_mini_batches if name == "ppo_two_mini_batches" else getattr(MODULE, name))(graph)
    MODULE.smoke(graph)
    for f in (common.local, common.no_tracking, common.quiet):
        f(graph)
    graph.output_dir = str(tmp_path)
    return graph


@pytest.fixture(scope="module")
def sft_checkpoint(tmp_path_factory) -> str:
    graph = graph_for(tmp_path_factory.mktemp("sft"))
    graph.stages = {"sft": graph.stages["sft"]}
    return run_experiment(graph)["sft"]["checkpoint"]


@dataclasses.dataclass
class Run:
    metrics: dict  # the last step's
    folder: Path  # the RL stage's folder: rollouts.jsonl, checkpoints/step_*

    def groups(self, step: int) -> dict[str, list[dict]]:
        """The step's recorded rows by prompt uid."""
        groups = defaultdict(list)
        for row in read_records(self.folder, step=step):
            groups[row["uid"]].append(row)
        return dict(groups)


@pytest.fixture(scope="module")
def runs(sft_checkpoint, tmp_path_factory):
    """`runs(name)`: the RL stage with fiddler `name` (run once per module, a checkpoint after every step)."""
    done: dict[str, Run] = {}

    def get(name: str) -> Run:
        if name not in done:
            graph = graph_for(tmp_path_factory.mktemp(name), *([name] if name != "grpo" else []))
            stage = resolve_stage_outputs(graph.stages["grpo"], {"sft": {"checkpoint": sft_checkpoint}}, "grpo")
            stage.save_freq = 1
            graph.stages = {"grpo": stage}
            result = run_experiment(graph)["grpo"]
            done[name] = Run(result["metrics"], Path(result["checkpoint"]).parent)
        return done[name]

    return get


def scores(rows):
    return [r["score"] for r in rows]


def approx(values, expected):
    assert values == pytest.approx(expected, rel=1e-4, abs=1e-5)


def with_spread(groups):
    spread = [rows for rows in groups.values() if len(set(scores(rows))) > 1]
    assert spread, "no prompt got different rewards: the check below would be vacuous"
    return spread


# ------------------------------------------------------------------ estimators
def check_grpo(metrics, groups):
    for rows in groups.values():
        s = scores(rows)
        std = statistics.stdev(s)
        approx([r["advantage"] for r in rows], [(x - statistics.mean(s)) / (std + 1e-6) for x in s])


def check_rloo(metrics, groups):
    for rows in with_spread(groups):
        s = scores(rows)
        approx([r["advantage"] for r in rows], [x - (sum(s) - x) / (len(s) - 1) for x in s])


def check_opo(metrics, groups):
    for rows in with_spread(groups):
        s, lengths = scores(rows), [r["response_length"] for r in rows]
        baseline = sum(n * x for n, x in zip(lengths, s)) / sum(lengths)
        approx([r["advantage"] for r in rows], [x - baseline for x in s])


def check_gpg(metrics, groups):
    spread = with_spread(groups)
    alpha = sum(map(len, groups.values())) / sum(map(len, spread))  # B / (B - M)
    for rows in groups.values():
        s = scores(rows)
        expected = [alpha * (x - statistics.mean(s)) for x in s] if rows in spread else [0.0] * len(s)
        approx([r["advantage"] for r in rows], expected)
    assert "actor/kl_loss" not in metrics


def check_grpo_passk(metrics, groups):
    for rows in with_spread(groups):
        s = scores(rows)
        credited = [r for r in rows if r["advantage"] != 0]
        if s.count(max(s)) == 1:  # only the best sample gets credit, max - second max > 0
            assert len(credited) == 1 and credited[0]["score"] == max(s)
        else:  # a tie for the best: max - second max = 0, nobody does
            assert credited == []


def check_reinforce_pp(metrics, groups):
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.001  # the KL went into the reward...
    assert "actor/kl_loss" not in metrics  # ...and out of the loss
    advantages = [r["advantage"] for rows in groups.values() for r in rows]
    assert max(advantages) > 0 > min(advantages)  # whitened over the batch


def check_remax(metrics, groups):
    assert metrics["timing_s/gen_max"] > 0  # the greedy rollout ran inside the step
    assert metrics["timing_s/step"] > metrics["timing_s/gen"] + metrics["timing_s/gen_max"]
    for rows in groups.values():  # A = score - greedy score: the same baseline for the whole group
        baselines = {round(r["score"] - r["advantage"], 4) for r in rows}
        assert len(baselines) == 1


def check_optimal_token_baseline(metrics, groups):
    differs_from_mean = False
    for rows in with_spread(groups):
        s = scores(rows)
        baselines = {round(r["score"] - r["advantage"], 4) for r in rows}
        assert len(baselines) == 1  # at t = 0 every sample of a group shares one weighted baseline
        (b,) = baselines
        assert min(s) - 1e-4 <= b <= max(s) + 1e-4  # a weighted mean of the group's returns
        differs_from_mean |= abs(b - statistics.mean(s)) > 1e-3  # weights from sum_pi_squared, not uniform
    assert differs_from_mean


def check_ppo(metrics, groups):
    assert {"critic/vf_loss", "critic/values/mean", "critic/vf_explained_var"} <= metrics.keys()
    assert all(len(rows) == 1 for rows in groups.values())  # one sample per prompt
    # after the critic's warm-up (step 1) the actor trains too: a real policy-gradient step
    assert metrics["actor/grad_norm"] > 0 and "actor/pg_loss" in metrics


# -------------------------------------------------------- DAPO and trainer features
def check_dapo(metrics, groups):
    assert 1 <= metrics["train/num_gen_batches"] <= 3
    found, filled = metrics["dynamic_sampling/groups_with_variance"], metrics["dynamic_sampling/filled_groups"]
    assert found + filled == 4 and len(groups) == 4
    assert sum(len(set(scores(rows))) > 1 for rows in groups.values()) >= found  # kept for their spread
    assert metrics["reward/overlong_penalty/mean"] <= 0  # overlong shaping on the RL stage's reward
    assert "actor/kl_loss" not in metrics


def check_pf_ppo(metrics, groups):
    assert metrics["pf_ppo/unique_fraction"] < 1  # resampled with replacement...
    assert sum(map(len, groups.values())) == 32  # ...to the same batch size
    assert metrics["pf_ppo/score_mean_before"] > 0
    assert metrics["critic/score/mean"] > metrics["pf_ppo/score_mean_before"]  # |score|^2 favours high scores


def check_rollout_correction(metrics, groups):
    for key in ("rollout_is_mean", "rollout_is_eff_sample_size", "rollout_rs_masked_fraction", "kl", "chi2_seq"):
        assert f"rollout_corr/{key}" in metrics, key
    # the HF engine samples with the trainer's own module in float32: no mismatch to correct
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert abs(metrics["rollout_corr/kl"]) < 1e-4


def check_token_tis(metrics, groups):
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
    assert "rollout_corr/rollout_rs_masked_fraction" not in metrics  # no rejection configured


# ------------------------------------------------------------------ policy losses
def off_policy(metrics):
    assert metrics["actor/ppo_kl"] != 0  # the second mini-batch ran on moved weights


def check_gspo(metrics, groups):
    off_policy(metrics)
    assert metrics["actor/pg_clipfrac"] > 0  # the 4e-4 sequence-ratio range clips after one step
    assert "actor/pg_clipfrac_lower" not in metrics  # not PPO's loss


def check_sapo(metrics, groups):
    off_policy(metrics)
    assert "actor/pg_clipfrac" not in metrics  # a smooth gate: nothing is clipped


def check_cispo(metrics, groups):
    off_policy(metrics)
    assert "actor/pg_clipfrac" in metrics and "actor/pg_clipfrac_lower" not in metrics


def check_gmpo(metrics, groups):
    check_cispo(metrics, groups)


def check_clip_cov(metrics, groups):
    assert metrics["actor/pg_clipcov_frac"] > 0  # some high-covariance tokens lost their gradient


def check_kl_cov(metrics, groups):
    assert metrics["actor/pg_klcov_frac"] > 0  # some high-covariance tokens got the KL penalty


CHECKS = {name.removeprefix("check_"): fn for name, fn in dict(globals()).items() if name.startswith("check_")}


def test_every_algorithm_fiddler_has_a_check():
    fiddlers = {"ppo", "rloo", "reinforce_pp", "remax", "opo", "gpg", "grpo_passk", "optimal_token_baseline", "dapo",
                "gspo", "sapo", "cispo", "gmpo", "clip_cov", "kl_cov", "rollout_correction", "token_tis", "pf_ppo"}
    assert fiddlers <= set(CHECKS) and all(hasattr(MODULE, f) for f in fiddlers)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_fiddler_does_what_it_is_for(name, runs):
    run = runs(name)
    CHECKS[name](run.metrics, run.groups(step=2))


def response_ids(tokenizer, row: dict) -> list[int] | None:
    """The recorded prompt + response as token ids (byte-level: exact, with the EOS the decoded text
    lost when the recorded length says it was there); None where the text is not exact (bytes that
    are not UTF-8 were decoded to U+FFFD)."""
    if "\ufffd" in row["response"]:
        return None
    response = tokenizer(row["response"], add_special_tokens=False)["input_ids"]
    if len(response) + 1 == row["response_length"]:
        response.append(tokenizer.eos_token_id)
    return response if len(response) == row["response_length"] else None


def response_log_prob(model, tokenizer, row: dict, response: list[int]) -> float:
    """Mean log-prob of a recorded response under `model`."""
    prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return float(torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None]).mean())


@pytest.mark.parametrize("name", ["grpo", "gspo", "sapo", "cispo", "gmpo"])
def test_the_loss_moves_the_policy_the_way_the_advantages_point(name, runs, sft_checkpoint, tmp_path):
    """Step 1 (two mini-batches: the second one off-policy, where the losses differ) must raise the mean
    log-prob of samples with A > 0 relative to those with A < 0: sum_i A_i (log pi_1 - log pi_0)(y_i) > 0."""
    run = runs(name)
    after_step_1 = export_checkpoint(str(run.folder / "checkpoints" / "step_00000001"), str(tmp_path / "step1"))
    before = AutoModelForCausalLM.from_pretrained(sft_checkpoint).eval()
    after = AutoModelForCausalLM.from_pretrained(after_step_1).eval()
    tokenizer = load_tokenizer(sft_checkpoint)
    rows = [(r, ids) for rows in run.groups(step=1).values() for r in rows
            if r["advantage"] != 0 and (ids := response_ids(tokenizer, r)) is not None]
    assert len(rows) >= 8, "too few samples with an advantage: the check would be vacuous"
    moved = [response_log_prob(after, tokenizer, r, ids) - response_log_prob(before, tokenizer, r, ids)
             for r, ids in rows]
    rows = [r for r, _ in rows]
    advantages = [r["advantage"] for r in rows]
    up = statistics.mean(m for m, a in zip(moved, advantages) if a > 0)
    down = statistics.mean(m for m, a in zip(moved, advantages) if a < 0)
    assert sum(a * m for a, m in zip(advantages, moved)) > 0 and up > down, (up, down)


def step_1_weights(run: Run, folder: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(
        export_checkpoint(str(run.folder / "checkpoints" / "step_00000001"), str(folder))).state_dict()


@pytest.mark.parametrize("name", ["sapo", "cispo", "gmpo"])
def test_the_loss_is_not_ppos(name, runs, sft_checkpoint, tmp_path):
    """On the very samples and advantages of PPO-clip with the same two mini-batches, step 1 moves the weights
    elsewhere. The first mini-batch is on-policy (r = 1), where these losses' gradients equal PPO's; the second
    is off-policy, where the loss is the only difference. A fiddler whose loss did not take effect, or a loss
    that reduced to PPO's, leaves the weights equal."""
    run, ppo = runs(name), runs("ppo_two_mini_batches")
    samples = lambda r: sorted((row["uid"], row["response"], row["advantage"])  # noqa: E731
                               for rows in r.groups(step=1).values() for row in rows)
    assert samples(run) == samples(ppo)  # the same rollout: any difference below comes from the update
    start = AutoModelForCausalLM.from_pretrained(sft_checkpoint).state_dict()
    mine, theirs = step_1_weights(run, tmp_path / "mine"), step_1_weights(ppo, tmp_path / "ppo")
    norm = lambda a, b: float(sum(((a[k] - b[k]) ** 2).sum() for k in a)) ** 0.5  # noqa: E731
    assert norm(mine, theirs) > 0.1 * norm(theirs, start), (norm(mine, theirs), norm(theirs, start))
