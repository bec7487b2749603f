"""The 2026-12-01 H200 figures as Markdown, read from the result files only (no figure typed in).

Writes benchmarks/results/2026-12-01-h200/summary.md and replaces the README's block between
`<!-- h200-2026-12-01 -->` markers with the same table, so the README's figures always come from
the stored rows. Three reference rows of the JPEG table come from the independent measurements in
../shared/measurements/h200-2026-11-30 (outside the repository): without that folder it stops, naming the
missing file, rather than write the tables without them; --shared points it elsewhere.

    python benchmarks/summarize_h200.py [--shared DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout, not an installed cnnpar

from cnnpar.errors import UserError, main_saying_user_errors  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "2026-12-01-h200"
MARK = "<!-- h200-2026-12-01 -->"


def rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def rel(path: Path) -> str:
    return str(path.relative_to(RESULTS))


def batch_lines() -> list[str]:
    a, b = RESULTS / "call-a" / "batch_auto.csv", RESULTS / "call-b" / "batch_auto_rule10.csv"
    out = []
    for path, rule in ((a, "5 % rule"), (b, "10 % rule, the default now")):
        for r in rows(path):
            label = "batch 64" if r["case"] == "64" else f"auto ({rule}): {r['batch_size']}"
            reached = "not reached"
            if r["epoch_reached"]:
                reached = f"epoch {r['epoch_reached']}, {float(r['train_s_to_target']):.2f} s"
            out.append(
                f"| ResNet-18 CIFAR-10, 10 epochs, {label} | {float(r['images_per_s']):,.0f} img/s | 80 % val: "
                f"{reached}; best {100 * float(r['best_val_acc']):.2f} % | `{rel(path)}` |"
            )
    return out


def record_lines() -> list[str]:
    out = []
    for path, what in (
        (RESULTS / "call-a" / "cifar10_record.csv", "compile default"),
        (RESULTS / "call-c" / "cifar10_record_eager.csv", "eager (compile off)"),
        (RESULTS / "call-d" / "cifar10_record_fixed.csv", "compile default, after the amax fix"),
        (RESULTS / "call-o" / "cifar10_record.csv", "compile default, session 6's record changes"),
    ):
        by_system: dict[str, list[dict]] = {}
        for r in rows(path):
            if r["run"] != "warmup" and r.get("status", "ok") == "ok":
                by_system.setdefault(r["system"], []).append(r)
        if "airbench94_muon" not in by_system:
            missing = "no run: killed by the call's budget"
            out.append(f"| CIFAR-10 record: airbench94_muon (same call) | - | {missing} | `{rel(path)}` |")
        for system, runs in by_system.items():
            acc = statistics.mean(float(r["val_acc"]) for r in runs)
            sec = statistics.mean(float(r["total_s"]) for r in runs)
            name = f"cnnpar cifar10-record, {what}" if system == "cnnpar" else f"{system} (same call)"
            out.append(
                f"| CIFAR-10 record: {name}, {len(runs)} runs | {sec:.3f} s train + TTA eval (mean) | "
                f"{100 * acc:.2f} % mean | `{rel(path)}` |"
            )
    return out


def ddp_lines() -> list[str]:
    path = RESULTS / "call-c" / "ddp_scaling_resnet50.csv"
    rs = rows(path)
    top = rs[-1]
    return [
        f"| DDP ResNet-50 224 b256/GPU, {top['step']} step, 1 -> {top['world_size']} GPUs | "
        f"{float(rs[0]['images_per_s']):,.0f} -> {float(top['images_per_s']):,.0f} img/s | "
        f"{float(top['speedup']):.3f}x | `{rel(path)}` |"
    ]


def tune_lines() -> list[str]:
    path = RESULTS / "call-b" / "tuned_resnet50.csv"
    rs = rows(path)
    kept = [r for r in rs if r["status"] in ("start", "kept")]
    best = max(kept, key=lambda r: float(r["images_per_s"]))
    wall = max(float(r["wall_s"] or 0) for r in rs)
    cut = [r["value"] for r in rs if r["status"] == "cut off"]
    return [
        f"| `cnnpar tune` ResNet-50 synthetic, --budget-s 200 | start {float(rs[0]['images_per_s']):,.0f}, best "
        f"{float(best['images_per_s']):,.0f} img/s ({best['switch']}={best['value']}) | cut off: "
        f"{', '.join(cut) or 'none'}; longest trial {wall:.0f} s | `{rel(path)}` |"
    ]


def framework_lines() -> list[str]:
    out = []
    for folder in ("frameworks_h200", "frameworks_h200x2"):
        path = next((RESULTS / "call-c" / folder).glob("*_summary.csv"))
        for r in rows(path):
            out.append(
                f"| cnn3 MNIST, {r['framework']}, {r['devices']} GPU(s) | {float(r['steady_images_per_s']):,.0f} img/s "
                f"| val {100 * float(r['final_val_acc']):.2f} % | `{rel(path)}` |"
            )
    return out


def claims_line() -> str:
    path = RESULTS / "call-a" / "claims" / "claims.csv"
    rs = rows(path)
    verdicts = [r.get("verdict", "") for r in rs]
    summary = ", ".join(f"{v}: {verdicts.count(v)}" for v in sorted(set(verdicts)))
    text = (RESULTS / "call-a" / "claims.log").read_text()
    took = re.search(r"Measuring took (\d+) s", text)
    return f"| `cnnpar bench --claims --device cuda` | {took.group(1) if took else '?'} s | {summary} | `{rel(path)}` |"


SHARED = ROOT.parent / "shared" / "measurements" / "h200-2026-11-30"
REFERENCE = "jpeg_folder_end_to_end.csv"  # the independent measurements of main at 5bfa0df
JPEG_MARK = "<!-- h200-jpeg-2026-12-01 -->"


def end_to_end_row(label: str, r: dict, path: Path, note: str = "") -> str:
    """A table row for one `benchmarks/jpeg_pipeline.py` variant."""
    return (
        f"| {label}: {r['variant']} | {float(r['end_to_end_images_per_s']):,.0f} img/s | loader alone "
        f"{float(r['loader_alone_images_per_s']):,.0f}, step alone {float(r['step_alone_images_per_s']):,.0f}, "
        f"data wait {100 * float(r['data_wait_share']):.0f} %{note} | `{rel(path)}` |"
    )


def jpeg_lines(ref: Path) -> list[str]:
    """ResNet-50 224 from the photos: the reference run at 5bfa0df (`ref`) beside session 6's, and the
    decoder's rows per batch of 256 (call E: one thread, two threads, the libraries alone)."""
    out = []
    for r in rows(ref):
        out.append(
            f"| end to end, reference at {r['git_rev']}: {r['variant'].replace('resnet50 224 folder ', '')} | "
            f"{float(r['images_per_s']):,.0f} img/s | data wait {100 * float(r['data_wait_share']):.0f} % | "
            f"`../shared/measurements/h200-2026-11-30/{ref.name}` (outside the repository) |"
        )
    for call in ("call-e", "call-g"):
        path = RESULTS / call / "jpeg_pipeline.csv"
        for r in rows(path):
            if r["status"] != "ok":
                continue
            note = ""
            if call == "call-e":  # at b3c9ebd every GPU decoder ran its two stages in two threads
                note = "; two threads" if "pipe=0" not in r["variant"] else "; one thread"
            if "split" in r["variant"]:
                note += "; a backend removed since (no faster)"
            out.append(end_to_end_row("end to end", r, path, note))
    path = RESULTS / "call-e" / "jpeg_decode_cuda.csv"
    for r in rows(path):
        if r["mode"] == "eval" or r["stage"] == "crop_resize":
            continue
        out.append(
            f"| decoder, batch {r['batch_size']}: {r['stage']} {r['method']} ({r['mode']}) | "
            f"{float(r['images_per_s']):,.0f} img/s | {1e3 * float(r['total_s']):.1f} ms a batch | `{rel(path)}` |"
        )
    log = RESULTS / "call-f" / "jpeg_decode.log"
    for m in re.finditer(r"^(decode_spin\S*)\s+(\S+)\s+train host\s+([\d.]+) ms", log.read_text(), re.M):
        where = "at a 0.2 ms GIL switch interval" if m.group(1).endswith("0.2ms") else "at the default 5 ms"
        out.append(
            f"| decoder beside a spinning Python thread, {where}: {m.group(2)} | {float(m.group(3)):,.0f} ms a batch "
            f"| (alone: the decoder rows above) | `{rel(log)}` |"
        )
    return out


