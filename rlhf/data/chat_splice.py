"""Chat prompts templated and tokenised by splicing: the same ids as rendering and tokenising each row, faster.

A million prompts rendered one by one through a Jinja chat template and tokenised whole spend
most of their time on text that is the same in every row (the template's headers, a default
system prompt). Here the template is rendered once per conversation *shape* (the sequence of
roles) around marker contents; each row's text is the rendered pieces with its contents spliced
in. With a Rust tokenizer the constant text is tokenised once too: the tokenizer cuts its input
at added tokens (`<|im_start|>`, `<|im_end|>`) before anything else and tokenises the text
between them independently, so only the stretches that hold a content are tokenised per row.

Both shortcuts are taken only where they are exact, and checked:
- the template must use each message's content only by writing it out, as it is (`{{ ... +
  message['content'] + ... }}`): never in a filter, a call, a `set`, a filter block or a test other
  than its type or its emptiness (`content_use`, on the template's syntax tree), so no content can
  change the rest (rows with an empty content go the per-row way where the template tests emptiness);
- a shape is spliced only if, for probe contents chosen to expose content-dependent templates
  and tokenizers (whitespace at the ends, empty strings, unicode, `<think>` tags, the
  tokenizer's own special tokens), and for the first real row of that shape in each call, the
  spliced text equals the template's own render and the spliced ids equal tokenising it whole;
- a row is tokenised in pieces only if no added token can straddle a content's edge (the content
  neither starts with a proper suffix nor ends with a proper prefix of one);
- messages with keys other than `role` and `content`, or non-string contents, go the per-row way.
Everything else falls back to the tokenizer's own `apply_chat_template` and encoding.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers import PreTrainedTokenizerBase

MARK_OPEN, MARK_CLOSE = "\U000f0000", "\U000f0001"  # Unicode private use: in no template and no special token
MARKS = (MARK_OPEN, MARK_CLOSE)

# contents that expose a template or tokenizer treating contents unevenly (the tokenizer's special
# tokens are added per tokenizer): trimming, emptiness tests, reasoning-tag splitting, escapes
PROBES = ("", " ", "\n", "  two spaces  ", "\ttab\n\n", "plain words. 12345", "Réponds — 答えて 🙂",
          "<think>hidden</think>shown", "</think>", "{{ raw }} {% if %}", "line one\nline two\n", "<", ">", "|")


TYPE_TESTS = {"string", "defined", "undefined", "none", "mapping", "iterable", "sequence"}  # same for every str
BLOCKS = (nodes.FilterBlock, nodes.AssignBlock, nodes.Macro, nodes.CallBlock)  # whose output may be transformed


def content_use(template: str) -> tuple[bool, bool]:
    """(transparent, tests_emptiness) for `template`. Transparent: it uses message contents only by writing
    them out unchanged (every `x.content` / `x['content']` in an output tag, joined by `+` or `~` at
    most, outside filter, set, macro and call blocks), or type-tests them (`is string`), or tests them for
    emptiness (`{% if message.content %}`, as Qwen2.5's does; then `tests_emptiness`). A transparent
    template renders the same text around any non-empty contents (around any contents without emptiness
    tests)."""
    try:
        tree = ImmutableSandboxedEnvironment().parse(template)
    except TemplateError:
        return False, False
    emptiness = False

    def is_content(node: nodes.Node) -> bool:
        return (isinstance(node, nodes.Getattr) and node.attr == "content") or (
            isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == "content")

    def is_truth_test(node: nodes.Node) -> bool:
        return is_content(node) or (isinstance(node, nodes.Not) and is_content(node.node))

    def ok(node: nodes.Node, written: bool, blocked: bool) -> bool:
        nonlocal emptiness
        if is_content(node):
            return written and not blocked
        if isinstance(node, nodes.Test) and node.name in TYPE_TESTS and is_content(node.node):
            return True
        if isinstance(node, nodes.Output):
            return all(ok(child, True, blocked) for child in node.nodes)
        if isinstance(node, (nodes.If, nodes.CondExpr)) and is_truth_test(node.test):
            emptiness = True
            return all(ok(child, False, blocked) for child in node.iter_child_nodes() if child is not node.test)
        keeps = isinstance(node, (nodes.Add, nodes.Concat)) and written
        blocked = blocked or isinstance(node, BLOCKS)
        return all(ok(child, keeps, blocked) for child in node.iter_child_nodes())

    transparent = ok(tree, False, False)
    return transparent, emptiness and transparent


def content_transparent(template: str) -> bool:
    """Whether `template` renders the same text around any non-empty contents (see `content_use`)."""
    return content_use(template)[0]


def marker(index: int) -> str:
    return f"{MARK_OPEN}{index}{MARK_CLOSE}"


def shape_of(messages: Sequence[Any]) -> tuple[str, ...] | None:
    """The roles of a conversation whose messages are exactly {role, content} with string values, else None."""
    roles = []
    for message in messages:
        if not isinstance(message, dict) or len(message) != 2:
            return None
        role, content = message.get("role"), message.get("content")
        if type(role) is not str or type(content) is not str:
            return None
        roles.append(role)
    return tuple(roles) if roles else None


@dataclass(frozen=True)
class Piece:
    """One stretch of a rendered prompt between added tokens: constant `ids`, or `parts` (constant strings
    interleaved with content indices) to be filled in and tokenised per row."""

    ids: tuple[int, ...] = ()
    parts: tuple[str | int, ...] = ()


@dataclass(frozen=True)
class Plan:
    """How to build one shape's prompts: `texts` are the n+1 rendered strings around its n contents;
    `pieces` the token plan (None: tokenise the spliced text whole)."""

    texts: tuple[str, ...]
    pieces: tuple[Piece, ...] | None


class ChatSplicer:
    """`ids(conversations)` == `[chat_prompt_ids(tokenizer, c) for c in conversations]` (rlhf.data.tokenize)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.backend = backend if backend is not None and backend.truncation is None and backend.padding is None \
            else None
        self.plans: dict[tuple[str, ...], Plan | None] = {}
        try:
            self.transparent, self.tests_emptiness = content_use(tokenizer.get_chat_template())
        except (ValueError, TypeError, AttributeError):  # no (single) template: the per-row path says why
            self.transparent, self.tests_emptiness = False, False
        self.checked: set[tuple[str, ...]] = set()  # shapes checked on a real row in this call
        self.added = self._added_tokens()
        edges = [(t[:j], t[j:]) for t in (self.added or ()) for j in range(1, len(t))]
        # a content ending with a token's head (or starting with its tail) might join the text beside it into it
        self.unsafe_end = alternatives(sorted({head for head, _ in edges}), r"\Z")
        self.unsafe_start = alternatives(sorted({tail for _, tail in edges}), "")
        self.longest = max((len(t) for t in self.added or ()), default=0)

    # ------------------------------------------------------------------ reference path
    def render(self, conversations: Sequence[Sequence[dict]]) -> list[str]:
        """The template's own render (one Jinja call per conversation)."""
        if not conversations:
            return []
        return self.tokenizer.apply_chat_template([list(c) for c in conversations], add_generation_prompt=True,
                                                  tokenize=False)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of whole texts, no special tokens added (the Rust tokenizer's batch call where there is one)."""
        if not texts:
            return []
        if self.backend is not None:  # without offsets: the same ids as tokenizer(texts), ~15% faster
            return [e.ids for e in self.backend.encode_batch_fast(list(texts), add_special_tokens=False)]
        return self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]

    # ------------------------------------------------------------------ fast path
    def ids(self, conversations: Sequence[Sequence[dict]]) -> list[list[int]]:
        self.checked = set()
        out: list[list[int] | None] = [None] * len(conversations)
        whole: list[int] = []  # rows tokenised whole: index -> text to be found in `texts`
        texts: dict[int, str] = {}
        pieced: list[tuple[int, Plan, list[str]]] = []
        unrendered: list[int] = []
        for i, messages in enumerate(conversations):
            shape = shape_of(messages)
            contents = [m["content"] for m in messages] if shape is not None else []
            spliceable = shape is not None and not (self.tests_emptiness and "" in contents)
            plan = self.plan(shape, messages) if spliceable else None
            if plan is None or any(MARK_OPEN in c or MARK_CLOSE in c for c in contents):
                unrendered.append(i)
            elif plan.pieces is not None and self.safe_edges(contents):
                pieced.append((i, plan, contents))
            else:
                texts[i] = splice(plan.texts, contents)
                whole.append(i)
        for i, text in zip(unrendered, self.render([conversations[i] for i in unrendered])):
            texts[i] = text
            whole.append(i)
        for i, ids in zip(whole, self.encode([texts[i] for i in whole])):
            out[i] = ids
        variable = [fill(piece.parts, contents) for _, plan, contents in pieced for piece in plan.pieces
                    if piece.parts]
        encoded = iter(self.encode(variable))
        for i, plan, _ in pieced:
            ids: list[int] = []
            for piece in plan.pieces:
                ids.extend(next(encoded) if piece.parts else piece.ids)
            out[i] = ids
        return out  # type: ignore[return-value]

    def safe_edges(self, contents: Sequence[str]) -> bool:
        """Whether no added token can straddle the edge of a content (then the pieces tokenise independently)."""
        if self.unsafe_end is None:
            return True
        end, start, longest = self.unsafe_end.search, self.unsafe_start.match, self.longest
        return not any(end(c, max(0, len(c) - longest)) or start(c) for c in contents)

    def plan(self, shape: tuple[str, ...], messages: Sequence[dict]) -> Plan | None:
        """The shape's plan, made and probed on first use; checked once per call on a real row."""
        if shape not in self.plans:
            self.plans[shape] = self._make_plan(shape)
        plan = self.plans[shape]
        if plan is not None and shape not in self.checked:
            self.checked.add(shape)
            if not self._agrees(plan, [[dict(m) for m in messages]]):
                plan = self.plans[shape] = None
        return plan

    def _make_plan(self, shape: tuple[str, ...]) -> Plan | None:
        if not self.transparent:
            return None
        try:
            rendered = self.render([[{"role": r, "content": marker(k)} for k, r in enumerate(shape)]])[0]
        except Exception:  # noqa: BLE001 - a template that refuses this shape refuses it per row too
            return None
        texts = split_at_markers(rendered, len(shape))
        if texts is None:
            return None
        plan = Plan(texts, None)
        if self.backend is not None and self.added is not None:
            pieces = self._pieces(rendered, len(shape))
            if pieces is not None and self._agrees(Plan(texts, pieces), self._probes(shape)):
                return Plan(texts, pieces)
        return plan if self._agrees(plan, self._probes(shape)) else None

    def _probes(self, shape: tuple[str, ...]) -> list[list[dict]]:
        specials = [t for t in (self.added or getattr(self.tokenizer, "all_special_tokens", []))][:8]
        contents = [c for c in (*PROBES, *specials, *(f"a{t}b" for t in specials)) if c or not self.tests_emptiness]
        return [[{"role": r, "content": contents[(j + k) % len(contents)]} for k, r in enumerate(shape)]
                for j in range(len(contents))]

    def _agrees(self, plan: Plan, conversations: list[list[dict]]) -> bool:
        """Whether `plan` gives the template's own text (and ids) for these conversations."""
        try:
            reference = self.render(conversations)
        except Exception:  # noqa: BLE001 - a template that rejects a probe: decide on the others
            reference = None
        if reference is None:
            return False
        contents = [[m["content"] for m in c] for c in conversations]
        if [splice(plan.texts, c) for c in contents] != reference:
            return False
        if plan.pieces is None:
            return True
        usable = [c for c in contents if self.safe_edges(c)]
        expected = self.encode([splice(plan.texts, c) for c in usable])
        for c, ids in zip(usable, expected):
            variable = self.encode([fill(p.parts, c) for p in plan.pieces if p.parts])
            got: list[int] = []
            for p in plan.pieces:
                got.extend(variable.pop(0) if p.parts else p.ids)
            if got != ids:
                return False
        return True

    def _added_tokens(self) -> list[str] | None:
        """The added tokens' texts, when every one is matched on the raw text with no stripping (then the
        tokenizer's first cut is at their exact occurrences); else None (no token splicing)."""
        if self.backend is None:
            return None
        tokens = list(self.backend.get_added_tokens_decoder().values())
        if any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in tokens):
            return None
        return sorted({t.content for t in tokens if t.content}, key=len, reverse=True)

    def _pieces(self, rendered: str, n: int) -> tuple[Piece, ...] | None:
        """The marker render cut at its added tokens (found by the tokenizer itself, with offsets)."""
        encoding = self.backend.encode(rendered, add_special_tokens=False)
        added_ids = set(self.backend.get_added_tokens_decoder())
        cuts = [(start, end, token) for token, (start, end) in zip(encoding.ids, encoding.offsets)
                if token in added_ids]
        pieces: list[Piece] = []
        position = 0
        for start, end, token in [*cuts, (len(rendered), len(rendered), None)]:
            if start < position:
                return None
            text = rendered[position:start]
            if text:
                parts = split_parts(text)
                if parts is None:
                    return None
                if any(isinstance(p, int) for p in parts):
                    pieces.append(Piece(parts=parts))
                else:
                    pieces.append(Piece(ids=tuple(self.encode([text])[0])))
            if token is not None:
                pieces.append(Piece(ids=(token,)))
            position = end
        found = sorted(p for piece in pieces for p in piece.parts if isinstance(p, int))
        if found != list(range(n)):
            return None
        merged: list[Piece] = []  # neighbouring constant pieces as one
        for piece in pieces:
            if merged and not piece.parts and not merged[-1].parts:
                merged[-1] = Piece(ids=merged[-1].ids + piece.ids)
            else:
                merged.append(piece)
        return tuple(merged)


