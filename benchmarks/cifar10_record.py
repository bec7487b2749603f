"""The CIFAR-10 record: cnnpar's `cifar10-record` preset beside airbench94_muon, in one call.

cnnpar, for the preset and then for each `--variant` of it (fields overridden):
- one untimed warm-up run of the whole recipe (seed 100,000 + variant): it compiles, and it meets
  every first-time cost a process pays once (cuDNN autotuning of the train and the TTA eval shapes,
  cuBLAS and cuSOLVER handles, the allocator's growth), so seed 0 costs what seed 1 does;
- then `--seeds` runs. Each builds its Trainer (data already loaded, model, optimizer) and captures
  its CUDA graph outside the clock, as airbench resets its model and compiles outside its own; the
  clock runs, with the device synchronised at both ends, from the stem's whitening on the device
  (the Trainer whitened on the CPU already; this repeats it where airbench does it, so it is paid)
  through the training epochs to the TTA accuracy: what airbench times. `launch_lead_s` says who
  set the pace: the seconds each epoch's end came after the host launched its last step, summed
  (near 0: the host; tens of ms: the GPU).

airbench94_muon (KellerJordan/cifar10-airbench; never copied into this repository) then runs in a
subprocess from the git-ignored folder its source was put in (`--fetch-airbench` does that from a
git snapshot): a copy there whose only change is its count of runs (200 -> `--seeds`), started the
way its README says, with `./cifar10/{train,test}.pt` linked to benchmarks/prepare_cifar10.py's
output. Its own rows give its figures: a warm-up run, then per run its TTA accuracy and its timer
(whitening + training + TTA eval, CUDA events). With `--airbench-gpu` naming another GPU it runs
there while cnnpar runs, else after cnnpar on the same GPU.

Rows (one per run, with GPU, driver, torch, git revision, airbench's source and this command) go to
`--out` (default benchmarks/results/<date>-<gpu>/cifar10_record.csv), means and ranges to a .md beside.

    python benchmarks/cifar10_record.py --fetch-airbench /path/to/cifar10-airbench/git   # once, on any machine
    python benchmarks/prepare_cifar10.py --src .devdata/cifar10_jpeg.npz --out .devdata
    python benchmarks/cifar10_record.py --seeds 5
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cnnpar.config import Config, from_dict, to_dict  # noqa: E402
from cnnpar.data import load_data  # noqa: E402
from cnnpar.dist import DistInfo  # noqa: E402
from cnnpar.engine.trainer import Trainer  # noqa: E402
from cnnpar.errors import main_saying_user_errors  # noqa: E402
from cnnpar.presets import cifar10_record  # noqa: E402
from cnnpar.report.environment import environment  # noqa: E402
from cnnpar.report.files import write_csv_atomic, write_text_atomic  # noqa: E402

AIRBENCH_FILE = "airbench94_muon.py"
AIRBENCH_RUNS = "for run in range(200)"  # the line of its __main__ that sets how many runs it makes
WARMUP_SEED = 100_000
COLUMNS = [
    "system",
    "variant",
    "run",
    "val_acc",
    "val_acc_no_tta",
    "train_acc",
    "total_s",
    "whiten_s",
    "train_s",
    "launch_lead_s",
    "eval_s",
    "setup_s",
    "compile_s",
    "graphs_compiled",
    "status",
    "error",
    "epochs",
    "batch_size",
    "resolved",
    "device",
    "driver",
    "torch",
    "cuda",
    "world_size",
    "git_rev",
    "date",
    "airbench_source",
    "command",
]


def log(*a) -> None:
    print(*a, flush=True)


# ---- cnnpar ------------------------------------------------------------------------------------
def parse_overrides(text: str) -> dict[str, dict]:
    """'speed.compile=max-autotune-no-cudagraphs,run.epochs=9' -> {'speed': {...}, 'run': {...}}."""
    out: dict[str, dict] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, raw = item.partition("=")
        section, dot, name = key.partition(".")
        if not (sep and dot and section and name):
            raise SystemExit(f"--variant {text!r}: expected section.field=value[,section.field=value], got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # a bare word: a string
        out.setdefault(section, {})[name] = value
    return out


def variant_config(base: Config, overrides: str) -> Config:
    raw = to_dict(base)
    for section, values in parse_overrides(overrides).items():
        raw.setdefault(section, {}).update(values)
    return from_dict(raw, origin=f"--variant {overrides!r}")


def whitening_sample(tr: Trainer, n: int = 5000) -> torch.Tensor | None:
    """The first n training images as the model sees them, from the copy already on the device."""
    if not hasattr(tr.raw_model, "init_from_data"):
        return None
    x = getattr(tr.train_loader.loader, "x", None)  # a ResidentLoader's uint8 images
    x = (x if x is not None else tr.bundle.train.x)[:n].to(tr.info.device)
    mean = torch.tensor(tr.bundle.mean, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(tr.bundle.std, device=x.device).view(1, -1, 1, 1)
    return (x.float().div_(255) - mean) / std


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_run(tr: Trainer) -> dict:
    """Whitening on the device + every epoch + the TTA evaluation, the device synchronised at both
    ends (and between the parts, where the Trainer already syncs: the end of an epoch, the accuracy)."""
    dev = tr.info.device
    sync(dev)
    t0 = time.perf_counter()
    sample = whitening_sample(tr)
    if sample is not None:
        tr.raw_model.init_from_data(sample)
    sync(dev)
    t1 = time.perf_counter()
    # Who sets the pace: the time from the host's last step launch of an epoch to that epoch's end
    # (the device catching up), summed. A few ms over 8 epochs: the host launches no faster than
    # the GPU runs (host-bound); tens of ms: the host runs ahead, the GPU is the limit.
    step, lead = tr.train_step, 0.0
    launched = [0.0]

    def noting(group):
        out = step(group)
        launched[0] = time.perf_counter()
        return out

    tr.train_step = noting
    try:
        for epoch in range(1, tr.cfg.run.epochs + 1):
            tr.train_epoch(epoch)  # ends on a device sync
            lead += time.perf_counter() - launched[0]
    finally:
        tr.train_step = step
    t2 = time.perf_counter()
    acc = tr.evaluate()["val_acc"]  # reads the accuracy on the host: a sync point
    sync(dev)
    t3 = time.perf_counter()
    return {
        "val_acc": acc,
        "total_s": t3 - t0,
        "whiten_s": t1 - t0,
        "train_s": t2 - t1,
        "launch_lead_s": lead,
        "eval_s": t3 - t2,
    }


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process so far (0 before anything was compiled)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def build(cfg: Config, info: DistInfo, bundle, seed: int) -> Trainer:
    run = replace(
        cfg.run, seed=seed, name=f"record-{seed}-{time.time_ns()}", progress=False, out_dir="/tmp/cnnpar-record"
    )
    cfg = replace(cfg, run=run)  # no folder is made: the benchmark never calls fit()
    return Trainer(cfg, info, bundle=bundle, log=lambda *a, **k: None)


def resolved_line(tr: Trainer) -> str:
    s = tr.cfg.speed
    muon = getattr(tr.optimizer, "use_torch_muon", None)  # MuonSGD's
    muon_impl = "" if muon is None else "(torch.optim.Muon)" if muon else "(batched)"
    return (
        f"{s.precision} cl={s.channels_last} compile={s.compile} graphs={'on' if tr.use_graphs else 'off'} "
        f"compile_eval={s.compile_eval} optimizer={tr.cfg.optim.optimizer} muon={type(tr.optimizer).__name__}"
        f"{muon_impl}"
    )


def cnnpar_runs(base: Config, info: DistInfo, bundle, variant: str, index: int, seeds: int) -> list[dict]:
    cfg = variant_config(base, variant) if variant else base
    rows = []
    common = {"system": "cnnpar", "variant": variant or "cifar10-record", "epochs": cfg.run.epochs}
    common["batch_size"] = cfg.run.batch_size
    for seed in [WARMUP_SEED + index, *range(seeds)]:
        label = "warmup" if seed >= WARMUP_SEED else seed
        try:
            graphs = graphs_compiled()
            t0 = time.perf_counter()
            tr = build(cfg, info, bundle, seed)
            tr.warm_up_compile()  # the warm-up run compiles; later seeds reuse it and only capture their graph
            setup_s = time.perf_counter() - t0
            res = timed_run(tr)
            row = {**common, "run": label, **res, "setup_s": setup_s, "compile_s": tr.compile_s, "status": "ok"}
            # after the warm-up run, 0: no seed compiles anything, inside its timed region or out
            row["graphs_compiled"] = graphs_compiled() - graphs
            row["resolved"] = resolved_line(tr)
        except Exception as e:  # one failed run leaves the others' figures
            row = {**common, "run": label, "status": "failed", "error": repr(e)[:300]}
        rows.append(row)
        log(format_row(row))
        tr = None
        gc.collect()
    return rows


def format_row(r: dict) -> str:
    if r.get("status") != "ok":
        return f"{r['system']} {r['variant']} run={r['run']}: {r['status']} {r.get('error', '')}"
    parts = f"{100 * r['val_acc']:.2f} % in {r['total_s']:.3f} s"
    if "train_s" in r and r.get("train_s") != "":
        parts += f" (whiten {r['whiten_s']:.3f} + train {r['train_s']:.3f} + TTA eval {r['eval_s']:.3f})"
        if r.get("launch_lead_s", "") != "":
            parts += f"; the device ran {r['launch_lead_s']:.3f} s behind the last launches"
    return f"{r['system']} {r['variant']} run={r['run']}: {parts}"


# ---- airbench94_muon ----------------------------------------------------------------------------
def fetch_airbench(git_dir: str, dest: Path) -> None:
    """Put airbench94_muon.py from a git snapshot (`git --git-dir GIT show HEAD:...`) into the
    git-ignored `dest`, with a SOURCE line naming the commit it came from."""

    def git(*a: str) -> str:
        return subprocess.run(["git", "--git-dir", git_dir, *a], capture_output=True, text=True, check=True).stdout

    commit = git("rev-parse", "HEAD").strip()
    text = git("show", f"HEAD:{AIRBENCH_FILE}")
    dest.mkdir(parents=True, exist_ok=True)
    write_text_atomic(dest / AIRBENCH_FILE, text)
    write_text_atomic(dest / "SOURCE", f"KellerJordan/cifar10-airbench@{commit}\n")
    log(f"wrote {dest / AIRBENCH_FILE} (KellerJordan/cifar10-airbench@{commit})")


def airbench_source(folder: Path) -> str:
    src = folder / AIRBENCH_FILE
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    named = (folder / "SOURCE").read_text().strip() if (folder / "SOURCE").exists() else "unknown commit"
    return f"{named} sha256:{digest}"


def prepare_airbench(folder: Path, data: Path, runs: int) -> Path:
    """The copy that makes `runs` runs instead of 200, and ./cifar10 pointing at the decoded data."""
    src = folder / AIRBENCH_FILE
    if not src.exists():
        raise FileNotFoundError(
            f"{src}: not found: expected airbench94_muon.py there (python benchmarks/cifar10_record.py "
            "--fetch-airbench <git dir of KellerJordan/cifar10-airbench>)"
        )
    for name in ("train.pt", "test.pt"):
        if not (data / name).exists():
            raise FileNotFoundError(
                f"{data / name}: not found: expected airbench's data layout (python benchmarks/prepare_cifar10.py)"
            )
    text = src.read_text()
    if text.count(AIRBENCH_RUNS) != 1:
        raise ValueError(
            f"{src}: expected one line with {AIRBENCH_RUNS!r} (its count of runs), found {text.count(AIRBENCH_RUNS)}"
        )
    copy = folder / f"airbench94_muon_{runs}runs.py"
    write_text_atomic(copy, text.replace(AIRBENCH_RUNS, f"for run in range({runs})"))
    link = folder / "cifar10"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(data.resolve(), target_is_directory=True)
    return copy


CHILDREN: list[subprocess.Popen] = []


def stop_children() -> None:
    """Kill an airbench run still going (the call is ending: killed, failed, or out of budget)."""
    for proc in CHILDREN:
        if proc.poll() is None:
            proc.kill()


EVAL_ROW = re.compile(r"^\|\s*(\S*)\s*\|\s*eval\s*\|(.*)\|\s*$")


def parse_eval_row(line: str) -> dict | None:
    """airbench's end-of-run row `| run | eval | train_acc | val_acc | tta_val_acc | time_seconds |`."""
    m = EVAL_ROW.match(line.strip())
    if not m:
        return None
    cells = [c.strip() for c in m.group(2).split("|")]
    try:
        train_acc, val_acc, tta, seconds = (float(c) for c in cells)
    except ValueError:
        return None
    return {"train_acc": train_acc, "val_acc_no_tta": val_acc, "val_acc": tta, "total_s": seconds}


