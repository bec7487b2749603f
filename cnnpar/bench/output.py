"""Bench results as files: flat CSV rows (schema in docs/bench.md), Markdown tables, PNG bar charts.

Pictures are drawn from the rows, never from typed numbers. Matplotlib is used through its
object API with the Agg canvas, so nothing here switches a global backend or needs a display.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cnnpar.report.files import atomic_write, write_csv_atomic, write_errors_explained, write_text_atomic

from .meta import META_COLUMNS

# The files each measuring mode writes into its results folder (compare's Markdown may go anywhere).
LADDER_FILES = ("ladder.csv", "ladder.md", "throughput.png", "step_time.png")
DDP_PREFIX = "ddp"  # the DDP rows beside a ladder: bench/ddp_scaling.py writes <prefix>.csv and <prefix>.json
DDP_FILES = (f"{DDP_PREFIX}.csv", f"{DDP_PREFIX}.json")
CLAIMS_FILES = ("claims.csv", "claims.md")
TTA_FILES = ("time_to_accuracy.csv", "time_to_accuracy.md")
# a bench's results (report.files.results_in): in an --out, an earlier bench's (refused); in a stopped bench's folder,
# its rows so far (kept)
RESULT_FILES = (*LADDER_FILES, *DDP_FILES, *CLAIMS_FILES, *TTA_FILES)


RUNG_COLUMNS = [
    "rung",
    "name",
    "technique",
    "builds_on",
    "needs",
    "loader",
    "workers",
    "pin_memory",
    "persistent_workers",
    "prefetch_stream",
    "resident",
    "precision",
    "channels_last",
    "compile",
    "compile_tuning",
    "compile_tiling",
    "stem_space_to_depth",
    "cuda_graphs",
    "cudnn_benchmark",
    "continues",
    "status",
    "error",
    "images_per_s",
    "images_per_s_min",
    "images_per_s_max",
    "step_ms",
    "grad_accum",
    "steps_per_repeat",
    "repeats_run",
    "warmup_steps_run",
    "data_wait_share",
    "main_cpu_pct",
    "host_load_1m",
    "peak_mem_mb",
    "peak_mem_kind",
    "mfu",
    "warmup_s",
    "speedup_vs_baseline",
    "prev_rung",
    "speedup_vs_prev",
]
LADDER_COLUMNS = META_COLUMNS + RUNG_COLUMNS

CLAIM_COLUMNS = META_COLUMNS + [
    "claim",
    "claim_text",
    "claimed_ratio",
    "verdict",
    "measured_ratio",
    "baseline_value",
    "variant_value",
    "unit",
    "method",
    "note",
    "workload",
    "stand_in",
    "ratio_low",
    "ratio_high",
    "baseline_min",
    "baseline_max",
    "variant_min",
    "variant_max",
    "steps_per_repeat",
    "seconds",
    "config",
]

TTA_COLUMNS = META_COLUMNS + [
    "seed",
    "target",
    "reached",
    "epochs",
    "max_epochs",
    "steps",
    "wall_s",
    "wall_with_compile_s",
    "train_s",
    "eval_s",
    "compile_s",
    "final_val_acc",
    "best_val_acc",
    "acc_by_epoch",
    "precision",
    "channels_last",
    "compile",
    "loader",
    "optimizer",
    "lr",
    "status",
    "error",
]


def _num(row: dict, key: str) -> float | None:
    v = row.get(key, "")
    if v in ("", None):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "" if v is None else f"{format(v, spec)}{suffix}"


def _round_floats(rows: list[dict], digits: int = 6) -> list[dict]:
    return [{k: (round(v, digits) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]


def metadata_lines(row: dict, timed_steps: bool = True) -> list[str]:
    lines = [
        f"- device: {row.get('device', '')} ({row.get('device_type', '')}), driver {row.get('driver') or 'n/a'}, "
        f"torch {row.get('torch', '')}, CUDA {row.get('cuda') or 'n/a'}, {row.get('host_cpus', '')} host CPUs "
        f"({row.get('torch_threads', '')} torch threads), "
        f"world size {row.get('world_size', '')}",
        f"- model {row.get('model', '')} on {row.get('data', '')} ({row.get('image_shape', '')}), "
        f"batch {row.get('batch_size', '')}",
        timing_line(row),
        f"- peak for MFU: {row.get('peak_tflops', '')} TFLOP/s ({row.get('peak_kind', '')}), measured in this run; "
        f"{row.get('gflops_per_image', '')} GFLOP per image (forward + backward)",
        f"- git {row.get('git_rev', '')}, {row.get('date', '')}",
    ]
    return lines if timed_steps else [ln for ln in lines if "warm-up steps" not in ln]


def timing_line(row: dict) -> str:
    """How the figures were measured, in the counts this run ran with: a run of `--repeats 1` said "figures are
    medians, ranges the slowest and fastest repeat" and "fewer repeats (at least 3)" of its one sample each."""
    from .timing import MIN_REPEATS, MIN_STEPS, SLOW_STEP_S

    warmup, steps, repeats = (row.get(k, "") for k in ("warmup_steps", "timed_steps", "repeats"))
    if _num(row, "repeats") == 1:
        figures = "figures are single samples: no range, noise unknown"
    else:
        figures = "figures are medians, ranges the slowest and fastest repeat"
    seconds = _num(row, "timed_s")
    if not seconds:
        return f"- {warmup} warm-up steps, then {repeats} repeats, {steps} timed steps each; {figures}"
    # Timing.warm cuts the warm-up at 2 steps, Timing.plan the repeats to MIN_REPEATS: only above those
    cut = f" (2 where the second still takes {SLOW_STEP_S:g} s or more)" if (_num(row, "warmup_steps") or 0) > 2 else ""
    fewer = ""
    if (_num(row, "repeats") or 0) > MIN_REPEATS:
        fewer = f", and where even that takes longer, fewer repeats (at least {MIN_REPEATS})"
    least = min(MIN_STEPS, int(_num(row, "timed_steps") or MIN_STEPS))
    return (
        f"- {warmup} warm-up steps{cut}, then {repeats} repeats of timed steps sized from the last warm-up step so "
        f"the repeats take about {seconds:g} s: at least {least} steps per repeat (1 for steps of {SLOW_STEP_S:g} s "
        f"or more), at most {steps}{fewer}; {figures} (each row's counts are its repeats x steps)"
    )


