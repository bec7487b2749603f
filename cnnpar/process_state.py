"""The process as a command found it: `cli.main` is called from Python too (a notebook, a script, the tests), and
what a command set for itself must not outlive it there. The signal handlers that turn a SIGTERM into a stop made
a notebook's own SIGTERM an exception and kept its dropped errors quiet after a stop; a run's seeds replaced the
caller's random streams; its cuDNN and TF32 choices changed the caller's later matmuls and convolutions."""

from __future__ import annotations

import contextlib
import csv
import gc
import random
import signal
import sys
import threading

import numpy as np
import torch

from cnnpar import errors


@contextlib.contextmanager
def stops_for_one_command():
    """`errors.stop_on_signals` while the block runs; then the handlers and unraisable hook it replaced, and no stop
    pending, so the next Ctrl-C in the caller is Python's own KeyboardInterrupt again. Nothing in a thread but the
    main one (a notebook's background run), where Python sets no handler (ValueError) and a Ctrl-C never lands: a
    SIGTERM ends the process there, as it would without cnnpar."""
    if threading.current_thread() is not threading.main_thread():
        try:
            yield
        finally:
            # a stop its output's reader going away noted (console.StopWhenGone) is this command's: left pending, it
            # ended the thread's next command at its first safe point (exit 141)
            errors.forget_stop()
        return
    handlers = {s: signal.getsignal(s) for s in errors.STOP_SIGNALS}
    hook = sys.unraisablehook
    errors.stop_on_signals()
    try:
        yield
    finally:
        came = None  # the signal of a stop that came meanwhile
        while True:  # until all is put back: a stop raised here by a handler still in place left the rest in place
            try:
                if came is None and errors.pending_stop() is not None:
                    # the stopped command's half-shut DataLoader iterators are finalised here, while their errors
                    # are still kept quiet (stop_on_signals), not later above the caller's own output
                    gc.collect()
                _put_back(handlers, hook)
                break
            except KeyboardInterrupt as e:  # cnnpar's handlers raise Terminated (a KeyboardInterrupt) for the others
                came = getattr(e, "signum", signal.SIGINT)
        if came is not None:
            # a stop that came as the command gave the process back (a second Ctrl-C: Jupyter's interrupt pressed
            # twice) goes to the caller's own handler, as one a moment later would: Python's KeyboardInterrupt, say
            signal.raise_signal(came)


def _put_back(handlers: dict, hook) -> None:
    """The caller's stop handlers and unraisable hook put back, and no stop pending. A second Ctrl-C that came while
    a stopped call put them back (20 ms after the first, in a kernel) was raised by cnnpar's handler still in place,
    and left the rest of them in the caller's process for good: a notebook kernel's SIGTERM then raised an exception
    in whatever cell ran, and kept the kernel's dropped errors ("Exception ignored in ...") quiet from then on."""
    for s, handler in handlers.items():
        if handler is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(s, handler)
    sys.unraisablehook = hook
    errors.forget_stop()


# torch >= 2.9's per-backend float32 precisions (`torch.backends.<name>.fp32_precision`), each backend's whole value
# before its operations' values: a backend's operations fall back to it where they say "none", as it to the generic one
_FP32_BACKENDS = ("", "cudnn", "mkldnn")
_FP32_OPERATIONS = ("cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")


def _fp32_module(name: str):
    module = torch.backends
    for part in filter(None, name.split(".")):
        module = getattr(module, part, None)
    return module if module is not None and hasattr(module, "fp32_precision") else None  # None: an older torch


def _read_refused(read):
    """A legacy TF32 setting as torch reads it, or None where torch refuses: a caller that set the newer
    `fp32_precision` API (PyTorch's documented way since 2.9) and not the legacy one left a mix whose legacy reads
    raise RuntimeError ("... you have used mix of the legacy and new APIs ..."); a command is not stopped by that."""
    try:
        return read()
    except RuntimeError:
        return None


