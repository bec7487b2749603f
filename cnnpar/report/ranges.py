"""Named ranges around the phases of a training step, for torch.profiler and for Nsight Systems.

`span("forward")` opens a `torch.profiler.record_function` range only while a torch profiler is
recording (one cheap flag check otherwise), and an NVTX range whenever CUDA is available, so an
`nsys profile cnnpar train ...` capture shows the same phases. An NVTX push/pop with no tool
attached costs well under a microsecond and never synchronises the device.
"""

from __future__ import annotations

import torch

DATA_WAIT = "data_wait"
H2D_COPY = "h2d_copy"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER_STEP = "optimizer_step"
JPEG_DECODE = "jpeg_decode"  # a GPU decoder's decode stage (the feeder's thread)
CROP_RESIZE = "crop_resize"  # its crop and resize stage
GRAPH_REPLAY = "forward_backward_graph"  # forward + backward replayed as one CUDA graph (parallel/graphs.py)
STEP_RANGES = (DATA_WAIT, H2D_COPY, FORWARD, BACKWARD, GRAPH_REPLAY, OPTIMIZER_STEP)
# why a step range can be absent from a profile that ran correctly (top_ops_markdown says it beside the table)
ABSENT_BECAUSE = {
    H2D_COPY: "no host-to-device copy in the training thread: the data is resident on the device, or a GPU "
    "decoder's thread made the batch there",
    FORWARD: f"replayed inside {GRAPH_REPLAY} (cnnpar's CUDA graph of forward + backward)",
    BACKWARD: f"replayed inside {GRAPH_REPLAY}",
    GRAPH_REPLAY: "the step is not replayed from a CUDA graph (CPU, --cuda-graphs off, or where graphs do not apply)",
}

_nvtx: bool | None = None  # decided on first use: importing cnnpar must not initialise CUDA


def _nvtx_on() -> bool:
    global _nvtx
    if _nvtx is None:
        _nvtx = torch.cuda.is_available()
    return _nvtx


class span:
    """`with span(name):` marks a region for whichever profiler is listening."""

    __slots__ = ("name", "_rf", "_pushed")
    # Set while a profiler records every thread (`profile_all_threads`, benchmarks/jpeg_pipeline.py):
    # the check below answers only for the thread that started the profiler.
    all_threads = False

    def __init__(self, name: str) -> None:
        self.name = name
        self._rf = None
        self._pushed = False

    def __enter__(self) -> span:
        if span.all_threads or torch._C._autograd._profiler_enabled():
            self._rf = torch.profiler.record_function(self.name)
            self._rf.__enter__()
        if _nvtx_on():
            torch.cuda.nvtx.range_push(self.name)
            self._pushed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._pushed:
            torch.cuda.nvtx.range_pop()
            self._pushed = False
        if self._rf is not None:
            self._rf.__exit__(*exc)
            self._rf = None
