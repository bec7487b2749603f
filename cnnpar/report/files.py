"""Atomic writes: a reader (or a resumed run) never sees a half-written file."""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import glob
import itertools
import json
import math
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from cnnpar.errors import UserError, first_line

try:
    import fcntl
except ImportError:  # Windows has no flock: a killed writer's temp file stays there (remove_orphan_temps aside)
    fcntl = None


def check_out_folder(path: str | Path, flag: str) -> None:
    """Refuse, before any measuring, an output folder that is a file or would lie under one, or one where no file
    can be made (itself, or the nearest folder above it that is there: permissions, a read-only file system): bench,
    doctor and profile measured for minutes and then ended in a FileExistsError, NotADirectoryError or read-only
    traceback; tune ran its whole start trial first."""
    from cnnpar.config import NAME_MAX_BYTES, path_length_problem

    too_long = path_length_problem(path, room=1 + NAME_MAX_BYTES)  # "/" and a file's name inside it
    if too_long:
        raise UserError(f"{flag} {path}: {too_long}")
    given = Path(path)
    place = next((place for place in (given, *given.parents) if place.exists()), Path("."))
    if not place.is_dir():
        where = "is a file" if place == given else f"lies under {place}, a file"
        raise UserError(f"{flag} {path}: {where}: expected a folder (or a path where one can be made)")
    why = unwritable(place)
    if why:
        raise UserError(f"{flag} {path}: cannot be written ({why}): expected a folder where files can be made")


def unwritable(folder: Path, name: str = "cnnpar-probe") -> str:
    """Why no file can be created in `folder` (the system's reason: permissions, a read-only or virtual file system),
    or "" where one can. Tried by creating and removing a temporary file `name` there, as the writes themselves will:
    permission bits alone do not say (root, a read-only mount)."""
    try:
        tmp, fd = _create_temp(folder, name)
    except OSError as e:
        return e.strerror or str(e)
    tmp.unlink(missing_ok=True)
    if fd >= 0:
        os.close(fd)
    return ""


def write_failure(e: BaseException, folder: str | Path) -> str:
    """Why a write failed, with what the disk and the process's file size limit allow: "No space left on device"
    (or torch's stream error, which names neither) alone does not say which of them ran out, nor how far."""
    facts = [e.strerror if isinstance(e, OSError) and e.strerror else first_line(e)]
    try:
        facts.append(f"{shutil.disk_usage(folder).free / 2**20:,.0f} MB free on its disk")
    except OSError:
        pass
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            facts.append(f"a file size limit (ulimit -f) of {limit / 2**20:,.1f} MB")
    except (ImportError, OSError, ValueError):  # no resource module off Unix
        pass
    return "; ".join(facts)


@contextlib.contextmanager
def write_errors_explained(path: str | Path, expected: str | Callable[[OSError], str]) -> Iterator[None]:
    """An OSError in the block (a full disk, a read-only folder, a file size limit) as one line naming `path`, why
    and what the user can do (`expected`, or what `expected(the error)` says: read only where the write fails), a
    UserError: the commands' result files (run records, reports, tables) are written after minutes of work, and a
    bare traceback there hid what had been saved."""

    try:
        yield
    except OSError as e:
        said = expected(e) if callable(expected) else expected
        raise UserError(f"{path}: cannot be written ({write_failure(e, Path(path).parent)}): {said}") from None


def _stamped_names(parent: str | Path, prefix: str) -> Iterator[Path]:
    """parent/<prefix>-YYYYMMDD-HHMMSS (local time now), then the same with -2, -3, ... after the time."""
    stamp = f"{prefix}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    yield Path(parent) / stamp
    for n in itertools.count(2):
        yield Path(parent) / f"{stamp}-{n}"


def stamped_name(parent: str | Path, prefix: str) -> Path:
    """The first of `_stamped_names` not there; makes nothing. For train's run folder alone, named when a Trainer is
    built (the doctor's and the bench's are never made) and made by `stamped_folder` at its claim (engine/rundir.py)."""
    return next(folder for folder in _stamped_names(parent, prefix) if not folder.exists())


