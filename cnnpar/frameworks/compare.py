"""`cnnpar compare`: run cnn3 under each framework in its own subprocess and put the results side by side.

Each framework gets a fresh `python -m cnnpar.frameworks.<runner>` with its own environment
(KERAS_BACKEND per Keras backend), so one framework's import, thread pools or device set-up cannot
disturb another's. A framework whose packages are missing is skipped with one line; a runner that
fails is marked failed with the last line of its log. Outputs, all in --out:
- one CSV per framework (see `spec` for the schema), logs/<framework>.log with each runner's output;
- cnn2d_3layer_fullconnected_3layer_summary.csv / .md: one row per framework asked for;
- cnn2d_3layer_fullconnected_3layer_summary.png: throughput and validation accuracy, drawn from the CSVs.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import shlex
import statistics
import subprocess
import sys
import threading
from pathlib import Path

from cnnpar.checkout import env_importing_this_checkout
from cnnpar.frameworks.spec import (
    CSV_PREFIX,
    FRAMEWORKS,
    Framework,
    RunSpec,
    add_spec_args,
    csv_name,
    diverged_note,
    parse_frameworks,
    read_result_csv,
    spec_from_args,
)
from cnnpar.process_tree import stop_process_tree

SUMMARY_COLUMNS = [
    "framework",
    "status",
    "csv",
    "device",
    "devices",
    "parallelism",
    "versions",
    "matmul_precision",
    "timed",
    "epochs",
    "first_epoch_s",
    "steady_epoch_s",
    "steady_images_per_s",
    "final_train_loss",
    "final_train_acc",
    "final_val_loss",
    "final_val_acc",
    "note",
    "git_rev",
    "date",
    "settings",
]
VERSION_KEYS = ("torch", "keras", "tensorflow", "jax", "pytensor")
EXTRAS = ("keras", "tensorflow", "jax", "pytensor")  # pyproject extras named after the package they install


def add_compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--frameworks",
        default="all",
        help=f"comma-separated, from: {', '.join(FRAMEWORKS)} (default: all)",
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed to each framework's run")
    add_spec_args(p)


def missing_package(fw: Framework) -> str | None:
    for pkg in fw.needs:
        if importlib.util.find_spec(pkg) is None:
            return pkg
    return None


def runner_env(fw: Framework) -> dict[str, str]:
    env = env_importing_this_checkout()  # the checkout that runs `compare` is the one its runners import
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter; errors still show
    if fw.keras_backend:
        env["KERAS_BACKEND"] = fw.keras_backend
    else:
        env.pop("KERAS_BACKEND", None)
    return env


def run_framework(fw: Framework, spec: RunSpec, timeout: float) -> tuple[str, str]:
    """Run one framework; returns (status, note). Its output goes to the console and to its log.

    The runner is stopped with every process it started at `timeout` or on any exit from here (Ctrl-C, SIGTERM):
    a runner silent in a compile or a stuck collective is stopped at the deadline, not when it next prints, and
    torchrun's workers under a `--devices` run, each in a session of its own, go with it (`stop_process_tree`).
    A run stopped so leaves no CSV."""
    logs = Path(spec.out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{fw.name}.log"
    cmd = [sys.executable, "-m", f"cnnpar.frameworks.{fw.module}", "--framework", fw.name, *spec.to_argv()]
    print(f"compare: {fw.name}: {shlex.join(cmd[1:])}", flush=True)  # quoted: an empty value pastes as ''
    lines: list[str] = []
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd,
            env=runner_env(fw),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )

        def copy_output() -> None:
            for line in proc.stdout:
                log.write(line)
                lines.append(line.rstrip())
                if line.startswith(f"{fw.name}:") or line.startswith(fw.framework + ":"):
                    print("  " + line.rstrip(), flush=True)  # the runner's own progress lines

        reader = threading.Thread(target=copy_output, name=f"compare-{fw.name}", daemon=True)
        reader.start()
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_process_tree(proc)
            rc = proc.returncode
        except BaseException:
            stop_process_tree(proc)
            (Path(spec.out) / csv_name(fw)).unlink(missing_ok=True)
            raise
        reader.join(timeout=10)  # the pipe closes once every process that holds it is gone
    if timed_out:
        (Path(spec.out) / csv_name(fw)).unlink(missing_ok=True)  # whatever it wrote before the kill
        return "failed", f"timed out after {timeout:.0f} s: stopped with its processes (log: {log_path})"
    if rc != 0:
        last = next((ln for ln in reversed(lines) if ln.strip()), "no output")
        return "failed", f"exit code {rc}: {last[:300]} (log: {log_path})"
    if not (Path(spec.out) / csv_name(fw)).is_file():
        return "failed", f"exited 0 but wrote no {csv_name(fw)} (log: {log_path})"
    return "ok", ""


def _f(value: str | float | None, digits: int = 4) -> str:
    return "" if value in (None, "") else f"{float(value):.{digits}f}"


def summary_row(fw: Framework, status: str, note: str, out: Path) -> dict[str, str]:
    row = {k: "" for k in SUMMARY_COLUMNS}
    row.update(framework=fw.name, status=status, note=note)
    path = out / csv_name(fw)
    if status != "ok":
        return row
    header, rows = read_result_csv(path)
    row.update(described(header), csv=path.name)
    diverged = first_non_finite(rows)
    if diverged is not None:
        # Keras, TensorFlow and PyTensor train on in NaN where the torch runner's engine stops: their rows keep a
        # rate, and argmax of NaN logits scores one class (a val acc of 1 / classes), neither of which means anything
        lr = header.get("spec_lr") or None
        row.update(status="failed", note=join_notes(diverged_note(*diverged, lr), note))
        return row
    row.update(figures(rows))
    # epoch 1 carries tracing/compilation: with it alone there is no steady figure to give (it would rank a
    # framework's compile as its speed), and the note says why the columns are empty
    one_epoch = "one epoch: no steady rate (epoch 1 holds tracing and compile)" if len(rows) == 1 else ""
    row["note"] = join_notes(note, header.get("note", ""), one_epoch)
    return row


def join_notes(*notes: str) -> str:
    return "; ".join(x for x in notes if x)


def first_non_finite(rows: list[dict[str, str]]) -> tuple[str, str, str] | None:
    """(epoch, "train loss" or "val loss", its value) of the first loss that is NaN or infinite, else None."""
    for r in rows:
        for key in ("train_loss", "val_loss"):
            if not math.isfinite(float(r[key])):
                return r["epoch"], key.replace("_", " "), r[key]
    return None


def described(header: dict[str, str]) -> dict[str, str]:
    """The summary's columns that say what ran and where, from a result CSV's header lines."""
    return dict(
        device=f"{header.get('device', '')} ({header.get('device_type', '')})",
        matmul_precision=header.get("matmul_precision", ""),
        timed=header.get("timed", ""),
        git_rev=header.get("git_rev", ""),
        date=header.get("date", ""),
        settings=", ".join(f"{k[5:]} {v}" for k, v in header.items() if k.startswith("spec_") and v not in ("", "0")),
        devices=header.get("devices_used", ""),
        parallelism=header.get("parallelism", ""),
        versions=" ".join(f"{k} {header[k]}" for k in VERSION_KEYS if header.get(k)),
    )


def figures(rows: list[dict[str, str]]) -> dict[str, str]:
    """The summary's timings and final metrics; the steady rate only with epochs after the first."""
    epoch_s = [float(r["epoch_s"]) for r in rows]
    speeds = [float(r["images_per_s"]) for r in rows]
    steady = len(rows) > 1
    last = rows[-1]
    return dict(
        epochs=str(len(rows)),
        first_epoch_s=_f(epoch_s[0], 2),
        steady_epoch_s=_f(statistics.median(epoch_s[1:]), 2) if steady else "",
        steady_images_per_s=_f(statistics.median(speeds[1:]), 1) if steady else "",
        final_train_loss=_f(last["train_loss"]),
        final_train_acc=_f(last["train_acc"]),
        final_val_loss=_f(last["val_loss"]),
        final_val_acc=_f(last["val_acc"]),
    )


