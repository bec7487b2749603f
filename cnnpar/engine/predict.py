"""Predictions from a checkpoint: Kaggle's `ImageId,Label` for CSV input (`id,label` and its ids where it has an
id column), the label a class index, as the CSV's own labels and Kaggle's submissions hold them; for the rest a
CSV of id, label (the index), class_name and confidence. Classes named by numbers that are not their indices
(folders 0..11, sorted as text) write and score their numbers instead (`class_numbers`)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import sys
from pathlib import Path

import torch

from cnnpar.config import TTA_LEVELS, RunConfig, device_advice, spelling_advice
from cnnpar.data.arrays import resize_square
from cnnpar.data.bundle import ArrayDataset, first_five
from cnnpar.data.csv_source import PixelCountError, read_ids
from cnnpar.data.folder import skipped_note, split_dirs
from cnnpar.data.labels_csv import is_whole_number
from cnnpar.data.sources import PREDICT_READS, detect_format, load_predict_data, npz_class_names, readable_name
from cnnpar.data.store_write import Sides
from cnnpar.data.transforms import DeviceTransform
from cnnpar.dist import apple_gpu_note, start_cuda, visible_devices_set
from cnnpar.engine.averaging import averaged_weights
from cnnpar.engine.checkpoint import (
    BEST,
    LAST,
    load_checkpoint,
    load_model_weights,
    refuse_nonfinite,
    require_checkpoint,
    require_model_description,
    stored_epoch,
)
from cnnpar.engine.memory_full import memory_full_said
from cnnpar.engine.predict_loader import AUTO_WORKERS, photo_batches
from cnnpar.engine.resolved import rooted
from cnnpar.engine.step import tta_logits
from cnnpar.engine.trainer import RUN_RECORDS
from cnnpar.errors import ConfigError, DataError, UserError, raise_pending_stop
from cnnpar.models import build_model
from cnnpar.parallel.precision import Precision
from cnnpar.report.files import check_out_file, refuse_unnameable_out_file, write_csv_atomic
from cnnpar.report.heartbeat import Heartbeat


def _inputs(ds, data: str, batch_size: int, workers: int, decode: str, dev: torch.device, meta: dict, log):
    """Normalised input batches on `dev`, in order: in-memory arrays sliced in the main process (workers would only
    add IPC, as train's auto_workers says), photos read by the run's evaluation loader (engine/predict_loader)."""
    if not isinstance(ds, ArrayDataset):
        yield from photo_batches(ds, data, batch_size, workers, decode, dev, meta["mean"], meta["std"], log)
        return
    transform = DeviceTransform(meta["mean"], meta["std"], "none", False, dev)
    for i in range(0, len(ds), batch_size):
        yield transform(ds.x[i : i + batch_size].to(dev), train=False)


def checkpoint_line(path: Path, state: dict) -> str:
    """Which weights predict reads: a run folder gives ckpt/last.pt, whose epoch may not be the best one, and the
    predictions did not say which they came from."""
    epoch = state.get("epoch")
    line = f"checkpoint: {path}" + (f" (epoch {epoch})" if isinstance(epoch, int) else "")
    best = path.with_name(BEST)
    if path.name != LAST or not best.is_file():
        return line
    held = stored_epoch(best)
    if held is None:  # cut short or damaged: no epoch to recommend it for
        return line + f"; {best}, meant to hold the best validation epoch, cannot be read (cut short or damaged?)"
    if held != epoch:
        line += (
            f"; {best} holds the best validation epoch, {held}: --checkpoint {shlex.quote(str(best))} predicts with it"
        )
    return line


def _device(text: str) -> torch.device:
    """--device as a torch device, refused in one line as `cnnpar train` refuses a CUDA it cannot see
    (dist.pick_device), rather than with torch's traceback at the first tensor moved there. auto: the first
    CUDA device where one is visible (as `cnnpar train` picks), else the CPU."""
    if text == "auto":
        return torch.device("cuda", 0) if torch.cuda.device_count() else torch.device("cpu")
    try:
        dev = torch.device(text)
    except RuntimeError:  # a name torch does not know at all
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        # CUDA:1: predict takes cuda:N, so not train's advice (CUDA_VISIBLE_DEVICES) but the case; mps: no Apple GPU
        lower = text.strip().lower()
        advice = spelling_advice(text, lower) if re.fullmatch(r"cpu|cuda(:\d+)?", lower) else device_advice(text)
        why = f" ({advice})" if advice else ""
        raise ConfigError(f"--device {text!r}: expected auto, cpu, cuda or cuda:N{why}")
    count = torch.cuda.device_count() if dev.type == "cuda" else 0  # 0, not an error, without a driver
    if dev.type == "cuda" and not count:
        raise ConfigError(
            f"--device {text!r} but no CUDA device is visible{visible_devices_set()}: expected --device cpu here"
        )
    if dev.type == "cuda" and (dev.index or 0) >= count:
        raise ConfigError(
            f"--device {text!r}: {count} CUDA device(s) visible{visible_devices_set()}: expected "
            f"cuda:0..cuda:{count - 1}"
        )
    return dev


def _precision(run_cfg: dict, dev: torch.device, log) -> Precision:
    """The run's precision, under which its validation scored the weights: a bf16 evaluation and an fp32 one of
    the same weights differ in a few borderline images, so predictions made in fp32 were not those of the model
    val_acc scored. fp32 where this device lacks the run's (bf16 on a GPU
    without it), said in a line."""
    kind = run_cfg.get("speed", {}).get("precision", "fp32")
    if kind == "tf32" and dev.type != "cuda":
        kind = "fp32"  # tf32 is a CUDA switch; the CPU runs such a model in fp32 as its validation would have
    if kind == "bf16" and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        log(f"precision: fp32 (the run evaluated in bf16, which {torch.cuda.get_device_name(dev)} lacks)")
        kind = "fp32"
    return Precision(kind if kind in ("fp32", "tf32", "bf16", "fp16") else "fp32", dev)


def range_warning(x: torch.Tensor, mean, std, data: str) -> str:
    """A loud warning when the pixels sit far from the training data's (say 0..16 digits fed to a
    model trained on 0..255): the model then predicts nearly one class, with no error anywhere.

    Two cheap tests on at most 10,000 images: a channel mean more than 4 training stds away, or a
    brightest pixel below a quarter of the training data's mean + std (a compressed range)."""
    sample = x[:10000].float().div_(255)
    seen_mean = sample.mean(dim=(0, 2, 3))
    t_mean, t_std = torch.tensor(mean), torch.tensor(std)
    brightest = float(sample.max())
    far = bool(((seen_mean - t_mean).abs() > 4 * t_std).any())
    dim = brightest < float((t_mean + t_std).max()) / 4
    if not (far or dim):
        return ""
    seen = ", ".join(f"{v:.3f}" for v in seen_mean.tolist())
    trained = ", ".join(f"{m:.3f} (std {s:.3f})" for m, s in zip(mean, std))
    return (
        f"warning: {data}: pixels unlike the training data's: channel mean {seen}, brightest pixel "
        f"{round(255 * brightest)}; expected a mean near {trained} (0..1 units of 0..255 pixels): the "
        "predictions are likely wrong (scale the pixels to 0..255 as in training)"
    )


