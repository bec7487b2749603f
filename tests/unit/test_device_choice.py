"""How a user picks the device for `cnnpar predict` and what CUDA_VISIBLE_DEVICES does to the count (no GPU here:
CUDA and Apple's MPS are monkeypatched, as a CPU-only CI machine needs)."""

from __future__ import annotations

import pytest
import torch

from cnnpar import dist
from cnnpar.engine import predict
from cnnpar.errors import ConfigError, UserError


def test_cuda_hidden_by_cuda_visible_devices_names_the_variable(monkeypatch):
    """`CUDA_VISIBLE_DEVICES=1` on a one-GPU machine (or an empty one) left "no CUDA device is visible" with no hint
    that the variable, not the machine, hid them."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match=r"no CUDA device is visible \(CUDA_VISIBLE_DEVICES='' chooses which are\)"):
        dist.pick_device("cuda", 0, 1)
    with pytest.raises(ConfigError, match=r"^--device 'cuda' but no .* \(CUDA_VISIBLE_DEVICES='' chooses which are\)"):
        predict._device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(ConfigError, match=r"2 processes .* 1 CUDA device\(s\) visible \(CUDA_VISIBLE_DEVICES='1' cho"):
        dist.pick_device("cuda", 0, 2)


def test_predict_refuses_mps_saying_that_no_apple_gpu_is_used():
    with pytest.raises(ConfigError) as e:
        predict._device("mps")
    line = str(e.value)
    assert line.startswith("--device 'mps': expected auto, cpu, cuda or cuda:N (") and "Apple GPU through MPS" in line


@pytest.mark.parametrize(
    ("device", "how"),
    [
        ("CUDA:1", "in lower case: cuda:1"),
        ("Cpu", "in lower case: cpu"),
        ("AUTO", "in lower case: auto"),
        ("cuda:1 ", "without spaces: cuda:1"),  # a lower-case name said to be "written in lower case"
        (" cpu", "without spaces: cpu"),
        ("CUDA ", "in lower case and without spaces: cuda"),
    ],
)
def test_predict_says_that_a_device_is_written_in_lower_case(device, how):
    """CUDA:1 got train's advice (CUDA_VISIBLE_DEVICES), which predict, taking cuda:N, does not need."""
    with pytest.raises(ConfigError) as e:
        predict._device(device)
    assert str(e.value) == f"--device {device!r}: expected auto, cpu, cuda or cuda:N (written {how})"


def test_predict_on_a_mac_says_that_the_apple_gpu_is_not_used(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    with pytest.raises(UserError):  # no checkpoint there: the note comes first, with the device
        predict.predict(str(tmp_path / "none"), "digits")
    assert "Apple GPU (MPS)" in capsys.readouterr().err
