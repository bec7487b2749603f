"""cnnpar.report.trace_reading reads a profiler trace: its interval arithmetic and its attribution
of GPU work to streams and of waits to host threads, on traces made up here."""

import pytest

from cnnpar.report import trace_reading as trace_summary


def test_union_and_overlap_count_shared_time_once():
    assert trace_summary.union_length([(0, 10), (5, 15), (20, 25)]) == 20
    assert trace_summary.union_length([(0, 10), (2, 3)]) == 10
    main = trace_summary.merged([(0, 10), (20, 30)])
    assert trace_summary.overlap_length([(5, 25)], main) == 10  # 5-10 and 20-25
    assert trace_summary.overlap_length([(10, 20)], main) == 0


def _kernel(ts, dur, stream, name="k"):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_summary_finds_the_step_stream_its_gaps_and_each_threads_waits():
    events = [
        _kernel(0, 400, 7, "conv"),
        _kernel(1400, 600, 7, "conv"),  # a 1 ms gap on the step's stream
        _kernel(300, 200, 13, "resize"),  # half of it beside the step's kernels
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 500, "dur": 800, "tid": 2},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 5, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "data_wait", "ts": 420, "dur": 900, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 1000, "tid": 1},
    ]
    s = trace_summary.summarize(events, {1: "MainThread", 2: "cnnpar-decode"})
    assert s["window_us"] == 2000
    assert s["main_stream"] == 7
    assert s["gpu_busy_share"] == pytest.approx((400 + 100 + 600) / 2000)
    assert s["main_gaps_over_1ms"] == (0, 0)  # 1,000 us exactly is not over 1 ms
    assert s["main_gaps_all_us"] == 1000
    assert s["streams"][13]["beside_main_share"] == pytest.approx(0.5)
    assert s["streams"][7]["beside_main_share"] is None
    threads = s["threads"]
    assert threads[2]["name"] == "cnnpar-decode"
    assert threads[2]["calls"]["cudaStreamSynchronize"] == (1, 800)
    assert threads[1]["ranges"] == {"data_wait": 900}
    assert threads[1]["torch_ops_share"] == pytest.approx(0.5)
    text = trace_summary.report(s)
    assert "cnnpar-decode" in text and "stream 13" in text


def test_idle_time_is_split_by_whether_the_next_kernel_was_launched_late():
    def launch(ts, dur, corr, tid):
        return {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cuLaunchKernel",
            "ts": ts,
            "dur": dur,
            "tid": tid,
            "args": {"correlation": corr},
        }

    def kernel(ts, dur, corr, name):
        return {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "ts": ts,
            "dur": dur,
            "args": {"stream": 7, "correlation": corr},
        }

    events = [
        launch(0, 5, 1, 1),
        kernel(10, 100, 1, "triton_red_fused__native_batch_norm_legit_functional_3"),
        launch(20, 5, 2, 1),
        kernel(150, 100, 2, "sm90_xmma_dgrad_implicit_gemm_bf16"),  # queued: waited 40 us
        launch(400, 5, 3, 2),
        kernel(410, 50, 3, "triton_poi_fused_add_7"),  # launched late: 160 us idle
    ]
    s = trace_summary.summarize(events, {1: "MainThread", 2: "backward"})
    assert s["main_idle_queued_us"] == 40
    assert s["main_idle_waiting_for_launch_us"] == 160
    assert s["main_idle_by_launching_thread_us"] == {"backward": 160}
    classes = s["main_kernel_classes"]
    assert classes["BatchNorm (+ReLU/add), Triton-fused"] == (100, 1)
    assert classes["convolution / matmul (cuDNN, cuBLAS)"] == (100, 1)
    assert classes["other Triton-fused"] == (50, 1)