def stamped_folder(parent: str | Path, prefix: str) -> Path:
    """A new folder parent/<prefix>-YYYYMMDD-HHMMSS, made here (with its missing parents): the default folder of
    every command that writes one (doctor's and profile's reports, bench's tables, tune's config), so each run keeps
    its own results. One already there gets -2, -3, ... after the time. Made by a mkdir that fails where the folder
    is there, so the name is this command's alone: two benches started within the same second each picked the first
    free name, made it only when they wrote their results, and wrote into one folder."""
    Path(parent).mkdir(parents=True, exist_ok=True)
    for folder in _stamped_names(parent, prefix):
        with contextlib.suppress(FileExistsError):  # taken, by a command started within the same second: the next
            folder.mkdir()
            return folder
    raise AssertionError("unreachable: _stamped_names never ends")


def results_in(folder: str | Path, patterns: Iterable[str]) -> list[Path]:
    """The files in `folder` that match `patterns` (names, or glob patterns such as trace_rank*.json): the results
    of a command's earlier run there."""
    return [path for pattern in patterns for path in sorted(Path(folder).glob(pattern))]


def refuse_earlier_results(
    command: str, flag: str, given: str | Path, results: Iterable[Path], instead: str = "a new or empty folder"
) -> None:
    """Refuse, before any measuring, an output place the user named (`flag` `given`) that already holds `results`
    of an earlier run (those of them that are there): the new files went in over the old, or beside them (a new
    ladder.csv beside an older bench's ddp.csv), without a word. One rule for bench, doctor, profile and tune, as
    train refuses a --name that holds a run; their default folders are new each time (`stamped_folder`)."""

    found = [path.name for path in results if path.exists()]
    if found:
        raise UserError(
            f"{command} {flag} {given}: already holds an earlier {command}'s results ({', '.join(found)}): expected "
            f"{instead}, or no {flag} (a new folder under --out-dir for each run)"
        )


def check_output_folder(
    command: str, flag: str, given: str | Path, out_dir: str | Path, results: Iterable[str]
) -> None:
    """Before any measuring, where a command's results will go: the folder its `flag` names (`given`: one that is a
    file, or lies under one, or holds an earlier run's `results`, names or glob patterns, is refused), or else its
    default, a new folder under --out-dir (`out_dir`: refused where it is a file, or lies under one)."""
    if given:
        check_out_folder(given, f"{command} {flag}")
        refuse_earlier_results(command, flag, given, results_in(given, results))
    else:
        check_out_folder(out_dir, "--out-dir")


def check_out_file(path: str | Path, flag: str) -> None:
    """Refuse, before the work, an output file that cannot be made: one under a file, or in a folder (or under the
    nearest one there is, for folders still to be made) where no file can be created (permissions, a read-only or
    virtual file system: `unwritable`). predict ran over every image, then ended in a traceback at its write."""

    refuse_unnameable_out_file(path, flag)
    given = Path(path)
    folder = next((place for place in given.parents if place.exists()), Path("."))
    if not folder.is_dir():
        raise UserError(f"{flag} {path}: lies under {folder}, a file: expected a path in a folder")
    why = unwritable(folder, given.name)
    if why:
        raise UserError(
            f"{flag} {path}: cannot be written ({why}): expected a path in a folder where files can be made"
        )


def refuse_unnameable_out_file(path: str | Path, flag: str) -> None:
    """Refuse an output file the system cannot name (config.path_length_problem), counted with the temporary name
    it is written under first (`_create_temp`): the first look at it ended in an OSError traceback."""
    from cnnpar.config import path_length_problem

    temp = Path(path).with_name(f".{Path(path).name}.00000000.tmp")
    too_long = path_length_problem(temp)
    if too_long:
        raise UserError(f"{flag} {path}: too long with the temporary name it is written under first: {too_long}")


def _create_temp(folder: Path, name: str) -> tuple[Path, int]:
    """A new empty file in `folder`, created with mode 0o666 so the kernel applies the umask, and an open
    descriptor holding an flock on it while it is written: the mark of a live writer (`_dead_temp`).

    Not tempfile.mkstemp: it creates 0o600 whatever the umask says, and the rename keeps that
    mode, so every CSV, checkpoint and submission came out readable by its owner alone. Asking
    the kernel for 0o666 gives exactly what `open(path, "w")` would, without reading the umask
    (os.umask can only be read by setting it, which races with other threads creating files).
    """
    for _ in range(100):
        tmp = folder / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            if fcntl is None:  # no flock (Windows): its temps are never taken for dead
                raise OSError
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # nothing to hold: closed now, since Windows renames no file that is still open
            os.close(fd)
            fd = -1
        return tmp, fd
    raise FileExistsError(f"no free temporary name for {folder / name}")


