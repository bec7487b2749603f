"""apply_* functions, one per concern, and parallelize() which calls them in a fixed order.

Before all of them the Trainer swaps the space-to-depth stem in (`apply_stem_space_to_depth`, where the model is
built): it changes the step's speed and memory, and the batch-size search, which runs before parallelize, must
time the model that trains.

Order, and why:
1. SyncBatchNorm conversion   - must see the plain BatchNorm modules, before anything wraps them.
2. channels_last              - parameters get their memory format before compile traces them.
3. move to device             - DDP requires the module on its device when it is wrapped.
4. DDP                        - wraps the eager module; it broadcasts rank 0's weights.
5. torch.compile              - compiling the DDP-wrapped module lets Dynamo split graphs at DDP
                                bucket boundaries, so all-reduce still overlaps backward.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from cnnpar.config import setting_name
from cnnpar.dist import DistInfo
from cnnpar.errors import ConfigError
from cnnpar.parallel.stem import space_to_depth_stem


def apply_stem_space_to_depth(model: nn.Module, enabled: bool) -> nn.Module:
    """--stem-space-to-depth (parallel/stem.py): swaps the stem for one holding the same Parameters, before
    anything wraps the module or builds an optimizer on it."""
    if enabled:
        space_to_depth_stem(model)
    return model


def apply_sync_bn(model: nn.Module, info: DistInfo, enabled: bool) -> nn.Module:
    """BatchNorm statistics over the global batch instead of each rank's share of it.

    One process has nothing to synchronise with, so the switch is then a no-op. On the CPU it is
    refused up front: DDP rejects SyncBatchNorm outside GPU modules, and saying so here beats a
    ValueError from inside DDP's constructor on every rank.
    """
    if not (enabled and info.distributed):
        return model
    refuse_sync_bn_on(info.device)
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def refuse_sync_bn_on(device: torch.device) -> None:
    """--sync-bn on processes that run on `device`, refused in one line where it is not a GPU: by `train --nproc`'s
    launcher before torchrun starts (cli.cmd_train), and by every rank of a torchrun started by hand."""
    if device.type != "cuda":
        raise ConfigError(
            f"{setting_name('dist', 'sync_bn')} = true: SyncBatchNorm needs CUDA devices, and this run is on "
            f"{device.type} (gloo); drop --sync-bn or run on GPUs"
        )


def apply_channels_last(model: nn.Module, enabled: bool) -> nn.Module:
    return model.to(memory_format=torch.channels_last) if enabled else model


def apply_ddp(
    model: nn.Module,
    info: DistInfo,
    bucket_mb: float = 0.0,
    static_graph: bool = False,
    broadcast_buffers: bool = True,
) -> nn.Module:
    """DDP with cnnpar's settings; `bucket_mb` (0: torch's own), `static_graph` and `broadcast_buffers`
    are config.DistConfig's ddp_* switches."""
    if not info.distributed or info.collectives is not None:  # Horovod averages in its optimizer instead
        return model
    device_ids = [info.device.index] if info.device.type == "cuda" else None
    extra = {"bucket_cap_mb": bucket_mb} if bucket_mb else {}
    # gradient_as_bucket_view: gradients alias the all-reduce buckets, saving a copy per step.
    return DDP(
        model,
        device_ids=device_ids,
        gradient_as_bucket_view=True,
        static_graph=static_graph,
        **ddp_buffer_kwargs(broadcast_buffers),
        **extra,
    )


def ddp_buffer_kwargs(broadcast_buffers: bool, ddp_init=DDP.__init__) -> dict:
    """DDP's keyword for sending rank 0's buffers before every forward, in the spelling this torch takes
    without a warning: `forward_sync_buffers` where DDP has it (2.14 here; torch's docstring dates it 2.13)
    and warns that `broadcast_buffers` is deprecated; `broadcast_buffers` where DDP has no other (2.7, 2.8).

    The two differ only at the wrap: `broadcast_buffers=False` leaves the buffers out of DDP's start-up
    broadcast, `forward_sync_buffers=False` still sends them. In cnnpar that copies equal values: every rank
    builds its model from the same seed before the wrap (Trainer) and loads a checkpoint after it, and no
    cnnpar model draws its buffers at random. Per step the two are the same."""
    import inspect

    if "forward_sync_buffers" in inspect.signature(ddp_init).parameters:
        return {"forward_sync_buffers": broadcast_buffers}
    return {"broadcast_buffers": broadcast_buffers}


# inductor's N-d tiling of its generated kernels, and each pointwise kernel's config picked by timing: ResNet-50 224
# b256 on an H200 1.057x (calls ZZI-ZZK: tiling alone 1.034x twice; its BatchNorm passes are channels-last
# reductions), for a compile ~2-2.5 min longer; ResNet-18 32 px b512 tiling alone 1.004x (config.compile_tiling)
TILING_OPTIONS = {"triton.prefer_nd_tiling": True, "max_autotune_pointwise": True}


def inductor_option_names() -> set[str]:
    """The inductor options this torch has, dotted names included (triton.prefer_nd_tiling)."""
    import torch._inductor.config as inductor_config

    return set(inductor_config.get_config_copy())


def missing_tiling_options() -> list[str]:
    """The `TILING_OPTIONS` this torch's inductor lacks (an older torch), in their order; [] where it has all."""
    have = inductor_option_names()
    return [k for k in TILING_OPTIONS if k not in have]


def compile_options(mode: str, tuning: bool, tiling: bool = False) -> dict:
    """torch.compile's keyword arguments for a cnnpar compile mode.

    torch.compile takes a mode or an options dict, not both; tuning (coordinate-descent tuning) and tiling
    (`TILING_OPTIONS`) spell the mode out as its inductor options (`list_mode_options`) and add theirs, so that
    only this model's compile changes (setting inductor's global config would change every later compile in the
    process too).
    """
    extra = {"coordinate_descent_tuning": True} if tuning else {}
    if tiling:
        missing = missing_tiling_options()
        if missing:
            raise ConfigError(
                f"{setting_name('speed', 'compile_tiling')}: torch {torch.__version__}'s inductor has no "
                f"{', '.join(missing)} option: expected --compile-tiling off, or a newer torch"
            )
        extra.update(TILING_OPTIONS)
    if not extra:
        return {"mode": None if mode == "default" else mode}
    from torch._inductor import list_mode_options

    return {"options": {**list_mode_options(mode), **extra}}


def apply_compile(model: nn.Module, mode: str, tuning: bool = False, tiling: bool = False) -> nn.Module:
    if mode == "off":
        return model
    return torch.compile(model, **compile_options(mode, tuning, tiling))


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under compile and DDP wrappers (what a checkpoint stores)."""
    model = getattr(model, "_orig_mod", model)
    return model.module if isinstance(model, DDP) else model


def parallelize(
    model: nn.Module,
    info: DistInfo,
    *,
    sync_bn: bool,
    channels_last: bool,
    compile_mode: str,
    ddp_bucket_mb: float = 0.0,
    ddp_static_graph: bool = False,
    ddp_broadcast_buffers: bool = True,
    compile_tuning: bool = False,
    compile_tiling: bool = False,
) -> nn.Module:
    model = apply_sync_bn(model, info, sync_bn)
    model = apply_channels_last(model, channels_last)
    model = model.to(info.device)
    model = apply_ddp(model, info, ddp_bucket_mb, ddp_static_graph, ddp_broadcast_buffers)
    return apply_compile(model, compile_mode, compile_tuning, compile_tiling)