def peak_mem_label(kinds: set[str]) -> str:
    """A column heading that says what the peak-memory figures are."""
    if kinds and all(k.startswith("process_") for k in kinds):
        return "peak RSS MB"
    if kinds == {"cuda_max_allocated"}:
        return "peak CUDA alloc MB"
    return "peak MB"


def one_repeat(row: dict) -> bool:
    """A row measured once (--repeats 1): its "range" is one figure, and no noise was measured."""
    return str(row.get("repeats_run", "")).strip() == "1"


def spread_text(row: dict, key: str = "images_per_s") -> str:
    """The slowest and fastest repeat, and half their gap over the median: "6,610-6,720 (±0.8%)"; a row of one
    repeat says its noise is unknown (it showed ±0.0%, as if measured without noise)."""
    mid, low, high = (_num(row, k) for k in (key, f"{key}_min", f"{key}_max"))
    if mid is None or low is None or high is None or not mid:
        return ""
    if one_repeat(row):
        return "one repeat: noise unknown"
    return f"{low:,.0f}-{high:,.0f} (±{50 * (high - low) / mid:.1f}%)"


def has_range(row: dict, key: str = "images_per_s") -> bool:
    """Does the row hold its repeats' slowest and fastest figures (rows of older ladders do not, nor does a row of
    one repeat, whose "range" is its one figure)?"""
    return None not in (_num(row, f"{key}_min"), _num(row, f"{key}_max")) and not one_repeat(row)