def _check_size(ds: ArrayDataset, shape, data: str, resize: bool) -> ArrayDataset:
    """Refuse images of another size than the model's unless --resize asks for it: a 16x16 model
    runs on 28x28 rows without any error (global pooling) and quietly gets most of them wrong."""
    _, h, w = shape
    got = tuple(ds.x.shape[-2:])
    if got == (h, w):
        return ds
    if not resize:
        raise DataError(
            f"{data}: images are {got[0]}x{got[1]}: expected {h}x{w}, as the model was trained on "
            "(pass --resize to resize them to the model's size)"
        )
    if h != w:
        raise DataError(f"{data}: --resize makes square images only: expected {h}x{w} images")
    return ArrayDataset(resize_square(ds.x, h), ds.y)


def out_target(out: str, fmt: str, data: str, found: Path) -> Path:
    """The file --out names (the default name inside it where it ends in '/': a folder, made where missing), refused
    before any work where it is a folder, the --data file, the checkpoint or its run's ckpt/ folder (the predictions
    replaced a run's last.pt, exit 0), or a path where no file can be made (a traceback after every image was
    predicted)."""
    default = "submission.csv" if fmt == "csv" else "predictions.csv"
    target = Path(out or default)
    if out.endswith(("/", os.sep)):  # Path() drops the slash: `--out results/` wrote a file named results
        target = target / default
    refuse_unnameable_out_file(target, "--out")  # the is_dir() below raised ENAMETOOLONG: a traceback
    if target.is_dir():
        raise UserError(
            f"--out {target}: is a folder: expected the path of the CSV file to write ({target}/ writes {default} "
            "in it)"
        )
    if target.exists() and not target.is_file():  # the rename would replace it: /dev/null itself, as root
        raise UserError(f"--out {target}: is not a regular file (a device or a pipe): expected the path of a CSV file")
    if target.exists() and Path(data).is_file() and target.samefile(data):  # it was replaced by the predictions
        raise UserError(f"--out {target}: is the --data file: expected another path for the predictions")
    _refuse_checkpoint_paths(target, found)
    check_out_file(target, "--out")
    return target


