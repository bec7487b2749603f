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
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
from pathlib import Path

from cnnpar.checkout import env_importing_this_checkout
from cnnpar.errors import SIGKILL, ConfigError, raise_pending_stop
from cnnpar.frameworks.spec import (
    CSV_PREFIX,
    FRAMEWORKS,
    PARENT_ENV,
    Framework,
    RunSpec,
    add_spec_args,
    csv_name,
    diverged_note,
    load_bundle,
    parse_frameworks,
    read_result_csv,
    spec_from_args,
)
from cnnpar.process_tree import parent_env, stop_process_tree
from cnnpar.report.chance import at_chance_level

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
# A run that did not learn, though its losses stayed finite, must not read as a result (lr 10 gave "ok" rows at
# 5-12 % val acc with a val loss of 1e6). A uniform guess scores a loss of ln(classes) and a healthy run starts
# near it (He-normal cnn3 on the digits: about 5, twice ln 10) and falls: a final loss this many times ln(classes),
# or a train loss this many times its first epoch's and worse than a uniform guess, has exploded. A 1-epoch digits
# run at the default lr ends near 1.2 train / 0.4 val, against 23 for 10 classes.
EXPLODED_FACTOR = 10.0
NOT_LEARNED = "did not learn (val acc at chance)"
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


def install_hint(pkg: str) -> str:
    return f'pip install "cnnpar[{pkg}]"' if pkg in EXTRAS else f"pip install {pkg}"


