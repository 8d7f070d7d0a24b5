"""Gateway mode of `rlhf serve`: token-exact trajectories of unmodified OpenAI-client agents, per session.

An agent written against the `openai` client changes only its base URL, to
`http://HOST:PORT/sessions/<session id>/v1`. Every chat completion in that session is built and
recorded by the trajectory builder of the agent loop (rlhf.agents.trajectory), in two steps:
`plan` works out the prompt without touching the session, and `commit` records the turn once it
was generated, so a request that is refused (a 400, a full queue, an engine failure) leaves the
session exactly as it was. `GET /sessions/<id>` returns the trajectories (prompt ids, response
ids, loss mask, the engine's log-probs and their temperature per turn, messages),
`POST /sessions/<id>/reward` attaches a reward, and `Trajectory.from_dict` + `trajectory_batch`
make a training batch of them. Sessions live in the server's memory only: a restart loses them
(the server logs how many at shutdown).

How a request's messages are matched with what the session recorded (the agent's messages win):

- **continuation**: the messages are a recorded conversation (each reply the server sampled
  compared with what the client was sent: text, and tool calls by name and arguments; every other
  message exactly) plus new messages. The prompt is that trajectory's own ids plus what the chat
  template adds for the new messages: sampled ids are never re-tokenised.
- **retry**: the messages are exactly those a recorded turn answered. For the trajectory's last
  turn this means the client never received that reply (a timeout, a lost connection, a retry of
  the `openai` client), so the turn is generated again in its place and the reply nobody received
  is never trained (`info["retried_turns"]` counts it). For an earlier turn the agent is sampling
  again from there: a new trajectory starts from that turn's prompt ids (`info["forked"]`).
- **divergence**: the messages leave a recorded conversation (the agent edited a reply or an
  observation, or rewound). A new trajectory keeps the recorded ids up to the end of the last
  reply that still matches and renders the agent's messages from there (`info["diverged"]`), so
  only what the agent changed is tokenised anew; the recorded trajectory stays as it was.
- anything else starts a new trajectory from the agent's messages.

A reply cut by a stop string is recorded as the text the client received: the sampled tokens
inside it (trained), then the rest of the text tokenised (context), never the stop string.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from rlhf.agents.trajectory import ChatRenderer, Trajectory
from rlhf.serve.completion import token_pieces
from rlhf.serve.protocol import ApiError

_UNBOUNDED = 1 << 62  # a planned trajectory's budget: the request's own checks bound it, not truncation


@dataclasses.dataclass(frozen=True)
class TurnRecord:
    """Where one generated turn sits in its trajectory (offsets over prompt + response ids)."""

    request: int  # messages in the request it answered: its reply is message number `request`
    start: int  # offset of its first sampled token: the ids before it were that request's prompt
    end: int  # offset after its reply (the sampled ids, then any received text tokenised)
    stopped: bool  # it ended on an end-of-turn token
    reply: tuple | None  # what the client was sent (`reply_key`); None: unknown (compared by the recorded text)


@dataclasses.dataclass(eq=False)
class Recording:
    """One trajectory of a session, with its renderer and its turns (those its prompt holds included)."""

    trajectory: Trajectory
    renderer: ChatRenderer
    turns: list[TurnRecord] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class PlannedTurn:
    """What `SessionStore.plan` decided: the prompt to generate from, and the trajectory it extends."""

    recording: Recording  # a new object: the session holds it only once `commit` has recorded the reply
    replaces: Recording | None  # the session's recording it takes the place of (continued, or retried)
    kind: str  # "continue", "retry", "fork", "diverge" or "new"
    room: int = _UNBOUNDED  # tokens the reply may have within the store's max_response_tokens

    @property
    def prompt_ids(self) -> list[int]:
        return self.recording.trajectory.all_ids


class Session:
    """One session's recordings (the most recently answered last) and the lock its requests take."""

    def __init__(self):
        self.recordings: list[Recording] = []
        self.lock = asyncio.Lock()
        self.pending = 0  # requests holding or waiting for the lock
        self.staged: PlannedTurn | None = None  # `SessionStore.prompt_ids`'s plan, until `record`

    @property
    def trajectories(self) -> list[Trajectory]:
        return [r.trajectory for r in self.recordings]

    @property
    def renderers(self) -> list[ChatRenderer]:
        return [r.renderer for r in self.recordings]

    @property
    def temperatures(self) -> list[list[float]]:
        """Per trajectory, the logit temperature of each turn."""
        return [r.trajectory.temperatures for r in self.recordings]

    def to_dict(self) -> dict[str, Any]:
        return {"trajectories": [t.to_dict() for t in self.trajectories]}