def test_a_copy_between_two_kernels_is_work_not_idle_and_untraced_launches_are_counted_apart():
    def op(cat, ts, dur, corr):
        return {"ph": "X", "cat": cat, "name": "x", "ts": ts, "dur": dur, "args": {"stream": 7, "correlation": corr}}

    events = [
        op("kernel", 0, 100, 1),
        op("gpu_memcpy", 100, 100, 2),  # back to back: no idle time at all
        op("kernel", 200, 100, 3),
        op("kernel", 350, 50, 4),  # 50 us idle, and no launch of correlation 4 in the trace
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 250,
            "dur": 5,
            "tid": 1,
            "args": {"correlation": 3},
        },
    ]
    s = trace_summary.summarize(events)
    assert s["main_gaps_all_us"] == 50
    assert s["main_idle_waiting_for_launch_us"] == 0  # correlation 3 came late, but no gap preceded it
    assert s["main_idle_launch_not_traced_us"] == 50
    assert s["main_idle_queued_us"] == 0


def test_host_figures_count_only_the_part_of_a_range_inside_the_gpu_window():
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 100, "dur": 100, "args": {"stream": 7}},
        {"ph": "X", "cat": "user_annotation", "name": "data_wait", "ts": 0, "dur": 150, "tid": 1},  # half inside
        {"ph": "X", "cat": "user_annotation", "name": "late", "ts": 500, "dur": 10, "tid": 1},  # outside
    ]
    s = trace_summary.summarize(events)
    assert s["threads"][1]["ranges"] == {"data_wait": 50}


def test_a_cpu_trace_is_read_as_host_threads_only():
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "forward", "ts": 0, "dur": 40, "tid": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "ts": 0, "dur": 30, "tid": 5},
        {"ph": "X", "cat": "user_annotation", "name": "data_wait", "ts": 40, "dur": 60, "tid": 5},
    ]
    s = trace_summary.summarize(events, {5: "MainThread"})
    assert s["main_stream"] is None and s["window_us"] == 100
    text = trace_summary.report(s)
    assert text.startswith("window 0.1 ms; no GPU activity in the trace")
    assert "thread MainThread (5): torch ops 30.0 %" in text and "range data_wait: 0.1 ms" in text


def test_kernels_that_share_a_long_prefix_are_listed_apart_with_their_counts():
    stem = "triton_red_fused__native_batch_norm_legit_functional_native_batch_norm_backward_threshold_backward_"
    events = [_kernel(0, 100, 7, stem + "53"), _kernel(100, 100, 7, stem + "53"), _kernel(200, 700, 7, stem + "60")]
    top = trace_summary.summarize(events)["streams"][7]["top"]
    assert top == [(stem + "60", 700, 1), (stem + "53", 200, 2)]  # a 60-character cut would have made one line
    text = trace_summary.report(trace_summary.summarize(events))
    assert "1 x    700.0 us" in text and "2 x    100.0 us" in text
    assert "threshold_backward_60" in text  # the distinguishing end of a long name is kept


def test_the_per_step_profiler_ranges_are_one_line_and_leave_room_for_data_wait():
    # five ProfilerStep#N ranges, each the longest, took 5 of the 8 listed slots and pushed data_wait out
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": 100 * i, "dur": 100, "tid": 5}
              for i in range(5)]  # fmt: skip
    for i, name in enumerate(["forward", "backward", "optimizer_step", "zero_grad", "loss", "h2d_copy", "data_wait"]):
        events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": 10 * i, "dur": 9 - i, "tid": 5})
    text = trace_summary.report(trace_summary.summarize(events, {5: "MainThread"}))
    ranges = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("range ")]
    assert ranges[0] == "range ProfilerStep#* (5 steps): 0.5 ms"
    assert "range data_wait: 0.0 ms" in ranges and "range h2d_copy: 0.0 ms" in ranges
    assert not any("ProfilerStep#0" in r for r in ranges)


def test_the_top_operators_table_does_not_rank_the_profilers_step_range():
    from types import SimpleNamespace

    from cnnpar.report.profiler import top_ops_markdown

    def avg(key, self_cpu_us):
        return SimpleNamespace(key=key, count=5, self_cpu_time_total=self_cpu_us, cpu_time_total=self_cpu_us,
                               self_cpu_memory_usage=0, self_device_time_total=0.0, device_time_total=0.0,
                               self_device_memory_usage=0)  # fmt: skip

    md = top_ops_markdown([avg("ProfilerStep*", 9000.0), avg("aten::conv2d", 500.0)], False, 5)
    assert "Top 1 operators" in md and "| `aten::conv2d` |" in md
    assert "ProfilerStep" not in md
