"""Two ladder CSVs side by side: rung by rung images/s and their ratio, and what differs in the setup."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from cnnpar.errors import UserError
from cnnpar.report.files import TEXT

from .output import _num, has_range, inside_noise

REQUIRED = ("name", "status", "images_per_s", "step_ms")
LADDER_CSV = "a ladder.csv written by `cnnpar bench`"  # what --compare expects, as its errors say
SETUP_KEYS = (
    "device",
    "driver",
    "torch",
    "cuda",
    "host_cpus",
    "model",
    "data",
    "image_shape",
    "batch_size",
    "grad_accum",  # step_ms is per optimizer step, of this many batches
    # how it was timed and on how many threads and processes: each changes the figures (torch_threads 1 against
    # 2 on a 2-core CPU made a ratio that the table showed as if the setups matched)
    "torch_threads",
    "world_size",
    "warmup_steps",
    "timed_steps",
    "repeats",
    "timed_s",
    "git_rev",
    "date",
)
# what is expected to differ between two runs and leaves their figures alone: the others, differing, are in each ratio
NOT_IN_THE_FIGURES = ("git_rev", "date")


def read_ladder_csv(path: str | Path) -> list[dict[str, str]]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found (expected {LADDER_CSV})")
    try:
        with path.open(newline="", **TEXT) as f:
            reader = csv.DictReader(f)
            rows, lines = [], []  # each row's last line in the file, as an editor counts (the header is line 1)
            for row in reader:
                rows.append(row)
                lines.append(reader.line_num)
            header = reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as e:
        # a field past csv's size limit (an image or archive given as A.csv): the error alone named no remedy
        raise UserError(
            f"{path}: not a readable CSV ({e}): expected {LADDER_CSV}, with the columns {', '.join(REQUIRED)}"
        ) from None
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}: expected {LADDER_CSV}")
    if not rows:
        raise UserError(f"{path}: holds no rows: expected one row per ladder rung")
    for k, (line, row) in enumerate(zip(lines, rows), 1):
        check_rate(path, f"line {line} (data row {k}, rung {row.get('name') or ''!r})", row)
    return rows


def check_rate(path: Path, where: str, row: dict[str, str]) -> None:
    """A measured row's images_per_s is a number (empty: not measured), or the comparison stops in one line: its
    ratios are computed from it."""
    value = row.get("images_per_s") or ""
    if row.get("status") != "ok" or not value:
        return
    try:
        finite = math.isfinite(float(value))
    except ValueError:
        finite = False
    if not finite:
        raise UserError(
            f"{path}, {where}, column 'images_per_s': {value!r} is not a number: expected images per second"
        )


def _rate(row: dict | None) -> float | None:
    if row is None or row.get("status") != "ok" or not row.get("images_per_s"):
        return None
    return float(row["images_per_s"])


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    rate = _rate(row)
    if rate is None:
        return row.get("status", "")
    low, high = _num(row, "images_per_s_min"), _num(row, "images_per_s_max")
    return f"{rate:,.0f}" + (f" ({low:,.0f}-{high:,.0f})" if low is not None and high is not None else "")


def _load(rows: list[dict]) -> str:
    """The 1-minute load average over a run's rungs: on a shared host the ratios move with it."""
    loads = [v for v in (_num(r, "host_load_1m") for r in rows) if v is not None]
    if not loads:
        return "not recorded"
    return f"{min(loads):.1f}" if min(loads) == max(loads) else f"{min(loads):.1f}-{max(loads):.1f}"


def compare_markdown(a_path: str | Path, b_path: str | Path) -> str:
    return compare_ladders(a_path, b_path)[0]


