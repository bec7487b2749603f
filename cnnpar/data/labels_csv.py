"""A flat folder of images labelled by a CSV (`--data train/ --labels labels.csv`), as Kaggle ships many image sets:
Dog Breed Identification's train/<id>.jpg + labels.csv `id,breed`, CIFAR-10's train/<n>.png + trainLabels.csv
`id,label`, Aerial Cactus's train/<id>.jpg + train.csv `id,has_cactus`.

`scan_labelled` turns the two into what `folder.scan_splits` gives for class folders (files, labels, split ids,
class names), so that everything after the scan (hold-out, decoders, loaders, stores, checksums) is the class
folders' own path. The rules (README's "Training on your data", `--labels`'s help):

- the CSV has a header; its first column names the image: its path under the folder, or that path without its
  extension (Kaggle's ids have none: `000bec18...` is `000bec18....jpg`);
- the label column is the one named `label` (any case), else the second where the CSV has exactly two columns;
- labels that are all whole numbers are classes in numeric order, named by their numbers; other labels are
  classes named by the distinct labels in sorted order, as class folders are.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from cnnpar.data.csv_source import row_length
from cnnpar.data.folder import image_files
from cnnpar.errors import DataError

LABELS_RULE = (
    "a header, the image's name (its path under the folder, with or without its extension) in the first column, and "
    "the label in a column named 'label' or in the second of exactly two columns"
)
SHOWN = 3  # names a message or warning lists before "..."


def scan_labelled(
    root: str | Path, labels_csv: str | Path, skipped: list[Path] | None = None, notes: list[str] | None = None
) -> tuple[list[Path], list[int], list[int], list[str]]:
    """Files, labels, split ids (all 0: train; `--val-fraction` holds out) and class names of the images under
    `root` that `labels_csv` names, in the CSV's row order. Images in formats not read go to `skipped` where it is
    given; a warning on images the CSV does not name goes to `notes`."""
    files, texts, _, _ = _read_labelled(root, labels_csv, skipped, notes)
    classes, labels = _classes(texts)
    if len(classes) < 2:
        raise DataError(
            f"{labels_csv}: every row has the label {classes[0]!r}: expected at least 2 labels to tell apart"
        )
    return files, labels, [0] * len(files), classes


def scan_for_classes(
    root: str | Path,
    labels_csv: str | Path,
    classes: list[str],
    skipped: list[Path] | None = None,
    notes: list[str] | None = None,
) -> tuple[list[Path], list[int]]:
    """Files and labels of the images under `root` that `labels_csv` names, read by `scan_labelled`'s rules, each
    label an index of a trained run's `classes` (`cnnpar predict --labels`: a hold-out folder of the training
    layout). A hold-out may hold fewer classes than training did, even one; a label the run never had is refused
    in one line naming the CSV, its line and the label."""
    files, texts, lines, label_column = _read_labelled(root, labels_csv, skipped, notes)
    numeric = all(is_whole_number(t) for t in texts)
    index = {c: i for i, c in enumerate(classes)}
    labels = []
    for text, line in zip(texts, lines):
        # named as training names them: whole numbers by their number (07 is class '7'), else the text itself
        name = str(int(text)) if numeric and text not in index else text
        if name not in index:
            shown = ", ".join(map(repr, classes[:5])) + (", ..." if len(classes) > 5 else "")
            raise DataError(
                f"{labels_csv}: line {line}: column {label_column!r} {text!r}: not a class of the model (it was "
                f"trained on {len(classes)}: {shown}): expected the labels the run trained on"
            )
        labels.append(index[name])
    return files, labels


def _read_labelled(
    root: str | Path, labels_csv: str | Path, skipped: list[Path] | None, notes: list[str] | None
) -> tuple[list[Path], list[str], list[int], str]:
    """The images `labels_csv` names under `root`, each row's label text and CSV line, and the label column's name;
    every row's image checked (one image, named once, there)."""
    root, labels_csv = Path(root), Path(labels_csv)
    if not root.is_dir():
        raise DataError(f"{root}: not a folder: --labels {labels_csv} labels the images of a folder")
    rows = _read_rows(labels_csv)
    unread: list[Path] = []  # images in formats not read: a row naming one is told so, not "no image"
    by_path, by_stem = _index(root, image_files(root, unread))
    if skipped is not None:
        skipped += unread
    files, texts, lines, missing, seen = [], [], [], [], {}
    for line, name, label, id_column, label_column in rows:
        where = f"{labels_csv}: line {line}"
        if not name:
            raise DataError(f"{where}: column {id_column!r} is empty: expected the name of an image under {root}")
        if not label:
            raise DataError(f"{where}: column {label_column!r} is empty for {name!r}: expected its label")
        found = _match(name, by_path, by_stem)
        if found is None:
            missing.append((line, name))
            continue
        if len(found) > 1:
            shown = ", ".join(str(f.relative_to(root)) for f in found)
            raise DataError(
                f"{where}: column {id_column!r} {name!r} matches {len(found)} images under {root} ({shown}): "
                "expected one; give the name with its extension"
            )
        key = found[0]
        if key in seen:
            raise DataError(
                f"{where}: column {id_column!r} {name!r} names {key.relative_to(root)}, as line {seen[key]} does: "
                "expected each image once"
            )
        seen[key] = line
        files.append(key)
        texts.append(label)
        lines.append(line)
    if missing:
        _refuse_unread(labels_csv, root, missing, unread, rows[0][3])
        line, name = missing[0]
        shown = ", ".join(n for _, n in missing[:SHOWN]) + (", ..." if len(missing) > SHOWN else "")
        raise DataError(
            f"{labels_csv}: line {line}: column {rows[0][3]!r} {name!r}: no image of that name under {root} "
            f"({len(missing):,} row(s) have none: {shown}): expected a .jpg, .jpeg or .png file named by each row"
        )
    if not files:
        raise DataError(f"{labels_csv}: no rows below its header: expected {LABELS_RULE}")
    unnamed = sorted(set(by_path.values()) - seen.keys())
    if unnamed and notes is not None:
        shown = ", ".join(str(f.relative_to(root)) for f in unnamed[:SHOWN]) + (", ..." if len(unnamed) > SHOWN else "")
        notes.append(
            f"warning: {root}: {len(unnamed):,} image(s) that {labels_csv} does not name are not read ({shown})"
        )
    return files, texts, lines, rows[0][4]