def runner_env(fw: Framework) -> dict[str, str]:
    env = env_importing_this_checkout()  # the checkout that runs `compare` is the one its runners import
    env.update(parent_env(PARENT_ENV))  # the runner ends with this process however it ends (spec.runner_main)
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
    # a stop noted, not raised, inside an import (errors.stop_on_signals), `cnnpar compare`'s own as it began: the
    # runners started one after another and each trained in full before the command stopped
    raise_pending_stop()
    logs = Path(spec.out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{fw.name}.log"
    cmd = [sys.executable, "-m", f"cnnpar.frameworks.{fw.module}", "--framework", fw.name, *spec.to_argv()]
    print(f"compare: {fw.name}: {shlex.join(cmd[1:])}", flush=True)  # quoted: an empty value pastes as ''
    lines: list[str] = []
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            cmd,
            env=runner_env(fw),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # not the locale's: under one that is not UTF-8 (LC_ALL=C with PYTHONUTF8=0) a runner's line that is not
            # ASCII ended the copying thread with a UnicodeDecodeError, and nothing read the pipe after it
            encoding="utf-8",
            errors="replace",
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
        return "failed", f"timed out after {timeout:g} s: stopped with its processes (log: {log_path})"
    if rc != 0:
        return "failed", failure_note(rc, lines, log_path)
    if not (Path(spec.out) / csv_name(fw)).is_file():
        return "failed", f"exited 0 but wrote no {csv_name(fw)} (log: {log_path})"
    return "ok", ""


# a runner's own divergence (the torch runner's engine stops there): "torch_runner: error: diverged: ..."
RUNNER_DIVERGED = re.compile(r"^\w+: error: (diverged: .*)$")


def failure_note(rc: int, lines: list[str], log_path: Path) -> str:
    """The note of a runner that exited with `rc` != 0, its output `lines`. A runner killed by a signal (the
    OOM killer's SIGKILL) printed nothing of it: its last line was a healthy epoch's. A divergence reads as the
    other runners' rows say it (summary_row), without the exit code and the runner's name."""
    if rc < 0:
        sig = -rc
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        oom = "; out of memory?" if sig == SIGKILL else ""
        return f"killed by {name} (signal {sig}{oom}) (log: {log_path})"
    last = next((ln for ln in reversed(lines) if ln.strip()), "no output")
    diverged = RUNNER_DIVERGED.match(last)
    if diverged:
        return diverged.group(1)
    return f"exit code {rc}: {last[:300]} (log: {log_path})"


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
    classes = int(header.get("num_classes") or 0)  # 0: a CSV from before the header had it
    lr = header.get("spec_lr") or None
    diverged = first_non_finite(rows)
    if diverged is not None:
        # Keras, TensorFlow and PyTensor train on in NaN where the torch runner's engine stops: their rows keep a
        # rate, and argmax of NaN logits scores one class (a val acc of 1 / classes), neither of which means anything
        row.update(status="failed", note=join_notes(diverged_note(*diverged, lr), note))
        return row
    blown = exploded(rows, classes)
    if blown is not None:  # as meaningless as NaN, though finite
        epoch, what, loss, why = blown
        row.update(status="failed", note=join_notes(diverged_note(epoch, what, loss, lr, why), note))
        return row
    row.update(figures(rows))
    # epoch 1 carries tracing/compilation: with it alone there is no steady figure to give (it would rank a
    # framework's compile as its speed), and the note says why the columns are empty
    one_epoch = ONE_EPOCH_NOTE if len(rows) == 1 else ""
    chance = NOT_LEARNED if at_chance(rows, classes) else ""
    row["note"] = join_notes(chance, note, header.get("note", ""), pytensor_mode(header), one_epoch)
    return row


ONE_EPOCH_NOTE = "one epoch: no steady rate (epoch 1 may hold tracing, compilation and warm-up)"


def exploded(rows: list[dict[str, str]], classes: int) -> tuple[str, str, str, str] | None:
    """(epoch, "train loss" or "val loss", its value, why) where the last epoch's loss has exploded, else None:
    above EXPLODED_FACTOR x ln(classes), or a train loss EXPLODED_FACTOR x its first epoch's and above
    ln(classes). A run that recovered by its last epoch is not one (the verdict is on what it ends with)."""
    if classes < 2:
        return None
    uniform = math.log(classes)
    limit = EXPLODED_FACTOR * uniform
    last = rows[-1]
    for key in ("val_loss", "train_loss"):
        if float(last[key]) > limit:
            why = f"is above {EXPLODED_FACTOR:g} x ln({classes} classes) = {limit:.1f}"
            return last["epoch"], key.replace("_", " "), last[key], why
    first, final = float(rows[0]["train_loss"]), float(last["train_loss"])
    if len(rows) > 1 and final > max(EXPLODED_FACTOR * first, uniform):
        why = f"grew above {EXPLODED_FACTOR:g} x epoch 1's {first:.4g} and above ln({classes} classes) = {uniform:.2f}"
        return last["epoch"], "train loss", last["train_loss"], why
    return None


def at_chance(rows: list[dict[str, str]], classes: int) -> bool:
    """The last epoch's val acc at chance level (report.chance): the run learned nothing it shows."""
    return at_chance_level(float(rows[-1]["val_acc"]), classes)


def learned(row: dict[str, str]) -> bool:
    """False for an `ok` row whose run ended at chance (summary_row's note says so)."""
    return NOT_LEARNED not in row["note"]


def pytensor_mode(header: dict[str, str]) -> str:
    """Which PyTensor mode and linker ran: FAST_COMPILE's Python linker runs some 15x slower than the C one and
    keeps the CSV name `pytensor_c`."""
    if not header.get("pytensor_mode"):
        return ""
    return f"PyTensor mode {header['pytensor_mode']}, linker {header.get('pytensor_linker', '?')}"


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
        settings=", ".join(f"{k[5:]} {v}" for k, v in header.items() if k.startswith("spec_") and not unset(k, v)),
        devices=header.get("devices_used", ""),
        parallelism=header.get("parallelism", ""),
        versions=" ".join(f"{k} {header[k]}" for k in VERSION_KEYS if header.get(k)),
    )


