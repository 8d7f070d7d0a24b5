"""Token-in/token-out trajectories: golden conversations per parser and template, the peers' boundary
bugs, and hypothesis properties of the mask and log-probs (through truncation and the Batch)."""

import functools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import tiny_model_path
from rlhf.agents import (
    AgentRollout, ChatRenderer, CodeBlockParser, HermesParser, PythonCallParser, ToolCall, ToolEnvironment,
    Trajectory, trajectory_batch,
)
from rlhf.agents.library import python
from rlhf.agents.batch import response_spans
from rlhf.batch import Batch
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rollout.sampling import SamplingParams
from scripted import ScriptedPolicy
from chat_templates import QWEN25_TEMPLATE, SMOLLM2_TEMPLATE


def add(a: int, b: int) -> int:
    """Add two integers exactly.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b


@functools.cache
def tokenizer(template: str | None = None):
    tok = load_tokenizer(tiny_model_path())
    if template is not None:
        tok.chat_template = template
    return tok


def prompts_for(question: str, tok) -> Batch:
    rows = [{"data_source": "calc", "prompt": [{"role": "user", "content": question}],
             "reward_model": {"ground_truth": "12211"}, "extra_info": {}}]
    return PromptDataset(rows, tok, raw_prompt=True).collate([0])


def run(tok, parser, script: list[str], max_response_tokens=256, max_turns=4, max_new_tokens=64, **env):
    question = "What is 4821+7390?"
    policy = ScriptedPolicy(tok, {question: script})
    agent = AgentRollout(environment=functools.partial(ToolEnvironment, tools=[add], **env), tokenizer=tok,
                         parser=parser, max_turns=max_turns, max_response_tokens=max_response_tokens,
                         max_prompt_length=2048)  # Qwen2.5's tool preamble: ~900 tokens of the byte-level tokenizer
    batch, metrics = agent.rollout(policy.generate, prompts_for(question, tok), SamplingParams(max_new_tokens=max_new_tokens))
    return batch, metrics


def spans_of(batch: Batch, tok, row: int = 0) -> list[tuple[str, int]]:
    real = batch["attention_mask"][row, batch["prompts"].shape[1]:].bool()
    return response_spans(tok, batch["responses"][row][real].tolist(), batch["response_mask"][row][real].tolist())


# ------------------------------------------------------------------ golden trajectories
def test_golden_chatml_python_calls():
    tok = tokenizer()
    batch, metrics = run(tok, PythonCallParser(), ["add(4821, 7390)", "12211"])
    assert spans_of(batch, tok) == [
        ("add(4821, 7390)<|im_end|>", 1),
        # ChatML's newline after <|im_end|> (never sampled: the engine stops AT the token), then the tool
        # turn with its own separator, then the generation prompt
        ("\n<|im_start|>tool\n12211<|im_end|>\n<|im_start|>assistant\n", 0),
        ("12211<|im_end|>", 1),
    ]
    prompt = tok.decode(batch["prompts"][0][batch["attention_mask"][0, : batch["prompts"].shape[1]].bool()])
    assert prompt == "<|im_start|>user\nWhat is 4821+7390?<|im_end|>\n<|im_start|>assistant\n"
    assert list(batch["response_text"]) == ["12211"]
    assert batch["extra_info"][0]["agent"] == {"reward": None, "num_turns": 2, "finish_reason": "done",
                                               "tool_calls": 1.0}
    assert metrics["num_turns/mean"] == 2 and metrics["tool_calls/total"] == 1 and metrics["tool_errors/total"] == 0


def test_golden_qwen25_hermes_calls_with_parallel_results():
    tok = tokenizer(QWEN25_TEMPLATE)
    parser = HermesParser()
    call = parser.format([ToolCall("add", {"a": 4821, "b": 7390}), ToolCall("add", {"a": 1, "b": "x"})])
    batch, metrics = run(tok, parser, [call, "12211"], max_new_tokens=256, max_response_tokens=1024)
    spans = spans_of(batch, tok)
    assert spans[0] == (call + "<|im_end|>", 1)
    # both results in ONE user turn (the template merges consecutive tool messages), after the newline
    assert spans[1] == (
        "\n<|im_start|>user\n<tool_response>\n12211\n</tool_response>\n<tool_response>\n"
        "error: invalid arguments for add: b: Input should be a valid integer, unable to parse string as an "
        "integer\n</tool_response><|im_end|>\n<|im_start|>assistant\n", 0)
    assert spans[2] == ("12211<|im_end|>", 1)
    prompt = tok.decode(batch["prompts"][0][batch["attention_mask"][0, : batch["prompts"].shape[1]].bool()])
    assert '"name": "add"' in prompt and "Add two integers exactly." in prompt  # the row's tool schemas
    assert metrics["tool_calls/total"] == 2 and metrics["tool_errors/invalid_arguments"] == 1


def test_golden_smollm2_template_code_blocks_run_in_the_sandbox():
    tok = tokenizer(SMOLLM2_TEMPLATE)
    question = "What is 4821+7390?"
    agent = AgentRollout(environment=functools.partial(ToolEnvironment, tools=[python]), tokenizer=tok,
                         parser=CodeBlockParser())
    code = "Let me compute it.\n```python\nprint(4821 + 7390)\n```"
    batch, metrics = agent.rollout(ScriptedPolicy(tok, {question: [code, "12211"]}).generate,
                                   prompts_for(question, tok), SamplingParams(max_new_tokens=128))
    prompt = tok.decode(batch["prompts"][0][batch["attention_mask"][0, : batch["prompts"].shape[1]].bool()])
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                      "<|im_end|>\n<|im_start|>user\nWhat is 4821+7390?<|im_end|>\n<|im_start|>assistant\n")
    assert spans_of(batch, tok) == [
        (code + "<|im_end|>", 1),
        ("\n<|im_start|>tool\n12211<|im_end|>\n<|im_start|>assistant\n", 0),  # the program's output
        ("12211<|im_end|>", 1),
    ]
    assert metrics["tool_calls/total"] == 1 and metrics["tool_errors/total"] == 0


def test_builder_ids_equal_one_render_where_the_template_is_append_only():
    for template in (None, QWEN25_TEMPLATE, SMOLLM2_TEMPLATE):
        tok = tokenizer(template)
        parser = HermesParser()
        call = parser.format([ToolCall("add", {"a": 4821, "b": 7390})])
        batch, _ = run(tok, parser, [call, "12211"], max_new_tokens=256, max_response_tokens=1024)
        ids = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
        renderer = ChatRenderer(tok, [ToolEnvironment([add]).tools["add"].schema])
        messages = [{"role": "user", "content": "What is 4821+7390?"},
                    {"role": "assistant", "content": parser.format([__import__("rlhf.agents", fromlist=["ToolCall"])
                                                                    .ToolCall("add", {"a": 4821, "b": 7390})])},
                    {"role": "tool", "name": "add", "content": "12211"},
                    {"role": "assistant", "content": "12211"}]
        single = renderer.encode(renderer.text(messages, generation_prompt=False))
        assert ids + renderer.encode("\n") == single  # the final newline comes after where the engine stopped


# ------------------------------------------------------------------ the peers' boundary bugs
def test_separator_after_a_tool_turn_is_kept():
    """verl#6921: the newline between a tool turn's <|im_end|> and the next <|im_start|> went missing."""
    tok = tokenizer()
    batch, _ = run(tok, PythonCallParser(), ["add(1, 2)", "add(3, 3)", "6"])
    text = tok.decode(batch["responses"][0][batch["attention_mask"][0, batch["prompts"].shape[1]:].bool()])
    assert text.count("<|im_end|>\n<|im_start|>") == 4  # after each of 2 assistant and 2 tool turns
    assert "<|im_end|><|im_start|>" not in text