def _refuse_unread(
    labels_csv: Path, root: Path, missing: list[tuple[int, str]], unread: list[Path], id_column: str
) -> None:
    """Refuse the rows that name an image in a format cnnpar does not read (a .webp): it is there, and "no image of
    that name" sent the user looking for a file they could see."""
    paths, stems = _index(root, unread)
    named = [(line, name, found[0]) for line, name in missing if (found := _match(name, paths, stems))]
    if not named:
        return
    line, name, first = named[0]
    kinds = ", ".join(sorted({f.suffix.lower() for _, _, f in named}))
    raise DataError(
        f"{labels_csv}: line {line}: column {id_column!r} {name!r} names {first.relative_to(root)}, an image of a "
        f"kind cnnpar does not read ({len(named):,} row(s) name {kinds} files): expected a .jpg, .jpeg or .png file "
        "(convert them, e.g. Pillow's Image.open(f).save(f.with_suffix('.png')))"
    )


def _read_rows(labels_csv: Path) -> list[tuple[int, str, str, str, str]]:
    """(line number, image name, label, name column, label column) of each row of `labels_csv` under its header."""
    try:
        # utf-8-sig: a CSV saved by Excel starts with a byte-order mark, which would stick to the first column's name
        with open(labels_csv, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise DataError(f"{labels_csv}: empty: expected {LABELS_RULE}")
            label_at = _label_column(labels_csv, [h.strip() for h in header])
            id_column, label_column = header[0].strip(), header[label_at].strip()
            rows = []
            for fields in reader:
                if not any(f.strip() for f in fields):
                    continue  # a blank line (a trailing one, most often)
                # a value past the header's columns was dropped unread; empty ones (a trailing comma) drop nothing
                if any(f.strip() for f in fields[len(header) :]):
                    raise DataError(f"{labels_csv}: line {reader.line_num}: {row_length(len(fields), len(header))}")
                name = fields[0].strip()
                label = fields[label_at].strip() if label_at < len(fields) else ""
                rows.append((reader.line_num, name, label, id_column, label_column))
    except FileNotFoundError:
        raise DataError(f"--labels {labels_csv}: no such file: expected a CSV of {LABELS_RULE}") from None
    except IsADirectoryError:
        raise DataError(f"--labels {labels_csv}: a folder: expected a CSV file of {LABELS_RULE}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{labels_csv}: not UTF-8 text ({e.reason} at byte {e.start}): expected a CSV file") from None
    except csv.Error as e:
        raise DataError(f"{labels_csv}: not a readable CSV ({e}): expected {LABELS_RULE}") from None
    return rows


def _label_column(labels_csv: Path, header: list[str]) -> int:
    named = [i for i, h in enumerate(header) if i > 0 and h.lower() == "label"]
    if named:
        return named[0]
    if len(header) == 2:
        return 1
    raise DataError(
        f"{labels_csv}: line 1: columns {', '.join(map(repr, header))}: no column named 'label' and not exactly two "
        f"columns (a one-hot CSV, one column a class, is not read): expected {LABELS_RULE}"
    )


def _index(root: Path, files: list[Path]) -> tuple[dict[str, Path], dict[str, list[Path]]]:
    """The images under `root` by their relative path (with '/') and by that path without its extension."""
    by_path, by_stem = {}, {}
    prefix = os.path.join(str(root), "")
    for f in files:
        name = str(f)
        rel = (name[len(prefix) :] if name.startswith(prefix) else str(f.relative_to(root))).replace(os.sep, "/")
        by_path[rel] = f
        by_stem.setdefault(os.path.splitext(rel)[0], []).append(f)
    return by_path, by_stem


def _match(name: str, by_path: dict[str, Path], by_stem: dict[str, list[Path]]) -> list[Path] | None:
    """The images a CSV's name matches: its path, else the paths it is without an extension; None where none."""
    name = name.replace("\\", "/").removeprefix("./")
    if name in by_path:
        return [by_path[name]]
    return by_stem.get(name)


def is_whole_number(text: str) -> bool:
    """A label or class name read as a number: ASCII digits with an optional sign (-1, 07, +3). The one rule for
    training's labels and predict's numbered classes (`predict.class_numbers`): a run trained on -1/0/3 wrote
    its indices 0/1/2 while predict took only digits."""
    digits = text[1:] if text[:1] in "+-" else text
    return digits.isascii() and digits.isdigit()


def _classes(texts: list[str]) -> tuple[list[str], list[int]]:
    """Class names and each row's class index: whole numbers in numeric order, named by their numbers (a 0/1 column
    is classes '0' and '1', index = number); other labels in sorted order, as class folders are."""
    if all(is_whole_number(t) for t in texts):
        numbers = [int(t) for t in texts]
        order = sorted(set(numbers))
        index = {n: i for i, n in enumerate(order)}
        return [str(n) for n in order], [index[n] for n in numbers]
    classes = sorted(set(texts))
    index = {c: i for i, c in enumerate(classes)}
    return classes, [index[t] for t in texts]


def scan_images(
    root: str | Path,
    labels_csv: str | Path = "",
    skipped: list[Path] | None = None,
    notes: list[str] | None = None,
    found=None,
) -> tuple[list[Path], list[int], list[int], list[str]]:
    """An image folder's files, labels, split ids and class names: from `labels_csv` where it is given (a flat
    folder), else from the class folders (`scan_splits`). The one scan that training, stores and their checks use.
    `found(n)`: told the images listed so far after each class folder (a flat folder is one listing: not told)."""
    from cnnpar.data.folder import scan_splits

    if labels_csv:
        return scan_labelled(root, labels_csv, skipped, notes)
    return scan_splits(root, skipped, found)
