"""Read a torch.profiler Chrome trace (JSON, or JSON.gz) of training steps and say where the time
went: how busy the GPU was and on which streams; of the step stream's idle time, how much the device
spent waiting for the host to launch the next operation (and from which thread) and how much the next
operation was already queued; what kinds of kernels the step is made of (BatchNorm passes, convolutions
and matrix products, other fused kernels, the optimizer); and, per host thread, the named ranges and
the CUDA runtime calls that wait. Nothing here is timed: it reads what the profiler recorded.

`cnnpar profile` writes this reading beside its trace; benchmarks/trace_summary.py runs it on a stored
trace (benchmarks/jpeg_pipeline.py's `trace=1` epochs).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# runtime calls in which a host thread waits for the device or the allocator's driver calls
WAITS = (
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaDeviceSynchronize",
    "cudaStreamWaitEvent",
    "cudaMalloc",
    "cudaFree",
    "cudaHostAlloc",
    "cudaMemcpyAsync",
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
)


TOP = 8  # kernels listed per stream, by total time
NAME_HEAD, NAME_TAIL = 64, 24  # a long kernel name keeps its start and its distinguishing end


def short_name(name: str) -> str:
    if len(name) <= NAME_HEAD + NAME_TAIL + 3:
        return name
    return f"{name[:NAME_HEAD]}...{name[-NAME_TAIL:]}"


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by (start, end) intervals, overlaps counted once."""
    return sum(e - s for s, e in merged(intervals))


def overlap_length(a: list[tuple[float, float]], b_merged: list[tuple[float, float]]) -> float:
    """How much of the intervals `a` (merged here) lies inside `b_merged`."""
    total, j = 0.0, 0
    for s, e in merged(a):
        while j < len(b_merged) and b_merged[j][1] <= s:
            j += 1
        k = j
        while k < len(b_merged) and b_merged[k][0] < e:
            total += min(e, b_merged[k][1]) - max(s, b_merged[k][0])
            k += 1
    return total


KERNEL_CLASSES = (  # (label, pattern on the kernel's name), first match wins
    ("BatchNorm (+ReLU/add), Triton-fused", re.compile(r"^triton_.*batch_norm")),
    ("other Triton-fused", re.compile(r"^triton_")),
    ("convolution / matmul (cuDNN, cuBLAS)", re.compile(r"xmma|nvjet|implicit_gemm|cudnn|conv|gemm|wgrad|dgrad", re.I)),
    ("optimizer (foreach)", re.compile(r"multi_tensor|foreach")),
)


def kernel_class(name: str) -> str:
    for label, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return label
    return "other"


def late_launches(ops: list[dict], launches: dict, names: dict[int, str]) -> tuple[float, float, float, dict]:
    """Split the idle time between consecutive operations of one stream (kernels, copies, memsets, in
    order): gaps whose next operation was launched only after the previous one had ended (the device
    waited for the host: whose thread launched it), gaps whose next operation was already queued (it
    waited for something else), and gaps whose launch is not in the trace."""
    host = queued = unknown = 0.0
    by_thread: dict[str, float] = defaultdict(float)
    end = None
    for e in ops:
        if end is not None and e["ts"] > end:
            gap = e["ts"] - end
            launch = launches.get(e.get("args", {}).get("correlation"))
            if launch is None:
                unknown += gap
            elif launch["ts"] + launch["dur"] > end:
                host += gap
                by_thread[names.get(launch["tid"], str(launch["tid"]))] += gap
            else:
                queued += gap
        end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])
    return host, queued, unknown, dict(by_thread)


def clipped(ts: float, dur: float, t0: float, t1: float) -> float:
    """How much of [ts, ts + dur] lies inside [t0, t1]."""
    return max(0.0, min(ts + dur, t1) - max(ts, t0))