def _refuse_checkpoint_paths(target: Path, found: Path) -> None:
    """--out on the checkpoint read, on its neighbour last.pt or best.pt, anywhere in a run's ckpt/ folder, or on
    one of the run's records (config.toml, metrics.csv, ...: a config.toml of predictions stopped its resume); through
    links too (a checkpoint linked from elsewhere is its run's file)."""
    where = target.resolve()
    if where == found.resolve() or (target.exists() and target.samefile(found)):
        raise UserError(f"--out {target}: is the --checkpoint file: expected another path for the predictions")
    for shown in dict.fromkeys((found.parent, found.resolve().parent)):  # as typed, and where a link leads
        folder = shown.resolve()
        if folder.name == "ckpt" and where.is_relative_to(folder):
            raise UserError(
                f"--out {target}: lies in the run's checkpoint folder {shown}: expected a path outside it (the "
                f"predictions could replace its {LAST} or {BEST})"
            )
        if where in (folder / LAST, folder / BEST):
            raise UserError(f"--out {target}: is the run's {where.name}: expected another path for the predictions")
        if folder.name == "ckpt" and where in [folder.parent / n for n in RUN_RECORDS]:  # resume reads them
            raise UserError(
                f"--out {target}: is the run's own {where.name}: expected another path for the predictions (the run "
                "could no longer be resumed or reported)"
            )


def digits_resize_note(trained_on: str | None, h: int, w: int) -> str:
    """A note where the built-in 8x8 digits are resized for a model of other data; "" for a digits run (train
    resizes them the same way) and for a model of 8x8 images (nothing is resized)."""
    if trained_on == "digits" or (h, w) == (8, 8):
        return ""
    return (
        f"cnnpar: note: the built-in digits are 8x8 images, resized to the model's {h}x{w} "
        f"(it was trained on {trained_on or 'other data'})"
    )


