"""cnn3 on cnnpar's own engine (the Trainer), set to the shared spec.

The engine's AdamW with weight_decay 0, a constant schedule and no warm-up is the spec's Adam;
the model's weights are replaced by the shared initial draw. `--devices N` is DDP over N gloo (or
NCCL) processes: this module starts itself under torchrun, and each process takes batch / N.
"""

from __future__ import annotations

import os
import shlex
import sys

from cnnpar.errors import Diverged, UserError
from cnnpar.frameworks.spec import (
    Framework,
    RunSpec,
    base_header,
    cpu_name,
    diverged_note,
    epoch_row,
    initial_weights,
    load_bundle,
    log_epoch,
    runner_main,
    torch_threads,
)
from cnnpar.process_tree import owned_temp_folder


def load_initial_weights(model, weights: dict) -> None:
    import torch

    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for m, k in zip(convs, weights["conv"], strict=True):
            m.weight.copy_(torch.from_numpy(k))
        for m, (g, b, mean, var) in zip(bns, weights["bn"], strict=True):
            m.weight.copy_(torch.from_numpy(g))
            m.bias.copy_(torch.from_numpy(b))
            m.running_mean.copy_(torch.from_numpy(mean))
            m.running_var.copy_(torch.from_numpy(var))
        for m, (w, b) in zip(linears, weights["dense"], strict=True):
            m.weight.copy_(torch.from_numpy(w))
            m.bias.copy_(torch.from_numpy(b))


def relaunch_under_torchrun(spec: RunSpec) -> int:
    """This runner's command in `spec.devices` processes, through torchrun as `cnnpar train --nproc N` launches it
    (`dist.run_launcher`, cnnpar.torchrun): torchrun, in a session of its own, stops with this runner however it
    ends, and a stop of this runner is handed on to it."""
    from cnnpar.dist import run_launcher

    cmd = [
        sys.executable,
        "-m",
        "cnnpar.torchrun",
        "--standalone",
        f"--nproc_per_node={spec.devices}",
        "-m",
        "cnnpar.frameworks.torch_runner",
        *sys.argv[1:],
    ]
    print("torch: DDP, launching", shlex.join(cmd[2:]), flush=True)
    return run_launcher(cmd, dict(os.environ))


def train(fw: Framework, spec: RunSpec):
    import torch

    from cnnpar.config import Config, DataConfig, OptimConfig, RunConfig, SpeedConfig
    from cnnpar.dist import destroy_distributed, init_distributed
    from cnnpar.engine.trainer import Trainer

    if spec.devices > 1 and "RANK" not in os.environ:
        rc = relaunch_under_torchrun(spec)
        if rc != 0:
            raise RuntimeError(f"torchrun exited with {rc}")
        return None  # rank 0 of the launched job wrote the CSV
    info = init_distributed("auto")
    try:
        bundle = load_bundle(spec)
        per_process = spec.batch_size // info.world_size
        # removed on a stop (runner_main's SIGTERM), and by the next runner where this one was killed outright
        with owned_temp_folder("cnnpar-torch-runner-") as tmp:
            cfg = Config(
                # the format and shape the bundle was read with: the engine detects the format again from them
                data=DataConfig(
                    source=spec.data,
                    format=spec.format,
                    image_shape=spec.image_shape,
                    augment="none",
                    val_fraction=spec.val_fraction,
                ),
                optim=OptimConfig(optimizer="adamw", lr=spec.lr, weight_decay=0.0, schedule="constant", warmup=0.0),
                speed=SpeedConfig(precision="fp32"),
                run=RunConfig(
                    epochs=spec.epochs, batch_size=per_process, seed=spec.seed, out_dir=tmp, name="run", progress=False
                ),
            )
            trainer = Trainer(cfg, info, bundle=bundle, log=lambda *a, **k: None)
            load_initial_weights(trainer.raw_model, initial_weights(bundle.shape, bundle.num_classes, spec.seed))
            try:
                history = trainer.fit().history
            except Diverged as e:  # the engine's own hint names `train` flags (--precision, --compile)
                raise UserError(diverged_note(e.epoch, e.what, e.loss, spec.lr)) from None
            resolved, graphs = trainer.cfg, trainer.use_graphs
    finally:
        destroy_distributed()
    if not info.is_main:
        return None
    rows = []
    for r in history:
        images = int(round(r["images_per_s"] * r["epoch_s"]))
        rows.append(
            epoch_row(r["epoch"], r["train_loss"], r["train_acc"], r["val_loss"], r["val_acc"], r["epoch_s"], images)
        )
        log_epoch(fw, spec, rows[-1])
    n_train, n_val = len(bundle.train), len(bundle.val)
    data_info = {
        "data": bundle.origin,
        "image_shape": "x".join(map(str, bundle.shape)),
        "num_classes": str(bundle.num_classes),
        "train_samples": str(n_train),
        "val_samples": str(n_val),
    }
    header = base_header(fw, spec)
    header.update(data_info)
    ddp = info.world_size > 1
    header.update(
        {
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else cpu_name(),
            "device_type": info.device.type,
            "devices_requested": str(spec.devices),
            "devices_used": str(info.world_size),
            "parallelism": (
                f"DDP over {info.world_size} processes ({'nccl' if info.device.type == 'cuda' else 'gloo'}), "
                f"torchrun, {per_process} per process"
                if ddp
                else "none (1 process)"
            ),
            "layout": "NCHW" if resolved.speed.channels_last == "off" else "NHWC (channels_last)",
            "compile": resolved.speed.compile,
            "timed": (
                f"torch.compile {resolved.speed.compile}; CUDA graphs "
                + ("on, captured before epoch 1 (in no epoch)" if graphs else "off")
                + "; each epoch the training steps alone (where the loader prepares the next epoch's input, it "
                "starts after the clock stops, beside the evaluation)"
            ),
            "matmul_precision": "fp32 (TF32 off: cnnpar's --precision fp32)",
            "torch_threads": str(torch.get_num_threads()),
            "intra_op_threads": torch_threads(),
            "note": "cnnpar's Trainer: loader, device-side normalisation, AdamW(weight_decay=0), fp32",
        }
    )
    return header, rows


if __name__ == "__main__":
    sys.exit(runner_main("torch_runner", train))
