"""DeviceFeeder's decode thread: same batches as in line, errors reach the training thread, and an
abandoned iterator stops its thread. On the CPU the thread runs without streams or events."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch

from cnnpar.config import resolve_decode
from cnnpar.data.loader import DeviceFeeder
from cnnpar.data.transforms import DeviceTransform
from cnnpar.errors import DataError


@dataclass
class Raw:
    pixels: torch.Tensor
    index: torch.Tensor


class Decoder:
    """Stands in for GpuDecoder: raw batch in, uint8 images out; fails on a chosen batch."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at, self.calls = fail_at, 0

    def __call__(self, raw: Raw) -> torch.Tensor:
        self.calls += 1
        if self.fail_at is not None and int(raw.index[0]) == self.fail_at:
            raise DataError(f"photos/{self.fail_at}.jpg: cannot decode as an image")
        return raw.pixels


def batches(n: int = 6, size: int = 4):
    g = torch.Generator().manual_seed(0)
    for b in range(n):
        x = torch.randint(0, 256, (size, 3, 8, 8), generator=g, dtype=torch.uint8)
        yield Raw(x, torch.arange(b * size, (b + 1) * size)), torch.arange(size) + b


def feeder(decoder, threaded: bool) -> DeviceFeeder:
    transform = DeviceTransform((0.5,) * 3, (0.25,) * 3, "none", False, torch.device("cpu"))
    return DeviceFeeder(list(batches()), None, transform, torch.device("cpu"), True, False, decoder, threaded)


def feeder_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "cnnpar-feeder"]


def test_threaded_feeder_yields_what_the_inline_feeder_yields():
    inline = list(feeder(Decoder(), threaded=False))
    threaded = list(feeder(Decoder(), threaded=True))
    assert len(threaded) == len(inline) == 6
    for (x1, y1), (x2, y2) in zip(inline, threaded):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not feeder_threads()


def test_a_decode_error_in_the_thread_reaches_the_training_thread():
    it = iter(feeder(Decoder(fail_at=8), threaded=True))
    next(it), next(it)
    with pytest.raises(DataError, match=r"photos/8\.jpg"):
        next(it)
    assert not feeder_threads()


def test_an_abandoned_iterator_stops_its_thread():
    dec = Decoder()
    it = iter(feeder(dec, threaded=True))
    next(it)
    del it  # as warm_up_compile does after one batch
    assert not feeder_threads()
    assert dec.calls < 6  # it stopped instead of decoding the whole epoch


def test_decode_rule():
    assert resolve_decode("auto", cuda=True, nvimgcodec_ok=True)[0] == "nvimgcodec"
    assert resolve_decode("auto", cuda=True, nvimgcodec_ok=False)[0] == "gpu"
    assert resolve_decode("auto", cuda=False, nvimgcodec_ok=True)[0] == "cpu"
    assert resolve_decode("gpu", cuda=True, nvimgcodec_ok=True) == ("gpu", "as asked")