def remove_orphan_temps(path: str | Path) -> None:
    """Remove the temp files `atomic_write` left beside `path` when a SIGKILL cut a write short (its own
    clean-up never ran). Only for a file no other process is writing: a run folder its run holds."""
    path = Path(path)
    for orphan in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        orphan.unlink(missing_ok=True)


# An unlocked temp written to this recently may still be a live writer's: one between its create and its flock
# (microseconds apart), or one on another machine whose flock this one cannot see (NFS mounted with local locks).
QUIET_S = 60.0


def unheld(path: Path, too_soon: Callable[[os.stat_result], bool]) -> bool:
    """True where no live writer holds `path`'s flock, unless `too_soon(its stat)` says it may still be a writer's
    before it took the lock. False where the file system has no locks, and for a file gone or another user's. The one
    test of a dead writer's file: `atomic_write`'s temps here, `cnnpar prepare`'s partial stores (data/store_write)."""
    if fcntl is None:
        return False
    try:
        # for writing: NFS emulates flock with byte-range locks, whose exclusive kind needs a writable file
        fd = os.open(path, os.O_RDWR)
    except OSError:  # gone already, or another user's
        return False
    try:
        if too_soon(os.fstat(fd)):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # held (BlockingIOError), or no locks on this file system
        return False
    finally:
        os.close(fd)


def _dead_temp(path: Path) -> bool:
    """True where no live writer holds `path`'s flock (`_create_temp`) and nothing has written to it for QUIET_S
    seconds: its writer was killed mid-write. False where the file system has no locks."""
    return unheld(path, lambda st: time.time() - st.st_mtime < QUIET_S)


def remove_dead_temps(path: str | Path) -> None:
    """Remove the temp files of writes of `path` whose writer died (SIGKILL, the OOM killer) before its own clean-up
    ran; a live writer's, which it holds locked, stay. Every atomic write does this, so a killed predict, tune or
    bench leaves no hidden file for good: only run folders had it (remove_orphan_temps)."""
    if fcntl is None:
        return
    path = Path(path)
    for temp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        if _dead_temp(temp):
            temp.unlink(missing_ok=True)


# Whether os.open opens a folder (Linux, macOS: the systems with O_DIRECTORY). Windows opens none (EACCES), and its
# fsync flushes only a file opened for writing (EBADF): every atomic write, so every run's config.toml, failed there.
FOLDERS_OPEN = hasattr(os, "O_DIRECTORY")


def fsync_path(path: Path) -> None:
    """Flush a file's data, or a folder's entries (what makes a rename durable), to the disk. On Windows a folder's
    are left to the file system (NTFS journals its renames), and a file is opened for writing to be flushed."""
    if not FOLDERS_OPEN and path.is_dir():
        return
    fd = os.open(path, os.O_RDONLY if FOLDERS_OPEN else os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp_path) for a temp file in the same folder, then rename it over `path`.

    The file is fsynced before the rename and the folder after it: without the first, a crash
    soon after can leave `path` renamed but empty; without the second, the rename itself can be lost.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, fd = _create_temp(path.parent, path.name)
    try:
        write(tmp)
        fsync_path(tmp)
        os.replace(tmp, path)  # atomic on POSIX within one file system
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if fd >= 0:
            os.close(fd)  # after the unlink: a temp is never unlocked while it is there, so never taken for dead
    fsync_path(path.parent)
    with contextlib.suppress(OSError):  # what a killed earlier writer left: no reason to fail this write
        remove_dead_temps(path)


# cnnpar's files are UTF-8 whatever the locale: under LC_ALL=C (PYTHONUTF8=0) open() defaulted to ASCII, and a class
# named café stopped predict's CSV with a traceback. surrogateescape writes a name that is not UTF-8 (a Latin-1
# folder caf\xe9, read with its byte kept as a lone surrogate) as the bytes it has on disk, and reads them back so.
TEXT = {"encoding": "utf-8", "errors": "surrogateescape"}


