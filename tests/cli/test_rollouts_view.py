"""`rlhf rollouts view`: the browsing logic, the Textual app driven headless, and the real command in tmux."""

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from rlhf.cli.rollouts_view import UNTRAINED_STYLE, RolloutBrowser, RolloutViewer, render_response
from rlhf.trainers.records import RECORDS_FILE, read_records

ROOT = Path(__file__).resolve().parents[2]


def _records(folder: Path) -> Path:
    """3 steps x 2 groups x 3 responses; group g1 of step 3 asks about 'needle'; one multi-turn row."""
    rows = []
    for step in (1, 2, 3):
        for g, prompt in (("g0", "What is 2+2?"), ("g1", "Where is the needle?" if step == 3 else "What is 5+5?")):
            for i, score in enumerate((0.0, 1.0, 0.5)):
                rows.append({"step": step, "uid": f"{g}", "prompt": prompt, "response": f"answer {step}-{g}-{i}",
                             "score": score + step, "advantage": score - 0.5, "response_length": 3 + i,
                             "ground_truth": "4", "data_source": "arithmetic"})
    rows.append({"step": 3, "uid": "g2", "prompt": "Use the calculator", "response": "", "score": 9.0,
                 "advantage": 1.0, "response_length": 7, "ground_truth": "8", "data_source": "tools",
                 "segments": [{"text": "<tool_call>add(3, 5)</tool_call>", "trained": True},
                              {"text": "\n<tool_response>8</tool_response>\n", "trained": False},
                              {"text": "The sum is 8.", "trained": True}]})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_browser_starts_at_the_newest_step_ranks_and_searches(tmp_path):
    b = RolloutBrowser(read_records(_records(tmp_path)))
    assert b.steps == [1, 2, 3] and b.step == 3
    groups = dict(b.groups())
    assert [r["score"] for r in groups["g0"]] == [4.0, 3.5, 3.0]  # best first
    b.query = "NEEDLE"  # case-insensitive, prompts and responses
    assert [uid for uid, _ in b.groups()] == ["g1"]
    b.query = "tool_response"  # multi-turn text is searched too
    assert [uid for uid, _ in b.groups()] == ["g2"]
    b.query = ""
    b.move_step(-5)
    assert b.step == 1 and "step 1 (1/3)" in b.summary()
    b.move_step(+1)
    assert b.step == 2


def test_masked_spans_are_styled_apart():
    row = {"response": "", "segments": [{"text": "call", "trained": True}, {"text": "tool out", "trained": False}]}
    text = render_response(row)
    assert text.plain == "calltool out"
    styled = {text.plain[s.start:s.end]: str(s.style) for s in text.spans}
    assert styled == {"tool out": UNTRAINED_STYLE}


def test_the_app_headless_navigates_steps_searches_and_picks_worst(tmp_path):
    async def drive():
        app = RolloutViewer(RolloutBrowser(read_records(_records(tmp_path))))
        async with app.run_test(size=(160, 45)) as pilot:
            summary = lambda: str(app.query_one("#summary", Static).render())  # noqa: E731
            assert "step 3 (3/3)" in summary() and "3 groups" in summary()
            await pilot.press("left")
            assert "step 2 (2/3)" in summary()
            await pilot.press("right", "slash", *"needle", "enter")
            assert "1 groups" in summary() and "needle" in summary()
            await pilot.press("w")  # the worst response of the group
            detail = str(app.query_one("#detail", Static).render())
            assert "answer 3-g1-0" in detail and "score +3.000" in detail
            await pilot.press("escape")
            assert "3 groups" in summary()
            assert app.query_one("#groups", DataTable).row_count == 3

    asyncio.run(drive())


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_the_command_in_a_real_terminal(tmp_path):
    """As a person would: `rlhf rollouts view` in tmux, keys sent, the screen read back."""
    folder = _records(tmp_path / "stage")
    session = f"rlhf-view-{time.monotonic_ns()}"
    cmd = f"{sys.executable} -m rlhf.cli rollouts view {folder}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "45", "-c", str(ROOT), cmd],
                   check=True)

    def screen_has(text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
            if text in out:
                return out
            time.sleep(0.3)
        raise AssertionError(f"{text!r} never appeared on the screen:\n{out}")

    try:
        screen_has("step 3 (3/3)")
        subprocess.run(["tmux", "send-keys", "-t", session, "Left"], check=True)
        screen_has("step 2 (2/3)")
        subprocess.run(["tmux", "send-keys", "-t", session, "Right", "/"], check=True)
        time.sleep(0.5)
        subprocess.run(["tmux", "send-keys", "-t", session, "-l", "calculator"], check=True)
        subprocess.run(["tmux", "send-keys", "-t", session, "Enter"], check=True)
        out = screen_has("1 groups")
        assert "tool_response" in out and "The sum is 8." in out
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        deadline = time.monotonic() + 15
        while subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "q did not quit the viewer"
            time.sleep(0.2)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_a_folder_without_records_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rlhf.cli", "rollouts", "view", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and proc.stderr.strip().startswith("error: no rollout records")
    assert "Traceback" not in proc.stderr
