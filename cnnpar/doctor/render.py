"""The doctor's outputs: flat CSV rows, a JSON record, a Markdown report, a PNG and a terminal report.

The plot is drawn from the rows in phases.csv, never from numbers held elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from cnnpar.config import dumps_toml, to_dict
from cnnpar.doctor.advise import MIN_GAIN
from cnnpar.doctor.run import DoctorReport
from cnnpar.report.files import (
    read_csv,
    write_csv_atomic,
    write_errors_explained,
    write_json_atomic,
    write_text_atomic,
)

PHASE_COLUMNS = [
    "name", "batches", "seconds", "images", "images_per_batch", "ms_per_batch", "images_per_s", "data_wait_share",
]  # fmt: skip
RECO_COLUMNS = [
    "rank", "key", "title", "action", "command", "est_gain", "basis", "tried_images_per_s", "tried_gain", "advised",
]  # fmt: skip


def phase_rows(report: DoctorReport) -> list[dict]:
    return [p.row() for p in report.phases] + [p.row() for _, _, p in report.tries]


def reco_rows(report: DoctorReport, advised: bool = True) -> list[dict]:
    """The advised recommendations, ranked; or (advised=False) those tried and not faster, unranked."""
    rows = []
    for i, r in enumerate(report.recommendations if advised else report.not_faster, 1):
        row = r.row()
        row.update(rank=i if advised else "", est_gain=round(r.est_gain, 3), advised=advised)
        if r.tried_gain is not None:
            row.update(tried_gain=round(r.tried_gain, 3), tried_images_per_s=round(r.tried_images_per_s, 2))
        rows.append(row)
    return rows


def no_advice_line(report: DoctorReport) -> str:
    """The summary when nothing is advised; it names the tries, so it never contradicts the list below it."""
    if report.not_faster:
        return "No change is advised: those tried were not measurably faster, and no other is estimated to gain more."
    if report.did_not_fit:
        return "No change is advised: those tried did not fit the device, and no other is estimated to gain more."
    return "No change is estimated to gain more than a few per cent."


DID_NOT_FIT = "Tried and did not fit the device (the baseline did: these changes are not advised):"


def not_faster_line(r) -> str:
    return f"{r.title} (`{r.action}`): estimated {_gain(r.est_gain)}, tried: {_gain(r.tried_gain)}, not advised"


def setup_line(report: DoctorReport) -> str:
    """What was measured: input shape, batch (and how it was chosen), workers, precision, GPU memory."""
    f, cfg, env = report.facts, report.cfg, report.env
    batch = f"batch {f.batch_size}" + (f" ({f.batch_from})" if f.batch_from else "")
    mem = ""
    if f.mem_used_bytes is not None and f.mem_total_bytes:
        mem = (
            f", GPU memory in use {f.mem_used_bytes / 2**30:.1f} of {f.mem_total_bytes / 2**30:.0f} GiB "
            f"({100 * f.mem_used_bytes / f.mem_total_bytes:.0f}%, the step's peak)"
        )
    return (
        f"{cfg.model.name} on {report.origin}, input {f.image_shape or '?'}, {batch}, {env['device']} "
        f"({env['device_type']}), {cfg.speed.precision}, channels_last {cfg.speed.channels_last}, compile "
        f"{cfg.speed.compile}, CUDA graphs {f.cuda_graphs}, loader {cfg.data.loader} with {f.workers} worker(s){mem}"
    )


UNRELIABLE = (
    "the measurements do not settle it (the last reason above says why); neither the verdict nor the estimates are "
    "settled."
)


def verdict_title(report: DoctorReport) -> str:
    """The verdict as the report's heading and the console panel's title say it: marked where it is unreliable."""
    return report.diagnosis.verdict + ("" if report.diagnosis.reliable else " (unreliable)")


def stopped_line(report: DoctorReport) -> str:
    """What a stop during the tries left out ("" where the doctor ran to its end)."""
    if not report.stopped:
        return ""
    return (
        f"Stopped ({report.stopped}): the phases measured before it are in this report; that try and any after it "
        "were not measured, and their recommendations keep their estimates."
    )


UNSETTLED_TRIES = (
    "The tried gains are divided by the end-to-end speed of a measurement the verdict marks unreliable: they are "
    "not settled either; re-run the doctor on a quiet host"
)


def unsettled_tries(report: DoctorReport) -> bool:
    """Whether tries were ranked against an end to end the verdict calls unreliable (a "31.01x" stood unmarked)."""
    return not report.diagnosis.reliable and any(r.tried_gain is not None for r in report.recommendations)


def step_text(report: DoctorReport) -> str:
    """How the step alone was timed: in rounds beside a half batch (compile off), else one window (a compiled step
    would compile the half batch's shape too). The report said "rounds" either way."""
    if any(p.name == "train step, half batch" for p in report.phases):
        return "The step alone is the best of 3 to 10 short rounds, alternating full and half batch"
    why = "the step is compiled" if report.cfg.speed.compile != "off" else "a batch of one image has no half"
    return f"The step alone is one window of repeated steps on one batch (no half batch: {why})"


def warm_up_text(report: DoctorReport) -> str:
    """What the figures leave out: with --warmup-steps 0 nothing, and the report said "warm-up excluded"."""
    if report.warmup_steps > 0:
        return f"warm-up excluded ({report.warmup_steps} untimed batch(es) before each phase)"
    return "no warm-up: each phase's first batch, cold, is timed"


def load_text(f) -> str:
    if f.load_avg_1m is None:
        return ""
    note = f" ({f.cores_note})" if f.cores_note else ""
    return f", load average (1 min) {f.load_avg_1m:.2f} on {f.cores} usable core(s){note}"


def batch_note(report: DoctorReport) -> str:
    """What a measurement row's batch is; with --grad-accum, one micro-batch carrying its share of the step's time.
    Each row's own size is in its batch column: the half batch and a try's batch (capped to the training split
    where a change asked for more) are not the run's, which the note alone said for every row."""
    accum = report.cfg.optim.grad_accum
    text = "ms/batch: one batch of the row's batch column's images (as measured)"
    if accum > 1:
        text += f", one micro-batch of the {accum} an optimizer step accumulates (its time spread over them)"
    return text


def _gain(g: float | None) -> str:
    return "" if g is None else f"{g:.2f}x"


def _cell(text: str) -> str:
    """`text` for a Markdown table cell: GitHub's tables split a row at every `|`, inside a code span too (a data
    path `d/my da|ta` shifted the columns), unless it is escaped."""
    return text.replace("|", "\\|")


def plot_phases(csv_path: Path, png_path: Path, verdict: str) -> Path:
    from cnnpar.report.mpl import import_matplotlib

    matplotlib = import_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_csv(csv_path)
    names = [r["name"] for r in rows][::-1]
    values = [float(r["images_per_s"]) for r in rows][::-1]
    colors = ["C2" if n.startswith("tried") else "C0" if n == "end to end" else "C7" for n in names]
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 1.4))
    bars = ax.barh(names, values, color=colors)
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=3, fontsize=8)
    ax.set_xlabel("images/s (higher is better)")
    ax.set_title(f"cnnpar doctor: {verdict}", fontsize=10)
    ax.margins(x=0.15)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path


