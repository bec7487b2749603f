"""Decode the JPEG copy of CIFAR-10 into arrays cnnpar (and a speedrun trainer) can read.

Writes, under the git-ignored `.devdata/`:
- `cifar10.npz`: x_train uint8 (50000, 32, 32, 3), y_train, x_test uint8 (10000, 32, 32, 3), y_test
  (for `cnnpar train|bench --data .devdata/cifar10.npz`);
- `cifar10/train.pt`, `cifar10/test.pt`: {'images': uint8 Nx32x32x3 tensor, 'labels': int64 tensor,
  'classes': list of names}, the layout airbench-style trainers load, for a side-by-side run.

The source images were re-encoded as JPEG at quality 75 (see /work/shared/data/README.md), so
accuracies are close to, not equal to, those on the original CIFAR-10.

    python benchmarks/prepare_cifar10.py [--src /work/shared/data/cifar10_jpeg.npz] [--out .devdata]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed cnnpar

from cnnpar.errors import UserError, main_saying_user_errors  # noqa: E402

DEFAULT_SRC = "/work/shared/data/cifar10_jpeg.npz"
# sha256 of the decoded arrays with Pillow's default (libjpeg-turbo) decoder, from the data README
EXPECTED_SHA256 = {
    "x_train": "5aaf8a2cf2e577ff4dbb15e4f368840fab5aca1812bcc69682005f8dc661d466",
    "x_test": "b7018a062865e9348a704e72416eb53c816b43cc8ac42ab43276a2b967508ab6",
}


def decode(buf: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    from PIL import Image

    return np.stack(
        [
            np.asarray(Image.open(io.BytesIO(buf[offsets[i] : offsets[i + 1]].tobytes())).convert("RGB"))
            for i in range(len(offsets) - 1)
        ]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=DEFAULT_SRC, help="the JPEG npz (train_jpeg/offsets, test_jpeg/offsets, labels)")
    ap.add_argument("--out", default=".devdata", help="output folder (git-ignored)")
    args = ap.parse_args()
    if not Path(args.src).is_file():  # before --out is made; np.load ended in a FileNotFoundError traceback
        raise UserError(f"--src {args.src}: file not found (expected the JPEG npz of CIFAR-10)")
    import torch

    out = Path(args.out)
    (out / "cifar10").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with np.load(args.src) as d:
        arrays = {
            "x_train": decode(d["train_jpeg"], d["train_offsets"]),
            "y_train": d["y_train"].astype(np.int64),
            "x_test": decode(d["test_jpeg"], d["test_offsets"]),
            "y_test": d["y_test"].astype(np.int64),
        }
        classes = [str(c) for c in d["class_names"]]
    print(f"decoded {len(arrays['x_train'])} + {len(arrays['x_test'])} images in {time.perf_counter() - t0:.1f} s")
    for key, want in EXPECTED_SHA256.items():
        got = hashlib.sha256(arrays[key].tobytes()).hexdigest()
        print(f"{key} sha256 {got} ({'matches' if got == want else 'DIFFERS from'} the data README)")
    tmp = out / ".cifar10.npz.tmp.npz"
    np.savez(tmp, **arrays)  # uncompressed: loads in a fraction of a second, and the folder is git-ignored
    tmp.replace(out / "cifar10.npz")
    for split, x, y in (("train", arrays["x_train"], arrays["y_train"]), ("test", arrays["x_test"], arrays["y_test"])):
        obj = {"images": torch.from_numpy(x), "labels": torch.from_numpy(y), "classes": classes}
        torch.save(obj, out / "cifar10" / f"{split}.pt")
    print(f"wrote {out / 'cifar10.npz'}, {out / 'cifar10' / 'train.pt'}, {out / 'cifar10' / 'test.pt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "prepare_cifar10"))
