"""Predictions from a checkpoint: Kaggle's `ImageId,Label` for CSV input, a CSV for the rest."""

from __future__ import annotations

from pathlib import Path

import torch

from cnnpar.data.bundle import ArrayDataset
from cnnpar.data.sources import detect_format, load_predict_data
from cnnpar.data.transforms import DeviceTransform
from cnnpar.engine.averaging import averaged_weights
from cnnpar.engine.checkpoint import load_checkpoint
from cnnpar.errors import DataError, UserError
from cnnpar.models import build_model
from cnnpar.report.files import write_csv_atomic


def _batches(ds, batch_size: int):
    """Image batches in order: slices of in-memory arrays, or decoded files from a DataLoader."""
    if isinstance(ds, ArrayDataset):
        for i in range(0, len(ds), batch_size):
            yield ds.x[i : i + batch_size]
        return
    for x, _ in torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=False):
        yield x


def predict(
    checkpoint: str, data: str, out: str = "", batch_size: int = 256, image_shape: str = "", device: str = "cpu"
) -> Path:
    dev = torch.device(device)
    state = load_checkpoint(checkpoint, map_location="cpu")
    meta = state.get("meta") if isinstance(state, dict) else None
    if meta is None:
        raise UserError(f"{checkpoint}: holds no model description ('meta'): expected a checkpoint of cnnpar train")
    c, h, w = meta["image_shape"]
    fmt = detect_format(data, "auto")
    if not image_shape and c != 1:
        # Only square grey rows can be inferred from a column count; colour rows take the model's shape.
        image_shape = f"{c}x{h}x{w}"
    ds, ids = load_predict_data(data, fmt, image_shape, image_size=h)
    channels = ds.x.shape[1] if isinstance(ds, ArrayDataset) else 3  # folders decode to RGB
    if channels != c:
        raise DataError(f"{data}: images have {channels} channel(s): expected {c}, as the model was trained on")
    model = build_model(meta["model"], c, meta["num_classes"], h)
    model.load_state_dict(averaged_weights(state) or state["model"])  # the weights the run evaluated
    model.to(dev).eval()
    transform = DeviceTransform(meta["mean"], meta["std"], "none", False, dev)
    preds, confs = [], []
    with torch.no_grad():
        for x in _batches(ds, batch_size):
            probs = model(transform(x.to(dev), train=False)).softmax(dim=1)
            conf, label = probs.max(dim=1)
            preds += label.tolist()
            confs += conf.tolist()
    names = meta["class_names"]
    if fmt == "csv":
        target = Path(out or "submission.csv")
        rows = [{"ImageId": i, "Label": names[p] if names else p} for i, p in zip(ids, preds)]
        write_csv_atomic(target, rows, ["ImageId", "Label"])
    else:
        target = Path(out or "predictions.csv")
        rows = [
            {"id": i, "label": p, "class_name": names[p] if names else p, "confidence": f"{q:.5f}"}
            for i, p, q in zip(ids, preds, confs)
        ]
        write_csv_atomic(target, rows, ["id", "label", "class_name", "confidence"])
    return target