def hardware_lines() -> list[str]:
    """Session 7: the GPU's JPEG engines through nvJPEG's hardware backend (`--decode hardware`)
    beside torchvision's nvJPEG, in the same calls (J and M end to end; J and K per batch)."""
    out = []
    for call in ("call-j", "call-m"):
        path = RESULTS / call / "jpeg_pipeline.csv"
        for r in rows(path):
            if r["status"] != "ok":
                continue
            out.append(end_to_end_row(f"end to end ({call[-1].upper()}, {r['git_rev']})", r, path))
    for call, note in (("call-j", ""), ("call-k", "; resize weights at the largest photo's size (undone)")):
        path = RESULTS / call / "jpeg_decode_cuda.csv"
        for r in rows(path):
            if r["mode"] == "eval" or r["stage"] not in ("decode", "gpu_decoder", "pipelined", "decode_spin"):
                continue
            where = " beside a spinning Python thread" if r["stage"] == "decode_spin" else ""
            out.append(
                f"| decoder ({call[-1].upper()}, {r['git_rev']}), batch {r['batch_size']}: {r['stage']} {r['method']} "
                f"({r['mode']}){where} | {float(r['images_per_s']):,.0f} img/s | "
                f"{1e3 * float(r['total_s']):.1f} ms a batch"
                f"{note if r['stage'] in ('gpu_decoder', 'pipelined') else ''} | `{rel(path)}` |"
            )
    return out


