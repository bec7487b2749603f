"""Tiny, learnable data files written by the tests themselves (nothing is ever downloaded).

Every class k lights a horizontal bar at rows 2k..2k+1 of an otherwise dim image, so even one
short epoch of cnn3 separates the classes and predictions can be checked against the truth.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SIDE = 16  # 16x16 grey: cnn3's three 2x2 pools leave a 2x2 map
CLASSES = 4


def bar_images(n: int, classes: int = CLASSES, side: int = SIDE, channels: int = 1, seed: int = 0):
    """(x uint8 (n, side, side) or (n, side, side, channels), y int64 (n,))."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    rng.shuffle(y)
    x = rng.integers(0, 40, size=(n, side, side), dtype=np.uint8)
    for k in range(classes):
        x[y == k, 2 * k : 2 * k + 2, :] = 230
    if channels > 1:
        x = np.repeat(x[..., None], channels, axis=-1)
    return x, y.astype(np.int64)


def pixel_header(n_pixels: int, label: bool = True) -> str:
    cols = (["label"] if label else []) + [f"pixel{i}" for i in range(n_pixels)]
    return ",".join(cols)


def write_pixel_csv(path: Path, x: np.ndarray, y: np.ndarray | None) -> Path:
    """Kaggle Digit Recognizer layout: label,pixel0..pixelN (test files have no label)."""
    flat = x.reshape(len(x), -1).astype(np.int64)
    rows = flat if y is None else np.concatenate([y[:, None], flat], axis=1)
    np.savetxt(path, rows, fmt="%d", delimiter=",", header=pixel_header(flat.shape[1], y is not None), comments="")
    return path


def write_train_test_csv(folder: Path, n_train: int = 512, n_test: int = 64) -> tuple[Path, Path, np.ndarray]:
    """train.csv (labelled) and test.csv (pixels only); returns the test labels for checking."""
    x, y = bar_images(n_train + n_test)
    train = write_pixel_csv(folder / "train.csv", x[:n_train], y[:n_train])
    test = write_pixel_csv(folder / "test.csv", x[n_train:], None)
    return train, test, y[n_train:]


def write_npz(path: Path, n_train: int = 512, n_test: int | None = 128) -> Path:
    x, y = bar_images(n_train + (n_test or 0))
    arrays = {"x_train": x[:n_train], "y_train": y[:n_train]}
    if n_test:
        arrays.update(x_test=x[n_train:], y_test=y[n_train:])
    np.savez(path, **arrays)
    return path


def write_image_folder(root: Path, per_class: int = 6, classes: int = 2, side: int = 20) -> Path:
    """root/<class>/<i>.png|jpg, alternating PNG and JPEG, written with Pillow."""
    from PIL import Image

    x, y = bar_images(per_class * classes, classes=classes, side=side, channels=3)
    for i, (img, label) in enumerate(zip(x, y)):
        folder = root / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(folder / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


def write_noise_jpegs(root: Path, n: int = 12, first_height: int = 48, width: int = 64) -> Path:
    """root/c<i % 3>/<i>.jpg: n JPEGs of seeded noise (quality 90), image i `first_height + 4 i` rows high,
    so files and batches differ in size."""
    import torch
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for i in range(n):
        (root / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        pixels = torch.randint(0, 256, (first_height + 4 * i, width, 3), generator=g, dtype=torch.uint8).numpy()
        Image.fromarray(pixels).save(root / f"c{i % 3}" / f"{i}.jpg", quality=90)
    return root


def write_first_batch_failures(root: Path) -> dict[str, tuple[Path, str]]:
    """Data that fails before or at its first batch, with the start of each one's error: an .npz of one
    image (refused as it loads: one label, and a hold-out that would leave no training image) and a folder of
    files that are not images (found only when decoded, after the command made its folders)."""
    root.mkdir(parents=True, exist_ok=True)
    x, y = bar_images(1)
    np.savez(root / "one.npz", x_train=x, y_train=y)
    folder = write_image_folder(root / "corrupt", per_class=2, side=16)
    for f in folder.rglob("*.*"):
        f.write_bytes(b"not an image")
    return {
        "one_image": (root / "one.npz", f"{root / 'one.npz'}: every training label is 0"),
        "corrupt_images": (folder, f"{folder}/class"),  # the file's name, then "cannot decode as an image"
    }


def damaged_jpeg(side: int = 64, seed: int = 0) -> bytes:
    """A JPEG of noise with 60 zero bytes written into its scan data: libjpeg decodes it with a warning ("Corrupt
    JPEG data: ... extraneous bytes before marker 0xd9"), which strict simplejpeg raises."""
    import io

    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    data = bytearray(buf.getvalue())
    scan = data.find(b"\xff\xda")
    middle = scan + (len(data) - scan) // 2
    data[middle : middle + 60] = bytes(60)
    return bytes(data)


def stray_bytes(jpeg: bytes) -> bytes:
    """A JPEG with 7 zero bytes between two of its header's segments (before the first quantisation table): libjpeg
    skips them with a warning ("Corrupt JPEG data: 7 extraneous bytes before marker 0xdb"), and cnnpar's own header
    reader (data/jpeg_header.py) finds no frame header in it."""
    dqt = jpeg.index(b"\xff\xdb")
    return jpeg[:dqt] + bytes(7) + jpeg[dqt:]


def short_png(width: int, height: int, raw_bytes: int) -> bytes:
    """An 8-bit RGB PNG whose whole zlib stream inflates to `raw_bytes` zero bytes, where its `width` x `height`
    header needs height * (1 + 3 * width): libpng stops with "Not enough image data", on which torchvision 0.29
    crashes the process (SIGSEGV) and Pillow raises "image file is truncated". Never decode one with torchvision
    in the test process: a refusal that failed would end pytest."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(bytes(raw_bytes))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def damaged_png(width: int = 64, height: int = 48) -> bytes:
    """A smooth RGB PNG (Pillow's) whose header and chunk lengths are whole, with 8 bytes in the middle of its image
    data flipped and the chunk's CRC written again to match: only zlib finds the damage ("invalid distance too far
    back"), and the data passes png_header's length bound. torchvision 0.29's PNG decoder dies of it (SIGSEGV);
    Pillow raises "broken data stream when reading image file". Never decode one with torchvision in the test
    process: that would end pytest."""
    import io
    import struct
    import zlib

    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (width + height)], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    start = data.index(b"IDAT") - 4  # the chunk's length field
    (length,) = struct.unpack_from(">I", data, start)
    middle = start + 8 + length // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    struct.pack_into(">I", data, start + 8 + length, zlib.crc32(data[start + 4 : start + 8 + length]))
    return bytes(data)


def photo_crops(n: int, side: int, seed: int = 0) -> np.ndarray:
    """(n, side, side, 3) uint8 crops of scikit-learn's two bundled photos (a temple, a flower): natural images,
    where neighbouring pixels and the three channels agree as they do in photos."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    crops = []
    for k in range(n):
        photo = photos[k % len(photos)]
        top, left = rng.integers(0, photo.shape[0] - side), rng.integers(0, photo.shape[1] - side)
        crops.append(photo[top : top + side, left : left + side])
    return np.stack(crops)