def markdown(report: DoctorReport, pictures: list[str]) -> str:
    f, cfg, e2e = report.facts, report.cfg, report.end_to_end
    env = report.env
    lines = [
        f"# cnnpar doctor: {verdict_title(report)}",
        "",
        f"{setup_line(report)}. torch {env['torch']}, git {env['git_rev']}, {env['date']}{load_text(f)}.",
        "",
        *([f"**{stopped_line(report)}**", ""] if report.stopped else []),
        *([f"**{report.telemetry_failed}**", ""] if report.telemetry_failed else []),
        "## Verdict",
        "",
        *[f"- {r}" for r in report.diagnosis.reasons],
        "",
        *([] if report.diagnosis.reliable else [f"**Unreliable verdict:** {UNRELIABLE}", ""]),
        "## Measurements",
        "",
        f"{warm_up_text(report)[0].upper()}{warm_up_text(report)[1:]}; the device is synchronised before and "
        f"after each measured window. {step_text(report)}; {batch_note(report)}.",
        "",
        "| phase | batch | batches | ms/batch | images/s | data wait |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in phase_rows(report):
        wait = f"{100 * r['data_wait_share']:.0f}%" if r["data_wait_s"] else ""
        lines.append(
            f"| {r['name']} | {r['images_per_batch']:g} | {r['batches']} | {r['ms_per_batch']:.2f} | "
            f"{r['images_per_s']:,.1f} | {wait} |"
        )
    extra = []
    if f.fixed_share is not None:
        extra.append(f"- fixed (batch-independent) share of the step: {100 * f.fixed_share:.0f}%")
    if f.gpu_idle_share is not None:
        extra.append(f"- GPU idle within the step: {100 * f.gpu_idle_share:.0f}%")
    if f.peak_mem_share is not None:
        extra.append(f"- peak device memory: {100 * f.peak_mem_share:.0f}% of the GPU")
    if f.textbook_ratio is not None:
        extra.append(f"- reading alone / reading + textbook transform, per sample: {100 * f.textbook_ratio:.0f}%")
    lines += ["", *extra, "", "## Recommendations", ""]
    if not report.recommendations:
        lines.append(no_advice_line(report))
    else:
        lines += [
            "Estimated gains apply to the measured end-to-end speed "
            f"({e2e.images_per_s:,.1f} images/s); 'tried' is measured here with the change applied.",
            *([f"**{UNSETTLED_TRIES}**"] if unsettled_tries(report) else []),
            "",
            "| # | recommendation | do | estimated | tried | basis |",
            "| ---: | --- | --- | ---: | ---: | --- |",
        ]
        for i, r in enumerate(report.recommendations, 1):
            tried = f"{_gain(r.tried_gain)} ({r.tried_images_per_s:,.0f}/s)" if r.tried_gain is not None else ""
            do, what = _cell(r.command or r.action), _cell(f"{r.title}: {r.why}")
            lines.append(f"| {i} | {what} | `{do}` | {_gain(r.est_gain)} | {tried} | {_cell(r.basis)} |")
    if report.not_faster:
        lines += ["", f"Tried and not faster (measured here under {MIN_GAIN:g}x, so not advised):", ""]
        lines += [f"- {not_faster_line(r)}" for r in report.not_faster]
    if report.did_not_fit:
        lines += ["", DID_NOT_FIT, ""] + [f"- {line}" for _, _, line in report.did_not_fit]
    combined = [t for t in report.tries if t[0].startswith("combined")]
    for label, _, p in combined:
        lines += ["", f"{label}: {p.images_per_s:,.1f} images/s ({p.images_per_s / e2e.images_per_s:.2f}x)."]
    lines += ["", *[f"![{Path(p).stem}]({p})" for p in pictures], "", "## Resolved config", "", "```toml"]
    lines += [dumps_toml(cfg).rstrip(), "```", ""]
    return "\n".join(lines)


# a write of the report that fails (a full disk): run_doctor, which calls write_report in its folder's block, removes
# the report's files, so a re-run into the same --report-dir is not refused
NOT_WRITTEN = (
    "expected room for the doctor's report (free disk space, a higher file size limit); none of its files are kept, "
    "so the same command can run again"
)


def write_report(report: DoctorReport) -> Path:
    """The report's files in its `report_dir`: the CSV rows first, then the picture drawn from them, the JSON record
    and report.md. One that cannot be written ends the doctor with one line naming it (`write_errors_explained`)."""
    out = report.report_dir
    with write_errors_explained(out / "phases.csv", NOT_WRITTEN):
        write_csv_atomic(out / "phases.csv", phase_rows(report), PHASE_COLUMNS + ["data_wait_s"])
    with write_errors_explained(out / "recommendations.csv", NOT_WRITTEN):
        write_csv_atomic(out / "recommendations.csv", reco_rows(report) + reco_rows(report, False), RECO_COLUMNS)
    with write_errors_explained(out / "doctor.png", NOT_WRITTEN):
        pictures = [plot_phases(out / "phases.csv", out / "doctor.png", verdict_title(report)).name]
    if report.telemetry_png is not None:  # this run's: a file left in the folder by an earlier run is not
        pictures.append(report.telemetry_png.name)
    record = {
        "verdict": report.diagnosis.verdict,
        "reasons": report.diagnosis.reasons,
        "verdict_reliable": report.diagnosis.reliable,
        "stopped": report.stopped,  # "" where the doctor ran to its end
        "telemetry_failed": report.telemetry_failed,  # "" where telemetry.csv is whole (or --monitor was off)
        "warmup_steps": report.warmup_steps,
        "facts": report.facts.__dict__,
        "phases": phase_rows(report),
        "recommendations": reco_rows(report),
        "tried_not_faster": reco_rows(report, advised=False),
        "tries": [{"label": label, "change": change, **p.row()} for label, change, p in report.tries],
        "did_not_fit": [
            {"label": label, "change": change, "error": line} for label, change, line in report.did_not_fit
        ],
        "environment": report.env,
        "config": to_dict(report.cfg),
    }
    with write_errors_explained(out / "doctor.json", NOT_WRITTEN):
        write_json_atomic(out / "doctor.json", record)
    with write_errors_explained(out / "report.md", NOT_WRITTEN):
        write_text_atomic(out / "report.md", markdown(report, pictures))
    return out / "report.md"


def print_report(report: DoctorReport) -> None:
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # a log file: wide enough that the basis column stays readable
        console.width = 150
    console.print(setup_line(report))
    table = Table(title=f"measurements ({warm_up_text(report)}, device synchronised)", title_justify="left")
    columns = (
        ("phase", "left"),
        ("batch", "right"),
        ("ms/batch", "right"),
        ("images/s", "right"),
        ("data wait", "right"),
    )
    for col, just in columns:
        table.add_column(col, justify=just)
    for r in phase_rows(report):
        wait = f"{100 * r['data_wait_share']:.0f}%" if r["data_wait_s"] else ""
        batch = f"{r['images_per_batch']:g}"
        table.add_row(r["name"], batch, f"{r['ms_per_batch']:.2f}", f"{r['images_per_s']:,.1f}", wait)
    console.print(table)
    console.print(batch_note(report), highlight=False)  # below, not in the title: that wraps to the table's width
    style = {
        "data-bound": "yellow",
        "compute-bound": "green",
        "host-bound": "magenta",
        "measurements disagree": "red",
    }.get(report.diagnosis.verdict, "white")
    title = f"verdict: {verdict_title(report)}"
    console.print(Panel("\n".join(report.diagnosis.reasons), title=title, border_style=style))
    if report.recommendations:
        recos = Table(title="recommendations, best first", title_justify="left")
        for col in ("#", "recommendation", "do", "estimated", "tried", "basis"):
            recos.add_column(col, overflow="fold")
        for i, r in enumerate(report.recommendations, 1):
            recos.add_row(str(i), r.title, r.action, _gain(r.est_gain), _gain(r.tried_gain), r.basis)
        console.print(recos)
        if unsettled_tries(report):
            console.print(f"note: {UNSETTLED_TRIES.lower()}", soft_wrap=True, highlight=False)
        for i, r in enumerate(report.recommendations, 1):  # whole lines, unwrapped, so they paste as they are
            console.print(f"{i}. {r.command or r.action}", soft_wrap=True, highlight=False)
    else:
        console.print(no_advice_line(report).lower(), highlight=False)
    if report.not_faster:
        console.print("tried and not faster (not advised):", highlight=False)
        for r in report.not_faster:
            console.print(f"- {not_faster_line(r).replace('`', '')}", soft_wrap=True, highlight=False)
    if report.did_not_fit:
        console.print(DID_NOT_FIT.lower(), highlight=False)
        for _, _, line in report.did_not_fit:
            console.print(f"- {line}", soft_wrap=True, highlight=False)
    if report.stopped:
        console.print(stopped_line(report), soft_wrap=True, highlight=False)
    console.print(f"report: {report.report_dir / 'report.md'}")
