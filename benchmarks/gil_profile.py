"""Which thread of this process holds the GIL, and in what, while a block runs: py-spy samples the
process from outside (`--gil`: only the thread holding the GIL is recorded, `--nonblocking`: the process
is never paused), and /proc gives each thread's CPU time over the same block.

Why: the JPEG pipeline's decode and resize threads share one interpreter with the training thread, and
end to end runs ~20 % under the step alone while the loader alone is ~50 % faster than the step
(docs/decoding.md). Whether the GIL is the shared resource, and whose Python holds it, is a measurement,
not a guess. py-spy (`pip install py-spy`) must be on PATH and allowed to read this process's memory;
where it is not, the block still runs and the summary says why there are no samples.

    with GilProfile(Path("gil.txt")) as prof:
        ...                      # the timed epochs
    print(prof.summary())        # also written beside the raw samples
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil

RATE_HZ = 200
ATTACH_S = 0.5  # py-spy's time to attach, inside the window the shares are of
# "thread (TID): NAME;frame;frame COUNT", or "thread (TID);frame;... COUNT" for a thread Python did not start
# (the autograd engine's, which runs compiled backwards)
_LINE = re.compile(r"^thread \((?P<tid>\d+)\)(?P<stack>.*) (?P<count>\d+)$")


def thread_cpu_seconds() -> dict[int, float]:
    """CPU seconds (user + system) of every thread of this process, by native thread id."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}


def parse_raw(text: str) -> list[tuple[int, list[str], int]]:
    """py-spy's raw (collapsed) lines -> (thread id, frames outermost first, samples)."""
    rows = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            rows.append((int(m["tid"]), m["stack"].lstrip(":; ").split(";"), int(m["count"])))
    return rows


def summarize(rows, seconds: float, cpu: dict[int, float], names: dict[int, str], top: int = 8) -> str:
    """Per thread: its share of the sampling window holding the GIL (samples / rate / seconds: the window
    is the block plus py-spy's attach and stop), its CPU share over the block, and the functions
    (innermost frame) where it held the GIL most."""
    held = collections.Counter()
    where: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for tid, frames, count in rows:
        held[tid] += count
        where[tid][frames[-1] if frames else "?"] += count
    total = sum(held.values())
    lines = [
        f"{seconds:.2f} s sampled at {RATE_HZ} Hz: {total} samples with the GIL held "
        f"({total / (RATE_HZ * seconds):.0%} of the time, all threads together)"
    ]
    for tid in sorted(set(held) | {t for t, s in cpu.items() if s >= 0.05 * seconds}, key=lambda t: -held[t]):
        lines.append(
            f"- thread {tid} {names.get(tid, '?')}: GIL held {held[tid] / (RATE_HZ * seconds):.0%} of the time, "
            f"CPU {cpu.get(tid, 0.0) / seconds:.0%}"
        )
        for frame, count in where[tid].most_common(top):
            lines.append(f"    {count / (RATE_HZ * seconds):6.1%}  {frame}")
    return "\n".join(lines)


class GilProfile:
    """Samples this process with py-spy while the `with` block runs; writes `path` (raw samples) and
    `path` with `.summary.txt` (see `summarize`)."""

    def __init__(self, path: Path, native: bool = False) -> None:
        """`native`: C frames too (py-spy's --native), which needs the process paused at each sample:
        for where a thread holds the GIL below its last Python frame, not for its rate."""
        self.path, self.native = Path(path), native
        self.text = ""
        self.cpu: dict[int, float] = {}  # after the block: each thread's CPU seconds in it, by native id
        self._names: dict[int, str] = {}
        self._done = threading.Event()

    def __enter__(self) -> GilProfile:
        exe = shutil.which("py-spy")
        self._spy = None
        self._why = "" if exe else "py-spy is not on PATH"
        self._t0 = time.perf_counter()  # the window: from py-spy's start to its stop, the block inside it
        if exe:
            cmd = [exe, "record", "--pid", str(os.getpid()), "--gil", "--threads"]
            cmd += ["--native"] if self.native else ["--nonblocking"]
            cmd += ["--rate", str(RATE_HZ), "--format", "raw", "-o", str(self.path)]
            self._spy = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            time.sleep(ATTACH_S)  # py-spy attaches before the block starts
        self._cpu0 = thread_cpu_seconds()
        self._cpu_last = dict(self._cpu0)
        self._watch = threading.Thread(target=self._watch_threads, daemon=True, name="gil-profile-names")
        self._watch.start()
        return self

    def _watch_threads(self) -> None:
        # threads made inside the block may also end there (the feeder's, every epoch): their names and
        # CPU time are read while they live
        while not self._done.wait(0.05):
            self._names.update({t.native_id: t.name for t in threading.enumerate() if t.native_id})
            self._cpu_last.update(thread_cpu_seconds())

    def __exit__(self, *exc) -> None:
        self._cpu_last.update(thread_cpu_seconds())
        self._done.set()
        self._watch.join()
        self.cpu = cpu = {tid: last - self._cpu0.get(tid, 0.0) for tid, last in self._cpu_last.items()}
        for tid in cpu:  # native threads (CUDA's, nvJPEG's) by their kernel name
            if tid not in self._names:
                try:
                    self._names[tid] = "native:" + Path(f"/proc/self/task/{tid}/comm").read_text().strip()
                except OSError:
                    pass
        rows = []
        if self._spy is not None:
            self._spy.send_signal(signal.SIGINT)
            try:
                log = self._spy.communicate(timeout=60)[0].decode(errors="replace")
            except subprocess.TimeoutExpired:
                self._spy.kill()
                log = "py-spy did not stop within 60 s"
            if self.path.exists():
                rows = parse_raw(self.path.read_text())
            else:
                self._why = "py-spy wrote nothing: " + log.strip()[-300:]
        seconds = time.perf_counter() - self._t0  # py-spy's whole window: its samples may come from all of it
        self.text = summarize(rows, seconds, cpu, self._names) + (f"\n({self._why})" if self._why else "")
        self.path.with_name(self.path.name + ".summary.txt").write_text(self.text + "\n")

    def summary(self) -> str:
        return self.text
