"""cnnpar's own torchvision.io decodes raise no DeprecationWarning: torchvision 0.29's codec notice is
known (docs/decoding.md) and silenced at cnnpar's call sites, nothing else is."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from cnnpar.data.cpu_decode import CpuDecodedFolder
from cnnpar.data.folder import ImageFolderDataset, decode_rgb, read_encoded
from cnnpar.data.gpu_decode import nvjpeg_decode
from cnnpar.data.loader import fork_warning_silenced
from cnnpar.data.tv_codecs import TV_CODEC_DEPRECATION, tv_codecs


def _jpeg(tmp_path, name="a.jpg", size=(40, 56)):
    rng = np.random.default_rng(0)
    path = tmp_path / name
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path, quality=90)
    return path


def _deprecations(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


def test_cpu_paths_decode_a_jpeg_without_deprecation_warnings(tmp_path):
    path = _jpeg(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        img = decode_rgb(read_encoded(path), path)
        x, _ = ImageFolderDataset([path], [0], 32)[0]
        batch, _, _ = CpuDecodedFolder([path], [0], 32, train=False)[[0]]
        (cpu_batch,) = nvjpeg_decode([read_encoded(path)], torch.device("cpu"))
    assert _deprecations(caught) == []
    assert img.shape == (3, 40, 56) and img.dtype == torch.uint8
    assert x.shape == (3, 32, 32) and batch.shape == (1, 3, 32, 32)
    assert torch.equal(cpu_batch, img)  # the same libjpeg-turbo decode either way


def test_only_the_codec_notice_is_silenced():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tv_codecs():
            warnings.warn(TV_CODEC_DEPRECATION, DeprecationWarning, stacklevel=1)
            warnings.warn("something else is deprecated", DeprecationWarning, stacklevel=1)
    assert _deprecations(caught) == ["something else is deprecated"]


def _each_batch_warns() -> None:
    warnings.warn("given at each batch", UserWarning, stacklevel=1)  # one place: -W default shows it once


def test_a_warning_shown_once_stays_shown_once_though_batches_decode_between_its_calls(tmp_path):
    """-W default (pytest, many CI setups) shows a warning once a place; a catch_warnings per decode reset that
    memory at each call, so a warning given at each batch showed again at each."""
    path = _jpeg(tmp_path)
    data = read_encoded(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        nvjpeg_decode([data], torch.device("cpu"))  # the run's first decode
        for _ in range(3):  # three batches
            _each_batch_warns()
            nvjpeg_decode([data], torch.device("cpu"))
            decode_rgb(data, path)
    assert [str(w.message) for w in caught] == ["given at each batch"]


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python 3.12 added the warning at a threaded fork")
def test_a_decode_that_ends_while_workers_fork_leaves_their_fork_warning_hidden():
    """A GPU decoder decodes in a thread of its own while the main thread starts the next loader's forked workers
    (the evaluation's, beside the next epoch's pipeline started ahead). A catch_warnings per decode, begun before
    the start's fork_warning_silenced and ended within it, put back the filters it had found, without the fork
    warning's: each fork said 'is multi-threaded, use of fork()' (16 times in test_sample_accounting on a GPU).
    The two threads' steps, in that order, here on one thread, with a real fork while a thread runs."""
    alive = threading.Event()
    thread = threading.Thread(target=alive.wait, daemon=True)  # a second thread: the fork warns
    thread.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            decode = tv_codecs()
            decode.__enter__()  # the decode thread's call begins
            start = fork_warning_silenced(True)
            start.__enter__()  # the main thread starts workers
            decode.__exit__(None, None, None)  # the decode ends
            worker = multiprocessing.get_context("fork").Process(target=int)
            worker.start()
            worker.join()
            start.__exit__(None, None, None)
    finally:
        alive.set()
        thread.join()
    assert worker.exitcode == 0
    assert [str(w.message) for w in caught if "fork()" in str(w.message)] == []
