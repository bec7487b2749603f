"""`cnnpar prepare`: decode an image folder once into a store (the format is described in `store`).

Worker processes decode chunks of files with Pillow; the main process writes their pixels in the
folder's order, so the store's index order is `scan_splits` order and a seeded hold-out picks the
same images from the store as from the folder. A file that does not decode stops the whole run
with its name, and nothing is left behind: the store is built under a name of its own,
`OUT.<random>.partial`, made durable (fsync) and only then renamed to OUT.

A worker hands its decoded pixels over in a file beside that one (`chunk_path`) and sends the writer only
their sizes: a worker killed while sending a large result left the pool's reader waiting for the rest of it
for ever, where one killed now is a broken pool, said in one line. Workers end with prepare (`start_worker`).

A writer holds an flock on its partial file while it writes (`hold_partial`), which the system drops when it ends,
killed or not: a prepare that finishes removes the partial files no writer holds, which prepares killed with SIGKILL
(no clean-up runs) left behind, to its OUT or to another store of the same folder (`remove_dead_partials_beside`).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import multiprocessing
import os
import re
import signal
import sys
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cnnpar.config import path_length_problem
from cnnpar.data.folder import check_pixel_count, decode_error, listing_checksum, pillow_rgb
from cnnpar.data.labels_csv import scan_images
from cnnpar.data.overlap import same_file_groups
from cnnpar.data.source_size import folder_sample, pick_side
from cnnpar.data.store import (
    INDEX_BYTES_PER_IMAGE,
    MAGIC,
    PARTIAL_SUFFIX,
    PREFIX,
    VERSION,
    align,
    encode_header,
    header_never_written,
    index_checksum,
    left_partials,
    new_hash,
    new_partial_path,
    pack_index,
)
from cnnpar.errors import SIGKILL, DataError, UserError, raise_pending_stop
from cnnpar.host_facts import higher_limit, usable_cores
from cnnpar.process_tree import end_with_parent
from cnnpar.report.files import fsync_path, unheld
from cnnpar.report.heartbeat import Heartbeat, bar_left_out
from cnnpar.report.host import WORKERS_PER_CORE, worker_cap_line

try:
    import fcntl
except ImportError:  # Windows has no flock: a killed prepare's partial files stay there, for the user to remove
    fcntl = None

MAX_CHUNK = 32  # files per task: enough to amortise the IPC, few enough to keep every worker busy
IN_FLIGHT = 2  # chunks queued per worker: decoded pixels waiting for the writer stay bounded


def fit_within(width: int, height: int, max_side: int = 0, short_side: int = 0) -> tuple[int, int]:
    """(width, height) scaled so the longer side is at most `max_side` and the shorter at most `short_side` (0:
    no bound); aspect kept, never enlarged."""
    scale = 1.0
    if max_side:
        scale = min(scale, max_side / max(width, height))
    if short_side:
        scale = min(scale, short_side / min(width, height))
    if scale >= 1:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


@dataclass(frozen=True)
class Sides:
    """How `prepare` bounds each image: the shorter side at most `short`, as ImageNet's 256 for 224-px inputs
    (every square crop of a model's input then comes from the photo's own pixels, not enlarged ones), and/or
    the longer side at most `longer` (a bound on the store's size; a 4:3 photo at a longer side of 256 keeps a
    shorter side of 192, which a 224 crop enlarges). 0: no bound; both 0: each photo at its own size."""

    longer: int = 0
    short: int = 0

    def __post_init__(self) -> None:
        for flag, side in (("--max-side", self.longer), ("--short-side", self.short)):
            if side < 0:
                raise DataError(f"{flag} {side}: expected a side in pixels >= 1 (or 0 for no bound), such as 256")

    def check_for_writing(self) -> None:
        """Refuse a shorter side bounded above the longer: the longer bound caps both, so the shorter one is never
        met, and the store is smaller than the --short-side asked. Checked where a store is written, not where one
        is read (a store from before this check keeps opening)."""
        if self.longer and self.short > self.longer:
            raise DataError(
                f"--short-side {self.short} with --max-side {self.longer}: a shorter side above the longer side's "
                "bound is never reached: expected --short-side at most --max-side (or only one of the two)"
            )

    def target(self, width: int, height: int) -> tuple[int, int]:
        return fit_within(width, height, self.longer, self.short)

    def describe(self) -> str:
        bounds = [f"shorter side <= {self.short}"] * bool(self.short) + [f"longer side <= {self.longer}"] * bool(
            self.longer
        )
        return ", ".join(bounds) or "full size (no bound on either side)"


def decode_for_store(path: Path, sides: Sides) -> tuple[bytes, int, int]:
    """RGB uint8 HWC bytes of one file, within `sides`, and its height and width."""
    from PIL import Image

    try:
        with no_pixel_limit(), Image.open(path) as im:
            check_pixel_count(path, im.height, im.width)  # training's limit: a store holds what training reads
            target = sides.target(*im.size)
            if 2 * target[0] <= im.size[0] and 2 * target[1] <= im.size[1]:
                # JPEG only (a no-op elsewhere): libjpeg decodes at 1/2, 1/4 or 1/8 scale in the DCT,
                # never below `target`; far cheaper than decoding every pixel to throw most away.
                im.draft("RGB", target)
            rgb = pillow_rgb(im)  # the pixels a folder decodes to (folder.decode_rgb), 16-bit grey included
        if rgb.size != target:
            rgb = rgb.resize(target, Image.Resampling.BILINEAR)  # Pillow widens the filter: antialiased
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as e:
        raise decode_error(path, e) from None
    return rgb.tobytes(), rgb.height, rgb.width


@contextmanager
def no_pixel_limit():
    """Pillow's decompression-bomb limit (~179 Mpixel: refused; half that: a warning) lifted while prepare
    opens a file: these are the user's own photos, which training from the folder decodes up to the same 179
    Mpixel (folder.MAX_PIXELS, which decode_for_store checks itself), without a warning from half of it, and the
    folder run itself advises prepare. Restored after, so cnnpar's other uses of Pillow keep the limit."""
    from PIL import Image

    saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def chunk_path(partial: Path, k: int) -> Path:
    """Where a worker leaves chunk `k`'s pixels for the writer: beside the store being written, a `.partial`
    too (never read as a store; cleared with the store's own partial file)."""
    return partial.with_name(f"{partial.name.removesuffix(PARTIAL_SUFFIX)}.chunk{k}{PARTIAL_SUFFIX}")