def noise_mark(a: dict, b: dict, key: str = "images_per_s") -> str:
    """What a ratio of two rows' rates claims: ", inside the noise" where their repeats overlap, ", noise unknown"
    where either row has no range (one repeat, or an older ladder), else ""."""
    if not (has_range(a, key) and has_range(b, key)):
        return ", noise unknown"
    return ", inside the noise" if inside_noise(a, b, key) else ""


def inside_noise(a: dict, b: dict, key: str = "images_per_s") -> bool:
    """Do the repeats of two rows overlap, so that their difference is inside the noise?"""
    lo_a, hi_a, lo_b, hi_b = (_num(r, f"{key}_{e}") for r in (a, b) for e in ("min", "max"))
    if None in (lo_a, hi_a, lo_b, hi_b):
        return False
    return lo_a <= hi_b and lo_b <= hi_a


def ladder_markdown(rows: list[dict]) -> str:
    # older ladders named the kind column mem_kind
    kinds = {k for k in (r.get("peak_mem_kind") or r.get("mem_kind") for r in rows) if k}
    by_name = {r["name"]: r for r in rows}
    head = (
        "| # | rung | technique | status | images/s | range of repeats | repeats x steps | step ms | data wait "
        f"| {peak_mem_label(kinds)} | MFU | x baseline | x previous |"
    )
    lines = ["# Technique ladder", "", *metadata_lines(rows[0] if rows else {}), "", head, "|" + "---|" * 13]
    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('error', '')}"
        prev = _fmt(_num(r, "speedup_vs_prev"), ".2f", "x")
        if prev and r.get("prev_rung") != r.get("builds_on"):
            prev += f" (vs {r['prev_rung']})"
        if prev:
            prev += noise_mark(r, by_name.get(r.get("prev_rung"), {}))
        base = _fmt(_num(r, "speedup_vs_baseline"), ".2f", "x")
        # the same overlap test as x previous: a ratio whose ranges overlap the baseline's is no measured gain
        if base and r.get("name") != "baseline":
            base += noise_mark(r, by_name.get("baseline", {}))
        shape = f"{r['repeats_run']} x {r['steps_per_repeat']}" if r.get("repeats_run") not in ("", None) else ""
        technique = r["technique"] + (f" (on {r['continues']}'s trainer)" if r.get("continues") else "")
        lines.append(
            f"| {r['rung']} | {r['name']} | {technique} | {status.replace('|', '/')} "
            f"| {_fmt(_num(r, 'images_per_s'), ',.0f')} | {spread_text(r)} | {shape} "
            f"| {_fmt(_num(r, 'step_ms'), '.2f')} "
            f"| {_fmt(_num(r, 'data_wait_share') and 100 * _num(r, 'data_wait_share'), '.0f', '%')} "
            f"| {_fmt(_num(r, 'peak_mem_mb'), ',.0f')} | {_fmt(_num(r, 'mfu') and 100 * _num(r, 'mfu'), '.2f', '%')} "
            f"| {base} | {prev} |"
        )
    loads = [v for v in (_num(r, "host_load_1m") for r in rows) if v is not None]
    load = (
        f" The host's 1-minute load average was {min(loads):.1f} to {max(loads):.1f} after the rungs." if loads else ""
    )
    lines += [
        "",
        "Peak memory is `torch.cuda.max_memory_allocated` on CUDA (the tensors) and the process's "
        "resident memory (RSS: Python, libraries and data included) on the CPU. "
        "x previous compares with the nearest measured rung this one builds on; *inside the noise* (in either "
        "x column, and on the throughput plot's labels) when the two rungs' ranges of repeats overlap. "
        "A rung *on another's trainer* was measured on the "
        "Trainer (model, compile, optimizer) of the rung it builds on, its own switch applied in place: "
        f"the step a new Trainer would run, without a second compile.{load}",
    ]
    return "\n".join(lines) + "\n"


def _save_figure(fig, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=120, bbox_inches="tight"))


