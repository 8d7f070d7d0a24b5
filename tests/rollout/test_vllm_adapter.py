"""vLLM given a PEFT adapter folder: it reads weights from disk, so it gets the merged model written once
to the cache (rlhf.models.loading.model_folder), and generates what the transformers engine does with
the adapter merged (real vLLM: the CPU build, `bash scripts/test_vllm.sh`)."""

import pytest
import torch

from helpers import chat_batch, vllm_model_path
from rlhf.models.loading import load_causal_lm
from rlhf.rollout import HFEngine, SamplingParams
from rlhf.rollout.vllm_engine import VLLMEngine

pytestmark = pytest.mark.vllm
peft = pytest.importorskip("peft")


def test_vllm_serves_an_adapter_folder_merged(tmp_path, monkeypatch):
    from rlhf.workers.lora import LoRA, save_adapter

    monkeypatch.setenv("RLHF_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = LoRA(rank=4)(load_causal_lm(vllm_model_path()))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    save_adapter(model, str(tmp_path / "adapter"))
    engine = VLLMEngine(str(tmp_path / "adapter"), dtype="float32", max_model_len=256, max_num_seqs=64)
    hf = HFEngine(str(tmp_path / "adapter"))
    batch = chat_batch(hf.tokenizer, ["What is 2+3?", "Name three colours, please.", "x"])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    got = engine.generate(batch, greedy)["responses"]
    assert torch.equal(got, hf.generate(batch, greedy)["responses"])
    assert not torch.equal(got, HFEngine(vllm_model_path()).generate(batch, greedy)["responses"])  # the adapter acts
    assert list((tmp_path / "cache" / "merged").iterdir())  # the merged copy vLLM read
