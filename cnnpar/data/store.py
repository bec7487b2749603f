"""The prepared image store (`cnnpar prepare`): photos decoded once, kept as raw pixels in one file.

Decoding a JPEG costs a core a few milliseconds; reading the same pixels back costs a memcpy. A
store holds every image of a folder decoded and resized so its shorter side is at most `short_side` (and,
where asked, its longer side at most `max_side`; aspect kept, never enlarged), RGB uint8 in HWC order (what
decoders produce), back to back, so a training run only copies bytes and crops/resizes them on the device
(`store_feed`).

Layout of one file, little-endian:

    PREFIX       magic (8 bytes), format version (uint32), header length (uint32)
    header       JSON, padded with spaces to the header length (count, max_side, short_side, class_names, splits,
                 source, checksums, and `same_file_groups`: lists of image ids that were one file
                 under several names, hard links, so that a hold-out drawn from the store is checked
                 for them; absent in stores written before it, where nothing is known; `grey`: every
                 sampled photo of the folder was a grey file, so --augment auto leaves them unmirrored; absent
                 before session 34 (2026-12-04): read from the pixels, `sources._store_grey`)
    index        offsets int64[n] (byte offset into the pixel area), heights int32[n],
                 widths int32[n], labels int64[n], splits uint8[n] (0 train, 1 val)
    zeros        up to `data_start`, a multiple of 4096 (page-aligned pixels map cleanly)
    pixel area   `pixel_bytes` bytes: image k is 3 * h * w bytes at data_start + offsets[k]

The writer (`store_write`) fills the pixel area first and writes the prefix, header and index last,
into a name of its own, `OUT.<random>.partial` (two runs to one OUT never share a file), then renames it:
a file named OUT is complete or absent. Opening checks the
magic, the version, the size the header declares and a checksum of the header and index, and
refuses anything else in one line. The pixels' own checksum is checked only on request
(`verify_store`, `cnnpar prepare --verify`): a store can be hundreds of GB.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import secrets
import struct
from pathlib import Path

import numpy as np
import torch

from cnnpar.config import NAME_MAX_BYTES
from cnnpar.errors import DataError, brief_repr
from cnnpar.report.heartbeat import Heartbeat, bar_left_out

MAGIC = b"CNNPSTOR"
VERSION = 1
PREFIX = struct.Struct("<8sII")  # magic, version, header length
ALIGN = 4096
INDEX_BYTES_PER_IMAGE = 8 + 4 + 4 + 8 + 1
PARTIAL_SUFFIX = ".partial"
RERUN = "re-run cnnpar prepare"
CHUNK_BYTES = 64 << 20


def default_store_path(folder: str | Path) -> Path:
    """FOLDER.cnnpar beside FOLDER: where `cnnpar prepare` writes unless told otherwise; in the current folder where
    FOLDER's own cannot be written (Kaggle's read-only /kaggle/input: the pasted advice failed there, Permission
    denied). os.access, not a probe file: nothing is tried beside the user's data, and it sees a read-only mount."""
    p = Path(folder)
    p = p.resolve() if p.name in ("", ".", "..") else p
    beside = p.with_name(p.name + ".cnnpar")
    parent = beside.parent
    if not parent.is_dir() or os.access(parent, os.W_OK | os.X_OK):
        return beside
    return Path(beside.name)


