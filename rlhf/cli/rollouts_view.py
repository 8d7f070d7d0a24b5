"""`rlhf rollouts view STAGE_DIR`: browse recorded rollouts in the terminal.

Steps (left/right), prompt groups (up/down), each group's responses ranked best to worst with
score, advantage and length, the full text of the chosen response, and a search over prompts
and responses (`/`). Multi-turn records carry `segments` (text spans marked `trained` or not):
tokens the policy sampled are shown plainly, tool output and template tokens (loss mask 0) dim
on a dark background, so what the loss saw is visible at a glance.

`RolloutBrowser` holds the state (pure Python, tested without a terminal); `RolloutViewer` is the
Textual app around it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Header, Input, Static

from rlhf.trainers.records import read_records

UNTRAINED_STYLE = "dim italic on grey15"  # tokens outside the loss mask (tool output, template)


class RolloutBrowser:
    """Recorded rows grouped by step and prompt group, with a cursor, a search and a ranking."""

    def __init__(self, rows: Sequence[dict]):
        if not rows:
            raise ValueError("no rollout records to show")
        self._by_step: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
        for row in rows:
            self._by_step[int(row["step"])][str(row["uid"])].append(row)
        self.steps = sorted(self._by_step)
        self.step = self.steps[-1]  # the newest step first: what the policy does now
        self.query = ""

    def move_step(self, delta: int) -> None:
        i = self.steps.index(self.step)
        self.step = self.steps[max(0, min(len(self.steps) - 1, i + delta))]

    def groups(self) -> list[tuple[str, list[dict]]]:
        """This step's groups matching the search, each ranked best to worst (ties keep record order)."""
        q = self.query.lower()
        out = []
        for uid, group in sorted(self._by_step[self.step].items()):
            if q and not any(q in r["prompt"].lower() or q in _response_text(r).lower() for r in group):
                continue
            out.append((uid, sorted(group, key=lambda r: -float(r["score"]))))
        return out

    def summary(self) -> str:
        groups = self.groups()
        rows = [r for _, g in groups for r in g]
        mean = sum(float(r["score"]) for r in rows) / len(rows) if rows else float("nan")
        search = f"  search {self.query!r}" if self.query else ""
        return (f"step {self.step} ({self.steps.index(self.step) + 1}/{len(self.steps)})  "
                f"{len(groups)} groups, {len(rows)} responses, mean score {mean:+.3f}{search}")


def _response_text(row: dict) -> str:
    segments = row.get("segments")
    return "".join(s["text"] for s in segments) if segments else str(row["response"])


def render_response(row: dict) -> Text:
    """The response with its masked spans told apart (multi-turn), or plain (single-turn)."""
    text = Text()
    for seg in row.get("segments") or [{"text": str(row["response"]), "trained": True}]:
        text.append(seg["text"], style="" if seg.get("trained", True) else UNTRAINED_STYLE)
    return text


class RolloutViewer(App):
    """The terminal viewer: groups on the left, the chosen group's ranked responses and text on the right."""

    TITLE = "rlhf rollouts"
    CSS = """
    #groups { width: 3fr; }
    #right { width: 4fr; }
    #responses { height: 40%; }
    #detail { height: 1fr; overflow-y: auto; border: round $accent; padding: 0 1; }
    #search { display: none; }
    #search.visible { display: block; }
    """
    BINDINGS = [
        # priority: the tables would otherwise take left/right for horizontal scrolling
        Binding("left,p", "step(-1)", "prev step", priority=True),
        Binding("right,n", "step(1)", "next step", priority=True),
        Binding("slash", "search", "search"),
        Binding("b", "pick(0)", "best"),
        Binding("w", "pick(-1)", "worst"),
        Binding("escape", "clear_search", "clear search", show=False),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, browser: RolloutBrowser, source: str = ""):
        super().__init__()
        self.browser, self.source = browser, source
        self._groups: list[tuple[str, list[dict]]] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="summary")
        yield Input(placeholder="search prompts and responses, Enter to apply, Esc to clear", id="search")
        with Horizontal():
            yield DataTable(id="groups", cursor_type="row")
            with Vertical(id="right"):
                yield DataTable(id="responses", cursor_type="row")
                yield Static(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.source
        self.query_one("#groups", DataTable).add_columns("group", "n", "best", "mean", "truth", "prompt")
        self.query_one("#responses", DataTable).add_columns("rank", "score", "adv", "len", "response")
        self.refresh_groups()
        self.query_one("#groups", DataTable).focus()

    # ------------------------------------------------------------------ state -> widgets
    def refresh_groups(self) -> None:
        self._groups = self.browser.groups()
        table = self.query_one("#groups", DataTable)
        table.clear()
        for uid, group in self._groups:
            scores = [float(r["score"]) for r in group]
            table.add_row(uid[:12], len(group), f"{max(scores):+.2f}", f"{sum(scores) / len(scores):+.2f}",
                          str(group[0].get("ground_truth", ""))[:12], _one_line(group[0]["prompt"], 60))
        self.query_one("#summary", Static).update(self.browser.summary())
        self.show_group(0)

    def show_group(self, index: int) -> None:
        table = self.query_one("#responses", DataTable)
        table.clear()
        if not self._groups:
            self.query_one("#detail", Static).update("no group matches the search")
            return
        _, group = self._groups[min(index, len(self._groups) - 1)]
        for rank, r in enumerate(group, 1):
            table.add_row(rank, f"{float(r['score']):+.3f}", f"{float(r['advantage']):+.3f}", r["response_length"],
                          _one_line(_response_text(r), 80))
        self.show_response(group[0])

    def show_response(self, row: dict) -> None:
        head = Text(f"score {float(row['score']):+.3f}  advantage {float(row['advantage']):+.3f}  "
                    f"length {row['response_length']}  truth {row.get('ground_truth')!r}\n", style="bold")
        head.append("prompt: ", style="bold").append(str(row["prompt"]) + "\n\n")
        head.append("response:\n", style="bold").append_text(render_response(row))
        self.query_one("#detail", Static).update(head)

    # ------------------------------------------------------------------ events and actions
    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "groups":
            self.show_group(event.cursor_row)
        elif self._groups:
            group = self._groups[min(self.query_one("#groups", DataTable).cursor_row, len(self._groups) - 1)][1]
            if event.cursor_row < len(group):
                self.show_response(group[event.cursor_row])

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """While the search box has the focus, keys (arrows, n, p, b, w, q) edit the search."""
        if action in ("step", "pick", "quit") and isinstance(self.focused, Input):
            return False
        return True

    def action_step(self, delta: int) -> None:
        self.browser.move_step(delta)
        self.refresh_groups()

    def action_pick(self, index: int) -> None:
        table = self.query_one("#responses", DataTable)
        if table.row_count:
            table.move_cursor(row=index % table.row_count)
            table.focus()

    def action_search(self) -> None:
        box = self.query_one("#search", Input)
        box.add_class("visible")
        box.focus()

    def action_clear_search(self) -> None:
        box = self.query_one("#search", Input)
        box.value, self.browser.query = "", ""
        box.remove_class("visible")
        self.refresh_groups()
        self.query_one("#groups", DataTable).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.browser.query = event.value.strip()
        self.refresh_groups()
        self.query_one("#groups", DataTable).focus()


def _one_line(text: str, width: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def view(stage_dir: str | Path) -> None:
    """Open the viewer on a stage folder's `rollouts.jsonl` (raises FileNotFoundError without one)."""
    RolloutViewer(RolloutBrowser(read_records(Path(stage_dir))), source=str(stage_dir)).run()
