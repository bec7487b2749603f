"""Predictions from a checkpoint: Kaggle's `ImageId,Label` for CSV input, a CSV for the rest."""

from __future__ import annotations

from pathlib import Path

import torch

from cnnpar.data.arrays import resize_square
from cnnpar.data.bundle import ArrayDataset
from cnnpar.data.sources import detect_format, load_predict_data
from cnnpar.data.transforms import DeviceTransform
from cnnpar.engine.checkpoint import load_checkpoint
from cnnpar.errors import DataError
from cnnpar.models import build_model
from cnnpar.report.files import write_csv_atomic


def predict(
    checkpoint: str, data: str, out: str = "", batch_size: int = 256, image_shape: str = "", device: str = "cpu"
) -> Path:
    dev = torch.device(device)
    state = load_checkpoint(checkpoint, map_location="cpu")
    meta = state["meta"]
    c, h, w = meta["image_shape"]
    fmt = detect_format(data, "auto")
    ds, ids = load_predict_data(data, fmt, image_shape, image_size=h)
    if isinstance(ds, ArrayDataset):
        if ds.x.shape[1] != c:
            raise DataError(f"{data}: images have {ds.x.shape[1]} channel(s): the model was trained on {c}")
        ds = ArrayDataset(resize_square(ds.x, h), ds.y)
    model = build_model(meta["model"], c, meta["num_classes"], h)
    model.load_state_dict(state["model"])
    model.to(dev).eval()
    transform = DeviceTransform(meta["mean"], meta["std"], "none", False, dev)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=False)
    preds, confs = [], []
    with torch.no_grad():
        for x, _ in loader:
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
