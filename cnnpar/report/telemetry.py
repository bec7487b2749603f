"""Background telemetry: GPU (NVML) and host (psutil) counters sampled into a CSV, then a PNG.

One row per GPU per sample (one row with an empty `gpu` without NVML), appended and flushed as
it is taken so a crashed run keeps what it measured. Sampling runs on its own thread and reads
only driver counters: it never touches CUDA streams, so it adds no sync to the training loop.
Without NVML (no driver, no GPU) the sampler says so once and records host CPU and memory.
"""

from __future__ import annotations

import contextlib
import csv
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from cnnpar.dist import DistInfo
from cnnpar.errors import first_line
from cnnpar.report.files import TEXT, write_failure

COLUMNS = [
    "time_s",
    "gpu",
    "gpu_util_pct",
    "gpu_mem_used_mb",
    "gpu_mem_total_mb",
    "gpu_power_w",
    "gpu_sm_clock_mhz",
    "pcie_tx_mb_s",
    "pcie_rx_mb_s",
    "host_cpu_pct",
    "host_mem_used_mb",
    "host_mem_pct",
]
DEFAULT_INTERVAL_S = 1.0
# The least time a host CPU figure covers. psutil's share since the last reading counts the kernel's 10 ms ticks:
# over a few ms (the first sample, right after the counter was primed; the last, right after the one before) it
# reads 0 or 100 at random. Such a sample's host_cpu_pct is left empty, and the next one covers the time since.
MIN_CPU_WINDOW_S = 0.1


