"""How spread out a policy's held-out answers are: the sign of a policy that learnt to guess.

A reward that pays only for right answers can still be raised by guessing: a policy that answers "6" to every
greatest-common-divisor question is right wherever 6 is, and its training score can sit above the base model's
while its held-out accuracy falls. Its answers collapse onto a few values, which these numbers show beside the
held-out score:

- `top_share`: the share of responses giving the most common answer;
- `distinct`: distinct answers per response (1.0: every answer differs);
- `truth_top_share`: the share of rows whose right answer is the most common right answer, the scale for
  `top_share` (a policy whose `top_share` is far above it answers the same thing to questions whose answers
  differ).

An answer is the response's final answer in the asked-for form (`rlhf.rewards.final_answer.final_answer`), else
its last non-empty line; case, surrounding space and a closing full stop aside.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rlhf.rewards.final_answer import final_answer


def answer_key(response: str) -> str:
    """The response's answer, normalised for counting (module docstring)."""
    answer = final_answer(response)
    if answer is None:
        lines = [line for line in response.splitlines() if line.strip()]
        answer = lines[-1] if lines else ""
    return " ".join(answer.lower().split()).removesuffix(".").strip()


def answer_spread(responses: Sequence[str], truths: Sequence[object] = ()) -> dict[str, float]:
    """`top_share` and `distinct` of `responses`, and `truth_top_share` of `truths` when given (None entries,
    rows without a right answer, are left out); empty for no responses."""
    if not responses:
        return {}
    counts = Counter(answer_key(r) for r in responses)
    spread = {"top_share": max(counts.values()) / len(responses), "distinct": len(counts) / len(responses)}
    known = [" ".join(str(t).lower().split()) for t in truths if t is not None]
    if known:
        spread["truth_top_share"] = max(Counter(known).values()) / len(known)
    return spread
