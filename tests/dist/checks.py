"""Several DDP checks inside one 2-process gloo job; tests/dist/test_ddp_checks.py asserts on them.

Run as `torchrun --nproc_per_node=2 tests/dist/checks.py OUT_DIR`. Each rank writes
OUT_DIR/rank<R>.json with raw observations (sample indices, digests of parameters, norms,
metrics) and does not judge them, so every assertion lives in the test that reads them.
One launch for all checks: starting a gloo job costs seconds of imports and rendezvous.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cnnpar.cli import main as cli_main
from cnnpar.config import Config, DataConfig, DistConfig, OptimConfig, RunConfig, SpeedConfig, resolve_for_device
from cnnpar.data.bundle import ArrayDataset, DataBundle
from cnnpar.data.loader import build_loader
from cnnpar.data.transforms import DeviceTransform
from cnnpar.dist import DistInfo, destroy_distributed, init_distributed
from cnnpar.engine import fault
from cnnpar.engine.step import forward_backward, optimizer_step, sync_context, tta_logits
from cnnpar.engine.train_step import TrainStep
from cnnpar.engine.trainer import Trainer
from cnnpar.errors import UserError
from cnnpar.models import build_model
from cnnpar.parallel import Precision
from cnnpar.parallel.apply import apply_ddp, apply_sync_bn
from cnnpar.report.files import write_json_atomic

SAMPLER_N, SAMPLER_BATCH = 200, 20  # 100 samples a rank: 5 full batches, nothing dropped
ACCUM_K, ACCUM_B = 3, 4  # micro-steps and samples per micro-step per rank
CLIP = 0.05  # far below the gradient norm of a fresh model, so clipping is active
SMALL_RUN = ["--device", "cpu", "--data", "synthetic", "--image-shape", "1x16x16", "--synthetic-samples", "128"]
SMALL_RUN += ["--batch-size", "16", "--no-progress", "--timeout-s", "60"]  # a lost peer must not hang a test


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def check_error_path(work: Path) -> dict:
    """A UserError after the process group exists (rank 0 refuses --resume of a missing run and
    broadcasts the refusal): exit code 2, the rank named, and the group destroyed."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli_main(["train", *SMALL_RUN, "--resume", str(work / "no-such-run")])
    return {"rc": rc, "stderr": err.getvalue(), "initialized_after": dist.is_initialized()}


def check_failure_names_rank(work: Path) -> dict:
    """The last rank raises mid-epoch (engine/fault.py): its message names it, the exception
    reaches the caller, and the process group is gone on every rank afterwards."""
    os.environ[fault.RAISE_ENV] = "1"
    fault._plan.cache_clear()  # the plan is read once per process; this process read it already
    err, exc, rc = io.StringIO(), "", None
    try:
        with contextlib.redirect_stderr(err):
            rc = cli_main(["train", *SMALL_RUN, "--epochs", "1", "--out-dir", str(work / "runs"), "--name", "fail"])
    except Exception as e:  # rank 1: the injected fault
        exc = f"{type(e).__name__}: {e}"
    finally:
        del os.environ[fault.RAISE_ENV]
    return {"stderr": err.getvalue(), "exception": exc, "rc": rc, "initialized_after": dist.is_initialized()}


def check_sampler(info: DistInfo, work: Path) -> dict:
    """Labels are the sample indices, so the batches a rank receives name its samples."""
    x = torch.zeros(SAMPLER_N, 1, 8, 8, dtype=torch.uint8)
    bundle = DataBundle(ArrayDataset(x, torch.arange(SAMPLER_N)), None, (1, 8, 8), SAMPLER_N, (0.5,), (0.25,), "ids")
    cfg = Config(
        data=DataConfig(augment="none", resident="off"),
        run=RunConfig(batch_size=SAMPLER_BATCH, seed=5, out_dir=str(work)),
    )
    loader = build_loader(bundle, resolve_for_device(cfg, "cpu", True), info, train=True)
    seen = {}
    for epoch in (1, 2):
        loader.set_epoch(epoch)
        seen[f"epoch{epoch}"] = [i for _, y in loader for i in y.tolist()]
    return seen


def one_batch_reference(logits: torch.Tensor, y: torch.Tensor, world_size: int) -> dict:
    """What one process computes over the whole validation split, and, to show what an inexact
    reduction would be off by, the mean of the ranks' own mean losses (ShardSampler's split:
    rank, rank + world, ...)."""
    losses = F.cross_entropy(logits.double(), y, reduction="none")
    rank_means = [losses[r::world_size].mean().item() for r in range(world_size)]
    return {
        "loss_sum": losses.sum().item(),
        "correct": int((logits.argmax(1) == y).sum()),
        "count": len(y),
        "mean_of_rank_means": sum(rank_means) / world_size,
    }


