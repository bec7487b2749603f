"""What a DataLoader worker killed by a signal means, in one line.

torch reports a worker that died by a signal as "RuntimeError: DataLoader worker (pid N) is killed by
signal: Segmentation fault.", often under "DataLoader worker (pid(s) N) exited unexpectedly", with
its traceback: it names no file and says nothing of why. A worker that decodes photos crashes when a
decoder does: torchvision 0.29's PNG decoder died (SIGSEGV) on a PNG whose image data stops short or
is damaged inside, which is why PNGs go to Pillow (folder.decode_png), which raises an error naming
the file, on every path. Should another decoder still crash a worker, this says what it was and how
to find the file.
A worker killed by a stop signal (SIGTERM, SIGINT, SIGHUP) died of the run's own stop (engine/stops.the_stop).
`worker_crash` is the one owner of that line for every command that reads through workers: train ends with it,
a bench rung fails with it, the doctor ends with it (after writing the report of what it measured, where a try
crashed).
"""

from __future__ import annotations

import re
import shlex
import signal

from cnnpar.data.folder import ImageFolderDataset
from cnnpar.data.store import StoreFile, default_store_path, prepare_args
from cnnpar.errors import SIGKILL, STOP_SIGNALS, DataError, chain

_KILLED = re.compile(r"DataLoader worker \(pid \d+\) is killed by signal: ([^.]+)\.")
# strsignal's words (what torch writes) to the signal: "Segmentation fault" -> SIGSEGV
_BY_WORDS = {signal.strsignal(s): s for s in signal.Signals if signal.strsignal(s)}


def killed_by(e: BaseException) -> signal.Signals | None:
    """The signal that torch's error `e` says killed a DataLoader worker, or None."""
    found = _KILLED.search(str(e)) if isinstance(e, RuntimeError) else None
    return _BY_WORDS.get(found.group(1)) if found else None


def worker_signal(e: BaseException) -> signal.Signals | None:
    """The signal that killed a DataLoader worker, from torch's error `e` or the errors it was raised from or over
    ("exited unexpectedly" is raised from "is killed by signal"); None where none says so."""
    return next((sig for x in chain(e) if (sig := killed_by(x)) is not None), None)


def worker_crash_line(sig: signal.Signals, source: str, photos: bool, input_size: int, labels: str = "") -> str:
    """The one line for a run whose DataLoader worker `sig` killed, reading `source` (`photos`: an image folder,
    whose workers decode; `input_size`: the model's input side, for the store the advice writes; `labels`: the
    run's --labels CSV, without which the advised prepare of a flat folder is refused)."""
    said = f"a data loader worker crashed ({sig.name}: {signal.strsignal(sig)}) while reading {source}"
    if sig == SIGKILL:  # no decoder sends itself SIGKILL: the kernel's out-of-memory killer does
        return (
            f"{said}: SIGKILL is most often the kernel's out-of-memory killer (dmesg names it): fewer --workers or "
            "a smaller --batch-size need less memory"
        )
    if not photos:
        return said
    prepare, out = shlex.join(prepare_args(source, input_size, labels)), str(default_store_path(source))
    return (
        f"{said}: a damaged image file can crash torchvision's decoders (libpng's or libjpeg's own line above may "
        f"say how); to find it: {prepare} decodes every photo with Pillow and stops at one it cannot read, naming "
        f"it (where it names none, it has written a store that trains without those decoders: cnnpar train --data "
        f"{shlex.quote(out)})"
    )


def worker_crash(e: BaseException, source: str, bundle, labels: str = "") -> DataError | None:
    """`worker_crash_line` as the DataError a command ends with (or a bench rung fails with), where `e` says a
    DataLoader worker reading `bundle` (loaded from `source`) was killed by a signal other than a stop's; else
    None. torch's own error ("DataLoader worker (pid(s) N) exited unexpectedly", under a traceback) said neither
    the signal nor what to do."""
    sig = worker_signal(e)
    if sig is None or sig in STOP_SIGNALS:
        return None
    store = getattr(bundle.train, "store", None)
    if sig == signal.SIGBUS and isinstance(store, StoreFile) and (changed := store.changed_line()):
        # a page past a truncated store's end: torch's own lines blamed /dev/shm, ours said only "crashed"
        return DataError(f"{changed} (a data loader worker reading it died of SIGBUS)")
    photos = isinstance(bundle.train, ImageFolderDataset)  # the workers decode photos
    return DataError(worker_crash_line(sig, source, photos, bundle.shape[1], labels))