def test_eos_stop_without_the_template_trailing_newline():
    """verl#3720: the engine stops at <|im_end|>; the template's newline after it belongs to the next
    observation (mask 0), never to the sampled turn, and the sampled ids end exactly at EOS."""
    tok = tokenizer()
    batch, _ = run(tok, PythonCallParser(), ["add(1, 2)", "3"])
    mask, ids = batch["response_mask"][0], batch["responses"][0]
    sampled_end = int(torch.nonzero(mask.diff() == -1)[0]) + 1  # first position after the first sampled run
    assert ids[sampled_end - 1] == tok.eos_token_id and tok.decode([int(ids[sampled_end])]) == "\n"
    assert mask[sampled_end] == 0


def test_truncation_inside_a_tool_response():
    """The token budget runs out inside an observation: the ids stop at the budget, the cut observation
    is mask 0, and every sampled token keeps its log-prob."""
    tok = tokenizer()
    full, _ = run(tok, PythonCallParser(), ["add(1, 2)", "3"])
    first_turn = len(tok("add(1, 2)")["input_ids"]) + 1
    budget = first_turn + 5  # 5 tokens into "\n<|im_start|>tool\n3..."
    cut, metrics = run(tok, PythonCallParser(), ["add(1, 2)", "3"], max_response_tokens=budget)
    assert cut["attention_mask"][0, cut["prompts"].shape[1]:].sum() == budget
    assert cut["response_mask"][0].tolist() == [1] * first_turn + [0] * 5
    assert torch.equal(cut["responses"][0, :budget], full["responses"][0, :budget])
    assert torch.equal(cut["rollout_log_probs"][0, :budget], full["rollout_log_probs"][0, :budget])
    assert cut["extra_info"][0]["agent"]["finish_reason"] == "max_tokens" and metrics["agent/finish/max_tokens"] == 1


def test_turn_cut_by_max_new_tokens_ends_the_conversation():
    tok = tokenizer()
    batch, metrics = run(tok, PythonCallParser(), ["add(4821, 7390)", "12211"], max_new_tokens=6)
    assert batch["response_mask"][0].tolist() == [1] * 6  # no EOS: nothing is appended after it
    assert metrics["agent/finish/length"] == 1 and metrics["num_turns/max"] == 1


