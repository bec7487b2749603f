"""Precision: autocast dtypes, a GradScaler only for fp16, and bf16/fp16 training on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

from cnnpar.config import Config, DataConfig, RunConfig, SpeedConfig
from cnnpar.dist import DistInfo
from cnnpar.engine.trainer import Trainer
from cnnpar.parallel.precision import Precision

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("kind", ["fp32", "tf32", "bf16", "fp16"])
def test_grad_scaler_exists_only_for_fp16(kind):
    p = Precision(kind, CPU)
    assert (p.scaler is not None) == (kind == "fp16")
    if kind == "fp16":
        assert isinstance(p.scaler, torch.amp.GradScaler)


@pytest.mark.parametrize("kind,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_runs_convolutions_in_the_chosen_dtype(kind, dtype):
    conv = torch.nn.Conv2d(1, 2, 3)
    with Precision(kind, CPU).autocast():
        out = conv(torch.randn(1, 1, 5, 5))
    assert out.dtype == dtype


def _tiny_run(tmp_path, precision: str):
    # Few small batches: the CPU has no fast fp16 convolutions, so fp16 steps are slow here.
    cfg = Config(
        data=DataConfig(source="synthetic", image_shape="1x16x16", num_classes=4, synthetic_samples=160),
        speed=SpeedConfig(device="cpu", precision=precision),
        run=RunConfig(epochs=2, batch_size=32, out_dir=str(tmp_path / "runs"), name=precision, progress=False),
    )
    return Trainer(cfg, DistInfo(0, 0, 1, CPU), log=lambda *a, **k: None).fit()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_trains_on_cpu_with_finite_loss(tmp_path, precision):
    result = _tiny_run(tmp_path, precision)
    losses = [row["train_loss"] for row in result.history]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]  # it learns, not merely runs
    assert result.summary["precision"] == precision
    steps = 2 * (128 // 32)  # 2 epochs of the 128 training samples (20 % of the 160 held out), batch 32
    skipped = result.summary["skipped_steps"]
    # bf16 has no scaler and skips nothing; fp16's scaler may skip its first overflowing steps, not most of them
    assert skipped == 0 if precision == "bf16" else 0 <= skipped < steps // 2, (precision, skipped)
    assert (result.run_dir / "ckpt" / "last.pt").is_file()


def test_fp16_state_round_trips_scale_and_skipped_steps():
    a = Precision("fp16", CPU)
    a.skipped_steps = 3
    a.scaler.scale(torch.ones(()))  # the scaler makes its scale tensor lazily, on first use
    a.scaler.update(1024.0)
    b = Precision("fp16", CPU)
    b.load_state_dict(a.state_dict())
    assert b.skipped_steps == 3 and b.scaler.get_scale() == 1024.0


def test_fp16_steps_read_nothing_from_the_device_and_still_count_the_skipped_ones(monkeypatch):
    """A fused optimizer (cnnpar's on CUDA) takes the GradScaler's inf check on the device, so an fp16 step needs
    no host sync; counting the skipped steps read the scale twice a step (get_scale: a sync each, which drains a
    GPU's launch queue). They are counted on the device and read where an epoch's row or a check asks."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    precision = Precision("fp16", CPU)
    reads = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        read = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, read=read, name=name: reads.append(name) or read(t, *a))
    trained = []
    for factor in (1e6, 1e6, 0.1, 0.1):  # 1e6 x the scale overflows fp16's gradients: those steps are skipped
        before = model.weight.detach().clone()
        with precision.autocast():
            loss = factor * model(torch.ones(4, 2)).float().mean()
        precision.backward(loss)
        precision.step(opt)
        opt.zero_grad(set_to_none=True)
        trained.append(not torch.equal(before, model.weight))
    assert reads == []
    monkeypatch.undo()
    assert trained == [False, False, True, True]
    assert precision.skipped_steps == 2
    precision.skipped_steps = 5  # as a restored checkpoint sets it: the device count starts again from there
    assert precision.skipped_steps == 5


def test_fp16_under_horovod_reads_the_gradients_after_its_all_reduce():
    """Horovod's DistributedOptimizer all-reduces in the background: the scaler must wait for it (synchronize)
    before unscaling and checking for infs, then step without synchronising again (Horovod's GradScaler pattern).
    Before, a rank's own gradients were read mid all-reduce and a skipped step left it pending."""
    import contextlib

    events = []
    model = torch.nn.Linear(2, 1)

    class HorovodLike:  # the optimizer surface the scaler uses, plus Horovod's two calls
        def __init__(self, inner):
            self.inner, self.param_groups, self.state = inner, inner.param_groups, inner.state

        def synchronize(self):
            events.append("synchronize")

        @contextlib.contextmanager
        def skip_synchronize(self):
            events.append("skip on")
            yield
            events.append("skip off")

        def step(self, *args, **kwargs):
            events.append("step")
            return self.inner.step()

    opt = HorovodLike(torch.optim.SGD(model.parameters(), lr=0.1))
    precision = Precision("fp16", CPU)
    with precision.autocast():
        loss = 0.1 * model(torch.ones(4, 2)).float().mean()  # gradients x 65,536 stay under fp16's 65,504
    precision.backward(loss)
    precision.step(opt)
    assert events == ["synchronize", "skip on", "step", "skip off"]


@pytest.mark.parametrize("native", [False, True])
def test_a_typed_bf16_on_a_cpu_that_emulates_it_is_said_at_the_start(tmp_path, monkeypatch, capsys, native):
    """--precision auto picks fp32 on a CPU without native bf16, but a typed bf16 trained there many times slower
    than fp32 (benchmarks/results/ladder_cpu_emulated_bf16/: about a tenth of its images/s) with no word about it."""
    from cnnpar.cli import main
    from cnnpar.parallel import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    quick = ["--data", "synthetic", "--image-shape", "1x8x8", "--synthetic-samples", "64", "--device", "cpu"]
    quick += ["--epochs", "1", "--max-steps", "1", "--no-progress", "--no-tensorboard", "--val-fraction", "0"]
    assert main(["train", *quick, "--precision", "bf16", "--out-dir", str(tmp_path)]) == 0
    said = capsys.readouterr()
    lines = [s for s in (said.out + said.err).splitlines() if "without native bf16" in s]
    if native:
        assert lines == []
    else:
        assert len(lines) == 1 and "--precision bf16" in lines[0] and "--precision auto picks" in lines[0]


# Precision's TF32 choice on a CUDA device is global torch state; it is set here without a GPU (no CUDA call is made)
CUDA = torch.device("cuda")


@pytest.mark.parametrize("caller", ["high", "medium", "highest"])
@pytest.mark.parametrize("kind,expected", [("fp32", "highest"), ("bf16", "high"), ("tf32", "high")])
def test_the_tf32_choice_on_cuda_leaves_a_precision_torch_can_read(caller, kind, expected):
    """`cuda.matmul.allow_tf32 = False` after a caller's `set_float32_matmul_precision("high")` left oneDNN's matmuls
    at TF32 under "highest": torch >= 2.9 then refused every read of the precision (RuntimeError "... mix of the
    legacy and new APIs ..."), and the next command from the same process ended in it (13 GPU tests, session 50)."""
    from cnnpar.process_state import torch_settings_kept

    with torch_settings_kept():
        torch.set_float32_matmul_precision(caller)
        Precision(kind, CUDA)
        assert torch.get_float32_matmul_precision() == expected
        assert torch.backends.cuda.matmul.allow_tf32 == (expected == "high")
        assert torch.backends.cudnn.allow_tf32 == (kind != "fp32")


@pytest.mark.skipif(not hasattr(torch.backends.cudnn, "conv"), reason="this torch has no fp32_precision API")
@pytest.mark.parametrize("backend", ["", "cudnn"])
def test_fp32_on_cuda_turns_tf32_off_for_convolutions_a_caller_set_tf32_for_through_the_newer_api(backend):
    """`cudnn.allow_tf32 = False` stores "none" for cuDNN's convolutions, which falls back to the value a caller set
    for cuDNN or for every backend (`torch.backends.fp32_precision = "tf32"`, the newer API): --precision fp32
    convolved in TF32, and torch refused to read `cudnn.allow_tf32` meanwhile."""
    from cnnpar.process_state import torch_settings_kept

    module = torch.backends.cudnn if backend else torch.backends
    start = module.fp32_precision, torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.rnn.fp32_precision
    try:
        with torch_settings_kept():
            module.fp32_precision = "tf32"
            Precision("fp32", CUDA)
            assert torch.backends.cudnn.conv.fp32_precision != "tf32"
            assert torch.backends.cudnn.rnn.fp32_precision != "tf32"
            assert torch.backends.cudnn.allow_tf32 is False  # readable: no mix of the two APIs
            Precision("tf32", CUDA)
            assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    finally:
        module.fp32_precision = start[0]
        torch.backends.cudnn.allow_tf32 = True  # torch's default, which the conv and rnn values below refine
        torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.rnn.fp32_precision = start[1:]