def utf8_text(text: str) -> bool:
    """Whether `text` encodes as strict UTF-8: not where it holds lone surrogates (a name that is not UTF-8 on disk, or
    any non-ASCII name read under a locale that is not UTF-8), which a TOML file or torch's mmap cannot take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def write_text_atomic(path: str | Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text, **TEXT))


def write_text_first(path: str | Path, text: str) -> bool:
    """`text` written whole to `path` (a reader never sees half of it, as with write_text_atomic) unless `path` is
    there already: of several processes writing it at once the first one's stays, where a rename lets the last one's
    replace it. False where `path` was there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, fd = _create_temp(path.parent, path.name)
    try:
        tmp.write_text(text, **TEXT)
        fsync_path(tmp)
        try:
            os.link(tmp, path)  # atomic, and refused where the name is taken
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: whole, and first unless another writer is just as quick
            if path.exists():
                return False
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # the link's second name, or a write cut short
        if fd >= 0:
            os.close(fd)
    fsync_path(path.parent)
    return True


def finite_json(obj: Any) -> Any:
    """`obj` with every float that is not finite (a loss that overflowed, an infinite budget, a rate of nothing over
    no time) as None, in the dicts, lists and tuples it holds: json.dumps writes those as NaN and Infinity, which no
    JSON reader but Python's takes (jq, JavaScript's JSON.parse, a CI script's). null is what JavaScript's own
    JSON.stringify writes for them."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {key: finite_json(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(value) for value in obj]
    return obj


def write_json_atomic(path: str | Path, obj: Any, strict: bool = True) -> None:
    """`obj` as indented JSON with sorted keys; `strict`: every value that is not a finite number as null
    (`finite_json`), so that any JSON reader takes the file. `strict=False` only for a file between cnnpar's own
    processes (json.loads reads NaN back), where null would turn a measured nan into a missing value."""
    if strict:
        obj = finite_json(obj)
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str, allow_nan=not strict) + "\n")


def write_csv_atomic(path: str | Path, rows: list[dict], columns: list[str] | None = None) -> None:
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))

    def write(p: Path) -> None:
        with p.open("w", newline="", **TEXT) as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)

    atomic_write(path, write)


def read_csv(path: str | Path) -> list[dict[str, str]]:
    with Path(path).open(newline="", **TEXT) as f:
        return list(csv.DictReader(f))


@contextlib.contextmanager
def removed_on_failure(folder: str | Path, when: Callable[[BaseException], bool] = lambda e: True) -> Iterator[Path]:
    """Make `folder` (and its missing parents) for the block; if the block raises an error that `when`
    accepts, remove the folders this made, with what they hold: a command that failed (bad data at the
    first batch) leaves no empty or partial report folder behind. Folders that were there before are
    left as they were, and a parent this made is removed only while empty: another command may have
    made its own folder there meanwhile (two runs started at once under a new runs/)."""
    folder = Path(folder)
    made = _missing(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _made_removed_on_failure(folder, made, when):
        yield folder


# hidden: the mark of the command writing a given output folder; not a run folder's .cnnpar.lock, which an output
# folder given inside a run folder would otherwise take (and remove) from its run
CLAIM_NAME = ".cnnpar-output.lock"


class OutputInUse(UserError):
    """Another live command holds the output a command was given (`output_held`): the clean-ups that remove what a
    failed command wrote leave it alone on this refusal, as the files there are the other command's."""


def holder_pid(fd: int) -> str:
    """The pid a holder wrote into its claim file (`output_held`, rundir's run claim), or "" where none is there or
    it names no live process: the flock says that the claim is held, the pid only who holds it, and a file a killed
    holder wrote may be held for an instant by a check that writes nothing (rundir.refuse_a_live_run)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).decode().strip())
        with contextlib.suppress(PermissionError):  # another user's live process
            os.kill(pid, 0)
        return str(pid)
    return ""


def held_by(fd: int) -> str | None:
    """Take the exclusive flock on the claim file `fd` without waiting: None where this process holds it now, else
    the holder's pid (`holder_pid`, "" where unknown), `fd` closed. Any other OSError (a file system without locks)
    is the caller's to judge, `fd` still open."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = holder_pid(fd)
        os.close(fd)
        return pid
    return None


def note_holder(fd: int) -> None:
    """Write this process's pid into the claim file it holds, for a refused command to name (`holder_pid`)."""
    with contextlib.suppress(OSError):  # a name in a message, no reason to fail the command
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


@contextlib.contextmanager
def output_held(claim: Path, said: str) -> Iterator[None]:
    """Hold an flock on the file `claim` for the block: the mark that a live command writes the output `said` names.
    Another command given the same output at the same time checked it before either wrote (nothing there), then
    both wrote into it, one's files over the other's (or one's failure removed the other's results): refused now,
    with OutputInUse naming the holder's pid. The flock goes with the process however it ends; the file goes with
    the block, unless a kill ends it first, when the next command takes it over (an unheld flock is no claim)."""
    fd = _claimed(claim, said)
    try:
        yield
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                claim.unlink()  # while still held: no command can hold the file that goes
            os.close(fd)


