"""What every framework runner shares: the run's settings, the data, the initial weights, the CSV.

Fairness rules, held in one place so no runner can drift:
- Architecture: cnn3 from `cnnpar.models.cnn3` (CONV_CHANNELS, FC_UNITS): three times conv3x3
  (padding "same", no bias) -> BatchNorm -> ReLU -> maxpool 2, then Linear 256 -> ReLU -> Linear 128
  -> ReLU -> Linear classes (logits).
- Initial weights: He-normal (untruncated, std sqrt(2 / fan_in)) for conv and dense kernels, zero
  biases, BatchNorm gamma 1 / beta 0 / running mean 0 / var 1. They are drawn once here in numpy
  from the seed, so every framework starts from the *same numbers*, not just the same scheme.
  Canonical layouts are PyTorch's (conv OIHW, dense (out, in), flatten in C,H,W order);
  `to_channels_last` converts them for the NHWC runners (Keras, TensorFlow).
- BatchNorm: epsilon 1e-5, running-average momentum 0.1 in PyTorch's convention (= Keras 0.9).
- Optimizer: Adam (beta1 0.9, beta2 0.999, eps 1e-8), constant learning rate, no weight decay;
  cross-entropy on logits. cnnpar's AdamW with weight_decay 0 is exactly this Adam. One difference stays:
  where eps goes. PyTorch adds it to the bias-corrected sqrt(v_hat); Keras, and the TensorFlow and PyTensor
  runners written after it, fold the bias correction into the step size and add eps to the uncorrected
  sqrt(v) (the "epsilon hat" form of Kingma and Ba's section 2), which is PyTorch's with eps divided by
  sqrt(1 - beta2^t): 3.2e-7 at step 1, 1.3e-8 at step 1,000. The two agree wherever
  sqrt(v_hat) is well above that, i.e. almost everywhere; the formula is left as each framework has it.
- Batch: `batch_size` is the global batch; with `--devices N` each replica gets batch_size / N.
  Incomplete last batches are dropped (every framework then compiles one shape).
- Data: `cnnpar.data.load_data` (digits, npz, csv, synthetic) gives identical uint8 arrays and the same
  seeded split to every runner (image folders and stores, which only cnnpar's engine reads, are refused
  when the spec is made; non-square images, which cnn3 cannot take unresized, by `load_bundle`, which `compare`
  calls once before any runner); normalisation is (x / 255 - mean) / std with the train split's
  per-channel mean and std. The first `max_train` / `max_val` samples are used when given.
  Each runner shuffles with numpy's generator seeded by (seed, epoch) (cnnpar's engine uses its own
  seeded DistributedSampler), so batch order differs across engines but not across runs.
- Timing: `epoch_s` covers the training pass of one epoch only (validation is timed out), and the
  first epoch includes each framework's tracing / compilation where it has one (each CSV's `timed` line says
  what its epochs hold); the combined table therefore reports the first epoch and the median of later epochs
  separately. Thread counts are recorded (`intra_op_threads`), not pinned.

CSV schema (one file per framework, `cnn2d_3layer_fullconnected_3layer_<framework>_<backend>.csv`):
leading `# key: value` comment lines (versions, device, parallelism, settings), then a header row
with CSV_COLUMNS and one row per epoch. `pandas.read_csv(path, comment="#")` reads the rows;
`read_result_csv` reads both parts.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import math
import os
import platform
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from cnnpar.config import SYNTHETIC_SHAPE, parse_shape
from cnnpar.errors import ConfigError
from cnnpar.report.host import cpu_name as host_cpu_name

CSV_PREFIX = "cnn2d_3layer_fullconnected_3layer"
CSV_COLUMNS = ["epoch", "train_loss", "train_acc", "val_loss", "val_acc", "epoch_s", "images_per_s"]
BN_EPSILON = 1e-5
BN_MOMENTUM_TORCH = 0.1  # new = (1 - m) * old + m * batch; Keras's momentum is 1 - m
ADAM_BETAS = (0.9, 0.999)
ADAM_EPSILON = 1e-8
ARRAY_FORMATS = ("digits", "npz", "csv", "synthetic")  # what load_arrays reads as in-memory arrays
# compare's process id, for its runner to end with it (runner_main): in a session of its own, the runner of a
# `compare` killed outright (SIGKILL, the OOM killer) trained on to its end, reparented to init
PARENT_ENV = "CNNPAR_RUNNER_PARENT"


@dataclass(frozen=True)
class Framework:
    name: str  # what --frameworks takes
    framework: str  # first part of the CSV name
    backend: str  # second part of the CSV name
    module: str  # python -m cnnpar.frameworks.<module>
    needs: tuple[str, ...]  # importable packages; the first missing one is named when skipping
    keras_backend: str = ""


FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in (
        Framework("torch", "torch", "cnnpar", "torch_runner", ("torch",)),
        Framework("keras-tensorflow", "keras", "tensorflow", "keras_runner", ("keras", "tensorflow"), "tensorflow"),
        Framework("keras-jax", "keras", "jax", "keras_runner", ("keras", "jax"), "jax"),
        Framework("keras-torch", "keras", "torch", "keras_runner", ("keras", "torch"), "torch"),
        Framework("tensorflow", "tensorflow", "graph", "tf_runner", ("tensorflow",)),
        Framework("pytensor", "pytensor", "c", "pytensor_runner", ("pytensor",)),
    )
}


def csv_name(fw: Framework) -> str:
    return f"{CSV_PREFIX}_{fw.framework}_{fw.backend}.csv"


def parse_frameworks(text: str) -> list[Framework]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(FRAMEWORKS.values())
    if not names:  # an empty or mistyped value must not start hours of work under every framework
        raise ConfigError(f"--frameworks {text!r}: expected all or some of {', '.join(FRAMEWORKS)}")
    unknown = [n for n in names if n not in FRAMEWORKS]
    if unknown:
        raise ConfigError(f"--frameworks: unknown {', '.join(unknown)}; expected some of {', '.join(FRAMEWORKS)}")
    return [FRAMEWORKS[n] for n in dict.fromkeys(names)]


@dataclass(frozen=True)
class RunSpec:
    """The settings every runner receives, as the same command-line flags."""

    data: str = "digits"
    format: str = "auto"
    image_shape: str = ""
    val_fraction: float = 0.2
    max_train: int = 0
    max_val: int = 0
    epochs: int = 3
    batch_size: int = 128
    lr: float = 1e-3
    seed: int = 0
    devices: int = 1
    out: str = "runs/compare"  # under runs/ (git-ignored) with every other output

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "devices"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} = {getattr(self, name)}: expected an integer >= 1")
        if not self.lr > 0 or math.isinf(self.lr):  # nan and inf reached each runner, which failed on its own
            raise ConfigError(f"--lr = {self.lr}: expected a finite number > 0")
        if not 0 <= self.seed < 2**63:  # as train's run.seed: a runner refused -1 after its process had started
            raise ConfigError(f"--seed = {self.seed}: expected 0 <= value < 2**63")
        for name in ("max_train", "max_val"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected 0 (all) or a count > 0")
        if self.batch_size % self.devices:
            raise ConfigError(
                f"--batch-size {self.batch_size} with --devices {self.devices}: the global batch must split evenly: "
                f"expected a multiple of {self.devices}"
            )
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"--val-fraction {self.val_fraction}: expected 0 <= value < 1")
        if self.format not in ("auto", *ARRAY_FORMATS):
            raise ConfigError(f"--format {self.format}: expected one of auto, {', '.join(ARRAY_FORMATS)}")
        if self.image_shape:
            check_square(parse_shape(self.image_shape), f"--image-shape {self.image_shape}")
        self._check_data_reads_as_arrays()

    def _check_data_reads_as_arrays(self) -> None:
        """Refuse up front what only cnnpar's engine reads: an image folder or a store reached every runner,
        and each but torch failed on its own with an AttributeError (its images are files, not arrays)."""
        from cnnpar.data.sources import detect_format

        found = detect_format(self.data, self.format)  # a DataError for a path that is nothing it can read
        if found in ("npz", "csv") and not Path(self.data).is_file():  # else each runner says it, one after another
            raise ConfigError(f"--data {self.data}: no such file: expected an existing .{found} file")
        if found not in ARRAY_FORMATS:
            what = {
                "folder": "an image folder",
                "store": "a .cnnpar store",
                # compare has no --labels to pair it with: one archive carries both to every runner
                "npy": "a .npy of images, with no --labels here (np.savez(F, x_train=x, y_train=y) makes an .npz)",
            }.get(found, f"{found} data")
            raise ConfigError(
                f"--data {self.data}: {what}: expected the built-in digits, an .npz or a .csv, which every framework "
                "reads as the same in-memory arrays"
            )

    def to_argv(self) -> list[str]:
        return [a for f in fields(self) for a in (f"--{f.name.replace('_', '-')}", str(getattr(self, f.name)))]


def check_square(shape: tuple[int, int, int], what: str) -> None:
    """cnn3's first dense layer is sized from one side, and `compare` does not resize: a non-square image failed
    in each runner on its own (a shape mismatch deep in TensorFlow or Keras; torch's named `train`'s --image-size)."""
    _, h, w = shape
    if h != w:
        raise ConfigError(f"{what}: {h}x{w} (HxW) images: cnn3 needs square images, and compare does not resize them")


SPEC_HELP = {
    "data": "digits (built in), an .npz (x_train, y_train[, x_val|x_test, y_val|y_test]), a train.csv or "
    f"synthetic (random images of --image-shape, default {SYNTHETIC_SHAPE})",
    "format": f"how to read --data (auto, {', '.join(ARRAY_FORMATS)})",
    "image_shape": "CxHxW of CSV rows when not square grey, or of synthetic images; square (H = W)",
    "val_fraction": "seeded hold-out when the data has no test split",
    "max_train": "use only the first N training samples (0: all)",
    "max_val": "use only the first N validation samples (0: all)",
    "epochs": "training epochs",
    "batch_size": "global batch (split over --devices)",
    "lr": "Adam learning rate (constant)",
    "seed": "seed for initial weights, split and shuffling",
    "devices": "data-parallel replicas, each framework in its own idiom (virtual devices on a CPU)",
    "out": "folder for the CSVs, the combined table and the chart",
}


def add_spec_args(p: argparse.ArgumentParser) -> None:
    # the fields' declared defaults, not a RunSpec(): making one checks its data, which imports torch (`--help`)
    for f in fields(RunSpec):
        default = f.default
        p.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f.name,
            type=type(default),
            default=default,
            help=f"{SPEC_HELP[f.name]} (default: {default!r})",
        )


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    return RunSpec(**{f.name: getattr(args, f.name) for f in fields(RunSpec)})


# ---- data ----------------------------------------------------------------------------------------
@dataclass
class Arrays:
    """Normalised float32 images in NCHW, int64 labels, and what the model needs."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    shape: tuple[int, int, int]
    origin: str

    def channels_last(self) -> Arrays:
        return Arrays(
            np.ascontiguousarray(self.x_train.transpose(0, 2, 3, 1)),
            self.y_train,
            np.ascontiguousarray(self.x_val.transpose(0, 2, 3, 1)),
            self.y_val,
            self.num_classes,
            self.shape,
            self.origin,
        )