def _visible_nvml_indices(count: int) -> list[int | str]:
    """NVML numbers every GPU in the machine; CUDA_VISIBLE_DEVICES says which ones this job uses."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return list(range(count))
    out: list[int | str] = []
    for item in visible.split(","):
        item = item.strip()
        out.append(int(item) if item.isdigit() else item)  # an index or a GPU-/MIG- UUID
    return out


def _nvml_handles() -> list[tuple[str, object]]:
    """(label, handle) for every GPU this process may use; raises when NVML is unusable."""
    import pynvml

    pynvml.nvmlInit()
    handles = []
    for ident in _visible_nvml_indices(pynvml.nvmlDeviceGetCount()):
        if isinstance(ident, int):
            handles.append((str(ident), pynvml.nvmlDeviceGetHandleByIndex(ident)))
        else:
            handles.append((ident, pynvml.nvmlDeviceGetHandleByUUID(ident)))
    if not handles:
        pynvml.nvmlShutdown()
        raise RuntimeError("NVML sees no GPU")
    return handles


def _read(fn: Callable[[], float]) -> float | str:
    """One counter; a GPU that does not report it (MIG, some boards) leaves the cell empty."""
    try:
        return round(float(fn()), 2)
    except Exception:
        return ""


def _gpu_fields(handle) -> dict[str, float | str]:
    import pynvml

    mem = None
    with contextlib.suppress(Exception):
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return {
        "gpu_util_pct": _read(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
        "gpu_mem_used_mb": round(mem.used / 2**20, 1) if mem else "",
        "gpu_mem_total_mb": round(mem.total / 2**20, 1) if mem else "",
        "gpu_power_w": _read(lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
        "gpu_sm_clock_mhz": _read(lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
        # NVML reports KB/s averaged over a short (~20 ms) window
        "pcie_tx_mb_s": _read(
            lambda: pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES) / 1024.0
        ),
        "pcie_rx_mb_s": _read(
            lambda: pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES) / 1024.0
        ),
    }


class TelemetrySampler:
    """`with TelemetrySampler(path):` samples every `interval_s` until the block exits, however it exits."""

    def __init__(
        self,
        csv_path: str | Path,
        interval_s: float = DEFAULT_INTERVAL_S,
        log: Callable[[str], None] = print,
        on_sample: Callable[[list[dict]], None] | None = None,
        append: bool = False,
        say_failure: Callable[[str], None] | None = None,
        goes_on: str = "training goes on",
    ) -> None:
        self.csv_path = Path(csv_path)
        self.say_failure = say_failure or log  # where a failed write of the CSV is said (`_write_failed`)
        self.goes_on = goes_on  # what that line says continues: the sampled command's work (the doctor's measuring)
        self.failed = ""  # that line, once said: sampling stopped there
        self._kept_s: float | None = None  # time_s of the last sample flushed to the CSV
        self.append = append  # keep an earlier attempt's samples in csv_path and continue its time_s
        self.on_sample = on_sample  # also given each sample's rows (the run's TensorBoard scalars)
        self.interval_s = interval_s
        self.log = log
        self.rows = 0
        self.gpus: list[str] = []
        self._handles: list[tuple[str, object]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file = None
        self._writer = None
        self.t0 = 0.0
        self._cpu_read_at = 0.0  # when psutil's CPU counter was last read: the start of the next figure

    # ---- life cycle --------------------------------------------------------------------------
    def start(self) -> TelemetrySampler:
        try:
            self._handles = _nvml_handles()
        except Exception as e:  # no driver, no GPU, no library: host counters still work
            self.log(f"telemetry: no GPU counters (NVML: {first_line(e)}); sampling host CPU and memory only")
            self._handles = []
        self.gpus = [label for label, _ in self._handles]
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        earlier_end = _earlier_samples_end(self.csv_path) if self.append else None
        self._kept_s = earlier_end
        try:
            self._file = self.csv_path.open("w" if earlier_end is None else "a", newline="", **TEXT)
        except OSError as e:  # no sampling, as for one that fails later; the run goes on
            self._write_failed(e)
            return self
        self._writer = csv.DictWriter(self._file, fieldnames=COLUMNS)
        if earlier_end is None:
            self._writer.writeheader()
            self.t0 = time.monotonic()
        else:  # one timeline across attempts, as metrics.csv numbers a resumed run's epochs on from the checkpoint's
            self.t0 = time.monotonic() - (earlier_end + self.interval_s)
            self.log(
                f"telemetry: continuing {self.csv_path} after an earlier attempt's samples (up to {earlier_end} s)"
            )
        self._thread = threading.Thread(target=self._run, name="cnnpar-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._file is not None:
            try:
                self._file.close()
            except OSError as e:
                self._write_failed(e)
            self._file = None
        if self._handles:
            with contextlib.suppress(Exception):
                import pynvml

                pynvml.nvmlShutdown()
            self._handles = []

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def elapsed(self) -> float:
        """Seconds since sampling began, on the clock the CSV's time_s uses (for phase marks)."""
        return time.monotonic() - self.t0

    # ---- sampling ----------------------------------------------------------------------------
    def sample(self) -> None:
        import psutil

        if self.failed:  # the CSV refused a write: nothing more is sampled
            return
        vm = psutil.virtual_memory()
        host = {
            "time_s": round(self.elapsed(), 3),
            "host_cpu_pct": self._host_cpu_pct(),
            "host_mem_used_mb": round(vm.used / 2**20, 1),
            "host_mem_pct": vm.percent,
        }
        rows = [{**host, "gpu": label, **_gpu_fields(h)} for label, h in self._handles] or [{**host, "gpu": ""}]
        try:
            self._writer.writerows(rows)
            self._file.flush()
        except OSError as e:
            self._write_failed(e)
            return
        self.rows += len(rows)
        self._kept_s = host["time_s"]
        if self.on_sample is not None:
            self.on_sample(rows)

    def _write_failed(self, e: OSError) -> None:
        """The CSV's open, write, flush or close failed (a full disk, a file size limit, a folder gone read-only):
        said once (`say_failure`), naming the file and what it keeps, and sampling stops; the run goes on. Not the
        stop in one line of a run record's failed write (train's metrics.csv, a checkpoint): the samples describe the
        machine while it trained, not the training, and nothing a --resume needs is in them; on a disk that is full,
        the epoch's own records stop the run in their one line at the epoch's end."""
        if self.failed:
            return
        kept = f"the samples up to {self._kept_s} s stay in it" if self._kept_s is not None else "it keeps no sample"
        self.failed = (
            f"telemetry: {self.csv_path}: cannot be written ({write_failure(e, self.csv_path.parent)}): sampling "
            f"stopped ({kept}), and {self.goes_on}"
        )
        self.say_failure(self.failed)
        self._stop.set()
        if self._file is not None:
            with contextlib.suppress(OSError):  # close flushes the buffer's rest again: that write failed already
                self._file.close()
            self._file = None

    def _host_cpu_pct(self) -> float | str:
        """The host's CPU share since the last reading; empty where that was less than MIN_CPU_WINDOW_S ago (or
        half the interval, where sampling is faster), and the counter is then left to run on."""
        import psutil

        if time.monotonic() - self._cpu_read_at < min(MIN_CPU_WINDOW_S, self.interval_s / 2):
            return ""
        share = psutil.cpu_percent(interval=None)
        self._cpu_read_at = time.monotonic()  # after the read: the next figure's window starts no earlier
        return share

    def _prime_cpu_counter(self) -> None:
        """Starts the window of the first host CPU figure. On the sampler's own thread: psutil keeps the last
        reading of cpu_percent(interval=None) per thread, so a prime on the thread that started sampling left the
        sampler's first figure without one, and psutil gave 0.0 for it (telemetry.csv's first figure read 0.0 on a
        busy host)."""
        import psutil

        psutil.cpu_percent(interval=None)
        self._cpu_read_at = time.monotonic()

    def _run(self) -> None:
        try:
            self._prime_cpu_counter()
            self.sample()
            while not self._stop.wait(self.interval_s):
                self.sample()
            self.sample()  # the last moments of the run
        except Exception as e:  # telemetry must never take a training run down with it
            self.log(f"telemetry: sampling stopped ({type(e).__name__}: {e})")