class SessionStore:
    """Sessions by id (the oldest dropped past `max_sessions`), built with the served model's tokenizer."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_ids: Sequence[int],
        max_sessions: int = 10_000,  # sessions kept; the least recently used beyond it are dropped
        max_response_tokens: int = 1 << 20,  # tokens after a trajectory's prompt (the context length bounds it anyway)
        max_model_len: int | None = None,  # the engine's context (build_app sets it): each trajectory's bound
    ):
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.max_sessions = max_sessions
        self.max_response_tokens = max_response_tokens
        self.max_model_len = max_model_len
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

    @contextlib.asynccontextmanager
    async def open(self, session_id: str) -> AsyncIterator[Session]:
        """The session, held for one request (its turns run one at a time). A session that still has no
        trajectory when its last request ends (every one was refused) is not kept."""
        session = self.get(session_id)
        session.pending += 1
        try:
            async with session.lock:
                yield session
        finally:
            session.pending -= 1
            if not session.pending and not session.recordings and self._sessions.get(session_id) is session:
                del self._sessions[session_id]

    def held(self) -> tuple[int, int]:
        """(sessions, trajectories) held in memory."""
        return len(self._sessions), sum(len(s.recordings) for s in self._sessions.values())

    # --------------------------------------------------------- plan, commit
    def plan(self, session: Session, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None
             ) -> PlannedTurn:
        """The prompt of a request with these messages, and how it relates to the session (module docstring).
        Nothing in the session changes; a template that cannot render the messages raises."""
        messages = [dict(m) for m in messages]
        tools = [dict(t) for t in tools] if tools else None
        best, matched = None, 0
        for recording in reversed(session.recordings):  # the most recently answered first
            if recording.renderer.tools == tools:
                n = _matched(recording, messages)
                if n > matched:
                    best, matched = recording, n
        planned = _follow(best, messages, matched) if best is not None else None
        if planned is None:
            renderer = ChatRenderer(self.tokenizer, tools=tools, eos_token_ids=self.eos_token_ids)
            planned = PlannedTurn(Recording(Trajectory.start(renderer, messages, _UNBOUNDED), renderer), None, "new")
            if best is not None and best.turns and matched == best.turns[0].request:  # the first reply was edited
                planned.recording.trajectory.count("diverged")
        response = len(planned.recording.trajectory.response_ids)
        if response >= self.max_response_tokens:
            raise ApiError(400, f"This session's conversation has {response} tokens after its prompt, the "
                           f"server's limit (max_response_tokens={self.max_response_tokens}) or more; start a new "
                           "session.", param="messages", code="context_length_exceeded")
        planned.room = self.max_response_tokens - response
        return planned

    def commit(
        self,
        session: Session,
        planned: PlannedTurn,
        token_ids: Sequence[int],
        log_probs: Sequence[float],
        temperature: float,  # the log-probs' (SamplingParams.logit_temperature: 1 for greedy)
        text: str | None = None,  # the reply's text as the client received it (None: the decoded tokens)
        reply: Mapping | None = None,  # the assistant message the client was sent (content, tool_calls)
    ) -> Trajectory:
        """Record the generated reply of a planned turn; the recording becomes the session's latest."""
        recording = planned.recording
        t, renderer = recording.trajectory, recording.renderer
        bound = self.max_response_tokens if self.max_model_len is None else min(
            self.max_response_tokens, self.max_model_len - len(t.prompt_ids))
        t.max_response_tokens = max(bound, len(t.response_ids))
        request, start = len(t.messages), len(t.all_ids)
        ids, lps, rest = _received(self.tokenizer, list(token_ids), list(log_probs), text)
        t.add_sampled(renderer, ids, lps, temperature=temperature)
        if rest:
            t.add_turn_text(renderer, rest)
        if text is not None:
            t.messages[-1] = {**t.messages[-1], "content": text}
        stopped = not rest and t.turn_stopped
        recording.turns.append(TurnRecord(request, start, len(t.all_ids), stopped,
                                          reply_key(reply) if reply is not None else None))
        if planned.replaces is not None and planned.replaces in session.recordings:
            session.recordings.remove(planned.replaces)
        session.recordings.append(recording)
        return t

    # ------------------------------------------------ the one-step form
    def prompt_ids(
        self, session: Session, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None
    ) -> list[int]:
        """`plan`, kept for `record`: the ids to generate from (the session changes only at `record`)."""
        session.staged = self.plan(session, messages, tools)
        return session.staged.prompt_ids

    def record(self, session: Session, token_ids: Sequence[int], log_probs: Sequence[float], temperature: float) -> None:
        """`commit` the turn `prompt_ids` planned, with the completion the server sent back."""
        if session.staged is None:
            raise RuntimeError("SessionStore.record: no turn was planned (call prompt_ids first)")
        planned, session.staged = session.staged, None
        self.commit(session, planned, token_ids, log_probs, temperature)