def engine_settings_lines() -> list[str]:
    """Session 19: the JPEG engines driven each way `nvjpeg_hw.EngineSettings` offers, each one's whole-image
    decode alone (`jpeg_decode.py --stages engines`) with what one library call waits for, launches and copies,
    counted by torch.profiler (calls ZZY, ZZZA, ZZZB; the defaults' row first in each call)."""
    out = []
    for call, name in (
        ("call-zzy", "engines.csv"),
        ("call-zzza", "engines_pipe.csv"),
        ("call-zzzb", "engines_sms.csv"),
    ):
        path = RESULTS / call / name
        for r in rows(path) if path.exists() else []:
            tag = call.split("-", 1)[1].upper()
            out.append(
                f"| engines alone ({tag}, {r['git_rev']}), batch {r['batch_size']}: {r['method']} | "
                f"{float(r['images_per_s']):,.0f} img/s | a batch: {float(r['host_waits_per_batch']):g} host waits, "
                f"{float(r['kernels_per_batch']):g} kernels, {float(r['copies_per_batch']):g} copies; "
                f"pixels vs the defaults: max {r['max_diff_vs_default']} | `{rel(path)}` |"
            )
    return out


def session8_lines() -> list[str]:
    """Session 8: end to end with the resize in the training thread, graphs, the C++ wrapper (calls N,
    P, Q, each beside the plain feeder of its own call), the decoder per batch (P), and where the
    traced epochs' time went (`trace_summary.py --json` over the traces, which are too large to keep)."""
    out = []
    for call in ("call-n", "call-p", "call-q"):
        path = RESULTS / call / "jpeg_pipeline.csv"
        for r in rows(path):
            if r["status"] == "ok":
                out.append(end_to_end_row(f"end to end ({call[-1].upper()}, {r['git_rev']})", r, path))
    path = RESULTS / "call-p" / "jpeg_decode_cuda.csv"
    for r in rows(path):
        if r["stage"] in ("decode", "gpu_decoder", "pipelined") and r["mode"] != "eval":
            out.append(
                f"| decoder (P, {r['git_rev']}), batch {r['batch_size']}: {r['stage']} {r['method']} ({r['mode']}) | "
                f"{float(r['images_per_s']):,.0f} img/s | {1e3 * float(r['total_s']):.1f} ms a batch | `{rel(path)}` |"
            )
    for summary, what in (
        (RESULTS / "call-n" / "trace_0_hardware_summary.json", "engines, two-thread feeder"),
        (RESULTS / "call-p" / "trace_0_hardware_summary.json", "engines, resize in the training thread"),
        (RESULTS / "call-p" / "trace_3_hardware_summary.json", "engines, resize in the training thread, graphs on"),
    ):
        s = json.loads(summary.read_text())  # trace_summary.py --json over the epoch's trace
        main_busy = s["streams"][str(s["main_stream"])]["busy_us"]
        idle = s["window_us"] - main_busy
        bn = s["main_kernel_classes"].get("BatchNorm (+ReLU/add), Triton-fused", (0, 0))[0]
        out.append(
            f"| one traced epoch ({what}) | GPU busy {100 * s['gpu_busy_share']:.0f} % | step stream idle "
            f"{idle / 1e3:.0f} ms of {s['window_us'] / 1e3:.0f}, {s['main_idle_waiting_for_launch_us'] / 1e3:.0f} ms "
            f"of it before a late launch; BatchNorm passes {100 * bn / main_busy:.0f} % of the step's kernel time | "
            f"`{rel(summary)}` |"
        )
    return out


