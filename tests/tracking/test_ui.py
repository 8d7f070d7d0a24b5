"""Aim's UI compares the runs of a sweep: URL state, `aim up` lifecycle, and the curves in a real browser."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from rlhf.tracking.query import find_runs
from rlhf.tracking.ui import aim64encode, latest_runs_url, latest_sweep, metrics_url, sweep_url

ROOT = Path(__file__).parents[2]


def aim64decode(text: str) -> dict:
    """Aim's `aim64decode` (utils/encoder/encoder.ts) in Python."""
    assert text.startswith("O-")
    body = text[2:].replace("_", "/").replace("-", "+")
    body += ["", "===", "==", "="][len(body) % 4]
    return json.loads(urllib.parse.unquote(base64.b64decode(body).decode("ascii")))


def test_aim64encode_matches_aims_javascript():
    state = {"color": ["run.params.a b"], "q": 'run.sweep.id == "x"', "u": "é"}
    # Computed with node: "O-" + btoa(encodeURI(JSON.stringify(state))) with + / = replaced as Aim does.
    assert aim64encode(state) == (
        "O-JTdCJTIyY29sb3IlMjI6JTVCJTIycnVuLnBhcmFtcy5hJTIwYiUyMiU1RCwlMjJxJTIyOiUyMnJ1bi5zd2VlcC5pZCUyMD09JTIwJTVDJTIy"
        "eCU1QyUyMiUyMiwlMjJ1JTIyOiUyMiVDMyVBOSUyMiU3RA"
    )
    assert aim64decode(aim64encode(state)) == state


def test_metrics_url_carries_the_query_metrics_and_grouping():
    url = metrics_url("http://127.0.0.1:1/", query='run.sweep.id == "s"', metrics=["sft/loss"], color=["run.params.x"])
    parsed = urllib.parse.urlparse(url)
    assert parsed.path == "/metrics"
    params = dict(urllib.parse.parse_qsl(parsed.query))
    assert aim64decode(params["grouping"]) == {"color": ["run.params.x"], "stroke": [], "chart": ["name"]}
    select = aim64decode(params["select"])
    assert select["query"] == 'run.sweep.id == "s"' and not select["advancedMode"]
    assert select["options"] == [{"value": {"option_name": "sft/loss", "context": None}}]


def test_the_latest_sweep_and_its_swept_fields(toy_sweep):
    results, repo, _ = toy_sweep
    found = latest_sweep(repo)
    assert found["id"] == results.sweep_id and found["name"] == "lr_sweep" and len(found["runs"]) == 4
    assert found["swept"] == ["stages.train.lr"]
    params = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(sweep_url("http://h:1", repo)).query))
    assert aim64decode(params["grouping"])["color"] == ["run.params.sweep.overrides.stages.train.lr"]
    assert aim64decode(params["select"])["query"] == f'run.sweep.id == "{results.sweep_id}"'
    with pytest.raises(LookupError, match="no sweep 'nope'"):
        latest_sweep(repo, "nope")


def test_latest_runs_link_compares_the_newest_runs_of_the_newest_experiment(toy_sweep):
    _, repo, _ = toy_sweep
    runs = find_runs(repo)
    params = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(latest_runs_url("http://h:1", repo, limit=3)).query))
    select = aim64decode(params["select"])
    assert select["query"] == f"run.hash in {[r['hash'] for r in runs[-3:]]!r}"  # the 3 newest, no sweep needed
    assert aim64decode(params["grouping"])["color"] == ["run.props.name"]
    with pytest.raises(LookupError, match="no runs of experiment 'nope'"):
        latest_runs_url("http://h:1", repo, experiment="nope")