def check_trainer(info: DistInfo, work: Path) -> dict:
    """The real Trainer: a few DDP steps, then exact evaluation against a one-batch reference."""
    cfg = Config(
        # 303 samples, 20 % held out: 61 validation samples, an odd count that 2 ranks split 31/30
        data=DataConfig(source="synthetic", image_shape="3x16x16", synthetic_samples=303, resident="off"),
        optim=OptimConfig(grad_clip=1.0, lr_scaling="linear"),
        # fp32 NCHW, as the one-batch reference below computes (the CPU defaults may pick bf16/NHWC)
        speed=SpeedConfig(precision="fp32", channels_last="off"),
        run=RunConfig(epochs=1, batch_size=16, max_steps=3, seed=3, out_dir=str(work), name="trainer", progress=False),
    )
    trainer = Trainer(cfg, info, log=lambda *a, **k: None)
    out = {
        "global_seed": torch.initial_seed(),
        "augment_seed": trainer.train_loader.transform.generator.initial_seed(),
        "lr": trainer.lr,
    }
    trainer.train_epoch(1)
    model = trainer.raw_model
    out["params"] = digest(model.parameters())
    metrics = trainer.evaluate()  # broadcasts rank 0's BatchNorm statistics first
    out["buffers_after_eval"] = digest(model.buffers())
    out["dist_eval"] = metrics
    if info.is_main:
        val = trainer.bundle.val
        b = trainer.bundle
        transform = DeviceTransform(b.mean, b.std, "none", False, info.device)
        with torch.no_grad():
            logits = model.eval()(transform(val.x, False))
        out["ref_eval"] = one_batch_reference(logits, val.y, info.world_size)
    return out


def check_store(info: DistInfo, work: Path) -> dict:
    """Two ranks train from one prepared store (made by the test before the launch): the sample
    indices each rank's batches carry, a few steps, and the sharded evaluation of its val split."""
    cfg = Config(
        data=DataConfig(source=str(work / "photos.cnnpar"), image_size=16, workers=0, val_fraction=0.25),
        speed=SpeedConfig(precision="fp32", channels_last="off"),
        run=RunConfig(epochs=1, batch_size=3, max_steps=2, seed=3, out_dir=str(work), name="store", progress=False),
    )
    trainer = Trainer(cfg, info, log=lambda *a, **k: None)
    trainer.train_loader.set_epoch(1)
    seen = [i for raw, _ in trainer.train_loader.loader for i in raw.index.tolist()]
    trainer.train_epoch(1)
    return {"seen": seen, "n_train": len(trainer.bundle.train), "dist_eval": trainer.evaluate()}


def check_speed_recipe(info: DistInfo, work: Path) -> dict:
    """Weight averaging, alternating flip and flip+translate TTA under DDP: the averages agree on
    both ranks, and the sharded evaluation of the average equals a one-batch reference."""
    cfg = Config(
        data=DataConfig(source="synthetic", image_shape="3x16x16", synthetic_samples=303, augment="translate+altflip"),
        optim=OptimConfig(ema=0.7, lookahead=True),
        speed=SpeedConfig(precision="fp32", channels_last="off"),
        run=RunConfig(epochs=1, batch_size=16, max_steps=3, seed=3, out_dir=str(work), name="recipe", progress=False),
    )
    trainer = Trainer(replace(cfg, run=replace(cfg.run, tta_level="flip+translate")), info, log=lambda *a, **k: None)
    trainer.train_epoch(1)
    metrics = trainer.evaluate()
    model = trainer.average.eval_model()
    out = {
        "n_averaged": int(trainer.average.averaged.n_averaged),
        "average": digest(model.state_dict().values()),
        "dist_eval": metrics,
    }
    if info.is_main:
        b = trainer.bundle
        transform = DeviceTransform(b.mean, b.std, "none", False, info.device)
        with torch.no_grad():
            logits = tta_logits(model.eval(), transform(b.val.x, False), flip=True, translate=True)
        out["ref_eval"] = one_batch_reference(logits, b.val.y, info.world_size)
    return out


def check_accumulation(info: DistInfo, **ddp_switches) -> dict:
    """k micro-steps under no_sync + a synced last one == one step on the whole global batch (with
    `ddp_switches`: apply_ddp's bucket size, static graph and buffer broadcast, as the config sets them)."""
    torch.manual_seed(11)
    model = build_model("cnn3", 1, 10, 16).eval()  # eval-mode BN: outputs do not depend on the batch
    ref = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    ddp = apply_ddp(model, info, **ddp_switches)
    precision = Precision("fp32", info.device)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(info.world_size, ACCUM_K, ACCUM_B, 1, 16, 16, generator=g)
    y = torch.randint(0, 10, (info.world_size, ACCUM_K, ACCUM_B), generator=g)
    out = {}
    for m in range(ACCUM_K):
        last = m == ACCUM_K - 1
        with sync_context(ddp, last):
            forward_backward(ddp, x[info.rank, m], y[info.rank, m], precision, 0.0, 1.0 / ACCUM_K)
        if m == 0:  # inside no_sync: this rank's own gradients, not yet averaged
            out["grads_after_first_micro_step"] = digest(p.grad for p in model.parameters())
    out["grads_synced"] = digest(p.grad for p in model.parameters())
    out["norm"] = float(optimizer_step(list(ddp.parameters()), opt, precision, CLIP))
    out["params"] = digest(model.parameters())

    ref_opt = torch.optim.SGD(ref.parameters(), lr=1.0)
    F.cross_entropy(ref(x.flatten(0, 2)), y.flatten()).backward()
    out["ref_norm"] = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP))
    ref_opt.step()
    update = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))
    gap = max(float((p.detach() - r.detach()).abs().max()) for p, r in zip(model.parameters(), ref.parameters()))
    out.update(max_update=update, max_gap_to_reference=gap)
    out["ddp"] = {
        "bucket_bytes_cap": ddp.bucket_bytes_cap,
        "static_graph": ddp.static_graph,
        "broadcast_buffers": ddp.broadcast_buffers,
    }
    return out