def session9_lines() -> list[str]:
    """Session 9: graphs beside the engines with high-priority streams or several decodes in flight, the
    compiled resize chunks, nvJPEG in the same calls (S, T); the user's command after the exit fix (W)."""
    out = []
    for call in ("call-s", "call-t"):
        path = RESULTS / call / "jpeg_pipeline.csv"
        for r in rows(path):
            if r["status"] == "ok":
                out.append(end_to_end_row(f"end to end ({call[-1].upper()}, {r['git_rev']})", r, path))
    for name, how in (("exit_a", "--decode hardware"), ("exit_g", "the default decoder then (nvJPEG)")):
        log = RESULTS / "call-w" / f"{name}.log"
        epochs = [line for line in log.read_text().splitlines() if line.startswith("epoch ")]
        rates = [line.split("img/s")[0].split()[-1] for line in epochs[1:]]  # after the first (warm-up) epoch
        batch = next(line for line in log.read_text().splitlines() if line.startswith("batch size auto:"))
        # gpu_session.sh's hang_case: "NAME: exited rc=R at T s (done: at D s)" or "NAME: still running ..."
        first = log.with_suffix(".summary").read_text().splitlines()[0]
        m = re.search(r"exited rc=(\d+) at (\d+) s \(done: at (\d+) s\)", first)
        left = f"exited rc {m[1]}, {int(m[2]) - int(m[3])} s after its last line" if m else first
        out.append(
            f"| `cnnpar train --model resnet50 --epochs 3` (W), {how} | {' and '.join(rates)} img/s (epochs 2-3) | "
            f"{batch.split(' (')[0]}; {left} | `{rel(log)}` |"
        )
    return out