def _earlier_samples_end(path: Path) -> float | None:
    """The time_s of the last sample an earlier attempt wrote to `path`, after cutting off a row that a kill left
    half-written; None where there is nothing to continue: no file, no sample, or columns this sampler does not
    write (the file is then started again)."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    lines = whole.decode(errors="replace").splitlines()
    if len(lines) < 2 or lines[0] != ",".join(COLUMNS):
        return None
    if len(whole) < len(data):
        with path.open("r+b") as f:
            f.truncate(len(whole))
    try:
        return float(lines[-1].split(",", 1)[0])
    except ValueError:
        return None


def plot_telemetry(
    csv_path: str | Path, png_path: str | Path, phases: list[tuple[str, float, float]] | None = None
) -> Path | None:
    """A timeline PNG from the CSV rows (never from numbers held elsewhere); phases are shaded."""
    from cnnpar.report.mpl import import_matplotlib

    matplotlib = import_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cnnpar.report.files import read_csv

    rows = read_csv(csv_path)
    if not rows:
        return None

    def series(key: str, gpu: str) -> tuple[list[float], list[float]]:
        pts = [(float(r["time_s"]), float(r[key])) for r in rows if r["gpu"] == gpu and r[key] not in ("", None)]
        return [p[0] for p in pts], [p[1] for p in pts]

    gpus = list(dict.fromkeys(r["gpu"] for r in rows if r["gpu"]))
    panels = [("host CPU %", ["host_cpu_pct"]), ("host memory (MB)", ["host_mem_used_mb"])]
    if gpus:
        panels = [
            ("GPU utilisation %", ["gpu_util_pct"]),
            ("GPU memory (MB)", ["gpu_mem_used_mb"]),
            ("power (W)", ["gpu_power_w"]),
            ("SM clock (MHz)", ["gpu_sm_clock_mhz"]),
            ("PCIe (MB/s)", ["pcie_rx_mb_s", "pcie_tx_mb_s"]),
            *panels,
        ]
    host_label = gpus[0] if gpus else ""  # host columns repeat on every GPU's row; plot them once
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.8 * len(panels)), sharex=True, squeeze=False)
    for ax, (title, keys) in zip(axes[:, 0], panels):
        for key in keys:
            for gpu in [host_label] if key.startswith("host_") else gpus or [""]:
                xs, ys = series(key, gpu)
                if xs:
                    label = key if len(keys) > 1 else None
                    label = f"gpu {gpu} {label or ''}".strip() if gpu and not key.startswith("host_") else label
                    ax.plot(xs, ys, lw=1.2, label=label)
        for i, (name, a, b) in enumerate(phases or []):
            ax.axvspan(a, b, color=f"C{i % 10}", alpha=0.12, lw=0, label=f"[{name}]" if ax is axes[-1, 0] else None)
        ax.set_ylabel(title, fontsize=8)
        ax.grid(alpha=0.3)
        if phases and ax is axes[-1, 0]:
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, frameon=False)
        elif ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel(
        "seconds since sampling began (shaded: measured phases)" if phases else "seconds since sampling began"
    )
    fig.tight_layout()
    fig.savefig(png_path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Path(png_path)


def _said_by(info: DistInfo, log: Callable[[str], None]) -> Callable[[str], None]:
    """Where this process says that its telemetry CSV cannot be written: the run's log on rank 0; on another
    machine's first process, whose run log says nothing, its standard error, named by its rank, so that a
    telemetry_rank{R}.csv cut short is not left unsaid."""
    if info.rank == 0:
        return log
    return lambda line: print(f"rank {info.rank}: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def monitor_run(
    enabled: bool,
    info: DistInfo,
    run_dir: Path,
    log: Callable[[str], None] = print,
    on_sample: Callable[[list[dict]], None] | None = None,
) -> Iterator[None]:
    """Sample while the block runs (one sampler per machine: local rank 0), then draw the timeline.

    Rank 0 writes telemetry.csv beside metrics.csv; the first process of every other machine
    writes telemetry_rank{R}.csv. A resumed run appends to its folder's file: the earlier attempts' samples stay,
    and time_s goes on from the last of them.
    """
    if not enabled or info.local_rank != 0:
        yield
        return
    stem = "telemetry" if info.rank == 0 else f"telemetry_rank{info.rank}"
    sampler = TelemetrySampler(
        Path(run_dir) / f"{stem}.csv", log=log, on_sample=on_sample, append=True, say_failure=_said_by(info, log)
    )
    sampler.start()
    try:
        yield
    finally:
        sampler.stop()
        plot_unless_failed(sampler, log)


def plot_unless_failed(
    sampler: TelemetrySampler, log: Callable[[str], None], phases: list[tuple[str, float, float]] | None = None
) -> Path | None:
    """The timeline PNG of the samples beside their CSV (None where none was drawn); none where the CSV could not be
    written (said already, once): its timeline would be cut short, on a disk that had just refused the CSV."""
    if sampler.failed:
        return None
    try:
        return plot_telemetry(sampler.csv_path, sampler.csv_path.with_suffix(".png"), phases)
    except Exception as e:  # a plot is a convenience; the CSV is the record
        log(f"telemetry: no timeline PNG ({type(e).__name__}: {e})")
        return None