def _title(rows: list[dict]) -> str:
    r = rows[0] if rows else {}
    return f"{r.get('model', '')} {r.get('image_shape', '')} batch {r.get('batch_size', '')} on {r.get('device', '')}"


def throughput_labels(rows: list[dict]) -> list[str]:
    """The bar labels of the throughput plot: images/s (or the status) and the ratio to the baseline."""
    base = next((r for r in rows if r["name"] == "baseline"), {})
    labels = []
    for r in rows:
        label = f"{_num(r, 'images_per_s') or 0.0:,.0f}" if r["status"] == "ok" else r["status"]
        sp = _num(r, "speedup_vs_baseline")
        if sp is not None:
            # marked as in the table's x baseline column, so the picture claims no more than the table
            noise = noise_mark(r, base) if r is not base else ""
            label += f"  ({sp:.2f}x{noise})"
        labels.append(label)
    return labels


def plot_throughput(rows: list[dict], path: Path) -> None:
    """Images/s per rung; failed and skipped rungs keep their place with a label instead of a bar."""
    from cnnpar.report.mpl import import_matplotlib

    import_matplotlib()
    from matplotlib.figure import Figure

    names = [r["name"] for r in rows]
    values = [_num(r, "images_per_s") or 0.0 for r in rows]
    fig = Figure(figsize=(8, 0.45 * len(rows) + 1.5))
    ax = fig.add_subplot()
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, values, color="#4c72b0")
    top = max(values, default=0.0) or 1.0
    for y, label, v in zip(ys, throughput_labels(rows), values):
        ax.text(v + 0.01 * top, y, label, va="center", fontsize=8)
    ax.set_yticks(ys, names)
    ax.set_xlim(0, top * 1.3)
    ax.set_xlabel("images/s (median of repeats)")
    ax.set_title(_title(rows), fontsize=9)
    _save_figure(fig, path)


