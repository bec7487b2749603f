"""torchvision's image codecs, used knowing that torchvision 0.29 deprecates them.

torchvision 0.29 warns (DeprecationWarning) on every `torchvision.io` decode and encode call: the
codecs are to move to TorchCodec. cnnpar keeps calling them until torchvision actually removes
them, because its decode paths were measured with them (libjpeg-turbo on the CPU, nvJPEG batched
on the GPU) and TorchCodec's are not yet; docs/decoding.md is the plan for the move and what must
be measured first. `tv_codecs()` hides exactly that notice from cnnpar's first codec call on, so
users and the test suite see only warnings that ask something of them.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

# The start of torchvision.io.image._DEPRECATION_MSG (a regular expression matched at the start).
TV_CODEC_DEPRECATION = "The image decoding and encoding capabilities of TorchVision are deprecated"

# The entry warnings.filterwarnings("ignore", message=TV_CODEC_DEPRECATION, category=DeprecationWarning) makes
_CODEC_FILTER = ("ignore", re.compile(TV_CODEC_DEPRECATION, re.I), DeprecationWarning, None, 0)


@contextmanager
def tv_codecs() -> Iterator[None]:
    """Around a `torchvision.io` decode/encode call: its codec-deprecation notice is known (see
    docs/decoding.md), every other warning still shows.

    One message-specific "ignore", added to the process's filters where it is missing (at cnnpar's
    first codec call; again after a pytest test or a catch_warnings put the list back), not a
    catch_warnings per call: each entry and exit of one resets the memory of every warning already
    shown once (-W default, pytest), so a warning given in each batch showed again in each, and a
    decode thread's exit put back a filter list without the fork-warning filter that the main
    thread's DataLoader start had just set (loader.fork_warning_silenced). The notice, at
    torchvision's own line for every caller, then stays hidden for the process's other
    torchvision.io calls too."""
    if _CODEC_FILTER not in warnings.filters:
        warnings.filterwarnings("ignore", message=TV_CODEC_DEPRECATION, category=DeprecationWarning)
    yield