def airbench_runs(folder: Path, data: Path, runs: int, gpu: int | None, timeout: float, rows: list) -> None:
    """Run it and append one row per run (the first is its warm-up) to `rows`."""
    common = {"system": "airbench94_muon", "variant": "as published", "epochs": 8, "batch_size": 2000}
    try:
        script = prepare_airbench(folder, data, runs)
        common["airbench_source"] = airbench_source(folder)
    except (OSError, ValueError) as e:
        rows.append({**common, "run": "", "status": "skipped", "error": str(e)[:300]})
        log(f"airbench94_muon skipped: {e}")
        return
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    log(f"airbench94_muon: {sys.executable} {script.name} in {folder} ({common['airbench_source']})")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, script.name], cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    CHILDREN.append(proc)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    found = 0
    tail: list[str] = []
    try:
        for line in proc.stdout:
            tail = (tail + [line.strip()])[-5:]
            row = parse_eval_row(line)
            if row is not None:
                label = "warmup" if found == 0 else found - 1
                row = {**common, "run": label, **row, "status": "ok"}
                if found == 0:
                    row["setup_s"] = time.perf_counter() - t0  # its start, compile and warm-up run
                rows.append(row)
                found += 1
            print(f"airbench| {line}", end="", flush=True)  # after its row is kept: a kill now loses nothing
        rc = proc.wait()
    finally:
        timer.cancel()
    if rc != 0 or found < runs + 1:
        why = f"killed after {timeout:.0f} s (--airbench-timeout, --budget-s)" if rc < 0 else f"exit code {rc}"
        rows.append(
            {**common, "run": "", "status": "failed", "error": f"{why}; {found} rows; last: {' / '.join(tail)}"[:300]}
        )
        log(rows[-1]["error"])