def load_bundle(spec: RunSpec):
    """cnnpar's own reader and split, cut to max_train / max_val (a DataBundle of uint8 tensors)."""
    import torch

    from cnnpar.config import DataConfig
    from cnnpar.data import load_data

    cfg = DataConfig(source=spec.data, format=spec.format, image_shape=spec.image_shape, val_fraction=spec.val_fraction)
    bundle = load_data(cfg, spec.seed)
    if bundle.val is None:
        raise ConfigError("compare needs a validation split: give --val-fraction > 0 or data with a test split")
    if spec.max_train:
        bundle.train = bundle.train.subset(torch.arange(min(spec.max_train, len(bundle.train))))
    if spec.max_val:
        bundle.val = bundle.val.subset(torch.arange(min(spec.max_val, len(bundle.val))))
    if len(bundle.train) < spec.batch_size:
        raise ConfigError(
            f"--batch-size {spec.batch_size} exceeds the {len(bundle.train)} training samples of {bundle.origin}: "
            f"expected at most {len(bundle.train)}"
        )
    check_square(tuple(bundle.shape), f"--data {spec.data}")  # an .npz's images, which --image-shape does not set
    return bundle


def normalise(x_uint8: np.ndarray, mean, std) -> np.ndarray:
    """(x / 255 - mean) / std as one multiply-add, the same arithmetic as cnnpar's DeviceTransform."""
    std_a = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    mean_a = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    scale = np.float32(1.0) / (np.float32(255.0) * std_a)
    shift = -mean_a / std_a
    return (x_uint8.astype(np.float32) * scale + shift).astype(np.float32)