def alternatives(texts: Sequence[str], suffix: str) -> re.Pattern | None:
    """One compiled pattern matching any of `texts` (then `suffix`), or None for none."""
    return re.compile("(?:" + "|".join(map(re.escape, texts)) + ")" + suffix) if texts else None


def split_at_markers(rendered: str, n: int) -> tuple[str, ...] | None:
    """The n+1 strings around markers 0..n-1 in order (each exactly once), else None."""
    texts, rest = [], rendered
    for k in range(n):
        head, found, rest = rest.partition(marker(k))
        if not found:
            return None
        texts.append(head)
    texts.append(rest)
    if any(MARK_OPEN in t or MARK_CLOSE in t for t in texts):
        return None
    return tuple(texts)


def split_parts(text: str) -> tuple[str | int, ...] | None:
    """`text` as constant strings and content indices (the markers in it)."""
    parts: list[str | int] = []
    while MARK_OPEN in text:
        head, _, rest = text.partition(MARK_OPEN)
        number, found, text = rest.partition(MARK_CLOSE)
        if not found or not number.isdigit():
            return None
        parts += [head, int(number)]
    parts.append(text)
    return tuple(parts)


def splice(texts: Sequence[str], contents: Sequence[str]) -> str:
    out = [texts[0]]
    for content, text in zip(contents, texts[1:]):
        out += [content, text]
    return "".join(out)


def fill(parts: Sequence[str | int], contents: Sequence[str]) -> str:
    return "".join(contents[p] if isinstance(p, int) else p for p in parts)
