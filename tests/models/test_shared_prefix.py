"""Shared-prompt response logits equal an ordinary forward's: values and gradients."""

import torch

from rlhf.algos import log_probs_from_logits
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.shared_prefix import response_logits
from rlhf.rollout import HFEngine, SamplingParams
from helpers import tiny_model_path


def rollout(n: int, prompts: int = 4, max_new_tokens: int = 6):
    path = tiny_model_path()
    model, tok = load_causal_lm(path), load_tokenizer(path)
    data = PromptDataset(arithmetic_rows(prompts, seed=0) + [
        {**arithmetic_rows(1, seed=1)[0], "prompt": [{"role": "user", "content": "a longer prompt: left padding"}]}
    ], tok)
    torch.manual_seed(0)
    batch = HFEngine.sharing(model, tok).generate(data.collate(range(prompts + 1)), SamplingParams(n=n, max_new_tokens=max_new_tokens))
    return model, batch


def full_logits(model, batch):
    r = batch["responses"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], logits_to_keep=r + 1, use_cache=False)
    return out.logits[:, :-1]


def test_log_probs_and_gradients_equal_a_full_forward():
    model, batch = rollout(n=3)
    r, mask = batch["responses"].shape[1], batch["response_mask"].bool()
    assert r > 1 and (batch["attention_mask"][:, 0] == 0).any()  # responses of several tokens, some left padding
    grads = []
    for logits_fn in (full_logits, lambda m, b: response_logits(
            m, b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"].shape[1])):
        model.zero_grad()
        log_probs = log_probs_from_logits(logits_fn(model, batch).float(), batch["responses"])
        (log_probs * mask).sum().backward()
        grads.append((log_probs.detach(), [p.grad.clone() for p in model.parameters()]))
    (lp_full, g_full), (lp_shared, g_shared) = grads
    assert torch.allclose(lp_full[mask], lp_shared[mask], atol=1e-5)
    for a, b in zip(g_full, g_shared):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_the_prompt_pass_runs_once_per_distinct_prompt():
    model, batch = rollout(n=4)
    rows = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape), with_kwargs=True)
    try:
        with torch.no_grad():
            response_logits(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                            batch["responses"].shape[1])
    finally:
        handle.remove()
    r = batch["responses"].shape[1]
    assert rows == [(5, batch["input_ids"].shape[1] - r), (20, r - 1)]


def test_without_shared_prompts_it_is_one_ordinary_forward():
    model, batch = rollout(n=1)
    with torch.no_grad():
        shared = response_logits(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                 batch["responses"].shape[1])
        assert torch.equal(shared, full_logits(model, batch))
