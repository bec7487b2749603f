"""matplotlib, imported quietly where it cannot keep its folders.

Under a HOME that cannot be written (a container's, read-only or unset to /) matplotlib makes a temporary config
and cache folder itself and says so in two WARNING lines on stderr ("mkdir -p failed ... Matplotlib created a
temporary cache directory ... set the MPLCONFIGDIR ..."), in the middle of a run's output, for every command that
draws a PNG (bench, doctor, --monitor). Its fallback works; only the lines are silenced. A MPLCONFIGDIR the user set
is matplotlib's to complain about: then nothing is silenced.
"""

from __future__ import annotations

import logging
import os
import sys
from types import ModuleType


def import_matplotlib() -> ModuleType:
    """`matplotlib`, with `matplotlib.font_manager` (which makes the cache folder), imported once with matplotlib's
    warnings about its config and cache folders left out. Call it before any other matplotlib import."""
    if "matplotlib.font_manager" in sys.modules or "MPLCONFIGDIR" in os.environ:
        import matplotlib

        return matplotlib
    log = logging.getLogger("matplotlib")
    level = log.level
    log.setLevel(logging.ERROR)  # the folder warnings come from the "matplotlib" logger, not from warnings.warn
    try:
        import matplotlib
        import matplotlib.font_manager  # noqa: F401
    finally:
        log.setLevel(level)
    return matplotlib
