"""Kaggle-style CSV: a `label` column, an optional `id` or `ImageId`, and pixel columns (`pixel0..pixelN`), one
image per row.

The fast path parses with pyarrow straight into uint8 columns (42,000 x 785 is ~33 MB in memory).
Any parse or conversion failure falls back to a slow row-by-row scan whose only job is to name
the first bad line and what was expected there; good files never pay for it.
"""

from __future__ import annotations

import csv
import gzip
import math
import re
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from cnnpar.config import parse_shape
from cnnpar.data.arrays import check_label_range
from cnnpar.data.store import MAGIC as STORE_MAGIC
from cnnpar.errors import DataError

LABEL = "label"
# Kaggle's row identifiers (Kannada MNIST's test.csv has id, Digit Recognizer's submission ImageId): never a pixel
ID_NAMES = ("id", "imageid")
# How pixel columns are named: Kaggle's pixel0, Fashion-MNIST's pixel1, 1x1..28x28, bare numbers. Not a file
# name, pandas' unnamed index ("" or "Unnamed: 0") or a misspelt label: those are named when they break a read.
PIXEL_NAME = re.compile(r"[A-Za-z_]*[0-9][0-9A-Za-z_]*")
GZIP_MAGIC = b"\x1f\x8b"
SNIFF_BYTES = 4096
# the csv module's default field limit (131,072 characters) stopped a wide semicolon-separated header, or a binary
# file read as CSV, in a traceback; raised for the process (it guards nothing cnnpar reads), never lowered
FIELD_LIMIT = 2**31 - 1


class PixelCountError(DataError):
    """The pixel columns make no image of the shape given or inferred; `n_pixels` lets predict say it against
    the checkpoint's own input shape."""

    def __init__(self, message: str, n_pixels: int) -> None:
        super().__init__(message)
        self.n_pixels = n_pixels

    def __reduce__(self):  # as errors.Diverged: a pickled copy keeps the count
        return type(self), (str(self), self.n_pixels)


def _layout(require_label: bool) -> str:
    label = "a label column" if require_label else "an optional label column"
    return f"{label}, an optional id or ImageId column and pixel columns pixel0, pixel1, ..."


def _sniff_gzip(path: Path) -> bool:
    """Whether `path` is gzip-compressed (read through gzip, as pyarrow reads a .csv.gz); DataError where its first
    bytes say it is no CSV text at all (a zip, an .npz, a store, UTF-16, binary), which the messages further on
    printed as column names, NUL bytes and all."""
    try:
        with path.open("rb") as f:
            head = f.read(SNIFF_BYTES)
        compressed = head.startswith(GZIP_MAGIC)
        if compressed:
            with gzip.open(path, "rb") as f:
                head = f.read(SNIFF_BYTES)
    except OSError as e:  # gzip.BadGzipFile (an OSError): cut short or damaged
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    gz = " (inside its gzip compression)" if compressed else ""
    if head.startswith(b"PK\x03\x04"):
        raise DataError(
            f"{path}: a zip archive{gz} (an .npz, or a zipped CSV), not CSV text: expected a CSV file (an .npz is "
            "read when named .npz or with --format npz; unzip a zipped CSV)"
        )
    if head.startswith(STORE_MAGIC):
        raise DataError(f"{path}: a .cnnpar store{gz}, not CSV text: expected a CSV file (name a store .cnnpar)")
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise DataError(
            f'{path}: UTF-16 text{gz} (Excel\'s "Unicode Text"): expected a UTF-8 CSV (save as "CSV UTF-8", or '
            "iconv -f UTF-16 -t UTF-8)"
        )
    # control bytes (NUL and the like; not tab, CR or LF) in the header line: no text editor's, nor a spreadsheet's;
    # nor a NUL anywhere in what was read (a PNG's first "line", "\x89PNG\r", holds none: its NULs come after)
    if re.search(rb"[\x00-\x08\x0e-\x1f]", head.split(b"\n", 1)[0]) or b"\x00" in head:
        raise DataError(
            f"{path}: control bytes in its first {len(head):,} bytes{gz}: a binary file (an image?), not CSV text: "
            "expected a header line label,pixel0,pixel1,..."
        )
    return compressed


def _open_text(path: Path, compressed: bool):
    # utf-8-sig: Excel's "CSV UTF-8" starts with a BOM, which would stick to the first name
    if compressed:
        return gzip.open(path, "rt", newline="", encoding="utf-8-sig", errors="replace")
    return path.open(newline="", encoding="utf-8-sig", errors="replace")


