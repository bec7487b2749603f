"""The training thread's CUDA stream when a GPU decoder feeds the run.

torch queues a thread's work on the legacy default stream unless told otherwise. nvJPEG makes streams
of its own with `cudaStreamCreate`, which are *blocking* streams: the legacy default stream and every
blocking stream synchronise implicitly, both ways. So each per-image copy and colour conversion nvJPEG
queues waits for all of the step's kernels queued before it, and the step's next kernels wait for those.
On an H200 (benchmarks/results/2026-12-01-h200/call-zd) that coupling showed as a decoder that kept up
alone (11,210 img/s) and starved the step beside it: with CUDA graphs, where one launch queues a whole
37 ms step, the data wait was 95 % with the JPEG engines and with torchvision's nvJPEG alike, while the
GIL was held only 14 % of the time.

A stream torch makes (`torch.cuda.Stream`) is non-blocking: no implicit synchronisation with anything.
The feeder already orders each batch after its decode with an event (loader._in_thread), and the
training thread's own work stays in order on its one stream. `TrainingStream` switches the calling
thread to such a stream and back, each switch ordered after the work queued before it.
"""

from __future__ import annotations

import torch

# benchmarks/jpeg_pipeline.py's stream=legacy sets this False to measure the coupling
FOR_GPU_DECODERS = True


def wants_own_stream(device: torch.device, gpu_decoder: bool) -> bool:
    """A stream of its own for the training thread: on CUDA, where a GPU decoder feeds the run."""
    return FOR_GPU_DECODERS and gpu_decoder and device.type == "cuda"


class TrainingStream:
    """Makes a new non-blocking stream the calling thread's current one (`enter`) and restores the one
    before (`exit`). No-op where `wants_own_stream` says no."""

    def __init__(self, device: torch.device, gpu_decoder: bool) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if wants_own_stream(device, gpu_decoder) else None
        self._before: torch.cuda.Stream | None = None

    def enter(self) -> None:
        if self.stream is None or self._before is not None:
            return
        self._before = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(self._before)  # what was queued before (the model's weights) comes first
        torch.cuda.set_stream(self.stream)

    def exit(self) -> None:
        if self._before is None:
            return
        current = torch.cuda.current_stream(self.device)
        if current == self.stream:
            self._before.wait_stream(self.stream)  # whatever comes after waits for the training's work
            torch.cuda.set_stream(self._before)
        else:  # a later switch (a second Trainer) is still in force: it stays, after this one's work
            current.wait_stream(self.stream)
        self._before = None

    def describe(self) -> str:
        return "own non-blocking stream (a GPU decoder's library streams block the default one)" if self.stream else ""
