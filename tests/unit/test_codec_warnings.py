"""cnnpar's own torchvision.io decodes raise no DeprecationWarning: torchvision 0.29's codec notice is
known (docs/decoding.md) and silenced at cnnpar's call sites, nothing else is."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from PIL import Image

from cnnpar.data.cpu_decode import CpuDecodedFolder
from cnnpar.data.folder import ImageFolderDataset, decode_rgb, read_encoded
from cnnpar.data.gpu_decode import nvjpeg_decode
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