def cli_line(log: Path, label: str) -> str:
    """A table row for a `cnnpar train` log written by gpu_session.sh's hang_case (its .summary beside it)."""
    lines = log.read_text().splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    rates = [line.split("img/s")[0].split()[-1] for line in epochs]
    waits = [m[1] for m in (re.search(r"data wait (\d+)%", line) for line in epochs) if m]
    batch = next(line for line in lines if line.startswith("batch size auto:"))
    if len(waits) == len(rates):
        batch = f"data wait {', '.join(waits)} %; {batch}"
    summary = log.with_suffix(".summary")  # hang_case's; a plain `logged` run has none
    first = summary.read_text().splitlines()[0] if summary.exists() else ""
    m = re.search(r"exited rc=(\d+) at (\d+) s \(done: at (\d+) s\)", first)
    left = f"; {first}" if first else ""
    if m:
        left = f"; exited rc {m[1]}, {int(m[2]) - int(m[3])} s after its last line"
    whole = r"\(epochs [\d.]+ s, evaluations [\d.]+ s, checkpoints [\d.]+ s, the rest [\d.]+ s\)"
    split = re.search(whole, "\n".join(lines))
    if split:  # since session 15 the last line says where the whole loop's time went
        left += f"; whole loop {split[0][1:-1]}"
    shown = f"{', '.join(rates)} img/s (epochs 1-{len(rates)})"
    if len(rates) > 5:  # a long run: its first epoch, then the range of the rest
        later = sorted(rates[1:], key=lambda r: float(r.replace(",", "")))
        shown = f"{rates[0]}, then {later[0]}-{later[-1]} img/s (epochs 1, 2-{len(rates)})"
        waits = sorted(waits[1:], key=int)
        batch = f"data wait {waits[0]}-{waits[-1]} % in epochs 2-{len(rates)}; {batch.split('; ', 1)[-1]}"
    return f"| {label} | {shown} | {batch.split('; lr')[0]}{left} | `{rel(log)}` |"


def session10_lines() -> list[str]:
    """Session 10: a 4x larger folder (24,000 photos, so an epoch's ends weigh less), batch 512, the batch
    search's start beside a GPU decoder, the resize as two Triton kernels, the decode stage in NumPy (X, Y, Z),
    each epoch preparing the next and the array fields (ZA, ZB)."""
    out = []
    for call in ("call-x", "call-y", "call-z", "call-za", "call-zb"):
        for name in ("jpeg_pipeline20.csv", "jpeg_pipeline80.csv"):
            path = RESULTS / call / name
            for r in rows(path) if path.exists() else []:
                if r["status"] == "ok":
                    tag = call.split("-", 1)[1].upper()
                    label = f"end to end ({tag}, {r['git_rev']}, {int(r['train_images']):,} photos)"
                    out.append(end_to_end_row(label, r, path))
    out.append(
        cli_line(RESULTS / "call-x" / "default.log", "`cnnpar train --model resnet50`, no flags, 24,000 photos (X)")
    )
    out.append(
        cli_line(RESULTS / "call-y" / "default.log", "the same after the search's start and the fused resize (Y)")
    )
    out.append(
        cli_line(
            RESULTS / "call-za" / "default.log",
            "the same on the 6,000 photos, epochs prepared ahead (ZA; 18-batch epochs begin with batches made "
            "during the validation before them: above the steady rate)",
        )
    )
    out.append(cli_line(RESULTS / "call-zb" / "default.log", "the same on the 24,000 photos (ZB)"))
    path = RESULTS / "call-z" / "jpeg_decode_cuda.csv"
    for r in rows(path):
        if r["stage"] in ("crop_resize", "gpu_decoder", "resize_spin") and r["mode"] == "train":
            out.append(
                f"| decoder (Z, {r['git_rev']}), batch {r['batch_size']}: {r['stage']} {r['method']} | "
                f"{float(r['images_per_s']):,.0f} img/s | {1e3 * float(r['total_s']):.1f} ms a batch, "
                f"host {1e3 * float(r['host_s']):.2f} ms | `{rel(path)}` |"
            )
    return out


def gil_note(path: Path) -> str:
    """`, GIL held N % (step's threads M %)` from a gil_profile summary (benchmarks/gil_profile.py)."""
    if not path.exists():
        return ""
    text = path.read_text()
    total = re.search(r"GIL held \((\d+)% of the time", text)
    step = sum(
        int(m[1]) for m in re.finditer(r"- thread \d+ (?:MainThread|native:pt_autograd_0): GIL held (\d+)%", text)
    )
    return f", GIL held {total[1]} % (the step's threads {step} %)" if total else ""


