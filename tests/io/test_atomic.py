"""Folders written whole: the modes follow the umask (mkdtemp's 0700 and safetensors' 0600 used to stay)."""

import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from rlhf.io.atomic import atomic_write_dir
from rlhf.models.tiny import tiny_qwen2


def modes(folder):
    out = {".": stat.S_IMODE(os.stat(folder).st_mode)}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = stat.S_IMODE(os.stat(path).st_mode)
    return out


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


@pytest.mark.parametrize("mask, folder, file", [(0o022, 0o755, 0o644), (0o002, 0o775, 0o664), (0o077, 0o700, 0o600)])
def test_a_written_folder_gets_the_modes_of_the_umask(tmp_path, umask, mask, folder, file):
    umask(mask)

    def write(tmp):
        (tmp / "policy").mkdir()
        save_file({"w": torch.zeros(2)}, str(tmp / "policy" / "model.safetensors"))  # safetensors writes 0600
        (tmp / "policy" / "config.json").write_text("{}")

    atomic_write_dir(str(tmp_path / "ckpt"), write)
    assert modes(tmp_path / "ckpt") == {".": folder, "policy": folder, "policy/model.safetensors": file,
                                        "policy/config.json": file}


def test_a_tiny_model_folder_gets_the_modes_of_the_umask(tmp_path, umask):
    umask(0o022)
    path = tiny_qwen2(str(tmp_path / "m"), hidden_size=16, num_layers=1, intermediate_size=32)
    found = modes(path)
    assert found["."] == 0o755 and found["model.safetensors"] == 0o644 and set(found.values()) == {0o755, 0o644}
