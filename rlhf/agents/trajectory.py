"""Token-in/token-out trajectories: a conversation as the exact token ids the policy saw and sampled.

A trajectory starts from the chat-template render of its first messages (with the generation
prompt) and then only ever appends:

- **sampled tokens**, verbatim as the engine returned them (never decoded and re-encoded),
  `loss_mask` 1, each with the engine's log-prob;
- **observations** (tool results, environment messages), `loss_mask` 0, log-prob 0: the text the
  chat template adds for the new messages, i.e. render(history + new, generation prompt) minus
  render(history). Before it comes whatever the template writes after an assistant turn's
  end-of-turn token that the engine did not sample: the engine stops AT `<|im_end|>`, ChatML
  then has a newline. Dropping it (verl#3720) or the separator before a tool turn (verl#6921)
  trains the policy on contexts it never sees at inference.

Re-rendering the whole history instead would re-tokenise sampled text (other ids than sampled:
the log-probs no longer belong to the tokens) and let a template rewrite earlier turns; verl's
docs report PPO failing to converge that way even in single-turn.

Where a template is not prefix-preserving (the render of the history is not a prefix of the
render with the new messages; `rlhf models check-template` says where), the observation is
rendered after a fixed two-message conversation instead, and `template_fallbacks` counts it.

Truncation: the response (everything after the prompt) never exceeds `max_response_tokens`;
whatever would pass it is cut, and the trajectory ends there (`finish_reason` "max_tokens").

A turn may be sampled in chunks (`AgentRollout(turn_chunk_tokens=...)`, so a weight update can land inside a long
turn): a chunk that stops at the chunk's budget leaves the turn `turn_paused`, and `continue_sampled` appends the
next chunk to the same turn, recording where it starts and the policy version that sampled it (`continuations`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

Message = dict[str, Any]


class TemplateError(ValueError):
    """The chat template cannot render an observation after the history (see `rlhf models check-template`)."""


class ChatRenderer:
    """One tokenizer's chat template, with the conversation's tool schemas, and its tokenisation of text."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        tools: Sequence[Mapping] | None = None,  # JSON schemas (Tool.schema) passed to the template as `tools=`
        eos_token_ids: Sequence[int] | None = None,  # where the engine stops; None: the tokenizer's EOS
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"{type(tokenizer).__name__} has no chat template; multi-turn rollouts render every "
                             "observation with it. Set tokenizer.chat_template.")
        self.tokenizer = tokenizer
        self.tools = [dict(t) for t in tools] if tools else None
        ids = list(eos_token_ids) if eos_token_ids is not None else [tokenizer.eos_token_id]
        self.eos_token_ids = frozenset(i for i in ids if i is not None)
        self.eos_texts = {tokenizer.decode([i], skip_special_tokens=False) for i in self.eos_token_ids}

    def text(self, messages: Sequence[Mapping], generation_prompt: bool) -> str:
        kwargs = {"tools": self.tools} if self.tools else {}
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=generation_prompt, tokenize=False, **kwargs
        )

    def ignores_tools(self, messages: Sequence[Mapping]) -> bool:
        """Whether the template renders `messages` the same with this renderer's tools as without them (many
        small models' templates never write `tools`: the model would not know they exist)."""
        if not self.tools:
            return False
        plain = ChatRenderer(self.tokenizer, eos_token_ids=list(self.eos_token_ids))
        return self.text(messages, generation_prompt=True) == plain.text(messages, generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def turn_end(self, history: Sequence[Mapping], stopped: bool = True) -> str:
        """What the template writes after the last (assistant) message that the engine did not sample.

        `stopped`: the turn ended on an end-of-turn token, and this is the text after it ("\n" for
        ChatML). Otherwise (cut by a stop string or max_tokens: the gateway continues such turns) it is
        everything the template writes after the message's content ("<|im_end|>\n"). Found in
        render(history) after render(history[:-1], generation prompt); "" where it cannot be told.
        """
        head = self.text(history[:-1], generation_prompt=True)
        full = self.text(history, generation_prompt=False)
        turn = full[len(head):] if full.startswith(head) else full
        if not stopped:
            content = history[-1].get("content") or ""
            return turn[len(content):] if turn.startswith(content) else ""
        ends = [turn.rfind(t) + len(t) for t in self.eos_texts if t and t in turn]
        return turn[max(ends):] if ends else ""

    def observation_text(self, history: Sequence[Mapping], new: Sequence[Mapping]) -> tuple[str, bool]:
        """(the text `new` messages add after `history`, ready for the next assistant turn; whether the
        fixed-history fallback was needed because the template is not prefix-preserving here)."""
        before = self.text(history, generation_prompt=False)
        after = self.text([*history, *new], generation_prompt=True)
        if after.startswith(before):
            return after[len(before):], False
        base = [m for m in history[:1] if m.get("role") == "system"] + [
            {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
        before = self.text(base, generation_prompt=False)
        after = self.text([*base, *new], generation_prompt=True)
        if not after.startswith(before):
            roles = [m.get("role") for m in new]
            raise TemplateError(
                f"the chat template does not render {roles} messages by appending to the conversation before "
                "them, even after a plain two-message history; `rlhf models check-template MODEL` shows where "
                "it rewrites earlier text."
            )
        return after[len(before):], True


@dataclasses.dataclass
class Trajectory:
    """One conversation's tokens: `prompt_ids`, then `response_ids` with `loss_mask` and `log_probs` aligned."""

    prompt_ids: list[int]
    messages: list[Message]
    max_response_tokens: int
    response_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)  # 1: sampled by the policy; 0: observation
    log_probs: list[float] = dataclasses.field(default_factory=list)  # the engine's, on sampled tokens; 0 elsewhere
    turns: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # [start, end) of each assistant turn
    finish_reason: str | None = None  # None while it runs; then done / max_turns / max_tokens / length / error
    rewards: list[float] = dataclasses.field(default_factory=list)  # what the environment gave, step by step
    template_fallbacks: int = 0
    turn_stopped: bool = True  # the last assistant turn ended on an end-of-turn token
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # counters (tool calls, errors by kind)
    temperatures: list[float] = dataclasses.field(default_factory=list)  # each turn's log-prob temperature, if known
    # the policy version that sampled each assistant turn (asynchronous rollout; a turn is one generate call, so
    # one version): with partial rollouts a conversation's turns may come from several versions; empty: unknown
    turn_versions: list[int] = dataclasses.field(default_factory=list)
    prompt_ends_turn: bool = False  # the prompt ends with a sampled assistant turn (a gateway fork): the next
    #                                 observation starts with what the template writes after that turn
    turn_paused: bool = False  # the last turn stopped at a chunk boundary: its next chunk continues it
    # each chunk that continued a paused turn: (its first position in response_ids, the policy version that sampled
    # it, -1 when unknown); the turn's first chunk has its version in turn_versions
    continuations: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    @classmethod
    def start(cls, renderer: ChatRenderer, messages: Sequence[Mapping], max_response_tokens: int) -> Trajectory:
        """The prompt: `messages` rendered with the generation prompt."""
        messages = [dict(m) for m in messages]
        return cls(renderer.encode(renderer.text(messages, generation_prompt=True)), messages, max_response_tokens)

    @property
    def room(self) -> int:
        """Response tokens left in the budget."""
        return self.max_response_tokens - len(self.response_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def reward(self) -> float | None:
        """The sum of the environment's rewards, or None when it gave none (the reward manager scores)."""
        return sum(self.rewards) if self.rewards else None

    @property
    def final_text(self) -> str:
        """The last assistant message: what an answer scorer reads."""
        return next((m["content"] for m in reversed(self.messages) if m.get("role") == "assistant"), "")

    def finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def add_sampled(self, renderer: ChatRenderer, ids: Sequence[int], log_probs: Sequence[float],
                    temperature: float | None = None, version: int | None = None) -> str:
        """Append one assistant turn's engine tokens verbatim (cut to the budget); returns its text.

        The turn's message in the history is its decoded text without the end-of-turn token. A
        turn cut by the token budget ends the trajectory ("max_tokens"); whether a turn that did not
        end on an end-of-turn token ends it is the caller's choice (the agent loop: "length").
        `temperature`: the one its log-probs were computed at (`SamplingParams.logit_temperature`),
        recorded per turn for `trajectory_batch`; `version`: the policy version of the weights that sampled it.
        """
        start = len(self.response_ids)
        ids = self._append_sampled("add_sampled", ids, log_probs)
        stopped = bool(ids) and ids[-1] in renderer.eos_token_ids
        self.turns.append((start, len(self.response_ids)))
        self.turn_stopped = stopped
        if temperature is not None:
            self.temperatures.append(float(temperature))
        if version is not None:
            self.turn_versions.append(int(version))
        text = renderer.decode(ids[:-1] if stopped else ids)
        self.messages.append({"role": "assistant", "content": text})
        return text

    def continue_sampled(self, renderer: ChatRenderer, ids: Sequence[int], log_probs: Sequence[float],
                         version: int | None = None) -> str:
        """Append the next chunk of the paused last turn (same turn, same temperature; cut to the budget as
        `add_sampled`); the turn's message becomes the decoded text of all its chunks. Returns that text."""
        if not self.turn_paused or not self.turns:
            raise ValueError("continue_sampled: the last turn is not paused (add_sampled starts a turn)")
        start, position = self.turns[-1][0], len(self.response_ids)
        self._append_sampled("continue_sampled", ids, log_probs)
        self.continuations.append((position, -1 if version is None else int(version)))
        self.turns[-1] = (start, len(self.response_ids))
        self.turn_paused = False
        whole = self.response_ids[start:]
        self.turn_stopped = bool(whole) and whole[-1] in renderer.eos_token_ids
        text = renderer.decode(whole[:-1] if self.turn_stopped else whole)
        self.messages[-1] = {**self.messages[-1], "content": text}
        return text

    def _append_sampled(self, caller: str, ids: Sequence[int], log_probs: Sequence[float]) -> list[int]:
        """Append sampled ids (mask 1) with their log-probs, cut to the budget (the cut ends the trajectory:
        "max_tokens"); returns the ids appended."""
        if len(ids) != len(log_probs):
            raise ValueError(f"{caller}: {len(ids)} tokens but {len(log_probs)} log-probs")
        ids, log_probs = list(ids), [float(x) for x in log_probs]
        if len(ids) > self.room:
            ids, log_probs = ids[: self.room], log_probs[: self.room]
            self.finish("max_tokens")
        self.response_ids += ids
        self.loss_mask += [1] * len(ids)
        self.log_probs += log_probs
        return ids

    @property
    def versions(self) -> list[int]:
        """Every known policy version among its sampled tokens (turns' first chunks and continuations)."""
        return list(self.turn_versions) + [v for _, v in self.continuations if v >= 0]

    def add_turn_text(self, renderer: ChatRenderer, text: str) -> None:
        """Append `text` to the last assistant turn as context (mask 0): text the client received that the
        engine did not sample as such (the gateway: the part of a token cut by a stop string)."""
        ids = renderer.encode(text)[: max(self.room, 0)]
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.messages[-1] = {**self.messages[-1], "content": self.messages[-1].get("content", "") + text}

    def add_messages(self, renderer: ChatRenderer, new: Sequence[Mapping]) -> None:
        """Append observation messages: the template's separator after the last turn and their render (mask 0)."""
        new = [dict(m) for m in new]
        separator = ""
        if self.messages and self.messages[-1].get("role") == "assistant" and (self.turns or self.prompt_ends_turn):
            separator = renderer.turn_end(self.messages, stopped=self.turn_stopped)
        delta, fell_back = renderer.observation_text(self.messages, new)
        self.template_fallbacks += fell_back
        ids = renderer.encode(separator + delta)
        if len(ids) > self.room:
            ids = ids[: self.room]
            self.finish("max_tokens")
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.messages += new

    def count(self, key: str, by: int = 1) -> None:
        self.info[key] = self.info.get(key, 0) + by

    # ------------------------------------------------------------- as data
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the gateway's session records): ids, mask, log-probs, messages, turns, how it ended."""
        return {
            "prompt_ids": self.prompt_ids, "response_ids": self.response_ids, "loss_mask": self.loss_mask,
            "log_probs": self.log_probs, "messages": self.messages, "turns": [list(t) for t in self.turns],
            "finish_reason": self.finish_reason, "rewards": self.rewards, "info": self.info,
            "max_response_tokens": self.max_response_tokens, "temperatures": self.temperatures,
            "turn_versions": self.turn_versions, "continuations": [list(c) for c in self.continuations],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trajectory:
        """The inverse of `to_dict`; lengths and values are checked (a record whose mask or log-probs do not
        line up with its ids would train the wrong tokens; a null or non-finite reward has no meaning)."""
        n = len(data["response_ids"])
        if len(data["loss_mask"]) != n or len(data["log_probs"]) != n:
            raise ValueError(f"trajectory record: {n} response ids but {len(data['loss_mask'])} mask values and "
                             f"{len(data['log_probs'])} log-probs")
        return cls(
            prompt_ids=_ids(data, "prompt_ids"), messages=[dict(m) for m in data["messages"]],
            max_response_tokens=int(data.get("max_response_tokens", n)), response_ids=_ids(data, "response_ids"),
            loss_mask=[int(m) for m in _numbers(data, "loss_mask")], log_probs=_numbers(data, "log_probs"),
            turns=[tuple(t) for t in data.get("turns", [])], finish_reason=data.get("finish_reason"),
            rewards=_numbers(data, "rewards"), info=dict(data.get("info", {})),
            temperatures=_numbers(data, "temperatures"), turn_versions=[int(v) for v in _numbers(data, "turn_versions")],
            continuations=[(int(p), int(v)) for p, v in data.get("continuations", [])],
        )


def _numbers(data: Mapping[str, Any], key: str) -> list[float]:
    """`data[key]` (absent: empty) as finite floats, or a ValueError naming the field and the first bad value."""
    out = []
    for i, value in enumerate(data.get(key) or []):
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if number is None or not math.isfinite(number):
            raise ValueError(f"trajectory record: {key}[{i}] is {value!r}, not a finite number (JSON has no NaN or "
                             "Infinity: a record holding null there was written from one; drop that value or the "
                             "record)")
        out.append(float(number))
    return out


def _ids(data: Mapping[str, Any], key: str) -> list[int]:
    ids = list(data[key])
    bad = next((i for i, v in enumerate(ids) if not isinstance(v, int) or isinstance(v, bool) or v < 0), None)
    if bad is not None:
        raise ValueError(f"trajectory record: {key}[{bad}] is {ids[bad]!r}, not a token id")
    return ids