def unused_flag_notes(fmt: str, data: str, image_shape: str, resize: bool, side: tuple[int, int]) -> list[str]:
    """A note for --image-shape and --resize typed where they do nothing (as `cnnpar train` names such flags):
    --image-shape shapes CSV rows, --resize resizes CSV and .npz arrays; folders and the built-in digits are
    resized to the model's size anyway."""
    resized = f"resized to the model's {side[0]}x{side[1]}"
    kind = {
        "npz": "an .npz, whose arrays keep their own shape",
        "npy": "a .npy, whose arrays keep their own shape",
        "folder": f"an image folder, whose photos are {resized} as the run's validation read them",
        "digits": f"the built-in digits, {resized}",
    }.get(fmt)
    if kind is None:  # CSV rows take both; other formats are refused by the reader
        return []
    notes = []
    if image_shape and fmt != "csv":
        notes.append(f"cnnpar: note: --image-shape {image_shape} not used: it shapes CSV rows, and {data} is {kind}")
    if resize and fmt not in ("csv", "npz", "npy"):
        notes.append(f"cnnpar: note: --resize not used: it resizes CSV, .npz and .npy images, and {data} is {kind}")
    return notes


def _trained_from_store(run_cfg: dict) -> bool:
    data = run_cfg.get("data", {})
    return data.get("format") == "store" or str(data.get("source", "")).lower().endswith(".cnnpar")


def _unprepared_store_warning(found: Path, run_cfg: dict, data: str) -> str:
    """A run trained from a store, whose checkpoint predates `prepared_sides`: how prepare resized its photos is
    not known, so the folder is read as a folder run's validation reads it, and the pixels can differ from those
    the run validated on (docs/decoding.md: up to ~100 levels on large photos)."""
    return (
        f"warning: {found}: its run trained from the store {run_cfg['data'].get('source')}, and the checkpoint "
        f"predates recording how the store was prepared (prepared_sides): {data} is read as a folder run's "
        "validation reads it, not as the store was prepared, so some predictions may differ from the run's"
    )


def _write(target: Path, rows: list[dict], columns: list[str]) -> None:
    """The predictions, written atomically; a write that fails (a full disk, a file size limit) leaves no file and
    ends in one line rather than a traceback."""
    try:
        write_csv_atomic(target, rows, columns)
    except OSError as e:
        room = e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
        expected = "room for it (free disk space, a higher file size limit)" if room else "a writable path"
        raise UserError(f"--out {target}: cannot be written ({e.strerror or e}): expected {expected}") from None