# ---- results ----------------------------------------------------------------------------------
def summary_md(rows: list[dict], command: str) -> str:
    """Means and ranges over the timed runs of each system and variant, computed from the rows."""
    out = [f"`{command}`", "", "| system | variant | runs | accuracy mean (min-max) | seconds mean (min-max) |"]
    out.append("|---|---|---:|---:|---:|")
    keys = []
    for r in rows:
        if (r["system"], r["variant"]) not in keys:
            keys.append((r["system"], r["variant"]))
    for system, variant in keys:
        ok = [r for r in rows if (r["system"], r["variant"]) == (system, variant) and r.get("status") == "ok"]
        timed = [r for r in ok if r["run"] != "warmup"]
        if not timed:
            out.append(f"| {system} | {variant} | 0 | - | - |")
            continue
        acc = [100 * float(r["val_acc"]) for r in timed]
        sec = [float(r["total_s"]) for r in timed]
        out.append(
            f"| {system} | {variant} | {len(timed)} | {statistics.mean(acc):.2f} % ({min(acc):.2f}-{max(acc):.2f}) "
            f"| {statistics.mean(sec):.3f} ({min(sec):.3f}-{max(sec):.3f}) |"
        )
    first = rows[0] if rows else {}
    out += [
        "",
        f"{first.get('device', '')}, driver {first.get('driver', '')}, torch {first.get('torch', '')}, "
        f"git {first.get('git_rev', '')}, {first.get('date', '')}. Seconds: train + TTA eval as each times it "
        "(cnnpar: whitening, epochs and TTA eval; airbench94_muon: its own timer). Warm-up runs not counted.",
    ]
    return "\n".join(out) + "\n"


