"""A plain line now and then for a long loop whose progress bar is not drawn because the output is not a terminal
(a log file, nohup, CI): tqdm's disable=None leaves the bar out there, and a working run looked like a hung one
(186 s silent evaluating 200,000 images, 34 s preparing 150,000 small PNGs)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

EVERY_S = 30.0  # between lines: a log gains one line a half minute, and a loop shorter than this prints none


def bar_left_out(bar, requested: bool) -> bool:
    """True where a bar was asked for (rank 0, --progress) and tqdm left it out: not a terminal. --no-progress
    (requested False) stays silent, as it was."""
    return requested and bool(bar.disable)


class Heartbeat:
    """`update(done)` says "{what}: {done}/{total} {unit}, {elapsed} s" once `EVERY_S` passed since the start or the
    last line, only where `on`; a loop that ends sooner prints nothing. A time read a call: no host sync."""

    def __init__(
        self, what: str, total: int, unit: str, say: Callable[..., object], on: bool, clock=time.monotonic
    ) -> None:
        self.what, self.total, self.unit, self.say, self.on, self.clock = what, total, unit, say, on, clock
        self.start = self.last = clock() if on else 0.0

    def update(self, done: int) -> None:
        if not self.on:
            return
        now = self.clock()
        if now - self.last < EVERY_S:  # read at each call: a test sets it to 0
            return
        self.last = now
        of = f"/{self.total:,}" if self.total else ""
        self.say(f"{self.what}: {done:,}{of} {self.unit}, {now - self.start:.0f} s")
        sys.stdout.flush()  # a log file's buffer would hold the line back: `say` is print, or takes one argument