def _header(path: Path, compressed: bool = False) -> list[str]:
    try:
        with _open_text(path, compressed) as f:
            first = f.readline()
            more = not first.strip() and any(line.strip() for line in f)
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    if more:  # pyarrow skips blank lines, but the header must come first: "empty" misled about a full file
        raise DataError(
            f"{path}: line 1 is blank: expected the header line of column names (delete the blank line(s) before it)"
        )
    if not first.strip():
        raise DataError(f"{path}: the file is empty: expected a header line of column names")
    csv.field_size_limit(max(csv.field_size_limit(), FIELD_LIMIT))
    try:
        return [c.strip() for c in next(csv.reader([first]))]
    except csv.Error as e:
        raise DataError(
            f"{path}: the header line cannot be read as CSV ({e}): expected label,pixel0,pixel1,..."
        ) from None


def _shown(columns: list[str], first: int = 5) -> str:
    """The first few column names, each cut short, and the count: a header of 785 names is no error line."""
    names = ", ".join(c if len(c) <= 30 else c[:27] + "..." for c in columns[:first])
    return f"{names}{', ...' if len(columns) > first else ''}; {len(columns):,} in all"


def _refuse_other_separator(path: Path, columns: list[str]) -> None:
    """A header that is one name holding semicolons (Excel in many locales) or tabs: the file is not
    comma-separated, and the messages further on repeated the whole header (6,000 characters)."""
    if len(columns) != 1:
        return
    for sep, what in ((";", "semicolon"), ("\t", "tab")):
        if sep in columns[0]:
            names = columns[0].split(sep)
            shown = ";".join(names[:3]) if sep == ";" else ", ".join(names[:3])
            raise DataError(
                f"{path}: the header ({shown}..., {len(names):,} names) looks {what}-separated: expected commas "
                f"(pandas: pd.read_csv(path, sep={sep!r}).to_csv(path, index=False))"
            )


def _holds_numbers(columns: list[str]) -> bool:
    """Whether a header line is a data row (np.savetxt writes none): numbers all, and not the column numbers
    pandas writes for a frame without names (0,1,2,..., which name pixels)."""
    if not all(re.fullmatch(r"-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?", c) for c in columns):
        return False
    as_numbers = [float(c) for c in columns]
    return as_numbers != [as_numbers[0] + i for i in range(len(columns))]


def infer_shape(n_pixels: int, image_shape: str, path: Path) -> tuple[int, int, int]:
    if image_shape:
        c, h, w = parse_shape(image_shape)
        if c * h * w != n_pixels:
            raise PixelCountError(
                f"{path}: {n_pixels} pixel columns do not fit --image-shape {image_shape} ({c * h * w} values)",
                n_pixels,
            )
        return c, h, w
    side = math.isqrt(n_pixels)
    if side * side != n_pixels:
        raise PixelCountError(
            f"{path}: {n_pixels} pixel columns is not a square grey image: give the shape, {_shape_hint(n_pixels)}",
            n_pixels,
        )
    return 1, side, side


def _shape_hint(n_pixels: int) -> str:
    """A --image-shape that fits the count where square colour fits it (192 values: 3x8x8); the fixed example
    3x32x32 was refused when pasted for 192 columns."""
    side = math.isqrt(n_pixels // 3)
    if n_pixels % 3 == 0 and side * side * 3 == n_pixels:
        return f"--image-shape 3x{side}x{side} if they are square colour images (stored channel by channel)"
    return "--image-shape CxHxW with C x H x W equal to the column count"


def pixel_order(pixel_cols: list[str]) -> list[str]:
    """The pixel columns in the order of the numbers in their names (pixel2 before pixel10; 1x28 before 2x1), where
    every name holds the same count of numbers and no two names the same ones; else in the file's order. A file
    whose columns were sorted as text (pixel0, pixel1, pixel10, ...) read by position scrambled every image.

    Names of two or more numbers are reordered only where the file's order is their order as text: which number
    is the row is not known (x3y0 written row by row would come out transposed), but a text sort scrambled it."""
    numbers = [tuple(int(d) for d in re.findall(r"[0-9]+", c)) for c in pixel_cols]
    if not numbers[0] or len({len(n) for n in numbers}) != 1 or len(set(numbers)) != len(numbers):
        return pixel_cols
    if len(numbers[0]) > 1 and pixel_cols != sorted(pixel_cols):
        return pixel_cols
    return [c for _, c in sorted(zip(numbers, pixel_cols))]


def _reordered_note(path: Path, in_file: list[str], read: list[str]) -> str:
    first = next(j for j, (a, b) in enumerate(zip(in_file, read)) if a != b)
    # A text sort is the usual cause, but a file written in any other order (shuffled, reversed) is reordered too:
    # the note named a text sort for those as well, sending the user to look for one that was not there.
    why = "look sorted as text" if in_file == sorted(in_file) else "are in another order"
    return (
        f"note: {path}: pixel columns read in the order of their numbers ({', '.join(read[first : first + 3])}, ...), "
        f"not the file's ({', '.join(in_file[first : first + 3])}, ...): the file's columns {why}"
    )


def _data_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number in the file, values) of each data row; read only to name a bad row.

    Blank lines are skipped, as pyarrow skips them, so the k-th row here is pyarrow's row k."""
    compressed = _sniff_gzip(path)
    csv.field_size_limit(max(csv.field_size_limit(), FIELD_LIMIT))
    with _open_text(path, compressed) as f:
        reader = csv.reader(f)
        next(reader, None)
        for row in reader:
            if row:
                yield reader.line_num, row


