"""An objective whose loss is NaN: for testing that bad steps never reach the weights."""

from rlhf.workers.objectives import PolicyObjective


class NaNObjective(PolicyObjective):
    def __call__(self, log_probs, entropy, batch, *, num_tokens, num_seqs):
        loss, metrics = super().__call__(log_probs, entropy, batch, num_tokens=num_tokens, num_seqs=num_seqs)
        return loss * float("nan"), metrics