def check_ddp_switches_in_the_trainer(info: DistInfo, work: Path) -> dict:
    """The config's ddp_* switches reach the Trainer's DDP module, and its ranks still evaluate one model
    (evaluation broadcasts rank 0's BatchNorm statistics when DDP no longer does before each forward)."""
    cfg = Config(
        data=DataConfig(source="synthetic", image_shape="3x16x16", synthetic_samples=96, resident="off"),
        speed=SpeedConfig(precision="fp32", channels_last="off"),
        dist=DistConfig(ddp_bucket_mb=2.0, ddp_static_graph=True, ddp_broadcast_buffers=False),
        run=RunConfig(epochs=1, batch_size=8, max_steps=3, seed=5, out_dir=str(work), name="switches", progress=False),
    )
    trainer = Trainer(cfg, info, log=lambda *a, **k: None)
    ddp = trainer.ddp
    trainer.train_epoch(1)
    buffers_after_steps = digest(trainer.raw_model.buffers())  # each rank's own: DDP did not send them
    trainer.evaluate()
    return {
        "bucket_bytes_cap": ddp.bucket_bytes_cap,
        "static_graph": ddp.static_graph,
        "broadcast_buffers": ddp.broadcast_buffers,
        "params": digest(trainer.raw_model.parameters()),
        "buffers_after_steps": buffers_after_steps,
        "buffers_after_eval": digest(trainer.raw_model.buffers()),
    }


def check_step_groups(info: DistInfo) -> dict:
    """The TrainStep under DDP: a group of two unequal micro-batches, then a short group of one,
    each equal to one process's step on both ranks' samples as one batch (clipped, like above)."""
    torch.manual_seed(13)
    model = build_model("cnn3", 1, 10, 16).eval()  # eval-mode BN: outputs do not depend on the batch
    ref = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    ddp = apply_ddp(model, info)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    step = TrainStep(ddp, Precision("fp32", info.device), opt, ddp=ddp, grad_clip=CLIP)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=1.0)
    g = torch.Generator().manual_seed(14)
    for sizes in ((5, 3), (4,)):  # samples per micro-batch, the same on every rank
        xs = [torch.randn(info.world_size, n, 1, 16, 16, generator=g) for n in sizes]
        ys = [torch.randint(0, 10, (info.world_size, n), generator=g) for n in sizes]
        step([(x[info.rank], y[info.rank]) for x, y in zip(xs, ys)])
        ref_opt.zero_grad()
        x_all = torch.cat([x.flatten(0, 1) for x in xs])
        F.cross_entropy(ref(x_all), torch.cat([y.flatten() for y in ys])).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
        ref_opt.step()
    update = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))
    gap = max(float((p.detach() - r.detach()).abs().max()) for p, r in zip(model.parameters(), ref.parameters()))
    return {"params": digest(model.parameters()), "max_update": update, "max_gap_to_reference": gap}


def check_sync_bn_on_cpu(info: DistInfo) -> dict:
    try:
        apply_sync_bn(build_model("cnn3", 1, 10, 16), info, True)
    except UserError as e:
        return {"refused": True, "message": str(e)}
    return {"refused": False, "message": ""}


def main() -> None:
    work = Path(sys.argv[1])
    results: dict = {}
    info = init_distributed("cpu", timeout_s=120)
    try:
        results["world_size"] = info.world_size
        results["sampler"] = check_sampler(info, work)
        results["trainer"] = check_trainer(info, work)
        results["speed_recipe"] = check_speed_recipe(info, work)
        results["store"] = check_store(info, work)
        results["accumulation"] = check_accumulation(info)
        # a 1 KiB bucket: several; no static graph (config.Config refuses it beside accumulation)
        switches = dict(bucket_mb=0.001, static_graph=False, broadcast_buffers=False)
        results["accumulation_switches"] = check_accumulation(info, **switches)
        results["ddp_switches"] = check_ddp_switches_in_the_trainer(info, work)
        results["step_groups"] = check_step_groups(info)
        results["sync_bn_cpu"] = check_sync_bn_on_cpu(info)
    finally:
        destroy_distributed()
    # Last, with the group gone: the CLI makes its own group and must tear it down on error.
    results["error_path"] = check_error_path(work)
    results["failure"] = check_failure_names_rank(work)
    write_json_atomic(work / f"rank{info.rank}.json", results)


if __name__ == "__main__":
    main()