def predict(
    checkpoint: str,
    data: str,
    out: str = "",
    batch_size: int = 256,
    image_shape: str = "",
    device: str = "auto",
    resize: bool = False,
    tta_level: str = "auto",
    data_format: str = "auto",
    log=print,
    labels: str = "",
    workers: int = AUTO_WORKERS,
    decode: str = "auto",
) -> Path:
    """Write predictions; log the accuracy where the data has labels, and warn on stderr about
    pixels that would make the predictions quietly wrong.

    `tta_level` auto: the test-time views the run evaluated with (its --tta-level / --tta-flip), so the
    predictions are those of the model its val_acc scored; none, flip or flip+translate to choose.
    `data_format` auto: told from --data's name (csv, npz, npy or folder to say). `labels`: the CSV labelling a flat
    folder, as `cnnpar train --labels` reads it (its labels matched to the run's classes by name), or the .npy of
    a .npy's labels (class indices, as an .npz's y_test), to score it. `workers` and `decode`: train's --workers
    (-1: auto) and --decode, for photos (a folder), which the evaluation's loader reads."""
    dev = _device(device)
    if dev.type == "cuda":
        start_cuda(dev)  # a GPU whose context cannot start: one line (dist.start_cuda), not model.to's traceback
    if note := apple_gpu_note(device):
        print(note, file=sys.stderr, flush=True)
    if batch_size < 1:  # a negative step makes an empty range: a header-only submission, "wrote", exit 0
        raise ConfigError(f"--batch-size {batch_size}: expected a whole number > 0")
    fmt = detect_format(data, data_format, PREDICT_READS)
    found = require_checkpoint(checkpoint)
    target = out_target(out, fmt, data, found)  # before any work: every refusal of --out costs nothing
    state = load_checkpoint(found, map_location="cpu")
    meta = require_model_description(state, found)
    log(checkpoint_line(found, state))
    c, h, w = meta["image_shape"]
    run_cfg = state.get("config") or {}
    for note in unused_flag_notes(fmt, data, image_shape, resize, (h, w)):
        print(note, file=sys.stderr, flush=True)
    typed = image_shape
    if not typed and (c != 1 or h != w):
        # Only square grey rows can be inferred from a column count; colour or oblong rows take the model's shape.
        image_shape = f"{c}x{h}x{w}"
    if c == 1 and fmt == "folder":
        raise DataError(
            f"{data}: an image folder decodes to RGB (3 channels), and the model was trained on grey images (1 "
            "channel): expected a CSV or an .npz of grey images"
        )
    skipped: list[Path] = []
    notes: list[str] = []
    unscored: list[str] = []  # why labels the data carries (a folder's class folders) are not scored
    try:
        per_image = run_cfg.get("data", {}).get("loader") == "textbook"  # validation's own way of reading a folder
        prepared = meta.get("prepared_sides")  # a run trained from a store (checkpoints since 2026-12)
        if prepared is None and fmt == "folder" and _trained_from_store(run_cfg):
            print(_unprepared_store_warning(found, run_cfg, data), file=sys.stderr, flush=True)
        ds, ids, label_origin = load_predict_data(
            data,
            fmt,
            image_shape,
            image_size=h,
            skipped=skipped,
            per_image=per_image,
            notes=notes,
            prepared=prepared,
            labels_csv=labels,
            class_names=meta.get("class_names"),
            unscored=unscored,
        )
        if prepared is not None and fmt == "folder":
            sides = Sides(prepared["max_side"], prepared["short_side"]).describe()
            log(f"images: resized as the run's store was prepared ({sides}), then cropped as its validation was")
    except PixelCountError as e:
        # the reader knows only the count (and a shape typed or taken from the model): say it against the model's
        if typed:
            raise DataError(f"{e}; the model was trained on {c}x{h}x{w} images ({c * h * w} values)") from None
        raise DataError(
            f"{data}: {e.n_pixels} pixel columns: expected {c * h * w}, one per value of the {c}x{h}x{w} images "
            "the model was trained on"
        ) from None
    if fmt == "digits" and (note := digits_resize_note(run_cfg.get("data", {}).get("source"), h, w)):
        print(note, file=sys.stderr, flush=True)
    if skipped:  # a folder's images in other formats get no row: said where the other warnings go
        print(skipped_note(skipped), file=sys.stderr, flush=True)
    id_name = "ImageId"
    if fmt == "csv" and (named := read_ids(data, notes)) is not None:
        id_name, ids = named  # a Kaggle test file's own ids, under its own name, as its sample submission has them
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    channels = ds.x.shape[1] if isinstance(ds, ArrayDataset) else 3  # folders decode to RGB
    if channels != c:
        raise DataError(f"{data}: images have {channels} channel(s): expected {c}, as the model was trained on")
    if isinstance(ds, ArrayDataset):
        ds = _check_size(ds, (c, h, w), data, resize)
        warning = range_warning(ds.x, meta["mean"], meta["std"], data)
        if warning:
            print(warning, file=sys.stderr, flush=True)
    model = build_model(meta["model"], c, meta["num_classes"], h, w)
    described = f"the {meta['model']} its meta describes, for {meta['num_classes']} classes of {c}x{h}x{w} images"
    averaged = averaged_weights(state)
    weights = averaged or state["model"]  # what the run evaluated
    load_model_weights(model, weights, found, described, "weight average" if averaged else "model")
    # before any image: a weight of -inf before a ReLU gives finite outputs, and NaN ones were blamed on the lr
    refuse_nonfinite(weights, found, "weight average" if averaged else "model")
    model.to(dev).eval()
    views = _views(state, tta_level, log)
    precision = _precision(run_cfg, dev, log)
    preds, confs = [], []
    # no bar and no switch: a line only once a folder takes over EVERY_S, where 200,000 images said nothing
    beat = Heartbeat("predicting", len(ds), "images", log, on=True)
    # closed on an error too: a folder's worker processes end with it
    batches = contextlib.closing(_inputs(ds, data, batch_size, workers, decode, dev, meta, log))
    full = memory_full_said("the prediction", batch_size, (c, h, w), dev, "a smaller --batch-size")
    with torch.no_grad(), full, batches as inputs:
        for x in inputs:
            # a stop noted, not raised, inside an import (errors.stop_on_signals): without this the prediction ran
            # through every image first, and wrote its file, then stopped
            raise_pending_stop()
            with precision.autocast():
                logits = tta_logits(model, x, "flip" in views, "translate" in views)
            logits = logits.float()
            # Checked on the outputs, not the weights: a run that diverged can keep finite weights
            # (lr 1e30) whose outputs still overflow, and argmax over NaN says class 0 with no error.
            if not bool(torch.isfinite(logits).all()):
                raise UserError(
                    f"{checkpoint}: the model's outputs on {data} are not finite (NaN or inf): its weights "
                    "come from a run that diverged; expected a checkpoint of a run that trained (try a lower --lr)"
                )
            probs = logits.softmax(dim=1)
            conf, label = probs.max(dim=1)
            preds += label.tolist()
            confs += conf.tolist()
            beat.update(len(preds))
    names = meta["class_names"]
    numbers = class_numbers(names)
    if numbers is not None:
        print(numbered_classes_note(names), file=sys.stderr, flush=True)
    if fmt == "folder":
        # a --labels CSV's labels and class folders are matched to the model's classes by name: already indices (a
        # .npy's are read as an .npz's)
        numbers = None
    for line in unscored:  # where the accuracy line would be
        log(line)
    own = npz_class_names(data) if label_origin and fmt == "npz" else None
    # a .npy's labels come from --labels' file, not the images': the note names the file that holds them
    labelled = f"--labels {labels}" if fmt == "npy" and labels else data
    by_index = (
        _by_index_note(labelled, names, numbers)
        if label_origin and own is None and fmt in ("csv", "npz", "npy")
        else ""
    )
    if own is not None:
        labels, note = _labels_by_name(ds.y, own, names, f"{data}[{label_origin}]", _npz_run_before_names(state))
        if note:
            log(note)
        if labels is None:
            label_origin = ""
        else:
            ds.y = labels
            numbers = None if numbers is None else list(range(len(names)))  # mapped by name: already indices
    if label_origin:
        y = ds.y if numbers is None else _indices_of_numbers(ds.y, numbers)
        if y is None:
            strays = sorted(set(ds.y.tolist()) - set(numbers))
            line = (
                f"{data}: ignoring {label_origin} as labels: values {first_five(map(str, strays))} are not among the "
                f"class numbers {first_five(map(str, sorted(numbers)))} (the model's class names)"
            )
        else:
            line = _accuracy_line(y, preds, meta["num_classes"], data, label_origin)
            if by_index and 0 <= int(y.min()) and int(y.max()) < meta["num_classes"]:
                # only beside a score: before labels the model has no class for ("ignoring ... as labels") it said
                # they were scored as the model's classes
                log(by_index)
        if fmt == "digits" and state.get("config", {}).get("data", {}).get("source") == "digits":
            line += ": every built-in digit, the run's training images among them, so not a held-out score"
        if fmt == "folder" and not labels and _is_training_folder(data, state):
            line += ": the folder the run trained on, its training images among them, so not a held-out score"
        log(line)
    if fmt == "csv":
        label = "Label" if id_name[:1].isupper() else "label"  # ImageId,Label (Digit Recognizer); id,label (Kannada)
        # the class index, not its name: the file's own 'label' column, which the accuracy line scores, and a
        # Kaggle submission (Digit Recognizer, Fashion-MNIST) hold numbers; a model with class names wrote those.
        # Classes named by numbers (folders 0..11, sorted as text) write their number: folder 10 is class 2
        rows = [{id_name: i, label: shown} for i, shown in zip(ids, _shown_labels(preds, names))]
        _write(target, rows, [id_name, label])
    else:
        # a class folder's name that is not UTF-8 escaped as the ids are: its lone surrogates stopped the write
        rows = [
            {
                "id": i,
                "label": shown,
                "class_name": readable_name(names[p]) if names else p,
                "confidence": f"{q:.5f}",
            }
            for i, p, shown, q in zip(ids, preds, _shown_labels(preds, names), confs)
        ]
        _write(target, rows, ["id", "label", "class_name", "confidence"])
    return target