def default_out(env: dict) -> str:
    gpu = env["device"].split()[-1].lower() if env["device_type"] == "cuda" else "cpu"
    return f"benchmarks/results/{env['date'][:10]}-{re.sub(r'[^a-z0-9]+', '-', gpu)}/cifar10_record.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="timed runs of each system (after one warm-up run)")
    ap.add_argument("--data", default=".devdata/cifar10.npz", help="decoded CIFAR-10 for cnnpar")
    ap.add_argument("--airbench-data", default=".devdata/cifar10", help="folder with airbench's train.pt and test.pt")
    ap.add_argument("--airbench-dir", default=".devdata/airbench", help="git-ignored folder holding airbench94_muon.py")
    ap.add_argument(
        "--fetch-airbench", metavar="GIT_DIR", help="copy airbench94_muon.py from this git snapshot, then stop"
    )
    ap.add_argument(
        "--airbench-gpu", type=int, default=None, help="run airbench there, beside cnnpar (default: after it, same GPU)"
    )
    ap.add_argument("--airbench-timeout", type=float, default=330.0, help="seconds airbench may take, compile included")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=510.0,
        help="stop starting parts (further variants, airbench's runs) that would end past this many seconds",
    )
    ap.add_argument("--skip-airbench", action="store_true")
    ap.add_argument("--skip-cnnpar", action="store_true")
    ap.add_argument(
        "--variant",
        action="append",
        default=None,
        help="after the preset's runs, runs with it changed: section.field=value[,...] (repeat for more)",
    )
    ap.add_argument("--set", default="", help="change the preset for every cnnpar run: section.field=value[,...]")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--out", default="", help="CSV of every run (default benchmarks/results/<date>-<gpu>/cifar10_record.csv)"
    )
    args = ap.parse_args()
    if args.fetch_airbench:
        fetch_airbench(args.fetch_airbench, Path(args.airbench_dir))
        return
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(device)
    env = environment(device)
    out = Path(args.out or default_out(env))
    log(f"{env['device']} | torch {env['torch']} | git {env['git_rev']} | {command}")
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    rows: list[dict] = []
    air_rows: list[dict] = []  # filled by airbench_runs as its runs end (from a thread when beside)

    def write() -> None:  # after every part, and on the way out: a killed call keeps what it measured
        done = rows + air_rows
        if not done:  # a refusal before the first run (a missing --data) left an empty CSV and .md behind
            return
        meta = {k: env[k] for k in ("device", "driver", "torch", "cuda", "world_size", "git_rev", "date")}
        for r in done:
            r.update(meta, command=command)
            for k in ("val_acc", "total_s", "whiten_s", "train_s", "launch_lead_s", "eval_s", "setup_s", "compile_s"):
                if isinstance(r.get(k), float):
                    r[k] = round(r[k], 4)
        write_csv_atomic(out, done, COLUMNS)
        write_text_atomic(out.with_suffix(".md"), summary_md(done, command))

    # `timeout` sends SIGTERM: leave through the finally below (rows written, airbench stopped)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    folder, data = Path(args.airbench_dir), Path(args.airbench_data)
    beside = args.airbench_gpu is not None and not args.skip_airbench
    after = not args.skip_airbench and not beside
    try:
        if beside:
            air = threading.Thread(
                target=airbench_runs,
                args=(folder, data, args.seeds, args.airbench_gpu, args.airbench_timeout, air_rows),
                daemon=True,
            )
            air.start()
        if not args.skip_cnnpar:
            info = DistInfo(0, 0, 1, device)
            base = cifar10_record()
            base = replace(
                base, data=replace(base.data, source=args.data), speed=replace(base.speed, device=device.type)
            )
            base = variant_config(base, args.set) if args.set else base
            bundle = load_data(base.data, 0)
            for i, variant in enumerate(["", *(args.variant or [])]):  # the preset itself first
                reserve = args.airbench_timeout if after else 0.0
                if i and deadline - time.perf_counter() < reserve + 60:
                    why = f"skipped: under {reserve + 60:.0f} s of --budget-s left"
                    rows.append({"system": "cnnpar", "variant": variant, "run": "", "status": why})
                    log(f"cnnpar {variant}: {why}")
                    continue
                rows.extend(cnnpar_runs(base, info, bundle, variant, i, args.seeds))
                write()
                if "torch._dynamo" in sys.modules:
                    torch._dynamo.reset()  # each variant compiles afresh (and under its own recompile limit)
            log(f"cnnpar done in {time.perf_counter() - t0:.0f} s")
        if beside:
            air.join()
        elif after:
            timeout = max(1.0, min(args.airbench_timeout, deadline - time.perf_counter()))
            airbench_runs(folder, data, args.seeds, None, timeout, air_rows)
    finally:
        stop_children()
        write()
    if not rows + air_rows:
        log(f"no runs made: {out} not written")
        return
    log(summary_md(rows + air_rows, command))
    log(f"wrote {out} and {out.with_suffix('.md')} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "cifar10_record"))  # a missing --data: one line, exit 2