def load_arrays(spec: RunSpec) -> Arrays:
    bundle = load_bundle(spec)
    tr, va = bundle.train, bundle.val
    return Arrays(
        normalise(tr.x.numpy(), bundle.mean, bundle.std),
        tr.y.numpy().astype(np.int64),
        normalise(va.x.numpy(), bundle.mean, bundle.std),
        va.y.numpy().astype(np.int64),
        bundle.num_classes,
        tuple(bundle.shape),
        bundle.origin,
    )


def epoch_order(n: int, epoch: int, seed: int) -> np.ndarray:
    # (seed, epoch) as a pair, not seed + epoch: that gave seed s + 1's epoch e seed s's epoch e + 1, so runs repeated
    # over consecutive seeds shared all their orders but one (the engine's sampler had the same flaw: shuffle_seed)
    return np.random.default_rng((seed, epoch)).permutation(n)


def steps_per_epoch(n: int, batch_size: int) -> int:
    return n // batch_size


# ---- initial weights -----------------------------------------------------------------------------
def initial_weights(shape: tuple[int, int, int], num_classes: int, seed: int) -> dict[str, list[np.ndarray]]:
    """He-normal kernels, zero biases, BN at identity, in PyTorch's layouts.

    Returns {"conv": [OIHW x3], "bn": [(gamma, beta, mean, var) x3], "dense": [(W (out, in), b) x3]}.
    """
    from cnnpar.models.cnn3 import CONV_CHANNELS, FC_UNITS, flat_features

    rng = np.random.default_rng(seed)
    c, h, _ = shape
    conv, bn = [], []
    for out in CONV_CHANNELS:
        fan_in = c * 9
        conv.append((rng.standard_normal((out, c, 3, 3)) * np.sqrt(2.0 / fan_in)).astype(np.float32))
        bn.append(tuple(np.full(out, v, dtype=np.float32) for v in (1.0, 0.0, 0.0, 1.0)))
        c = out
    dense, fan_in = [], flat_features(h)
    for out in (*FC_UNITS, num_classes):
        w = (rng.standard_normal((out, fan_in)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        dense.append((w, np.zeros(out, dtype=np.float32)))
        fan_in = out
    return {"conv": conv, "bn": bn, "dense": dense}


def conv_hwio(w_oihw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(w_oihw.transpose(2, 3, 1, 0))


def dense_in_out(w_out_in: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(w_out_in.T)


def first_dense_for_nhwc(w_out_in: np.ndarray, channels: int, side: int) -> np.ndarray:
    """Reorder the first dense layer's inputs from PyTorch's C,H,W flatten to NHWC's H,W,C flatten,
    so an NHWC network computes exactly what the NCHW one does. Returns (in, out)."""
    out = w_out_in.shape[0]
    w = w_out_in.reshape(out, channels, side, side).transpose(0, 2, 3, 1).reshape(out, -1)
    return np.ascontiguousarray(w.T)


# ---- results -------------------------------------------------------------------------------------
def cpu_name() -> str:
    return host_cpu_name() or platform.processor() or platform.machine() or "cpu"


def base_header(fw: Framework, spec: RunSpec, data: Arrays | None = None) -> dict[str, str]:
    """The `# key: value` lines every CSV starts with; runners add versions, device and parallelism."""
    from cnnpar.report.environment import git_revision

    header = {
        "framework": fw.framework,
        "backend": fw.backend,
        "name": fw.name,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "host_cpus": str(os.cpu_count() or 0),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "model": "cnn3",
        "init": "He-normal kernels from one shared numpy draw, zero biases, BatchNorm at identity",
        "optimizer": f"Adam betas={ADAM_BETAS} eps={ADAM_EPSILON}, constant lr, no weight decay",
        "batchnorm": f"eps={BN_EPSILON} momentum={BN_MOMENTUM_TORCH} (PyTorch convention)",
        **{f"spec_{k}": str(v) for k, v in asdict(spec).items() if k != "out"},
    }
    if data is not None:
        header.update(
            {
                "data": data.origin,
                "image_shape": "x".join(map(str, data.shape)),
                "num_classes": str(data.num_classes),
                "train_samples": str(len(data.x_train)),
                "val_samples": str(len(data.x_val)),
            }
        )
    # Other work on a shared machine skews the figures; the load average says how much there was. This one is
    # read as the run ends and includes the run's own load; runner_main adds the one read before training.
    header["load_avg_1_5_15"] = load_average()
    header["git_rev"] = git_revision()
    header["date"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    return header


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def write_result_csv(path: str | Path, header: dict[str, str], rows: list[dict]) -> None:
    """`# key: value` lines, then CSV_COLUMNS rows; written to a temporary file and renamed."""
    from cnnpar.report.files import write_text_atomic

    buf = io.StringIO()
    for k, v in header.items():
        buf.write(f"# {k}: {str(v).replace(chr(10), ' ')}\n")
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(path, buf.getvalue())


def read_result_csv(path: str | Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    from cnnpar.report.files import TEXT

    lines = Path(path).read_text(**TEXT).splitlines()
    header = {}
    for ln in lines:
        if not ln.startswith("# "):
            break
        k, _, v = ln[2:].partition(": ")
        header[k] = v
    body = [ln for ln in lines if not ln.startswith("#")]
    return header, list(csv.DictReader(body))


def epoch_row(epoch: int, train_loss: float, train_acc: float, val_loss: float, val_acc: float, seconds: float, n: int):
    return {
        "epoch": epoch,
        "train_loss": f"{train_loss:.6f}",
        "train_acc": f"{train_acc:.6f}",
        "val_loss": f"{val_loss:.6f}",
        "val_acc": f"{val_acc:.6f}",
        "epoch_s": f"{seconds:.4f}",
        "images_per_s": f"{n / seconds:.2f}",
    }


def diverged_note(
    epoch: int | str, what: str, loss: float | str, lr: float | str | None, why: str = "is not finite"
) -> str:
    """What the summary says of a run whose loss stopped being finite (or exploded: `why` says how), whichever
    runner it was: the torch runner (whose engine stops there) and the rows of the others (which train on in NaN)
    read alike. The hint names only a flag that `compare` takes (None: the run's lr is not known)."""
    lower = f"--lr {float(lr) / 2:g}" if lr is not None else "--lr"
    return f"diverged: epoch {epoch} {what} {loss} {why}: try a lower {lower}"


def runner_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=f"cnn3 under one framework ({prog})")
    p.add_argument("--framework", required=True, choices=sorted(FRAMEWORKS), help="which entry of FRAMEWORKS")
    add_spec_args(p)
    return p


def log_epoch(fw: Framework, spec: RunSpec, row: dict) -> None:
    print(
        f"{fw.name}: epoch {row['epoch']}/{spec.epochs} train loss {float(row['train_loss']):.4f} "
        f"acc {100 * float(row['train_acc']):.2f}% val loss {float(row['val_loss']):.4f} "
        f"acc {100 * float(row['val_acc']):.2f}% {float(row['epoch_s']):.1f} s "
        f"{float(row['images_per_s']):,.0f} img/s",
        flush=True,
    )


def runner_main(prog: str, train) -> int:
    """Parse the shared flags, train, write the CSV (when `train` returns rows: rank 0 only). The runner ends with
    the `compare` that started it, and a SIGTERM (compare's stop, or its death) stops it with its clean-up run (the
    torch runner's temporary folder)."""
    import signal

    from cnnpar.console import printable_stdio
    from cnnpar.errors import stop_on_signals
    from cnnpar.process_tree import end_with_parent_named_in

    end_with_parent_named_in(PARENT_ENV, signal.SIGTERM)
    stop_on_signals()
    # it prints as the CLI does: its `wrote runs/café/...csv` on an ASCII log (PYTHONIOENCODING=ascii, a Windows
    # cp1252 one) failed the run after its CSV was written
    with printable_stdio():
        return _runner_main(prog, train)


def _runner_main(prog: str, train) -> int:
    import signal
    import sys

    from cnnpar.errors import Terminated, UserError, say_user_error, user_error_text

    args = runner_parser(prog).parse_args()
    fw = FRAMEWORKS[args.framework]
    # before this run's own load (the header's other reading includes it); its 1-minute figure still holds
    # whatever ran in the minute before, the previous framework of a `compare` included
    load_before = load_average()
    try:
        spec = spec_from_args(args)
        result = train(fw, spec)
    except UserError as e:
        return say_user_error(user_error_text(e), prog)
    except Terminated:
        print(f"{prog}: stopped (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    if result is not None:
        header, rows = result
        header["load_avg_before_1_5_15"] = load_before
        path = Path(spec.out) / csv_name(fw)
        write_result_csv(path, header, rows)
        print(f"{fw.name}: wrote {path}", flush=True)
    return 0


# ---- intra-op threads: recorded, not pinned (OMP_NUM_THREADS caps torch and BLAS; TensorFlow and XLA size their
# own pools, one thread per core by default), so a CPU table says what each framework was given
def torch_threads() -> str:
    import torch

    return f"{torch.get_num_threads()} (torch.get_num_threads)"


def tf_threads(tf) -> str:
    n = tf.config.threading.get_intra_op_parallelism_threads()
    return f"{n} (tf.config.threading)" if n else f"TensorFlow's default, one per core ({os.cpu_count()})"


def xla_threads() -> str:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "thread" in f]
    return " ".join(flags) if flags else f"XLA's CPU default, one per core ({os.cpu_count()})"


def blas_threads() -> str:
    """The native pools loaded in this process (BLAS, OpenMP) and their sizes, as threadpoolctl finds them."""
    from threadpoolctl import threadpool_info

    pools = dict.fromkeys(f"{p['internal_api']} {p['num_threads']}" for p in threadpool_info())  # numpy's, scipy's
    return ", ".join(pools) or "no BLAS pool found"


def tf_device(tf, strategy_devices: list[str]) -> dict[str, str]:
    """The `device` and `device_type` of a TensorFlow run, from the devices its strategy trains on ([]: the
    default strategy, which takes the first GPU when there is one). With fewer GPUs than --devices the strategy
    runs on logical CPU devices, and the record named the GPU."""
    gpus = tf.config.list_physical_devices("GPU")
    names = strategy_devices or (["/gpu:0"] if gpus else ["/cpu:0"])
    if gpus and any("gpu" in n.lower() for n in names):
        return {"device": gpus[0].name, "device_type": "gpu"}
    return {"device": cpu_name(), "device_type": "cpu"}


def tf_precision(tf) -> str:
    """TensorFlow's TF32 switch, as it ran (recorded, not pinned: on by default on GPUs that have TF32)."""
    return f"tensor_float_32_execution={tf.config.experimental.tensor_float_32_execution_enabled()}"