# ------------------------------------------------------------------ the real thing, in a browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LRS = (1e-3, 2e-3, 4e-3, 8e-3)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_sweep_shows_one_curve_per_run_coloured_by_the_swept_value(tmp_path):
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")

    # A 4-member sweep of SFT learning rates on the tiny arithmetic experiment, in this process tree
    # only: LocalRuntime, a few SFT steps, a small held-out set; its files go to tmp_path.
    sweep = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "arithmetic_tiny.py"),
         "--config", "fiddler:local", "--config", "fiddler:quiet",
         "--config", "set:stages.sft.total_steps=5", "--config", "set:stages.sft.batch_size=32",
         "--config", "set:stages.sft.policy.worker.training.micro_batch_size=32",
         "--config", "set:stages.sft.data.rows.n=256", "--config", "set:stages.sft.evaluator.dataset.rows.n=8",
         "--config", "set:tracker.repo='aim'", "--stages", "sft",
         "--sweep", f"lr_sweep(stage='sft', values={LRS!r})"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]

    ui = subprocess.Popen(
        [sys.executable, "-m", "rlhf.cli", "ui", "--repo", "aim", "--metric", "sft/loss"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    aim_group, url, runs_url, lines = None, None, None, []
    try:
        deadline = time.monotonic() + 300
        while url is None and time.monotonic() < deadline:
            line = ui.stdout.readline()
            assert line, f"rlhf ui ended early:\n{''.join(lines)}"
            lines.append(line)
            if line.startswith("Aim UI:"):
                aim_group = int(line.split("process group ")[1].split(";")[0])
            if line.startswith("runs: "):
                runs_url = line.removeprefix("runs: ").strip()
            if line.startswith("sweep: "):
                url = line.removeprefix("sweep: ").strip()
        assert url and runs_url and aim_group, "".join(lines)
        base = url.split("/metrics")[0]

        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base) else route.abort())
            page.add_init_script("window.localStorage.setItem('communityPopupSeen', 'true')")
            page.goto(url)
            page.wait_for_selector("svg.Visualization path.Line", timeout=120_000)
            page.wait_for_selector(".ProgressBar", state="detached", timeout=60_000)
            page.wait_for_function(
                "document.querySelectorAll('svg.Visualization path.Line').length >= 4", timeout=60_000)
            page.screenshot(path=str(tmp_path / "sweep.png"))
            strokes = page.eval_on_selector_all(
                "svg.Visualization path.Line", "els => els.map(e => getComputedStyle(e).stroke)")
            legend = page.eval_on_selector_all(  # the colour legend: one cell per value, in its colour
                "#Legend-group-color text.Legend-cell", "els => els.map(e => [e.getAttribute('fill'), e.textContent])")
            fields = page.eval_on_selector_all("#Legend-group-color title", "els => els.map(e => e.textContent)")
            # the latest-runs link (no sweep needed): the same 4 runs, one colour per run name
            page.goto(runs_url)
            page.wait_for_function(
                "document.querySelectorAll('svg.Visualization path.Line').length >= 4", timeout=120_000)
            run_strokes = page.eval_on_selector_all(
                "svg.Visualization path.Line", "els => els.map(e => getComputedStyle(e).stroke)")
            run_legend = page.eval_on_selector_all("#Legend-group-color text.Legend-cell", "els => els.map(e => e.textContent)")
            browser.close()
        assert len(run_strokes) == 4 and len(set(run_strokes)) == 4, run_strokes
        names = [name.strip('"') for name in run_legend]  # the legend quotes string values
        assert len(set(names)) == 4 and all(n.startswith("arithmetic_tiny/") and n.endswith("/sft") for n in names), names
        assert len(strokes) == 4, strokes  # one curve per run of the sweep
        assert len(set(strokes)) == 4, strokes  # each in its own colour
        assert "run.sweep.overrides.stages.sft.policy.worker.optimizer.lr" in fields, fields
        shown = {float(text): colour for colour, text in legend}
        assert sorted(shown) == sorted(LRS), legend  # coloured by the swept learning rate
        as_rgb = {f"rgb({int(c[1:3], 16)}, {int(c[3:5], 16)}, {int(c[5:7], 16)})" for c in shown.values()}
        assert as_rgb == set(strokes)
    finally:
        ui.send_signal(signal.SIGINT)
        ui.wait(timeout=60)
    # `rlhf ui` stopped aim up's whole process group (uvicorn child included) and freed the port.
    deadline = time.monotonic() + 20
    while aim_group and group_alive(aim_group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(aim_group)
    port = urllib.parse.urlparse(base).port
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
