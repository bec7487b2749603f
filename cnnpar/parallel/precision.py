"""Precision owns autocast, backward and the optimizer step.

Only fp16 needs a GradScaler (its 5-bit exponent underflows small gradients); bf16 has fp32's
range and needs none. The scaler's skipped steps (inf/nan gradients) are counted so a run can
report them rather than silently train on fewer steps.
"""

from __future__ import annotations

import contextlib

import torch

from cnnpar.config import Config, bf16_by_default, resolve_for_device
from cnnpar.data.nvjpeg_hw import jpeg_engines


def cpu_has_native_bf16() -> bool:
    """True where the CPU multiplies bf16 in hardware (AVX512-BF16 or AMX); elsewhere oneDNN
    emulates it and bf16 autocast is slower than fp32. Private torch probes, so guarded."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    try:
        return any(getattr(torch.cpu, name, lambda: False)() for name in probes)
    except Exception:  # a probe that misbehaves on some build means "do not assume bf16"
        return False


def _bf16_abilities(device: torch.device) -> tuple[bool, bool]:
    """(bf16 runs on the device at all, the CPU computes bf16 natively), as `resolve_for_device` takes them."""
    return device.type != "cuda" or torch.cuda.is_bf16_supported(), cpu_has_native_bf16()


def bf16_on(device: torch.device) -> bool:
    """Whether --precision auto trains in bf16 on `device`, asked as `resolve_for` asks it: what the doctor reports
    as the device's bf16 support, so the fact agrees with the precision a run on it resolves."""
    return bf16_by_default(device.type, *_bf16_abilities(device))


def emulated_bf16_note(precision: str, device: torch.device) -> str:
    """A line where a run trains in bf16 on a CPU that emulates it ("" elsewhere): --precision auto picks fp32 there,
    so only a typed bf16 (or a preset's) gets here, and it trained many times slower than fp32 without a word (the
    bf16 rung of benchmarks/results/ladder_cpu_emulated_bf16/: about a tenth of fp32's images/s)."""
    if precision != "bf16" or device.type != "cpu" or cpu_has_native_bf16():
        return ""
    return (
        "note: --precision bf16 on a CPU without native bf16 (AVX512-BF16 or AMX): oneDNN emulates it, slower than "
        "fp32, which --precision auto picks on this CPU"
    )


def resolve_for(cfg: Config, device: torch.device) -> Config:
    """`resolve_for_device` with what this machine supports (bf16 on this GPU, native bf16 on this
    CPU, JPEG engines on this GPU): the one resolution `cnnpar train`, the bench, the doctor and tune
    all use."""
    bf16_ok, cpu_bf16 = _bf16_abilities(device)
    engines = jpeg_engines(cfg.data.decode, cfg.data.source, device)
    return resolve_for_device(cfg, device.type, bf16_ok, cpu_bf16=cpu_bf16, jpeg_engines=engines)


def set_tf32(on: bool) -> None:
    """TF32 for float32 matmuls and cuDNN's convolutions, on or off. Through `set_float32_matmul_precision`, which
    sets torch's legacy precision and its newer per-backend `fp32_precision` values (CUDA's and oneDNN's matmuls)
    together; never `cuda.matmul.allow_tf32`, which sets the legacy value and CUDA's alone: after a caller's
    `set_float32_matmul_precision("high")` (Lightning's advice) it left oneDNN's matmuls at TF32 under "highest",
    a mix newer torch (2.11, 2.14) refuses to read: `get_float32_matmul_precision()` raises
    "PyTorch is checking the matmul precision without a specific backend name"."""
    torch.set_float32_matmul_precision("high" if on else "highest")
    torch.backends.cudnn.allow_tf32 = on  # cuDNN's legacy flag sets its conv and rnn values of the newer API too
    if not on:
        # off, that flag stores "none" for them, which falls back to cuDNN's whole value or the generic one: after a
        # caller's `torch.backends.fp32_precision = "tf32"` (or cudnn's), --precision fp32 convolved in TF32
        for op in ("conv", "rnn"):
            if hasattr(module := getattr(torch.backends.cudnn, op, None), "fp32_precision"):  # torch >= 2.9
                module.fp32_precision = "ieee"


class Precision:
    def __init__(self, kind: str, device: torch.device) -> None:
        self.kind, self.device = kind, device
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(kind)
        # tf32 lets fp32 matmuls/convs use the tensor cores with a 10-bit mantissa; "fp32" keeps
        # full precision, so set the flag explicitly either way.
        if device.type == "cuda":
            set_tf32(kind in ("tf32", "bf16", "fp16"))
        self.scaler = torch.amp.GradScaler(device.type) if kind == "fp16" else None
        self._skipped_before = 0  # restored from a checkpoint, or set
        self._skipped_here: torch.Tensor | None = None  # steps skipped since, counted on the device

    @property
    def skipped_steps(self) -> int:
        """Steps the GradScaler skipped (inf/nan gradients). Read once an epoch, not at every step."""
        if self._skipped_here is None:
            return self._skipped_before
        return self._skipped_before + int(self._skipped_here.item())  # note: a CPU-GPU sync point

    @skipped_steps.setter
    def skipped_steps(self, n: int) -> None:
        self._skipped_before, self._skipped_here = int(n), None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale before clipping reads their norm."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
            return
        # The scale as a device tensor, not get_scale(): a fused optimizer takes the scaler's inf check on the
        # device, so two get_scale() reads were the fp16 step's only host syncs, two a step, draining the launch queue
        scale = self.scaler._get_scale_async()  # None before any scaled backward: the scaler's own step says so
        before = scale.clone() if scale is not None else None
        if hasattr(optimizer, "skip_synchronize"):
            # Horovod's DistributedOptimizer: its all-reduce must finish before the scaler reads the gradients
            # (unscale and its inf check, on averaged gradients: every rank then skips the same steps), and its
            # step must not synchronise again. Without this a skipped step left the all-reduce pending and the
            # next zero_grad raised (Horovod's documented GradScaler pattern).
            optimizer.synchronize()
            with optimizer.skip_synchronize():
                self.scaler.step(optimizer)
        else:
            self.scaler.step(optimizer)
        self.scaler.update()
        if before is not None:
            self._count_skipped(self.scaler._get_scale_async() < before)  # the scale drops exactly when skipped

    def _count_skipped(self, dropped: torch.Tensor) -> None:
        if self._skipped_here is None:
            self._skipped_here = torch.zeros((), dtype=torch.int64, device=dropped.device)
        self._skipped_here += dropped

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict() if self.scaler else {}, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