def _claimed(claim: Path, said: str) -> int | None:
    """`output_held`'s descriptor holding the flock on `claim`, with this process's pid in it; None where nothing can
    be held (no flock on this system or file system, a place where nothing can be made: refused by the command's
    output checks, or failing where it writes)."""
    if fcntl is None:  # no flock (Windows): outputs go unclaimed, as they always did
        return None
    while True:
        try:
            fd = os.open(claim, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return None
        try:
            pid = held_by(fd)
        except OSError:  # a file system without locks: unclaimed, and no file left there for nothing
            os.close(fd)
            with contextlib.suppress(OSError):
                claim.unlink()
            return None
        if pid is not None:
            holder = f"pid {pid}" if pid else "another process"
            raise OutputInUse(
                f"{said}: another cnnpar command ({holder}) is writing there now: expected it to end first, or "
                "another output"
            )
        # a holder that ended removes its file (output_held) after this open and before this flock: the flock is
        # then on a file no later command finds, so it is taken again on the file there now
        with contextlib.suppress(OSError):
            if os.stat(claim).st_ino == os.fstat(fd).st_ino:
                note_holder(fd)
                return fd
        os.close(fd)


@contextlib.contextmanager
def output_folder(
    given: str | Path,
    parent: str | Path,
    prefix: str,
    keep: Callable[[Path], bool] = lambda folder: False,
    results: Iterable[str] = (),
    claim: str = CLAIM_NAME,
    said: str = "",
) -> Iterator[Path]:
    """The folder a command writes its results into, for the block: `given` (its flag's, checked beforehand with
    `refuse_earlier_results`, and held for the block by the file `claim` in it: `output_held`, whose refusal names it as
    `said`, the folder itself by default), or else a new `stamped_folder(parent, prefix)`. If the block raises, the
    folders made for it are removed as `removed_on_failure` removes them, unless `keep(folder)` (it holds results worth
    keeping: a stopped bench's rows so far). A `given` folder that was there before stays; the `results` (names or glob
    patterns) the block wrote in it are removed instead: refuse_earlier_results found none there before, and a report
    cut short (a full disk) made a re-run into the same folder refused as an earlier run's."""
    # (folder: bound below, before the block runs) a refusal leaves what is there, the holder's
    when = lambda e: not isinstance(e, OutputInUse) and not keep(folder)  # noqa: E731
    if given:
        folder = Path(given)
        try:
            with removed_on_failure(folder, when), output_held(folder / claim, said or str(folder)):
                yield folder
        except BaseException as e:
            if when(e):
                for path in results_in(folder, results):  # none where the folder itself was made and removed
                    with contextlib.suppress(OSError):
                        path.unlink()
            raise
        return
    made = _missing(Path(parent))
    folder = stamped_folder(parent, prefix)
    with _made_removed_on_failure(folder, [*made, folder], when):
        yield folder


@contextlib.contextmanager
def stamped_folder_removed_on_failure(
    parent: str | Path, prefix: str, when: Callable[[BaseException], bool]
) -> Iterator[Path]:
    """A new `stamped_folder(parent, prefix)` for the block, removed with the parents it made where the block raises
    an error that `when` accepts, as `removed_on_failure` removes its folder."""
    made = _missing(Path(parent))
    folder = stamped_folder(parent, prefix)
    with _made_removed_on_failure(folder, [*made, folder], when):
        yield folder


def _missing(folder: Path) -> list[Path]:
    """`folder` and its parents that are not there, outermost first: what making it makes."""
    return [d for d in (*reversed(folder.parents), folder) if not d.exists()]


@contextlib.contextmanager
def _made_removed_on_failure(folder: Path, made: list[Path], when: Callable[[BaseException], bool]) -> Iterator[None]:
    """`removed_on_failure`'s clean-up, of `made` (outermost first, ending with `folder` where it was made)."""
    try:
        yield
    except BaseException as e:
        if made and when(e):
            shutil.rmtree(folder, ignore_errors=True)  # the report folder, with what the command wrote into it
            for parent in reversed(made[:-1]):  # innermost first; another command may have written there since
                with contextlib.suppress(OSError):
                    parent.rmdir()  # only while empty
        raise