def prepare_side(input_size: int) -> int:
    """The shorter side to store photos at for a model input of `input_size`: ~8/7 of it, a multiple
    of 8 (256 for 224, ImageNet's usual pair), so random-resized crops keep resolution to spare."""
    return 8 * -(-input_size // 7)


def prepare_command(
    source: str, input_size: int = 0, model: str = "", train: list[str] | None = None, labels: str = ""
) -> str:
    """`cnnpar prepare` for a photo folder, then `cnnpar train` from the store it writes: the advice
    the doctor and a run from a folder print, pasteable as it stands. `train` replaces the default
    train command (the doctor passes the user's own flags); its --data must be `store_path(source)`."""
    import shlex

    out = str(default_store_path(source))
    if train is None:
        train = ["cnnpar", "train", "--data", out] + (["--model", model] if model else [])
        train += ["--image-size", str(input_size)] if input_size else []
    return f"{shlex.join(prepare_args(source, input_size, labels))} && {shlex.join(train)}"


def prepare_args(source: str, input_size: int = 0, labels: str = "") -> list[str]:
    """`cnnpar prepare` of a photo folder (labelled by the CSV `labels` where given) into
    `default_store_path(source)`, for a model input of `input_size` (0: 224), as a list of arguments."""
    out = str(default_store_path(source))
    labelled = ["--labels", labels] if labels else []
    return ["cnnpar", "prepare", source, *labelled, "--out", out, "--short-side", str(prepare_side(input_size or 224))]


def prepare_then_train(cfg, input_size: int) -> str:
    """`prepare_command` for `cfg`'s photo folder with the user's own run (`cfg`: every flag they gave) from
    the store it writes: the advice a run from a folder and the doctor print. The run's name and resume are
    left out: the pasted command is a new run, not one under a name already taken."""
    import shlex

    from cnnpar.config import command_line

    source = cfg.data.source
    size = {} if cfg.data.image_size else {"image_size": input_size}
    # the store holds the CSV's labels: the run from it names none (load_data refuses --labels beside a store)
    change = {"data": {"source": str(default_store_path(source)), "format": "auto", "labels": "", **size}}
    change["run"] = {"name": "", "resume": ""}
    return prepare_command(source, input_size, train=shlex.split(command_line(cfg, change)), labels=cfg.data.labels)


def new_partial_path(out: Path) -> Path:
    """Where one writer builds `out` before renaming it: a name no other writer to `out` uses, never a store."""
    return out.with_name(f"{out.name}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}")


def left_partials(out: Path) -> list[Path]:
    """Files beside `out` that a cnnpar prepare to `out` left when it did not finish (`OUT.partial` from
    cnnpar before each writer had a name of its own, too)."""
    return sorted(out.parent.glob(glob.escape(out.name) + ".*" + PARTIAL_SUFFIX.lstrip(".")))


def header_never_written(magic: bytes) -> bool:
    """A file whose first bytes are still zeros: the writer fills the prefix and header last, so this is a
    store whose writer stopped (or a renamed `.partial`)."""
    return magic == bytes(len(MAGIC))


def new_hash():
    return hashlib.blake2b(digest_size=32)


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def pack_index(offsets, heights, widths, labels, splits) -> bytes:
    parts = [(offsets, np.int64), (heights, np.int32), (widths, np.int32), (labels, np.int64), (splits, np.uint8)]
    return b"".join(np.ascontiguousarray(a, dtype=np.dtype(t).newbyteorder("<")).tobytes() for a, t in parts)


def unpack_index(buf: bytes, n: int) -> dict[str, np.ndarray]:
    out, pos = {}, 0
    for name, t in (("offsets", "<i8"), ("heights", "<i4"), ("widths", "<i4"), ("labels", "<i8"), ("splits", "u1")):
        dt = np.dtype(t)
        out[name] = np.frombuffer(buf, dtype=dt, count=n, offset=pos).astype(dt.newbyteorder("="))
        pos += n * dt.itemsize
    return out


def index_checksum(header: dict, index: bytes) -> str:
    """blake2b of every header field but this one, and of the index: a damaged or mismatched header
    or index is caught on open, before any pixel is read."""
    fields = {k: v for k, v in header.items() if k != "index_checksum"}
    h = new_hash()
    h.update(json.dumps(fields, sort_keys=True).encode())
    h.update(index)
    return h.hexdigest()


def encode_header(header: dict, length: int | None = None) -> bytes:
    text = json.dumps(header, sort_keys=True).encode()
    return text if length is None else text.ljust(length, b" ")


class StoreFile:
    """An opened, checked store: the header, the index in memory, the pixels mapped on first use.

    Picklable for DataLoader workers: the mapping is dropped and each process maps the file itself.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # the file the header and index were read from: each process maps the pixels itself, later, by path
        self.header, index, self.identity = read_checked(self.path)
        self.count = self.header["count"]
        arrays = unpack_index(index, self.count)
        check_index(self.path, self.header, arrays)
        self.offsets, self.labels, self.splits = arrays["offsets"], arrays["labels"], arrays["splits"]
        self.hw = np.stack([arrays["heights"], arrays["widths"]], 1).astype(np.int64)  # 3*h*w overflows int32
        self.class_names: list[str] = self.header["class_names"]
        self._pixels: np.ndarray | None = None
        self._held = None  # the file the pixels are mapped from, kept open to fstat (`check_unchanged`)
        self._on_device: dict[str, torch.Tensor] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pixels": None, "_held": None, "_on_device": {}}

    @property
    def pixel_bytes(self) -> int:
        return self.header["pixel_bytes"]

    @property
    def pixels(self) -> np.ndarray:
        """The pixel area as a flat uint8 array mapped from the file (copy-on-write: never written)."""
        if self._pixels is None:
            f = self.path.open("rb")
            # A prepare to the same path renames a new store over it (atomically): a worker mapping the path
            # afterwards read the new file's pixels through the old index, and trained on them without a word
            if _file_identity(os.fstat(f.fileno())) != self.identity:
                f.close()
                raise DataError(
                    f"{self.path}: replaced since this run opened it (a cnnpar prepare wrote it again): its index "
                    "no longer matches its pixels; expected the store the run started with: start the run again"
                )
            self._pixels = np.memmap(
                f, dtype=np.uint8, mode="c", offset=self.header["data_start"], shape=(self.pixel_bytes,)
            )
            self._held = f
        return self._pixels

    def check_unchanged(self) -> None:
        """Refuse, in one line, a mapped store written in place since this run opened it (truncated, emptied, copied
        over): reading a page of the mapping past a truncated file's end raises SIGBUS, which killed the process with
        no word, and pixels written over in place were read through the old index. One fstat of the open file: cheap
        beside a batch's copy."""
        if self._held is not None and (line := self.changed_line()):
            raise DataError(line)

    def changed_line(self) -> str | None:
        """The line for this store's file written in place since the run opened it, or None: the mapped file where
        this process holds it, else the file at the path where it is the same file. A store renamed over the path is
        another file; the run's own stays whole and is read on (`pixels` refuses to map the new one)."""
        try:
            st = os.fstat(self._held.fileno()) if self._held is not None else os.stat(self.path)
        except OSError:  # gone from the path: renamed or deleted, the run's open file is whole
            return None
        if (st.st_dev, st.st_ino) != self.identity[:2] or _file_identity(st) == self.identity:
            return None
        declared = self.header["data_start"] + self.pixel_bytes
        how = "truncated" if st.st_size < declared else "written over in place"
        return (
            f"{self.path}: changed while this run read it ({how}: {st.st_size:,} bytes, {declared:,} when the run "
            "opened it): expected the store unchanged until the run ends"
        )

    def tail_padding(self) -> int:
        """Bytes after the last image that let `resized_crops_flat` read whole row windows in place."""
        return 3 * (2 * int(self.hw[:, 1].max(initial=1)) + 8)  # the widest row: a store's longer side may be unbound

    def is_on(self, device: torch.device) -> bool:
        return str(device) in self._on_device

    def on_device(self, device: torch.device) -> torch.Tensor:
        """The whole pixel area (plus tail padding) as one tensor on `device`, made once per process
        and shared by the train and validation loaders."""
        key = str(device)
        if key not in self._on_device:
            n = self.pixel_bytes
            buf = torch.empty(n + self.tail_padding(), dtype=torch.uint8, device=device)
            buf[n:].zero_()
            pixels = self.pixels
            for a in range(0, n, CHUNK_BYTES):  # bounded host staging for stores larger than RAM
                b = min(n, a + CHUNK_BYTES)
                self.check_unchanged()  # a store of tens of GB copies for a minute: truncated meanwhile, SIGBUS
                buf[a:b].copy_(torch.from_numpy(np.asarray(pixels[a:b])))
            self._on_device[key] = buf
        return self._on_device[key]


def _file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells one file at a path from another renamed over it: device, inode, size and modification time."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _refuse(path: Path, what: str) -> DataError:
    return DataError(f"{path}: {what}: {RERUN}")


def read_checked(path: Path) -> tuple[dict, bytes, tuple[int, int, int, int]]:
    """The header, the raw index and the `_file_identity` of the store at `path`, or a one-line DataError saying why
    not. All three from one open file: a prepare renaming a new store over the path in between made a stat by path
    name the new file, whose pixels the old index then read without a word."""
    if path.name.endswith(PARTIAL_SUFFIX):
        raise _refuse(path, "half-written by a cnnpar prepare that did not finish (a .partial file is never read)")
    if not path.is_file():
        left = left_partials(path)
        if left:
            why = f"no such file; {left[0].name} beside it was left by a cnnpar prepare that did not finish"
            raise _refuse(path, why)
        raise DataError(f"{path}: no such file: make it with cnnpar prepare FOLDER --out {path}")
    with path.open("rb") as f:
        st = os.fstat(f.fileno())
        size = st.st_size
        prefix = f.read(PREFIX.size)
        if len(prefix) < PREFIX.size:
            raise _refuse(path, f"{size} bytes, too short to be a cnnpar store")
        magic, version, header_len = PREFIX.unpack(prefix)
        if header_never_written(magic):
            raise _refuse(path, "incomplete: the header was never written (a cnnpar prepare that did not finish)")
        if magic != MAGIC:
            raise DataError(
                f"{path}: not a cnnpar store (starts {magic!r}, expected {MAGIC!r}): make one with cnnpar prepare"
            )
        if version != VERSION:
            raise _refuse(path, f"store format version {version}, this cnnpar reads version {VERSION}")
        if header_len > size - PREFIX.size:  # read no more than the file holds: a damaged length names gigabytes
            raise _refuse(path, f"header length {header_len:,} bytes, past the end of its {size:,}-byte file")
        try:
            header = json.loads(f.read(header_len))
        except (ValueError, RecursionError) as e:  # RecursionError: brackets nested deeper than json parses
            raise _refuse(path, f"unreadable header ({type(e).__name__}: {e})") from None
        check_sizes(path, header, header_len)
        declared = header["data_start"] + header["pixel_bytes"]
        if size != declared:
            raise _refuse(path, f"truncated or damaged: {size:,} bytes, its header declares {declared:,}")
        index = f.read(header["index_bytes"])
    if len(index) != header["index_bytes"] or index_checksum(header, index) != header.get("index_checksum"):
        raise _refuse(path, "header/index checksum mismatch (the file is damaged)")
    return header, index, _file_identity(st)


def check_sizes(path: Path, header, header_len: int) -> None:
    """The header's counts and sizes, checked against each other and the file's size before any is used to read or
    allocate: the header and index checksum proves only that they were written together, and a file handed on by
    someone else can hold any numbers (a negative index length read the whole store into memory)."""
    if not isinstance(header, dict):
        raise _refuse(path, f"unreadable header (a JSON {type(header).__name__}, expected an object)")
    for key in ("count", "index_bytes", "data_start", "pixel_bytes"):
        value = header.get(key)
        if type(value) is not int or value < 0:  # bool is an int to isinstance
            raise _refuse(path, f"header field {key} is {brief_repr(value)}: expected a whole number >= 0")
    count, index_bytes, data_start = header["count"], header["index_bytes"], header["data_start"]
    if count == 0:  # prepare refuses a folder without images: a run took the median side of none (a NaN traceback)
        raise _refuse(path, "header field count is 0: expected 1 or more images")
    if index_bytes != count * INDEX_BYTES_PER_IMAGE:
        expected = f"{count * INDEX_BYTES_PER_IMAGE:,} for count {count:,}"
        raise _refuse(path, f"header field index_bytes is {index_bytes:,}: expected {expected}")
    if data_start < PREFIX.size + header_len + index_bytes:
        raise _refuse(path, f"header field data_start is {data_start:,}: expected the index's end or past it")
    names = header.get("class_names")
    if not isinstance(names, list) or not names or not all(isinstance(c, str) for c in names):
        raise _refuse(path, f"header field class_names is {brief_repr(names)}: expected a list of names (strings)")
    # prepare writes a store only from a folder, whose class names are its folders' names: never empty, '/' or NUL,
    # at most NAME_MAX bytes (so characters). One past that was not prepared by cnnpar: a 10 MB name went whole into
    # every line naming classes. A newline is kept: a folder's name can hold one, and predict's CSV quotes it.
    for k, name in enumerate(names):
        if not name or "/" in name or "\0" in name or len(name) > NAME_MAX_BYTES:
            shown = brief_repr(name) + (f" ({len(name):,} characters)" if len(name) > 40 else "")
            raise _refuse(path, f"header field class_names[{k}] is {shown}: expected a class folder's name")
    if not isinstance(header.get("data_checksum"), str):
        raise _refuse(
            path, f"header field data_checksum is {brief_repr(header.get('data_checksum'))}: expected a string"
        )


def check_index(path: Path, header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Every image of the index within the pixel area, its label a class of the header and its split train or val:
    an image past the end was read as a short slice (a traceback), one of 2**31 rows allocated terabytes, and on the
    device an offset past the pixel area reads another tensor's memory."""
    n_bytes, n_classes = header["pixel_bytes"], len(header["class_names"])
    off, h, w = arrays["offsets"], arrays["heights"].astype(np.int64), arrays["widths"].astype(np.int64)
    inside = (h >= 1) & (w >= 1) & (off >= 0) & (off <= n_bytes)
    # compared by division: 3 * h * w of two damaged int32 sides overflows int64
    inside[inside] &= w[inside] <= (n_bytes - off[inside]) // (3 * h[inside])
    labels, splits = arrays["labels"], arrays["splits"]
    checks = (
        (inside, lambda k: f"{h[k]}x{w[k]} pixels at offset {off[k]:,}", f"within pixel_bytes {n_bytes:,}"),
        ((labels >= 0) & (labels < n_classes), lambda k: f"label {labels[k]}", f"0 to {n_classes - 1} (its classes)"),
        (splits <= 1, lambda k: f"split {splits[k]}", "0 (train) or 1 (val)"),
    )
    for ok, shown, expected in checks:
        if not ok.all():
            k = int(np.argmin(ok))
            many = f" ({np.count_nonzero(~ok):,} images alike)" if np.count_nonzero(~ok) > 1 else ""
            raise _refuse(path, f"index: image {k} has {shown(k)}{many}: expected {expected}")


def verify_store(path: str | Path, progress: bool = True) -> dict:
    """Check the pixel area against the data checksum taken while it was written; returns the header."""
    from tqdm.auto import tqdm

    store = StoreFile(path)
    h = new_hash()
    pixels = store.pixels
    # disable=None: a bar only on a terminal, never \r fragments in a log file
    bar = tqdm(total=store.pixel_bytes, unit="B", unit_scale=True, desc="verify", disable=None if progress else True)
    # in the bar's place a line now and then: a store of tens of GB is read for minutes
    beat = Heartbeat(f"verify {store.path.name}", store.pixel_bytes >> 20, "MiB", print, bar_left_out(bar, progress))
    with bar:
        for a in range(0, store.pixel_bytes, CHUNK_BYTES):
            chunk = pixels[a : a + CHUNK_BYTES]
            h.update(memoryview(chunk))
            bar.update(len(chunk))
            beat.update((a + len(chunk)) >> 20)
    if h.hexdigest() != store.header["data_checksum"]:
        raise _refuse(store.path, "pixel data checksum mismatch (the file is damaged)")
    return store.header
