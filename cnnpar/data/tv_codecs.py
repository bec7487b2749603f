"""torchvision's image codecs, used knowing that torchvision 0.29 deprecates them.

torchvision 0.29 warns (DeprecationWarning) on every `torchvision.io` decode and encode call: the
codecs are to move to TorchCodec. cnnpar keeps calling them until torchvision actually removes
them, because its decode paths were measured with them (libjpeg-turbo on the CPU, nvJPEG batched
on the GPU) and TorchCodec's are not yet; docs/decoding.md is the plan for the move and what must
be measured first. `tv_codecs()` silences exactly that notice around cnnpar's own calls, so
users and the test suite see only warnings that ask something of them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

# The start of torchvision.io.image._DEPRECATION_MSG (a regular expression matched at the start).
TV_CODEC_DEPRECATION = "The image decoding and encoding capabilities of TorchVision are deprecated"


@contextmanager
def tv_codecs() -> Iterator[None]:
    """Around a `torchvision.io` decode/encode call: its codec-deprecation notice is known (see
    docs/decoding.md), every other warning still shows."""
    # catch_warnings restores the filter list on exit; two threads overlapping here can at worst
    # leave this one message-specific "ignore" in place, which hides nothing else.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TV_CODEC_DEPRECATION, category=DeprecationWarning)
        yield
