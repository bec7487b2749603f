"""The model registry: name -> builder and a one-line description for `cnnpar models`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn as nn

from cnnpar.errors import ConfigError


@dataclass(frozen=True)
class ModelEntry:
    build: Callable[[int, int, int], nn.Module]  # (in_channels, num_classes, image_size) -> model
    description: str
    square_only: bool = False  # sized from one side (a linear head): a non-square input fails mid-epoch
    # (smallest height and width, what sets it): a smaller input fails mid-epoch (a pool's output would be empty)
    min_side: tuple[int, str] | None = None


MODELS: dict[str, ModelEntry] = {}


def register(name: str, description: str, square_only: bool = False, min_side: tuple[int, str] | None = None):
    def deco(fn):
        MODELS[name] = ModelEntry(fn, description, square_only, min_side)
        return fn

    return deco


def check_model_name(name: str, what: str = "model") -> None:
    """Refuse a name the registry lacks, listing the known ones. The CLI asks before it loads data or starts
    torchrun's workers (`what` names the setting there); the config cannot ask itself: building a Config
    (`--help` does) must not import torch, and the models' modules do."""
    _load_builtin()
    if name not in MODELS:
        raise ConfigError(f"{what} {name!r}: expected one of {', '.join(sorted(MODELS))} (see `cnnpar models`)")


def build_model(name: str, in_channels: int, num_classes: int, image_size: int, width: int = 0) -> nn.Module:
    """`image_size` is the input's height; `width`, when given, its width (0: square)."""
    check_model_name(name)
    if MODELS[name].square_only and width and width != image_size:
        raise ConfigError(
            f"model {name}: input images {image_size}x{width} (HxW): expected square images, as its linear head "
            "is sized from one side; give --image-size N to resize them to NxN"
        )
    if MODELS[name].min_side is not None:
        least, why = MODELS[name].min_side
        if min(image_size, width or image_size) < least:  # a user error (--image-size, --max-side, an array), raised
            # while the trainer is built: before any run folder
            shape = f"{image_size}x{width} (HxW)" if width and width != image_size else f"{image_size}x{image_size}"
            raise ConfigError(
                f"model {name}: input images {shape}: expected at least {least}x{least} ({why}); "
                f"give --image-size {least} or more"
            )
    return MODELS[name].build(in_channels, num_classes, image_size)


def describe_models() -> list[tuple[str, str]]:
    _load_builtin()
    return [(n, MODELS[n].description) for n in sorted(MODELS)]


def _load_builtin() -> None:
    # Imported for their @register side effect; kept lazy so `import cnnpar.models` stays cheap.
    from cnnpar.models import cnn3, fastnet, resnet  # noqa: F401


def smallest_batchnorm_map(model: nn.Module, shape: tuple[int, int, int]) -> tuple[str, int, bool] | None:
    """(the name of the BatchNorm layer whose input map is the smallest, its height x width, whether it has
    spatial dimensions at all) for `shape` (C, H, W) images; None for a model without BatchNorm. Found by one
    forward of a blank image in eval mode, which leaves the running statistics as they are."""
    import math

    import torch

    seen: dict[str, tuple[int, bool]] = {}

    def note(name: str):
        def hook(module, args) -> None:  # None: a pre-hook's return value would replace the layer's input
            seen.setdefault(name, (math.prod(args[0].shape[2:]), args[0].dim() > 2))

        return hook

    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not layers:
        return None
    hooks = [m.register_forward_pre_hook(note(n)) for n, m in layers]
    was_training = model.training
    param = next(model.parameters())
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, *shape, device=param.device, dtype=param.dtype))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    name = min(seen, key=lambda n: seen[n][0])
    return name, *seen[name]
