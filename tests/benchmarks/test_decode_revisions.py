"""benchmarks/decode_revisions.py: each source tree is imported in its own process and timed, alternated."""

import json
import subprocess
import sys
from pathlib import Path

from helpers import tiny_model_path

ROOT = Path(__file__).resolve().parents[2]


def test_two_sources_are_timed_in_turn_and_compared(tmp_path):
    """The same checkout twice on the tiny model: every repetition of each source is recorded with its revision,
    and the ratio is the ratio of the medians."""
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_revisions.py"), "--source", str(ROOT), str(ROOT),
                    "--model", tiny_model_path(), "--prompt-tokens", "6", "--prompts", "2", "--n", "2",
                    "--new-tokens", "3", "--repeats", "2", "--out", str(out)], check=True, cwd=ROOT, timeout=600)
    result = json.loads(out.read_text())
    assert [len(s["seconds"]) for s in result["sources"]] == [2, 2]
    assert all(s["revision"] and s["min"] <= s["median"] <= s["max"] for s in result["sources"])
    before, after = (s["median"] for s in result["sources"])
    assert abs(result["after_over_before"] - after / before) < 1e-12
    assert result["shape"] == {"prompt_tokens": 6, "prompts": 2, "n": 2, "new_tokens": 3, "temperature": 0.7}
