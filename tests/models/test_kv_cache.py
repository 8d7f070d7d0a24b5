"""The KV-cache argument is passed under the name the installed transformers takes, without warnings."""

import warnings

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from helpers import tiny_model_path
from rlhf.models.kv_cache import cache_kwargs, output_cache
from rlhf.models.shared_prefix import response_logits


def test_a_cached_decode_step_equals_the_full_forward_and_is_quiet():
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()
    ids = torch.randint(0, 200, (2, 7))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecation warning fails the test
        with torch.no_grad():
            first = model(input_ids=ids[:, :6], use_cache=True, **cache_kwargs(model, DynamicCache(config=model.config)))
            step = model(input_ids=ids[:, 6:], use_cache=True, **cache_kwargs(model, output_cache(first)))
            full = model(input_ids=ids).logits
    torch.testing.assert_close(step.logits[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


def test_wrappers_are_looked_through():
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    wrapped = torch.nn.parallel.DistributedDataParallel.__new__(torch.nn.parallel.DistributedDataParallel)
    torch.nn.Module.__init__(wrapped)
    wrapped.module = model
    assert cache_kwargs(wrapped, "c") == cache_kwargs(model, "c") and len(cache_kwargs(model, "c")) == 1


def test_shared_prefix_forward_is_quiet():
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    ids = torch.cat([torch.randint(0, 200, (1, 5)).repeat(3, 1), torch.randint(0, 200, (3, 4))], dim=1)
    mask = torch.ones_like(ids)
    pos = torch.arange(ids.shape[1]).repeat(3, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shared = response_logits(model, ids, mask, pos, response_length=4)
    plain = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, 4:8]
    torch.testing.assert_close(shared, plain, rtol=1e-4, atol=1e-4)