def row_length(found: int, expected: int) -> str:
    """What a data row of the wrong length is told, the pixel CSV's and the labels CSV's alike."""
    return f"{found} value{'s' * (found != 1)}: expected {expected}, one per column of the header"


def _where(line: int, row: int) -> str:
    """Data row `row` (0-based) at `line` as the user's editor shows it: the header is line 1."""
    return f"line {line} (data row {row + 1})"


def _line(path: Path, row: int) -> str:
    return _where(next(islice(_data_rows(path), row, None))[0], row)


def _pixel(column: str, require_label: bool) -> str:
    """What a pixel column holds; with the file's layout where the column is named as no pixel is (a file name
    column, say), which is most likely not a pixel column at all."""
    if PIXEL_NAME.fullmatch(column):
        return "a pixel value 0..255"
    return f"a pixel value 0..255 here, or no such column ({_layout(require_label)})"


def _label_index(columns: list[str], path: Path) -> int | None:
    """The label column: `label`, or one name that is `label` in another case (Label, LABEL), which no pixel is.
    Two of them (label and Label) are refused whichever comes first: the other was read as a pixel."""
    found = [i for i, c in enumerate(columns) if c.lower() == LABEL]
    if len(found) > 1:
        names = ", ".join(repr(columns[i]) for i in found)
        raise DataError(f"{path}: {len(found)} label columns ({names}): expected one label column")
    return found[0] if found else None


def _id_index(columns: list[str], path: Path) -> int | None:
    found = [i for i, c in enumerate(columns) if c.lower() in ID_NAMES]
    if len(found) > 1:
        names = ", ".join(repr(columns[i]) for i in found)
        raise DataError(f"{path}: {len(found)} id columns ({names}): expected one id or ImageId column at most")
    return found[0] if found else None


def _not_pixels(path: Path, columns: list[str], pixel_idx: list[int], require_label: bool) -> DataError | None:
    """A few columns named as no pixel is among pixel-named ones (a file name, pandas' unnamed index): counted
    as pixels they leave a count that makes no image, and naming them says more than that count. A file whose
    columns mostly have other names gets no such guess."""
    odd = [j for j in pixel_idx if not PIXEL_NAME.fullmatch(columns[j])]
    if not odd or 2 * len(odd) >= len(pixel_idx):
        return None
    names = ", ".join(f"{columns[j]!r} (number {j + 1} in the header)" for j in odd[:3])
    which = f"column {names} is not a pixel column" if len(odd) == 1 else f"columns {names} are not pixel columns"
    return DataError(f"{path}: {which}{', ...' if len(odd) > 3 else ''}: expected {_layout(require_label)}")


def _diagnose(
    path: Path, columns: list[str], label_idx: int | None, id_idx: int | None, require_label: bool, cause: Exception
) -> DataError:
    """Find the first line that breaks the format; called only after the fast parse failed."""
    try:
        return _first_bad_row(path, columns, label_idx, id_idx, require_label, cause)
    except csv.Error as e:
        return DataError(f"{path}: could not be parsed as CSV ({e}): expected comma-separated numbers")


