"""A finished stage's `final/` carries checksums, and the next stage checks them before it trains
from it: bytes flipped in the SFT model make the RL stage stop at once, naming the file and the fix."""

import json
from pathlib import Path

import pytest

from rlhf.cli.experiment import run_cli
from rlhf.io.manifest import MANIFEST, verify
from helpers import load_file


@pytest.fixture(scope="module")
def tiny():
    return load_file("experiments/arithmetic_tiny.py")


def argv(out: Path, *extra: str) -> list[str]:
    commands = ["fiddler:local", "fiddler:smoke", "fiddler:no_tracking", "set:stages.sft.total_steps=2",
                f"set:output_dir={str(out)!r}", "set:run_name='job'"]
    return [a for c in commands for a in ("--config", c)] + list(extra)


def test_a_corrupted_final_model_stops_the_next_stage_naming_the_file(tiny, tmp_path, capsys):
    run_cli(tiny, argv(tmp_path, "--stages", "sft"))
    final = tmp_path / "arithmetic_tiny" / "job" / "sft" / "final"
    assert verify(final) is None  # written with its checksums
    listed = json.loads((final / MANIFEST).read_text())["files"]
    assert "model.safetensors" in listed and "config.json" in listed
    weights = final / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-200:-136] = bytes(b ^ 0xFF for b in data[-200:-136])  # 64 inverted bytes, size unchanged
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    with pytest.raises(SystemExit) as err:
        run_cli(tiny, argv(tmp_path))  # sft is finished: grpo would start from its final/
    message = str(err.value.code)
    assert message.startswith("error: ") and "\n" not in message.strip()
    assert str(weights) in message and "sha256" in message
    assert "stage 'grpo'" in message and "stage 'sft'" in message
    assert "result.json" in message  # how to write final/ anew
    assert not (tmp_path / "arithmetic_tiny" / "job" / "grpo" / "checkpoints").exists()  # nothing trained