def summarize(events: list[dict], thread_names: dict[int, str] | None = None) -> dict:
    """The figures `report` prints (microseconds, as the trace keeps them)."""
    thread_names = thread_names or {}
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    if gpu:
        t0 = min(e["ts"] for e in gpu)
        t1 = max(e["ts"] + e["dur"] for e in gpu)
    else:
        xs = [e for e in events if e.get("ph") == "X" and "dur" in e]
        t0, t1 = min(e["ts"] for e in xs), max(e["ts"] + e["dur"] for e in xs)
    window = max(t1 - t0, 1e-9)
    by_stream: dict[int, list[tuple[float, float]]] = defaultdict(list)
    # by whole name: inductor's kernels share long prefixes (`triton_red_fused__native_batch_norm_legit_...`) and
    # differ at the end, so a cut name would sum different kernels into one line
    names: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for e in gpu:
        stream = int(e.get("args", {}).get("stream", -1))
        by_stream[stream].append((e["ts"], e["ts"] + e["dur"]))
        total = names[stream][e["name"]]
        total[0] += e["dur"]
        total[1] += 1
    streams = {}
    known = [s for s in by_stream if s >= 0] or list(by_stream)  # -1: an operation without its stream
    main = max(known, key=lambda s: union_length(by_stream[s])) if by_stream else None
    main_busy = merged(by_stream[main]) if main is not None else []
    for s, iv in by_stream.items():
        busy = union_length(iv)
        top = [(name, us, int(n)) for name, (us, n) in sorted(names[s].items(), key=lambda kv: -kv[1][0])[:TOP]]
        streams[s] = {
            "ops": len(iv),
            "busy_us": busy,
            "busy_share": busy / window,
            "beside_main_share": (overlap_length(iv, main_busy) / busy if busy and s != main else None),
            "top": top,
        }
    gaps = [b[0] - a[1] for a, b in zip(main_busy, main_busy[1:])]
    main_ops = sorted((e for e in gpu if int(e.get("args", {}).get("stream", -1)) == main), key=lambda e: e["ts"])
    classes: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in (e for e in main_ops if e.get("cat") == "kernel"):
        c = classes[kernel_class(e["name"])]
        c[0] += e["dur"]
        c[1] += 1
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    host_wait, queued_wait, unknown_wait, host_by_thread = late_launches(main_ops, launches, thread_names)
    threads: dict[int, dict] = defaultdict(
        lambda: {"ranges": defaultdict(float), "calls": defaultdict(float), "counts": defaultdict(int), "ops_us": []}
    )
    for e in events:
        if e.get("ph") != "X" or "tid" not in e or not isinstance(e.get("tid"), int):
            continue
        inside = clipped(e["ts"], e.get("dur", 0.0), t0, t1)  # the part within the GPU's window
        if inside <= 0:
            continue
        th = threads[e["tid"]]
        cat = e.get("cat")
        if cat == "user_annotation":
            th["ranges"][e["name"]] += inside
        elif cat in ("cuda_runtime", "cuda_driver") and e["name"] in WAITS:
            th["calls"][e["name"]] += inside
            th["counts"][e["name"]] += 1
        elif cat == "cpu_op":
            th["ops_us"].append((max(e["ts"], t0), min(e["ts"] + e["dur"], t1)))
    out_threads = {}
    for tid, th in threads.items():
        busy = union_length(th["ops_us"])
        if not th["ranges"] and not th["calls"] and busy < 0.01 * window:
            continue
        out_threads[tid] = {
            "name": thread_names.get(tid, str(tid)),
            "torch_ops_share": busy / window,
            "ranges": dict(th["ranges"]),
            "calls": {k: (th["counts"][k], v) for k, v in th["calls"].items()},
        }
    return {
        "window_us": window,
        "gpu_busy_share": union_length([iv for s in by_stream.values() for iv in s]) / window,
        "main_stream": main,
        "main_gaps_over_1ms": (sum(1 for g in gaps if g > 1000), sum(g for g in gaps if g > 1000)),
        "main_gaps_all_us": sum(gaps),
        "main_kernel_classes": {k: (v[0], int(v[1])) for k, v in classes.items()},
        "main_idle_waiting_for_launch_us": host_wait,
        "main_idle_queued_us": queued_wait,
        "main_idle_launch_not_traced_us": unknown_wait,
        "main_idle_by_launching_thread_us": host_by_thread,
        "streams": streams,
        "threads": out_threads,
    }


