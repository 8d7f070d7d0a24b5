"""Is a chat template append-only for a multi-turn tool conversation? Where is it not?

The trajectory builder (rlhf.agents.trajectory) appends the engine's tokens and, for each
observation, the text the template adds for it. Its ids equal one render of the whole
conversation exactly when

1. the template is **prefix-preserving**: rendering one more message only appends text (a
   template that drops earlier reasoning, or re-renders the system prompt with the tools, is not);
2. the text it writes after an assistant's end-of-turn token (ChatML's newline), which the engine
   never samples, is what the builder puts before the next observation;
3. tokenisation is **additive** at the seams: tokenising the pieces one by one gives the ids of
   tokenising the whole render (BPE merges across a seam break this).

`check_template(tokenizer)` runs a sample conversation (system, user, assistant calling a tool,
tool result, two parallel results, a user follow-up, a final answer) through both and reports every
place where they part, with the message and the text around it. `rlhf models check-template MODEL`
prints the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from transformers import PreTrainedTokenizerBase

from rlhf.agents.trajectory import ChatRenderer, Trajectory

SAMPLE_TOOLS = [{
    "type": "function",
    "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer", "description": "first"},
                                                        "b": {"type": "integer", "description": "second"}},
                       "required": ["a", "b"]},
    },
}]


def sample_conversation() -> list[dict]:
    """A tool conversation with every boundary the builder crosses."""
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 4821, "b": 7390}}\n</tool_call>'
    return [
        {"role": "system", "content": "You are a careful assistant. Use the tools when numbers are large."},
        {"role": "user", "content": "What is 4821+7390?"},
        {"role": "assistant", "content": call},
        {"role": "tool", "name": "add", "content": "12211"},
        {"role": "assistant", "content": call.replace("4821", "12211").replace("7390", "5")},
        {"role": "tool", "name": "add", "content": "12216"},
        {"role": "tool", "name": "add", "content": "error: add timed out after 10 s"},
        {"role": "assistant", "content": "4821+7390 is 12211."},
        {"role": "user", "content": "And plus five?"},
        {"role": "assistant", "content": "12216"},
    ]


@dataclasses.dataclass
class TemplateReport:
    """What `check_template` found: `problems` make the builder's ids differ from one render; `notes` do not."""

    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    builder_ids: list[int] = dataclasses.field(default_factory=list)  # the builder's prompt + response ids
    render_ids: list[int] = dataclasses.field(default_factory=list)  # one render of the whole conversation
    first_difference: int | None = None  # first index where they differ (None: equal)

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        lines = ["append-only: yes (the builder's ids equal one render of the conversation)" if self.ok else
                 "append-only: NO (the builder's ids differ from one render of the conversation; see below)"]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def check_template(
    tokenizer: PreTrainedTokenizerBase,
    conversation: Sequence[Mapping] | None = None,  # None: `sample_conversation()`
    tools: Sequence[Mapping] | None = None,  # None: a sample `add` tool's schema
    eos_token_ids: Sequence[int] | None = None,  # where the engine stops a turn; None: the tokenizer's EOS
) -> TemplateReport:
    """Build `conversation` as the agent loop would (assistant turns as their canonical tokens) and compare."""
    messages = [dict(m) for m in (conversation or sample_conversation())]
    renderer = ChatRenderer(tokenizer, tools if tools is not None else SAMPLE_TOOLS, eos_token_ids)
    report = TemplateReport()
    try:
        _check_prefixes(renderer, messages, report)
    except Exception as err:  # e.g. a template that raises on a role it does not know
        report.problems.append(f"the template cannot render the conversation: {type(err).__name__}: {err}")
        return report
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    trajectory = Trajectory.start(renderer, messages[:first], max_response_tokens=1 << 30)
    i = first
    eos = min(renderer.eos_token_ids)
    while i < len(messages):
        content = messages[i]["content"]
        ids = renderer.encode(content) + [eos]
        trajectory.add_sampled(renderer, ids, [0.0] * len(ids))
        if trajectory.messages[-1]["content"] != content:
            report.problems.append(f"message {i} (assistant): its canonical tokens decode to "
                                   f"{trajectory.messages[-1]['content']!r}, not the content {content!r}")
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j > i + 1:
            trajectory.add_messages(renderer, messages[i + 1 : j])
        i = j
    if trajectory.template_fallbacks:
        report.notes.append(f"{trajectory.template_fallbacks} observation(s) were rendered after a fixed history "
                            "(the template is not prefix-preserving there)")
    full = renderer.text(messages, generation_prompt=False)
    separator = renderer.turn_end(messages) if messages[-1]["role"] == "assistant" else ""
    report.notes.append(f"after an assistant's end-of-turn token the template writes {separator!r}; the engine "
                        "stops before it, and the builder adds it in front of the next observation")
    if separator and full.endswith(separator):
        full = full[: -len(separator)]  # the conversation ends where the engine stopped
    report.builder_ids = trajectory.all_ids
    report.render_ids = renderer.encode(full)
    _compare_ids(renderer, report)
    if tools is None and SAMPLE_TOOLS[0]["function"]["description"] not in full:
        report.notes.append("the template ignores `tools=`: describe the tools in a system prompt "
                            "(ToolEnvironment(system_prompt=...)) or teach them by SFT")
    return report


def _check_prefixes(renderer: ChatRenderer, messages: list[dict], report: TemplateReport) -> None:
    """Every boundary the builder crosses must only append text: an assistant turn after the render
    with the generation prompt, and the messages between two assistant turns (added together, as one
    environment step's observations) after the render before them."""
    k = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    while k < len(messages):
        role = messages[k]["role"]
        end = k + 1
        while role != "assistant" and end < len(messages) and messages[end]["role"] != "assistant":
            end += 1
        after = renderer.text(messages[:end], generation_prompt=role != "assistant" and end < len(messages))
        before = renderer.text(messages[:k], generation_prompt=role == "assistant")
        if not after.startswith(before):
            at = _common_prefix(before, after)
            report.problems.append(
                f"messages {k}..{end - 1} ({', '.join(m['role'] for m in messages[k:end])}) are not appended: the "
                f"render of messages[:{k}]{' with the generation prompt' if role == 'assistant' else ''} changes "
                f"at character {at}: {_around(before, at)!r} becomes {_around(after, at)!r}"
            )
        k = end


def _compare_ids(renderer: ChatRenderer, report: TemplateReport) -> None:
    a, b = report.builder_ids, report.render_ids
    if a == b:
        return
    at = _common_prefix(a, b)
    report.first_difference = at
    report.problems.append(
        f"the builder's ids differ from one render's at token {at}: builder "
        f"{renderer.decode(a[max(0, at - 8): at + 8])!r} vs render {renderer.decode(b[max(0, at - 8): at + 8])!r} "
        f"({len(a)} vs {len(b)} tokens)"
    )


def _common_prefix(a: Sequence, b: Sequence) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _around(text: str, at: int, width: int = 30) -> str:
    return text[max(0, at - width): at + width]