def _first_bad_row(
    path: Path, columns: list[str], label_idx: int | None, id_idx: int | None, require_label: bool, cause: Exception
) -> DataError:
    n = len(columns)
    for k, (line_no, row) in enumerate(_data_rows(path)):
        where = f"{path}, {_where(line_no, k)}"
        if len(row) != n:
            return DataError(f"{where}: {row_length(len(row), n)}")
        for j, value in enumerate(row):
            if j == id_idx:  # any text names a row
                continue
            v = value.strip()
            # as the fast parse reads integers: ASCII digits with an optional minus (not "+5", not "５")
            if not re.fullmatch(r"-?[0-9]+", v):
                return DataError(
                    f"{where}, column {columns[j]!r}: {_cut(value)!r} is not an integer: expected "
                    + ("a class label" if j == label_idx else _pixel(columns[j], require_label))
                )
            # past 20 digits a value is out of any range here (and int() refuses 4,300 digits and more)
            num = int(v) if len(v.lstrip("-0")) <= 20 else 2**64
            if j != label_idx and not 0 <= num <= 255:
                return DataError(
                    f"{where}, column {columns[j]!r}: {_cut(v)}: expected {_pixel(columns[j], require_label)}"
                )
            if j == label_idx and not -(2**63) <= num < 2**63:
                return DataError(f"{where}, column {columns[j]!r}: {_cut(v)}: expected a class label")
    return DataError(f"{path}: could not be parsed as CSV ({cause})")


HWC_ROWS = 1000  # rows the layout check reads: a few ms
# the share of the channel-by-channel reading's vertical steps below which a pixel-by-pixel reading is called the
# file's layout: photos (sklearn's sample images, 4x4 to 64x64 crops) gave 0.19-0.25 stored pixel by pixel and
# 1.7-2.8 stored channel by channel; noise gives 1.0
HWC_RATIO = 0.5


def _looks_hwc(x: np.ndarray, shape: tuple[int, int, int]) -> bool:
    """Whether colour rows look flattened pixel by pixel (HWC: r,g,b of each pixel together, what x.reshape(N, -1)
    of numpy's, PIL's and Keras' (N, H, W, 3) arrays writes) rather than channel by channel (CHW), as read: their
    vertical neighbours differ far less read as HWC. Read as CHW such rows are every image scrambled, untold."""
    c, h, w = shape
    if c != 3 or h * w < 16:
        return False
    rows = x[:HWC_ROWS].astype(np.float32)
    as_chw = float(np.abs(np.diff(rows.reshape(-1, 3, h, w), axis=2)).mean())
    as_hwc = float(np.abs(np.diff(rows.reshape(-1, h, w, 3), axis=1)).mean())
    return as_hwc < HWC_RATIO * as_chw


def _hwc_note(path: Path, shape: tuple[int, int, int]) -> str:
    _, h, w = shape
    return (
        f"warning: {path}: the rows look stored pixel by pixel (r,g,b of each pixel together: x.reshape(N, -1) of "
        f"(N, H, W, 3) images), and are read channel by channel (CHW), which scrambles every image: "
        f"np.transpose(x.reshape(N, {h}, {w}, 3), (0, 3, 1, 2)).reshape(N, -1) writes CHW rows"
    )


def _cut(value: str, most: int = 40) -> str:
    """A value as an error line shows it: a 200,000-character field would be the whole line."""
    return value if len(value) <= most else f"{value[: most - 3]}..."