def unset(key: str, value: str) -> bool:
    """A spec value the settings column leaves out: empty, or max_train / max_val at 0 (all). Seed 0 is a seed."""
    return value == "" or (key in ("spec_max_train", "spec_max_val") and value == "0")


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
        cells = {**r, "status": table_status(r)}
        lines.append("| " + " | ".join((cells[k] or "").replace("|", "/") for k, _ in cols) + " |")
    notes = []
    for r in rows:
        said = "; ".join(x for x in (r["timed"], r["matmul_precision"], r["note"]) if x)
        if said:
            notes.append(f"- {r['framework']}: {said}")
    if notes:
        lines += ["", "Notes:", ""] + notes
    write_text_atomic(path, "\n".join(lines) + "\n")


def table_status(row: dict[str, str]) -> str:
    return row["status"] if learned(row) else f"{row['status']}, {NOT_LEARNED}"


def bar_label(row: dict[str, str]) -> str:
    """A throughput bar's label: the rate and the devices it ran on (with --devices N some frameworks run on one),
    or why there is no rate."""
    if row["status"] != "ok":
        return row["status"]
    if not row["steady_images_per_s"]:
        return "one epoch"
    devices = f" on {row['devices']} dev" if row["devices"] else ""
    chance = ", did not learn" if not learned(row) else ""
    return f"{float(row['steady_images_per_s']):,.0f}{devices}{chance}"


def chart_title(spec: RunSpec, rows: list[dict[str, str]]) -> str:
    # each row names its own device (PyTensor runs on the CPU beside GPU frameworks): all of them in the title
    device = ", ".join(dict.fromkeys(r["device"] for r in rows if r["status"] == "ok")) or "unknown"
    asked = (f", --devices {spec.devices}" if spec.devices > 1 else "") + (
        f", --max-train {spec.max_train}" if spec.max_train else ""
    )
    return f"cnn3 on {Path(spec.data).name}, {spec.epochs} epochs, batch {spec.batch_size}{asked}, {device}"


def bar_colour(row: dict[str, str]) -> str:
    if row["status"] != "ok" or not row["steady_images_per_s"]:
        return "lightgrey"
    return "tab:blue" if learned(row) else "tab:orange"