def report(s: dict) -> str:
    w = s["window_us"]
    if s["main_stream"] is None:  # a CPU run: the host threads are all there is
        return "\n".join([f"window {w / 1e3:.1f} ms; no GPU activity in the trace", *_thread_lines(s)])
    lines = [
        f"window {w / 1e3:.1f} ms; GPU busy (any stream) {100 * s['gpu_busy_share']:.1f} %",
        f"main stream {s['main_stream']}: idle between its ops {s['main_gaps_all_us'] / 1e3:.1f} ms, of which "
        f"{s['main_gaps_over_1ms'][0]} gaps over 1 ms = {s['main_gaps_over_1ms'][1] / 1e3:.1f} ms",
    ]
    lines.append(
        f"  of its idle time, {s['main_idle_waiting_for_launch_us'] / 1e3:.1f} ms before an operation launched "
        "only after the one before had ended (the device waiting for the host), "
        f"{s['main_idle_queued_us'] / 1e3:.1f} ms with the next one already queued, "
        f"{s['main_idle_launch_not_traced_us'] / 1e3:.1f} ms whose launch the trace lacks"
    )
    for name, us in sorted(s["main_idle_by_launching_thread_us"].items(), key=lambda kv: -kv[1]):
        lines.append(f"      waiting for launches from {name}: {us / 1e3:.1f} ms")
    busy = sum(us for us, _ in s["main_kernel_classes"].values()) or 1.0
    lines.append("  the main stream's kernels by kind:")
    for label, (us, n) in sorted(s["main_kernel_classes"].items(), key=lambda kv: -kv[1][0]):
        lines.append(f"      {us / 1e3:8.1f} ms {100 * us / busy:5.1f} %  {n} kernels  {label}")
    for sid, st in sorted(s["streams"].items(), key=lambda kv: -kv[1]["busy_us"]):
        beside = st["beside_main_share"]
        lines.append(
            f"  stream {sid}: {st['ops']} ops, busy {st['busy_us'] / 1e3:.1f} ms ({100 * st['busy_share']:.1f} %)"
            + (f", {100 * beside:.0f} % of it beside the main stream's work" if beside is not None else "")
        )
        for name, us, n in st["top"]:
            lines.append(f"      {us / 1e3:8.1f} ms {n:5d} x {us / n:8.1f} us  {short_name(name)}")
    lines += _thread_lines(s)
    return "\n".join(lines)


PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")  # torch.profiler's own range around each recorded step


def merged_step_ranges(ranges: dict[str, float]) -> dict[str, float]:
    """The ranges with torch.profiler's ProfilerStep#N summed into one entry: one per recorded step, and
    each the longest, they would take the listed slots of cnnpar's own ranges (data_wait, h2d_copy)."""
    steps = [us for name, us in ranges.items() if PROFILER_STEP.match(name)]
    out = {name: us for name, us in ranges.items() if not PROFILER_STEP.match(name)}
    if steps:
        out[f"ProfilerStep#* ({len(steps)} steps)"] = sum(steps)
    return out


def _thread_lines(s: dict) -> list[str]:
    lines = []
    for tid, th in sorted(s["threads"].items(), key=lambda kv: kv[1]["name"]):
        lines.append(f"thread {th['name']} ({tid}): torch ops {100 * th['torch_ops_share']:.1f} % of the window")
        for name, us in sorted(merged_step_ranges(th["ranges"]).items(), key=lambda kv: -kv[1])[:8]:
            lines.append(f"      range {name}: {us / 1e3:.1f} ms")
        for name, (n, us) in sorted(th["calls"].items(), key=lambda kv: -kv[1][1]):
            lines.append(f"      {name}: {n} calls, {us / 1e3:.1f} ms, {us / max(n, 1) / 1e3:.3f} ms each")
    return lines