def read_pixel_csv(
    path: str | Path,
    image_shape: str = "",
    require_label: bool = True,
    num_classes: int = 0,
    notes: list[str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return (images uint8 (N,C,H,W), labels int64 or None). Pixel columns are read in the order of the numbers
    in their names (`pixel_order`); where that is not the file's order, a line saying so goes to `notes` where it
    is given."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    compressed = _sniff_gzip(path)
    columns = _header(path, compressed)
    _refuse_other_separator(path, columns)
    if _holds_numbers(columns):
        raise DataError(
            f"{path}: the first line holds numbers ({', '.join(columns[:3])}, ...), not column names: expected a "
            f"header line ({'label,' if require_label else '[label,]'}pixel0,pixel1,...; np.savetxt(..., "
            "header=..., comments='') writes one)"
        )
    repeated = next((c for i, c in enumerate(columns) if c in columns[:i]), None)
    if repeated is not None:  # pyarrow would rename or merge them: which column is which is lost
        where = [i + 1 for i, c in enumerate(columns) if c == repeated]
        raise DataError(
            f"{path}: column name {repeated!r} is repeated in the header (columns {', '.join(map(str, where))}): "
            "expected each column name once"
        )
    label_idx = _label_index(columns, path)
    if require_label and label_idx is None:
        raise DataError(
            f"{path}: no {LABEL!r} column in the header (found {_shown(columns)}): expected label,pixel0,pixel1,..."
        )
    id_idx = _id_index(columns, path)  # read by read_ids where wanted; skipped here
    pixel_idx = [i for i in range(len(columns)) if i not in (label_idx, id_idx)]
    pixel_cols = [columns[i] for i in pixel_idx]
    if not pixel_cols:
        raise DataError(f"{path}: no pixel columns: expected label,pixel0,pixel1,...")
    try:
        shape = infer_shape(len(pixel_cols), image_shape, path)
    except PixelCountError:
        named = _not_pixels(path, columns, pixel_idx, require_label)
        if named is None:
            raise
        raise named from None
    types = {c: pa.uint8() for c in pixel_cols}
    label = columns[label_idx] if label_idx is not None else LABEL
    if label_idx is not None:
        types[label] = pa.int64()
    try:
        # the header's names as read above (spaces stripped, no BOM), not pyarrow's raw ones
        read = pacsv.ReadOptions(column_names=columns, skip_rows=1)
        convert = pacsv.ConvertOptions(
            column_types=types, include_columns=[c for i, c in enumerate(columns) if i != id_idx]
        )
        table = pacsv.read_csv(_arrow_source(path, compressed), read_options=read, convert_options=convert)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise _diagnose(path, columns, label_idx, id_idx, require_label, e) from None
    if table.num_rows == 0:
        raise DataError(f"{path}: has a header but no data rows: expected one row of values per image below it")
    for c in pixel_cols + ([label] if label_idx is not None else []):
        if table.column(c).null_count:
            row = int(np.flatnonzero(table.column(c).is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(
                f"{path}, {_line(path, row)}, column {c!r}: empty or missing value (blank, NA, nan, null, ...): "
                "expected a number"
            )
    ordered = pixel_order(pixel_cols)
    if ordered != pixel_cols and notes is not None:
        notes.append(_reordered_note(path, pixel_cols, ordered))
    x = np.empty((table.num_rows, len(pixel_cols)), dtype=np.uint8)
    for j, c in enumerate(ordered):
        x[:, j] = table.column(c).to_numpy()
    if notes is not None and _looks_hwc(x, shape):
        notes.append(_hwc_note(path, shape))
    y = None
    if label_idx is not None:
        y = table.column(label).to_numpy()
        if require_label:  # predict's labels are optional: it scores them, or says why it ignores them (-1 for unknown)
            check_label_range(y, str(path), num_classes, position=lambda i: _line(path, i))
        y = torch.from_numpy(y.astype(np.int64))
    del table
    return torch.from_numpy(x).view(-1, *shape), y


def _arrow_source(path: Path, compressed: bool):
    """What pyarrow reads: the path, or a gzip stream where the file is compressed (pyarrow tells compression from
    a name's .gz alone, and read a gzip file named .csv as text)."""
    import pyarrow as pa

    return pa.input_stream(str(path), compression="gzip") if compressed else path


def read_ids(path: str | Path, notes: list[str] | None = None) -> tuple[str, list[str]] | None:
    """(the id or ImageId column's name, its values as written) for predict to name its rows; None without one.
    A warning on the first repeated id goes to `notes` where it is given: a submission with an id twice is refused
    (Kaggle's), and which row each stood for is lost.

    Called after read_pixel_csv accepted the file's rows, so only this column is converted, as text: 007 stays 007."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    path = Path(path)
    compressed = _sniff_gzip(path)
    columns = _header(path, compressed)
    id_idx = _id_index(columns, path)
    if id_idx is None:
        return None
    name = columns[id_idx]
    read = pacsv.ReadOptions(column_names=columns, skip_rows=1)
    convert = pacsv.ConvertOptions(column_types={name: pa.string()}, include_columns=[name])
    table = pacsv.read_csv(_arrow_source(path, compressed), read_options=read, convert_options=convert)
    ids = table.column(name).to_pylist()
    blank = next((i for i, v in enumerate(ids) if v is None or not v.strip()), None)
    if blank is not None:  # a row without its id would go into the submission under none
        raise DataError(f"{path}, {_line(path, blank)}, column {name!r}: empty: expected the row's id")
    if notes is not None and len(set(ids)) < len(ids):
        first: dict[str, int] = {}
        again = next(i for i, v in enumerate(ids) if first.setdefault(v, i) != i)
        notes.append(
            f"warning: {path}, {_line(path, again)}, column {name!r}: id {ids[again]!r} repeats that of "
            f"{_line(path, first[ids[again]])}: each row is predicted, but a submission expects each id once"
        )
    return name, ids
