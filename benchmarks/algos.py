"""Time every advantage estimator, loss and helper of rlhf.algos on a realistic batch.

    python benchmarks/algos.py                       # 1024 responses x 4096 tokens
    python benchmarks/algos.py --batch 256 --tokens 2048
    python benchmarks/algos.py --quick               # 128 x 512, a few seconds

One CPU thread (the machine is shared). Responses have ragged lengths (uniform in
[T/8, T], right padding), groups of 8 samples per prompt, an outcome reward on the last
token. GAE is compared, in the same run, with a straightforward per-timestep Python loop
in the style of verl's `compute_gae_advantage_return`; the table reports the speed-up.
Times are the minimum over --repeat runs after one warm-up run.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import torch

from rlhf.algos import (
    GAE,
    GPG,
    GRPO,
    OPO,
    RLOO,
    AdvantageInputs,
    CISPOLoss,
    ClipCovLoss,
    ClippedValueLoss,
    GMPOLoss,
    GRPOPassK,
    GSPOLoss,
    KLCovLoss,
    KLLoss,
    OptimalTokenBaseline,
    PPOClipLoss,
    REINFORCELoss,
    ReinforcePlusPlus,
    ReinforcePlusPlusBaseline,
    RejectionMask,
    ReMax,
    SAPOLoss,
    SequenceTIS,
    TokenTIS,
    apply_kl_penalty,
    entropy_from_logits,
    entropy_from_logits_chunked,
    log_probs_from_logits,
    masked_whiten,
    mismatch_metrics,
    seq_mean_token_mean,
    seq_mean_token_sum,
    token_mean,
)


def reference_gae(rewards, values, mask, gamma, lam):
    """Per-timestep loop over T, vectorised over B (verl's compute_gae_advantage_return, no whitening)."""
    with torch.no_grad():
        next_value = 0
        last = 0
        reversed_adv = []
        for t in reversed(range(rewards.shape[-1])):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            new = delta + gamma * lam * last
            next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
            last = new * mask[:, t] + (1 - mask[:, t]) * last
            reversed_adv.append(last)
        adv = torch.stack(reversed_adv[::-1], dim=1)
        return adv, adv + values


def timeit(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def make_batch(B: int, T: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(T // 8, 1), T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    scores = torch.randint(0, 2, (B,), generator=g).float()
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths - 1] = scores
    log_probs = -torch.rand(B, T, generator=g) * 3
    return {
        "mask": mask,
        "holes": mask * (torch.rand(B, T, generator=g) > 0.1).float(),  # 10% tool-output tokens
        "rewards": rewards,
        "values": torch.randn(B, T, generator=g),
        "group_ids": torch.arange(B) // 8,
        "baseline": torch.rand(B, generator=g),
        "log_probs": log_probs,
        "old_log_probs": log_probs + 0.05 * torch.randn(B, T, generator=g),
        "rollout_log_probs": log_probs + 0.05 * torch.randn(B, T, generator=g),
        "ref_log_probs": log_probs + 0.2 * torch.randn(B, T, generator=g),
        "advantages": torch.randn(B, T, generator=g),
        "sum_pi_squared": torch.rand(B, T, generator=g) * 0.5 + 0.2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1024, help="responses per batch (B)")
    parser.add_argument("--tokens", type=int, default=4096, help="response length T")
    parser.add_argument("--quick", action="store_true", help="small batch (128 x 512) for a smoke run")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per entry (the minimum is reported)")
    parser.add_argument("--vocab", type=int, default=32768, help="vocabulary for the log-prob/entropy rows")
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--lam", type=float, default=0.95)
    args = parser.parse_args()
    if args.quick:
        args.batch, args.tokens, args.vocab = 128, 512, 4096
    torch.set_num_threads(1)
    B, T = args.batch, args.tokens
    d = make_batch(B, T)
    mask = d["mask"]
    n_tok, n_seq = mask.sum(), (mask.sum(-1) > 0).sum()
    inputs = AdvantageInputs(
        d["rewards"], mask, group_ids=d["group_ids"], values=d["values"], baseline_rewards=d["baseline"],
        old_log_probs=d["old_log_probs"], sum_pi_squared=d["sum_pi_squared"],
    )
    hole_inputs = AdvantageInputs(d["rewards"] * d["holes"], d["holes"], values=d["values"])

    rows: list[tuple[str, str, float]] = []

    def add(section: str, name: str, fn: Callable[[], object], repeat: int = args.repeat) -> float:
        t = timeit(fn, repeat)
        rows.append((section, name, t))
        print(f"  {section:<11} {name:<44} {t * 1e3:10.2f} ms", flush=True)
        return t

    print(f"rlhf.algos benchmark: B={B} T={T} ({int(n_tok)} valid tokens), 1 thread, min of {args.repeat}")
    gae = GAE(gamma=args.gamma, lam=args.lam)
    t_gae = add("advantage", "GAE (vectorised, right padding)", lambda: gae(inputs))
    slow = max(1, args.repeat - 1)  # the reference loop is slow; fewer repeats
    t_ref = add(
        "advantage", "GAE reference loop (verl-style)",
        lambda: reference_gae(d["rewards"], d["values"], mask, args.gamma, args.lam), repeat=slow,
    )
    t_gae_h = add("advantage", "GAE (vectorised, 10% holes)", lambda: gae(hole_inputs))
    t_ref_h = add(
        "advantage", "GAE reference loop, 10% holes",
        lambda: reference_gae(hole_inputs.token_level_rewards, d["values"], d["holes"], args.gamma, args.lam),
        repeat=slow,
    )
    ref_adv, _ = reference_gae(d["rewards"], d["values"], mask, args.gamma, args.lam)
    max_err = ((gae(inputs)[0] - ref_adv) * mask).abs().max().item()
    add("advantage", "GAE whiten=True", lambda: GAE(args.gamma, args.lam, whiten=True)(inputs))
    estimators = [
        GRPO(), GRPO(norm_by_std=False), GRPOPassK(), RLOO(), OPO(), GPG(),
        ReinforcePlusPlus(), ReinforcePlusPlusBaseline(), ReMax(), OptimalTokenBaseline(),
    ]
    for est in estimators:
        add("advantage", repr(est), lambda est=est: est(inputs))

    lp = d["log_probs"]
    losses = [
        PPOClipLoss(), PPOClipLoss(clip_high=0.28, dual_clip=3.0), GSPOLoss(), SAPOLoss(), GMPOLoss(), CISPOLoss(),
        REINFORCELoss(), ClipCovLoss(), KLCovLoss(),
    ]
    for loss_obj in losses:
        def fwd_bwd(loss_obj=loss_obj):
            x = lp.clone().requires_grad_(True)
            loss, _ = loss_obj(x, d["old_log_probs"], d["advantages"], mask, num_tokens=n_tok, num_seqs=n_seq)
            loss.backward()
        suffix = "(dual, clip-higher)" if getattr(loss_obj, "dual_clip", None) else ""
        add("loss f+b", type(loss_obj).__name__ + suffix, fwd_bwd)

    def value_fwd_bwd():
        v = d["values"].clone().requires_grad_(True)
        ClippedValueLoss()(v, d["values"] + 0.1, d["rewards"], mask)[0].backward()

    add("loss f+b", "ClippedValueLoss", value_fwd_bwd)

    def kl_fwd_bwd():
        x = lp.clone().requires_grad_(True)
        KLLoss()(x, d["ref_log_probs"], mask)[0].backward()

    add("loss f+b", "KLLoss(k3)", kl_fwd_bwd)
    add("kl", "apply_kl_penalty(k1)", lambda: apply_kl_penalty(d["rewards"], lp, d["ref_log_probs"], mask, 0.01))
    for agg in [token_mean, seq_mean_token_sum, seq_mean_token_mean]:
        add("aggregate", agg.__name__, lambda agg=agg: agg(d["advantages"], mask))
    add("masked", "masked_whiten", lambda: masked_whiten(d["advantages"], mask))
    add("rollout", "TokenTIS(2.0)", lambda: TokenTIS()(d["old_log_probs"], d["rollout_log_probs"], mask))
    add("rollout", "SequenceTIS(2.0)", lambda: SequenceTIS()(d["old_log_probs"], d["rollout_log_probs"], mask))
    add(
        "rollout", "RejectionMask(k3, seq_mean)",
        lambda: RejectionMask(upper=0.01)(d["old_log_probs"], d["rollout_log_probs"], mask),
    )
    add("rollout", "mismatch_metrics", lambda: mismatch_metrics(d["old_log_probs"], d["rollout_log_probs"], mask))

    n_rows = 2048 if not args.quick else 256
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, n_rows, args.vocab, generator=g)
    labels = torch.randint(0, args.vocab, (1, n_rows), generator=g)

    def lp_fwd_bwd():
        z = logits.clone().requires_grad_(True)
        log_probs_from_logits(z, labels).sum().backward()

    def lp_reference():
        z = logits.clone().requires_grad_(True)
        torch.log_softmax(z, -1).gather(-1, labels[..., None]).sum().backward()

    vsize = f"{n_rows}x{args.vocab}"
    add("logits", f"log_probs_from_logits f+b ({vsize})", lp_fwd_bwd)
    add("logits", f"log_softmax+gather f+b ({vsize}, reference)", lp_reference)
    add("logits", f"entropy_from_logits ({vsize})", lambda: entropy_from_logits(logits))
    add("logits", f"entropy_from_logits_chunked ({vsize})", lambda: entropy_from_logits_chunked(logits))

    print()
    print(f"GAE speed-up vs reference loop: {t_ref / t_gae:.1f}x (right padding), {t_ref_h / t_gae_h:.1f}x (10% holes)")
    print(f"GAE max |vectorised - reference| on valid tokens: {max_err:.2e}")


if __name__ == "__main__":
    main()