def plot_step_time(rows: list[dict], path: Path) -> None:
    """Step time split into waiting for data and the rest (compute, copies, optimizer)."""
    from cnnpar.report.mpl import import_matplotlib

    import_matplotlib()
    from matplotlib.figure import Figure

    names = [r["name"] for r in rows]
    step = [_num(r, "step_ms") or 0.0 for r in rows]
    wait = [s * (_num(r, "data_wait_share") or 0.0) for s, r in zip(step, rows)]
    rest = [s - w for s, w in zip(step, wait)]
    fig = Figure(figsize=(8, 0.45 * len(rows) + 1.5))
    ax = fig.add_subplot()
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, wait, color="#dd8452", label="waiting for data")
    ax.barh(ys, rest, left=wait, color="#4c72b0", label="compute and the rest")
    ax.set_yticks(ys, names)
    ax.set_xlabel("ms per step (median of repeats)")
    ax.set_title(_title(rows), fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    _save_figure(fig, path)


ROOM = "expected room for the bench's results (free disk space, a higher file size limit)"


def _write_results(files: list[Path], writes: list[Callable[[Path], None]]) -> list[Path]:
    """Each of `files` by its write, in order, the CSV rows first. One that cannot be written (a full disk) ends the
    bench in one line naming it and saying whether the rows measured are kept: it ended in a traceback after all the
    measuring, with ladder.csv written and whole and nothing saying so."""
    for i, (path, write) in enumerate(zip(files, writes)):
        kept = f"the rows measured are kept, whole, in {files[0]}" if i else "the rows measured are not saved"
        with write_errors_explained(path, f"{ROOM}; {kept}"):
            write(path)
    return files


def write_ladder(out_dir: Path, rows: list[dict]) -> list[Path]:
    files = [Path(out_dir) / n for n in LADDER_FILES]
    writes = [
        lambda p: write_csv_atomic(p, _round_floats(rows), LADDER_COLUMNS),
        lambda p: write_text_atomic(p, ladder_markdown(rows)),
        lambda p: plot_throughput(rows, p),
        lambda p: plot_step_time(rows, p),
    ]
    return _write_results(files, writes)


def claims_markdown(rows: list[dict]) -> str:
    r0 = rows[0] if rows else {}
    lines = ["# Founding-document claims, measured", "", metadata_lines(r0)[0], timing_line(r0)]
    lines += [f"- git {r0.get('git_rev', '')}, {r0.get('date', '')}", ""]
    lines += [
        "| claim | workload | claimed | measured (median, range of repeats) | verdict | how | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        measured = _fmt(_num(r, "measured_ratio"), ".2f", "x")
        if measured and _num(r, "ratio_low") is not None:
            measured += f", {_num(r, 'ratio_low'):.2f}-{_num(r, 'ratio_high'):.2f}x"
        if measured and r.get("baseline_value") not in ("", None):
            a, b = _fmt(_num(r, "baseline_value"), ".4g"), _fmt(_num(r, "variant_value"), ".4g")
            measured += f" ({a} -> {b} {r['unit']})"
        workload = r.get("workload", "")
        if r.get("stand_in"):
            workload += f" ({r['stand_in']})"
        cells = [
            r["claim_text"],
            workload,
            _fmt(_num(r, "claimed_ratio"), ".2f", "x"),
            measured,
            r["verdict"],
            r.get("method", ""),
            r.get("note", ""),
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    took = [v for v in (_num(r, "seconds") for r in rows) if v is not None]
    lines += [
        "",
        "A claim is *confirmed* when the measured effect (median ratio - 1) is at least half the claimed "
        "effect, in the claimed direction, and the whole range of the ratio (the worst and the best pairing "
        "of the two sides' repeats) lies beyond 1; *inside the noise* when the median would confirm it but "
        "the range reaches 1; otherwise *not reproduced*, with *(difference inside the noise)* when the "
        "range reaches 1. Ratios are oriented so that the claim's direction is > 1. A claim with no range "
        "was measured once per side (a compile time, a memory size): its verdict says *(single sample each, "
        "noise unknown)*. A claim measured on a stand-in for the model it names is *not comparable (measured "
        "on a stand-in)*: its ratio is about another model, so it neither confirms nor refutes the claim.",
    ]
    if took:
        lines.append(f"Measuring took {sum(took):.0f} s in all.")
    return "\n".join(lines) + "\n"


def write_claims(out_dir: Path, rows: list[dict]) -> list[Path]:
    files = [Path(out_dir) / n for n in CLAIMS_FILES]
    writes = [
        lambda p: write_csv_atomic(p, _round_floats(rows), CLAIM_COLUMNS),
        lambda p: write_text_atomic(p, claims_markdown(rows)),
    ]
    return _write_results(files, writes)


def tta_markdown(rows: list[dict]) -> str:
    lines = ["# Time to accuracy", "", *metadata_lines(rows[0] if rows else {}, timed_steps=False), ""]
    lines += [
        "| seed | target | reached | epochs | wall s | wall s with compile | train s | eval s | final acc |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("status", "ok") != "ok":  # a seed whose run raised: no times, the error instead
            lines.append(f"| {r['seed']} | {100 * float(r['target']):.2f}% | {r['status']}: {r['error']} |||||||")
            continue
        lines.append(
            f"| {r['seed']} | {100 * float(r['target']):.2f}% | {r['reached']} | {r['epochs']}/{r['max_epochs']} "
            f"| {float(r['wall_s']):.2f} | {float(r['wall_with_compile_s']):.2f} | {float(r['train_s']):.2f} "
            f"| {float(r['eval_s']):.2f} | {100 * float(r['final_val_acc']):.2f}% |"
        )
    return "\n".join(lines) + "\n"


def write_tta(out_dir: Path, rows: list[dict]) -> list[Path]:
    files = [Path(out_dir) / n for n in TTA_FILES]
    writes = [
        lambda p: write_csv_atomic(p, _round_floats(rows), TTA_COLUMNS),
        lambda p: write_text_atomic(p, tta_markdown(rows)),
    ]
    return _write_results(files, writes)