def session11_lines() -> list[str]:
    """Session 11: who holds the GIL (py-spy, ZC-ZE), CUDA graphs beside the decoders (ZD, ZE), the training
    thread's own stream (ZE), the encoded batches in shared slots made once (ZG, ZH); session 12: the same at
    the revision after the review, slots pageable (ZJ); session 13: the feeder streams' priority (ZO), the
    space-to-depth stem off and at its new CUDA default (ZS, ZT); sessions 14-15: CUDA's device queues, graphs
    beside the decoder, the store's batch (ZW-ZZE)."""
    out = []
    for call in (
        "call-zc",
        "call-zd",
        "call-ze",
        "call-zf",
        "call-zg",
        "call-zh",
        "call-zj",
        "call-zo",
        "call-zs",
        "call-zt",
        "call-zw",  # session 14: the default traced, batch 384; graphs on with CUDA's 8 queues and 32
        "call-zx",
        "call-zy",
        "call-zz",
        "call-zza",
        "call-zze",  # session 15: the engines against nvJPEG with 32 queues
        "call-zzy",  # session 19: the engines driven other ways (nvjpeg_hw.EngineSettings)
        "call-zzza",
    ):
        path = RESULTS / call / "jpeg_pipeline80.csv"
        if not path.exists():
            path = RESULTS / call / "jpeg_pipeline80_repeat.csv"
        for i, r in enumerate(rows(path) if path.exists() else []):
            if r["status"] != "ok":
                continue
            tag = call.split("-", 1)[1].upper()
            note = gil_note(RESULTS / call / f"gil_{i}_{r['variant'].split()[1]}.txt.summary.txt")
            if "gil=native" in r["variant"]:
                note += ", paused at every sample: the rate is not comparable"
            if r.get("slots") and r["slots"] != "none":
                note += f", {r['slots']}"
            # the column came with cnnpar's own setting (ZZ on); ZY's caller set the variable for the process
            queues = r.get("device_queues") or QUEUES_SET_BY_CALLER.get(call)
            if queues:
                note += f", device queues {queues}"
            label = f"end to end ({tag}, {r['git_rev']}, {int(r['train_images']):,} photos)"
            out.append(end_to_end_row(label, r, path, note))
    for call, label in (
        (
            "call-zf",
            "`cnnpar train --model resnet50`, no flags, 24,000 photos, the training thread on its own stream (ZF)",
        ),
        ("call-zg", "the same with the encoded batches in shared slots (ZG)"),
        (
            "call-zi",
            "the same, the slots not page-locked, the stream entered last (ZI; epochs 2-3 start with up to 5 of 75 "
            "batches made during the validation)",
        ),
        ("call-zw", "the same, the space-to-depth stem on (ZW, session 14)"),
        ("call-zz", "the same, CUDA's 32 hardware queues set by cnnpar, graphs off for photos (ZZ)"),
        ("call-zza", "the same, graphs kept beside the decoder with 32 queues: the default since ZZA"),
        ("call-zzc", "the same, the queue value recorded at CUDA's start (ZZC, session 15)"),
        ("call-zzh", "the same, cnnpar waiting on the engines once per batch (ZZH, session 16)"),
        ("call-zzz", "the same (ZZZ, session 19)"),
        (
            "call-zzzd",
            "the same (ZZZD, session 19: the only row here whose data wait is the device's; the others host time)",
        ),
    ):
        out.append(cli_line(RESULTS / call / "default.log", label))
    label = "the same for 20 epochs, the decoders on streams of their own (ZZM, session 17)"
    out.append(cli_line(RESULTS / "call-zzm" / "long.log", label))
    for call, label in (  # session 15: issue 11.5, from a `cnnpar prepare` store of the same 24,000 photos
        ("call-zzc", "`cnnpar train --model resnet50` from the store, no flags (ZZC: the search kept 64)"),
        ("call-zze", "the same after photo-sized inputs start the batch search at 256 (ZZE)"),
    ):
        out.append(cli_line(RESULTS / call / "store80.log", label))
    return out