def decode_chunk_to_file(paths: list[Path], sides: Sides, dest: Path) -> list[tuple[int, int]]:
    """Decode `paths` into the file `dest`, back to back; returns each image's (height, width): a few bytes
    through the pool's pipe, whatever the pixels weigh."""
    sizes = []
    with dest.open("wb") as f:
        for p in paths:
            pixels, h, w = decode_for_store(p, sides)
            f.write(pixels)
            sizes.append((h, w))
    return sizes


def start_worker(parent: int) -> None:
    """Runs first in each decoding worker, so that it ends with prepare however prepare ends."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the fork copied cnnpar's handler: stopping a worker ends it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches every process of the terminal; prepare stops us
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # so does the SIGHUP of a terminal that closed
    # killed with prepare even when prepare is killed outright (kill -9, the OOM killer): no orphans
    end_with_parent(parent, SIGKILL)


class OrderedDecode:
    """Every file's pixels, in order, decoded `workers` processes wide, a bounded window ahead; the workers
    pass pixels in files named after `partial` (`chunk_path`).

    A context manager: entering forks the workers and queues the first chunks, so they exist before
    any thread does (tqdm's monitor; forking a threaded process can deadlock); leaving on an error (a
    worker's, SIGTERM, Ctrl-C) stops the workers at once, never waiting on one that is busy or stuck.
    """

    def __init__(self, files: list[Path], sides: Sides, workers: int, partial: Path) -> None:
        self.files, self.sides, self.workers, self.partial = files, sides, workers, partial
        size = max(1, min(MAX_CHUNK, -(-len(files) // (4 * workers))))
        self.chunks = enumerate(files[i : i + size] for i in range(0, len(files), size))
        self.pool, self.pending, self.processes = None, deque(), []

    def __enter__(self) -> OrderedDecode:
        if self.workers > 1:
            # fork, as Linux's default before Python 3.14: the workers' parent is this process, which
            # start_worker checks (a forkserver would be their parent instead)
            context = multiprocessing.get_context("fork") if sys.platform.startswith("linux") else None
            self.pool = ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=start_worker, initargs=(os.getpid(),)
            )
            try:
                for _ in range(IN_FLIGHT * self.workers):
                    self._submit()
            except BaseException:
                # a fork or pipe the system refused (ulimit -n 16) after other workers were forked: `with` calls no
                # __exit__ for a failed __enter__, and the exit waited for ever on the workers never stopped
                self._kill_started()
                raise
            self.processes = list(self.pool._processes.values())  # no public way to stop them; Python 3.14 adds one
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.pool is None:
            return
        if exc_type is None:
            self.pool.shutdown(wait=True)  # every chunk is done: the workers are idle
            return
        # shutdown(wait=True) waited for the chunks in the workers' hands, for ever when the pool was stuck
        self.pool.shutdown(wait=False, cancel_futures=True)
        for p in self.processes:
            p.terminate()
        for p in self.processes:
            p.join(5)  # gone before the caller removes the chunk files they write

    def _kill_started(self) -> None:
        """Stop the workers of a start that failed part way. SIGKILL: one just forked may not have run start_worker
        yet, and the SIGTERM handler it copied from cnnpar kept it alive past a join (seen under ulimit -n 15)."""
        self.processes = list(self.pool._processes.values())  # shutdown drops them
        self.pool.shutdown(wait=False, cancel_futures=True)
        for p in self.processes:
            p.kill()
        for p in self.processes:
            p.join()

    def _submit(self) -> None:
        k, chunk = next(self.chunks, (0, None))
        if chunk is not None:
            dest = chunk_path(self.partial, k)
            self.pending.append((dest, self.pool.submit(decode_chunk_to_file, chunk, self.sides, dest)))

    def __iter__(self) -> Iterator[tuple[bytes, int, int]]:
        if self.pool is None:
            yield from (decode_for_store(f, self.sides) for f in self.files)
            return
        while self.pending:
            raise_pending_stop()  # a stop whose raise was dropped (errors.pending_stop): no chunk after it
            dest, future = self.pending.popleft()
            sizes = future.result()  # re-raises a worker's DataError here
            pixels = memoryview(dest.read_bytes())
            dest.unlink()
            self._submit()
            pos = 0
            for h, w in sizes:
                yield pixels[pos : pos + 3 * h * w], h, w
                pos += 3 * h * w

    def how_a_worker_ended(self) -> str:
        """How the worker that broke the pool ended, such as "killed by SIGKILL", as far as it is known."""
        codes = [p.exitcode for p in self.processes if p.exitcode]
        # the pool stops the other workers with SIGTERM: the one that ended first is the one with another code
        code = min(codes, key=lambda c: c == -signal.SIGTERM, default=None)
        if code is None:
            return "ended"
        if code > 0:
            return f"exited with status {code}"
        return f"killed by {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"killed by {-code}"


def check_store_out(out: Path, src: Path) -> None:
    """Refuse, before any decoding, an --out that is not a store path: a folder, a name `--data` would not read
    as a store, or an existing file that is not a store (the rename at the end would replace a user's CSV or
    one of the photos without a word), or one the system cannot name (config.path_length_problem)."""
    longest = out.with_name(chunk_path(new_partial_path(out), 99_999).name)  # the longest name made beside it
    too_long = path_length_problem(longest)
    if too_long:
        raise DataError(
            f"--out {out}: too long with the suffix of the files prepare writes first "
            f"({longest.name[len(out.name) :]}): {too_long}"
        )
    if out.is_dir():
        raise DataError(f"--out {out}: is a folder: expected the store file to write, such as {out / src.name}.cnnpar")
    if not out.name.lower().endswith(".cnnpar"):
        raise DataError(
            f"--out {out}: expected a name ending in .cnnpar (what --data reads as a store), such as {out}.cnnpar"
        )
    if out.exists():
        with out.open("rb") as f:
            start = f.read(len(MAGIC))
        # a store whose writer stopped (its header never written) is replaced too: reading it says to re-run prepare
        if start != MAGIC and not header_never_written(start):
            raise DataError(
                f"--out {out}: exists and is not a cnnpar store (starts {start!r}): expected a new file, or a store "
                "to replace; move the file away first"
            )


def decode_workers(asked: int, files: int) -> int:
    """The decoding processes prepare starts for --workers `asked` (-1, auto: one per usable core; 0, as train's
    --workers 0, or 1: none, decoding in this process): at most WORKERS_PER_CORE per usable core, said in a line (the
    pool forks them all at once: --workers 100000 was a fork storm), and no more than there are files."""
    cores = usable_cores()
    limit = WORKERS_PER_CORE * cores
    started = max(1, min(cores if asked < 0 else asked, limit, files))
    if line := worker_cap_line(asked, limit, cores):
        if started < limit:  # fewer images than the cores' cap: the line names the number started, not the cap
            line = f"--workers {asked} capped to {started}: one per image ({files:,} image{'s' * (files != 1)})"
        print(line, flush=True)
    return started


def prepare_store(
    src: str | Path,
    out: str | Path,
    max_side: int = 0,
    workers: int = -1,
    progress: bool = True,
    short_side: int = 0,
    skipped: list[Path] | None = None,
    labels: str | Path = "",
    notes: list[str] | None = None,
) -> dict:
    """Decode the image folder `src` into the store `out`, each image within `max_side` (its longer side) and
    `short_side` (its shorter; `Sides`); returns the store's header. `labels`: a CSV labelling a flat `src`
    (labels_csv.scan_labelled), whose warnings go to `notes`. Images in formats not read go to `skipped`
    where it is given (folder.skipped_note)."""
    from tqdm.auto import tqdm

    src, out = Path(src), Path(out)
    sides = Sides(max_side, short_side)
    sides.check_for_writing()
    check_store_out(out, src)
    labels_csv = labels
    files, labels, splits, classes = scan_images(src, labels_csv, skipped, notes)
    n = len(files)
    photos = folder_sample(files)  # the headers `cnnpar train --data SRC` reads, read the same way
    header = {
        "format": "cnnpar image store",
        "version": VERSION,
        "count": n,
        "max_side": max_side,  # 0: no bound on the longer side
        "short_side": short_side,  # 0: none on the shorter (stores before session 21 lack the key)
        "layout": "HWC",
        "class_names": classes,
        "splits": {"train": n - sum(splits), "val": sum(splits)},
        "source": str(src.resolve()),
        # the input size `cnnpar train --data SRC` picks from the photos themselves, and why: a store's own sizes
        # (all 256x341 after --short-side 256, say) made it pick 256 where the folder's run picked 224
        "source_side": list(pick_side(photos.sizes, photos.sampled)),
        # every sampled photo grey (grey PNGs stored as 3 equal channels): --augment auto does not mirror them, as
        # from the folder (stores before session 34 lack the key: sources._store_grey reads it from their pixels)
        "grey": photos.grey,
        # what the folder held (names, classes, splits): a run from the store says where the folder changed since
        "source_listing": listing_checksum(src, files, labels, splits),
        # the CSV that labelled a flat folder ("" for class folders): the listing is checked against it again
        "source_labels": str(Path(labels_csv).resolve()) if labels_csv else "",
        # files under two names (hard or symbolic links): a hold-out drawn at train time is checked against them
        "same_file_groups": same_file_groups(files),
        "index_bytes": n * INDEX_BYTES_PER_IMAGE,
        # placeholders as long as any real value: the header's length is fixed before the pixels
        "data_start": 10**15,
        "pixel_bytes": 10**19,
        "data_checksum": "0" * 64,
        "index_checksum": "0" * 64,
    }
    header_len = len(encode_header(header))
    header["data_start"] = align(PREFIX.size + header_len + header["index_bytes"])
    offsets, hw = np.zeros(n, np.int64), np.zeros((n, 2), np.int64)
    digest, pos = new_hash(), 0
    partial = new_partial_path(out)
    workers = decode_workers(workers, n)
    images, written, starting_workers = OrderedDecode(files, sides, workers, partial), False, False
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # "x": a file of this writer's own; another prepare to the same OUT writes its own and renames it in turn
        with partial.open("xb") as f:
            hold_partial(f)
            starting_workers = True  # until they run: a fork or a semaphore the system refuses is not a write
            with images:
                starting_workers = False
                # disable=None: a bar only on a terminal, never \r fragments in a log file
                bar = tqdm(
                    total=n, unit="img", desc=f"prepare {src.name}", file=sys.stderr, disable=None if progress else True
                )
                # in the bar's place a line now and then: a photo folder's tens of minutes said nothing in a log
                beat = Heartbeat(f"prepare {src.name}", n, "images", print, bar_left_out(bar, progress))
                f.seek(header["data_start"])  # the pixels first; the prefix, header and index last
                for k, (pixels, h, w) in enumerate(images):
                    f.write(pixels)
                    digest.update(pixels)
                    offsets[k], hw[k] = pos, (h, w)
                    pos += len(pixels)
                    bar.update(1)
                    beat.update(k + 1)
                bar.close()
                header.update(pixel_bytes=pos, data_checksum=digest.hexdigest())
                index = pack_index(offsets, hw[:, 0], hw[:, 1], labels, splits)
                header["index_checksum"] = index_checksum(header, index)
                f.seek(0)
                f.write(PREFIX.pack(MAGIC, VERSION, header_len) + encode_header(header, header_len) + index)
                f.flush()
                os.fsync(f.fileno())
        os.replace(partial, out)
        written = True
        remove_dead_partials_beside(out)
    except BrokenProcessPool:
        raise_pending_stop()  # the group's SIGTERM killed the workers, and its raise here was dropped: the stop
        raise UserError(
            f"{out}: not written: a decoding worker was {images.how_a_worker_ended()} before it finished (the "
            "system's out-of-memory killer does this): expected every worker to finish; run again, with fewer "
            "--workers if memory is short"
        ) from None
    except OSError as e:
        if starting_workers:
            raise UserError(
                f"{src}: could not start {workers} decoding processes ({e.strerror or e}): expected the system to "
                "allow them, or fewer --workers (--workers 1 decodes in this process)"
            ) from None
        where = f" at {e.filename}" if e.filename else ""
        # a worker's, re-raised here, met outside its decode (decode_error says that one), as its imports under
        # ulimit -n 16: no fault of the disk
        if e.errno == errno.EMFILE:
            raise UserError(
                f"{out}: not written: the open-files limit ran out ({e.strerror}{where}): expected {higher_limit()}, "
                "or fewer --workers (--workers 1 decodes in this process)"
            ) from None
        # a full disk, a quota, a read-only or vanished folder: the OS's reason, in one line
        raise UserError(
            f"{out}: cannot write the store ({e.strerror or e}{where}): expected room for it and permission to "
            f"write in {out.parent}"
        ) from None
    finally:
        if not written:  # every way out but success, Ctrl-C and SIGTERM (errors.Terminated) included
            remove_partial(partial)
    fsync_path(out.parent)  # makes the rename itself durable
    return header


def hold_partial(f) -> None:
    """Mark this writer's partial file `f` as live until the writer ends (an flock, dropped by the system however
    the process ends; the decoding workers share it and die with the writer)."""
    if fcntl is not None:
        with contextlib.suppress(OSError):  # a file system without locks: no other prepare will remove this file
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def remove_dead_partials(out: Path) -> None:
    """Remove the partial files (and their chunk files) of prepares to `out` that ended without cleaning up (SIGKILL,
    the out-of-memory killer): those no writer holds (`hold_partial`). The store's refusal of them says to re-run
    prepare; that re-run left them beside the store, as large as the store, without a word."""
    if fcntl is None:
        return
    for path in left_partials(out):
        # chunk files go with their writer's partial; an empty partial may be a writer between its open and its
        # flock (nothing written yet), so it is left, as it costs nothing
        if ".chunk" in path.name.removeprefix(out.name) or not unheld(path, lambda st: st.st_size == 0):
            continue
        with contextlib.suppress(OSError):  # one that cannot be removed is no reason to fail a written store
            remove_partial(path)


# a writer's partial file (`new_partial_path`): the store it was writing, then its own token
PARTIAL_OF = re.compile(r"(?P<out>.+(?i:\.cnnpar))\.[0-9a-f]{8}" + re.escape(PARTIAL_SUFFIX))


def remove_dead_partials_beside(out: Path) -> None:
    """`remove_dead_partials` for `out` and for every other store of its folder that a partial file there was
    writing: with no later prepare to the same OUT, a killed prepare's partial, as large as the pixels it had
    written, stayed for good. Files not named as a prepare names its partials are left alone."""
    named = (PARTIAL_OF.fullmatch(path.name) for path in out.parent.glob("*" + PARTIAL_SUFFIX))
    for name in sorted({out.name} | {m["out"] for m in named if m}):
        remove_dead_partials(out.parent / name)


def remove_partial(partial: Path) -> None:
    """Remove the store's partial file and the chunk files its workers left (`chunk_path`)."""
    pattern = glob.escape(partial.name.removesuffix(PARTIAL_SUFFIX)) + ".chunk*" + PARTIAL_SUFFIX
    for path in [partial, *partial.parent.glob(pattern)]:
        # a clean-up after an error must not hide it: on a read-only file system, unlinking even a file that was
        # never made raises EROFS, not the ENOENT missing_ok covers
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