def reply_key(message: Mapping) -> tuple:
    """An assistant message as compared with what the client was sent: its text, and its tool calls by name and
    arguments (ids differ per client; arguments may come as a JSON string or an object)."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                pass
        calls.append((function.get("name"), json.dumps(arguments, sort_keys=True)))
    return message.get("content") or "", tuple(calls)


def _matched(recording: Recording, messages: list[dict]) -> int:
    """How many leading `messages` are the recorded conversation's."""
    replies = {turn.request: turn.reply for turn in recording.turns}
    count = 0
    for k, (ours, theirs) in enumerate(zip(recording.trajectory.messages, messages)):
        if k in replies:  # a reply the server generated: the client sends back its own rendering of it
            sent = replies[k] if replies[k] is not None else reply_key(ours)
            same = theirs.get("role") == "assistant" and reply_key(theirs) == sent
        else:
            same = ours == theirs
        if not same:
            break
        count += 1
    return count


def _follow(recording: Recording, messages: list[dict], matched: int) -> PlannedTurn | None:
    """The turn that continues, retries or forks `recording` for these messages (None: none does)."""
    t, renderer, turns = recording.trajectory, recording.renderer, recording.turns
    known = len(t.messages)
    if matched == known and len(messages) > known and turns and turns[-1].request == known - 1:
        planned = PlannedTurn(_copy(recording, turns), recording, "continue")
        planned.recording.trajectory.add_messages(renderer, messages[known:])
        return planned
    for j in range(len(turns) - 1, -1, -1):
        if turns[j].request == len(messages) and matched >= len(messages):
            if j == len(turns) - 1 and turns[j].start >= len(t.prompt_ids):  # its own last turn: replaced
                planned = PlannedTurn(_cut(recording, j), recording, "retry")
                planned.recording.trajectory.count("retried_turns")
                return planned
            fork = _fork(recording, turns[j].start, t.messages[: len(messages)], turns[:j], ends_turn=False)
            fork.trajectory.count("forked")
            return PlannedTurn(fork, None, "fork")
    cut = next((turn for turn in reversed(turns) if turn.request < matched), None)
    if cut is None or len(messages) <= cut.request + 1:
        return None
    at = turns.index(cut) + 1
    fork = _fork(recording, cut.end, t.messages[: cut.request + 1], turns[:at], ends_turn=True, stopped=cut.stopped)
    fork.trajectory.add_messages(renderer, messages[cut.request + 1:])
    fork.trajectory.count("diverged")
    return PlannedTurn(fork, None, "diverge")


def _copy(recording: Recording, turns: list[TurnRecord]) -> Recording:
    t = copy.deepcopy(recording.trajectory)
    t.max_response_tokens = _UNBOUNDED
    return Recording(t, recording.renderer, list(turns))


def _cut(recording: Recording, j: int) -> Recording:
    """The recording as it was before its turn `j` (its own, the last) was generated."""
    t, turn = recording.trajectory, recording.turns[j]
    keep = turn.start - len(t.prompt_ids)  # response ids before the turn
    spans = [span for span in t.turns if span[1] <= keep]
    previous = recording.turns[j - 1] if j else None
    cut = dataclasses.replace(
        copy.deepcopy(t), response_ids=t.response_ids[:keep], loss_mask=t.loss_mask[:keep],
        log_probs=t.log_probs[:keep], messages=copy.deepcopy(t.messages[: turn.request]), turns=spans,
        temperatures=t.temperatures[: len(spans)], finish_reason=None, max_response_tokens=_UNBOUNDED,
        turn_stopped=previous.stopped if previous is not None else True,
    )
    return Recording(cut, recording.renderer, recording.turns[:j])


def _fork(recording: Recording, upto: int, messages: list[dict], turns: list[TurnRecord], ends_turn: bool,
          stopped: bool = True) -> Recording:
    """A new recording whose prompt is `recording`'s ids up to offset `upto` (the conversation `messages`)."""
    t = Trajectory(list(recording.trajectory.all_ids[:upto]), copy.deepcopy(messages), _UNBOUNDED,
                   turn_stopped=stopped, prompt_ends_turn=ends_turn)
    return Recording(t, recording.renderer, list(turns))


def _received(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], log_probs: list[float], text: str | None
) -> tuple[list[int], list[float], str]:
    """(the sampled ids inside the received text, their log-probs, the text's remainder to tokenise).

    All of them when the text is the tokens' own; after a stop string (which the client does not
    receive) only the tokens whose text lies wholly before it, and the start of the token the stop
    string began in comes back as text.
    """
    if text is None:
        return ids, log_probs, ""
    pieces = token_pieces(tokenizer, ids)
    if "".join(pieces) == text:
        return ids, log_probs, ""
    kept, covered = 0, 0
    while kept < len(ids) and covered + len(pieces[kept]) <= len(text):
        covered += len(pieces[kept])
        kept += 1
    while kept and not pieces[kept - 1]:  # a token adding no text here (half a character) goes with the rest
        kept -= 1
    return ids[:kept], log_probs[:kept], text[covered:]
