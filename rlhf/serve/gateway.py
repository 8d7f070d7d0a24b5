"""Gateway mode of `rlhf serve`: token-exact trajectories of unmodified OpenAI-client agents, per session.

An agent written against the `openai` client changes only its base URL, to
`http://HOST:PORT/sessions/<session id>/v1`. Every chat completion in that session is then built
and recorded by the trajectory builder of the agent loop (rlhf.agents.trajectory): when a request's
messages extend the session's conversation (the messages it has seen, then the assistant turn the
server generated, then anything new: tool results, user turns), the prompt is the session's own
token ids plus what the chat template adds for the new messages, so the sampled ids are never
re-tokenised; otherwise a new trajectory starts. `GET /sessions/<id>` returns the trajectories
(prompt ids, response ids, loss mask, the engine's log-probs, messages), `POST /sessions/<id>/reward`
attaches a reward, and `Trajectory.from_dict` + `trajectory_batch` make a training batch of them.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from rlhf.agents.trajectory import ChatRenderer, Trajectory


class Session:
    """One session's trajectories (the last is the one being continued) and the lock its requests take."""

    def __init__(self):
        self.trajectories: list[Trajectory] = []
        self.renderers: list[ChatRenderer] = []
        self.temperatures: list[list[float]] = []  # per trajectory, the logit temperature of each turn
        self.lock = asyncio.Lock()

    def to_dict(self) -> dict[str, Any]:
        return {"trajectories": [{**t.to_dict(), "temperatures": temps}
                                 for t, temps in zip(self.trajectories, self.temperatures)]}


class SessionStore:
    """Sessions by id (the oldest dropped past `max_sessions`), built with the served model's tokenizer."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_ids: Sequence[int],
        max_sessions: int = 10_000,  # sessions kept; the least recently used beyond it are dropped
        max_response_tokens: int = 1 << 20,  # tokens after a trajectory's prompt (the context length bounds it anyway)
    ):
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.max_sessions = max_sessions
        self.max_response_tokens = max_response_tokens
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()

    def get(self, session_id: str, create: bool = True) -> Session | None:
        session = self._sessions.get(session_id)
        if session is None and create:
            session = self._sessions[session_id] = Session()
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        if session is not None:
            self._sessions.move_to_end(session_id)
        return session

    def drop(self, session_id: str) -> bool:
        return self._sessions.pop(session_id, None) is not None

    def prompt_ids(
        self, session: Session, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None
    ) -> list[int]:
        """The ids to generate from: the session's trajectory continued by the new messages, or a new one
        (also when the request offers other `tools` than the trajectory's: they are part of its prompt)."""
        messages = [dict(m) for m in messages]
        tools = [dict(t) for t in tools] if tools else None
        if (session.trajectories and session.renderers[-1].tools == tools
                and _continues(session.trajectories[-1].messages, messages)):
            t, renderer = session.trajectories[-1], session.renderers[-1]
            t.add_messages(renderer, messages[len(t.messages):])
            return t.all_ids
        renderer = ChatRenderer(self.tokenizer, tools=tools, eos_token_ids=self.eos_token_ids)
        session.trajectories.append(Trajectory.start(renderer, messages, self.max_response_tokens))
        session.renderers.append(renderer)
        session.temperatures.append([])
        return session.trajectories[-1].all_ids

    def record(self, session: Session, token_ids: Sequence[int], log_probs: Sequence[float], temperature: float) -> None:
        """Append the completion the server sent back (its ids and the engine's log-probs) to the trajectory."""
        session.trajectories[-1].add_sampled(session.renderers[-1], token_ids, log_probs)
        session.temperatures[-1].append(temperature)


def _continues(known: list[dict], messages: list[dict]) -> bool:
    """Whether `messages` is the conversation `known` (which ends with a turn the server generated) plus more.

    Assistant turns the server generated are matched by role only: the client sends back its own
    rendering of them (text, or structured tool calls) while the session keeps the sampled ids.
    """
    if not known or known[-1].get("role") != "assistant" or len(messages) <= len(known):
        return False
    for ours, theirs in zip(known, messages):
        if ours.get("role") != theirs.get("role"):
            return False
        if ours.get("role") != "assistant" and ours.get("content") != theirs.get("content"):
            return False
    return True