def _is_training_folder(data: str, state: dict) -> bool:
    """Whether the class folders scored are those the run trained on: its --data itself (a seeded hold-out of it
    validated) or that folder's train/ split."""
    source = (state.get("config") or {}).get("data", {}).get("source")
    if source:
        # where the run read it: a relative --data read from predict's working folder missed the run's own folder
        # given from elsewhere, and took another folder of that name for it
        recorded, started_in = state["meta"].get("data_path"), state.get("started_in")
        if isinstance(recorded, str) and recorded:
            source = recorded
        elif isinstance(started_in, str):
            source = rooted(source, started_in)
    if not source or not Path(source).is_dir():
        return False
    train_dir, _ = split_dirs(Path(source))
    scored = Path(data).resolve()
    return scored == Path(source).resolve() or (train_dir is not None and scored == train_dir.resolve())


def class_numbers(names: list[str] | None) -> list[int] | None:
    """The classes' numbers where every class name is a whole number (`is_whole_number`, as training reads
    labels: -1 is one) and some number is not its index: class folders 0..11 sort as text (0, 1, 10, 11, 2, ...),
    so folder 10 is class 2, and a labels CSV's -1/0/3 are classes 0/1/2; a submission or a labels file that holds
    those numbers was written and scored as indices, wrong without a word. None
    where the names are not all numbers, two names are the same number (07 and 7), or every number is its index
    (0..9): the index is the number there."""
    if not names or not all(is_whole_number(n) for n in names):
        return None
    numbers = [int(n) for n in names]
    if len(set(numbers)) != len(numbers) or numbers == list(range(len(numbers))):
        return None
    return numbers