def compare_ladders(a_path: str | Path, b_path: str | Path) -> tuple[str, list[str]]:
    """The comparison's Markdown, and the setup columns A and B differ in that change the figures (setups_differ),
    from one reading of the two CSVs."""
    a_rows, b_rows = read_ladder_csv(a_path), read_ladder_csv(b_path)
    a_by, b_by = {r["name"]: r for r in a_rows}, {r["name"]: r for r in b_rows}
    if not a_by.keys() & b_by.keys():  # the table had no ratio at all, and the command ended 0 with it
        raise UserError(
            f"bench --compare {a_path} {b_path}: no rung in common, nothing to compare (A has {', '.join(a_by)}; "
            f"B has {', '.join(b_by)}): expected two ladders that measured at least one rung of the same name"
        )
    names = list(dict.fromkeys([r["name"] for r in a_rows] + [r["name"] for r in b_rows]))
    lines = ["# Ladder comparison", "", f"- A: `{a_path}`", f"- B: `{b_path}`", ""]
    lines += ["| setup | A | B |", "|---|---|---|"]
    sa, sb = setup_rows(a_rows, b_rows)
    for key in SETUP_KEYS:
        va, vb = sa.get(key, ""), sb.get(key, "")
        # one side's blank (a CSV from before the column) is unknown, as setups_differ and the host load read it:
        # marked "(differs)" here, the table named as different what the note below it did not
        mark = " (differs)" if va and vb and va != vb else ""
        lines.append(f"| {key}{mark} | {va} | {vb} |")
    la, lb = _load(a_rows), _load(b_rows)
    differs = la != lb and "not recorded" not in (la, lb)  # a missing figure is unknown, not different
    lines.append(f"| host load (1 min, over the rungs){' (differs)' if differs else ''} | {la} | {lb} |")
    differ = setups_differ(sa, sb)
    if differ:  # each ratio read as the rung's alone under a table whose "(differs)" marks were easy to pass over
        lines += ["", f"**{differ_line(differ)}**"]
    lines += ["", "| rung | A images/s (range) | B images/s (range) | B / A |", "|---|---|---|---|"]
    for n in names:
        ra, rb = _rate(a_by.get(n)), _rate(b_by.get(n))
        ratio = f"{rb / ra:.2f}x" if ra and rb else ""
        if ratio and not (has_range(a_by[n]) and has_range(b_by[n])):  # one repeat, or a CSV from before the ranges
            ratio += ", noise unknown (no range)"
        elif ratio and inside_noise(a_by[n], b_by[n]):
            ratio += ", inside the noise"
        lines.append(f"| {n} | {_cell(a_by.get(n))} | {_cell(b_by.get(n))} | {ratio} |")
    lines += [
        "",
        "Images/s are medians of repeats, in brackets the slowest and fastest repeat; a ratio is *inside the "
        "noise* when the two runs' ranges overlap, *noise unknown* where a run recorded none. The host load was "
        "read after each rung.",
    ]
    return "\n".join(lines) + "\n", differ


def setup_rows(a_rows: list[dict[str, str]], b_rows: list[dict[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    """A's and B's rows whose setups are compared: those of one rung both measured (else both ran; else their first
    rows). Each rung records the batch it ran (--batch-size auto searches its own on a GPU: bf16's is larger than
    baseline's), so each side's first row, baseline against a `--only bf16` ladder's bf16, differed in a batch that
    no ratio's two rows did."""
    b_by = {r["name"]: r for r in b_rows}
    pairs = [(a, b_by[a["name"]]) for a in a_rows if a["name"] in b_by]
    measured = [(a, b) for a, b in pairs if _rate(a) is not None and _rate(b) is not None]
    return (measured or pairs or [(a_rows[0], b_rows[0])])[0]


def setups_differ(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The setup columns whose values differ between A's row and B's that change the figures (not the revision or
    date): a different device, batch or thread count is in every ratio, beside the rung's technique. A value one
    side did not record (a CSV from before the column) is unknown, not different."""
    return [k for k in SETUP_KEYS if k not in NOT_IN_THE_FIGURES and a.get(k) and b.get(k) and a[k] != b[k]]


def differ_line(keys: list[str]) -> str:
    return f"A and B differ in {', '.join(keys)}: each B / A ratio measures that difference too, not the rung alone"


def default_compare_path(out_root: str | Path, a_path: str | Path, b_path: str | Path) -> Path:
    """OUT_ROOT/bench/compare-<A's folder>-vs-<B's folder>.md, beside the bench results."""
    a, b = (Path(p).resolve().parent.name or Path(p).stem for p in (a_path, b_path))
    return Path(out_root) / "bench" / f"compare-{a}-vs-{b}.md"