def write_markdown(path: Path, rows: list[dict[str, str]], spec: RunSpec) -> None:
    from cnnpar.report.files import write_text_atomic

    cols = [
        ("framework", "framework"),
        ("status", "status"),
        ("device", "device"),
        ("devices", "devices"),
        ("first_epoch_s", "epoch 1 s"),
        ("steady_epoch_s", "later epochs s (median)"),
        ("steady_images_per_s", "img/s (median, later epochs)"),
        ("final_train_acc", "train acc"),
        ("final_val_acc", "val acc"),
        ("final_val_loss", "val loss"),
        ("versions", "versions"),
        ("parallelism", "parallelism"),
    ]
    lines = [
        f"# cnn3 across frameworks: {spec.data}",
        "",
        f"Epochs {spec.epochs}, global batch {spec.batch_size}, Adam lr {spec.lr}, "
        f"seed {spec.seed}, --devices {spec.devices}"
        + (f", first {spec.max_train} training samples" if spec.max_train else "")
        + (f", first {spec.max_val} validation samples" if spec.max_val else "")
        + ". What each framework's timed epochs hold (compile, tracing, CUDA graphs) and its matmul precision are "
        "in the notes below: they are not the same for all.",
        "",
        "| " + " | ".join(t for _, t in cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        lines.append("| " + " | ".join((r[k] or "").replace("|", "/") for k, _ in cols) + " |")
    notes = []
    for r in rows:
        said = "; ".join(x for x in (r["timed"], r["matmul_precision"], r["note"]) if x)
        if said:
            notes.append(f"- {r['framework']}: {said}")
    if notes:
        lines += ["", "Notes:", ""] + notes
    write_text_atomic(path, "\n".join(lines) + "\n")


def write_chart(path: Path, rows: list[dict[str, str]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_speed, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [r["framework"] for r in rows]
    timed = [r["status"] == "ok" and r["steady_images_per_s"] != "" for r in rows]  # one epoch: no steady rate
    speeds = [float(r["steady_images_per_s"]) if t else 0.0 for r, t in zip(rows, timed)]
    bars = ax_speed.barh(names, speeds, color=["tab:blue" if t else "lightgrey" for t in timed])
    for bar, r, t in zip(bars, rows, timed):
        label = f"{float(r['steady_images_per_s']):,.0f}" if t else r["status"] if r["status"] != "ok" else "one epoch"
        ax_speed.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + label, va="center", fontsize=8)
    ax_speed.invert_yaxis()
    ax_speed.set_xlabel("training images/s (median of epochs after the first)")
    ax_speed.set_title("throughput")
    for r in rows:
        if r["status"] != "ok":
            continue
        fw = FRAMEWORKS[r["framework"]]
        _, epochs = read_result_csv(out / csv_name(fw))
        ax_acc.plot(
            [int(e["epoch"]) for e in epochs], [100 * float(e["val_acc"]) for e in epochs], marker="o", label=fw.name
        )
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("validation accuracy, %")
    ax_acc.set_title("validation accuracy")
    ax_acc.grid(alpha=0.3)
    if ax_acc.lines:
        ax_acc.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


def run_compare(frameworks: list[Framework], spec: RunSpec, timeout: float = 3600.0) -> list[dict[str, str]]:
    from cnnpar.report.files import write_csv_atomic

    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for fw in frameworks:
        stale = out / csv_name(fw)
        stale.unlink(missing_ok=True)  # a failed run must not leave an older CSV looking current
        pkg = missing_package(fw)
        if pkg is not None:
            hint = f'pip install "cnnpar[{pkg}]"' if pkg in EXTRAS else f"pip install {pkg}"
            note = f"{pkg} is not installed ({hint})"
            print(f"compare: skipping {fw.name}: {note}", flush=True)
            results.append((fw, "skipped", note))
            continue
        status, note = run_framework(fw, spec, timeout)
        if status != "ok":
            print(f"compare: {fw.name} failed: {note}", flush=True)
        results.append((fw, status, note))
    rows = [summary_row(fw, status, note, out) for fw, status, note in results]
    # each row names its own device (PyTensor runs on the CPU beside GPU frameworks): all of them in the title
    device = ", ".join(dict.fromkeys(r["device"] for r in rows if r["status"] == "ok")) or "unknown"
    base = out / f"{CSV_PREFIX}_summary"
    write_csv_atomic(base.with_suffix(".csv"), rows, SUMMARY_COLUMNS)
    write_markdown(base.with_suffix(".md"), rows, spec)
    title = f"cnn3 on {Path(spec.data).name}, {spec.epochs} epochs, batch {spec.batch_size}, {device}"
    write_chart(base.with_suffix(".png"), rows, out, title)
    for r in rows:
        if r["status"] != "ok":
            speed = f"{r['status']:>16}"
        else:  # one epoch: no steady rate (the note says why)
            speed = f"{float(r['steady_images_per_s']):>10,.0f} img/s" if r["steady_images_per_s"] else f"{'-':>16}"
        acc = f"val acc {100 * float(r['final_val_acc']):.2f}%" if r["status"] == "ok" else r["note"]
        print(f"{r['framework']:<18} {speed}  {acc}")
    print(f"compare: wrote {base}.csv, .md and .png")
    return rows


def main_from_args(args: argparse.Namespace) -> int:
    frameworks = parse_frameworks(args.frameworks)
    rows = run_compare(frameworks, spec_from_args(args), args.timeout)
    return 1 if any(r["status"] == "failed" for r in rows) else 0