def write_chart(path: Path, rows: list[dict[str, str]], out: Path, title: str) -> None:
    from cnnpar.report.mpl import import_matplotlib

    matplotlib = import_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_speed, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [r["framework"] for r in rows]
    timed = [r["status"] == "ok" and r["steady_images_per_s"] != "" for r in rows]  # one epoch: no steady rate
    speeds = [float(r["steady_images_per_s"]) if t else 0.0 for r, t in zip(rows, timed)]
    bars = ax_speed.barh(names, speeds, color=[bar_colour(r) for r in rows])
    for bar, r in zip(bars, rows):
        ax_speed.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + bar_label(r), va="center", fontsize=8)
    ax_speed.margins(x=0.35)  # room for the labels right of the longest bar (bars stay pinned at 0)
    ax_speed.invert_yaxis()
    ax_speed.set_xlabel("training images/s (median of epochs after the first)")
    ax_speed.set_title("throughput")
    for r in rows:
        if r["status"] != "ok":
            continue
        fw = FRAMEWORKS[r["framework"]]
        _, epochs = read_result_csv(out / csv_name(fw))
        label = fw.name if learned(r) else f"{fw.name}: did not learn"
        ax_acc.plot(
            [int(e["epoch"]) for e in epochs], [100 * float(e["val_acc"]) for e in epochs], marker="o", label=label
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
    from cnnpar.report.files import check_out_folder, write_csv_atomic

    out = Path(spec.out)
    # before any data is loaded or framework run: a name over NAME_MAX ended in an OSError traceback at the mkdir
    check_out_folder(out, "compare --out")
    missing = {fw.name: missing_package(fw) for fw in frameworks}
    if all(pkg is not None for pkg in missing.values()):
        # settings this machine cannot run, as a typo in --frameworks is: it wrote a summary of skipped rows, removed
        # the frameworks' earlier CSVs from --out and exited 1, a tool's failure, with no tool run
        each = "; ".join(f"{name} needs {pkg}: {install_hint(pkg)}" for name, pkg in missing.items())
        raise ConfigError(
            f"compare --frameworks {','.join(missing)}: none of them is installed here ({each}): expected a "
            "framework that is installed (torch always is), or install one"
        )
    # what only the data can tell (a batch larger than the training set, no validation split, non-square images),
    # once and before any runner: each runner found it on its own after its imports
    load_bundle(spec)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for fw in frameworks:
        stale = out / csv_name(fw)
        stale.unlink(missing_ok=True)  # a failed run must not leave an older CSV looking current
        pkg = missing[fw.name]
        if pkg is not None:
            note = f"{pkg} is not installed ({install_hint(pkg)})"
            print(f"compare: skipping {fw.name}: {note}", flush=True)
            results.append((fw, "skipped", note))
            continue
        status, note = run_framework(fw, spec, timeout)
        if status != "ok":
            print(f"compare: {fw.name} failed: {note}", flush=True)
        results.append((fw, status, note))
    rows = [summary_row(fw, status, note, out) for fw, status, note in results]
    base = out / f"{CSV_PREFIX}_summary"
    write_csv_atomic(base.with_suffix(".csv"), rows, SUMMARY_COLUMNS)
    write_markdown(base.with_suffix(".md"), rows, spec)
    write_chart(base.with_suffix(".png"), rows, out, chart_title(spec, rows))
    for r in rows:
        print(console_line(r))
    print(f"compare: wrote {base}.csv, .md and .png")
    return rows


def console_line(r: dict[str, str]) -> str:
    if r["status"] != "ok":
        return f"{r['framework']:<18} {r['status']:>16}  {r['note']}"
    # one epoch: no steady rate (the note says why)
    speed = f"{float(r['steady_images_per_s']):>10,.0f} img/s" if r["steady_images_per_s"] else f"{'-':>16}"
    chance = f" {NOT_LEARNED}" if not learned(r) else ""
    acc = f"val acc {100 * float(r['final_val_acc']):.2f}%{chance}"
    return f"{r['framework']:<18} {speed}  {r['devices'] or '?':>2} dev  {acc}"


def exit_status(rows: list[dict[str, str]]) -> tuple[int, str]:
    """(exit status, the line that says why where it is not 0): 1 where a framework failed (a divergence
    included) or ended at chance. (Where none asked for is installed, run_compare refused the settings first.)"""
    failed = [r["framework"] for r in rows if r["status"] == "failed"]
    chance = [r["framework"] for r in rows if r["status"] == "ok" and not learned(r)]
    if failed or chance:
        said = [
            f"failed: {', '.join(failed)}" if failed else "",
            f"{NOT_LEARNED}: {', '.join(chance)}" if chance else "",
        ]
        return 1, f"compare: {'; '.join(x for x in said if x)}"
    return 0, ""


# keras.utils.set_random_seed seeds numpy's legacy generator too, which takes a seed below 2**32 (RunSpec's is 2**63)
KERAS_SEED_LIMIT = 2**32


def check_keras_seed(frameworks: list[Framework], seed: int) -> None:
    """A --seed the Keras runners cannot take, refused before any runner starts: each Keras one that would run
    (not skipped as not installed) failed on its own with numpy's "Seed must be between 0 and 2**32 - 1", exit 1."""
    keras = [fw.name for fw in frameworks if fw.framework == "keras" and missing_package(fw) is None]
    if keras and seed >= KERAS_SEED_LIMIT:
        raise ConfigError(
            f"--seed = {seed}: {', '.join(keras)} seed numpy's generator, which takes 0 <= value < 2**32: expected a "
            "smaller --seed, or --frameworks without Keras"
        )


def main_from_args(args: argparse.Namespace) -> int:
    if not args.timeout > 0 or not math.isfinite(args.timeout):  # NaN too
        raise ConfigError(f"--timeout {args.timeout:g}: expected a number of seconds > 0")
    frameworks = parse_frameworks(args.frameworks)
    spec = spec_from_args(args)
    check_keras_seed(frameworks, spec.seed)
    rows = run_compare(frameworks, spec, args.timeout)
    status, line = exit_status(rows)
    if line:
        print(line, flush=True)
    return status