def test_observation_characters_are_capped():
    tok = tokenizer()
    question = "What is 4821+7390?"
    agent = AgentRollout(environment=functools.partial(ToolEnvironment, tools=[add]), tokenizer=tok,
                         parser=PythonCallParser(), max_observation_chars=3)
    batch, _ = agent.rollout(ScriptedPolicy(tok, {question: ["add(4821, 7390)", "x"]}).generate,
                             prompts_for(question, tok), SamplingParams(max_new_tokens=32))
    assert "<|im_start|>tool\n122... (truncated: 2 more characters)<|im_end|>" in tok.decode(batch["responses"][0])


# ------------------------------------------------------------------ hypothesis properties
turns = st.lists(
    st.tuples(
        st.lists(st.integers(0, 255), min_size=0, max_size=12),  # sampled byte tokens of one turn
        st.booleans(),  # the turn ended on EOS
        st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20),  # the observation
    ),
    min_size=1, max_size=4,
)


@given(turns=turns, budget=st.integers(1, 120))
def test_mask_and_log_probs_stay_aligned_through_truncation(turns, budget):
    tok = tokenizer()
    renderer = ChatRenderer(tok)
    t = Trajectory.start(renderer, [{"role": "user", "content": "q"}], budget)
    appended = []  # (position, id, log-prob) of every sampled token kept
    counter = 0
    for sampled, stops, observation in turns:
        ids = sampled + ([tok.eos_token_id] if stops else [])
        lps = [-(counter + k + 1) / 7 for k in range(len(ids))]
        counter += len(ids)
        start = len(t.response_ids)
        t.add_sampled(renderer, ids, lps)
        kept = len(t.response_ids) - start
        appended += [(start + k, ids[k], lps[k]) for k in range(kept)]
        if t.finished:
            break
        t.add_messages(renderer, [{"role": "tool", "content": observation}])
        if t.finished:
            break
    # mask length equals response length, within the budget
    assert len(t.response_ids) == len(t.loss_mask) == len(t.log_probs) <= budget
    # masked tokens are exactly the sampled ones, each with its own log-prob; the rest has log-prob 0
    assert [i for i, m in enumerate(t.loss_mask) if m] == [p for p, _, _ in appended]
    assert all(t.response_ids[p] == i and t.log_probs[p] == lp for p, i, lp in appended)
    assert all(lp == 0.0 for lp, m in zip(t.log_probs, t.loss_mask) if not m)
    # and the same through the Batch, beside a shorter and a longer row
    other = Trajectory.start(renderer, [{"role": "user", "content": "a longer question"}], 400)
    other.add_sampled(renderer, [65] * 30 + [tok.eos_token_id], [-0.5] * 31)
    rows = Batch({}, {"uid": ["a", "b"], "extra_info": [{}, {}]})
    batch = trajectory_batch([t, other], rows, tok.pad_token_id, temperature=1.0, max_new_tokens=400)
    p = batch["prompts"].shape[1]
    n = len(t.response_ids)
    assert batch["response_mask"][0, :n].tolist() == t.loss_mask and batch["response_mask"][0, n:].sum() == 0
    assert batch["rollout_log_probs"][0, :n].tolist() == pytest.approx(t.log_probs)
    assert batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist() == t.prompt_ids + t.response_ids
    assert batch["attention_mask"][0, p:].sum() == n
    assert (batch["rollout_log_probs"][batch["response_mask"] == 0] == 0).all()


def test_golden_trajectories_for_a_two_sample_group_share_the_prompt_and_uid():
    tok = tokenizer()
    rows = arithmetic_rows(2, seed=3)
    data = PromptDataset(rows, tok, raw_prompt=True)
    operands = {r["prompt"][0]["content"]: r["prompt"][0]["content"].removeprefix("What is ").rstrip("?").split("+")
                for r in rows}
    scripts = {q: [f"add({a}, {b})", str(int(a) + int(b))] for q, (a, b) in operands.items()}
    agent = AgentRollout(environment=functools.partial(ToolEnvironment, tools=[add]), tokenizer=tok,
                         parser=PythonCallParser())
    batch, metrics = agent.rollout(ScriptedPolicy(tok, scripts).generate, data.collate([0, 1]),
                                   SamplingParams(n=2, max_new_tokens=32))
    assert list(batch["uid"]) == ["prompts-0", "prompts-0", "prompts-1", "prompts-1"]
    assert list(batch["response_text"]) == [r["reward_model"]["ground_truth"] for r in rows for _ in range(2)]
    assert metrics["num_turns/mean"] == 2 and metrics["agent/finish/done"] == 1


def test_mask_truncated_keeps_cut_conversations_out_of_the_loss():
    tok = tokenizer()
    question = "What is 4821+7390?"
    for mask_truncated, trained in ((False, True), (True, False)):
        agent = AgentRollout(environment=functools.partial(ToolEnvironment, tools=[add]), tokenizer=tok,
                             parser=PythonCallParser(), max_turns=1, mask_truncated=mask_truncated)
        batch, metrics = agent.rollout(ScriptedPolicy(tok, {question: ["add(1, 2)", "3"]}).generate,
                                       prompts_for(question, tok), SamplingParams(max_new_tokens=32))
        assert metrics["agent/finish/max_turns"] == 1
        assert bool(batch["response_mask"].any()) is trained