# calls whose CSV predates the device_queues column but whose process had CUDA_DEVICE_MAX_CONNECTIONS set
QUEUES_SET_BY_CALLER = {"call-zy": "32 (set by the caller)"}

STEP_FILES = (  # session 12, issue 13.2 and 13.3: the train step on data already on the GPU
    "call-zk/step_rn50_b256.csv",
    "call-zl/step_rn50_cdt.csv",
    "call-zm/step_rn50_b512.csv",
    "call-zl/step_rn18_b512.csv",
    "call-zm/step_rn18_big.csv",
    "call-zn/step_rn18_b2048_tuning.csv",
    "call-zp/step_rn18_b4096_tuning.csv",  # session 13
    "call-zq/step_rn50_s2d.csv",
    "call-zr/step_rn50_s2d.csv",
    "call-zs/step_rn50_b512.csv",
    "call-zzg/step_rn50_coop.csv",  # session 15: inductor's cooperative reductions
    "call-zzi/step_rn50_bn.csv",  # session 16: inductor's N-d tiling (the call's third variant cut off at 480 s)
    "call-zzj/step_rn50_bn.csv",  # the same again, and with tiled reductions
    "call-zzk/step_rn50_bn.csv",  # tiling with autotuned pointwise configs: compile_tiling
    "call-zzk/step_rn18_nd.csv",
    "call-zzn/step_rn50_atenbn.csv",  # session 17: aten's own BatchNorm kernels in the compiled graph
    "call-zzo/step_rn50_b512_tiling.csv",  # compile_tiling at b512
    "call-zzp/step_rn50_b512_tiling.csv",  # tiling with coordinate-descent tuning (compile_tuning) at b512
    "call-zzq/step_rn50_b512_tiling.csv",  # the same again, the plain compiled loop beside it
    "call-zzs/step_rn50_b512_lim10.csv",  # session 18: cuDNN timing 10 algorithms per convolution (torch's default)
    "call-zzs/step_rn50_b512_lim0.csv",  # ... and every one its heuristics return
    "call-zzt/step_rn50_b512_pair.csv",  # tiling + tuning at b512 without their kernels in the caches
    "call-zzu/step_rn50_b512_vs_plain.csv",  # the plain compiled loop, the defaults and the pair, one process
    "call-zzu/step_rn50_b256_plain.csv",  # the plain compiled loop at b256, issue 13's reference batch
    "call-zzw/step_rn50_b512_pair_map.csv",  # the pair, and with autotuned pointwise configs
    "call-zzx/step_rn50_b256_pair.csv",  # the pair at b256
)


def step_lines() -> list[str]:
    """Train-step rows (benchmarks/step_vs_plain.py) with MFU against the peak measured in the same run, and
    the kernel kinds of the profiled ResNet-50 step (call ZK's `cnnpar profile` reading)."""
    out = []
    for name in STEP_FILES:
        path = RESULTS / name
        tag = name.split("/")[0].split("-", 1)[1].upper()
        for r in rows(path):
            if r["status"] != "ok":
                continue
            variant = r["variant"].split(" (")[0]
            out.append(
                f"| {r['model']} {r['image_size']} px b{r['batch']} train step ({tag}, {r['git_rev']}): {variant} | "
                f"{float(r['images_per_s']):,.0f} img/s | MFU {100 * float(r['mfu']):.1f} % of "
                f"{float(r['peak_tflops']):.1f} TFLOP/s ({r['peak_kind']}, same run); "
                f"warm-up {float(r['warmup_s']):.0f} s | `{rel(path)}` |"
            )
    reading = RESULTS / "call-zk" / "profile_rn50" / "where_time_went_rank0.txt"
    kinds = re.findall(r"^\s+[\d.]+ ms\s+([\d.]+) %\s+\d+ kernels\s+(.+)$", reading.read_text(), re.M)
    if kinds:
        shares = "; ".join(f"{kind} {share} %" for share, kind in kinds)
        out.append(
            f"| resnet50 224 px b256 step as `cnnpar profile` runs it (ZK: AdamW, CUDA graphs, under the profiler): "
            f"the largest kind of kernel time | {kinds[0][1]}: {kinds[0][0]} % | {shares} | `{rel(reading)}` |"
        )
    return out