def numbered_classes_note(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return (
        f"cnnpar: note: the model's classes are named by numbers ({shown}): labels are written as those numbers "
        "(the class's name), not the class index, and labels read are scored "
        "as those numbers"
    )


def _shown_labels(preds: list[int], names: list[str] | None) -> list[int]:
    """The labels the rows hold: the class indices, or the classes' numbers where `class_numbers` has them."""
    numbers = class_numbers(names)
    return preds if numbers is None else [numbers[p] for p in preds]


def _indices_of_numbers(y: torch.Tensor, numbers: list[int]) -> torch.Tensor | None:
    """Labels that hold class numbers as the model's class indices; None where one is not a class's number."""
    index = {n: i for i, n in enumerate(numbers)}
    found = [index.get(v) for v in y.tolist()]
    return None if any(i is None for i in found) else torch.tensor(found, dtype=torch.int64)


def _by_index_note(data: str, names: list[str] | None, numbers: list[int] | None) -> str:
    """Labels that are bare indices (a CSV's label column, an .npz without class_names, a .npy) scored against a
    model whose classes have names (class folders, an archive's class_names): label k is taken for the model's class
    k, which holds only where the data was labelled in the run's order; said, since a folder exported with its
    classes in another order scored against the wrong names without a word. Classes named '0'..'N-1' (a run on
    such labels) or by other numbers (`numbered_classes_note`) say nothing here."""
    if not names or numbers is not None or names == [str(i) for i in range(len(names))]:
        return ""
    return (
        f"{data}: its labels name no classes, so label k is scored as the model's class k ("
        f"{first_five(f'{k}: {readable_name(n)!r}' for k, n in enumerate(names))}): labels in another order score "
        "against the wrong classes (an .npz's class_names are matched by name)"
    )


def _npz_run_before_names(state: dict) -> bool:
    """Whether the checkpoint's run trained on an .npz before cnnpar read an archive's class_names (2026-12-03,
    dbe7474): it named the classes by index whatever the archive said. Its meta lacks data_path (stored since
    an hour before)."""
    data = state.get("config", {}).get("data", {})
    npz = data.get("format") == "npz" or str(data.get("source", "")).lower().endswith(".npz")
    return npz and "data_path" not in state.get("meta", {})


def _labels_by_name(
    y: torch.Tensor, own: list[str], model: list[str], where: str, before_names: bool = False
) -> tuple[torch.Tensor | None, str]:
    """An archive's labels are indices into its own class_names; the model's outputs index its own. The same
    names in another order are mapped (scored as they were, its accuracy was 0 % against reversed names); names
    the model does not know leave the labels unscored, but for a model named by index ('0'..'N-1') by a run on an
    .npz from before cnnpar read class_names (`before_names`) beside as many names: scored by index, the order
    that run trained in. Returns (the labels in the model's indices or None, a line to say, or "")."""
    if int(y.max()) >= len(own):
        return None, f"{where}: ignored as labels: label {int(y.max())} has no name among its {len(own)} class_names"
    if before_names and model == [str(i) for i in range(len(model))] and len(own) == len(model) and own != model:
        return y, (
            f"{where}: scored by index: the checkpoint predates the archive's class_names "
            f"({first_five(repr(n) for n in own)}); the cnnpar that wrote it named the classes by index "
            f"({first_five(model)}), in the archive's order"
        )
    unknown = [n for n in own if n not in model]
    if unknown:
        return None, (
            f"{where}: ignored as labels: its class_names {first_five(repr(n) for n in unknown)} are not among the "
            f"model's classes ({first_five(repr(n) for n in model)})"
        )
    if own == model[: len(own)]:
        return y, ""
    to_model = torch.tensor([model.index(n) for n in own], dtype=torch.int64)
    return to_model[y], f"{where}: labels mapped to the model's classes by the archive's class_names"


def _views(state: dict, tta_level: str, log) -> str:
    """The test-time views to predict with: the run's own where `tta_level` is auto, said when there are any."""
    if tta_level not in ("auto", *TTA_LEVELS):
        raise ConfigError(f"--tta-level {tta_level!r}: expected auto, {', '.join(TTA_LEVELS)}")
    if tta_level != "auto":
        return tta_level
    run = state.get("config", {}).get("run", {})
    # RunConfig's own rule (tta_level, or the older tta_flip), on the checkpoint's two fields alone
    views = RunConfig(tta_level=run.get("tta_level", "none"), tta_flip=bool(run.get("tta_flip"))).tta_in_effect
    if views != "none":
        log(f"test-time augmentation: {views}, as the run evaluated (--tta-level none: the image alone)")
    return views


def _accuracy_line(y: torch.Tensor, preds: list[int], num_classes: int, data: str, origin: str) -> str:
    if int(y.min()) < 0 or int(y.max()) >= num_classes:
        return (
            f"{data}: ignoring {origin} as labels: values {int(y.min())}..{int(y.max())}, but the model "
            f"knows classes 0..{num_classes - 1}"
        )
    right = int((torch.tensor(preds) == y).sum())
    return f"accuracy {100 * right / len(preds):.2f}% ({right}/{len(preds)}) against {origin} of {data}"