def _fp32_settings() -> dict:
    return {
        "matmul_precision": _read_refused(torch.get_float32_matmul_precision),
        # where that read is refused (oneDNN's matmuls set alone through the newer API), "highest" or not still is
        "matmul_tf32": _read_refused(lambda: torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": _read_refused(lambda: torch.backends.cudnn.allow_tf32),
        # the values the getters resolve (torch has no getter of a raw "none"), which behave as the raw ones did
        "fp32_precision": {
            name: module.fp32_precision
            for name in _FP32_BACKENDS + _FP32_OPERATIONS
            if (module := _fp32_module(name)) is not None
        },
    }


def _put_fp32_settings(saved: dict) -> None:
    """The float32 precisions as `_fp32_settings` read them. The legacy ones through their setters, not
    `cuda.matmul.allow_tf32` where the precision string could be read: it is `set_float32_matmul_precision`'s own
    value ("medium" read back as True would come back "high"), and setting it alone after that call left oneDNN's
    matmuls at TF32 under "highest", a mix torch refuses to read, which ended every later command from Python in
    torch's RuntimeError (the GPU tests, session 50). Then the newer API's values, which those setters move, exactly
    as they were."""
    new = saved["fp32_precision"]
    for name in _FP32_BACKENDS:
        if name in new:
            _fp32_module(name).fp32_precision = new[name]
    if saved["matmul_precision"] is not None:
        torch.set_float32_matmul_precision(saved["matmul_precision"])
    elif saved["matmul_tf32"] is not None:
        # the legacy precision left at the command's "high" made the caller's `cuda.matmul.allow_tf32`, readable
        # before, raise after a run with TF32 (torch.compile reads it); the values it moves are put back below
        torch.backends.cuda.matmul.allow_tf32 = saved["matmul_tf32"]
    if saved["cudnn_tf32"] is not None:
        torch.backends.cudnn.allow_tf32 = saved["cudnn_tf32"]
    for name in _FP32_OPERATIONS:
        if name in new:
            _fp32_module(name).fp32_precision = new[name]


def _cuda_started() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


@contextlib.contextmanager
def torch_settings_kept():
    """The global settings and random streams a command sets (the trainer's seeds and cudnn.benchmark, Precision's
    TF32 flags, Horovod's threads, the csv module's field limit that data/csv_source.py raises for a pixel CSV's long
    rows) as they were before it. A CUDA generator is put back only where CUDA had started
    before the command: one started during it keeps the run's seed."""
    saved = {
        "benchmark": torch.backends.cudnn.benchmark,
        "deterministic": torch.backends.cudnn.deterministic,
        "fp32": _fp32_settings(),
        "threads": torch.get_num_threads(),
        "csv_field_limit": csv.field_size_limit(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
        "cuda_rng": torch.cuda.get_rng_state_all() if _cuda_started() else None,
        # the caller's current GPU, which the command's start_cuda (dist) changes: a notebook's later `.cuda()` went
        # to the GPU the call ran on. Only where CUDA had started: set back on a fresh process, it would start a
        # context on GPU 0 that nothing uses
        "cuda_device": torch.cuda.current_device() if _cuda_started() else None,
    }
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved["benchmark"]
        torch.backends.cudnn.deterministic = saved["deterministic"]
        _put_fp32_settings(saved["fp32"])
        csv.field_size_limit(saved["csv_field_limit"])
        if torch.get_num_threads() != saved["threads"]:
            torch.set_num_threads(saved["threads"])
        torch.set_rng_state(saved["torch_rng"])
        np.random.set_state(saved["numpy_rng"])
        random.setstate(saved["python_rng"])
        if saved["cuda_rng"] is not None:
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        if saved["cuda_device"] is not None:
            with contextlib.suppress(RuntimeError):  # a CUDA error that ended the command, not hidden by a second
                torch.cuda.set_device(saved["cuda_device"])