def ladder_line() -> str:
    path = RESULTS / "call-f" / "ladder_resnet50_synthetic" / "ladder.csv"
    rs = rows(path)
    measured = sum(r["status"] == "ok" for r in rs)
    text = (RESULTS / "call-f" / "ladder50.log").read_text()
    stamps = re.findall(r"\[(\d+) s\]", text)
    return (
        f"| ResNet-50 ladder, one H200 | {stamps[-1] if stamps else '?'} s to the last rung | {measured} of "
        f"{len(rs)} rungs measured | `{rel(path)}` |"
    )


def doctor_line() -> str:
    folder = RESULTS / "call-i" / "doctor_resnet18_b64"
    rec = rows(folder / "recommendations.csv")[0]
    phases = {r["name"]: r for r in rows(folder / "phases.csv")}
    e2e = float(phases["end to end"]["images_per_s"])
    return (
        f"| doctor, ResNet-18 32 px, --batch-size 64 | advice 1: `{rec['action']}` | end to end {e2e:,.0f} img/s, "
        f"tried {float(rec['tried_images_per_s']):,.0f} ({float(rec['tried_gain']):.2f}x) | "
        f"`{rel(folder / 'recommendations.csv')}` |"
    )


def reference_file(argv: list[str] | None) -> Path:
    """The reference rows' CSV, checked before anything is written: skipped when missing, it had silently
    deleted three documented rows from docs/decoding.md and jpeg_summary.md."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=SHARED, help=f"folder holding {REFERENCE} (default: {SHARED})")
    ref = ap.parse_args(argv).shared / REFERENCE
    if not ref.is_file():
        raise UserError(
            f"{ref} is missing: it holds the reference rows of docs/decoding.md; "
            "nothing written (run from a checkout beside shared/, or pass --shared DIR)"
        )
    return ref


def main(argv: list[str] | None = None) -> int:
    ref = reference_file(argv)
    table = [
        "| what | figure | outcome | file |",
        "|---|---:|---|---|",
        *batch_lines(),
        *record_lines(),
        *ddp_lines(),
        *tune_lines(),
        claims_line(),
        ladder_line(),
        doctor_line(),
        *step_lines(),
        *framework_lines(),
    ]
    block = "\n".join(table)
    (RESULTS / "summary.md").write_text(
        "# H200 figures, 2026-12-01 (generated by benchmarks/summarize_h200.py from the files named)\n\n" + block + "\n"
    )
    replace_block(ROOT / "README.md", block)
    frameworks = "\n".join(["| what | figure | outcome | file |", "|---|---:|---|---|", *framework_lines()])
    replace_block(ROOT / "docs" / "frameworks.md", frameworks)
    head = ["| what | figure | detail | file |", "|---|---:|---|---|"]
    jpeg = "\n".join(
        [
            *head,
            *jpeg_lines(ref),
            *hardware_lines(),
            *engine_settings_lines(),
            *session8_lines(),
            *session9_lines(),
            *session10_lines(),
            *session11_lines(),
        ]
    )
    (RESULTS / "jpeg_summary.md").write_text(
        "# JPEG photos on an H200, 2026-12-01 (generated by benchmarks/summarize_h200.py)\n\n" + jpeg + "\n"
    )
    replace_block(ROOT / "docs" / "decoding.md", jpeg, JPEG_MARK)
    print(block)
    print(jpeg)
    return 0


def replace_block(path: Path, block: str, mark: str = MARK) -> None:
    """The text between the file's two `mark` lines becomes `block` (files without them are left alone)."""
    text = path.read_text()
    if text.count(mark) == 2:
        head, _, rest = text.partition(mark)
        _, _, tail = rest.partition(mark)
        path.write_text(f"{head}{mark}\n{block}\n{mark}{tail}")


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "summarize_h200"))  # no reference rows: one line, exit 2
